"""A kept run page answered at a bounded cost to everything else (bench/api.py figure c's warm phase): four
clients re-reading a 40,000-member run's page held the small requests' threads (the look-up ran there,
and every RESCAN_SECONDS each reader re-stat-ed 40,000 step files, a second each on a loaded machine) and
read its 15 MB into the heap per read: small /loss p99 1.1 s. Now the look-up and the body's chunks are
read in threads of their own (``Lanes.reads``), a rescan is shared by the reads waiting on it, the body is
streamed from the file a chunk at a time, and a client that has the page gets a 304.

In process, no worker processes (as tests/test_runs_summary.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_api_runs import write_run
from test_runs_summary import client, settle

from app import summaries
from app.lanes import Lanes
from app.middleware import SECURITY_HEADERS
from app.settings import Settings
from app.work import Reply


def test_a_kept_page_takes_no_small_request_thread(tmp_path: Path) -> None:
    """Every thread of the small requests' lane taken (four /loss computations, say): a kept page is still
    answered, whole and the same as computed. Before, its look-up waited for one of those threads."""
    run = settle(write_run(tmp_path, "r"))
    settings = Settings(runs_dir=str(tmp_path), process_workers=0, threads=2)

    async def read() -> tuple[Any, Any, bytes]:
        lanes = Lanes(settings)
        computed = await summaries.page(lanes, run, settings)
        for _ in range(settings.threads):
            await lanes.threads.acquire_on_behalf_of(object())
        assert lanes.threads.available_tokens == 0
        kept = await asyncio.wait_for(summaries.page(lanes, run, settings), 10)
        assert isinstance(kept, summaries.Kept)
        return computed, kept, b"".join([chunk async for chunk in kept.chunks(lanes.reads)])

    computed, kept, body = asyncio.run(read())
    assert isinstance(computed, Reply) and computed.status == 200
    assert kept.status == 200 and body == computed.body and kept.length == len(body)
    assert kept.file.closed  # the last chunk read closes it


def test_concurrent_reads_share_one_rescan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four reads of a run whose scan is due: one rescan. The rescan is held until all four have looked
    for a remembered scan (the pause between check and act), so four rescans, as before, are no luck."""
    run = settle(write_run(tmp_path, "r"))
    summaries.current_scan(run)
    summaries._scans[str(run)] = (*summaries._scans[str(run)][:1], 0.0, summaries._scans[str(run)][2])  # due
    entered: list[int] = []
    scans: list[int] = []
    real_scan, real_current = summaries.scan, summaries.current_scan

    def scan(path: Path) -> summaries.Scan:
        scans.append(1)
        deadline = time.monotonic() + 10
        while len(entered) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the others are past their look at the remembered scan: before, each scanned too
        return real_scan(path)

    monkeypatch.setattr(summaries, "scan", scan)
    found: list[summaries.Scan] = []

    def read() -> None:
        entered.append(1)
        found.append(real_current(run))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(found) == 4 and len({f.files for f in found}) == 1
    assert scans == [1]


def test_a_kept_page_is_streamed_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kept page's bytes come from its file CHUNK_BYTES at a time, never read whole: the answer is the
    computed page, byte for byte, its Content-Length that of the page, with the security headers."""
    settle(write_run(tmp_path, "r"))
    monkeypatch.setattr(summaries, "CHUNK_BYTES", 1000)
    reads: list[int] = []
    real = summaries.Kept.read

    def read(self: summaries.Kept, start: int) -> bytes:
        chunk = real(self, start)
        reads.append(len(chunk))
        return chunk

    monkeypatch.setattr(summaries.Kept, "read", read)
    with client(tmp_path) as http:
        computed = http.get("/api/v1/runs/r")
        assert reads == []  # computed: answered from memory (once)
        kept = http.get("/api/v1/runs/r")
    assert kept.status_code == 200 and kept.content == computed.content
    assert int(kept.headers["content-length"]) == len(kept.content)
    assert kept.headers["content-type"] == "application/json"
    assert sum(reads) == len(kept.content) and max(reads) == 1000 and len(reads) > 2
    for name, value in SECURITY_HEADERS:
        assert kept.headers[name.decode()] == value.decode()


def test_a_kept_page_answers_the_file_it_opened(tmp_path: Path) -> None:
    """A summary rewritten (by a rename, as every write here is) while a kept page is answered: the answer
    is the page looked up, whole; and a summary longer than its header says is refused (recomputed)."""
    run = settle(write_run(tmp_path, "r"))
    with client(tmp_path) as http:
        whole = http.get("/api/v1/runs/r").content
    found, kept = summaries.lookup(run)
    assert kept is not None
    summaries._write(run, {"listing_key": None, "listing": None, "page": found.files, "status": 200}, b"{}")
    try:
        assert b"".join(kept.read(start) for start in range(0, kept.length, summaries.CHUNK_BYTES)) == whole
    finally:
        kept.close()
    assert summaries.lookup(run)[1] is not None  # the new one, "{}"
    path = run / summaries.SUMMARY_FILE
    path.write_bytes(path.read_bytes() + b" ")
    assert summaries.lookup(run)[1] is None


def test_a_client_with_the_page_gets_a_304(tmp_path: Path) -> None:
    """A kept page carries an ETag; If-None-Match naming it gets a 304 without a body; HEAD answers the
    page's headers. A changed run is a new page and a new ETag."""
    run = settle(write_run(tmp_path, "r"))
    with client(tmp_path) as http:
        assert "etag" not in http.get("/api/v1/runs/r").headers  # computed: kept from now on
        first = http.get("/api/v1/runs/r")
        etag = first.headers["etag"]
        assert first.status_code == 200 and first.headers["cache-control"] == "private, no-cache"
        again = http.get("/api/v1/runs/r", headers={"if-none-match": f'"other", W/{etag}'})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
        for name, value in SECURITY_HEADERS:
            assert again.headers[name.decode()] == value.decode()
        head = http.head("/api/v1/runs/r")
        assert head.status_code == 200 and head.content == b"" and head.headers["etag"] == etag
        assert int(head.headers["content-length"]) == len(first.content)
        assert http.get("/api/v1/runs/r", headers={"if-none-match": '"other"'}).content == first.content
        (run / "steps" / "000002-001.safetensors").unlink()
        settle(run, age=30)
        changed = http.get("/api/v1/runs/r", headers={"if-none-match": etag})
        assert changed.status_code == 200 and changed.json()["steps"] and changed.content != first.content
        assert http.get("/api/v1/runs/r").headers["etag"] != etag
