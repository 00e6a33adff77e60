"""The hostile catalogue: each class of input that once ended the process or got a 500.

In process (ASGI) where the behaviour is the app's: empty counted sets, strings that cannot be
encoded, JSON nested past any parser's depth, NPZ headers that lie about sizes, content that does
not match the file name, a bug's 500. Against a real uvicorn under RLIMIT_AS where it is the
server's: bodies padded far past what they send (a regression fails the request, not the machine),
redirects and foreign Host headers, slow clients, the large-request lane.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from api_fixtures import ARTICLE, ROOT, client, error_detail, free_port, serve
from fastapi.testclient import TestClient
from safetensors.torch import save as save_safetensors

import grpo
from app.lanes import Lanes
from app.middleware import SECURITY_HEADERS
from app.settings import Settings

BASE: dict[str, Any] = {"per_token_logps": [[-1.0, -2.0], [-0.5]], "rewards": [1.0, 0.0]}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def api() -> TestClient:
    return client(raise_server_exceptions=False)


def upload(api: TestClient, name: str, data: bytes, **form: str) -> httpx.Response:
    return api.post("/api/v1/upload", files={"file": (name, data)}, data=form)


# --- empty counted sets: every position masked, under every preset, on every route ---------------------
@pytest.mark.parametrize("preset", list(grpo.PRESETS))
@pytest.mark.parametrize(
    "nothing_counts",
    [{"completion_mask": [[0, 0], [0]]}, {"prompt_lengths": [2, 1]}],
    ids=["mask-all-zero", "all-prompt"],
)
def test_a_batch_where_nothing_counts_is_answered(api: TestClient, preset: str, nothing_counts: dict[str, Any]) -> None:
    body = {**BASE, **nothing_counts, "config": {"preset": preset}}
    data = api.post("/api/v1/loss", json=body).json()
    assert data["tokens"]["mask"] == [[0, 0], [0]]
    assert data["loss"] == 0.0 and data["curves"]["points"]["ratio"] == []  # no token: nothing to place
    compared = api.post("/api/v1/compare", json={**BASE, **nothing_counts, "configs": [{"preset": preset}]})
    assert compared.status_code == 200


# --- strings that cannot be encoded --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('"tokens": [["\\ud800", "b"], ["c"]]', "tokens"),
        ('"config": {"preset": "\\udfff"}', "preset"),
        ('"\\ud83d": 1', "key"),
    ],
    ids=["token", "preset", "field-name"],
)
def test_lone_surrogates_are_replaced_not_a_500(api: TestClient, text: str, where: str) -> None:
    body = '{"per_token_logps": [[-1.0, -2.0], [-0.5]], "rewards": [1.0, 0.0], ' + text + "}"
    response = api.post("/api/v1/loss", content=body.encode(), headers=JSON)
    assert response.status_code in (200, 422), response.text[:300]
    if where == "tokens":
        assert response.json()["tokens"]["text"][0] == ["\ufffd", "b"]  # U+FFFD, the replacement character
    else:
        assert "\ufffd" in error_detail(response, 422)[0]["msg"] or where == "key"


# --- JSON nested past any depth, wherever the server parses JSON ----------------------------------------
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("field", ["config", "token_rows"])
def test_deep_json_in_upload_form_fields_is_a_422(api: TestClient, field: str) -> None:
    detail = error_detail(upload(api, "b.json", json.dumps(BASE).encode(), **{field: DEEP}), 422)
    assert detail[0]["loc"] == ["body", field] and "depth" in detail[0]["msg"]


@pytest.mark.parametrize("path", ["/api/v1/loss", "/api/v1/compare"])
def test_deep_json_bodies_are_a_422(api: TestClient, path: str) -> None:
    detail = error_detail(api.post(path, content=('{"per_token_logps": ' + DEEP + "}").encode(), headers=JSON), 422)
    assert detail[0]["loc"] == ["body"]


# --- file headers that lie about sizes; content that does not match the name ----------------------------
def npz_with_header(shape: tuple[int, ...], data: bytes) -> bytes:
    """An NPZ whose per_token_logps.npy header claims ``shape`` but holds ``data``."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": shape})
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("per_token_logps.npy", header.getvalue() + data)  # the header writer writes the magic too
        archive.writestr("rewards.npy", _npy(np.ones(1)))
    return buffer.getvalue()


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def test_an_npz_header_claiming_10_to_the_10_elements_is_refused_unread(api: TestClient) -> None:
    data = npz_with_header((100_000, 100_000), b"\x00" * 16)
    assert len(data) < 1000
    detail = error_detail(upload(api, "lie.npz", data), 422)
    assert detail[0]["loc"][:2] == ["body", "per_token_logps"]
    assert "16 bytes" in detail[0]["msg"] and "(100000, 100000)" in detail[0]["msg"]
    honest = npz_with_header((1, 2), np.array([-1.0, -0.5]).tobytes())
    assert upload(api, "honest.npz", honest).status_code == 200


def _formats() -> dict[str, bytes]:
    tensors = {"per_token_logps": -torch.rand(2, 3) - 0.01, "rewards": torch.tensor([1.0, 0.0])}
    pt = io.BytesIO()
    torch.save(tensors, pt)
    npz = io.BytesIO()
    np.savez(npz, **{k: v.numpy() for k, v in tensors.items()})
    return {
        "pt": pt.getvalue(),
        "npz": npz.getvalue(),
        "safetensors": save_safetensors(tensors),
        "json": json.dumps({k: v.tolist() for k, v in tensors.items()}).encode(),
    }


FORMATS = _formats()


