"""The training lab over HTTP: start runs, stream their steps (Server-Sent Events), cancel them.

Routes stay thin: the request model validates, ``app.lab_workers.LabManager`` queues and runs,
``grpo.lab`` trains. A run's id is its run name under /api/v1/runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import secrets
import signal
import struct
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Message, Receive, Scope, Send

import grpo
from app.auth import Sessions, cookie_values
from app.errors import LimitError, config_error, error_item
from app.ingest import check_cost
from app.lab_workers import LabManager, LabRefused, LabRun
from app.schemas import ConfigRequest, ErrorResponse
from app.settings import Settings, get_settings
from app.store import RUN_NAME_PATTERN, RunStore, valid_name
from grpo.check import batch_advantages
from grpo.lab import COMPARISONS, DEFAULT_TASK, METRICS, TASKS, LabConfig
from grpo.runs import load_step

log = logging.getLogger("grpo_lens.lab")
KEEPALIVE_SECONDS = 10.0
COALESCE_SECONDS = 0.2  # a stream sends what came in this long at once: fewer wakeups per stream while a run trains
RUN_NAME = rf"^{RUN_NAME_PATTERN}$"  # the run store's names (pydantic's $ is the true end of the text)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    manager = _new_manager(_settings_of(app), _budget(app))
    manager.start(asyncio.get_running_loop())
    app.state.lab = manager
    _close_streams_on_exit(manager)
    try:
        yield
    finally:
        manager.stop()  # on the loop, where the runs' events live; nothing else is served at shutdown


def _close_streams_on_exit(manager: LabManager) -> None:
    """Uvicorn waits for open responses before it shuts down, and an event stream never ends by
    itself: wrap its SIGINT/SIGTERM handlers so a stop signal also ends every stream at once."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            manager.request_close()
            previous(signum, frame)

        with contextlib.suppress(ValueError):  # not the main thread: no signals to catch
            signal.signal(sig, handler)


router = APIRouter(lifespan=lifespan, tags=["lab"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "No such lab run or step"}}


class LabRunRequest(BaseModel):
    """A lab run: the task, the loss (a preset and overrides), steps, seed, and the loop's knobs."""

    model_config = ConfigDict(extra="forbid")

    task: str | None = Field(None, description=f"One of {', '.join(TASKS)}; default: {DEFAULT_TASK}.")
    config: ConfigRequest | None = Field(None, description="A preset and overrides; default: the article's loss.")
    steps: int = Field(150, ge=1, description="Optimiser steps (at most the setting lab_max_steps).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Fixes the policy's init, the prompts and every sample.")
    name: str | None = Field(None, pattern=RUN_NAME, description="The run's id and directory name; default: generated.")
    num_iterations: int = Field(1, ge=1, le=16, description="Optimiser steps per rollout (> 1 reuses samples).")
    learning_rate: float = Field(3e-3, gt=0, le=1, description="Adam learning rate.")
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    group_size: int = Field(8, ge=2, le=64, description="Completions per prompt.")
    prompts_per_step: int = Field(8, ge=1, le=64, description="Prompts per rollout.")
    max_grad_norm: float = Field(1.0, gt=0, le=1e6, description="Gradient norm clip (TRL max_grad_norm).")


def _lab_config(body: LabRunRequest, settings: Settings) -> LabConfig:
    if body.steps > settings.lab_max_steps:
        raise config_error(["body"], grpo.GrpoInputError("steps", f"at most {settings.lab_max_steps} (a setting)"))
    fields: dict[str, Any] = body.config.model_dump(exclude_unset=True) if body.config is not None else {}
    fields |= dict(body.config.model_extra or {}) if body.config is not None else {}
    try:
        loss = grpo.LossConfig.resolve({**fields, "device": "cpu"})  # the lab's workers train on the CPU
    except grpo.GrpoInputError as exc:
        raise config_error(["body", "config"], exc) from exc
    knobs = body.model_dump(exclude={"config", "name", "task"})
    try:
        return LabConfig(task=body.task or DEFAULT_TASK, loss=loss, **knobs)
    except grpo.GrpoInputError as exc:
        raise config_error(["body"], exc) from exc


def _manager(request: Request) -> LabManager:
    """The app's LabManager (made by the lifespan; made here when the app runs without one, as
    under an in-process test client: it spawns no worker until a run is submitted)."""
    state = request.app.state
    if not hasattr(state, "lab"):
        state.lab = _new_manager(_settings_of(request.app), _budget(request.app))
        state.lab.start(asyncio.get_running_loop())
    manager: LabManager = state.lab
    return manager


def _settings_of(app: Any) -> Settings:
    """The settings the app was built with (create_app), else the environment's."""
    settings: Settings = getattr(app.state, "settings", None) or get_settings()
    return settings


