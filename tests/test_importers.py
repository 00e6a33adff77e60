"""``python -m grpo import nemo-rl|slime DIR RUN_DIR``: other trainers' dumps as runs.

The fixture dumps are written the way the trainers write them, from the fields their source puts there:
- NeMo RL 0.6.0 (NVIDIA-NeMo/RL commit 7ea279a): ``nemo_rl/algorithms/grpo.py`` builds ``log_data`` from
  ``train_data`` and ``Logger.log_batched_dict_as_jsonl`` (``nemo_rl/utils/logger.py``) writes one line per
  sample of a batch sliced one row at a time (``BatchedDataDict.make_microbatch_iterator(1)``), tensors
  ``tolist()``-ed, plus ``idx`` (``nemo_jsonl`` below does exactly that);
- slime commit 624b824: ``_build_dump_payload`` in ``slime/observability/train_data_utils.py`` (format 2)
  and, before commit 681b3ad, ``{rollout_id, rank, rollout_data}`` per rank (format 1), both ``torch.save``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

import grpo
from app.main import create_app
from app.settings import Settings
from grpo.__main__ import main
from grpo.check import check_run
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.importers import map_nemo_rl, map_slime
from grpo.importers.nemo_rl import import_nemo_rl
from grpo.runs import load_run, load_step

ROOT = Path(__file__).resolve().parent.parent
SAMPLER = "sampling_per_token_logps"
SAMPLER_IS_A_FIELD = SAMPLER in BATCH_FIELDS


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- NeMo RL ----------------------------------------------------------------------------------------
def nemo_train_data(seed: int = 0) -> dict[str, Any]:
    """``log_data`` as grpo.py builds it: 4 samples of prompt + response, padded to one width S."""
    g = torch.Generator().manual_seed(seed)
    B, S = 4, 9
    input_lengths = torch.tensor([9, 7, 8, 6])
    prompt = torch.tensor([3, 2, 4, 3])
    pos = torch.arange(S)[None, :]
    token_mask = ((pos >= prompt[:, None]) & (pos < input_lengths[:, None])).long()  # response tokens
    prev = -torch.rand(B, S, generator=g) - 0.05
    prev[:, 0] = 0.0  # nothing scores the first token
    gen = prev + 0.05 * torch.randn(B, S, generator=g)
    gen = gen.clamp(max=0.0)
    row_adv = torch.tensor([1.5, -0.5, 0.0, -1.0])
    return {
        "content": [f"sample {i}" for i in range(B)],
        "rewards": [1.0, 0.0, 0.5, 0.0],
        "input_lengths": input_lengths.tolist(),
        "token_ids": torch.randint(0, 100, (B, S), generator=g).tolist(),
        "token_loss_mask": token_mask.tolist(),
        "sample_loss_mask": torch.tensor([1.0, 1.0, 1.0, 0.0]).tolist(),  # the last sample filtered out
        "advantages": (row_adv[:, None] * torch.ones(B, S)).tolist(),
        "generation_logprobs": gen.tolist(),
        "prev_logprobs": prev.tolist(),
    }


def nemo_jsonl(log_data: dict[str, Any]) -> str:
    """``log_batched_dict_as_jsonl``: each line a batch of one (lists sliced [i:i+1]) plus ``idx``."""
    size = len(log_data["rewards"])
    return "".join(json.dumps({**{k: v[i : i + 1] for k, v in log_data.items()}, "idx": i}) + "\n" for i in range(size))


@pytest.fixture
def nemo_dir(tmp_path: Path) -> Path:
    d = tmp_path / "nemo-logs"
    d.mkdir()
    for step in (1, 2):
        (d / f"train_data_step{step}.jsonl").write_text(nemo_jsonl(nemo_train_data(step)))
    (d / "train_data_step1.jsonl.bak").write_text("not a dump")  # not matched: ignored
    return d


def test_nemo_rl_import_holds_the_dump_as_the_loss_reads_it(nemo_dir: Path, capsys: Any) -> None:
    code, out, err = run(capsys, "import", "nemo-rl", str(nemo_dir), str(nemo_dir.parent / "run"))
    assert code == 0, err
    assert "imported 2 step files" in out
    loaded = load_run(nemo_dir.parent / "run")
    assert loaded.info["source"] == "nemo-rl" and loaded.info["status"] == "done"
    assert "7ea279a" in loaded.info["imported"]["read_as"]
    assert [(s.step, s.micro, s.rank) for s in loaded.steps] == [(1, 0, None), (2, 0, None)]
    data = nemo_train_data(1)
    batch, config, info = load_step(loaded.steps[0].path)
    # the loss reads [:, 1:] and counts token_mask * sample_mask
    prev = torch.tensor(data["prev_logprobs"])[:, 1:]
    mask = torch.tensor(data["token_loss_mask"])[:, 1:] * torch.tensor(data["sample_loss_mask"])[:, None]
    assert torch.equal(batch.completion_mask.float(), mask.float())
    counted = mask > 0
    assert torch.equal(batch.per_token_logps[counted], prev[counted])
    assert torch.equal(batch.old_per_token_logps[counted], prev[counted])
    assert batch.advantages.tolist() == [1.5, -0.5, 0.0, 0.0]  # a row with no counted token weighs nothing
    assert info["tensors"]["row_rewards"].tolist() == data["rewards"]
    assert config.aggregation == "token-mean" and config.beta == 0.01 and config.kl_clamp == 10.0
    # NeMo RL's global counts, each + 1e-8 (its masked_mean): Σ token_mask · sample_mask, Σ sample_mask (3 kept)
    assert config.token_normalizer == float(mask.sum()) + 1e-8 and config.sequence_normalizer == 3 + 1e-8
    gen = torch.tensor(data["generation_logprobs"])[:, 1:]
    if SAMPLER_IS_A_FIELD:  # the sampler's log-probs are a batch field: a tensor of the step
        assert torch.equal(getattr(batch, SAMPLER)[counted], gen[counted].float())
    else:
        assert loaded.info["imported"]["sampler_log_probs"].startswith("step meta")
        assert torch.tensor(info["meta"]["sampling_per_token_logps"]).allclose(gen)
    diff = (prev - gen)[mask > 0].double()
    assert info["meta"]["sampler_vs_old"]["mean_abs_logp_diff"] == pytest.approx(float(diff.abs().mean()))
    assert info["meta"]["sampler_vs_old"]["token_mult_prob_error"] == pytest.approx(float(diff.abs().exp().mean()))
    assert any("current policy" in why for why in info["meta"]["cannot_check"])


def test_nemo_rl_run_checks_as_documented(nemo_dir: Path, capsys: Any) -> None:
    """No trainer loss in the dump: check-run compares nothing, so every micro-batch, step and the run are
    unchecked, with the dump's reasons, and it exits 3 (it said "all within tolerance" and exited 0 before
    the three-state verdict); it shows -; the loss is the ratio-1 breakdown: ratio 1 everywhere, KL 0 (no reference),
    token-mean of -A over the counted tokens."""
    target = nemo_dir.parent / "run"
    assert run(capsys, "import", "nemo-rl", str(nemo_dir), str(target))[0] == 0
    result = check_run(load_run(target))
    assert result.verdict == "unchecked" and result.counts()["unchecked"] == 2
    assert all(m.trainer_loss is None and m.rel_error is None and m.verdict == "unchecked" for m in result.micro)
    assert any("not in the dump" in r for r, n in result.unchecked_reasons())
    for m, step in zip(result.micro, (1, 2), strict=True):
        data = nemo_train_data(step)
        mask = torch.tensor(data["token_loss_mask"])[:, 1:] * torch.tensor(data["sample_loss_mask"])[:, None]
        adv = torch.tensor([1.5, -0.5, 0.0, -1.0])
        expected = -float((adv[:, None] * mask).sum() / mask.sum())
        assert m.lens_loss == pytest.approx(expected, rel=1e-6)
    code, out, _ = run(capsys, "check-run", str(target))
    assert code == 3 and "2 micro-batches (2 unchecked), 2 steps: unchecked" in out and "match" not in out
    assert "not compared:" in out and "the loss NeMo RL returned: it is not in the dump" in out
    assert out.splitlines()[2].split()[2] == "-"  # step 1's trainer loss: not in the dump
    code, out, _ = run(capsys, "check-run", str(target), "--json")
    assert code == 3 and json.loads(out)["verdict"] == "unchecked"


def test_nemo_rl_config_file_maps_loss_fn(nemo_dir: Path, tmp_path: Path, capsys: Any) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "loss_fn:\n  ratio_clip_max: 0.28\n  token_level_loss: false\n  use_importance_sampling_correction: true\n"
    )
    code, _, err = run(capsys, "import", "nemo-rl", str(nemo_dir), str(tmp_path / "run"), "--config", str(cfg))
    assert code == 0, err
    info = load_run(tmp_path / "run").info
    assert info["config"]["epsilon_high"] == 0.28 and info["config"]["aggregation"] == "seq-mean-token-mean"
    # the importance-sampling correction is reproduced (unbounded token weights exp(prev - generation))
    assert info["config"]["rollout_correction"] == "token_truncate" and info["config"]["rollout_is_max"] is None
    assert "use_importance_sampling_correction" in info["imported"]["mapped"]


def test_nemo_rl_counts_a_kept_sample_with_no_token_as_a_sequence(tmp_path: Path) -> None:
    # sample 1 kept (sample_loss_mask 1) but every token masked: NeMo RL's sequence mean still divides by the 3
    # kept samples (global_valid_seqs = Σ sample_mask), so its loss is 2/3 of the mean over the 2 rows with tokens
    data = nemo_train_data(3)
    data["token_loss_mask"][1] = [0] * len(data["token_loss_mask"][1])
    d = tmp_path / "dump"
    d.mkdir()
    (d / "train_data_step1.jsonl").write_text(nemo_jsonl(data))
    run_dir = import_nemo_rl(d, tmp_path / "seq", {"token_level_loss": False, "reference_policy_kl_penalty": 0.0})
    batch, config, _ = load_step(load_run(run_dir).steps[0].path)
    assert config.sequence_normalizer == 3 + 1e-8
    rows_with_tokens = grpo.evaluate(batch, dataclasses.replace(config, sequence_normalizer=None))
    assert float(grpo.evaluate(batch, config).loss) == pytest.approx(float(rows_with_tokens.loss) * 2 / 3, rel=1e-6)


def test_map_nemo_rl_places_every_field() -> None:
    m = map_nemo_rl({"ratio_clip_min": 0.1, "ratio_clip_c": 3.0, "reference_policy_kl_type": "k2", "lr": 1e-6})
    c = m.config
    assert (c.epsilon_low, c.epsilon_high, c.dual_clip, c.kl_estimator) == (0.1, 0.2, 3.0, "k2")
    assert (c.kl_log_ratio_clamp, c.kl_clamp, c.beta) == (20.0, 10.0, 0.01)
    assert m.unused == ("lr",) and "ratio_clip_min" in m.mapped
    assert "reference_policy_kl_penalty" in m.unsupported  # the KL's score-function gradient term
    gspo = map_nemo_rl({"sequence_level_importance_ratios": True, "token_level_loss": False, "use_kl_in_reward": True})
    assert gspo.config.importance_sampling_level == "sequence" and gspo.config.beta == 0.0 and not gspo.unsupported
    cispo = map_nemo_rl({"use_cispo": True}).config
    assert (cispo.objective, cispo.cispo_bounds) == ("cispo", "relative")
    assert map_nemo_rl({"disable_ppo_ratio": True}).config.objective == "gpg"
    assert "force_on_policy_ratio" in map_nemo_rl({"force_on_policy_ratio": True}).captured
    with pytest.raises(GrpoInputError, match="reference_policy_kl_type"):
        map_nemo_rl({"reference_policy_kl_type": "k4"})


# --- slime ------------------------------------------------------------------------------------------
def slime_samples(seed: int, n: int = 4) -> list[dict[str, Any]]:
    """Per-sample values as slime's rollout_data holds them (response tokens only)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        R = 3 + i
        logp = -torch.rand(R, generator=g) - 0.05
        out.append(
            {
                "tokens": torch.randint(0, 100, (R + 4,), generator=g),
                "total_lengths": R + 4,
                "response_lengths": R,
                "loss_masks": torch.tensor([1] * (R - 1) + [int(i != 1)]),
                "log_probs": logp,
                "ref_log_probs": logp - 0.1 * torch.rand(R, generator=g),
                "rollout_log_probs": (logp + 0.02 * torch.randn(R, generator=g)).clamp(max=0.0),
                "advantages": torch.full((R,), [1.0, -1.0, 0.5, -0.5][i % 4]),
                "returns": torch.full((R,), 0.0),
                "rewards": [1.0, 0.0, 1.0, 0.0][i % 4],
            }
        )
    return out


