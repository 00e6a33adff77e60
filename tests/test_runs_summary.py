"""Run summaries (app/summaries.py): a run's page computed once and kept beside it, the listing paginated
and bounded, runs the rules refuse listed as invalid, steps and replays checked and laned as /loss is.

In process (ASGI), with no worker processes: every computation runs in this process's threads, where
a monkeypatch counts it. Files are aged on purpose (``settle``): a summary is kept only once the run's
files are RACY_SECONDS old (a file rewritten within the clock tick of the scan would keep its time).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save
from test_api_runs import write_run
from test_runs import step_tensors

from app import runview, summaries
from app.lanes import Lanes
from app.main import create_app
from app.settings import Settings
from grpo.runs import load_run, read_metadata


def settle(run: Path, age: float = 60.0) -> Path:
    """Date the run's files ``age`` seconds back, as a run written earlier is."""
    when = time.time() - age
    for path in [run / "run.json", *(run / "steps").iterdir(), run / "steps"]:
        os.utime(path, (when, when))
    return run


def client(root: Path, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings(runs_dir=str(root), process_workers=0, **settings)))


@pytest.fixture
def http(tmp_path: Path) -> Iterator[TestClient]:
    with client(tmp_path) as c:
        yield c


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runs whose every micro-batch was recomputed (check_run), one entry per computation."""
    calls: list[str] = []
    real = runview.check_run

    def check_run(run: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(run.name)
        return real(run, *args, **kwargs)

    monkeypatch.setattr(runview, "check_run", check_run)
    return calls


# --- the page: computed once, kept, recomputed when the files change -------------------------------------------
def test_the_page_is_computed_once_and_kept_out_of_the_run(
    http: TestClient, tmp_path: Path, counted: list[str]
) -> None:
    run = settle(write_run(tmp_path, "r"))
    first = http.get("/api/v1/runs/r")
    second = http.get("/api/v1/runs/r")
    assert first.status_code == second.status_code == 200
    assert first.content == second.content and first.json()["ok"]
    assert counted == ["r"]  # the second read answered from the kept summary
    assert (run / summaries.SUMMARY_FILE).is_file()
    assert len(load_run(run).steps) == 4  # not a step file
    names = zipfile.ZipFile(io.BytesIO(http.get("/api/v1/runs/r/download").content)).namelist()
    assert summaries.SUMMARY_FILE not in names and len(names) == 5


def test_a_changed_step_file_is_recomputed(http: TestClient, tmp_path: Path, counted: list[str]) -> None:
    run = settle(write_run(tmp_path, "r"))
    assert http.get("/api/v1/runs/r").json()["ok"]
    step = run / "steps" / "000002-001.safetensors"
    meta = read_metadata(step.read_bytes())
    loss = json.loads(meta["meta"])["loss"]
    tampered = {**meta, "meta": json.dumps({"loss": loss + 0.01})}
    step.write_bytes(save(step_tensors(21), metadata=tampered))  # the trainer's number, changed on disk
    settle(run, age=30)
    page = http.get("/api/v1/runs/r").json()
    assert counted == ["r", "r"]
    assert not page["ok"] and [s["ok"] for s in page["steps"]] == [True, False]
    assert http.get("/api/v1/runs/r").json() == page and counted == ["r", "r"]


def test_a_new_step_file_is_recomputed(http: TestClient, tmp_path: Path, counted: list[str]) -> None:
    run = settle(write_run(tmp_path, "r"))
    assert len(http.get("/api/v1/runs/r").json()["steps"]) == 2
    (run / "steps" / "000003-000.safetensors").write_bytes((run / "steps" / "000001-000.safetensors").read_bytes())
    settle(run, age=30)
    assert [s["step"] for s in http.get("/api/v1/runs/r").json()["steps"]] == [1, 2, 3]
    assert counted == ["r", "r"]


def test_a_warm_page_stats_no_step_file(
    http: TestClient, tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept page is answered after a few stats (run.json, steps/) while those keep their times; every
    step file is stat-ed again after RESCAN_SECONDS, which finds one rewritten in place."""
    run = settle(write_run(tmp_path, "r"))
    scans: list[str] = []
    real = summaries.scan
    monkeypatch.setattr(summaries, "scan", lambda path: scans.append(path.name) or real(path))
    assert http.get("/api/v1/runs/r").json()["ok"] and http.get("/api/v1/runs/r").json()["ok"]
    assert scans == ["r"] and counted == ["r"]
    steps = os.stat(run / "steps")
    step = run / "steps" / "000001-000.safetensors"
    meta = read_metadata(step.read_bytes())
    with open(step, "r+b") as f:  # in place: steps/ keeps its time
        f.write(save(step_tensors(10), metadata={**meta, "meta": json.dumps({"loss": 5.0})}))
        f.truncate()
    os.utime(run / "steps", ns=(steps.st_atime_ns, steps.st_mtime_ns))
    monkeypatch.setattr(summaries, "RESCAN_SECONDS", 0.0)
    assert not http.get("/api/v1/runs/r").json()["ok"]
    assert scans == ["r", "r"] and counted == ["r", "r"]