def _request_settings(request: Request) -> Settings:
    return _settings_of(request.app)


SettingsDep = Annotated[Settings, Depends(_request_settings)]


def _budget(app: Any) -> Callable[[], int | None] | None:
    """The run store's remaining bytes, which lab runs count against (None: an app without a store)."""
    store: RunStore | None = getattr(app.state, "store", None)
    return store.remaining_bytes if store is not None else None


def _new_manager(settings: Settings, budget: Callable[[], int | None] | None = None) -> LabManager:
    return LabManager(
        settings.runs_dir,
        settings.lab_max_concurrent,
        settings.lab_max_seconds,
        settings.lab_torch_threads,
        settings.lab_nice,
        max_queue=settings.lab_max_queue,
        budget=budget,
    )


def _refused(status: int, loc: list[str | int], msg: str, kind: str) -> HTTPException:
    """An error in the API's one shape, its loc naming the path parameter or body field at fault."""
    return HTTPException(status, [error_item(loc, msg, kind)])


def _run(request: Request, run_id: str) -> LabRun:
    run = _manager(request).runs.get(run_id)
    if run is None:
        raise _refused(404, ["path", "run_id"], f"no lab run {run_id!r} in this server process", "not_found")
    return run


def _summary(manager: LabManager, run: LabRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "status": run.status,
        "queue_position": manager.queue_position(run.id),
        "steps_done": sum(1 for e, _ in run.events if e == "step"),
        "lab": _lab_json(run.fields),
    }


def _lab_json(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if k != "loss"} | {"config": fields["loss"]}


@router.get("/api/v1/lab/tasks", summary="The lab's tasks, canned comparisons, metrics and loop settings")
async def tasks() -> JSONResponse:
    defaults = LabConfig()
    knobs = [
        {"name": f.name, "default": getattr(defaults, f.name), "doc": f.metadata.get("doc", "")}
        for f in dataclasses.fields(LabConfig)
        if f.name not in ("task", "loss", "hidden")
    ]
    return JSONResponse(
        {
            "default": DEFAULT_TASK,
            "tasks": [
                {"name": t.name, "doc": t.doc, "teaches": t.teaches, "max_completion_length": t.max_completion_length}
                for t in TASKS.values()
            ],
            "metrics": list(METRICS),
            "settings": knobs,
            "comparisons": [
                {
                    "name": c.name,
                    "title": c.title,
                    "watch": c.watch,
                    "metrics": list(c.metrics),
                    "overlay": c.overlay,
                    "runs": [_run_request(r) for r in c.runs],
                }
                for c in COMPARISONS.values()
            ],
        }
    )


def _run_request(config: LabConfig) -> dict[str, Any]:
    """The POST body that starts ``config``: the loss as a whole resolved config."""
    fields = config.to_dict()
    loss = {k: v for k, v in fields.pop("loss").items() if k not in ("device", "dtype")}
    fields.pop("hidden")
    return fields | {"config": loss | {"preset": loss.get("preset") or "article"}}


@router.post(
    "/api/v1/lab/runs",
    status_code=202,
    summary="Start a lab run (queued when the workers are busy)",
    responses={
        409: {"model": ErrorResponse, "description": "A run of that name exists"},
        429: {"model": ErrorResponse, "description": "The queue is full (a setting)"},
        507: {"model": ErrorResponse, "description": "The runs store is full (its budget, a setting)"},
    },
)
async def start_run(body: LabRunRequest, request: Request, settings: SettingsDep) -> JSONResponse:
    manager = _manager(request)
    config = _lab_config(body, settings)
    run_id = body.name or f"lab-{config.task}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
    fields = config.to_dict() | {"loss": config.loss.to_dict()}
    try:
        run = await manager.submit(run_id, fields, {"name": run_id, "lab": _lab_json(fields)})
    except LabRefused as exc:
        raise _refused(exc.status, ["body", "name"] if exc.status == 409 else ["body"], str(exc), exc.kind) from exc
    except OSError as exc:  # the run's directory could not be written: say why, never where
        status = 507 if exc.errno in DISK_FULL else 503
        raise _refused(status, ["body"], f"the run could not be written: {exc.strerror}", "storage") from exc
    return JSONResponse(_summary(manager, run), status_code=202)


@router.get("/api/v1/lab/queue", summary="The lab runs of this server process, with queue positions")
async def list_lab_runs(request: Request) -> JSONResponse:
    manager = _manager(request)
    return JSONResponse({"runs": [_summary(manager, r) for r in manager.runs.values()]})


@router.get("/api/v1/lab/runs/{run_id}/status", summary="One lab run's status and queue position", responses=NOT_FOUND)
async def get_lab_run(run_id: str, request: Request) -> JSONResponse:
    return JSONResponse(_summary(_manager(request), _run(request, run_id)))


