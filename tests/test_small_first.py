"""Small requests first (``app.small_first``): while a small request is being computed, a large body's next
chunk waits, at most ``small_first_wait`` seconds; with none running it is read at once. bench/api.py's
figure 5 measures what it is for (small requests beside a stream of 24 MB uploads)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest

from app.lanes import Lanes
from app.settings import Settings
from app.small_first import SmallFirst
from app.work import Reply


async def _waited(gate: SmallFirst) -> float:
    started = time.perf_counter()
    await gate.before_large_chunk()
    return time.perf_counter() - started


def test_with_no_small_request_running_a_chunk_is_read_at_once() -> None:
    gate = SmallFirst(wait=5.0)
    assert anyio.run(_waited, gate) < 0.05
    assert gate.waited == 0.0


def test_a_chunk_waits_while_a_small_request_runs_and_goes_on_as_soon_as_it_ends() -> None:
    gate = SmallFirst(wait=5.0)
    took: list[float] = []

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            with gate.small():
                tasks.start_soon(lambda: _record(gate, took))
                await anyio.sleep(0.2)  # the small request's compute
                assert not took  # the chunk is still waiting
        # left the task group: the waiting chunk went on once the small request ended

    anyio.run(main)
    assert 0.15 <= took[0] < 1.0  # about the small request's 0.2 s, far from the 5 s cap
    assert gate.running == 0


async def _record(gate: SmallFirst, took: list[float]) -> None:
    took.append(await _waited(gate))


def test_a_stream_of_small_requests_slows_a_chunk_by_at_most_the_wait() -> None:
    gate = SmallFirst(wait=0.1)

    async def main() -> float:
        with gate.small():  # a small request that outlasts the cap
            return await _waited(gate)

    took = anyio.run(main)
    assert 0.08 <= took < 1.0
    assert gate.waited == pytest.approx(took, abs=0.05)


def test_wait_zero_reads_large_bodies_at_once() -> None:
    gate = SmallFirst(wait=0.0)

    async def main() -> float:
        with gate.small():
            return await _waited(gate)

    assert anyio.run(main) < 0.05


def test_two_small_requests_a_chunk_waits_for_both() -> None:
    gate = SmallFirst(wait=5.0)
    took: list[float] = []

    async def small(seconds: float) -> None:
        with gate.small():
            await anyio.sleep(seconds)

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(small, 0.1)
            tasks.start_soon(small, 0.3)
            await anyio.sleep(0.01)
            tasks.start_soon(_record, gate, took)

    anyio.run(main)
    assert 0.25 <= took[0] < 1.0  # the later of the two ends


def _inside(lanes: Lanes, raise_it: bool, body: bytes, settings: Settings) -> dict[str, Any]:
    running = lanes.small_first.running  # read from the small-request thread, while the work runs
    if raise_it:
        raise RuntimeError("the work failed")
    return {"running": running}


@pytest.mark.parametrize("raise_it", [False, True])
def test_the_small_lane_marks_its_work_running_and_unmarks_it_when_it_ends_or_fails(raise_it: bool) -> None:
    settings = Settings(process_workers=0)
    lanes = Lanes(settings)

    async def main() -> Reply:
        return await lanes.run(100, _inside, lanes, raise_it, b"{}", settings)

    reply = anyio.run(main)
    if raise_it:
        assert reply.status == 500
    else:
        assert reply.status == 200 and b'"running":1' in reply.body.replace(b" ", b"")
    assert lanes.small_first.running == 0
    assert lanes.used["small"] == 1  # a failure is a Reply too (500)
