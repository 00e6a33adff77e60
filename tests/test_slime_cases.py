"""``python -m grpo import slime``: each slime set-up either reproduces slime's loss on the dump, or is refused by
name (exit 2, one line, nothing left behind).

The expected losses follow slime's own code at THUDM/slime commit 624b824, re-implemented literally below
(``slime_loss``) with the line each step follows; ``tests/test_slime_parity.py`` holds the import against slime's
code itself when a source tree is at hand. The dumps are built by hand in the layouts slime writes
(``_build_dump_payload``, format 2; ``dict(rollout_id=, rank=, rollout_data=)`` per rank before 681b3ad, format 1).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo.__main__ import main
from grpo.check import check_run
from grpo.importers import slime as slime_importer
from grpo.runs import load_run, load_step

ROOT = Path(__file__).resolve().parent.parent
VANILLA = "slime.backends.megatron_utils.loss.vanilla_tis_function"
ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"


# --- slime's loss, literally -------------------------------------------------------------------------------
def slime_terms(s: dict[str, Any], a: dict[str, Any]) -> torch.Tensor:
    """One sample's per-token loss (float64) as ``policy_loss_function`` builds it, the current policy being the
    dump's log_probs (what the import takes; slime 624b824 records them from the training forward)."""
    d = torch.float64
    logp, adv = s["log_probs"].to(d), s["advantages"].to(d)
    # loss.py:965: old_log_probs = batch["rollout_log_probs"] if args.use_rollout_logprobs else batch.get("log_probs")
    old = (s["rollout_log_probs"] if a.get("use_rollout_logprobs") else s["log_probs"]).to(d)
    ppo_kl = old - logp  # loss.py:1046
    eps, eps_high = a.get("eps_clip", 0.2), a.get("eps_clip_high") or a.get("eps_clip", 0.2)
    ratio = (-ppo_kl).exp()  # ppo_utils.py:132-135: compute_policy_loss
    pg = torch.maximum(-ratio * adv, -ratio.clamp(1 - eps, 1 + eps_high) * adv)
    if a.get("eps_clip_c") is not None:  # ppo_utils.py:142-144: dual clip where A < 0
        pg = torch.where(adv < 0, torch.minimum(-a["eps_clip_c"] * adv, pg), pg)
    if a.get("use_tis") or a.get("get_mismatch_metrics"):  # loss.py:1050: tis_func whenever either is on
        tis = (s["log_probs"].to(d) - s["rollout_log_probs"].to(d)).exp()  # loss.py:895 (train = dumped log_probs)
        low, high = a.get("tis_clip_low", 0.0), a.get("tis_clip", 2.0)
        if a.get("custom_tis_function_path") == ICEPOP:  # loss.py:921-923
            pg = pg * torch.where((tis >= low) & (tis <= high), tis, torch.zeros_like(tis))
        else:  # loss.py:897-904: vanilla_tis_function
            pg = pg * tis.clamp(min=low, max=high)
    if a.get("use_kl_loss"):  # loss.py:1114-1127, ppo_utils.py:28-49: compute_approx_kl
        log_ratio = logp - s["ref_log_probs"].to(d)
        kind = a.get("kl_loss_type", "k1")
        kl = {"k1": log_ratio, "k2": log_ratio**2 / 2}.get(kind, (-log_ratio).exp() - 1 + log_ratio)
        if a.get("use_unbiased_kl"):
            kl = (logp - old).exp() * kl
        if kind == "low_var_kl":
            kl = kl.clamp(-10, 10)
        pg = pg + a.get("kl_loss_coef", 0.0) * kl
    return pg


def slime_loss(samples: list[dict[str, Any]], a: dict[str, Any], global_batch_size: int | None = None) -> float:
    """One optimiser step's loss as slime logs it (``reduce_train_step_metrics``) over every sample of the step,
    every rank's: per token, Σ ℓ·mask / Σ max(Σ mask, 1) (loss.py:1318 ``num_tokens``); else each sample's
    Σ ℓ·mask / max(its rollout's mask total, 1) (cp_utils.py:75 ``sum_of_sample_mean`` over ``rollout_mask_sums``,
    rollout.py:691-700), summed and divided by the step's rollouts (``step_global_batch_size``)."""
    masks = [s["loss_masks"].double() for s in samples]
    sums = [float(m.sum()) for m in masks]
    total = sum((slime_terms(s, a) * m).sum() for s, m in zip(samples, masks, strict=True))
    if a.get("calculate_per_token_loss"):
        return float(total) / sum(max(x, 1.0) for x in sums)
    rollout_ids = [s.get("rollout_ids", i) for i, s in enumerate(samples)]
    by_rollout = {r: sum(x for q, x in zip(rollout_ids, sums, strict=True) if q == r) for r in rollout_ids}
    size = global_batch_size or len(by_rollout)
    per_sample = [
        float((slime_terms(s, a) * m).sum()) / max(by_rollout[r], 1.0)
        for s, m, r in zip(samples, masks, rollout_ids, strict=True)
    ]
    return sum(per_sample) / size