def slime_v2(rollout_id: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """``_build_dump_payload``'s dict for one DP shard (rank 0), samples in sample_index order."""
    for i, s in enumerate(samples):
        s |= {"data_parallel_rank": 0, "sample_index": i}
    return {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": 0,
        "samples": samples,
        "dp_shards": [{"rank": 0, "data_parallel_rank": 0, "sample_indices": list(range(len(samples)))}],
    }


def slime_v1(rollout_id: int, rank: int, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Before 681b3ad: ``dict(rollout_id=, rank=, rollout_data=)``, rollout_data a dict of columns."""
    columns = {k: [s[k] for s in samples] for k in samples[0]}
    return {"rollout_id": rollout_id, "rank": rank, "rollout_data": {**columns, "micro_batch_indices": [[0, 1]]}}


@pytest.fixture
def slime_dir(tmp_path: Path) -> Path:
    d = tmp_path / "dump" / "train_data"  # --dump-details DIR writes DIR/train_data/{rollout_id}.pt
    d.mkdir(parents=True)
    for rollout_id in (0, 1):
        torch.save(slime_v2(rollout_id, slime_samples(rollout_id)), d / f"{rollout_id}.pt")
    return d.parent


def test_slime_v2_import_and_its_loss(slime_dir: Path, tmp_path: Path, capsys: Any) -> None:
    cfg = tmp_path / "slime.json"
    cfg.write_text(json.dumps({"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl"}))
    code, _, err = run(capsys, "import", "slime", str(slime_dir), str(tmp_path / "run"), "--config", str(cfg))
    assert code == 0, err
    loaded = load_run(tmp_path / "run")
    assert loaded.info["source"] == "slime" and [s.step for s in loaded.steps] == [1, 2]  # rollout_id + 1
    samples = slime_samples(0)
    batch, _, info = load_step(loaded.steps[0].path)
    assert torch.equal(batch.per_token_logps[0, :3], samples[0]["log_probs"])
    assert batch.completion_mask[1].tolist() == [1, 1, 1, 0, 0, 0]  # loss_masks, padded to the longest
    assert batch.advantages.tolist() == [1.0, -1.0, 0.5, -0.5]
    # ratio 1: the loss is seq-mean-token-mean of -A + 0.1 * clamp(k3, 10) against the dumped reference
    per_row = []
    for s in samples:
        m = s["loss_masks"].float()
        x = s["ref_log_probs"] - s["log_probs"]
        kl = (x.exp() - x - 1).clamp(-10, 10)
        per_row.append(float(((-s["advantages"] + 0.1 * kl) * m).sum() / m.sum()))
    result = check_run(loaded)
    assert result.ok and result.micro[0].lens_loss == pytest.approx(sum(per_row) / 4, rel=1e-5)
    gen = samples[0]["rollout_log_probs"]
    sampler = getattr(batch, SAMPLER)[0, :3] if SAMPLER_IS_A_FIELD else torch.tensor(info["meta"][SAMPLER][0])
    assert torch.equal(sampler, gen)
    assert info["meta"]["sampler_vs_old"]["tokens"] == int(sum(s["loss_masks"].sum() for s in samples))


def test_slime_v1_per_rank_files(tmp_path: Path, capsys: Any) -> None:
    d = tmp_path / "dump"
    d.mkdir()
    samples = slime_samples(3)
    torch.save(slime_v1(0, 0, samples[:2]), d / "0_0.pt")
    torch.save(slime_v1(0, 1, samples[2:]), d / "0_1.pt")
    no_logps = [{k: v for k, v in s.items() if k != "log_probs"} for s in samples[:2]]
    torch.save(slime_v1(0, 2, no_logps), d / "0_2.pt")  # a pipeline stage before the last
    code, _, err = run(capsys, "import", "slime", str(d), str(tmp_path / "run"))
    assert code == 0, err
    loaded = load_run(tmp_path / "run")
    assert [(s.step, s.rank) for s in loaded.steps] == [(1, 0), (1, 1)]
    assert loaded.info["imported"]["skipped"] == ["0_2.pt"]
    batch, config, _ = load_step(loaded.steps[1].path)
    assert batch.advantages.tolist() == [0.5, -0.5] and config.beta == 0.0  # slime's default: no KL loss


def test_map_slime() -> None:
    m = map_slime({"eps_clip": 0.1, "eps_clip_high": 0.3, "eps_clip_c": 3.0, "calculate_per_token_loss": True})
    assert (m.config.epsilon_low, m.config.epsilon_high, m.config.dual_clip) == (0.1, 0.3, 3.0)
    assert m.config.aggregation == "token-mean" and not m.unsupported
    tis = map_slime({"use_tis": True}).config  # slime's vanilla_tis_function: clamp(ratio, tis_clip_low, tis_clip)
    assert (tis.rollout_correction, tis.rollout_is_min, tis.rollout_is_max) == ("token_truncate", 0.0, 2.0)
    with pytest.raises(GrpoInputError, match="entropy_coef"):  # not reproduced: refused by name
        map_slime({"entropy_coef": 0.01})


# --- bad input: one line, exit 2, nothing written -------------------------------------------------
class Payload:
    """An object a weights_only load must refuse: unpickling it would create the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def refused(capsys: Any, tmp_path: Path, trainer: str, src: Path, match: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(capsys, "import", trainer, str(src), str(tmp_path / "run"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and match in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run, no hidden temporary directory


def test_nemo_rl_bad_dumps_are_refused_whole(nemo_dir: Path, tmp_path: Path, capsys: Any) -> None:
    refused(capsys, tmp_path, "nemo-rl", tmp_path / "missing", "DIR")
    step2 = nemo_dir / "train_data_step2.jsonl"
    good = step2.read_text()
    step2.write_text(good[: len(good) - 40])  # the last line cut: step 1 was already written
    refused(capsys, tmp_path, "nemo-rl", nemo_dir, "train_data_step2.jsonl line 4")
    lines = good.splitlines()
    bad = json.loads(lines[0])
    bad["advantages"][0] = bad["advantages"][0][:-2]  # a shorter per-token list
    step2.write_text("\n".join([json.dumps(bad), *lines[1:]]) + "\n")
    refused(capsys, tmp_path, "nemo-rl", nemo_dir, "per-token lists of one length")
    bad = json.loads(lines[0])
    bad["advantages"][0][-1] = 7.0  # a per-token advantage that varies within a counted row
    step2.write_text("\n".join([json.dumps(bad), *lines[1:]]) + "\n")
    refused(capsys, tmp_path, "nemo-rl", nemo_dir, "advantages[0]")
    bad = json.loads(lines[1])
    bad["prev_logprobs"][0][4] = 0.5  # a positive log-prob on a counted token
    step2.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
    refused(capsys, tmp_path, "nemo-rl", nemo_dir, "per_token_logps[1]")


def test_bad_settings_are_named(nemo_dir: Path, tmp_path: Path, capsys: Any) -> None:
    cfg = tmp_path / "bad.json"
    for settings, field in (
        ({"ratio_clip_min": "0.2"}, "ratio_clip_min"),
        ({"loss_fn": {"ratio_clip_c": 0.5}}, "dual_clip"),  # NeMo RL asserts c > 1; LossConfig says so
        ([1, 2], "config"),
    ):
        cfg.write_text(json.dumps(settings))
        code, _, err = run(capsys, "import", "nemo-rl", str(nemo_dir), str(tmp_path / "run"), "--config", str(cfg))
        assert code == 2 and err.startswith(f"error: {field}") and err.count("\n") == 1, err
    cfg.write_text("{not json")
    code, _, err = run(capsys, "import", "slime", str(nemo_dir), str(tmp_path / "run"), "--config", str(cfg))
    assert code == 2 and err.startswith("error: --config")
    assert not (tmp_path / "run").exists()
    with pytest.raises(GrpoInputError, match="eps_clip_high"):
        map_slime({"eps_clip_high": True})


def test_import_never_overwrites(nemo_dir: Path, tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    code, _, err = run(capsys, "import", "nemo-rl", str(nemo_dir), str(tmp_path / "run"))
    assert code == 2 and "does not exist yet" in err
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["keep.txt"]


def test_slime_bad_dumps_are_refused(slime_dir: Path, tmp_path: Path, capsys: Any) -> None:
    target = slime_dir / "train_data" / "1.pt"
    marker = tmp_path / "unpickled"
    torch.save({**slime_v2(1, slime_samples(1)), "extra": Payload(marker)}, target)
    refused(capsys, tmp_path, "slime", slime_dir, "weights_only")
    assert not marker.exists()  # refused, never run
    torch.save(slime_v2(1, slime_samples(1)), target)
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])  # truncated
    refused(capsys, tmp_path, "slime", slime_dir, "1.pt")
    samples = slime_samples(1)
    samples[2]["advantages"] = samples[2]["advantages"][:-1]  # wrong shape
    torch.save(slime_v2(1, samples), target)
    refused(capsys, tmp_path, "slime", slime_dir, "advantages[2]")
    torch.save(torch.zeros(3), target)  # not slime's dict
    refused(capsys, tmp_path, "slime", slime_dir, "a dict")
    torch.save({**slime_v2(1, slime_samples(1)), "format_version": 3}, target)
    refused(capsys, tmp_path, "slime", slime_dir, "format_version")


def test_the_real_command(nemo_dir: Path, tmp_path: Path) -> None:
    """``python -m grpo import`` in its own process: exit 0, then exit 2 with one line on a missing dir."""
    cmd = [sys.executable, "-m", "grpo", "import", "nemo-rl"]
    ok = subprocess.run([*cmd, str(nemo_dir), str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*cmd, str(tmp_path / "nope"), str(tmp_path / "r2")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and not (tmp_path / "r2").exists()


def test_imported_runs_open_in_the_server(nemo_dir: Path, slime_dir: Path, tmp_path: Path, capsys: Any) -> None:
    """The Runs view's routes read an imported run like a captured one (the sampler rows in meta included)."""
    root = tmp_path / "runs"
    root.mkdir()
    assert run(capsys, "import", "nemo-rl", str(nemo_dir), str(root / "nemo"))[0] == 0
    assert run(capsys, "import", "slime", str(slime_dir), str(root / "slime"))[0] == 0
    with TestClient(create_app(Settings(runs_dir=str(root), process_workers=0))) as http:
        listed = http.get("/api/v1/runs").json()
        assert sorted((r["name"], r["source"]) for r in listed) == [("nemo", "nemo-rl"), ("slime", "slime")]
        for name in ("nemo", "slime"):
            detail = http.get(f"/api/v1/runs/{name}")
            assert detail.status_code == 200 and detail.json()["ok"]
            step = http.get(f"/api/v1/runs/{name}/steps/1")
            assert step.status_code == 200
            expected = check_run(load_run(root / name)).micro[0].lens_loss
            assert step.json()["breakdown"]["loss"] == pytest.approx(expected, rel=1e-6)


KILLED_IMPORT = """
import os, signal, sys
from pathlib import Path
from grpo.importers import common, nemo_rl
def killed():
    for step in nemo_rl.steps(Path(sys.argv[1])):
        yield step
        os.kill(os.getpid(), signal.SIGKILL)  # killed mid-import: no clean-up runs
common.write_run(sys.argv[2], "nemo-rl", nemo_rl.map_nemo_rl().config, killed(), {})
"""


def test_a_killed_import_leaves_nothing_the_next_one_keeps(nemo_dir: Path, tmp_path: Path, capsys: Any) -> None:
    """A SIGKILL mid-import leaves its temporary directory (no clean-up runs); the next import into that name
    removes it, since its process is gone, and leaves a live import's alone."""
    target = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILLED_IMPORT, str(nemo_dir), str(target)], cwd=ROOT)
    assert killed.returncode == -9
    left = list(tmp_path.glob(".run.import-*"))
    assert len(left) == 1 and any(left[0].rglob("*.safetensors")) and not target.exists()
    alive = tmp_path / f".run.import-{os.getpid()}-live"  # this process: still running, so never removed
    alive.mkdir()
    code, _, err = run(capsys, "import", "nemo-rl", str(nemo_dir), str(target))
    assert code == 0, err
    assert not left[0].exists() and alive.is_dir() and load_run(target).steps
