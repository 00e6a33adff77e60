"""A running run's event stream (GET /api/v1/runs/{name}/events, app/watch.py and app/run_streams.py) under a
real uvicorn on the loopback: a step file written while a client listens is pushed as that step's timeline
entry (equal to grpo.runs.timeline's), a reconnect with Last-Event-ID gets only the later events, a fresh
stream a bounded history, the lab's caps and stall limit hold, a stopped server ends its streams, and a run that
stops running, is deleted or loses its last listener ends its watch. Every wait has a bound (a hang guard,
not a timing)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from api_fixtures import free_port
from fastapi import FastAPI
from test_lab_server import lab_server

import grpo
from app.main import create_app
from app.run_streams import LiveRun, start_index
from app.settings import Settings
from app.summaries import anomaly_thresholds
from app.watch import Watch
from grpo.runs import RunWriter, timeline

Event = tuple[str, str, dict[str, Any]]  # (id, event, data)
BOUND = 60.0  # seconds any one wait may take before the test fails (a hang guard)


def tensors(seed: int, rows: int = 4, width: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 2 - 0.05
    return {
        "per_token_logps": (old + 0.3 * torch.randn(rows, width, generator=g)).clamp(max=-1e-3),
        "old_per_token_logps": old,
        "completion_mask": torch.arange(width)[None, :] < torch.tensor([6, 3, 5, 1])[:rows, None],
        "advantages": torch.randn(rows, generator=g),
    }


def running_run(run_dir: Path, steps: int) -> RunWriter:
    """A TRL run being captured (run.json status "running") with ``steps`` one-file steps."""
    writer = RunWriter(run_dir, "trl", grpo.LossConfig.from_preset("trl-grpo"))
    for step in range(1, steps + 1):
        writer.write_step(step, 0, tensors(step), {})
    return writer


@contextlib.asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The app under a real uvicorn on 127.0.0.1 in this event loop (streams need a real server)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="critical"))
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done())
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=BOUND) as http:
            yield http
    finally:
        app.state.watcher.stop()
        server.should_exit = True
        await task


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(int(BOUND / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


class Reader:
    """An open stream's events, one at a time, each within BOUND seconds."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.status_code
        assert response.headers["content-type"].startswith("text/event-stream")
        self.lines = response.aiter_lines()

    async def next(self) -> Event:
        fields: dict[str, str] = {}
        return await asyncio.wait_for(self._next(fields), BOUND)  # keep-alives within it never extend it

    async def _next(self, fields: dict[str, str]) -> Event:
        while True:
            line = await anext(self.lines)
            if line.startswith(":") or (line == "" and not fields):  # a keep-alive comment and its blank line
                continue
            if line == "":
                return fields["id"], fields["event"], json.loads(fields["data"])
            name, _, value = line.partition(": ")
            fields[name] = value

    async def step(self, anomalies: list[dict[str, Any]] | None = None) -> Event:
        """The next step event (anomalies before it go into ``anomalies``)."""
        while (event := await self.next())[1] == "anomaly":
            if anomalies is not None:
                anomalies.append(event[2])
        assert event[1] == "step", event
        return event

    async def until(self, event: str) -> list[Event]:
        """Events up to and including the first named ``event``."""
        seen = [await self.next()]
        while seen[-1][1] != event:
            seen.append(await self.next())
        return seen

    async def ended(self) -> bool:
        with contextlib.suppress(StopAsyncIteration):
            while True:
                await asyncio.wait_for(anext(self.lines), BOUND)
        return True


def app_for(runs_dir: Path, **settings: Any) -> FastAPI:
    return create_app(Settings(runs_dir=runs_dir, process_workers=0, watch_interval=0.1, **settings))


def test_a_step_written_while_listening_is_pushed_as_its_timeline_entry(tmp_path: Path) -> None:
    writer = running_run(tmp_path / "live", 2)
    app = app_for(tmp_path)

    async def scenario() -> None:
        async with served(app) as http, http.stream("GET", "/api/v1/runs/live/events") as response:
            events = Reader(response)
            status = await events.next()
            assert status[1] == "status" and status[2]["status"] == "running" and status[2]["steps"] == 2
            anomalies: list[dict[str, Any]] = []
            first = [(await events.step(anomalies))[2] for _ in range(2)]
            fresh = timeline(tmp_path / "live", anomaly_thresholds(app.state.settings))
            assert first == fresh["steps"]  # the entries as the timeline answers them
            await asyncio.to_thread(writer.write_step, 3, 0, tensors(3), {})
            _, _, entry = await events.step(anomalies)
            again = timeline(tmp_path / "live", anomaly_thresholds(app.state.settings))
            assert entry == again["steps"][2] and entry["step"] == 3
            # a second micro-batch of step 3: the step is sent again, changed (its rows joined)
            await asyncio.to_thread(writer.write_step, 3, 1, tensors(33), {})
            _, _, joined = await events.step(anomalies)
            final = timeline(tmp_path / "live", anomaly_thresholds(app.state.settings))
            assert joined["step"] == 3 and joined["rows"] == entry["rows"] + 4 and joined == final["steps"][2]
            assert all(a in final["anomalies"] or a in again["anomalies"] for a in anomalies)
            await asyncio.to_thread(writer.update, status="done")
            tail = await events.until("done")
            assert tail[-1][2] == {"status": "done", "reason": "status"}
            assert ("status", "done") in [(e[1], e[2].get("status")) for e in tail]
            assert await events.ended()
        assert app.state.watcher.watches == {}  # the watch stopped with the run

    asyncio.run(scenario())