@pytest.mark.parametrize("content", list(FORMATS))
@pytest.mark.parametrize("name", ["pt", "npz", "safetensors", "json"])
def test_content_that_does_not_match_the_name_is_refused(api: TestClient, content: str, name: str) -> None:
    response = upload(api, f"batch.{name}", FORMATS[content])
    if content == name:
        assert response.status_code == 200, response.text[:300]
        return
    detail = error_detail(response, 422)
    assert detail[0]["loc"] == ["body", "file"] and f"the name says .{name}" in detail[0]["msg"]


# --- a bug: a 500 with the security headers, an error id, and the traceback in the log -------------------
def test_a_500_carries_the_security_headers_and_an_error_id(
    api: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("secret detail /etc/passwd")

    monkeypatch.setattr(grpo, "evaluate", broken)
    with caplog.at_level(logging.ERROR, logger="grpo_lens"):
        response = api.post("/api/v1/loss", json=BASE)
    detail = error_detail(response, 500)
    assert "secret" not in response.text and detail[0]["type"] == "internal"
    error_id = detail[0]["msg"].split()[2].rstrip(":")
    assert any(error_id in r.getMessage() and "secret detail" in r.exc_text for r in caplog.records if r.exc_text)
    for name, value in SECURITY_HEADERS:
        assert response.headers[name.decode()] == value.decode()


def test_a_500_outside_the_routes_carries_the_security_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception that escapes every handler is answered by Starlette's outermost middleware."""
    from app import pages

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("secret")

    monkeypatch.setattr(pages.templates, "TemplateResponse", broken)
    response = client(raise_server_exceptions=False).get("/")
    assert response.status_code == 500 and "secret" not in response.text
    for name, value in SECURITY_HEADERS:
        assert response.headers[name.decode()] == value.decode()


# --- the large-request lane: bounded, and a full lane is a 503 with Retry-After --------------------------
def test_a_full_large_request_lane_is_a_503_with_retry_after() -> None:
    lanes = Lanes(Settings(process_workers=1, process_queue=0, large_request_bytes=10))
    lanes.pool = object()  # type: ignore[assignment]  # a pool that is never reached: the lane is full
    lanes.process_places.taken = 1
    import anyio

    reply = anyio.run(lanes.run, 100, lambda: None)
    assert reply.status == 503 and reply.headers["retry-after"] == "5"
    assert json.loads(reply.body)["detail"][0]["type"] == "busy"


# --- a real server under a memory cap ------------------------------------------------------------------
CAP = 6 * 1024**3  # virtual memory: torch's mappings fit; a (100001 x 2000) float64 grid per field does not


@pytest.fixture(scope="module")
def capped() -> Iterator[str]:
    env = {"GRPO_LENS_REQUEST_TIMEOUT": "3", "GRPO_LENS_LARGE_REQUEST_BYTES": "65536"}
    with serve(env, memory_cap=CAP, http="app.server:HeaderTimeoutHttpTools") as url:
        yield url


@pytest.mark.parametrize(
    ("rows", "width", "padded"),
    [(4000, 4000, 4001 * 4000), (100_000, 2000, 100_001 * 2000)],
    ids=["66KB-to-16M", "1.6MB-to-200M"],
)
def test_bodies_padded_far_past_what_they_send_are_413(capped: str, rows: int, width: int, padded: int) -> None:
    body = {"per_token_logps": [[-1.0] * width] + [[-1.0]] * rows, "advantages": [1.0] * (rows + 1)}
    with httpx.Client(base_url=capped, timeout=120) as http:
        response = http.post("/api/v1/loss", content=json.dumps(body).encode(), headers=JSON)
        detail = error_detail(response, 413)
        assert f"{rows + 1} rows padded to the longest ({width} positions): {padded} positions" in detail[0]["msg"]
        assert http.post("/api/v1/loss", json=ARTICLE).status_code == 200


def test_redirects_never_name_a_foreign_host(capped: str) -> None:
    # without a token a foreign Host is refused outright (400: DNS rebinding); an allowed one is
    # redirected by path, never to a host
    response = httpx.get(f"{capped}/static", headers={"host": "evil.example"}, follow_redirects=False)
    assert response.status_code == 400 and "location" not in response.headers
    response = httpx.get(f"{capped}/static", follow_redirects=False)
    assert response.status_code in (301, 307) and response.headers["location"] == "/static/"


def _socket(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


# The slow-client tests (late headers: dropped; a late body: 408) run for both parsers in test_hostile_edge.py.


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_workers_still_starting_do_not_outlive_a_killed_server() -> None:
    """The server killed while its workers are still starting (importing torch takes seconds): by the
    time a worker could look up its parent it has been re-parented, so it must be told its parent's
    PID; it exits instead of living on as an orphan."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(free_port())],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while not workers and time.monotonic() < deadline and proc.poll() is None:
            workers = [w for w in _children(proc.pid) if "spawn_main" in _cmdline(w)]
            time.sleep(0.01)
        assert workers, "the server started no worker"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while any(os.path.exists(f"/proc/{w}") for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [w for w in workers if os.path.exists(f"/proc/{w}")]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode(errors="replace")
    return ""


def test_worker_processes_do_not_outlive_a_killed_server() -> None:
    """A server killed outright (OOM killer, kill -9) shuts nothing down: its workers notice and exit,
    instead of staying behind as orphans holding memory."""
    pids: list[int] = []
    with serve({"GRPO_LENS_LARGE_REQUEST_BYTES": "64"}, pids=pids) as url:
        assert httpx.post(f"{url}/api/v1/loss", json=ARTICLE, timeout=120).status_code == 200  # a worker ran it
        workers = _children(pids[0])
        assert workers
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while any(os.path.exists(f"/proc/{w}") for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [w for w in workers if os.path.exists(f"/proc/{w}")]