@pytest.mark.parametrize(("name", "value"), [("VERSION", "99.0"), ("DEFAULT_RTOL", 1e-3)])
def test_the_key_holds_the_version_and_the_tolerances(
    http: TestClient, tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch, name: str, value: Any
) -> None:
    settle(write_run(tmp_path, "r"))
    http.get("/api/v1/runs/r")
    monkeypatch.setattr(summaries, name, value)
    page = http.get("/api/v1/runs/r").json()
    assert counted == ["r", "r"]
    if name == "DEFAULT_RTOL":
        assert page["rtol"] == value


def test_files_written_just_now_are_not_trusted(http: TestClient, tmp_path: Path, counted: list[str]) -> None:
    write_run(tmp_path, "r")  # within RACY_SECONDS of the read: a rewrite in the same tick would go unseen
    http.get("/api/v1/runs/r")
    http.get("/api/v1/runs/r")
    assert counted == ["r", "r"]


def test_a_bad_step_file_is_its_error_in_a_kept_page(http: TestClient, tmp_path: Path, counted: list[str]) -> None:
    """A step file the check cannot read is that file's ``error`` (the verdict): the run's page is answered with
    the rest checked, the run's verdict error, the file and why named; kept like any page (one computation)."""
    run = write_run(tmp_path, "r")
    step = run / "steps" / "000001-001.safetensors"
    tensors = {**step_tensors(1), "group_size": torch.tensor([2, 2])}  # read by the check, not the cost
    step.write_bytes(save(tensors, metadata=read_metadata(step.read_bytes())))
    settle(run)
    first, second = http.get("/api/v1/runs/r"), http.get("/api/v1/runs/r")
    assert first.status_code == second.status_code == 200 and first.content == second.content
    page = second.json()
    assert page["verdict"] == "error" and not page["ok"] and page["counts"]["error"] == 1
    (bad,) = [s for s in page["steps"] if s["errors"]]
    assert bad["verdict"] == "error" and bad["errors"][0]["file"] == "000001-001.safetensors"
    assert "group_size" in bad["errors"][0]["error"] and counted == ["r"]


def test_a_torn_summary_is_refused(http: TestClient, tmp_path: Path, counted: list[str]) -> None:
    run = settle(write_run(tmp_path, "r"))
    whole = http.get("/api/v1/runs/r").content
    kept = run / summaries.SUMMARY_FILE
    kept.write_bytes(kept.read_bytes()[:-10])  # a crash before the page was all on disk
    assert http.get("/api/v1/runs/r").content == whole and counted == ["r", "r"]


