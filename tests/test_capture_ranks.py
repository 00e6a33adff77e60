"""A real TRL 1.16 GRPOTrainer run on two CPU processes (torchrun, gloo), captured per rank and checked joined.

Each process records its own loss calls (``-rank{r}`` files). TRL gathers each loss call's metrics over the
processes before it logs them, and the step's logged loss is the mean over the ranks of each rank's sum: the
check compares each rank's recomputed loss with what that rank returned, and the metrics joined over the
ranks as TRL joins them (tests/capture_ranks.py is one process of the run).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trainers import save_model

from grpo.check import check_run
from grpo.runs import load_run

pytest.importorskip("trl")
ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")


def launch(root: Path, *ranks: str) -> Path:
    """A two-process TRL run under torchrun, captured into ``root / "run"`` (``ranks``: the processes captured,
    as capture_ranks.py takes them; none: every one)."""
    save_model(root / "model")  # once, before the processes start: both load the same weights
    script = ROOT / "tests" / "capture_ranks.py"
    args = [str(root / "out"), str(root / "run"), str(root / "model"), "dapo", *ranks]
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "run"


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return launch(tmp_path_factory.mktemp("ranks"))


def test_each_rank_writes_its_own_files_and_the_first_its_log(two_ranks: Path) -> None:
    run = load_run(two_ranks)
    assert [(s.step, s.rank, s.micro) for s in run.steps] == [
        (step, rank, micro) for step in (1, 2) for rank in (0, 1) for micro in (0, 1)
    ]
    assert [p.name for p in two_ranks.glob("logged*.jsonl")] == ["logged.jsonl"]
    assert run.info["status"] == "done" and sorted(run.info["logged"], key=int)[:2] == ["1", "2"]


def test_a_step_across_ranks_checks_per_rank_and_joined(two_ranks: Path) -> None:
    check = check_run(load_run(two_ranks))
    assert check.ok, [
        (m.step, m.micro, m.rank, {k: v.diff for k, v in m.metrics.items() if not v.ok}) for m in check.micro
    ]
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    ranks = {(m.step, m.micro): set() for m in check.micro}
    for m in check.micro:
        ranks[(m.step, m.micro)].add(m.rank)
    assert set(map(frozenset, ranks.values())) == {frozenset({0, 1})}
    for s in check.steps:
        assert s.ranks == 2 and s.micro_batches == 4
        # the step's loss as the trainer logs it: each rank's sum over its micro-batches, averaged over the ranks
        assert s.trainer_loss == pytest.approx(s.logged["loss"], abs=1e-6)
        assert s.lens_loss == pytest.approx(s.trainer_loss, rel=1e-5, abs=1e-7)
        assert {"entropy", "clip_ratio/region_mean", "clip_ratio/low_min"} <= set(s.metrics) and s.ok
    # the two ranks saw different rows: their own losses differ, their gathered metrics agree
    first = {m.rank: m for m in check.micro if (m.step, m.micro) == (1, 0)}
    assert first[0].lens_loss != first[1].lens_loss
    assert first[0].metrics["entropy"].trainer == first[1].metrics["entropy"].trainer


# --- the three-state verdict: the logged loss compared, a capture of some ranks checked honestly ----------------
def _check_cli(run_dir: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "grpo", "check-run", str(run_dir), "--json", "--jobs", "2"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_whole_run_matches_with_its_logged_loss_compared(two_ranks: Path) -> None:
    """Every rank captured: each step's logged loss (the mean over the ranks of each rank's sum of returned
    losses) is compared with GRPO Lens's joined the same way, and the run's verdict is match (exit 0)."""
    done = _check_cli(two_ranks)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["verdict"] == "match" and out["unchecked"] == []
    for s in out["steps"]:
        assert s["verdict"] == "match" and s["logged_loss"]["ok"]
        assert s["logged_loss"]["trainer"] == pytest.approx(s["logged"]["loss"])
    assert {m["verdict"] for m in out["micro"]} == {"match"}


def test_a_logged_loss_changed_by_half_differs(two_ranks: Path, tmp_path: Path) -> None:
    """The finding: a step's ``loss`` in logged.jsonl moved by 0.5 gave exit 0 (the logged loss was never
    compared). Now the step differs and check-run exits 1."""
    copy = tmp_path / "run"
    shutil.copytree(two_ranks, copy)
    lines = [json.loads(line) for line in (copy / "logged.jsonl").read_text().splitlines()]
    first = next(r for r in lines if "loss" in r["metrics"])
    first["metrics"]["loss"] += 0.5
    (copy / "logged.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    done = _check_cli(copy)
    assert done.returncode == 1, done.stdout[-3000:]
    out = json.loads(done.stdout)
    bad = [s for s in out["steps"] if s["verdict"] == "differ"]
    assert out["verdict"] == "differ" and [s["step"] for s in bad] == [first["step"]]
    assert not bad[0]["logged_loss"]["ok"] and bad[0]["logged_loss"]["diff"] > 0.1


@pytest.fixture(scope="module")
def rank_zero_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return launch(tmp_path_factory.mktemp("rank0"), "0")


def test_a_capture_of_rank_zero_alone_passes_with_what_it_could_not_compare(rank_zero_only: Path) -> None:
    """The finding: captured with ranks=[0] on 2 processes, check-run exited 1 (metrics TRL gathered over both
    ranks compared with rank 0's alone). Now rank 0's returned losses are compared (match), and the gathered
    metrics and the logged loss, which need rank 1 too, are unchecked with the reason: no differ, exit 3."""
    run = load_run(rank_zero_only)
    assert {s.rank for s in run.steps} == {0} and run.info["capture"]["ranks"] == [0]
    check = check_run(run)
    assert check.verdict == "unchecked" and check.ok
    assert all(m.rel_error is not None and m.rel_error <= 1e-5 for m in check.micro)
    assert all(m.verdict == "unchecked" and m.metrics == {} for m in check.micro)
    reasons = [r for r, _ in check.unchecked_reasons()]
    assert any("2 processes" in r and "rank 0 alone" in r for r in reasons), reasons
    assert all(s.logged_loss is None and s.verdict == "unchecked" for s in check.steps)
    done = _check_cli(rank_zero_only)
    assert done.returncode == 3, done.stdout[-3000:]
    assert json.loads(done.stdout)["verdict"] == "unchecked"