def test_last_event_id_and_after_replay_only_later_events(tmp_path: Path) -> None:
    writer = running_run(tmp_path / "live", 3)
    app = app_for(tmp_path)

    async def scenario() -> None:
        async with served(app) as http, http.stream("GET", "/api/v1/runs/live/events") as kept:
            first = Reader(kept)
            await first.next()  # status
            seed = [await first.step() for _ in range(3)]  # steps 1-3
            await asyncio.to_thread(writer.write_step, 4, 0, tensors(4), {})
            four = await first.step()
            # a reconnect naming step 2's event: steps 3 and 4 only
            headers = {"last-event-id": seed[1][0]}
            async with http.stream("GET", "/api/v1/runs/live/events", headers=headers) as again:
                later = Reader(again)
                assert [(await later.step())[2]["step"] for _ in range(2)] == [3, 4]
            # an id of another log (a restarted server): a fresh stream, its whole (bounded) history
            async with http.stream("GET", "/api/v1/runs/live/events", headers={"last-event-id": "999-1"}) as other:
                assert [e[1] for e in [await Reader(other).next()]] == ["status"]
            # after=3: the page has steps up to 3 (and their anomalies); step 4 comes first
            async with http.stream("GET", "/api/v1/runs/live/events?after=3") as page:
                assert await Reader(page).next() == four
            assert (await http.get("/api/v1/runs/live/events?after=-1")).status_code == 422
            assert (await http.get("/api/v1/runs/nope/events")).status_code == 404

    asyncio.run(scenario())


def test_a_fresh_stream_replays_a_bounded_history(tmp_path: Path) -> None:
    running_run(tmp_path / "live", 6)
    app = app_for(tmp_path, lab_stream_history=2)

    async def scenario() -> None:
        async with served(app) as http, http.stream("GET", "/api/v1/runs/live/events") as response:
            events = Reader(response)
            replayed = [await events.next() for _ in range(2)]
            log = app.state.watcher.watches["live"].run
            newest = len(log.chunks)
            assert [e[0] for e in replayed] == [f"{log.epoch}-{newest - 2}", f"{log.epoch}-{newest - 1}"]
            assert {e[2]["step"] for e in replayed} <= {5, 6}  # the newest of 6 steps (and their anomalies)

    asyncio.run(scenario())


def test_streams_are_capped_per_client_as_the_labs(tmp_path: Path) -> None:
    running_run(tmp_path / "live", 1)
    app = app_for(tmp_path, lab_max_streams_per_client=2)

    async def scenario() -> None:
        async with served(app) as http, contextlib.AsyncExitStack() as stack:
            codes = []
            for _ in range(3):
                response = await stack.enter_async_context(http.stream("GET", "/api/v1/runs/live/events"))
                codes.append(response.status_code)
            assert codes == [200, 200, 429]
            assert "lab_max_streams_per_client" in json.loads(await response.aread())["detail"][0]["msg"]
            assert app.state.watcher.watches["live"].run.listeners == 2
        await until(lambda: not app.state.lab_streams.clients)  # every place given back

    asyncio.run(scenario())


def test_a_deleted_run_ends_its_stream_and_nobody_listening_stops_the_watch(tmp_path: Path) -> None:
    writer = running_run(tmp_path / "live", 1)
    app = app_for(tmp_path)

    async def scenario() -> None:
        async with served(app) as http:
            async with http.stream("GET", "/api/v1/runs/live/events") as response:
                await Reader(response).next()
            await until(lambda: "live" not in app.state.watcher.watches)  # the last listener left
            polled = app.state.watcher.polled
            await asyncio.to_thread(writer.write_step, 2, 0, tensors(2), {})
            await asyncio.sleep(0.5)  # five polling intervals: nothing is watched, nothing computed
            assert app.state.watcher.polled == polled
            async with http.stream("GET", "/api/v1/runs/live/events") as response:
                events = Reader(response)
                await events.next()
                await asyncio.to_thread(shutil.rmtree, tmp_path / "live")
                assert (await events.until("done"))[-1][2] == {"status": None, "reason": "deleted"}
                assert await events.ended()

    asyncio.run(scenario())


