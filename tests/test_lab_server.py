"""The lab over a real uvicorn: runs stream their steps as Server-Sent Events, replay to a late
subscriber, queue behind a busy worker, cancel (freeing the worker, keeping the steps), refuse bad
input with 4xx, and a stopped server ends its streams and marks unfinished runs interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_fixtures import ROOT, free_port

from app.lab import LabRunRequest
from app.lab_workers import LabManager
from grpo.runs import load_run, load_step

Event = tuple[str, dict[str, Any]]


@contextmanager
def lab_server(runs_dir: Path, **settings: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """uvicorn with the lab's runs under ``runs_dir``; workers at normal priority so tests on a
    loaded machine are not starved (the nice level is a setting). No large-request worker process
    unless asked: the lab's requests are small (thread lane), and one would import torch for seconds
    beside the lab's own workers."""
    port = free_port()
    env = {
        **os.environ,
        "GRPO_LENS_RUNS_DIR": str(runs_dir),
        "GRPO_LENS_LAB_NICE": "0",
        "GRPO_LENS_PROCESS_WORKERS": "0",
        **{f"GRPO_LENS_{k.upper()}": v for k, v in settings.items()},
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # a hang guard, not a timing
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def read_events(response: httpx.Response) -> Iterator[Event]:
    """Parse an SSE stream: (event, data) pairs; comment lines (keep-alives) are skipped."""
    event, data = "message", ""
    for line in response.iter_lines():
        if line.startswith(":"):
            continue
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif line == "" and data:
            yield event, json.loads(data)
            event, data = "message", ""


def stream(http: httpx.Client, run_id: str) -> list[Event]:
    with http.stream("GET", f"/api/v1/lab/runs/{run_id}/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(read_events(response))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    runs_dir = tmp_path_factory.mktemp("runs")
    with lab_server(runs_dir, lab_max_concurrent="1", lab_max_steps="2000") as (url, _):
        yield url, runs_dir


@pytest.fixture(scope="module")
def http(server: tuple[str, Path]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server[0], timeout=120.0) as client:
        yield client


def test_tasks_list_the_default_and_the_comparisons(http: httpx.Client) -> None:
    body = http.get("/api/v1/lab/tasks").json()
    assert body["default"] == "count"
    assert [t["name"] for t in body["tasks"]] == ["count", "add", "length"]
    assert {c["name"] for c in body["comparisons"]} >= {"length-bias", "kl-leash", "clip-higher", "iterations"}
    for comparison in body["comparisons"]:  # each canned run is a body POST /api/v1/lab/runs accepts
        for run in comparison["runs"]:
            assert set(run) <= set(LabRunRequest.model_fields)
            LabRunRequest.model_validate(run)


def test_a_run_streams_its_steps_then_done_and_replays_to_a_late_subscriber(
    http: httpx.Client, server: tuple[str, Path]
) -> None:
    response = http.post("/api/v1/lab/runs", json={"steps": 4, "seed": 1, "name": "stream-me"})
    assert response.status_code == 202
    assert response.json()["id"] == "stream-me"
    live = stream(http, "stream-me")
    names = [e for e, _ in live]
    assert names[-1] == "done"
    steps = [d for e, d in live if e == "step"]
    assert [d["step"] for d in steps] == [1, 2, 3, 4]
    assert all({"reward", "loss", "kl", "entropy", "grad_norm"} <= set(d) for d in steps)
    assert stream(http, "stream-me") == live  # a late subscriber gets everything, in order
    run = load_run(server[1] / "stream-me")
    assert run.info["status"] == "done" and run.info["source"] == "lab"
    assert run.step_numbers() == [1, 2, 3, 4]
    _, _, info = load_step(run.steps[-1].path)
    assert info["meta"]["metrics"]["reward"] == steps[-1]["reward"]


def test_cancel_keeps_the_steps_and_frees_the_worker(http: httpx.Client, server: tuple[str, Path]) -> None:
    """One worker: the second run queues (position 1) until the first is cancelled, then runs."""
    assert http.post("/api/v1/lab/runs", json={"steps": 2000, "name": "long"}).status_code == 202
    assert http.post("/api/v1/lab/runs", json={"steps": 2, "name": "after"}).status_code == 202
    assert http.get("/api/v1/lab/runs/after/status").json()["queue_position"] == 1
    with http.stream("GET", "/api/v1/lab/runs/long/events") as response:
        events = read_events(response)
        for event, _ in events:
            assert event != "done"
            if event == "step":
                break
        assert http.delete("/api/v1/lab/runs/long").status_code in (200, 202)
        tail = [e for e, _ in events]
    assert tail[-1] == "cancelled"
    after = stream(http, "after")
    assert ("queued", {"position": 1}) in after
    assert [e for e, _ in after][-1] == "done"
    long_run = load_run(server[1] / "long")
    assert long_run.info["status"] == "cancelled"
    assert 1 <= len(long_run.step_numbers()) < 2000


def test_cancelling_a_queued_run(http: httpx.Client) -> None:
    http.post("/api/v1/lab/runs", json={"steps": 2000, "name": "busy"})
    http.post("/api/v1/lab/runs", json={"steps": 5, "name": "waiting"})
    assert http.delete("/api/v1/lab/runs/waiting").json()["status"] == "cancelled"
    assert [e for e, _ in stream(http, "waiting")][-1] == "cancelled"
    http.delete("/api/v1/lab/runs/busy")
    assert [e for e, _ in stream(http, "busy")][-1] == "cancelled"


def test_a_killed_worker_is_an_error_and_frees_its_slot(http: httpx.Client) -> None:
    http.post("/api/v1/lab/runs", json={"steps": 2000, "name": "doomed"})
    http.post("/api/v1/lab/runs", json={"steps": 1, "name": "next"})
    with http.stream("GET", "/api/v1/lab/runs/doomed/events") as response:
        events = read_events(response)
        started = next(d for e, d in events if e == "started")
        os.kill(started["pid"], signal.SIGKILL)
        last = list(events)[-1]
    assert last[0] == "error" and "died" in last[1]["message"]
    assert [e for e, _ in stream(http, "next")][-1] == "done"


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"task": "nope"}, ["body", "task"]),
        ({"steps": 5000}, ["body", "steps"]),
        ({"steps": 0}, ["body", "steps"]),
        ({"config": {"preset": "nope"}}, ["body", "config", "preset"]),
        ({"config": {"epsilon_low": -1}}, ["body", "config", "epsilon_low"]),
        ({"name": "../up"}, ["body", "name"]),
        ({"num_iterations": 0}, ["body", "num_iterations"]),
        ({"surprise": 1}, ["body", "surprise"]),
    ],
)
def test_bad_input_is_a_422_naming_the_field(http: httpx.Client, body: dict[str, Any], loc: list[str]) -> None:
    response = http.post("/api/v1/lab/runs", json=body)
    assert response.status_code == 422
    assert any(d["loc"][: len(loc)] == loc for d in response.json()["detail"]), response.json()