@router.delete(
    "/api/v1/lab/runs/{run_id}",
    status_code=202,
    summary="Cancel a lab run (its steps so far stay as a run)",
    responses={**NOT_FOUND, 200: {"description": "The run had already finished: its status"}},
)
async def cancel_run(run_id: str, request: Request) -> JSONResponse:
    manager = _manager(request)
    run = manager.cancel(_run(request, run_id).id)
    return JSONResponse(_summary(manager, run), status_code=202 if not run.finished else 200)


@router.get(
    "/api/v1/lab/runs/{run_id}/events",
    summary="Server-Sent Events: queued, started, one step per optimiser step, then done, error or cancelled",
    response_class=StreamingResponse,
    responses={**NOT_FOUND, 429: {"model": ErrorResponse, "description": "Too many open streams (a setting)"}},
)
async def events(run_id: str, request: Request, settings: SettingsDep) -> StreamingResponse:
    manager, run, caps = _manager(request), _run(request, run_id), _stream_caps(request)
    client = _client(request)
    caps.open(run.id, client)  # checked and counted in one step: no await in between
    return EventStream(
        stream_events(manager, run), lambda: caps.close(run.id, client), settings.lab_stream_stall_seconds
    )


def _client(request: Request) -> str:
    """Who opens a stream, for the per-client cap: the signed-in session when the instance has sign-in
    (people behind one address each get their own share), else the address (uvicorn has put the
    forwarded one there when the proxy is trusted). Without sign-in a cookie proves nothing: a client
    could vary it to dodge the cap, so it does not count."""
    sessions: Sessions | None = getattr(request.app.state, "sessions", None)
    if sessions is not None:
        for value in cookie_values(request.headers.get("cookie", "")):
            if (sid := sessions.check(value)) is not None:
                return f"session {sid}"
    return f"address {request.client.host if request.client else ''}"


@dataclass
class StreamCaps:
    """Open event streams, counted per run and per client; past a cap a new one is a 429 naming it."""

    per_run: int
    per_client: int
    runs: Counter[str] = field(default_factory=Counter)
    clients: Counter[str] = field(default_factory=Counter)

    def open(self, run_id: str, client: str) -> None:
        if self.runs[run_id] >= self.per_run:
            msg = f"{self.runs[run_id]} event streams are open on this run (at most {self.per_run}: the setting "
            raise _refused(429, ["path", "run_id"], msg + "lab_max_streams_per_run); retry later", "too_many_streams")
        if self.clients[client] >= self.per_client:
            msg = f"this client has {self.clients[client]} event streams open (at most {self.per_client}: the "
            raise _refused(429, ["path", "run_id"], msg + "setting lab_max_streams_per_client)", "too_many_streams")
        self.runs[run_id] += 1
        self.clients[client] += 1

    def close(self, run_id: str, client: str) -> None:
        for counter, key in ((self.runs, run_id), (self.clients, client)):
            counter[key] -= 1
            if counter[key] <= 0:
                del counter[key]


def _stream_caps(request: Request) -> StreamCaps:
    state = request.app.state
    if not hasattr(state, "lab_streams"):
        settings = _settings_of(request.app)
        state.lab_streams = StreamCaps(settings.lab_max_streams_per_run, settings.lab_max_streams_per_client)
    caps: StreamCaps = state.lab_streams
    return caps


class EventStream(StreamingResponse):
    """A Server-Sent Events response that gives its place under the caps back however it ends, and
    drops a reader that has taken nothing for ``stall`` seconds (every buffer to it full): the server
    holds no events per stream (each reads the run's one list), so a stream's cost is the one send it
    waits on, bounded in time here and in number by the caps."""

    def __init__(self, content: AsyncIterator[bytes], release: Callable[[], None], stall: float) -> None:
        headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.release, self.stall = release, stall

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bounded(message: Message) -> None:
            async with asyncio.timeout(self.stall):
                await send(message)

        try:
            await super().__call__(scope, receive, bounded)
        except TimeoutError:
            log.info("dropped an event stream whose reader took nothing for %g s", self.stall)
        finally:
            self.release()


async def stream_events(manager: LabManager, run: LabRun) -> AsyncIterator[bytes]:
    """Every event so far, then what comes as it comes; ends after the run's last event or when the
    server stops. No polling: the stream sleeps on the run's event, waking for news, for a comment
    line every KEEPALIVE_SECONDS (proxies close silent streams), or when the server closes."""
    sent = 0
    while True:
        woken = run.updated  # taken in the same step as the check below: no event slips between them
        if sent < len(run.chunks):
            chunk, sent = b"".join(run.chunks[sent:]), len(run.chunks)
            yield chunk
            if not run.finished and not manager.closing:
                await asyncio.sleep(COALESCE_SECONDS)
            continue
        if run.finished or manager.closing:
            return
        if not await _wait(woken, KEEPALIVE_SECONDS):
            yield b": keep-alive\n\n"


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Whether ``event`` was set within ``timeout`` seconds."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