def test_concurrent_first_reads_share_one_computation(
    tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first computation is held until the second read has looked for a kept page and found none:
    without one computation per run and key, both would compute."""
    run = settle(write_run(tmp_path, "r"))
    settings = Settings(runs_dir=str(tmp_path), process_workers=0)
    looked: list[Path] = []
    real_lookup, real_check = summaries.lookup, runview.check_run

    def lookup(path: Path) -> Any:
        found = real_lookup(path)
        looked.append(path)
        return found

    def check_run(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 60
        while len(looked) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        return real_check(*args, **kwargs)

    monkeypatch.setattr(summaries, "lookup", lookup)
    monkeypatch.setattr(runview, "check_run", check_run)

    async def both() -> list[Any]:
        lanes = Lanes(settings)
        return list(await asyncio.gather(*(summaries.page(lanes, run, settings) for _ in range(2))))

    first, second = asyncio.run(both())
    assert len(looked) == 2 and counted == ["r"]
    assert first.status == second.status == 200 and first.body == second.body


# --- the listing ------------------------------------------------------------------------------------------------------
def runs_of_ages(root: Path, ages: dict[str, float]) -> None:
    for name, age in ages.items():
        settle(write_run(root, name), age)


def test_the_listing_is_paginated_by_name(http: TestClient, tmp_path: Path) -> None:
    runs_of_ages(tmp_path, {"c": 30, "a": 10, "b": 20})
    first = http.get("/api/v1/runs", params={"sort": "name", "limit": 2})
    assert [r["name"] for r in first.json()] == ["a", "b"]
    assert all(r["valid"] and r["steps"] == 2 and r["files"] == 4 for r in first.json())
    assert first.headers["link"] == '</api/v1/runs?limit=2&after=b&sort=name>; rel="next"'
    last = http.get("/api/v1/runs", params={"sort": "name", "limit": 2, "after": "b"})
    assert [r["name"] for r in last.json()] == ["c"] and "link" not in last.headers


def test_the_listing_is_sorted_by_the_runs_own_time(http: TestClient, tmp_path: Path) -> None:
    runs_of_ages(tmp_path, {"old": 300, "new": 10, "mid": 100})
    # "created" is what a user wrote: it never orders the listing
    info = json.loads((tmp_path / "old" / "run.json").read_text())
    (tmp_path / "old" / "run.json").write_text(json.dumps({**info, "created": "2999-01-01T00:00:00+00:00"}))
    settle(tmp_path / "old", 300)
    assert [r["name"] for r in http.get("/api/v1/runs").json()] == ["new", "mid", "old"]
    page = http.get("/api/v1/runs", params={"limit": 1, "after": "new"})
    assert [r["name"] for r in page.json()] == ["mid"] and "after=mid" in page.headers["link"]
    gone = http.get("/api/v1/runs", params={"after": "deleted-since"})
    assert gone.status_code == 422 and gone.json()["detail"][0]["loc"] == ["query", "after"]


@pytest.mark.parametrize(
    ("params", "loc"), [({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"sort": "created"}, "sort")]
)
def test_listing_parameters_are_bounded(http: TestClient, params: dict[str, Any], loc: str) -> None:
    response = http.get("/api/v1/runs", params=params)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["query", loc]


def test_the_listing_keeps_its_entries(http: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs_of_ages(tmp_path, {"a": 30, "b": 20})
    reads: list[str] = []
    real = summaries.read_info

    def read_info(path: Path) -> Any:
        reads.append(path.name)
        return real(path)

    monkeypatch.setattr(summaries, "read_info", read_info)
    first = http.get("/api/v1/runs").json()
    assert sorted(reads) == ["a", "b"]
    assert http.get("/api/v1/runs").json() == first and sorted(reads) == ["a", "b"]  # no run.json read again
    (tmp_path / "a" / "steps" / "000001-000.safetensors").unlink()
    settle(tmp_path / "a", 25)
    assert [r["files"] for r in http.get("/api/v1/runs").json()] == [4, 3] and sorted(reads) == ["a", "a", "b"]


BAD_INFO = {
    "too-large": (lambda info: {**info, "notes": "x" * (summaries.MAX_INFO_BYTES + 1)}, "at most 1048576 bytes"),
    "nested-source": (lambda info: {**info, "source": json.loads("[" * 300 + "]" * 300)}, "source"),
    "deep-config": (lambda info: {**info, "config": json.loads("[" * 300 + "]" * 300)}, "nested"),
    "long-status": (lambda info: {**info, "status": "x" * 1000}, "status"),
    "format": (lambda info: {**info, "format": 99}, "format"),
}


def _bad(root: Path, name: str) -> str:
    change, words = BAD_INFO[name]
    run = write_run(root, name)
    (run / "run.json").write_text(json.dumps(change(json.loads((run / "run.json").read_text()))))
    settle(run)
    return words


@pytest.mark.parametrize("name", [*BAD_INFO, "lone-surrogate", "not-json"])
def test_runs_the_rules_refuse_are_listed_as_invalid(tmp_path: Path, name: str) -> None:
    if name == "lone-surrogate":
        run = write_run(tmp_path, name)
        text = (run / "run.json").read_text().replace('"trl"', '"\\ud800"')
        (run / "run.json").write_text(text)
        words = "Unicode"
    elif name == "not-json":
        (write_run(tmp_path, name) / "run.json").write_text("{nope")
        words = "valid JSON"
    else:
        words = _bad(tmp_path, name)
    settle(write_run(tmp_path, "good"))
    with client(tmp_path) as c, TestClient(c.app, raise_server_exceptions=False) as http:
        listed = http.get("/api/v1/runs", params={"sort": "name"})
        assert listed.status_code == 200, listed.text
        by_name = {r["name"]: r for r in listed.json()}
        bad, good = by_name[name], by_name["good"]
        assert good["valid"] and good["steps"] == 2
        assert bad == {"name": name, "valid": False, "error": bad["error"]} and words in bad["error"], bad
        for response in (http.get(f"/api/v1/runs/{name}"), http.get(f"/api/v1/runs/{name}/steps/1")):
            assert response.status_code == 422, response.text
            assert response.json()["detail"][0]["loc"][-1] == "run.json"


def test_a_directory_whose_name_is_no_run_name_is_listed_as_invalid(http: TestClient, tmp_path: Path) -> None:
    settle(write_run(tmp_path, "bad\nname"))
    (entry,) = http.get("/api/v1/runs").json()
    assert entry["name"] == "bad\nname" and not entry["valid"] and "run name" in entry["error"]


# --- steps and replays: limits, configs, pages ------------------------------------------------------------------------
def test_steps_runs_and_replays_past_the_padded_limit_are_413(tmp_path: Path) -> None:
    settle(write_run(tmp_path, "r"))  # micro-batches of 4 rows x 5 positions: 8 x 5 = 40 as a joined step
    with client(tmp_path, max_tokens=30) as http:
        assert http.get("/api/v1/runs/r/steps/1", params={"micro": 0}).status_code == 200
        for response in (
            http.get("/api/v1/runs/r/steps/1"),
            http.post("/api/v1/runs/r/replay", json={"config": {"preset": "trl-dapo"}}),
        ):
            if response.request.method == "POST":
                assert response.status_code == 200  # a replay evaluates each micro-batch alone
                continue
            detail = response.json()["detail"][0]
            assert response.status_code == 413 and detail["loc"] == ["path", "step"], detail
            assert "000001-000.safetensors" in detail["msg"] and "40 positions" in detail["msg"]
    with client(tmp_path, max_tokens=15) as http:
        for response in (http.get("/api/v1/runs/r"), http.post("/api/v1/runs/r/replay", json={"beta": 0.1})):
            assert response.status_code == 413, response.text
            assert "20 positions" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize("config", ['{"preset": []}', '{"preset": "nope"}', '{"beta": "x"}'])
def test_a_bad_config_on_a_step_or_a_replay_is_a_422_naming_it(http: TestClient, tmp_path: Path, config: str) -> None:
    settle(write_run(tmp_path, "r"))
    field = next(iter(json.loads(config)))
    step = http.get("/api/v1/runs/r/steps/1", params={"config": config})
    assert step.status_code == 422, step.text
    assert step.json()["detail"][0]["loc"] == ["query", "config", field]
    replayed = http.post("/api/v1/runs/r/replay", json={"config": json.loads(config)})
    assert replayed.status_code == 422, replayed.text
    assert replayed.json()["detail"][0]["loc"] == ["body", "config", field]


def test_a_replay_is_paged_by_whole_steps(tmp_path: Path) -> None:
    settle(write_run(tmp_path, "r"))  # two steps of two micro-batches
    with client(tmp_path) as http:
        whole = http.post("/api/v1/runs/r/replay", json={"config": {"preset": "trl-dr_grpo"}}).json()
    assert [s["step"] for s in whole["steps"]] == [1, 2] and whole["next"] is None
    with client(tmp_path, replay_max_micro_batches=3) as http:
        first = http.post("/api/v1/runs/r/replay", json={"config": {"preset": "trl-dr_grpo"}}).json()
        assert [s["step"] for s in first["steps"]] == [1] and first["next"] == 1
        rest = http.post("/api/v1/runs/r/replay?after=1", json={"config": {"preset": "trl-dr_grpo"}}).json()
        assert [s["step"] for s in rest["steps"]] == [2] and rest["next"] is None
        assert first["steps"] + rest["steps"] == whole["steps"]
    with client(tmp_path, replay_max_micro_batches=1) as http:
        response = http.post("/api/v1/runs/r/replay", json={"beta": 0.1})
        assert response.status_code == 413 and "holds 2 micro-batches" in response.json()["detail"][0]["msg"]


def test_a_long_run_is_summarised_in_a_worker_process(tmp_path: Path, counted: list[str]) -> None:
    """Past large_request_bytes (as the lanes size it) the page is computed in the worker process: this
    process's check_run is never called, and the page is kept for the next read all the same."""
    settle(write_run(tmp_path, "r"))
    settings = Settings(runs_dir=str(tmp_path), process_workers=1, large_request_bytes=1024)
    with TestClient(create_app(settings)) as http:
        first = http.get("/api/v1/runs/r")
        assert first.status_code == 200 and first.json()["ok"] and counted == []
    assert (tmp_path / "r" / summaries.SUMMARY_FILE).is_file()
    with client(tmp_path) as http:
        assert http.get("/api/v1/runs/r").content == first.content and counted == []
