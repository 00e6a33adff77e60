"""Round four of the hostile catalogue: run-zip uploads (item 3), runs deleted or replaced while they
are read (item 8), a rejection threshold that is not a number (item 11).

Each test sends what got a 500, a stall or a wrong answer at the base commit and checks the answer now. Races
are forced as in tests/test_hostile_store.py: a function of app.summaries is wrapped to delete (or replace) the
run between the route finding it and reading it, so "failed before" does not rest on luck. In process (ASGI).
"""

from __future__ import annotations

import io
import json
import shutil
import threading
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from api_fixtures import error_detail
from fastapi.testclient import TestClient
from safetensors.torch import save
from test_api_runs import write_run
from test_runs import step_tensors

import app.store
import app.summaries
from app.main import create_app
from app.settings import Settings
from grpo.runs import read_metadata

WAIT = 20.0  # seconds a forced pause waits at most (never reached when the code is right)


def make_client(root: Path, **settings: Any) -> TestClient:
    settings.setdefault("process_workers", 0)  # tiny runs: the thread lane; no worker spawned per test
    return TestClient(create_app(Settings(runs_dir=str(root), **settings)), raise_server_exceptions=False)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    write_run(tmp_path, "model")
    with make_client(tmp_path) as http:
        yield http, tmp_path


