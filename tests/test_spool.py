"""Large bodies off the main process's GIL: a body of ``large_request_bytes`` or more is
written to a spool file chunk by chunk as it arrives (``app.middleware.BodyLimit`` into ``app.lanes.Spooled``)
and handed to its lane as that file, never joined in the server's memory: a 24 MB join was a copy into
freshly faulted pages with the GIL held, beside small requests that need it (bench/api.py, figure 5).

Behaviour is unchanged: every route answers what it answered when the body was joined; a route that does
not hand its body to a lane reads it through ``receive`` as before; a refused, late or abandoned body
leaves no file behind; a full tmpfs moves the file to the temp dir, what it held included.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
from api_fixtures import ARTICLE, serve
from fastapi.testclient import TestClient
from safetensors.numpy import save as save_safetensors

from app import lanes
from app.lanes import SPOOLED_BODY, Lanes, Spooled, take_spooled
from app.main import create_app
from app.middleware import BodyLimit
from app.settings import Settings

JSON = {"content-type": "application/json"}
KIB = 1024
SPOOL_BYTES = 256 * KIB  # what BodyLimit is given in these tests: bodies from 256 KiB on are spooled


@pytest.fixture
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The spool directory, this test's own: what is left in it is what the server left behind."""
    monkeypatch.setattr(lanes, "SPOOL_DIR", str(tmp_path))
    return tmp_path


def chunks_of(body: bytes, size: int = 64 * KIB) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def receiving(chunks: list[bytes], seen: list[int] | None = None, then: Any = None) -> Any:
    """An ASGI ``receive`` giving ``chunks`` as one whole body, or with ``then``, as the start of a body
    that never ends: after them, ``then()`` (a disconnect, or a message that never comes). Before each
    chunk, the size of every file in the spool dir goes into ``seen``."""
    queue = list(chunks)

    async def receive() -> dict[str, Any]:
        if seen is not None:
            seen.append(sum(p.stat().st_size for p in Path(lanes.SPOOL_DIR or "/nonexistent").glob("*")))
        if queue:
            chunk = queue.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(queue) or then is not None}
        if then is None:
            return {"type": "http.disconnect"}
        return await then()

    return receive


def call(middleware: BodyLimit, receive: Any, method: str = "POST") -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/api/v1/loss", "headers": []}
    anyio.run(middleware, scope, receive, send)
    return sent


# --- BodyLimit and Spooled ---------------------------------------------------------------------------------
def test_a_large_body_is_written_to_the_file_as_it_arrives_and_the_route_takes_the_file(spool_dir: Path) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB, 16 chunks of 64 KiB
    got: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        spooled = take_spooled(scope)
        assert spooled is not None and take_spooled(scope) is None  # taken once
        got.update(size=len(spooled), head=spooled.head, data=spooled.read())
        got["after_take"] = await receive()  # the route took the file: receive gives no bytes

    seen: list[int] = []
    call(BodyLimit(app, lambda path: 2 * len(body), spool_bytes=SPOOL_BYTES), receiving(chunks_of(body), seen))
    assert got["data"] == body and got["size"] == len(body)
    assert got["head"] == body[: Spooled.HEAD_BYTES]
    assert got["after_take"] == {"type": "http.request", "body": b"", "more_body": False}
    # Before chunk k (k from 0) the file holds what came before it, once the body passed 256 KiB (after
    # chunk 3): the chunks are written as they come, never held until the end.
    assert seen[:4] == [0, 0, 0, 0]
    assert seen[4:16] == [64 * KIB * k for k in range(4, 16)]
    assert list(spool_dir.iterdir()) == []


def test_each_chunk_of_a_large_body_asks_small_requests_first_and_a_small_body_never_does(spool_dir: Path) -> None:
    asked: list[int] = []

    async def before_large_chunk() -> None:  # app.small_first: records the spool file's size when asked
        asked.append(sum(p.stat().st_size for p in spool_dir.glob("*")))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()

    def limit(path: str) -> int:
        return 4 * 1024 * KIB

    large, small = os.urandom(1024 * KIB), os.urandom(128 * KIB)
    call(
        BodyLimit(app, limit, spool_bytes=SPOOL_BYTES, before_large_chunk=before_large_chunk),
        receiving(chunks_of(large)),
    )
    # 16 chunks of 64 KiB: spooled from the 4th on, so chunks 5 to 16 are read after asking, each after the one before
    assert asked == [64 * KIB * k for k in range(4, 16)]
    asked.clear()
    call(
        BodyLimit(app, limit, spool_bytes=SPOOL_BYTES, before_large_chunk=before_large_chunk),
        receiving(chunks_of(small)),
    )
    assert asked == []


