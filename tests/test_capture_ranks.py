"""A real TRL 1.16 GRPOTrainer run on two CPU processes (torchrun, gloo), captured per rank and checked joined.

Each process records its own loss calls (``-rank{r}`` files). TRL gathers each loss call's metrics over the
processes before it logs them, and the step's logged loss is the mean over the ranks of each rank's sum: the
check compares each rank's recomputed loss with what that rank returned, and the metrics joined over the
ranks as TRL joins them (tests/capture_ranks.py is one process of the run).
"""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    save_model(root / "model")  # once, before the processes start: both load the same weights
    script = ROOT / "tests" / "capture_ranks.py"
    args = [str(root / "out"), str(root / "run"), str(root / "model"), "dapo"]
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "run"


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
