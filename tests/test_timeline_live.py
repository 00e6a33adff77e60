"""A run's timeline extended while the run is captured: in one process, each extension evaluates only the new
files, joins again only the steps from the last logging window before them, appends the new files' facts to the
kept list, and equals a fresh computation of the same run byte for byte (two ranks, a log every 3 steps, a step
whose files come in two calls, an earlier file written again, a changed log line).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_timeline import tensors

import grpo
import grpo.timeline
from grpo.runs import RunWriter, load_step, timeline

CONFIG = grpo.LossConfig.from_preset("trl-grpo", rollout_correction="token_mask", rollout_is_min=0.5)


def write_files(run_dir: Path, step: int, files: list[tuple[int, int]]) -> None:
    """The (rank, micro) files of ``step``, each recording GRPO Lens's loss as the trainer's."""
    for rank, micro in files:
        writer = RunWriter(run_dir, "trl", CONFIG, rank=rank, resume=(run_dir / "run.json").exists())
        t = tensors(100 * step + 10 * rank + micro)
        path = writer.write_step(step, micro, t, {})
        assert path is not None
        batch, cfg, _ = load_step(path)
        writer.write_step(step, micro, t, {"loss": float(grpo.evaluate(batch, cfg).loss), "processes": 2})
        writer.close()


def log(run_dir: Path, step: int, loss: float) -> None:
    with (run_dir / "logged.jsonl").open("a") as out:
        out.write(json.dumps({"step": step, "metrics": {"loss": loss}}) + "\n")


def fresh(run_dir: Path, where: Path) -> dict[str, Any]:
    """The timeline of a copy of the run without its kept files (another path: nothing of this process reused)."""
    copy = where / run_dir.name
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(".lens-timeline*"))
    return timeline(copy)


def test_each_extension_joins_only_the_last_window_and_equals_a_fresh_computation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "live" / "r"
    joined: list[int] = []  # the files each join of the check was given
    real = grpo.timeline.run_check_from

    def counted(r: Any, results: Any, *args: Any) -> Any:
        results = list(results)
        joined.append(len(results))
        return real(r, results, *args)

    monkeypatch.setattr(grpo.timeline, "run_check_from", counted)
    all_files = [(0, 0), (0, 1), (1, 0), (1, 1)]
    write_files(run, 1, all_files)
    assert timeline(run)["steps"][0]["step"] == 1
    listed = run / ".lens-timeline-files.json"
    for step in range(2, 15):
        before = listed.read_bytes()
        joined.clear()
        if step == 7:  # a step whose files come in two calls: its entry is answered again, changed
            write_files(run, step, all_files[:1])
            assert grpo.timeline.extend(run).evaluated == 1
            write_files(run, step, all_files[1:])
        else:
            write_files(run, step, all_files)
        if step == 10:  # a file of step 4 written again: the run joined again from its window (4..6) on
            write_files(run, 4, [(1, 1)])
        if step % 3 == 0:  # TRL logging every 3 steps: the window of steps step-2..step
            log(run, step, 0.1 * step)
        if step == 13:  # the last log line says another loss for step 12: its window joined again
            log(run, 12, 0.5)
        done = grpo.timeline.extend(run)
        rejoined = joined[-1]
        assert done.evaluated == {7: 3, 10: 5}.get(step, 4)
        assert done.new_steps == ([4, step] if step == 10 else [step])
        assert json.dumps(done.answer) == json.dumps(fresh(run, tmp_path / "fresh"))
        # the entries kept before are a prefix of the list: only the new (or changed) files' facts were appended
        assert listed.read_bytes().startswith(before) and len(listed.read_bytes()) > len(before)
        logged_before = max([n for n in range(3, step, 3)], default=0)  # the last log before the new step
        if step == 2:
            logged_before = 1  # nothing logged yet: no window, the new step alone is joined
        if step == 10:
            logged_before = 3  # step 4's window starts after the log of step 3
        if step == 13:
            logged_before = 9  # step 12's log changed: the window 10..12 is joined again
        assert rejoined == 4 * (step - logged_before)  # the files of the steps after it, 4 per step
    answer = timeline(run)
    assert [s["step"] for s in answer["steps"]] == list(range(1, 15))
    assert [s["logged_over"] for s in answer["steps"] if "logged_over" in s] == [
        [n - 2, n - 1, n] for n in range(3, 15, 3)
    ]


def test_a_torn_append_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append cut short (the kept list's last entry torn): the list is not trusted, every file evaluated
    again, and the answer is the fresh one."""
    run = tmp_path / "r"
    write_files(run, 1, [(0, 0), (1, 0)])
    timeline(run)
    write_files(run, 2, [(0, 0), (1, 0)])
    timeline(run)
    listed = run / ".lens-timeline-files.json"
    listed.write_bytes(listed.read_bytes()[:-40])
    write_files(run, 3, [(0, 0), (1, 0)])
    done = grpo.timeline.extend(run)
    assert done.evaluated == 6 and done.new_steps == [1, 2, 3]
    assert json.dumps(done.answer) == json.dumps(fresh(run, tmp_path / "fresh"))
