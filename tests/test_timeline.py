"""``grpo.runs.timeline``: each step's numbers against the check and against plain loops over the step files, and
how the answer is kept: answered from the kept file without reading a step file, extended by evaluating only the
new files (equal, byte for byte, to a fresh computation), recomputed when the kept file is torn or garbled, and
kept under ``cache_dir`` when the run directory cannot be written.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import grpo
import grpo.timeline
from grpo.check import check_run
from grpo.corrections import MASKED, NOT_SCORED, REJECTED, SEQUENCE_MASKED
from grpo.runs import RunWriter, load_run, load_step, timeline

ROWS, WIDTH = 6, 10
LENGTHS = [10, 7, 3, 9, 1, 5]


def tensors(seed: int) -> dict[str, torch.Tensor]:
    """Ragged rows with a sampler 0.2 off the old policy (some tokens past the token_mask bounds), and a row
    with advantage exactly 0."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(ROWS, WIDTH, generator=g) * 2 - 3.0
    adv = torch.randn(ROWS, generator=g)
    adv[seed % ROWS] = 0.0
    return {
        "per_token_logps": old + 0.2 * torch.randn(ROWS, WIDTH, generator=g),
        "old_per_token_logps": old,
        "completion_mask": torch.arange(WIDTH)[None, :] < torch.tensor(LENGTHS)[:, None],
        "advantages": adv,
        "sampling_per_token_logps": old + 0.6 * torch.randn(ROWS, WIDTH, generator=g),
    }


def write(run_dir: Path, steps: range, ranks: int = 2, micros: int = 2, metrics: tuple[str, ...] = ()) -> None:
    """A TRL run on ``ranks`` processes under a token-level masking correction; each file records GRPO Lens's loss
    (and its ``metrics``) as the trainer's (``resume``: steps added to an existing run)."""
    config = grpo.LossConfig.from_preset("trl-grpo", rollout_correction="token_mask", rollout_is_min=0.5)
    for rank in range(ranks):
        writer = RunWriter(run_dir, "trl", config, rank=rank, resume=(run_dir / "run.json").exists())
        for step in steps:
            for micro in range(micros):
                t = tensors(100 * step + 10 * rank + micro)
                path = writer.write_step(step, micro, t, {})
                assert path is not None
                batch, cfg, _ = load_step(path)
                bd = grpo.evaluate(batch, cfg)
                meta = {"loss": float(bd.loss), "processes": ranks, "metrics": {k: bd.metrics[k] for k in metrics}}
                writer.write_step(step, micro, t, meta)
        writer.close()


def breakdowns(run_dir: Path, step: int, rank: int | None = None) -> list[grpo.Breakdown]:
    out = []
    for ref in load_run(run_dir).steps:
        if ref.step == step and (rank is None or ref.rank == rank):
            batch, config, _ = load_step(ref.path)
            out.append(grpo.evaluate(batch, config))
    return out


def loop_series(bds: list[grpo.Breakdown]) -> dict[str, float]:
    """The lens's own series of a step (or one rank of it) by plain loops over every row and token."""
    counted = masked = reweighted = kept = 0
    weights = gap_sum = 0.0
    gaps: list[float] = []
    advantages: list[float] = []
    lengths: list[int] = []
    for bd in bds:
        t = bd.tokens
        for r in range(t.mask.shape[0]):
            advantages.append(float(bd.advantages[r]))
            lengths.append(int(t.mask[r].sum()))
            for c in range(t.mask.shape[1]):
                if not t.mask[r, c]:
                    continue
                counted += 1
                code = int(t.correction[r, c])
                if code in (MASKED, SEQUENCE_MASKED, REJECTED):
                    masked += 1
                else:
                    kept += 1
                    weights += float(t.is_weight[r, c])
                    reweighted += float(t.is_weight[r, c]) != 1.0
                if code != NOT_SCORED:
                    gaps.append(abs(float(t.sampler_log_ratio[r, c])))
                    gap_sum += gaps[-1]
    mean = sum(advantages) / len(advantages)
    return {
        "correction_masked": masked / counted,
        "correction_reweighted": reweighted / counted,
        "correction_mean_weight": weights / kept,
        "mismatch_mean": gap_sum / len(gaps),
        "mismatch_max": max(gaps),
        "advantage_std": math.sqrt(sum((a - mean) ** 2 for a in advantages) / (len(advantages) - 1)),
        "zero_advantage_rows": sum(a == 0 for a in advantages) / len(advantages),
        "length_mean": sum(lengths) / len(lengths),
        "length_max": max(lengths),
        "counted": counted,
    }


