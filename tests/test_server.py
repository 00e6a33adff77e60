"""A real uvicorn on a free loopback port: the API over a socket, the 413s for bodies past 64 MiB
and requests past 4,194,304 tokens, and that the server keeps answering after each.
"""

from __future__ import annotations

import gc
import json
import socket
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from api_fixtures import ARTICLE, client, serve
from fastapi.testclient import TestClient
from safetensors.torch import save as save_safetensors

from app.main import create_app
from app.middleware import SECURITY_HEADERS
from app.settings import Settings

LIMITS = Settings()  # the defaults the server runs with
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve() as url:
        yield url


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60.0) as c:
        yield c


def assert_still_answering(http: httpx.Client) -> None:
    assert http.get("/healthz").json()["status"] == "ok"
    response = http.post("/api/v1/loss", json=ARTICLE)
    assert response.status_code == 200 and response.json()["num_positions"] == 15


def assert_security_headers(headers: Any) -> None:
    for name, value in SECURITY_HEADERS:
        assert headers[name.decode()] == value.decode(), name


def raw_request(base_url: str, head: bytes, chunks: Iterable[bytes] = ()) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` then ``chunks`` on a fresh socket; return the status, headers and body read back.

    Sending stops quietly when the server has answered and closed (it refuses a body it will not read).
    """
    url = urlsplit(base_url)
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(head)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        response = b""
        try:
            while b"\r\n\r\n" not in response or len(response) < _expected_length(response):
                data = sock.recv(65536)
                if not data:
                    break
                response += data
        except ConnectionResetError:
            pass
    head_text, _, body = response.partition(b"\r\n\r\n")
    lines = head_text.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _expected_length(response: bytes) -> int:
    head, _, _ = response.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(response) + 1


def post_head(path: str, extra: str) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}\r\n".encode()


# --- the API over a socket -----------------------------------------------------------------------------
def test_loss_over_loopback_is_the_asgi_answer(http: httpx.Client) -> None:
    response = http.post("/api/v1/loss", json=ARTICLE)
    assert response.status_code == 200
    assert_security_headers(response.headers)
    assert response.json() == client().post("/api/v1/loss", json=ARTICLE).json()


def test_pages_and_errors_carry_the_security_headers(http: httpx.Client) -> None:
    for response in (
        http.get("/"),
        http.get("/docs"),
        http.get("/openapi.json"),
        http.get("/static/js/main.js"),
        http.get("/nope"),
        http.post("/api/v1/loss", json={"per_token_logps": [[1.0]], "rewards": [1.0]}),
    ):
        assert_security_headers(response.headers)


def test_upload_over_loopback(http: httpx.Client) -> None:
    import torch

    tensors = {"per_token_logps": -torch.rand(3, 4) - 0.01, "rewards": torch.tensor([1.0, 0.0, 1.0])}
    response = http.post("/api/v1/upload", files={"file": ("b.safetensors", save_safetensors(tensors))})
    assert response.status_code == 200, response.text[:300]
    assert response.json()["num_positions"] == 12


def test_concurrent_requests_all_answer(http: httpx.Client) -> None:
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: http.post("/api/v1/loss", json=ARTICLE).status_code, range(32)))
    assert statuses == [200] * 32


# --- 413s over a real socket, and the server keeps answering ---------------------------------------------
def test_a_declared_body_over_64_mib_is_refused_before_it_is_sent(base_url: str, http: httpx.Client) -> None:
    assert LIMITS.max_body_bytes == 64 * MIB
    length = LIMITS.max_body_bytes + 1
    status, headers, body = raw_request(base_url, post_head("/api/v1/loss", f"Content-Length: {length}\r\n"))
    assert status == 413
    assert_security_headers(headers)
    detail = json.loads(body)["detail"]
    assert detail[0]["loc"] == ["body"] and f"at most {LIMITS.max_body_bytes} bytes" in detail[0]["msg"]
    assert_still_answering(http)


def test_a_chunked_body_over_64_mib_is_refused(base_url: str, http: httpx.Client) -> None:
    """No Content-Length: the server reads up to the limit, then answers 413 and stops reading."""
    chunk = b" " * MIB

    def chunks() -> Iterator[bytes]:
        yield b"%x\r\n{\r\n" % 1
        for _ in range(LIMITS.max_body_bytes // MIB + 2):
            yield b"%x\r\n" % len(chunk) + chunk + b"\r\n"
        yield b"1\r\n}\r\n0\r\n\r\n"

    status, headers, body = raw_request(base_url, post_head("/api/v1/loss", "Transfer-Encoding: chunked\r\n"), chunks())
    assert status == 413
    assert_security_headers(headers)
    assert "at most" in json.loads(body)["detail"][0]["msg"]
    assert_still_answering(http)


def test_a_request_over_4194304_padded_positions_gets_413(http: httpx.Client) -> None:
    assert LIMITS.max_tokens == 4_194_304
    rows, per_row = 1024, LIMITS.max_tokens // 1024
    row = "[" + ",".join(["-1"] * per_row) + "]"
    extra = "[-1]"  # one token past the limit
    text = '{"per_token_logps": [' + ",".join([row] * rows + [extra]) + '], "advantages": ['
    text += ",".join(["1"] * (rows + 1)) + "]}"
    response = http.post("/api/v1/loss", content=text.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 413, response.text[:300]
    assert_security_headers(response.headers)
    detail = response.json()["detail"]
    assert detail[0]["loc"] == ["body", "per_token_logps"]
    padded = (rows + 1) * per_row  # the extra one-token row is padded to the longest row
    assert f"{padded} positions; at most {LIMITS.max_tokens} padded positions" in detail[0]["msg"]
    assert_still_answering(http)


def test_the_objects_alive_at_startup_are_out_of_the_collectors_sight(tmp_path: Any) -> None:
    """Before: every full collection walked the ~200,000 objects of the imports, 100-200 ms holding the GIL
    that each request waits on (bench/ab.py's p99 alone). Now they are frozen once the app has started:
    a collection walks what requests allocate."""
    gc.unfreeze()
    try:
        with TestClient(create_app(Settings(runs_dir=str(tmp_path), process_workers=0))) as http:
            assert http.get("/healthz").status_code == 200
            frozen = gc.get_freeze_count()
            assert frozen > 10_000  # the imports' modules, functions, classes
            assert len(gc.get_objects()) < frozen  # what a full collection walks: not them
    finally:
        gc.unfreeze()  # this test process's collector as it was
