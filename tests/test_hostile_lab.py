"""The lab, attacked: races between a check and its act forced with an injected pause, never
left to luck; slots freed whatever the order of events; cancel and delete in every state; the step
endpoint on files the lab did not write; event streams capped, asleep when idle, and a reader that
takes nothing dropped.

The manager's workers are fakes here (no process, no training): a test plays the worker's events
with ``LabManager.on_event``. The worker's own side (``run_job``) runs in this process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn
from api_fixtures import free_port
from fastapi import FastAPI, Request

from app import deps, lab_streams
from app.auth import COOKIE
from app.lab_streams import stream_events
from app.lab_workers import Job, LabManager, LabRun, Worker, run_job
from app.main import create_app
from app.settings import Settings
from grpo import LossConfig
from grpo.lab import LabConfig
from grpo.runs import RunWriter, load_run

LOSS = LossConfig().to_dict()


# --- fakes ---------------------------------------------------------------------------------------
class FakeProcess:
    def __init__(self) -> None:
        self.alive, self.exitcode, self.terminated = True, None, False

    def is_alive(self) -> bool:
        return self.alive

    def terminate(self) -> None:
        self.alive, self.terminated, self.exitcode = False, True, -15

    def join(self, timeout: float | None = None) -> None:
        return None

    def kill(self) -> None:
        self.alive = False


class FakeJobs:
    def __init__(self) -> None:
        self.items: list[Job] = []

    def put(self, job: Job) -> None:
        self.items.append(job)

    def cancel_join_thread(self) -> None:
        return None


class Box:
    """multiprocessing.Value's one attribute."""

    def __init__(self, value: int = 0) -> None:
        self.value = value


def fake_manager(runs_dir: Path, max_concurrent: int = 1, max_queue: int = 32, **kw: Any) -> LabManager:
    """A LabManager whose workers are fakes; call ``start`` inside the test's event loop."""
    manager = LabManager(runs_dir, max_concurrent, 60.0, 1, 0, max_queue=max_queue, **kw)

    def spawn() -> Worker:
        worker = Worker(FakeProcess(), FakeJobs(), Box())
        manager.workers.append(worker)
        return worker

    manager._spawn = spawn  # type: ignore[method-assign]
    return manager


def lab_app(runs_dir: Path, manager: LabManager, **settings: Any) -> FastAPI:
    app = create_app(Settings(runs_dir=runs_dir, **settings))
    app.state.lab = manager
    return app