def test_a_run_that_is_not_running_answers_its_status_and_ends(tmp_path: Path) -> None:
    running_run(tmp_path / "over", 2).update(status="done")
    app = app_for(tmp_path)

    async def scenario() -> None:
        async with served(app) as http, http.stream("GET", "/api/v1/runs/over/events") as response:
            events = Reader(response)
            assert [e[1] for e in await events.until("done")] == ["status", "done"]  # no step replayed
            assert await events.ended()
        assert app.state.watcher.polled == 0  # not read at all

    asyncio.run(scenario())


def test_diff_sends_new_and_changed_entries_only() -> None:
    """Invariant of the watch's diff: an entry is sent once per content; a changed one again; the first diff
    only the last ``history`` steps."""
    watch = Watch(Path("run"), LiveRun(id="run", run_dir=Path("run"), fields={}))
    steps = [{"step": s, "loss": {"recomputed": s / 10}} for s in range(1, 6)]
    anomaly = {"step": 4, "kind": "loss_spike", "micro": 0, "rank": None, "value": 1.0}
    first = watch.diff({"steps": steps, "anomalies": [anomaly]}, history=2)
    assert first == [("step", steps[3]), ("anomaly", anomaly), ("step", steps[4])]  # a step's anomalies after it
    changed = {"step": 5, "loss": {"recomputed": 0.7}}
    second = watch.diff({"steps": [*steps[:4], changed, {"step": 6}], "anomalies": [anomaly]}, history=None)
    assert second == [
        ("step", steps[0]),
        ("step", steps[1]),
        ("step", steps[2]),
        ("step", changed),
        ("step", {"step": 6}),
    ]
    assert watch.diff({"steps": [*steps[:4], changed, {"step": 6}], "anomalies": [anomaly]}, history=None) == []


def test_start_index_follows_the_log_its_id_names() -> None:
    run = LiveRun(id="run", run_dir=Path("run"), fields={})
    events = [("status", {"status": "running"})] + [("step", {"step": s}) for s in range(1, 11)]
    run.publish(events, history=100)
    assert run.chunks[3].startswith(f"id: {run.epoch}-3\n".encode())
    assert start_index(run, f"{run.epoch}-3", None, 100) == 4  # after event 3
    assert start_index(run, "0-3", None, 100) == 0  # another log's id: a fresh stream
    assert start_index(run, None, None, 4) == 7  # a fresh stream: the newest 4
    assert start_index(run, None, 7, 100) == 8  # past step 7's event (index 7)
    run.publish([("step", {"step": s}) for s in range(11, 1000)], history=100)
    assert run.chunks[:10] == [b""] * 10 and run.chunks[-1]  # events past 4 replays' worth dropped from memory


@pytest.mark.parametrize("bad", ["abc", "1-", "-1", "x" * 40])
def test_a_garbled_last_event_id_is_a_fresh_stream(bad: str) -> None:
    run = LiveRun(id="run", run_dir=Path("run"), fields={})
    run.publish([("step", {"step": s}) for s in range(1, 6)], history=100)
    assert start_index(run, bad, None, 3) == 2


def test_a_stopped_server_ends_its_live_streams(tmp_path: Path) -> None:
    """SIGINT with a live stream open: the stream ends (the watch sees the lab manager closing) and uvicorn exits,
    well before the stream's keep-alive would have ended it."""
    running_run(tmp_path / "live", 1)
    with lab_server(tmp_path, watch_interval="0.1") as (url, proc), httpx.Client(base_url=url, timeout=BOUND) as http:
        with http.stream("GET", "/api/v1/runs/live/events") as response:
            lines = response.iter_lines()
            assert next(lines).startswith("id: ")
            start = time.monotonic()
            proc.send_signal(signal.SIGINT)
            rest = list(lines)  # ends when the server closes the stream
        proc.wait(timeout=BOUND)
    assert "event: done" not in rest  # ended with the server, not with the run
    assert time.monotonic() - start < 8.0  # before the first keep-alive (10 s) would have looked at the closing flag


def test_a_reader_that_takes_nothing_is_dropped(tmp_path: Path) -> None:
    """The lab's stall limit: a client that never reads is dropped once its buffers are full, its place given back."""
    running_run(tmp_path / "live", 1)
    app = app_for(tmp_path, lab_stream_stall_seconds=0.2)

    async def scenario() -> None:
        async with served(app) as http:
            host, port = str(http.base_url).removeprefix("http://").rstrip("/").split(":")
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect((host, int(port)))
            sock.sendall(b"GET /api/v1/runs/live/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            await until(lambda: "live" in app.state.watcher.watches and app.state.watcher.watches["live"].run.listeners)
            log = app.state.watcher.watches["live"].run
            for step in range(400):  # fill every buffer between the server and the reader that never reads
                log.publish([("step", {"step": step + 2, "note": "x" * 65536})], history=1024)
                await asyncio.sleep(0.01)
                if not app.state.lab_streams.runs:
                    break
            assert not app.state.lab_streams.runs  # dropped, its place given back
            await until(lambda: "live" not in app.state.watcher.watches)  # and the watch stopped with it
            sock.close()

    asyncio.run(scenario())
