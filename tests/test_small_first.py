"""Small requests first (``app.small_first``): while a small request is being computed, a large body's next
chunk waits, and a worker process and the server's large and costly threads pause before their next torch
operation, each at most ``small_first_wait`` seconds at a time; with none running nothing waits, and what the
paused work computes is unchanged.
bench/api.py's figure 5 measures what it is for (small requests beside a stream of 24 MB uploads)."""

from __future__ import annotations

import json
import threading
import time
from contextlib import nullcontext
from functools import partial
from typing import Any

import anyio
import pytest
import torch

import grpo
from app.ingest import price
from app.lanes import WORKER, Lanes
from app.settings import Settings
from app.small_first import PausedForSmall, SmallFirst
from app.work import Reply
from grpo.view.answer import breakdown_to_json, dumps


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


def test_after_a_wait_large_bodies_read_on_for_as_long_before_they_wait_again() -> None:
    gate = SmallFirst(wait=0.1)

    async def main() -> list[float]:
        took = []
        with gate.small():  # small requests that never stop
            took.append(await _waited(gate))  # the first chunk waits the cap
            took.append(await _waited(gate))  # the next ones read on, for as long as it waited
            await anyio.sleep(0.15)  # past that: a chunk waits again
            took.append(await _waited(gate))
        return took

    first, second, later = anyio.run(main)
    assert 0.08 <= first < 1.0 and second < 0.05 and 0.08 <= later < 1.0


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


def test_the_flag_the_workers_read_is_up_exactly_while_small_requests_run() -> None:
    gate = SmallFirst(wait=0.01)
    assert not gate.flag.value
    with gate.small():
        with gate.small():
            assert gate.flag.value
        assert gate.flag.value  # one still runs
    assert not gate.flag.value
    with SmallFirst(wait=0.0).small() as _:
        pass  # wait 0: the workers are never told to pause


class _Flag:
    def __init__(self, value: bool) -> None:
        self.value = value


def _ops(n: int) -> torch.Tensor:
    x = torch.zeros(4)
    for _ in range(n):
        x = x + 1
    return x


def test_a_worker_job_pauses_before_a_torch_operation_while_the_flag_is_up_and_goes_on_when_it_drops() -> None:
    flag = _Flag(True)
    mode = PausedForSmall(flag, wait=5.0)
    threading.Timer(0.2, lambda: setattr(flag, "value", False)).start()  # the small request ends after 0.2 s
    started = time.perf_counter()
    with mode:
        out = _ops(10)
    took = time.perf_counter() - started
    assert torch.equal(out, torch.full((4,), 10.0))
    assert 0.15 <= mode.paused <= took < 1.0  # the small request's 0.2 s, far from the 5 s cap


def test_with_the_flag_down_a_worker_job_never_pauses() -> None:
    mode = PausedForSmall(_Flag(False), wait=5.0)
    with mode:
        _ops(100)
    assert mode.paused == 0.0


def test_under_small_requests_that_never_stop_a_worker_keeps_at_least_half_its_pace() -> None:
    mode = PausedForSmall(_Flag(True), wait=0.02)
    started = time.perf_counter()
    with mode:
        while time.perf_counter() - started < 0.5:
            _ops(50)
    took = time.perf_counter() - started
    # each pause (at most 0.02 s) is followed by at least as long computing: at most half the time paused
    assert 0.0 < mode.paused <= took / 2 + 0.02


def test_a_job_paused_for_small_requests_computes_every_bit_as_without() -> None:
    torch.manual_seed(0)
    batch = grpo.Batch(
        per_token_logps=-torch.rand(4, 16) * 3,
        old_per_token_logps=-torch.rand(4, 16) * 3,
        ref_per_token_logps=-torch.rand(4, 16) * 3,
        advantages=torch.randn(4),
        completion_mask=torch.ones(4, 16),
    )
    config = grpo.LossConfig.from_preset("trl-grpo", beta=0.04)
    plain = grpo.evaluate(batch, config)
    mode = PausedForSmall(_Flag(True), wait=0.001)
    with mode:
        paused = grpo.evaluate(batch, config)
    assert mode.paused > 0
    assert dumps(breakdown_to_json(plain)) == dumps(breakdown_to_json(paused))  # every tensor, metric, sentence


def torch_ops_paused(body: bytes, settings: Settings) -> dict[str, Any]:
    """In a worker process (module level: it imports it): a few torch operations, and the seconds this job's
    pause for small requests took."""
    mode = WORKER["paused_for_small"]
    before = mode.paused
    _ops(20)
    return {"paused": mode.paused - before}


@pytest.mark.parametrize("small_running", [True, False])
def test_a_worker_process_pauses_its_job_while_the_server_computes_a_small_request(small_running: bool) -> None:
    settings = Settings(process_workers=1, small_first_wait=0.2)
    lanes = Lanes(settings)
    lanes.start()
    try:
        lanes.small_first.flag.value = small_running  # as SmallFirst.small sets it while a small request runs
        reply: Reply = anyio.run(lanes.run, settings.large_request_bytes, torch_ops_paused, b"", settings)
    finally:
        lanes.stop()
    assert reply.status == 200
    paused = json.loads(reply.body)["paused"]
    assert lanes.used["process"] == 1
    if small_running:
        assert 0.15 <= paused <= 0.5  # the cap: 0.2 s, then at least as long computing (longer than the job)
    else:
        assert paused == 0.0


def ops_and_their_pause(body: bytes, settings: Settings) -> dict[str, Any]:
    """A few torch operations, and the pause the lane put around them (None: no pause at all)."""
    from torch.overrides import _get_current_function_mode_stack

    modes = [m for m in _get_current_function_mode_stack() if isinstance(m, PausedForSmall)]
    _ops(20)
    return {"paused": modes[0].paused if modes else None}


def priced_costly_ops(body: bytes, settings: Settings) -> dict[str, Any]:
    """Work that prices itself past the cheap limits and must stay in this process: the costly threads."""
    price(2 * 1024 * 1024, 1024 * 1024, "a test's work", here=True)
    return ops_and_their_pause(body, settings)


def lane_reply(lanes: Lanes, size: int, fn: Any, settings: Settings, light: bool = False) -> dict[str, Any]:
    reply: Reply = anyio.run(partial(lanes.run, size, fn, b"", settings, light=light))
    assert reply.status == 200
    answer: dict[str, Any] = json.loads(reply.body)
    return answer


@pytest.mark.parametrize("small_running", [True, False])
def test_the_large_and_costly_threads_pause_for_small_requests_and_the_small_threads_never_do(
    small_running: bool,
) -> None:
    settings = Settings(process_workers=0, small_first_wait=0.2)
    lanes = Lanes(settings)
    with lanes.small_first.small() if small_running else nullcontext():  # a small request running meanwhile
        large = lane_reply(lanes, settings.large_request_bytes, ops_and_their_pause, settings, light=True)
        costly = lane_reply(lanes, 100, priced_costly_ops, settings)  # small, priced costly, kept in this process
        small = lane_reply(lanes, 100, ops_and_their_pause, settings)
    assert lanes.used == {"large": 1, "escalated": 1, "costly": 1, "small": 1}
    assert small["paused"] is None  # the small lane is what the others step back for
    for paused in (large["paused"], costly["paused"]):
        assert (0.15 <= paused <= 0.5) if small_running else paused == 0.0