def asgi(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://lens.test", timeout=60)


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds (a hang guard, not a timing)."""
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the condition never held")


def streams_on(app: FastAPI, run_id: str) -> int:
    caps = getattr(app.state, "lab_streams", None)
    return 0 if caps is None else int(caps.runs.get(run_id, 0))


def worker_of(manager: LabManager, run: LabRun) -> Worker:
    return next(w for w in manager.workers if w.job == run.job)


@contextlib.contextmanager
def paused_creation(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every run.json write of a new run waits at a gate: the pause between a POST's check and its act."""
    gate, arrived = asyncio.Event(), []
    original = LabManager._create

    async def paused(self: LabManager, run: LabRun, info: dict[str, Any]) -> None:
        arrived.append(run.id)
        await gate.wait()
        await original(self, run, info)

    monkeypatch.setattr(LabManager, "_create", paused)
    yield gate, arrived


# --- races: name and queue --------------------------------------------------------------------
def test_twenty_concurrent_posts_of_one_name_give_one_202(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the name was checked, then an await, then the run submitted: 10 of 20 got 202 and the
    run's bookkeeping jammed the queue. Now the check and the reservation are one step."""

    async def scenario() -> list[httpx.Response]:
        manager = fake_manager(tmp_path, max_concurrent=2)
        manager.start(asyncio.get_running_loop())
        with paused_creation(monkeypatch) as (gate, arrived):
            async with asgi(lab_app(tmp_path, manager)) as http:
                body = {"steps": 1, "name": "same"}
                tasks = [asyncio.create_task(http.post("/api/v1/lab/runs", json=body)) for _ in range(20)]
                await until(lambda: len(arrived) + sum(t.done() for t in tasks) == 20)
                gate.set()
                responses = list(await asyncio.gather(*tasks))
        assert list(manager.runs) == ["same"]
        assert sum(len(w.jobs.items) for w in manager.workers) == 1
        return responses

    responses = asyncio.run(scenario())
    assert sorted(r.status_code for r in responses) == [202] + [409] * 19
    for refused in (r for r in responses if r.status_code == 409):
        assert refused.json()["detail"][0]["loc"] == ["body", "name"]
    assert json.loads((tmp_path / "same" / "run.json").read_text())["status"] == "queued"


def test_120_concurrent_posts_never_pass_the_queue_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: 41 of 120 accepted against a limit of 32. Now at most 32 wait (two more start at once)."""

    async def scenario() -> tuple[list[int], LabManager]:
        manager = fake_manager(tmp_path, max_concurrent=2, max_queue=32)
        manager.start(asyncio.get_running_loop())
        with paused_creation(monkeypatch) as (gate, arrived):
            async with asgi(lab_app(tmp_path, manager, lab_max_queue=32, lab_max_concurrent=2)) as http:
                posts = [http.post("/api/v1/lab/runs", json={"steps": 1, "name": f"r{i}"}) for i in range(120)]
                tasks = [asyncio.create_task(p) for p in posts]
                await until(lambda: len(arrived) + sum(t.done() for t in tasks) == 120)
                gate.set()
                statuses = [r.status_code for r in await asyncio.gather(*tasks)]
        return statuses, manager

    statuses, manager = asyncio.run(scenario())
    assert statuses.count(202) == 34 and statuses.count(429) == 86
    assert len(manager.pending) == 32
    assert sum(w.job is not None for w in manager.workers) == 2
    refused = sorted(p.name for p in tmp_path.iterdir())
    assert len(refused) == 34  # a refused POST leaves no directory behind


def test_a_failed_run_json_write_releases_the_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def failing(self: LabManager, run: LabRun, info: dict[str, Any]) -> None:
        raise OSError(28, "No space left on device")

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        manager = fake_manager(tmp_path)
        manager.start(asyncio.get_running_loop())
        async with asgi(lab_app(tmp_path, manager)) as http:
            with monkeypatch.context() as patch:
                patch.setattr(LabManager, "_create", failing)
                full = await http.post("/api/v1/lab/runs", json={"steps": 1, "name": "x"})
            again = await http.post("/api/v1/lab/runs", json={"steps": 1, "name": "x"})
        return full, again

    full, again = asyncio.run(scenario())
    assert full.status_code == 507 and str(tmp_path) not in full.text
    assert again.status_code == 202


def test_a_store_without_room_refuses_a_run_with_507(tmp_path: Path) -> None:
    async def scenario() -> httpx.Response:
        manager = fake_manager(tmp_path, budget=lambda: 0)
        manager.start(asyncio.get_running_loop())
        async with asgi(lab_app(tmp_path, manager)) as http:
            return await http.post("/api/v1/lab/runs", json={"steps": 1, "name": "x"})

    response = asyncio.run(scenario())
    assert response.status_code == 507
    assert "GRPO_LENS_RUNS_MAX_BYTES" in response.json()["detail"][0]["msg"]
    assert not (tmp_path / "x").exists()


# --- slots, whatever the order of events ------------------------------------------------------------
async def two_runs(tmp_path: Path, manager: LabManager) -> tuple[LabRun, LabRun]:
    manager.start(asyncio.get_running_loop())
    first = await manager.submit("first", {"loss": LOSS}, {"name": "first"})
    second = await manager.submit("second", {"loss": LOSS}, {"name": "second"})
    assert first.job is not None
    manager.on_event(first.job, "started", {"pid": 0})
    return first, second


def test_a_terminal_event_for_a_finished_run_still_frees_its_worker(tmp_path: Path) -> None:
    """Before: the slot was freed only by a terminal event of an unfinished run, so a run finished by
    another path kept its worker forever and the next run waited at position 1 behind idle workers."""

    async def scenario() -> None:
        manager = fake_manager(tmp_path, max_concurrent=1)
        first, second = await two_runs(tmp_path, manager)
        job = first.job
        assert job is not None and manager.queue_position("second") == 1
        first.add("cancelled", {"reason": "finished by another path first"})
        manager.on_event(job, "cancelled", {"reason": "the worker's own end"})
        assert second.job is not None and manager.queue_position("second") is None
        assert [e for e, _ in first.events].count("cancelled") == 1  # recorded once
        manager.on_event(job, "step", {"step": 9})  # a late event of the ended job goes nowhere
        assert all(e != "step" for e, _ in first.events + second.events)

    asyncio.run(scenario())


def test_a_dead_worker_frees_its_slot_and_a_new_one_starts(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager = fake_manager(tmp_path, max_concurrent=1)
        first, second = await two_runs(tmp_path, manager)
        dead = worker_of(manager, first)
        dead.process.alive = False
        assert first.job is not None
        manager.on_event(first.job, "error", {"message": "the worker process died (exit code -9)"})
        manager.on_event(first.job, "error", {"message": "reported twice"})  # the watchdog may repeat itself
        assert first.status == "error" and [e for e, _ in first.events].count("error") == 1
        assert dead not in manager.workers and second.job is not None
        assert json.loads((tmp_path / "first" / "run.json").read_text())["status"] == "error"

    asyncio.run(scenario())


# --- cancel and delete in every state ----------------------------------------------------------
@pytest.mark.parametrize("state", ["queued", "running", "finished", "unknown"])
def test_cancel_in_every_state(tmp_path: Path, state: str) -> None:
    async def scenario() -> tuple[int, dict[str, Any], LabManager]:
        manager = fake_manager(tmp_path, max_concurrent=1)
        first, _ = await two_runs(tmp_path, manager)
        name = {"queued": "second", "running": "first", "finished": "first", "unknown": "nobody"}[state]
        if state == "finished":
            assert first.job is not None
            manager.on_event(first.job, "done", {"reason": "finished", "steps": 1})
        async with asgi(lab_app(tmp_path, manager)) as http:
            response = await http.delete(f"/api/v1/lab/runs/{name}")
        return response.status_code, response.json(), manager

    status, body, manager = asyncio.run(scenario())
    if state == "queued":
        assert (status, body["status"]) == (200, "cancelled")
        assert json.loads((tmp_path / "second" / "run.json").read_text())["status"] == "cancelled"
        assert not manager.pending
    elif state == "running":  # the worker is asked to stop after its step; it reports the end
        assert (status, body["status"]) == (202, "running")
        worker = manager.workers[0]
        assert worker.cancel.value == worker.job
    elif state == "finished":
        assert (status, body["status"]) == (200, "done")
    else:
        assert status == 404 and body["detail"][0]["loc"] == ["path", "run_id"]


def test_cancel_after_the_run_directory_was_deleted_is_not_a_500(tmp_path: Path) -> None:
    """Before: a DELETE of the run's directory, then a cancel, touched a file in the missing directory: 500."""

    async def scenario() -> int:
        manager = fake_manager(tmp_path)
        manager.start(asyncio.get_running_loop())
        await manager.submit("gone", {"loss": LOSS}, {"name": "gone"})
        shutil.rmtree(tmp_path / "gone")
        async with asgi(lab_app(tmp_path, manager)) as http:
            return (await http.delete("/api/v1/lab/runs/gone")).status_code

    assert asyncio.run(scenario()) == 202


@pytest.mark.parametrize("state", ["queued", "running", "stuck", "finished", "unknown"])
def test_remove_in_every_state_frees_the_name_and_the_slot(tmp_path: Path, state: str) -> None:
    """``remove`` (the runs store's DELETE calls it): the run is cancelled, its worker let go of it (or,
    stuck past the bound, is terminated and its slot freed), and its name is free again."""

    async def scenario() -> None:
        manager = fake_manager(tmp_path, max_concurrent=1)
        first, second = await two_runs(tmp_path, manager)
        target = {"queued": second, "running": first, "stuck": first, "finished": first}.get(state)
        worker = manager.workers[0]
        if state == "finished":
            assert first.job is not None
            manager.on_event(first.job, "done", {"reason": "finished", "steps": 0})
        if state == "running":  # the worker sees the cancel after its step and reports the end
            asyncio.get_running_loop().call_soon(
                lambda: manager.on_event(worker.cancel.value, "cancelled", {"reason": "cancelled", "steps": 3})
            )
        await manager.remove(target.id if target else "nobody", timeout=0.05 if state == "stuck" else 30)
        if target is None:
            return
        assert target.id not in manager.runs and target.finished
        assert b"/" + tmp_path.name.encode() not in b"".join(target.chunks)  # no server path in any event
        if state == "stuck":
            assert worker.process.terminated and worker not in manager.workers
        if state in ("running", "stuck"):
            assert target.events[-1][0] == "cancelled"
            assert second.job is not None  # the slot went to the next run
        shutil.rmtree(target.run_dir)  # what the store does next
        again = await manager.submit(target.id, {"loss": LOSS}, {"name": target.id})
        assert manager.runs[target.id] is again

    asyncio.run(scenario())


def test_a_run_whose_directory_vanished_reports_no_server_path(tmp_path: Path) -> None:
    """Before: a lab run deleted while queued streamed 'FileNotFoundError: ... /srv/runs/x/run.json'."""
    events: list[tuple[int, str, dict[str, Any]]] = []

    class Events:
        def put(self, item: tuple[int, str, dict[str, Any]]) -> None:
            events.append(item)

    fields = LabConfig(steps=1).to_dict() | {"loss": LOSS}
    run_job(Job(1, "gone", str(tmp_path / "gone"), fields, 60.0, None), Events(), Box())
    assert [e for _, e, _ in events] == ["error"]
    message = events[0][2]["message"]
    assert "FileNotFoundError" in message and str(tmp_path) not in message and "gone" not in message


# --- the disk budget ------------------------------------------------------------------------------
def trained(tmp_path: Path, name: str, steps: int, budget: int | None) -> list[tuple[int, str, dict[str, Any]]]:
    events: list[tuple[int, str, dict[str, Any]]] = []

    class Events:
        def put(self, item: tuple[int, str, dict[str, Any]]) -> None:
            events.append(item)

    RunWriter(tmp_path / name, "lab", LOSS, info={"name": name, "status": "queued"})
    fields = LabConfig(steps=steps, prompts_per_step=2, group_size=2).to_dict() | {"loss": LOSS}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_job(Job(1, name, str(tmp_path / name), fields, 600.0, budget), Events(), Box())
    finally:
        torch.set_num_threads(threads)
    return events


def test_a_lab_run_stops_at_the_disk_budget_keeping_its_steps(tmp_path: Path) -> None:
    trained(tmp_path, "probe", 1, None)
    step_bytes = (tmp_path / "probe" / "steps" / "000001-000.safetensors").stat().st_size
    events = trained(tmp_path, "capped", 5, 2 * step_bytes + step_bytes // 2)
    names = [e for _, e, _ in events]
    assert names == ["started", "step", "step", "error"]
    message = events[-1][2]["message"]
    assert "GRPO_LENS_RUNS_MAX_BYTES" in message and "step 3" in message
    run = load_run(tmp_path / "capped")
    assert run.step_numbers() == [1, 2]
    assert run.info["status"] == "error" and "budget" in run.info["error"] and run.info["name"] == "capped"


def test_run_json_is_written_once_per_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: four writes before step 1, the first saying 'running' for a queued run."""
    import grpo.runs

    statuses: list[str] = []
    original = grpo.runs.write_atomic

    def recording(path: Path, data: bytes) -> None:
        if path.name == "run.json":
            statuses.append(json.loads(data)["status"])
        original(path, data)

    monkeypatch.setattr(grpo.runs, "write_atomic", recording)
    trained(tmp_path, "once", 2, None)
    assert statuses == ["queued", "running", "done"]


# --- the step endpoint --------------------------------------------------------------------------
def step_run(root: Path, name: str, source: str, rows: int = 2, tokens: int = 3, ref: bool = False) -> None:
    writer = RunWriter(root / name, source, LOSS, info={"status": "done"})
    logps = -torch.rand(rows, tokens) - 0.1
    tensors = {"per_token_logps": logps, "advantages": torch.tensor([1.0, -1.0] * (rows // 2))}
    if ref:
        tensors["ref_per_token_logps"] = logps - 0.1
    writer.write_step(1, 0, tensors, {"loss": 0.0})


def get_step(root: Path, name: str, **settings: Any) -> httpx.Response:
    async def scenario() -> httpx.Response:
        async with asgi(create_app(Settings(runs_dir=root, **settings))) as http:
            return await http.get(f"/api/v1/lab/runs/{name}/steps/1")

    return asyncio.run(scenario())


def test_a_step_without_reference_log_probs_defaults_them_to_the_policy(tmp_path: Path) -> None:
    """Before: a 500 (what the TRL capture writes at beta 0 has no ref_per_token_logps)."""
    step_run(tmp_path, "noref", "lab")
    response = get_step(tmp_path, "noref")
    assert response.status_code == 200, response.text
    request = response.json()["request"]
    assert request["ref_per_token_logps"] == request["per_token_logps"] == request["old_per_token_logps"]


def test_a_step_of_a_captured_run_opens_as_its_micro_batch_0(tmp_path: Path) -> None:
    step_run(tmp_path, "captured", "trl", ref=True)
    response = get_step(tmp_path, "captured")
    assert response.status_code == 200, response.text
    request = response.json()["request"]
    assert request["ref_per_token_logps"] != request["per_token_logps"]


# The step route found its file by a path of its own: a directory with a steps/ folder and no run.json
# (no run of the store: the listing and every /api/v1/runs view answer 404) still had its steps served.
# Now the route asks the run store, whose runs hold a regular run.json in a real directory.
def test_a_step_of_a_directory_that_is_no_run_is_a_404(tmp_path: Path) -> None:
    step_run(tmp_path, "bare", "lab")
    (tmp_path / "bare" / "run.json").unlink()
    response = get_step(tmp_path, "bare")
    assert response.status_code == 404, response.text
    assert response.json()["detail"][0]["loc"] == ["path", "run_id"]


def test_a_step_past_the_request_limits_is_a_413_before_it_is_read(tmp_path: Path) -> None:
    step_run(tmp_path, "wide", "lab", rows=4, tokens=16)
    response = get_step(tmp_path, "wide", max_tokens=32)
    assert response.status_code == 413
    assert "64 positions" in response.json()["detail"][0]["msg"]


def test_a_step_file_that_is_not_safetensors_is_a_422(tmp_path: Path) -> None:
    step_run(tmp_path, "junk", "lab")
    (tmp_path / "junk" / "steps" / "000001-000.safetensors").write_bytes(b"\xff" * 64)
    response = get_step(tmp_path, "junk")
    assert response.status_code == 422, response.text


# --- event streams ------------------------------------------------------------------------------
def test_an_idle_stream_sleeps_until_news(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every stream woke each 0.5 s to poll (1,000 idle streams: 98% of a core). Now one
    wait per keep-alive period, woken early only by the run's events."""
    waits: list[float] = []
    wait_for = asyncio.wait_for

    async def counting(awaitable: Any, timeout: float | None) -> Any:
        waits.append(timeout or 0.0)
        return await wait_for(awaitable, timeout)

    async def scenario() -> list[bytes]:
        manager = fake_manager(tmp_path)
        manager.start(asyncio.get_running_loop())
        run = LabRun("idle", tmp_path / "idle", {})
        manager.runs["idle"] = run
        run.add("queued", {"position": 1})
        chunks = stream_events(manager, run)
        first = await anext(chunks)
        monkeypatch.setattr(asyncio, "wait_for", counting)
        pending = asyncio.ensure_future(anext(chunks))
        await asyncio.sleep(1.5)  # three polls' worth of the old stream
        assert len(waits) == 1 and waits[0] >= lab_streams.KEEPALIVE_SECONDS
        run.add("step", {"step": 1, "loss": float("nan")})
        second = await pending
        run.add("done", {"reason": "finished"})
        rest = [chunk async for chunk in chunks]
        return [first, second, *rest]

    chunks = asyncio.run(scenario())
    text = b"".join(chunks).decode()
    assert (
        text.count("event: ") == 3
        and '"loss": null' in text
        and text.endswith("event: done\n" + 'data: {"reason": "finished"}\n\n')
    )


@contextlib.asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[str]:
    """The app under a real uvicorn in this event loop (streams need a real server); no lifespan:
    the test's fake manager stays."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="critical"))
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


def test_streams_are_capped_per_client_and_per_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager = fake_manager(tmp_path)
        manager.start(asyncio.get_running_loop())
        run = await manager.submit("busy", {"loss": LOSS}, {"name": "busy"})
        app = lab_app(tmp_path, manager, lab_max_streams_per_run=3, lab_max_streams_per_client=2)
        async with served(app) as url, httpx.AsyncClient(base_url=url, timeout=60) as http:
            opened: list[int] = []
            async with contextlib.AsyncExitStack() as streams:

                async def open_stream(client: str) -> httpx.Response:
                    # uvicorn trusts X-Forwarded-For from 127.0.0.1 (its default): one address per client
                    headers = {"x-forwarded-for": {"a": "127.0.1.1", "b": "127.0.1.2", "c": "127.0.1.3"}[client]}
                    response = await streams.enter_async_context(
                        http.stream("GET", "/api/v1/lab/runs/busy/events", headers=headers)
                    )
                    opened.append(response.status_code)
                    return response

                await open_stream("a")
                await open_stream("a")
                third_a = await open_stream("a")
                await open_stream("b")
                fourth = await open_stream("c")
                assert opened == [200, 200, 429, 200, 429]
                assert "lab_max_streams_per_client" in json.loads(await third_a.aread())["detail"][0]["msg"]
                assert "lab_max_streams_per_run" in json.loads(await fourth.aread())["detail"][0]["msg"]
                assert app.state.lab_streams.runs == {"busy": 3}
                assert run.job is not None
                manager.on_event(run.job, "done", {"reason": "finished", "steps": 0})  # the streams end...
            await until(lambda: not app.state.lab_streams.runs)  # ... and give their places back
            assert not app.state.lab_streams.clients
            assert (await http.get("/api/v1/lab/runs/busy/events")).status_code == 200  # replayed, then ended

    asyncio.run(scenario())


def test_a_reader_that_takes_nothing_is_dropped(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager = fake_manager(tmp_path)
        manager.start(asyncio.get_running_loop())
        run = await manager.submit("loud", {"loss": LOSS}, {"name": "loud"})
        app = lab_app(tmp_path, manager, lab_stream_stall_seconds=0.2)
        async with served(app) as url:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            host, port = url.removeprefix("http://").split(":")
            sock.connect((host, int(port)))
            sock.sendall(b"GET /api/v1/lab/runs/loud/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            await until(lambda: streams_on(app, "loud") == 1)
            big = "x" * 65536
            for step in range(400):  # fill every buffer between the server and the reader that never reads
                run.add("step", {"step": step, "note": big})
                await asyncio.sleep(0.01)
                if not streams_on(app, "loud"):
                    break
            assert not streams_on(app, "loud")  # the stream was dropped, its place given back
            sock.close()

    asyncio.run(scenario())


def test_a_client_is_its_session_with_sign_in_else_its_address(tmp_path: Path) -> None:
    """With sign-in, two people behind one address each get their share and a forged cookie counts as the
    address; without sign-in a cookie proves nothing (varying it would dodge the cap): the address."""
    signed = create_app(Settings(runs_dir=tmp_path, auth_token="t" * 32))
    one, two = signed.state.sessions.start(), signed.state.sessions.start()

    def client(app: FastAPI, cookie: str) -> str:
        scope = {"type": "http", "app": app, "headers": [(b"cookie", f"{COOKIE}={cookie}".encode())]}
        return asyncio.run(deps.stream_client(Request({**scope, "client": ("127.0.0.1", 5000)})))

    assert client(signed, one) != client(signed, two)
    assert client(signed, one).startswith("session ")
    assert client(signed, "forged") == client(signed, "another forged") == "address 127.0.0.1"
    plain = create_app(Settings(runs_dir=tmp_path))
    assert client(plain, "a") == client(plain, "b") == "address 127.0.0.1"