def zipped(members: list[tuple[str, str | bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def run_members(root: Path, name: str = "model") -> list[tuple[str, str | bytes]]:
    """The run ``name`` as zip members: run.json and its step files."""
    members: list[tuple[str, str | bytes]] = [("run.json", (root / name / "run.json").read_text())]
    for step in sorted((root / name / "steps").iterdir()):
        members.append((f"steps/{step.name}", step.read_bytes()))
    return members


def upload(http: TestClient, name: str, data: bytes) -> Any:
    return http.post("/api/v1/runs", files={"file": ("u.zip", data)}, data={"name": name})


# --- item 3: run-zip uploads -------------------------------------------------------------------------------
# The duplicate-name check counted every name against every other (list.count per name): a 6.6 MB zip of
# members named alike took 33 s in a small-request thread (57 s here). Now one pass with a set: ten times the
# members take about ten times as long, not a hundred.
def duplicates_zip(members: int) -> bytes:
    with warnings.catch_warnings():  # zipfile warns as it writes a name twice
        warnings.simplefilter("ignore", UserWarning)
        return zipped(
            [("run.json" if i % 2 else f"steps/{i // 2 + 1:06d}-000.safetensors", b"") for i in range(members)]
        )


def test_the_zip_checks_are_linear_in_the_members(runs: tuple[TestClient, Path]) -> None:
    store: app.store.RunStore = runs[0].app.state.store  # type: ignore[attr-defined]
    small, large = duplicates_zip(4_000), duplicates_zip(40_000)

    def seconds(data: bytes) -> float:
        start = time.perf_counter()
        with pytest.raises(app.store.GrpoInputError, match="more than once"):
            store.add_zip("dup", data)
        return time.perf_counter() - start

    ratio = min(seconds(large) for _ in range(2)) / min(seconds(small) for _ in range(3))
    assert ratio < 30, f"10x the members took {ratio:.0f}x as long: not linear"
    assert sorted(p.name for p in runs[1].iterdir()) == ["model"]


# The upload ran in the small requests' threads (lanes.call): four 4 MB zips held every one of them, and a
# victim's tiny /loss waited 42 s. Now a large zip is unpacked in the large lane's threads: with the one small
# thread free, /loss answers while a large upload is held mid-unpack.
def test_a_large_zip_is_unpacked_outside_the_small_requests_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run(tmp_path, "model")
    data = zipped(run_members(tmp_path))
    assert len(data) > 4096
    reached, release = threading.Event(), threading.Event()
    original = app.store.copy_member

    def held(*args: Any) -> None:
        reached.set()
        assert release.wait(WAIT)
        original(*args)

    monkeypatch.setattr(app.store, "copy_member", held)
    with make_client(tmp_path, threads=1, large_request_bytes=4096) as http, ThreadPoolExecutor(2) as pool:
        uploading = pool.submit(upload, http, "copy", data)
        try:
            assert reached.wait(WAIT)
            small = pool.submit(http.post, "/api/v1/loss", json={"per_token_logps": [[-1.0]], "rewards": [1.0]})
            assert small.result(timeout=10).status_code == 200
        finally:
            release.set()
        assert uploading.result().status_code == 201


# A step file's padded size was never priced on upload: a 30M-token step was accepted (+509 MB) and its page
# then answered 413. Now each step file is priced from its safetensors header, against /api/v1/loss's limits,
# before anything is unpacked: a 413 naming the member, nothing written, nothing loaded.
def test_a_step_past_the_padded_limit_is_a_413_before_unpacking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_run(tmp_path, "model")
    members = run_members(tmp_path)
    big = step_tensors(0, B=8, T=64)  # 512 padded positions, a valid step file
    big |= {"advantages": torch.linspace(-1, 1, 8), "row_rewards": torch.zeros(8), "row_groups": torch.arange(8) // 2}
    metadata = read_metadata((tmp_path / "model" / "steps" / "000001-000.safetensors").read_bytes())
    members.append(("steps/000003-000.safetensors", save(big, metadata)))
    unpacked: list[str] = []
    original = app.store.copy_member
    monkeypatch.setattr(app.store, "copy_member", lambda a, m, out: (unpacked.append(m.filename), original(a, m, out)))
    with make_client(tmp_path, max_tokens=500) as http:
        detail = error_detail(upload(http, "big", zipped(members)), 413)
        assert detail[0]["loc"] == ["body", "file", "steps/000003-000.safetensors"], detail
        assert "512 positions" in detail[0]["msg"] and "a setting" in detail[0]["msg"]
        assert unpacked == []
        assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
        members.pop()  # within the limit: accepted, and its page is no 413
        assert upload(http, "fits", zipped(members)).status_code == 201
        assert http.get("/api/v1/runs/fits").status_code == 200


# --- item 8: runs deleted or replaced while they are read --------------------------------------------------
# A run deleted between the route finding it and reading its files: 112 x 500 (file not found). Now the 404 a
# missing run gets. Each case wraps the function that reads next so that the run is gone when it runs.
def vanishing(
    monkeypatch: pytest.MonkeyPatch, root: Path, name: str, then: Callable[[Path], None] | None = None
) -> None:
    """Wrap app.summaries.<name>: its first call removes the run "model" (``then`` may put another in its place)."""
    original: Callable[..., Any] = getattr(app.summaries, name)
    done = threading.Event()

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not done.is_set():
            done.set()
            shutil.rmtree(root / "model")
            if then is not None:
                then(root)
        return original(*args, **kwargs)

    monkeypatch.setattr(app.summaries, name, wrapper)


READS = [
    ("lookup", "get", "/api/v1/runs/model"),  # the kept page's look-up
    ("load_run", "get", "/api/v1/runs/model"),  # computing the page
    ("step_plan", "get", "/api/v1/runs/model/steps/1"),  # pricing a step from its headers
    ("step_batch", "get", "/api/v1/runs/model/steps/2?micro=1"),  # loading the step files
    ("replay_plan", "post", "/api/v1/runs/model/replay"),
    ("replay", "post", "/api/v1/runs/model/replay"),
    ("step_input", "get", "/api/v1/lab/runs/model/steps/1"),  # a saved step as /loss input
]


@pytest.mark.parametrize(("name", "method", "url"), READS)
def test_a_run_deleted_while_it_is_read_is_a_404(
    runs: tuple[TestClient, Path], monkeypatch: pytest.MonkeyPatch, name: str, method: str, url: str
) -> None:
    http, root = runs
    vanishing(monkeypatch, root, name)
    response = http.post(url, json={"beta": 0.0}) if method == "post" else http.get(url)
    detail = error_detail(response, 404)
    assert detail[0]["type"] == "not_found" and "model" in detail[0]["msg"], detail


# Replaced: deleted and uploaded again under its name, another run, while a read was between its steps. The
# answer is one version or the other, or a 404; never a 500.
@pytest.mark.parametrize(("name", "method", "url"), READS)
def test_a_run_replaced_while_it_is_read_is_one_version_or_a_404(
    runs: tuple[TestClient, Path], monkeypatch: pytest.MonkeyPatch, name: str, method: str, url: str
) -> None:
    http, root = runs
    write_run(root, "other")
    info = json.loads((root / "other" / "run.json").read_text())

    def replaced(root: Path) -> None:  # a run of one step: steps 2 and its micro-batches are gone
        (root / "model" / "steps").mkdir(parents=True)
        (root / "model" / "run.json").write_text(json.dumps(info | {"status": "replaced"}))
        shutil.copy(root / "other" / "steps" / "000001-000.safetensors", root / "model" / "steps")

    vanishing(monkeypatch, root, name, replaced)
    response = http.post(url, json={"beta": 0.0}) if method == "post" else http.get(url)
    assert response.status_code in (200, 404), response.text[:300]
    if response.status_code == 404:
        assert error_detail(response, 404)[0]["type"] == "not_found"


# --- item 11: a rejection threshold that is not a number ---------------------------------------------------
# rollout_rs_threshold "nan" was accepted for every criterion but k1's and rejected every token (NaN compares
# false): loss 0; "inf" passed too. Now a threshold must be finite: a 422 naming the field, for k1's
# "lower_upper" bounds as for the others' upper bound.
@pytest.mark.parametrize("threshold", ["nan", "inf", "1e400", "nan_2", "0.5_nan"])
@pytest.mark.parametrize(("criterion", "good"), [("token_k1", "2"), ("token_k2", "2"), ("seq_max_k3", "2")])
def test_a_threshold_that_is_not_finite_is_a_422_naming_it(threshold: str, criterion: str, good: str) -> None:
    body = {
        "per_token_logps": [[-1.0, -0.5]],
        "sampling_per_token_logps": [[-1.1, -0.4]],
        "rewards": [1.0],
        "config": {"preset": "verl-grpo", "rollout_rs": criterion, "rollout_rs_threshold": threshold},
    }
    with TestClient(create_app(Settings(process_workers=0)), raise_server_exceptions=False) as http:
        detail = error_detail(http.post("/api/v1/loss", json=body), 422)
        assert detail[0]["loc"][-1] == "rollout_rs_threshold" and "finite" in detail[0]["msg"], detail
        body["config"]["rollout_rs_threshold"] = good
        assert http.post("/api/v1/loss", json=body).status_code == 200