def test_a_route_that_reads_its_body_gets_the_bytes_and_the_file_goes(spool_dir: Path) -> None:
    body = os.urandom(600 * KIB)
    got: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert SPOOLED_BODY in scope
        got.append(await receive())

    call(BodyLimit(app, lambda path: len(body), spool_bytes=SPOOL_BYTES), receiving(chunks_of(body)))
    assert got == [{"type": "http.request", "body": body, "more_body": False}]
    assert list(spool_dir.iterdir()) == []


def test_a_small_body_is_replayed_as_before(spool_dir: Path) -> None:
    got: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        got.extend([SPOOLED_BODY in scope, take_spooled(scope), await receive()])

    call(BodyLimit(app, lambda path: 10**6, spool_bytes=SPOOL_BYTES), receiving([b"ab", b"cd"]))
    assert got == [False, None, {"type": "http.request", "body": b"abcd", "more_body": False}]
    call(BodyLimit(app, lambda path: 10**6), receiving(chunks_of(os.urandom(300 * KIB))))  # no spool_bytes
    assert got[3:5] == [False, None] and len(got[5]["body"]) == 300 * KIB


def never_called(*args: Any) -> None:
    raise AssertionError("the app was called")


@pytest.mark.parametrize("case", ["413 past the limit", "408 too slow", "client gone"])
def test_a_refused_or_abandoned_body_leaves_no_file(spool_dir: Path, case: str) -> None:
    chunks = chunks_of(os.urandom(512 * KIB))

    async def forever() -> dict[str, Any]:
        await anyio.sleep(60)
        raise AssertionError("not reached")

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    seen: list[int] = []
    limit = 400 * KIB if case == "413 past the limit" else 10**6
    middleware = BodyLimit(never_called, lambda p: limit, timeout=0.5, spool_bytes=SPOOL_BYTES)
    then = {"413 past the limit": None, "408 too slow": forever, "client gone": gone}[case]
    receive = receiving(chunks, seen, then)
    sent = call(middleware, receive)
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    assert statuses == {"413 past the limit": [413], "408 too slow": [408], "client gone": []}[case]
    assert max(seen) >= SPOOL_BYTES  # the body had been spooled
    assert list(spool_dir.iterdir()) == []


