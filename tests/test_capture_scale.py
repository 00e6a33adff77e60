"""Capture for long runs: sampled steps, a byte budget, logged metrics appended, a restarted job resumed.

Real TRL 1.16 GRPOTrainer runs (tests/trainers.py: 4 optimiser steps of 2 micro-batches each) captured with
``grpo.capture.trl``'s sampling arguments, and the run format's own pieces (``Sampling``, ``RunWriter.log``,
``read_logged``) on their own.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from test_runs import step_tensors

from grpo.check import check_run
from grpo.errors import GrpoInputError
from grpo.runs import RunWriter, Sampling, load_run, read_header, read_logged

CONFIG = {"preset": "article"}


@pytest.mark.parametrize(
    ("sampling", "wanted"),
    [
        (Sampling(), [1, 2, 3, 4, 5, 6, 7]),
        (Sampling.of(every=3), [1, 4, 7]),
        (Sampling.of(steps=[2, 5]), [2, 5]),
        (Sampling.of(every=3, steps=[2]), [1, 2, 4, 7]),  # either rule
        (Sampling.of(ranks=[1]), []),  # rank 0 (one process) is not chosen
    ],
)
def test_sampling_chooses_steps_and_ranks(sampling: Sampling, wanted: list[int]) -> None:
    assert [step for step in range(1, 8) if sampling.wants(step, rank=None)] == wanted
    assert [step for step in range(1, 8) if sampling.wants(step, rank=0)] == wanted


@pytest.mark.parametrize("bad", [{"every": 0}, {"every": True}, {"max_bytes": 0}, {"steps": [-1]}, {"ranks": ["0"]}])
def test_bad_sampling_names_its_argument(bad: dict[str, object]) -> None:
    with pytest.raises(GrpoInputError) as caught:
        Sampling.of(**bad)  # type: ignore[arg-type]
    assert caught.value.field == next(iter(bad))


def test_a_budget_stops_writing_once_and_says_where(tmp_path: Path) -> None:
    one = sum(t.numel() * t.element_size() for t in step_tensors(0).values())
    writer = RunWriter(tmp_path / "run", "trl", CONFIG, sampling=Sampling.of(max_bytes=3 * one))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = [writer.write_step(step, 0, step_tensors(step), {}) for step in range(1, 7)]
    writer.close()
    assert [p is not None for p in written] == [True, True, True, False, False, False]
    assert len([w for w in caught if "budget" in str(w.message)]) == 1  # said once
    capture = load_run(tmp_path / "run").info["capture"]
    assert capture == {
        "every": None,
        "steps": None,
        "ranks": None,
        "max_bytes": 3 * one,
        "files": 3,
        "bytes": 3 * one,
        "skipped_calls": 3,
        "budget_reached_at_step": 4,
    }


def test_logged_lines_are_appended_and_merged_by_step(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run", "trl", CONFIG)
    before = (tmp_path / "run" / "run.json").stat().st_mtime_ns
    for step in range(1, 101):
        writer.log(step, {"loss": float(step), "kl": None})
    writer.log(100, {"train_runtime": 3.5})  # the end-of-training summary, logged at the last step too
    # appended, one line per call; run.json untouched (a rewrite per call is quadratic over a long run)
    assert len((tmp_path / "run" / "logged.jsonl").read_bytes().splitlines()) == 101
    assert (tmp_path / "run" / "run.json").stat().st_mtime_ns == before
    logged = load_run(tmp_path / "run").info["logged"]
    assert len(logged) == 100 and logged["7"] == {"loss": 7.0, "kl": None}
    assert logged["100"] == {"loss": 100.0, "kl": None, "train_runtime": 3.5}


def test_a_torn_last_line_is_skipped_and_a_bad_line_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    RunWriter(run, "trl", CONFIG).log(1, {"loss": 1.0})
    with open(run / "logged.jsonl", "ab") as f:
        f.write(b'{"step": 2, "metr')  # a crash in the middle of a write
    assert read_logged(run) == {"1": {"loss": 1.0}}
    (run / "logged.jsonl").write_bytes(b'{"step": 1, "metrics": {"loss": "high"}}\n{"step": 2, "metrics": {}}\n')
    with pytest.raises(GrpoInputError, match="line 1"):
        load_run(run)
    (run / "logged.jsonl").write_bytes(b"[1, 2]\n")
    with pytest.raises(GrpoInputError, match="line 1"):
        load_run(run)


def test_the_first_process_lines_win(tmp_path: Path) -> None:
    run = tmp_path / "run"
    RunWriter(run, "trl", CONFIG, rank=0).log(1, {"loss": 1.0})
    RunWriter(run, "trl", CONFIG, rank=3).log(1, {"loss": 9.0, "only_rank3": 2.0})
    assert read_logged(run) == {"1": {"loss": 1.0, "only_rank3": 2.0}}


# --- real TRL runs ----------------------------------------------------------------------------------------------
trl = pytest.importorskip("trl")


def captured(tmp_path: Path, name: str, steps: int = 4, **sampling: object) -> Path:
    from trainers import grpo_trainer

    import grpo.capture

    trainer = grpo_trainer(tmp_path / f"out-{name}", "grpo", steps=steps)
    with grpo.capture.trl(trainer, tmp_path / name, **sampling):  # type: ignore[arg-type]
        trainer.train()
    assert trainer.state.global_step == steps  # training itself was never cut short
    return tmp_path / name


def test_every_other_step_of_a_real_run(tmp_path: Path) -> None:
    run = load_run(captured(tmp_path, "every2", every=2))
    assert [(s.step, s.micro) for s in run.steps] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert run.info["capture"] | {"bytes": 0} == {
        "every": 2,
        "steps": None,
        "ranks": None,
        "max_bytes": None,
        "files": 4,
        "bytes": 0,
        "skipped_calls": 4,  # steps 2 and 4, 2 loss calls each: never gathered, TRL's own loss ran alone
    }
    assert sorted(run.info["logged"], key=int) == ["1", "2", "3", "4"]  # every step's log, sampled or not
    assert "logged" not in json.loads((run.path / "run.json").read_text())
    check = check_run(run)
    assert check.ok and [s.step for s in check.steps] == [1, 3]


def tensor_bytes(path: Path) -> int:
    return sum(end - start for name, (start, end) in _offsets(path) if name != "__metadata__")


def _offsets(path: Path) -> list[tuple[str, tuple[int, int]]]:
    header = read_header(path)
    return [(name, tuple(entry["data_offsets"])) for name, entry in header.items() if name != "__metadata__"]


def test_a_budget_reached_within_a_real_step_stops_capture_not_training(tmp_path: Path) -> None:
    probe = load_run(captured(tmp_path, "probe", steps=1, every=1))
    first, second = (tensor_bytes(ref.path) for ref in probe.steps)
    assert probe.info["capture"]["bytes"] == first + second  # the budget counts the tensors' bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the same deterministic run (seed 0), a budget one byte short of step 1's two micro-batches
        run = load_run(captured(tmp_path, "budget", max_bytes=first + second - 1))
    assert len([w for w in caught if "budget" in str(w.message)]) == 1  # said once
    assert [(s.step, s.micro) for s in run.steps] == [(1, 0)]
    capture = run.info["capture"]
    assert capture["budget_reached_at_step"] == capture["incomplete_step"] == 1
    assert capture["skipped_calls"] == 7  # the rest of 4 steps x 2 micro-batches
    check = check_run(run)
    # the step's micro-batch is checked; its step-level comparison (a mean over both) is not made
    assert check.ok and len(check.micro) == 1 and check.steps[0].metrics == {}
    assert run.info["status"] == "done"


def test_a_restarted_job_resumes_its_run_without_overwriting(tmp_path: Path) -> None:
    first = load_run(captured(tmp_path, "run", steps=2))
    kept = {ref.path.name: ref.path.read_bytes() for ref in first.steps}
    # the job restarts (from step 0 again: no checkpoint) into the same directory
    second = load_run(captured(tmp_path, "run", steps=2))
    assert len(second.info["attempts"]) == 2 and second.info["created"] == first.info["created"]
    aside = tmp_path / "run" / "steps" / "superseded" / "1"
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == kept  # the first attempt's files, as written
    assert [r.path.name for r in second.steps] == sorted(kept)
    assert check_run(second).ok
    # both attempts logged steps 1 and 2, a line each: the later line wins
    records = [json.loads(line) for line in (tmp_path / "run" / "logged.jsonl").read_text().splitlines()]
    step1 = [r["metrics"] for r in records if r["step"] == 1]
    assert len(step1) == 2 and second.info["logged"]["1"] == step1[0] | step1[1]
