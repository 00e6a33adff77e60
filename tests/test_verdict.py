"""The three-state verdict of ``grpo.check``: match, differ, unchecked with its reasons, and a file
that cannot be read an error; check-run's exit status from it; the trainer's logged loss joined as the trainer
logs it (TRL's window over steps and ranks, transformers' non-finite filter; verl's parts over ranks and
micro-batches); a worker's error never hangs a pool.

Runs here are written by ``RunWriter`` with the trainer's numbers computed by GRPO Lens on the same file (what
a faithful trainer would have written), then changed where a test wants a difference.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
from grpo.check import LocalPool, check_run, format_check, trl_logged_loss
from grpo.check_pool import FORK_UNSAFE_MODULES
from grpo.runs import RunWriter, load_run, load_step

ROOT = Path(__file__).resolve().parent.parent


def tensors(seed: int, rows: int = 4, width: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 2 - 0.05
    return {
        "per_token_logps": (old + 0.3 * torch.randn(rows, width, generator=g)).clamp(max=-1e-3),
        "old_per_token_logps": old,
        "completion_mask": torch.arange(width)[None, :] < torch.tensor([6, 3, 5, 1])[:rows, None],
        "advantages": torch.randn(rows, generator=g),
    }


def lens_loss(path: Path) -> float:
    batch, config, _ = load_step(path)
    return float(grpo.evaluate(batch, config).loss)


def write(
    run_dir: Path,
    source: str = "trl",
    steps: int = 2,
    micros: int = 2,
    ranks: int = 1,
    meta: dict[str, Any] | None = None,
    preset: str = "trl-grpo",
) -> dict[tuple[int, int, int], float]:
    """A run whose step files record the loss GRPO Lens computes for them (``meta`` adds to each file's);
    returns each (step, rank, micro)'s loss."""
    config = grpo.LossConfig.from_preset(preset)
    losses = {}
    for rank in range(ranks):
        writer = RunWriter(run_dir, source, config, rank=None if ranks == 1 else rank)
        for step in range(1, steps + 1):
            for micro in range(micros):
                t = tensors(1000 * rank + 10 * step + micro)
                path = writer.write_step(step, micro, t, {})
                assert path is not None
                loss = lens_loss(path)
                extra = {"processes": ranks} if source == "trl" else {}
                writer.write_step(step, micro, t, {"loss": loss, **extra, **(meta or {})})
                losses[(step, rank, micro)] = loss
        writer.close()
    return losses


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "grpo", "check-run", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def log(run_dir: Path, records: list[tuple[int, dict[str, float]]]) -> None:
    (run_dir / "logged.jsonl").write_text("".join(json.dumps({"step": s, "metrics": m}) + "\n" for s, m in records))


# --- the verdict's states ----------------------------------------------------------------------------------------
def test_a_micro_batch_without_a_trainer_loss_is_unchecked_never_a_match(tmp_path: Path) -> None:
    """The finding: ``check_micro`` counted a micro-batch with no trainer loss as passing (``rel is None or``),
    so a run with nothing compared said "all within tolerance" and exited 0. Now it is unchecked, says why,
    and check-run exits 3."""
    writer = RunWriter(tmp_path / "r", "trl", grpo.LossConfig.from_preset("trl-grpo"))
    writer.write_step(1, 0, tensors(0), {})
    check = check_run(load_run(tmp_path / "r"))
    (m,) = check.micro
    assert m.verdict == "unchecked" and m.trainer_loss is None and m.unchecked
    assert check.verdict == "unchecked" and check.steps[0].verdict == "unchecked"
    assert "match" not in format_check(check).replace("unchecked", "")
    done = cli(str(tmp_path / "r"))
    assert done.returncode == 3 and "the trainer's returned loss: the step file does not record it" in done.stdout


def test_exit_status_follows_the_verdict(tmp_path: Path) -> None:
    """0 match, 1 differ, 2 error (before 1), 3 unchecked (after 1); --json carries the verdict at every level."""
    write(tmp_path / "ok")
    done = cli(str(tmp_path / "ok"), "--json")
    out = json.loads(done.stdout)
    assert done.returncode == 0 and out["verdict"] == "match" and out["counts"]["match"] == 4
    assert {m["verdict"] for m in out["micro"]} == {s["verdict"] for s in out["steps"]} == {"match"}

    write(tmp_path / "bad")
    (tmp_path / "bad" / "steps" / "000002-001.safetensors").unlink()
    writer = RunWriter(tmp_path / "bad", "trl", grpo.LossConfig.from_preset("trl-grpo"), resume=True)
    t = tensors(21)
    writer.write_step(2, 1, t, {"loss": 1.0 + abs(lens_loss(writer.write_step(2, 1, t, {})))})  # type: ignore[arg-type]
    done = cli(str(tmp_path / "bad"), "--json")
    out = json.loads(done.stdout)
    assert done.returncode == 1 and out["verdict"] == "differ"
    assert [s["verdict"] for s in out["steps"]] == ["match", "differ"]

    (tmp_path / "bad" / "steps" / "000001-000.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    done = cli(str(tmp_path / "bad"), "--json")
    out = json.loads(done.stdout)
    assert done.returncode == 2 and out["verdict"] == "error" and out["counts"]["error"] == 1
    (bad,) = [m for m in out["micro"] if m["verdict"] == "error"]
    assert bad["file"] == "000001-000.safetensors" and "safetensors" in bad["error"] and bad["lens_loss"] is None


def test_a_run_without_step_files_is_unchecked(tmp_path: Path) -> None:
    RunWriter(tmp_path / "empty", "trl", grpo.LossConfig())
    check = check_run(load_run(tmp_path / "empty"))
    assert check.verdict == "unchecked" and "no step files" in check.unchecked_reasons()[0][0]
    assert cli(str(tmp_path / "empty")).returncode == 3


def test_a_dumps_own_reasons_make_it_unchecked_even_with_a_loss(tmp_path: Path) -> None:
    """An importer's ``cannot_check`` sentences: the loss compared (within tolerance) is not enough for a match
    when the dump says part of it could not be reproduced."""
    why = "the KL penalty: reference log-probs not dumped: the loss without its KL term"
    write(tmp_path / "r", steps=1, micros=1, meta={"cannot_check": [why]})
    check = check_run(load_run(tmp_path / "r"))
    assert check.verdict == "unchecked" and check.micro[0].rel_error == pytest.approx(0, abs=1e-6)
    assert check.unchecked_reasons() == [(why, 1)]


# --- the logged loss ---------------------------------------------------------------------------------------------
def test_the_logged_loss_is_the_ranks_mean_of_each_ranks_sum_over_the_window(tmp_path: Path) -> None:
    """TRL on 2 processes, 2 micro-batches a step, logging every 2 steps: the logged loss at step 2 is
    (Σ_rank Σ_{steps 1,2} Σ_micro loss) / 2 ranks / 2 steps. Matched when logged so; 1e-3 off differs."""
    losses = write(tmp_path / "r", ranks=2)
    expected = sum(losses.values()) / 2 / 2
    log(tmp_path / "r", [(2, {"loss": expected})])
    check = check_run(load_run(tmp_path / "r"))
    assert check.verdict == "match", format_check(check)
    step2 = check.steps[1]
    assert step2.logged_loss is not None and step2.logged_loss.lens == pytest.approx(expected, rel=1e-9)
    assert check.steps[0].logged_loss is None  # inside the window, not logged itself
    log(tmp_path / "r", [(2, {"loss": expected + 1e-3})])
    check = check_run(load_run(tmp_path / "r"))
    assert check.verdict == "differ" and check.steps[1].verdict == "differ" and check.steps[0].verdict == "match"


def test_a_window_with_a_step_not_captured_is_unchecked_with_why(tmp_path: Path) -> None:
    losses = write(tmp_path / "r", steps=2)
    for path in (tmp_path / "r" / "steps").glob("000001-*"):
        path.unlink()
    log(tmp_path / "r", [(2, {"loss": sum(losses.values()) / 2})])
    check = check_run(load_run(tmp_path / "r"))
    assert check.verdict == "unchecked"
    assert check.steps[0].unchecked == ["the logged loss (the mean over steps 1-2): step 1 was not captured"]


def test_a_non_finite_micro_batch_loss_is_replaced_as_transformers_does() -> None:
    """transformers' ``logging_nan_inf_filter``: a non-finite micro-batch loss adds ``tr_loss / (1 + global_step -
    last_logged)`` instead. Window steps 3-4 after a log at step 2, one rank: step 3 adds 1 and 2 (tr = 3); step 4
    (global_step 3) adds 4, then NaN -> 7 / (1 + 3 - 2) = 3.5 (tr = 10.5), then 1 (tr = 11.5); logged 11.5 / 2."""
    from grpo.check import _Step

    def step(number: int, values: list[float]) -> _Step:
        from grpo.check import MicroCheck, MicroResult

        items = [
            MicroResult(MicroCheck(number, i, None, f"{number}-{i}", v, v, 0.0, 1, {}, True), {}, 1.0, v)
            for i, v in enumerate(values)
        ]
        return _Step(number, items, [0], [], False)

    assert trl_logged_loss([step(3, [1.0, 2.0]), step(4, [4.0, math.nan, 1.0])], before=2) == 11.5 / 2


def test_verl_logs_its_parts_joined_over_ranks_and_micro_batches(tmp_path: Path) -> None:
    """verl 0.9.1 logs no total: ``actor/pg_loss`` is, per micro-batch index, the mean over the data-parallel
    ranks, then summed over the micro-batches (``aggregate_dp``, SUM once the loss is normalised globally)."""
    write(tmp_path / "r", source="verl", steps=1, micros=2, ranks=2, preset="verl-grpo")
    run = load_run(tmp_path / "r")
    parts = {}
    for ref in run.steps:
        batch, config, _ = load_step(ref.path)
        parts[(ref.rank, ref.micro)] = float(grpo.evaluate(batch, config).policy_loss)
    expected = sum((parts[(0, m)] + parts[(1, m)]) / 2 for m in (0, 1))
    log(tmp_path / "r", [(1, {"actor/pg_loss": expected})])
    check = check_run(load_run(tmp_path / "r"))
    assert check.verdict == "match" and check.steps[0].logged_loss is not None
    assert check.steps[0].logged_loss.lens == pytest.approx(expected, rel=1e-9)
    log(tmp_path / "r", [(1, {"actor/pg_loss": expected + 0.01})])
    assert check_run(load_run(tmp_path / "r")).verdict == "differ"


def test_a_trl_step_missing_a_rank_leaves_the_gathered_metrics_unchecked(tmp_path: Path) -> None:
    """The finding: with ranks=[0] on 2 processes the metrics TRL gathers over both ranks were compared with rank
    0's alone and failed a correct run. Now they are unchecked with the reason; rank 0's own loss is compared."""
    write(tmp_path / "r", ranks=2, meta={"metrics": {"clip_ratio/region_mean": 0.5}})
    for path in (tmp_path / "r" / "steps").glob("*-rank1.safetensors"):
        path.unlink()
    check = check_run(load_run(tmp_path / "r"))
    assert check.verdict == "unchecked" and check.ok
    assert all(m.metrics == {} and m.rel_error is not None for m in check.micro)
    assert "rank 0 alone was captured" in check.unchecked_reasons()[0][0]


# --- never a hang --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_bad_file_in_a_pool_is_its_error_and_the_run_finishes(tmp_path: Path, method: str) -> None:
    """The finding: a GrpoInputError raised in a pool's process could not be unpickled, which killed the pool's
    result thread: ``check-run --jobs N`` hung forever. Now the worker returns the file's error.
    Forked where Ray ran earlier in this process (``test_capture_ray``), a pool worker inherits its native threads'
    locks and the pool's ``terminate`` can wait on it forever (a full run hung here once): the fork case then runs
    in a fresh interpreter, as ``check_pool`` itself would choose to spawn."""
    if method == "fork" and any(name in sys.modules for name in FORK_UNSAFE_MODULES):
        test = f"{__file__}::test_a_bad_file_in_a_pool_is_its_error_and_the_run_finishes[fork]"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr  # 5 if nothing ran, 1 if it failed
        return
    write(tmp_path / "r", steps=2, micros=2)
    (tmp_path / "r" / "steps" / "000001-001.safetensors").write_bytes(b"not a safetensors file")
    run = load_run(tmp_path / "r")
    with multiprocessing.get_context(method).Pool(2) as p:
        result = p.apply_async(check_run, (run,), {"pool": None})  # the whole check in a worker, then pooled
        assert result.get(timeout=120).verdict == "error"
        check = check_run(run, pool=LocalPool(p, 2))
    assert [m.verdict for m in check.micro] == ["match", "error", "match", "match"]
    assert check.verdict == "error" and check.steps[0].lens_loss is None and check.steps[1].verdict == "match"


def test_check_run_jobs_finishes_on_a_file_missing_a_tensor(tmp_path: Path) -> None:
    """A step file without per_token_logps: its error, exit 2, with --jobs 2 (the default pool) in bounded time."""
    from safetensors.torch import save

    from grpo.runs import read_metadata

    write(tmp_path / "r", steps=2, micros=2)
    path = tmp_path / "r" / "steps" / "000002-000.safetensors"
    metadata = read_metadata(path.read_bytes())
    path.write_bytes(save({"completion_mask": torch.ones(2, 2)}, metadata=metadata))
    done = cli(str(tmp_path / "r"), "--jobs", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "000002-000.safetensors" in done.stdout and "per_token_logps" in done.stdout


def test_a_capture_that_chose_nothing_is_unchecked_and_says_so(tmp_path: Path) -> None:
    """The finding: ``ranks=[1]`` on one process wrote nothing, warned nothing, and check-run passed (exit 0).
    The capture now says so in run.json (``capture.chooses_nothing``) and check-run is unchecked with it: exit 3."""
    import warnings

    from grpo.runs import Sampling

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        writer = RunWriter(tmp_path / "r", "trl", grpo.LossConfig(), sampling=Sampling.of(ranks=[1]))
        writer.check_sampling(world_size=1)
        assert writer.write_step(1, 0, tensors(0), {"loss": 0.0}) is None
        writer.close()
    assert any("rank" in str(w.message) for w in said)
    check = check_run(load_run(tmp_path / "r"))
    assert check.verdict == "unchecked"
    assert any(r.startswith("the capture chose nothing: ranks [1]") for r, _ in check.unchecked_reasons())
    assert cli(str(tmp_path / "r")).returncode == 3


def test_a_bad_file_in_a_ray_pool_is_its_error(tmp_path: Path) -> None:
    """--ray: the same worker function, so a bad file comes back as its error from Ray's pool too."""
    pytest.importorskip("ray")
    write(tmp_path / "r", steps=1, micros=2)
    (tmp_path / "r" / "steps" / "000001-001.safetensors").write_bytes(b"not a safetensors file")
    done = cli(str(tmp_path / "r"), "--ray", "local", "--json")
    assert done.returncode == 2, done.stderr[-3000:]
    assert [m["verdict"] for m in json.loads(done.stdout)["micro"]] == ["match", "error"]