def test_a_full_tmpfs_moves_the_file_to_the_temp_dir_with_what_it_held(
    spool_dir: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp_dir = tmp_path_factory.mktemp("tmp")
    monkeypatch.setattr("tempfile.tempdir", str(temp_dir))
    write = Spooled._write

    def full_at_300k(self: Spooled, chunk: bytes) -> None:
        if self.in_tmpfs and self.size + len(chunk) > 300 * KIB:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(self, chunk)

    monkeypatch.setattr(Spooled, "_write", full_at_300k)
    body = os.urandom(1000 * KIB)
    spooled = Spooled()
    for chunk in chunks_of(body, 100 * KIB):
        spooled.append(chunk)
    spooled.finish()
    assert not spooled.in_tmpfs and Path(spooled.path).parent == temp_dir
    assert list(spool_dir.iterdir()) == []  # the tmpfs file is gone
    assert spooled.read() == body and list(temp_dir.iterdir()) == []


def test_a_worker_gets_the_path_not_the_descriptor_or_the_head(spool_dir: Path) -> None:
    body = os.urandom(100 * KIB)
    spooled = Spooled()
    spooled.append(body)
    spooled.finish()
    there = pickle.loads(pickle.dumps(spooled))
    assert (there.fd, there.head, len(there), there.path) == (-1, b"", len(body), spooled.path)
    assert there.read() == body and list(spool_dir.iterdir()) == []
    spooled.discard()  # the server's own discard after the job: the file is already gone


# --- through the app: the same answers whether the body was spooled or joined -------------------------------
def big_batch(rows: int = 64, tokens: int = 1024) -> dict[str, Any]:
    g = np.random.default_rng(3)
    logp = -g.random((rows, tokens)).round(4) - 0.01
    return {
        "per_token_logps": logp.tolist(),
        "old_per_token_logps": np.minimum(logp + 0.2 * g.standard_normal(logp.shape), -1e-3).round(4).tolist(),
        "rewards": g.integers(0, 2, rows).astype(float).tolist(),
        "group_size": 4,
        "config": {"preset": "trl-grpo"},
    }


@pytest.fixture(scope="module")
def bodies() -> dict[str, Any]:
    batch = big_batch()
    names = ("per_token_logps", "old_per_token_logps", "rewards")
    arrays = {k: np.asarray(batch[k], dtype=np.float32) for k in names} | {"group_size": np.asarray(4)}
    return {"json": json.dumps(batch).encode(), "safetensors": save_safetensors(arrays)}


def answers(settings: Settings, bodies: dict[str, Any], seen: list[Any] | None = None) -> list[Any]:
    with TestClient(create_app(settings)) as http:
        return [
            http.post("/api/v1/loss", content=bodies["json"], headers=JSON).json(),
            http.post("/api/v1/upload", files={"file": ("b.json", bodies["json"])}).json(),
            http.post(
                "/api/v1/upload",
                files={"file": ("b.safetensors", bodies["safetensors"])},
                data={"config": '{"preset": "trl-grpo"}'},
            ).json(),
            http.post("/api/v1/export/json", content=bodies["json"], headers=JSON).content,
        ]


def test_a_spooled_body_answers_as_a_joined_one(
    spool_dir: Path, bodies: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(bodies["json"]) > 1024 * KIB and len(bodies["safetensors"]) > SPOOL_BYTES
    joined = answers(Settings(process_workers=0, large_request_bytes=2**30), bodies)  # nothing spooled
    handed: list[type] = []
    run = Lanes.run

    async def recording(self: Lanes, size: int, fn: Any, *args: Any, light: bool = False) -> Any:
        handed.append(type(args[0]))
        return await run(self, size, fn, *args, light=light)

    monkeypatch.setattr(Lanes, "run", recording)
    spooled = answers(Settings(process_workers=0, large_request_bytes=SPOOL_BYTES), bodies)
    assert handed == [Spooled] * 4  # each body reached its lane as the file
    assert spooled == joined and joined[0]["num_positions"] == 64 * 1024
    assert list(spool_dir.iterdir()) == []


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve() as url:  # one worker process, large_request_bytes at its default (1 MiB)
        yield url


def test_a_large_body_reaches_the_worker_process_over_a_socket(server: str, bodies: dict[str, Any]) -> None:
    joined = answers(Settings(process_workers=0, large_request_bytes=2**30), bodies)
    with httpx.Client(base_url=server, timeout=120) as http:
        loss = http.post("/api/v1/loss", content=bodies["json"], headers=JSON)
        upload = http.post("/api/v1/upload", files={"file": ("b.json", bodies["json"])})
        assert loss.status_code == upload.status_code == 200, loss.text[:300]
        # The worker's torch runs on one thread, this process's on several: sums may differ in their last bits.
        for got, want in ((loss.json(), joined[0]), (upload.json(), joined[1])):
            assert got.keys() == want.keys() and got["num_positions"] == want["num_positions"] == 64 * 1024
            assert abs(want["loss"]) > 1e-3 and got["loss"] == pytest.approx(want["loss"], rel=1e-5)
            assert got["metrics"] == pytest.approx(want["metrics"], rel=1e-5, abs=1e-7)
        assert http.post("/api/v1/loss", json=ARTICLE).json()["num_positions"] == 15


# --- the small requests' threads: large work in the thread lane never takes them all -------------------------
def test_large_work_in_threads_never_occupies_every_small_request_thread() -> None:
    """Binary uploads of any size (light: their numbers are copied, not parsed) and large work without a
    worker pool run in threads of the server. Before, they took the small requests' threads: as many large
    safetensors uploads as ``threads`` made every small request wait for one of them. They now have threads
    of their own (``threads // 2``, at least 1), and a small request still runs while those are all busy."""
    lanes = Lanes(Settings(process_workers=0, threads=2, large_request_bytes=1000))
    release = threading.Event()
    started: list[str] = []

    def large() -> dict[str, Any]:
        started.append("large")
        release.wait(10)
        return {}

    def small() -> dict[str, Any]:
        started.append("small")
        return {}

    async def scenario() -> list[Any]:
        replies: list[Any] = []
        async with anyio.create_task_group() as tg:
            for _ in range(3):  # more large jobs than there are threads in all
                tg.start_soon(lambda: _append(replies, lanes.run(10_000, large, light=True)))
            await anyio.sleep(0.3)
            with anyio.fail_after(5):  # answered while every large job still waits for `release`
                replies.append(await lanes.run(10, small))
            assert started.count("large") == 1  # one thread for large work (threads // 2), the others queue
            release.set()
        return replies

    replies = anyio.run(scenario)
    assert sorted(r.status for r in replies) == [200] * 4 and started.count("large") == 3


async def _append(out: list[Any], reply: Any) -> None:
    out.append(await reply)