@pytest.mark.numerical
def test_each_step_is_the_checks_join_and_its_series_are_the_loops(tmp_path: Path) -> None:
    """Two ranks, two micro-batches: the step's loss and verdict are check_run's; the series equal plain loops
    over the step's files (every rank) and each rank's over its own; the clip fractions are the check's joined
    means (TRL's gathered metrics); policy + KL parts make the loss."""
    write(tmp_path / "r", range(1, 4))
    answer = timeline(tmp_path / "r")
    check = check_run(load_run(tmp_path / "r"))
    assert answer["ranks"] == [0, 1] and answer["verdict"] == check.verdict
    assert [s["step"] for s in answer["steps"]] == [1, 2, 3]
    for entry, step in zip(answer["steps"], check.steps, strict=True):
        assert entry["loss"]["recomputed"] == step.lens_loss and entry["verdict"] == step.verdict
        assert entry["series"]["clip_low"] == step.lens_mean["clip_ratio/low_mean"]
        assert entry["series"]["clip_dual"] is None and entry["series"]["entropy"] is None
        parts = entry["series"]["policy_loss"] + entry["series"]["kl_loss"]
        assert parts == pytest.approx(entry["loss"]["recomputed"], rel=1e-6, abs=1e-7)
        expected = loop_series(breakdowns(tmp_path / "r", entry["step"]))
        assert entry["tokens"]["counted"] == expected.pop("counted") == 4 * sum(LENGTHS)
        # every step so far counts 4 files (2 ranks x 2 micro-batches) of sum(LENGTHS) counted tokens each
        assert entry["tokens"]["cumulative"] == entry["step"] * 4 * sum(LENGTHS)
        assert entry["tokens"]["total"] == 4 * ROWS * WIDTH and entry["rows"] == 4 * ROWS
        for name, value in expected.items():  # float32 tensors summed in float64: a few ulps of float64
            assert entry["series"][name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
        assert 0 < entry["series"]["correction_masked"] < 1
        for rank in (0, 1):
            own = loop_series(breakdowns(tmp_path / "r", entry["step"], rank))
            got = entry["ranks"][str(rank)]
            assert got["tokens"]["counted"] == own.pop("counted")
            own_losses = [float(bd.loss) for bd in breakdowns(tmp_path / "r", entry["step"], rank)]
            assert got["loss"] == pytest.approx(sum(own_losses), rel=1e-12)
            for name, value in own.items():
                assert got["series"][name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    json.dumps(answer, allow_nan=False)  # strict JSON: what the web endpoint serves


def test_logged_values_sit_beside_the_series(tmp_path: Path) -> None:
    """The trainer's log at step 2 (TRL names) becomes the step's ``logged``, under the series' names."""
    write(tmp_path / "r", range(1, 3), ranks=1)
    (tmp_path / "r" / "logged.jsonl").write_text(
        json.dumps({"step": 2, "metrics": {"clip_ratio/low_mean": 0.25, "sampling/sampling_logp_difference/max": 2.5}})
        + "\n"
    )
    answer = timeline(tmp_path / "r")
    assert answer["steps"][0]["logged"] == {} and answer["steps"][0]["loss"]["logged"] is None
    assert answer["steps"][1]["logged"] == {"clip_low": 0.25, "mismatch_max": 2.5}
    names = {s["name"]: s["trainer_name"] for s in answer["series"]}
    assert names["clip_low"] == "clip_ratio/low_mean" and names["advantage_std"] is None
    assert set(names) == set(answer["steps"][0]["series"])


class Reads:
    """Counts the step files the timeline reads."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.files: list[str] = []
        real = grpo.timeline.load_step

        def counted(path: Any) -> Any:
            self.files.append(Path(path).name)
            return real(path)

        monkeypatch.setattr(grpo.timeline, "load_step", counted)


def test_a_kept_answer_is_served_without_reading_a_step_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "r", range(1, 3))
    reads = Reads(monkeypatch)
    first = timeline(tmp_path / "r")
    assert len(reads.files) == 8 and (tmp_path / "r" / ".lens-timeline.json").is_file()
    again = grpo.timeline.extend(tmp_path / "r")
    assert len(reads.files) == 8 and again.answer == first and again.evaluated == 0 and again.new_steps == []
    other = timeline(tmp_path / "r", grpo.runs.AnomalyThresholds(spike_z=2.0))  # other thresholds: recomputed
    assert len(reads.files) == 16 and other["thresholds"]["spike_z"] == 2.0


def test_extension_evaluates_only_the_new_files_and_equals_a_fresh_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "r", range(1, 3))
    timeline(tmp_path / "r")
    write(tmp_path / "r", range(3, 5))
    reads = Reads(monkeypatch)
    extended = grpo.timeline.extend(tmp_path / "r")
    assert extended.evaluated == 8 and extended.new_steps == [3, 4]
    assert sorted(reads.files) == sorted(p.name for p in (tmp_path / "r" / "steps").glob("00000[34]-*"))
    for name in (".lens-timeline.json", ".lens-timeline-files.json"):
        (tmp_path / "r" / name).unlink()
    fresh = timeline(tmp_path / "r")
    assert len(reads.files) == 8 + 16
    assert json.dumps(extended.answer) == json.dumps(fresh)


@pytest.mark.parametrize("damage", ["torn", "garbled", "not json"])
def test_a_damaged_kept_file_is_recomputed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    write(tmp_path / "r", range(1, 2))
    first = timeline(tmp_path / "r")
    for name in (".lens-timeline.json", ".lens-timeline-files.json"):
        path = tmp_path / "r" / name
        data = path.read_bytes()
        if damage == "torn":
            data = data[: len(data) // 2]
        elif damage == "garbled":
            at = data.index(b'"verdict"') if b'"verdict"' in data else len(data) // 2
            data = data[:at] + b'"verdicz"' + data[at + 9 :]
        else:
            data = b"\x00\xff{"
        path.write_bytes(data)
    reads = Reads(monkeypatch)
    assert timeline(tmp_path / "r") == first and len(reads.files) == 4


def test_a_read_only_run_keeps_its_timeline_in_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run directory refuses writes (0555; as root, which a mode does not stop, the write is refused as the
    kernel would refuse it): the answer is kept under cache_dir, named from the run's resolved path, and served
    from there."""
    run_dir = tmp_path / "r"
    write(run_dir, range(1, 2))
    os.chmod(run_dir, 0o555)
    real = grpo.timeline.write_atomic

    def refusing(path: Path, data: bytes) -> None:
        if Path(path).parent == run_dir:
            raise PermissionError(13, "Permission denied", str(path))
        real(path, data)

    monkeypatch.setattr(grpo.timeline, "write_atomic", refusing)
    try:
        done = grpo.timeline.extend(run_dir, cache_dir=tmp_path / "cache")
        assert done.kept is not None and done.kept.parent == tmp_path / "cache"
        assert not (run_dir / ".lens-timeline.json").exists()
        reads = Reads(monkeypatch)
        assert timeline(run_dir, cache_dir=tmp_path / "cache") == done.answer and reads.files == []
        assert grpo.timeline.extend(run_dir).kept is None  # nowhere to keep it: answered all the same
    finally:
        os.chmod(run_dir, 0o755)


def test_metrics_logged_over_a_window_of_steps_are_the_mean_of_its_loss_calls(tmp_path: Path) -> None:
    """TRL logging every 2 steps logs each loss-call metric as the mean over the window's calls (2 steps x 2
    micro-batches, one rank here): check-run compares the log with that mean (match), not with the logged step's
    own mean (which then differs), and the timeline says which steps the logged value covers."""
    write(tmp_path / "r", range(1, 3), ranks=1, metrics=("clip_ratio/region_mean",))
    calls = [bd.metrics["clip_ratio/region_mean"] for step in (1, 2) for bd in breakdowns(tmp_path / "r", step)]
    window_mean = sum(calls) / 4
    own = sum(calls[2:]) / 2
    assert abs(own - window_mean) > 1e-3
    for value, verdict in ((window_mean, "match"), (own, "differ")):
        (tmp_path / "r" / "logged.jsonl").write_text(
            json.dumps({"step": 2, "metrics": {"clip_ratio/region_mean": value}}) + "\n"
        )
        check = check_run(load_run(tmp_path / "r"))
        assert check.steps[1].verdict == verdict and check.steps[1].metrics["clip_ratio/region_mean"].trainer == value
    answer = timeline(tmp_path / "r")
    assert answer["steps"][1]["logged_over"] == [1, 2] and "logged_over" not in answer["steps"][0]


def test_a_run_without_steps_and_a_step_file_unread(tmp_path: Path) -> None:
    """No step files: no steps, unchecked. A file that cannot be read: its step is error with a null loss and null
    series (never 0), the other steps as ever."""
    RunWriter(tmp_path / "empty", "trl", grpo.LossConfig())
    empty = timeline(tmp_path / "empty")
    assert (empty["verdict"], empty["steps"], empty["ranks"], empty["anomalies"]) == ("unchecked", [], [], [])
    write(tmp_path / "r", range(1, 3), ranks=1, micros=1)
    (path,) = (tmp_path / "r" / "steps").glob("000001-000*")
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    answer = timeline(tmp_path / "r")
    first, second = answer["steps"]
    assert answer["verdict"] == "error" and first["verdict"] == "error" and first["loss"]["recomputed"] is None
    assert set(first["series"].values()) == {None} and first["tokens"] == {"counted": 0, "total": 0, "cumulative": 0}
    assert second["verdict"] == "match" and second["tokens"]["counted"] == sum(LENGTHS)
    assert second["tokens"]["cumulative"] == sum(LENGTHS)  # the unread step counts none


def test_the_answer_says_what_check_run_says_beside_the_verdict(tmp_path: Path) -> None:
    """``unchecked`` is ``RunCheck.unchecked_items()`` and ``errors`` each file check-run could not read, as it
    names them: for a run without step files, a run with an unreadable file, and a run that matches."""
    RunWriter(tmp_path / "empty", "trl", grpo.LossConfig())
    write(tmp_path / "r", range(1, 3), ranks=1, micros=1)
    write(tmp_path / "clean", range(1, 3), ranks=1, micros=1)
    (path,) = (tmp_path / "r" / "steps").glob("000001-000*")
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")
    for name in ("empty", "r", "clean"):
        check = check_run(load_run(tmp_path / name))
        answer = timeline(tmp_path / name)
        assert answer["unchecked"] == check.unchecked_items(), name
        assert answer["errors"] == [
            {"file": m.file, "step": m.step, "error": m.error} for m in check.micro if m.error is not None
        ], name
    assert timeline(tmp_path / "empty")["unchecked"] and not timeline(tmp_path / "empty")["errors"]
    (error,) = timeline(tmp_path / "r")["errors"]
    assert error["step"] == 1 and error["file"].endswith(path.name) and error["error"]
    assert timeline(tmp_path / "clean")["unchecked"] == timeline(tmp_path / "clean")["errors"] == []