@router.get(
    "/api/v1/lab/runs/{run_id}/steps/{step}",
    summary="One saved step of a lab run as a /api/v1/loss request (ragged rows, advantages, tokens) and its config",
    responses={**NOT_FOUND, 413: {"model": ErrorResponse, "description": "The step file is past a request limit"}},
)
async def step_input(run_id: str, step: int, request: Request, settings: SettingsDep) -> Response:
    path = _step_file(settings, run_id, step)
    try:
        size = path.stat().st_size
    except OSError:  # deleted meanwhile
        raise _refused(404, ["path", "step"], f"run {run_id!r} has no saved step {step}", "not_found") from None
    reply = await request.app.state.lanes.run(size, lab_step, str(path), settings)
    return Response(reply.body, reply.status, headers=reply.headers, media_type="application/json")


def _step_file(settings: Settings, run_id: str, step: int) -> Path:
    """The step file of a lab run's step (micro-batch 0: the lab writes one per step); 404 otherwise.
    Links are not followed: a run holds its own files."""
    if not valid_name(run_id):
        msg = f"no run {run_id!r}: names are letters, digits, '.', '-' and '_'"
        raise _refused(404, ["path", "run_id"], msg, "not_found")
    run_dir = settings.runs_dir / run_id
    path = run_dir / "steps" / f"{step:06d}-000.safetensors"
    if not 1 <= step <= 999_999 or any(p.is_symlink() for p in (run_dir, path.parent, path)) or not path.is_file():
        raise _refused(404, ["path", "step"], f"run {run_id!r} has no saved step {step}", "not_found")
    return path


def lab_step(path: str, settings: Settings) -> dict[str, Any]:
    """A step file as the dashboard's input (in a lane: ``app.lanes``), under the same limits as
    /api/v1/loss, checked from the file's size and header before its tensors are read. A captured
    run's step opens too: its micro-batch 0, the lab's whole step."""
    file = Path(path)
    size = file.stat().st_size
    if size > settings.max_upload_bytes:
        msg = f"the step file {file.name} has {size} bytes; at most {settings.max_upload_bytes} (a setting)"
        raise LimitError(["path", "step"], msg)
    rows, tokens, fields = _step_shape(file)
    check_cost([tokens] * rows, fields, "float32", settings)
    return _step_request(file)


def _step_shape(path: Path) -> tuple[int, int, int]:
    """(rows, tokens, per-token tensors) of a step file, from its safetensors header alone."""
    bad = grpo.GrpoInputError("file", f"a safetensors step file holding a 2-D per_token_logps ({path.name})")
    with path.open("rb") as f:
        head = f.read(8)
        size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < size <= path.stat().st_size - 8:
            raise bad
        try:
            header = json.loads(f.read(size))
        except (ValueError, RecursionError) as exc:
            raise bad from exc
    entry = header.get("per_token_logps") if isinstance(header, dict) else None
    shape = entry.get("shape") if isinstance(entry, dict) else None
    if not isinstance(shape, list) or len(shape) != 2 or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise bad
    per_token = sum(isinstance(v, dict) and v.get("shape") == shape for v in header.values())
    return shape[0], shape[1], per_token


def _step_request(path: Path) -> dict[str, Any]:
    """A step file as the dashboard's input: each row cut to its counted tokens; the old and reference
    log-probs default to the policy's, as in /api/v1/loss (a TRL capture at beta 0 holds no reference)."""
    batch, config, info = load_step(path)
    lengths = batch.mask.sum(-1).tolist()
    tokens = info["meta"].get("tokens") if isinstance(info["meta"], dict) else None

    def rows(value: Any) -> list[list[float]]:
        value = batch.per_token_logps if value is None else value
        return [row[:n] for row, n in zip(value.tolist(), lengths, strict=True)]

    body: dict[str, Any] = {
        "per_token_logps": rows(batch.per_token_logps),
        "old_per_token_logps": rows(batch.old_per_token_logps),
        "ref_per_token_logps": rows(batch.ref_per_token_logps),
        "advantages": [float(a) for a in batch_advantages(batch, config).tolist()],
    }
    if isinstance(tokens, list) and len(tokens) == len(lengths):
        body["tokens"] = [row[:n] for row, n in zip(tokens, lengths, strict=True)]
    fields = {k: v for k, v in config.to_dict().items() if k not in ("device", "dtype")}
    return {"request": body, "config": fields | {"preset": fields.get("preset") or "article"}, "meta": info["meta"]}
