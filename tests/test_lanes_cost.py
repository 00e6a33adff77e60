"""The lane is chosen by the work's price, not its body's size (``app.lanes``, ``app.ingest.price``).

A small body can ask for costly work: a ragged batch padded far past what it sends, an export whose file is
far larger than its body, a compressed upload that unpacks to hundreds of MB. Run in the small-request
threads, such work held them for seconds while small requests waited (bench/api.py, figure w). Work now
prices itself before its costly part and, past ``cheap_request_bytes`` or ``cheap_unpack_bytes``, starts
again in a worker process (niced: ``worker_nice``), or in niced threads of this process where it must stay
in this process or there is no pool. ``Lanes.used`` counts the lane that answered.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest
from api_fixtures import ARTICLE
from fastapi.testclient import TestClient

from app.ingest import Costly, cheap_work, price
from app.lanes import Lanes
from app.main import create_app
from app.settings import Settings
from app.work import Reply

JSON = {"content-type": "application/json"}
MB = 1024 * 1024
LINUX = sys.platform.startswith("linux")
# One row of 1,024 tokens and 63 of one token: 64 x 1,024 = 65,536 padded positions from a body of about 10 KB.
# check_padded's estimate for /loss (two per-token fields and the mask at 8 bytes, 160 bytes of evaluate in
# float32) is 65,536 x (8 x 3 + 160) = 12,058,624 bytes: past a cheap limit of 8 MiB, under the body limit.
PADDED = {
    "per_token_logps": [[-1.0] * 1024] + [[-1.0]] * 63,
    "old_per_token_logps": [[-1.1] * 1024] + [[-1.1]] * 63,
    "rewards": [1.0, 0.0, 0.5, 0.25] * 16,
    "group_size": 4,
}
CHEAP = 8 * MB


def app_client(**settings: Any) -> TestClient:
    return TestClient(create_app(Settings(**settings)))


@pytest.fixture(scope="module")
def pooled() -> Iterator[TestClient]:
    """An app with one worker process and small cheap limits (the lifespan runs: the pool is started)."""
    with app_client(process_workers=1, cheap_request_bytes=CHEAP, cheap_unpack_bytes=CHEAP) as http:
        yield http


def lanes_of(http: TestClient) -> Lanes:
    found: Lanes = http.app.state.lanes  # type: ignore[attr-defined]
    return found


def used_by(http: TestClient, method: str, path: str, **kw: Any) -> tuple[Any, dict[str, int]]:
    """The response and how each lane's count moved while it was answered."""
    before = dict(lanes_of(http).used)
    response = http.request(method, path, **kw)
    after = lanes_of(http).used
    return response, {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


# --- the lane actually used ----------------------------------------------------------------------------------
def test_a_small_body_priced_costly_is_answered_by_a_worker_process(pooled: TestClient) -> None:
    """A 10 KB body padded to 65,536 positions (priced 11.5 MiB, past the 8 MiB cheap limit) leaves the small
    threads for the worker; before, its body's size (under ``large_request_bytes``) kept it in the threads."""
    body = json.dumps(PADDED).encode()
    assert len(body) < Settings().large_request_bytes // 50
    response, moved = used_by(pooled, "POST", "/api/v1/export/json", content=body, headers=JSON)
    assert response.status_code == 200, response.text[:300]
    assert moved == {"escalated": 1, "process": 1}
    # the worker's answer is the one the small lane gives with a cheap limit the request is under, byte for byte
    with app_client(process_workers=0) as plain:
        same, moved_plain = used_by(plain, "POST", "/api/v1/export/json", content=body, headers=JSON)
    assert moved_plain == {"small": 1}
    assert same.content == response.content


def test_a_cheap_request_stays_in_the_small_request_threads(pooled: TestClient) -> None:
    """The article's 3 x 5 batch: 15 positions, priced at kilobytes."""
    response, moved = used_by(pooled, "POST", "/api/v1/loss", json=ARTICLE)
    assert response.status_code == 200 and response.json()["num_positions"] == 15
    assert moved == {"small": 1}


def test_a_413_is_answered_where_it_was_priced(pooled: TestClient) -> None:
    """A request past the position limit is refused in the small threads: pricing it costs milliseconds."""
    body = {**PADDED, "per_token_logps": [[-1.0] * 5000] + [[-1.0]] * 1023}
    body["old_per_token_logps"] = body["per_token_logps"]
    response, moved = used_by(pooled, "POST", "/api/v1/loss", json=body)
    assert response.status_code == 413 and moved == {"small": 1}


def zeros_npz(rows: int, tokens: int) -> bytes:
    """A compressed NPZ of zeros: a few KB that unpack to rows x tokens values (priced at 8 bytes each)."""
    out = io.BytesIO()
    logp = np.full((rows, tokens), -1.0, np.float32)
    np.savez_compressed(out, per_token_logps=logp, old_per_token_logps=logp, rewards=np.zeros(rows, np.float32))
    return out.getvalue()


def test_a_small_compressed_upload_priced_past_the_unpack_limit_goes_to_a_worker(pooled: TestClient) -> None:
    """64 x 8,192 float32 values in two fields: 2 x 524,288 x 8 = 8 MiB priced once unpacked, plus the rewards'
    64 x 8 bytes: past the 8 MiB cheap unpack limit (from the headers, before anything is unpacked), from a
    body of a few KB. It is read in the worker; its answer is the one computed in the small threads."""
    data = zeros_npz(64, 8192)
    assert len(data) < 64 * 1024
    files = {"file": ("zeros.npz", data)}
    response, moved = used_by(pooled, "POST", "/api/v1/upload", files=files)
    assert response.status_code == 200, response.text[:300]
    assert moved == {"escalated": 1, "process": 1}
    with app_client(process_workers=0) as plain:
        same, moved_plain = used_by(plain, "POST", "/api/v1/upload", files=files)
    assert moved_plain == {"small": 1}
    got, want = response.json(), same.json()
    assert got["num_positions"] == want["num_positions"] == 64 * 8192
    # one torch thread in the worker, several here: sums may differ in their last bits (float32)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7)


def test_without_a_pool_costly_work_runs_in_the_costly_threads() -> None:
    with app_client(process_workers=0, cheap_request_bytes=CHEAP) as http:
        response, moved = used_by(http, "POST", "/api/v1/export/json", content=json.dumps(PADDED), headers=JSON)
    assert response.status_code == 200 and moved == {"escalated": 1, "costly": 1}


def test_a_large_binary_upload_priced_cheap_stays_in_the_large_lanes_threads() -> None:
    """A body past ``large_request_bytes`` that is a binary file is read in threads of this process (its numbers
    are copied, not parsed), the large lane's (not niced: it is cheap work); priced costly it would leave."""
    data = zeros_npz(64, 8192)
    with app_client(process_workers=0, large_request_bytes=1024) as http:
        response, moved = used_by(http, "POST", "/api/v1/upload", files={"file": ("zeros.npz", data)})
    assert response.status_code == 200 and moved == {"large": 1}


# --- the mechanism -------------------------------------------------------------------------------------------
def priced_costly(here: bool) -> dict[str, Any]:
    """Work priced at 2 MiB against a 1 MiB cheap limit (module level: a worker process imports it)."""
    price(2 * MB, MB, "a test's work", here=here)
    return {"pid": os.getpid()}


def test_work_that_must_stay_in_this_process_runs_in_the_costly_threads() -> None:
    """``here``: a run zip's unpacking (the store's disk claims are this process's) never goes to a worker."""
    lanes = Lanes(Settings(process_workers=1))
    lanes.start()
    try:
        here: Reply = anyio.run(lanes.run, 10, priced_costly, True)
        away: Reply = anyio.run(lanes.run, 10, priced_costly, False)
    finally:
        lanes.stop()
    assert here.status == away.status == 200
    assert json.loads(here.body)["pid"] == os.getpid() != json.loads(away.body)["pid"]
    assert lanes.used == {"escalated": 2, "costly": 1, "process": 1}


def test_price_raises_only_in_cheap_work() -> None:
    price(2 * MB, MB, "costly work")  # in a worker process or a costly thread: it runs where it is
    with cheap_work():
        price(MB, MB, "at the limit")  # past it, not at it
        with pytest.raises(Costly) as caught:
            price(2 * MB, MB, "past the limit", here=True)
    assert caught.value.here
    price(2 * MB, MB, "costly work again")  # the thread is no longer cheap once the work is done


# --- the costly lanes yield the CPU --------------------------------------------------------------------------
def test_a_worker_runs_at_the_niced_priority(pooled: TestClient) -> None:
    pool = lanes_of(pooled).pool
    assert pool is not None
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    worker = pool.submit(os.getpriority, os.PRIO_PROCESS, 0).result(timeout=60)
    assert worker == min(19, mine + Settings().worker_nice) > mine


def huge_pages_after_touching(nbytes: int) -> int:
    """In a worker: allocate ``nbytes`` with malloc (numpy), write every page, and return the bytes of this
    process's memory in transparent huge pages (``AnonHugePages`` of /proc/self/smaps_rollup)."""
    block = np.ones(nbytes // 8)
    with open("/proc/self/smaps_rollup") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))
    del block
    return kb * 1024


THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def keep_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lanes' start with ``worker_huge_pages`` adds glibc's tunable to this process's environment (the
    workers inherit it): restored after the test, so that later tests' workers start as the default has it."""
    monkeypatch.setenv("GLIBC_TUNABLES", os.environ.get("GLIBC_TUNABLES", ""))


@pytest.mark.skipif(
    not LINUX or not os.path.exists(THP) or "[never]" in open(THP).read(),  # noqa: SIM115
    reason="transparent huge pages are Linux's, where the kernel allows them",
)
def test_workers_allocate_in_huge_pages_when_the_setting_asks(
    pooled: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``worker_huge_pages`` the workers start with glibc's malloc asking for huge pages: a 64 MiB buffer lies
    mostly in 2 MiB pages (a request's buffers, faulted in again after each trim, take 512x fewer faults). By
    default they do not (the largest requests ran 3x slower with them on a VM whose host takes back free memory)."""
    pool = lanes_of(pooled).pool
    assert pool is not None
    if "glibc.malloc.hugetlb" not in os.environ.get("GLIBC_TUNABLES", ""):  # the operator's own tunable is kept
        assert "glibc.malloc.hugetlb" not in (pool.submit(os.getenv, "GLIBC_TUNABLES").result(timeout=60) or "")
    keep_the_environment(monkeypatch)
    with app_client(process_workers=1, worker_huge_pages=True) as http:
        pool = lanes_of(http).pool
        assert pool is not None
        assert "glibc.malloc.hugetlb=1" in pool.submit(os.getenv, "GLIBC_TUNABLES").result(timeout=60)
        assert pool.submit(huge_pages_after_touching, 64 * MB).result(timeout=60) >= 32 * MB


def huge_pages_of_a_job(body: bytes) -> dict[str, int]:
    """A worker's job (``body``: its request bytes): 32 MiB allocated and written; the bytes of it that came in
    huge pages (``AnonHugePages`` grown meanwhile), and whether the process had them turned off."""
    import ctypes

    def anon_huge() -> int:
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:")) * 1024

    before = anon_huge()
    block = np.ones(32 * MB // 8)
    grown = anon_huge() - before
    del block
    off = ctypes.CDLL(None).prctl(42, 0, 0, 0, 0)  # PR_GET_THP_DISABLE
    return {"huge": grown, "off": off}


def huge_pages_of_a_priced_job(body: bytes, cost: int) -> dict[str, int]:
    """``huge_pages_of_a_job`` after the job has priced its working memory at ``cost`` bytes, as
    ``app.ingest.check_cost`` does once a batch's shape is known."""
    from app.ingest import price

    price(cost, cost, "the test's working memory")
    return huge_pages_of_a_job(body)


@pytest.mark.skipif(
    not LINUX or not os.path.exists(THP) or "[never]" in open(THP).read(),  # noqa: SIM115
    reason="transparent huge pages are Linux's, where the kernel allows them",
)
def test_a_workers_small_job_faults_in_small_pages_and_a_large_one_in_huge_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Huge pages pay off for a large request's buffers only: a job of a few MB would pay for each 2 MiB page
    it touches (zeroed whole) and again when the trim splits them. A job under ``HUGE_PAGE_JOB_BYTES`` request
    bytes runs with them off and leaves them on; a larger one keeps them (its 32 MiB mostly in 2 MiB pages).
    A worker of its own: one whose heap earlier jobs have faulted in 4 KiB pages keeps those page tables."""
    from functools import partial

    from app.lanes import _in_worker
    from app.memory import HUGE_PAGE_JOB_BYTES, release_memory

    keep_the_environment(monkeypatch)
    with app_client(process_workers=1, worker_huge_pages=True) as http:
        pool = lanes_of(http).pool
        assert pool is not None

        def job(size: int) -> dict[str, int]:
            reply = pool.submit(partial(_in_worker, huge_pages_of_a_job, 60.0), b"x" * size).result(timeout=60)
            pool.submit(release_memory).result(timeout=60)
            assert reply.status == 200, reply.body
            found: dict[str, int] = json.loads(reply.body)
            return found

        large, small = job(HUGE_PAGE_JOB_BYTES), job(HUGE_PAGE_JOB_BYTES - 1)
        assert large["off"] == 0 and large["huge"] >= 16 * MB
        assert small == {"huge": 0, "off": 1}
        assert pool.submit(huge_pages_of_a_job, b"").result(timeout=60)["off"] == 0  # on again after the small job


@pytest.mark.skipif(
    not LINUX or not os.path.exists(THP) or "[never]" in open(THP).read(),  # noqa: SIM115
    reason="transparent huge pages are Linux's, where the kernel allows them",
)
def test_a_job_priced_past_the_huge_page_work_limit_goes_on_in_small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """The largest requests' 2 MiB pages, on a VM whose host takes back the guest's free memory, are each a fresh
    fault on the host (``bench/api.py``'s figure 4 ran 2.7x slower with them): a large-bodied job whose working
    memory is priced past ``HUGE_PAGE_WORK_BYTES`` faults the rest of its buffers in 4 KiB pages; one priced at
    the limit keeps its huge pages; the worker has them on again after either."""
    from functools import partial

    from app.lanes import _in_worker
    from app.memory import HUGE_PAGE_JOB_BYTES, HUGE_PAGE_WORK_BYTES, release_memory

    keep_the_environment(monkeypatch)
    with app_client(process_workers=1, worker_huge_pages=True) as http:
        pool = lanes_of(http).pool
        assert pool is not None

        def job(cost: int) -> dict[str, int]:
            body = b"x" * HUGE_PAGE_JOB_BYTES
            reply = pool.submit(partial(_in_worker, huge_pages_of_a_priced_job, 60.0), body, cost).result(timeout=60)
            pool.submit(release_memory).result(timeout=60)
            assert reply.status == 200, reply.body
            found: dict[str, int] = json.loads(reply.body)
            return found

        at_limit, past = job(HUGE_PAGE_WORK_BYTES), job(HUGE_PAGE_WORK_BYTES + 1)
        assert at_limit["off"] == 0 and at_limit["huge"] >= 16 * MB
        assert past == {"huge": 0, "off": 1}
        assert pool.submit(huge_pages_of_a_job, b"").result(timeout=60)["off"] == 0  # on again after it


def test_huge_pages_keep_the_operators_own_tunables(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.lanes import allow_huge_pages_in_children

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    allow_huge_pages_in_children()
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")  # the operator said no: kept
    allow_huge_pages_in_children()
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


@pytest.mark.skipif(not LINUX, reason="a thread's own priority is Linux's")
def test_the_costly_threads_are_niced_and_the_others_are_not() -> None:
    lanes = Lanes(Settings(process_workers=0, worker_nice=7))

    def priority() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert lanes.costly_threads.submit(priority).result(timeout=30) == min(19, mine + 7)
    assert lanes.large_threads.submit(priority).result(timeout=30) == mine
    assert anyio.run(lanes.call, priority) == mine


# --- a worker's large download comes back as a file ----------------------------------------------------------
def spool_files() -> set[str]:
    from app.lanes import SPOOL_DIR

    folder = SPOOL_DIR or tempfile.gettempdir()
    return {name for name in os.listdir(folder) if name.startswith("grpo-lens-")}


def test_a_workers_large_download_is_written_to_a_file_not_sent_through_the_pipe() -> None:
    """In the worker, an export past ``REPLY_FILE_BYTES`` becomes a file the server sends from (``Reply.path``),
    the same bytes as the answer computed in a thread; a JSON answer never does (its callers read its body)."""
    from app import work
    from app.lanes import REPLY_FILE_BYTES, _in_worker

    body = json.dumps(PADDED).encode()
    settings = Settings()
    in_thread = work.export(body, "npz", settings)
    assert in_thread.download and len(in_thread.body) >= REPLY_FILE_BYTES  # 64 x 1,024 float64 grids: ~2 MB
    reply = _in_worker(work.export, 60.0, body, "npz", settings)
    assert reply.status == 200 and reply.body == b"" and reply.path is not None
    try:
        with open(reply.path, "rb") as f:
            assert f.read() == in_thread.body
    finally:
        os.unlink(reply.path)
    answer = _in_worker(work.loss, 60.0, body, settings)
    assert answer.status == 200 and answer.path is None and not answer.download and answer.body


def test_the_served_download_is_the_file_and_its_spool_file_is_gone_after(pooled: TestClient) -> None:
    """Through the pooled app: the NPZ export answered by the worker is byte for byte the one the threads of an
    app without a pool answer, with its length, and no spool file is left behind."""
    body = json.dumps(PADDED).encode()
    before = spool_files()
    response, moved = used_by(pooled, "POST", "/api/v1/export/npz", content=body, headers=JSON)
    assert response.status_code == 200 and moved == {"escalated": 1, "process": 1}
    with app_client(process_workers=0) as http:
        threads = http.post("/api/v1/export/npz", content=body, headers=JSON)
    assert response.content == threads.content and int(response.headers["content-length"]) == len(threads.content)
    assert response.headers["content-disposition"] == threads.headers["content-disposition"]
    assert spool_files() <= before


# --- the costly threads have places and a per-member share too ---------------------------------------------
def test_the_costly_threads_share_their_places_per_member() -> None:
    """With one costly thread and one waiting place (threads=2, process_queue=1): a member's second costly job is
    a 429 naming the share while its first runs; another member still gets the waiting place; a third
    request, from anyone, finds the lane full: 503. Before, the costly threads queued without a bound."""
    from app.lanes import MEMBER

    lanes = Lanes(Settings(process_workers=0, threads=2, process_queue=1, process_queue_per_client=1))
    go = threading.Event()

    def held() -> dict[str, str]:
        assert go.wait(30)
        return {"done": "yes"}

    replies: dict[str, Reply] = {}

    async def send(name: str, member: str) -> None:
        MEMBER.set(member)
        replies[name] = await lanes._costly_thread(held)

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(send, "a1", "address a")
            await anyio.sleep(0.2)
            tasks.start_soon(send, "a2", "address a")
            tasks.start_soon(send, "b1", "address b")
            await anyio.sleep(0.2)
            tasks.start_soon(send, "c1", "address c")
            await anyio.sleep(0.2)
            go.set()

    try:
        anyio.run(main)
    finally:
        lanes.costly_threads.shutdown(wait=True)
    assert replies["a1"].status == replies["b1"].status == 200
    assert replies["a2"].status == 429 and "process_queue_per_client" in replies["a2"].body.decode()
    assert replies["c1"].status == 503 and replies["c1"].headers["retry-after"] == "5"
    assert lanes.thread_places.taken == 0 and not lanes.thread_places.members


def test_a_starting_server_removes_the_spool_files_of_servers_that_are_gone() -> None:
    """A server killed between spooling a body (or a worker's download) and reading or sending it leaves the file
    in /dev/shm, memory until the machine restarts. Spool files carry their server's pid; a starting server
    removes those whose server is not running, and never a running one's (this process's, here)."""
    from app.lanes import SPOOL_DIR, Spooled, remove_orphaned_spool_files

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    folder = SPOOL_DIR or tempfile.gettempdir()
    orphan = os.path.join(folder, f"grpo-lens-{dead_pid}-orphan")
    with open(orphan, "wb") as f:
        f.write(b"x" * 1000)
    mine = Spooled(b"y" * 1000)  # this process is the server of its spool files
    try:
        assert os.path.basename(mine.path).startswith(f"grpo-lens-{os.getpid()}-")
        assert remove_orphaned_spool_files() >= 1
        assert not os.path.exists(orphan) and os.path.exists(mine.path)
    finally:
        mine.discard()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(orphan)