def test_unknown_runs_and_taken_names(http: httpx.Client) -> None:
    assert http.get("/api/v1/lab/runs/missing/events").status_code == 404
    assert http.delete("/api/v1/lab/runs/missing").status_code == 404
    assert http.post("/api/v1/lab/runs", json={"steps": 1, "name": "stream-me"}).status_code == 409


def test_restart_marks_unfinished_runs_interrupted(tmp_path: Path) -> None:
    for name, status, source in [
        ("a", "running", "lab"),
        ("b", "queued", "lab"),
        ("c", "done", "lab"),
        ("d", "running", "trl"),
    ]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"format": 1, "source": source, "status": status}))
    manager = LabManager(tmp_path, 1, 60.0, 1, 0)
    assert sorted(manager.mark_interrupted()) == ["a", "b"]
    statuses = {p.parent.name: json.loads(p.read_text())["status"] for p in tmp_path.glob("*/run.json")}
    assert statuses == {"a": "interrupted", "b": "interrupted", "c": "done", "d": "running"}


def test_a_stopped_server_ends_open_streams_and_marks_the_run_interrupted(tmp_path: Path) -> None:
    with lab_server(tmp_path) as (url, proc), httpx.Client(base_url=url, timeout=120.0) as http:
        http.post("/api/v1/lab/runs", json={"steps": 1000, "name": "open"})
        with http.stream("GET", "/api/v1/lab/runs/open/events") as response:
            events = read_events(response)
            for event, _ in events:
                if event == "step":
                    break
            start = time.monotonic()
            proc.send_signal(signal.SIGINT)
            rest = [e for e, _ in events]  # the stream ends: the server closed it
        proc.wait(timeout=60)
        stopped_after = time.monotonic() - start
    print(f"server stopped {stopped_after:.2f} s after SIGINT with a stream open")
    assert "done" not in rest  # the stream ended with the server, not with the run
    assert load_run(tmp_path / "open").info["status"] == "interrupted"
