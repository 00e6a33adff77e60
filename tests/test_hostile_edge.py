"""The hostile catalogue, the export half: a batch file is bounded as /api/v1/loss is.

``POST /api/v1/export/{fmt}`` read its body with FastAPI's model and padded it with no limit, outside
the lanes: a 1.2 MB body (one 200,000-token row and 2,000 one-token rows, 400 M padded positions)
answered a 6.4 GB safetensors file, and as NPZ got the server OOM-killed; a 133 KB body made a 320 MB
file. Now an export reads its body as /loss does (the same 413s, before any (B, T) array exists), and
the file's own size is counted before it is written.

Against a real uvicorn under RLIMIT_AS where a regression would allocate gigabytes (it fails its
request instead of the machine); in process where the limits are small settings.
"""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from api_fixtures import ARTICLE, error_detail, serve
from fastapi.testclient import TestClient

from app import lanes
from app.main import create_app
from app.settings import Settings
from grpo.export import FORMATS

JSON = {"content-type": "application/json"}
CAP = 6 * 1024**3  # virtual memory: torch's mappings fit; one (2001 x 200000) float64 grid (3.2 GB) twice does not
MIB = 1024 * 1024


def padded_far(width: int, rows: int) -> bytes:
    """One ``width``-token row and ``rows`` one-token rows: small to send, (rows + 1) x width padded."""
    body = {"per_token_logps": [[-1.0] * width] + [[-1.0]] * rows, "advantages": [1.0] * (rows + 1)}
    return json.dumps(body).encode()


@pytest.fixture(scope="module")
def capped() -> Iterator[str]:
    with serve(memory_cap=CAP) as url:
        yield url


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize(("width", "rows"), [(200_000, 2000), (20_000, 2000)], ids=["1.2MB-to-400M", "133KB-to-40M"])
def test_export_bodies_padded_far_past_what_they_send_are_413(capped: str, fmt: str, width: int, rows: int) -> None:
    body = padded_far(width, rows)
    assert len(body) < 1.3e6
    with httpx.Client(base_url=capped, timeout=120) as http:
        detail = error_detail(http.post(f"/api/v1/export/{fmt}", content=body, headers=JSON), 413)
        assert detail[0]["loc"] == ["body", "per_token_logps"]
        padded = (rows + 1) * width
        assert f"{rows + 1} rows padded to the longest ({width} positions): {padded} positions" in detail[0]["msg"]
        # the same answer as /api/v1/loss gives the same body
        assert error_detail(http.post("/api/v1/loss", content=body, headers=JSON), 413) == detail
        assert http.post(f"/api/v1/export/{fmt}", json=ARTICLE).status_code == 200  # and the server still serves


# --- in process: the same limits as /loss, at small settings --------------------------------------------
def api(**settings: Any) -> TestClient:
    return TestClient(create_app(Settings(**settings)), raise_server_exceptions=False)


def rows_of(lengths: list[int], **extra: Any) -> dict[str, Any]:
    return {"per_token_logps": [[-0.5] * n for n in lengths], "rewards": [1.0] * len(lengths), **extra}


@pytest.mark.parametrize(
    ("settings", "body", "status"),
    [
        ({"max_tokens": 100}, rows_of([10] * 10), 200),  # at the padded limit: 10 x 10
        ({"max_tokens": 100}, rows_of([10] * 10 + [1]), 413),  # one token more is a row more: 11 x 10
        ({"max_tokens": 100}, rows_of([101]), 413),
        # 4,000 x 1,000 positions (under max_tokens) would take ~670 MB to evaluate: past a 512 MiB limit
        ({"max_request_bytes": 512 * MIB}, rows_of([1000] + [1] * 3999), 413),
    ],
    ids=["at-the-limit", "one-row-past", "one-row-too-long", "memory"],
)
def test_exports_are_bounded_like_loss(settings: dict[str, Any], body: dict[str, Any], status: int) -> None:
    http = api(**settings)
    loss = http.post("/api/v1/loss", json=body)
    assert loss.status_code == status, loss.text[:300]
    for fmt in FORMATS:
        exported = http.post(f"/api/v1/export/{fmt}", json=body)
        assert exported.status_code == status, (fmt, exported.text[:300])
        if status == 413:
            assert error_detail(exported, 413) == error_detail(loss, 413)


