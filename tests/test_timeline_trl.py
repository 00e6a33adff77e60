"""The timeline of a real TRL 1.16 GRPOTrainer run on two CPU processes (torchrun, gloo) logging every 2 steps:
each step's loss and verdict are check-run's for that step, and the trainer's logged loss (logged.jsonl) sits
at the steps it logged, equal to GRPO Lens's loss joined as the trainer logs it.

Run directly (under torchrun), this file is one process of that run: ``python tests/test_timeline_trl.py
OUTPUT_DIR RUN_DIR MODEL_DIR``, as tests/capture_ranks.py is for tests/test_capture_ranks.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from trainers import end_process_group, grpo_trainer, save_model

import grpo.capture
from grpo.check import check_run
from grpo.runs import load_run, timeline

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
STEPS, LOGGING_STEPS = 4, 2


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("trl")
    root = tmp_path_factory.mktemp("timeline_trl")
    save_model(root / "model")  # once, before the processes start: both load the same weights
    args = [str(root / "out"), str(root / "run"), str(root / "model")]
    done = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", __file__, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "run"


def test_each_step_is_check_runs_and_the_trainers_log(run_dir: Path) -> None:
    run = load_run(run_dir)
    check = check_run(run)
    answer = timeline(run_dir, jobs=2)
    assert answer["ranks"] == [0, 1] and answer["verdict"] == check.verdict == "match"
    assert [s["step"] for s in answer["steps"]] == list(range(1, STEPS + 1))
    logged = {}
    for line in (run_dir / "logged.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record["metrics"]:
            logged[record["step"]] = record["metrics"]["loss"]
    assert sorted(logged) == list(range(LOGGING_STEPS, STEPS + 1, LOGGING_STEPS))
    for entry, step in zip(answer["steps"], check.steps, strict=True):
        assert entry["step"] == step.step and entry["verdict"] == step.verdict == "match"
        assert entry["loss"]["recomputed"] == step.lens_loss
        assert set(entry["ranks"]) == {"0", "1"}
        ranks_mean = sum(r["loss"] for r in entry["ranks"].values()) / 2  # DDP: the ranks' sums, meaned
        assert ranks_mean == pytest.approx(step.lens_loss, rel=1e-12, abs=1e-15)
        if step.step in logged:
            # the trainer's log: the mean over the window's 2 steps of the ranks' mean of each rank's sum
            assert entry["loss"]["logged"] == logged[step.step]
            assert step.logged_loss is not None and entry["loss"]["logged_recomputed"] == step.logged_loss.lens
            window = [e["loss"]["recomputed"] for e in answer["steps"][step.step - LOGGING_STEPS : step.step]]
            assert entry["loss"]["logged_recomputed"] == pytest.approx(sum(window) / LOGGING_STEPS, rel=1e-9)
            assert entry["loss"]["logged"] == pytest.approx(entry["loss"]["logged_recomputed"], rel=1e-5, abs=1e-7)
        else:
            assert entry["loss"]["logged"] is None
        # TRL's own metrics at the steps it logged: the mean over the window's loss calls (2 per step), so the
        # mean of the window's recomputed steps
        if step.step in logged:
            window_steps = list(range(step.step - LOGGING_STEPS + 1, step.step + 1))
            assert entry["logged_over"] == window_steps
            for name in ("entropy", "clip_region", "clip_low", "kl"):
                mean = sum(answer["steps"][n - 1]["series"][name] for n in window_steps) / LOGGING_STEPS
                assert entry["logged"][name] == pytest.approx(mean, abs=1e-6), name
        else:
            assert entry["logged"] == {} and "logged_over" not in entry
    assert not [a for a in answer["anomalies"] if a["kind"] == "differ"]


if __name__ == "__main__":  # one process of the run, under torchrun
    out, run, model = (Path(a) for a in sys.argv[1:4])
    trainer = grpo_trainer(out, "dapo", steps=STEPS, model_dir=model, logging_steps=LOGGING_STEPS)
    with grpo.capture.trl(trainer, run):
        trainer.train()
    end_process_group()