# --- dumps in slime's layouts ------------------------------------------------------------------------------
def samples(seed: int, n: int = 6, far: float = 0.4, rollout_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """n samples of 2..7 response tokens, sample 2's loss mask empty, the sampler ``far`` from the actor."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(2, 8, (), generator=g))
        logp = -(torch.rand(length, generator=g) * 2 + 0.05)
        mask = (torch.rand(length, generator=g) > 0.25).int() if i != 2 else torch.zeros(length, dtype=torch.int)
        out.append(
            {
                "tokens": torch.randint(0, 50, (length + 3,), generator=g),
                "response_lengths": length,
                "total_lengths": length + 3,
                "loss_masks": mask,
                "log_probs": logp,
                "rollout_log_probs": (logp + far * torch.randn(length, generator=g)).clamp(max=-1e-4),
                "ref_log_probs": (logp + 0.3 * torch.randn(length, generator=g)).clamp(max=-1e-4),
                "advantages": torch.full((length,), float(torch.randn((), generator=g))),
                "rewards": float(torch.rand((), generator=g)),
                "rollout_ids": i if rollout_ids is None else rollout_ids[i],
            }
        )
    return out


def schedule(n: int, steps: int = 1, micro: int = 2) -> dict[str, Any]:
    """One rank's schedule over its n samples in order: ``micro`` per micro-batch, ``steps`` optimiser steps."""
    mbs = [list(range(i, min(i + micro, n))) for i in range(0, n, micro)]
    return {"micro_batch_indices": mbs, "num_microbatches": [len(mbs) // steps] * steps}


def format_2(
    rollout_id: int, ss: list[dict[str, Any]], steps: int = 1, sizes: list[int] | None = None
) -> dict[str, Any]:
    """``_build_dump_payload`` (train_data_utils.py:110-186) for one data-parallel shard: each sample its own
    values plus ``rollout_position`` (its ``partition`` entry), the schedule in ``dp_shards``."""
    rows = [{**s, "data_parallel_rank": 0, "rollout_position": i} for i, s in enumerate(ss)]
    sizes = sizes or [len({s["rollout_ids"] for s in ss}) // steps] * steps
    shard = {"rank": 0, "data_parallel_rank": 0, "partition": list(range(len(ss))), "global_batch_sizes": sizes}
    return {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": 0,
        "samples": rows,
        "dp_shards": [shard | schedule(len(ss), steps)],
    }


def format_1(rollout_id: int, rank: int, ss: list[dict[str, Any]], size: int, first: int = 0) -> dict[str, Any]:
    """Before 681b3ad (train_dump_utils.py): ``dict(rollout_id=, rank=, rollout_data=)``, a dict of columns."""
    columns: dict[str, Any] = {k: [s[k] for s in ss] for k in ss[0]}
    columns |= {"partition": list(range(first, first + len(ss))), "global_batch_sizes": [size]} | schedule(len(ss))
    return {"rollout_id": rollout_id, "rank": rank, "rollout_data": columns}


def save(d: Path, name: str, payload: Any) -> Path:
    """``payload`` saved as ``d/name``; the dump's directory."""
    d.mkdir(parents=True, exist_ok=True)
    torch.save(payload, d / name)
    return d


def step_losses(tmp_path: Path, d: Path, settings: dict[str, Any]) -> tuple[Any, list[float]]:
    """The imported run and its steps' losses as check-run joins them (under each step file's own config)."""
    cfg = tmp_path / "slime.json"
    cfg.write_text(json.dumps(settings))
    code = main(["import", "slime", str(d), str(tmp_path / "run"), "--config", str(cfg)])
    assert code == 0
    run = load_run(tmp_path / "run")
    return run, [float(s.lens_loss or math.nan) for s in check_run(run).steps]


def close(got: float, want: float) -> None:
    """float32 round-off: the import evaluates in float32 sums of a few dozen terms of size <= ~5."""
    assert abs(got - want) <= 2e-6 * max(1.0, abs(want)), (got, want)


# --- reproduced --------------------------------------------------------------------------------------------
def test_per_token_loss_counts_an_empty_sample_as_one_token(tmp_path: Path) -> None:
    # by hand: sample 0 has 2 counted tokens at ratio 1 with A = 1, so -1 each; sample 1's mask is empty, which
    # slime still counts as one token (loss.py:1318 clamp_min(loss_mask.sum(), 1)): (-1 - 1) / (2 + 1) = -2/3,
    # where a token mean over the counted tokens alone gives -1
    s = samples(0, n=2)
    s[0]["loss_masks"] = torch.zeros(len(s[0]["log_probs"]), dtype=torch.int)
    s[0]["loss_masks"][:2] = 1
    s[0]["advantages"] = torch.ones(len(s[0]["log_probs"]))
    s[1]["loss_masks"] = torch.zeros(len(s[1]["log_probs"]), dtype=torch.int)
    s[1]["advantages"] = torch.full((len(s[1]["log_probs"]),), 5.0)
    _, losses = step_losses(tmp_path, save(tmp_path / "d", "0.pt", format_2(0, s)), {"calculate_per_token_loss": True})
    close(losses[0], -2 / 3)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"calculate_per_token_loss": True},
        {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl"},
        {"get_mismatch_metrics": True, "custom_tis_function_path": VANILLA},  # TIS applied without use_tis
        {"get_mismatch_metrics": True, "custom_tis_function_path": ICEPOP, "tis_clip": 1.3, "tis_clip_low": 0.7},
        {"use_tis": True, "tis_clip": 1.5, "tis_clip_low": 0.5, "calculate_per_token_loss": True},
        {"use_rollout_logprobs": True},  # the ratio is log_probs against rollout_log_probs
        {"use_rollout_logprobs": True, "eps_clip": 0.1, "eps_clip_high": 0.3, "eps_clip_c": 3.0},
        {
            "use_rollout_logprobs": True,
            "use_kl_loss": True,
            "kl_loss_coef": 0.1,
            "kl_loss_type": "k3",
            "use_unbiased_kl": True,
        },
    ],
    ids=str,
)
def test_settings_reproduce_slime(tmp_path: Path, settings: dict[str, Any]) -> None:
    s = samples(1)
    _, losses = step_losses(tmp_path, save(tmp_path / "d", "0.pt", format_2(0, s)), settings)
    close(losses[0], slime_loss(s, settings))


@pytest.mark.parametrize("per_token", [False, True])
def test_several_samples_per_rollout_share_one_token_mean(tmp_path: Path, per_token: bool) -> None:
    s = samples(2, n=7, rollout_ids=[0, 0, 1, 2, 2, 2, 3])  # 4 rollouts (compact rollouts: 2 and 3 samples)
    settings = {"calculate_per_token_loss": per_token}
    run, losses = step_losses(tmp_path, save(tmp_path / "d", "0.pt", format_2(0, s)), settings)
    close(losses[0], slime_loss(s, settings, global_batch_size=4))
    batch, _, _ = load_step(run.steps[0].path)
    assert batch.completion_mask.shape[0] == (7 if per_token else 4)  # under the sequence mean: a row per rollout


def test_two_optimiser_steps_per_rollout_are_two_steps(tmp_path: Path) -> None:
    s = samples(3, n=8)
    d = tmp_path / "d"
    save(d, "0.pt", format_2(0, s[:8], steps=2))
    save(d, "1.pt", format_2(1, samples(4, n=8), steps=2))
    run, losses = step_losses(tmp_path, d, {})
    assert [st.step for st in run.steps] == [1, 2, 3, 4]  # rollout_id * 2 + optimiser step
    close(losses[0], slime_loss(s[:4], {}))  # micro-batches 0-1 (samples 0-3) are step 1
    close(losses[1], slime_loss(s[4:], {}))
    _, _, info = load_step(run.steps[1].path)
    assert info["meta"]["optimiser_step"] == {"of_rollout": 2, "steps_per_rollout": 2}
    assert any("optimiser step 2 of 2" in r for r in info["meta"]["cannot_check"])


@pytest.mark.parametrize("per_token", [False, True])
def test_format_1_ranks_join_as_slime_normalises_them(tmp_path: Path, per_token: bool) -> None:
    s = samples(5, n=6)
    d = tmp_path / "d"
    save(d, "0_0.pt", format_1(0, 0, s[:2], size=6))  # rank 0 holds 2 samples, rank 1 holds 4
    save(d, "0_1.pt", format_1(0, 1, s[2:], size=6, first=2))
    settings = {"calculate_per_token_loss": per_token, "use_kl_loss": True, "kl_loss_coef": 0.05}
    _, losses = step_losses(tmp_path, d, settings)
    close(losses[0], slime_loss(s, settings))  # over both ranks' tokens (rollouts), not the mean of per-rank means


def test_kl_without_reference_is_unchecked(tmp_path: Path) -> None:
    s = [{k: v for k, v in x.items() if k != "ref_log_probs"} for x in samples(6)]
    run, _ = step_losses(
        tmp_path, save(tmp_path / "d", "0.pt", format_2(0, s)), {"use_kl_loss": True, "kl_loss_coef": 0.1}
    )
    result = check_run(run)
    assert result.verdict == "unchecked"  # grpo.check.UNCHECKED
    assert any("ref_log_probs are not dumped" in r for r in result.micro[0].unchecked)


def test_unmapped_settings_reach_run_json(tmp_path: Path) -> None:
    run, _ = step_losses(tmp_path, save(tmp_path / "d", "0.pt", format_2(0, samples(7))), {"lr": 1e-6, "eps_clip": 0.2})
    imported = run.info["imported"]
    assert "lr" in imported["unsupported"] and "eps_clip" in imported["mapped"]


def test_a_rollout_dump_beside_training_dumps_is_skipped_with_a_note(tmp_path: Path) -> None:
    d = tmp_path / "d"
    save(d, "0.pt", format_2(0, samples(8)))
    rollout = {"rollout_id": 0, "samples": [{"tokens": [1, 2], "response": "x", "status": "completed", "reward": 1.0}]}
    save(d, "rollout_0.pt", rollout)  # save_debug_rollout_data's {rollout_id, samples}
    run, _ = step_losses(tmp_path, d, {})
    imported = run.info["imported"]
    assert imported["skipped"] == ["rollout_0.pt"] and "rollout dump" in imported["notes"][0]
    assert [st.step for st in run.steps] == [1]


# --- refused: exit 2, one line naming the setting, nothing left behind ----------------------------------------
def refused(capsys: Any, tmp_path: Path, d: Path, match: str, settings: dict[str, Any] | None = None) -> str:
    argv = ["import", "slime", str(d), str(tmp_path / "run")]
    if settings is not None:
        cfg = tmp_path / "slime.json"
        cfg.write_text(json.dumps(settings))
        argv += ["--config", str(cfg)]
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and match in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run, no temporary directory
    return str(err)


@pytest.mark.parametrize(
    ("settings", "name"),
    [
        ({"entropy_coef": 0.01}, "entropy_coef"),
        ({"use_opsm": True}, "use_opsm"),
        ({"advantage_estimator": "gspo"}, "advantage_estimator"),
        ({"loss_type": "sft_loss"}, "loss_type"),
        ({"custom_pg_loss_reducer_function_path": "my.reducer"}, "custom_pg_loss_reducer_function_path"),
        ({"get_mismatch_metrics": True, "custom_tis_function_path": "my.tis"}, "custom_tis_function_path"),
        ({"use_rollout_logprobs": True, "get_mismatch_metrics": True}, "get_mismatch_metrics"),
    ],
    ids=str,
)
def test_settings_not_reproduced_are_refused_by_name(
    capsys: Any, tmp_path: Path, settings: dict[str, Any], name: str
) -> None:
    d = save(tmp_path / "d", "0.pt", format_2(0, samples(9)))
    refused(capsys, tmp_path, d, f"error: {name}: expected a setting the import reproduces", settings)


def test_format_1_without_log_probs_says_why(capsys: Any, tmp_path: Path) -> None:
    s = [{k: v for k, v in x.items() if k != "log_probs"} for x in samples(10)]
    d = tmp_path / "d"
    save(d, "0_0.pt", format_1(0, 0, s[:3], size=6))
    save(d, "0_1.pt", format_1(0, 1, s[3:], size=6, first=3))
    err = refused(capsys, tmp_path, d, "log_probs")
    assert "kl_coef 0" in err and "none in 2 rank file(s)" in err


def test_a_rollout_split_over_rank_files_is_refused(capsys: Any, tmp_path: Path) -> None:
    s = samples(17, n=4, rollout_ids=[0, 0, 1, 2])  # rollout 0's two samples on ranks 0 and 1
    totals = {0: float(s[0]["loss_masks"].sum() + s[1]["loss_masks"].sum())}
    for x in s:  # rollout.py:691-700: each sample carries its whole rollout's mask total
        x["rollout_mask_sums"] = totals.get(x["rollout_ids"], float(x["loss_masks"].sum()))
    d = tmp_path / "d"
    save(d, "0_0.pt", format_1(0, 0, [s[0], s[2]], size=3))
    save(d, "0_1.pt", format_1(0, 1, [s[1], s[3]], size=3, first=2))
    refused(capsys, tmp_path, d, "rollout 0's samples on several ranks")


def test_symbolic_links_are_refused(capsys: Any, tmp_path: Path) -> None:
    outside = save(tmp_path / "elsewhere", "0.pt", format_2(0, samples(11)))
    d = tmp_path / "d"
    d.mkdir()
    (d / "train_data").symlink_to(outside)  # --dump-details DIR/train_data pointing out of the dump
    refused(capsys, tmp_path, d, "train_data")
    (d / "train_data").unlink()
    save(d, "1.pt", format_2(1, samples(12)))
    (d / "0.pt").symlink_to(outside / "0.pt")
    refused(capsys, tmp_path, d, "0.pt: expected a dump file, not a symbolic link")


def test_non_finite_log_probs_are_named_as_slime_names_them(capsys: Any, tmp_path: Path) -> None:
    s = samples(13)
    s[3]["log_probs"] = s[3]["log_probs"].clone()
    s[3]["log_probs"][1] = float("nan")
    d = save(tmp_path / "d", "0.pt", format_2(0, s))
    refused(
        capsys,
        tmp_path,
        d,
        "0.pt: expected finite log-probs, advantages and masks, got samples[3]['log_probs'][1] is nan",
    )
    s = samples(13)
    s[4]["ref_log_probs"] = s[4]["ref_log_probs"].clone()
    s[4]["ref_log_probs"][0] = -float("inf")
    (d / "0.pt").unlink()
    save(d, "0_0.pt", format_1(0, 0, s, size=6))
    refused(capsys, tmp_path, d, "rollout_data['ref_log_probs'][4][0] is -inf")


def test_the_real_command_refuses_in_one_line(tmp_path: Path) -> None:
    s = samples(14)
    s[0]["rollout_log_probs"] = torch.full_like(s[0]["rollout_log_probs"], float("nan"))
    d = save(tmp_path / "d", "0.pt", format_2(0, s))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "grpo", "import", "slime", str(d), str(tmp_path / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "samples[0]['rollout_log_probs'][0] is nan" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_a_file_past_the_size_bound_is_refused_unread(capsys: Any, tmp_path: Path, monkeypatch: Any) -> None:
    path = save(tmp_path / "d", "0.pt", format_2(0, samples(15))) / "0.pt"
    monkeypatch.setattr(slime_importer, "MAX_DUMP_BYTES", path.stat().st_size - 1)

    def never(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.load called on a file past the bound")

    monkeypatch.setattr(torch, "load", never)
    refused(capsys, tmp_path, path.parent, f"0.pt: expected at most {path.stat().st_size - 1} bytes")


def test_no_grid_larger_than_the_dump_justifies(capsys: Any, tmp_path: Path, monkeypatch: Any) -> None:
    s = samples(16, n=6)
    long = 600  # one long row among short ones: 6 x 600 cells for ~615 tokens, past 4 x the tokens
    s[0] |= {
        "log_probs": -torch.rand(long) - 0.05,
        "rollout_log_probs": -torch.rand(long) - 0.05,
        "ref_log_probs": -torch.rand(long) - 0.05,
        "loss_masks": torch.ones(long, dtype=torch.int),
        "advantages": torch.ones(long),
        "response_lengths": long,
    }
    monkeypatch.setattr(slime_importer, "GRID_FACTOR", 4)
    monkeypatch.setattr(slime_importer, "GRID_FLOOR", 1000)
    refused(capsys, tmp_path, save(tmp_path / "d", "0.pt", format_2(0, s)), "padded grid")
    # an expanded view: 4 bytes of data that a float32 copy would make 4e8
    (tmp_path / "d" / "0.pt").unlink()
    s = samples(16)
    s[1]["advantages"] = torch.zeros(1).expand(10**8)
    refused(capsys, tmp_path, save(tmp_path / "d", "0.pt", format_2(0, s)), "samples[1]['advantages'] is a view")