def test_the_files_own_size_is_counted() -> None:
    """Display strings are free to /loss, but NPZ pads each to the longest: one 200,000-character token in
    a 20 x 50 batch is a 760 MB array (4 bytes a character). The 413 names the tokens; the other formats,
    whose files hold each string once, are written."""
    lengths = [50] * 20
    tokens = [["t"] * n for n in lengths]
    tokens[0][0] = "x" * 200_000
    body = rows_of(lengths, tokens=tokens)
    http = api(max_request_bytes=1024 * MIB)
    assert http.post("/api/v1/loss", json=body).status_code == 200
    detail = error_detail(http.post("/api/v1/export/npz", json=body), 413)
    assert detail[0]["loc"] == ["body", "tokens"] and "npz file" in detail[0]["msg"], detail
    exported = http.post("/api/v1/export/json", json=body)
    assert exported.status_code == 200 and json.loads(exported.content)["tokens"][0][0] == "x" * 200_000


def test_an_export_is_answered_as_its_file() -> None:
    """The file and its headers come through the lanes' answer (a Reply with a media type)."""
    http = api()
    response = http.post("/api/v1/export/npz", json=ARTICLE)
    assert response.status_code == 200 and response.headers["content-type"] == "application/octet-stream"
    assert response.headers["content-disposition"] == 'attachment; filename="grpo-lens-input.npz"'
    arrays = np.load(io.BytesIO(response.content))
    assert arrays["per_token_logps"].tolist() == ARTICLE["per_token_logps"]
    assert "server-timing" in response.headers
    empty = error_detail(http.post("/api/v1/export/json", content=b"", headers=JSON), 422)
    assert empty[0]["loc"] == ["body"]


# --- slow clients, on both of uvicorn's parsers ----------------------------------------------------------
# `make run` and the image serve httptools (a C parser: large bodies received with little of the GIL);
# h11 stays for installs without it. Each drops a client whose headers are late, and BodyLimit answers
# a body that is late with 408, whichever parser read it.
@pytest.fixture(scope="module", params=["HeaderTimeoutHttpTools", "HeaderTimeoutH11"])
def slow_limits(request: pytest.FixtureRequest) -> Iterator[str]:
    with serve({"GRPO_LENS_REQUEST_TIMEOUT": "3"}, http=f"app.server:{request.param}") as url:
        yield url


def _socket(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def test_a_client_that_sends_its_headers_too_slowly_is_dropped(slow_limits: str) -> None:
    # two connections at once, so their two 3 s timeouts run together
    with _socket(slow_limits) as sock, _socket(slow_limits) as kept:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        # after an answer on a kept-alive connection too
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while not answer.endswith(b"}"):  # the whole answer (its JSON body ends the stream of bytes)
            answer += kept.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200")
        kept.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert sock.recv(1024) == b""  # closed by the server (the socket's own timeout is 30 s)
        assert kept.recv(1024) == b""


def test_a_client_that_sends_its_body_too_slowly_gets_408(slow_limits: str) -> None:
    with _socket(slow_limits) as sock:
        sock.sendall(
            b"POST /api/v1/loss HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 3 s" in answer


def test_both_parsers_answer_alike(slow_limits: str) -> None:
    with httpx.Client(base_url=slow_limits, timeout=60) as http:
        response = http.post("/api/v1/loss", json=ARTICLE)
        assert response.status_code == 200 and response.json()["num_positions"] == 15
        exported = http.post("/api/v1/export/safetensors", json=ARTICLE)
        assert exported.status_code == 200 and exported.headers["content-type"] == "application/octet-stream"


# --- memory back after any route ------------------------------------------------------------------------
# Only the large /loss-style jobs trimmed the heap: a listing, a download or an export on the main
# process left it at 1.27 GB from 307 MB idle. Now every response is followed by the rule.
def test_any_route_that_grew_the_process_arms_the_idle_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    lanes.trim_when_idle(None)  # no trim due from an earlier test: one due would not be postponed
    armed: list[float | None] = []
    monkeypatch.setattr(lanes, "trim_when_idle", armed.append)
    http = api(trim_idle=0.25)
    monkeypatch.setattr(lanes, "rss_bytes", lambda pid: 0)  # no larger than after the last trim
    assert http.get("/api/v1/examples/npz").status_code == 200
    assert armed == []
    monkeypatch.setattr(lanes, "rss_bytes", lambda pid: 2**50)  # far larger, after a plain GET route
    assert http.get("/api/v1/options").status_code == 200
    assert armed == [0.25]
