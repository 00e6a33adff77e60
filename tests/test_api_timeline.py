"""GET /api/v1/runs/{run}/timeline: grpo.runs.timeline served as it is, under the server's thresholds (settings),
kept in the server's cache directory when the run directory cannot be written, 404 for a run that is not there."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from test_runs import step_tensors

import grpo
import grpo.timeline
from app.main import create_app
from app.settings import Settings
from grpo.answer import dumps
from grpo.runs import AnomalyThresholds, RunWriter, load_step, timeline

CONFIG = grpo.LossConfig.from_preset("trl-grpo", beta=0.04)
SPIKE_STEP, SPIKE_ROW, SPIKE_COL = 7, 1, 2


def spiked(seed: int, step: int, spike: bool) -> dict[str, torch.Tensor]:
    """step_tensors, and at the spike step one token of row 1 (advantage -1) whose ratio is e^3 (old log-prob -4,
    new -1): its unclipped term e^3 (about 20) over the row's 3 counted tokens, a quarter of the rows' mean, adds
    about 1.7 to a loss of a few hundredths."""
    tensors = step_tensors(seed)
    if spike and step == SPIKE_STEP:
        tensors["old_per_token_logps"][SPIKE_ROW, SPIKE_COL] = -4.0
        tensors["ref_per_token_logps"][SPIKE_ROW, SPIKE_COL] = -4.05
        tensors["per_token_logps"][SPIKE_ROW, SPIKE_COL] = -1.0
    return tensors


def write_timeline_run(
    root: Path, name: str, steps: int = 10, ranks: tuple[int | None, ...] = (None,), spike: bool = True, seed: int = 0
) -> Path:
    """A run of ``steps`` steps of one micro-batch per rank, its meta and logged loss the loss GRPO Lens computes
    (so every step matches), with a planted spike at step 7 on rank ranks[0] (row 1, position 2)."""
    writers = [RunWriter(root / name, "trl", CONFIG, rank=rank) for rank in ranks]
    for step in range(1, steps + 1):
        losses = []
        for i, writer in enumerate(writers):
            tensors = spiked(seed + 100 * step + 10 * i, step, spike and i == 0)
            path = writer.write_step(step, 0, tensors, {})
            loss = float(grpo.evaluate(*load_step(path)[:2]).loss)
            writer.write_step(step, 0, tensors, {"loss": loss})
            losses.append(loss)
        writers[0].log(step, {"loss": sum(losses) / len(losses)})  # each rank's one micro-batch, mean over ranks
    writers[0].update(status="done")
    return root / name


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    root.mkdir()
    return root


def client(root: Path, tmp_path: Path, **settings: Any) -> TestClient:
    # No worker process: these runs are far under large_request_bytes, so every request takes the thread lane.
    made = Settings(runs_dir=root, cache_dir=tmp_path / "cache", process_workers=0, **settings)
    return TestClient(create_app(made))


@pytest.fixture
def http(runs_root: Path, tmp_path: Path) -> Iterator[TestClient]:
    with client(runs_root, tmp_path) as c:
        yield c


def as_json(answer: dict[str, Any]) -> Any:
    return json.loads(dumps(answer))


def test_the_answer_is_the_librarys_timeline(http: TestClient, runs_root: Path, tmp_path: Path) -> None:
    run = write_timeline_run(runs_root, "spiked")
    got = http.get("/api/v1/runs/spiked/timeline")
    assert got.status_code == 200, got.text
    fresh = tmp_path / "fresh"  # the library on a copy: its own computation, not the kept file the server wrote
    write_timeline_run(fresh, "spiked")
    assert got.json() == as_json(timeline(fresh / "spiked", AnomalyThresholds()))
    assert got.json()["run"] == "spiked" and [s["step"] for s in got.json()["steps"]] == list(range(1, 11))
    spikes = [a for a in got.json()["anomalies"] if a["kind"] == "loss_spike"]
    assert [a["step"] for a in spikes] == [SPIKE_STEP]
    assert [SPIKE_ROW, SPIKE_COL] in [t[:2] for t in spikes[0]["tokens"]]
    # the library kept it beside the run: a second read answers the same from that file
    assert (run / ".lens-timeline.json").is_file()
    assert http.get("/api/v1/runs/spiked/timeline").json() == got.json()


def test_a_missing_or_deleted_run_is_a_404(http: TestClient, runs_root: Path) -> None:
    missing = http.get("/api/v1/runs/nothing-here/timeline")
    assert missing.status_code == 404 and missing.json()["detail"][0]["loc"] == ["path", "run"]
    run = write_timeline_run(runs_root, "gone", steps=2, spike=False)
    assert http.get("/api/v1/runs/gone/timeline").status_code == 200
    for file in sorted(run.rglob("*"), reverse=True):
        file.rmdir() if file.is_dir() else file.unlink()
    run.rmdir()
    gone = http.get("/api/v1/runs/gone/timeline")
    assert gone.status_code == 404 and "gone" in gone.json()["detail"][0]["msg"]


def test_a_run_without_steps_answers_an_empty_timeline(http: TestClient, runs_root: Path) -> None:
    RunWriter(runs_root / "started", "trl", CONFIG)  # a capture that has written run.json, no step yet
    got = http.get("/api/v1/runs/started/timeline")
    assert got.status_code == 200, got.text
    assert got.json()["steps"] == [] and got.json()["anomalies"] == []


def test_a_run_json_the_rules_refuse_is_a_422(http: TestClient, runs_root: Path) -> None:
    (runs_root / "broken").mkdir()
    (runs_root / "broken" / "run.json").write_text("{nope")
    got = http.get("/api/v1/runs/broken/timeline")
    assert got.status_code == 422 and "run.json" in got.json()["detail"][0]["msg"]


def test_the_thresholds_settings_reach_the_answer(runs_root: Path, tmp_path: Path) -> None:
    write_timeline_run(runs_root, "spiked")
    # every field the server sets is a field of the library's dataclass, and its default is the library's
    defaults = Settings(runs_dir=runs_root)
    for f in dataclasses.fields(AnomalyThresholds):
        if f"timeline_{f.name}" in Settings.model_fields:
            assert getattr(defaults, f"timeline_{f.name}") == f.default, f.name
    # a spike_z past the planted spike's z-score: no spike; a window of 3 (and the rest moved too) is used
    moved = {"spike_z": 1e6, "clip_jump": 0.9, "entropy_drop": 0.1, "window": 3, "few_tokens": 2}
    with client(runs_root, tmp_path, **{f"timeline_{k}": v for k, v in moved.items()}) as c:
        got = c.get("/api/v1/runs/spiked/timeline").json()
    assert {k: got["thresholds"][k] for k in moved} == moved
    assert not [a for a in got["anomalies"] if a["kind"] == "loss_spike"]
    assert got == as_json(timeline(runs_root / "spiked", AnomalyThresholds(**moved)))


def test_the_thresholds_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GRPO_LENS_TIMELINE_SPIKE_Z", "2.5")
    monkeypatch.setenv("GRPO_LENS_TIMELINE_WINDOW", "7")
    monkeypatch.setenv("GRPO_LENS_CACHE_DIR", str(tmp_path / "elsewhere"))
    settings = Settings()
    assert (settings.timeline_spike_z, settings.timeline_window) == (2.5, 7)
    assert settings.cache_dir == tmp_path / "elsewhere"


def test_a_bad_threshold_setting_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="timeline_window"):
        Settings(timeline_window=0)
    with pytest.raises(ValueError, match="timeline_spike_z"):
        Settings(timeline_spike_z=-1)


def test_a_read_only_run_keeps_its_timeline_in_the_cache_dir(
    http: TestClient, runs_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = write_timeline_run(runs_root, "readonly", steps=3, spike=False)
    if os.geteuid() == 0:  # root writes through a directory's mode bits: the run directory refuses writes here

        def refused(path: Path, data: bytes) -> None:
            if Path(path).parent == run:
                raise PermissionError(13, "Permission denied", str(path))
            real(path, data)

        real = grpo.timeline.write_atomic
        monkeypatch.setattr(grpo.timeline, "write_atomic", refused)
    run.chmod(0o555)
    try:
        got = http.get("/api/v1/runs/readonly/timeline")
        assert got.status_code == 200, got.text
        assert not list(run.glob(".lens-timeline*"))
        cache = tmp_path / "cache"
        assert cache.stat().st_mode & 0o777 == 0o700  # made private to the server's user
        assert [f for f in cache.iterdir() if f.stat().st_size > 0]
        assert got.json() == as_json(timeline(run, AnomalyThresholds(), cache_dir=cache))
    finally:
        run.chmod(0o755)


def test_an_unchanged_timeline_revalidates_with_a_304(http: TestClient, runs_root: Path) -> None:
    run = write_timeline_run(runs_root, "tagged", steps=3, spike=False)
    aged(run)
    first = http.get("/api/v1/runs/tagged/timeline")
    etag = first.headers["etag"]
    again = http.get("/api/v1/runs/tagged/timeline", headers={"if-none-match": etag})
    assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    # a step added: a new state of the run, a new tag and the new step in the answer
    RunWriter(run, "trl", CONFIG, resume=True).write_step(4, 0, step_tensors(4), {})
    aged(run)
    after = http.get("/api/v1/runs/tagged/timeline", headers={"if-none-match": etag})
    assert after.status_code == 200 and after.headers["etag"] != etag
    assert [s["step"] for s in after.json()["steps"]] == [1, 2, 3, 4]


def test_files_too_new_to_tell_apart_get_no_etag(http: TestClient, runs_root: Path) -> None:
    write_timeline_run(runs_root, "fresh", steps=2, spike=False)  # written now: a rewrite in this tick keeps its time
    got = http.get("/api/v1/runs/fresh/timeline")
    assert got.status_code == 200 and "etag" not in got.headers


def aged(run: Path) -> None:
    """Every file of the run (and its directories) a minute old: their times then tell a later change apart, and
    the answer carries an ETag (files under 2 s old get none: a rewrite in their tick would keep their time)."""
    when = time.time() - 60
    for path in [run, *run.rglob("*")]:
        os.utime(path, (when, when))
