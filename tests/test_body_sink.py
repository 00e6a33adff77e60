"""The server's body sink (``app.server.HeaderTimeoutHttpTools``): once ``BodyLimit`` spools a body whose
length it knows, httptools' parser writes the rest straight to the spool file, and the app's ``receive`` wakes
once, when the body is whole. Served for real here (uvicorn in a thread, over loopback sockets), beside
uvicorn's own httptools protocol, which must give the same bytes the old way."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app import lanes
from app.lanes import Spooled, take_spooled
from app.middleware import BodyLimit
from app.server import HeaderTimeoutHttpTools

KIB = 1024
SPOOL_BYTES = 256 * KIB
LIMIT = 32 * 1024 * KIB


class Seen:
    """What the app saw: each request's body (its digest and size, and whether it came as the spool file),
    and how many times the server's ``receive`` was called for it."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, int, bool]] = []
        self.receives: list[int] = []


def echo_app(seen: Seen) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        spooled = take_spooled(scope)
        data = spooled.read() if spooled is not None else (await receive())["body"]
        seen.bodies.append((hashlib.sha256(data).hexdigest(), len(data), spooled is not None))
        answer = f"{len(data)} {hashlib.sha256(data).hexdigest()}".encode()
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    limited = BodyLimit(app, lambda path: LIMIT, timeout=2.0, spool_bytes=SPOOL_BYTES)

    async def counting(scope: Any, receive: Any, send: Any) -> None:
        """Outermost: counts the server's own ``receive`` calls for this request."""
        calls = [0]

        async def counted() -> Any:
            calls[0] += 1
            return await receive()

        try:
            await limited(scope, counted, send)
        finally:
            if scope["type"] == "http":
                seen.receives.append(calls[0])

    return counting


@pytest.fixture
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(lanes, "SPOOL_DIR", str(tmp_path))
    return tmp_path


@contextmanager
def serving(protocol: type, seen: Seen) -> Iterator[tuple[str, int]]:
    """uvicorn with ``protocol`` on a free loopback port, in a thread of this process; its host and port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        echo_app(seen), host="127.0.0.1", port=port, http=protocol, lifespan="off", log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(30)


def post(body: bytes, path: str = "/echo") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def read_answers(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """``count`` answers off ``sock``: (status, body) each (every answer here has a Content-Length)."""
    data, answers = b"", list[tuple[int, bytes]]()
    while len(answers) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed the connection after {len(answers)} answers"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(
            int(v) for k, _, v in (line.partition(b": ") for line in lines[1:]) if k.lower() == b"content-length"
        )
        while len(data) < length:
            data += sock.recv(65536)
        answers.append((int(lines[0].split()[1]), data[:length]))
        data = data[length:]
    return answers


def expected(body: bytes) -> tuple[int, bytes]:
    return 200, f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()


PROTOCOLS = {"sink": HeaderTimeoutHttpTools, "uvicorn's": HttpToolsProtocol}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_large_body_arrives_whole_and_with_the_sink_wakes_the_app_once(spool_dir: Path, protocol: str) -> None:
    body = os.urandom(4 * 1024 * KIB + 13)  # 4 MiB and a few bytes: no chunk boundary lines up
    small = b'{"a": 1}'
    seen = Seen()
    with serving(PROTOCOLS[protocol], seen) as address, socket.create_connection(address, timeout=30) as sock:
        # The headers and the first 100 KiB first (they arrive before BodyLimit asks for the sink), the rest
        # in pieces of odd sizes, then a small request pipelined behind it on the same connection.
        request = post(body)
        cut = request.index(b"\r\n\r\n") + 4 + 100 * KIB
        sock.sendall(request[:cut])
        time.sleep(0.2)
        rest = request[cut:]
        for i in range(0, len(rest), 777_777):
            sock.sendall(rest[i : i + 777_777])
        sock.sendall(post(small))
        assert read_answers(sock, 2) == [expected(body), expected(small)]
    assert seen.bodies[0][1:] == (len(body), True) and seen.bodies[1][1:] == (len(small), False)
    if protocol == "sink":
        # the first receive wakes when the body is whole; the second gives the app its (empty) replay
        assert seen.receives[0] == 1, seen.receives
    else:
        assert seen.receives[0] > len(body) // (256 * KIB), seen.receives  # a wake-up for each piece read
    assert list(spool_dir.iterdir()) == []


def test_a_chunked_or_small_body_is_read_as_before(spool_dir: Path) -> None:
    # chunked: no Content-Length, so BodyLimit reads it chunk by chunk (its size checked against the limit as
    # it comes) and spools it itself; a small one is joined in memory
    body = os.urandom(600 * KIB)
    pieces = (body[:300_000], body[300_000:])
    chunked = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in pieces) + b"0\r\n\r\n"
    seen = Seen()
    with serving(HeaderTimeoutHttpTools, seen) as address, socket.create_connection(address, timeout=30) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
        assert read_answers(sock, 1) == [expected(body)]
        sock.sendall(post(b"x" * 1000))
        assert read_answers(sock, 1) == [expected(b"x" * 1000)]
    assert [b[1:] for b in seen.bodies] == [(len(body), True), (1000, False)]
    assert seen.receives[0] > 2  # woken for the pieces as they came
    assert list(spool_dir.iterdir()) == []


@pytest.mark.parametrize("case", ["client gone", "408 too slow"])
def test_a_sunk_body_that_never_ends_leaves_no_file(spool_dir: Path, case: str) -> None:
    seen = Seen()
    request = post(os.urandom(2 * 1024 * KIB))
    with serving(HeaderTimeoutHttpTools, seen) as address:
        with socket.create_connection(address, timeout=30) as sock:
            sock.sendall(request[: len(request) // 2])
            deadline = time.monotonic() + 10
            while sum(f.stat().st_size for f in spool_dir.iterdir()) < 512 * KIB:  # the sink writes as it comes
                assert time.monotonic() < deadline, "nothing was spooled"
                time.sleep(0.01)
            if case == "408 too slow":  # BodyLimit's timeout is 2 s here
                status, answer = read_answers(sock, 1)[0]
                assert status == 408 and b"did not arrive within 2 s" in answer
        deadline = time.monotonic() + 10
        while list(spool_dir.iterdir()) or not seen.receives:
            assert time.monotonic() < deadline, list(spool_dir.iterdir())
            time.sleep(0.01)
    assert seen.bodies == [] and seen.receives == [1]  # the app never called; one wake-up: the end


def test_a_write_that_fails_drops_the_rest_and_the_request_errs_with_no_file_left(
    spool_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    append = Spooled.append

    def failing(self: Spooled, chunk: bytes) -> None:
        if self.size > 1024 * KIB:
            raise OSError(28, "No space left on device")
        append(self, chunk)

    monkeypatch.setattr(Spooled, "append", failing)
    seen = Seen()
    body = os.urandom(3 * 1024 * KIB)
    with serving(HeaderTimeoutHttpTools, seen) as address:
        with socket.create_connection(address, timeout=30) as sock:
            sock.sendall(post(body))
            # the error reaches the app's side once the body is whole: uvicorn answers an app's exception 500
            assert read_answers(sock, 1)[0][0] == 500
        with socket.create_connection(address, timeout=30) as sock:  # the server goes on
            sock.sendall(post(b"after"))
            assert read_answers(sock, 1) == [expected(b"after")]
    assert list(spool_dir.iterdir()) == []
