"""The training lab over HTTP: start runs, stream their steps (Server-Sent Events), cancel them.

Routes stay thin: the request model validates, ``app.lab_workers.LabManager`` queues and runs,
``grpo.lab`` trains. A run's id is its run name under /api/v1/runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import re
import secrets
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

import grpo
from app.errors import config_error, error_item
from app.lab_workers import LabManager, LabRun
from app.schemas import ConfigRequest, ErrorResponse
from app.settings import Settings, get_settings
from grpo.check import batch_advantages
from grpo.lab import COMPARISONS, DEFAULT_TASK, METRICS, TASKS, LabConfig
from grpo.runs import load_step

KEEPALIVE_SECONDS = 10.0
SHUTDOWN_POLL_SECONDS = 0.5
RUN_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    manager = _new_manager(_settings_of(app))
    manager.start(asyncio.get_running_loop())
    app.state.lab = manager
    _close_streams_on_exit(manager)
    try:
        yield
    finally:
        await asyncio.to_thread(manager.stop)


def _close_streams_on_exit(manager: LabManager) -> None:
    """Uvicorn waits for open responses before it shuts down, and an event stream never ends by
    itself: wrap its SIGINT/SIGTERM handlers so a stop signal also ends every stream at once."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            manager.closing = True
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
    preset = fields.pop("preset", None) or "article"
    try:
        loss = grpo.LossConfig.from_preset(preset, **{**fields, "device": "cpu"})
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
        state.lab = _new_manager(_settings_of(request.app))
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


def _new_manager(settings: Settings) -> LabManager:
    return LabManager(
        settings.runs_dir,
        settings.lab_max_concurrent,
        settings.lab_max_seconds,
        settings.lab_torch_threads,
        settings.lab_nice,
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
    },
)
async def start_run(body: LabRunRequest, request: Request, settings: SettingsDep) -> JSONResponse:
    manager = _manager(request)
    config = _lab_config(body, settings)
    if len(manager.pending) >= settings.lab_max_queue:
        msg = f"{len(manager.pending)} lab runs are waiting (at most {settings.lab_max_queue}, a setting); retry later"
        raise _refused(429, ["body"], msg, "queue_full")
    run_id = body.name or f"lab-{config.task}-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
    if run_id in manager.runs or (settings.runs_dir / run_id).exists():
        raise _refused(409, ["body", "name"], f"a run named {run_id!r} exists; choose another name", "conflict")
    fields = config.to_dict() | {"loss": config.loss.to_dict()}
    run = await asyncio.to_thread(manager.submit, run_id, fields, {"name": run_id, "lab": _lab_json(fields)})
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
    responses=NOT_FOUND,
)
async def events(run_id: str, request: Request) -> StreamingResponse:
    manager, run = _manager(request), _run(request, run_id)
    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
    return StreamingResponse(_stream(manager, run), media_type="text/event-stream", headers=headers)


async def _stream(manager: LabManager, run: LabRun) -> AsyncIterator[bytes]:
    """Every event so far, then each new one as it comes; ends after the run's last event or when
    the server stops. A comment line every few seconds keeps proxies from closing the stream."""
    sent, idle = 0, 0.0
    while True:
        woken = run.updated
        while sent < len(run.events):
            event, data = run.events[sent]
            sent += 1
            yield f"event: {event}\ndata: {json.dumps(_finite(data))}\n\n".encode()
        if run.finished or manager.closing:
            return
        try:
            await asyncio.wait_for(woken.wait(), SHUTDOWN_POLL_SECONDS)
            idle = 0.0
        except TimeoutError:
            idle += SHUTDOWN_POLL_SECONDS
            if idle >= KEEPALIVE_SECONDS:
                idle = 0.0
                yield b": keep-alive\n\n"


def _finite(data: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinities as null: the browser's JSON.parse takes nothing else."""
    return {k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in data.items()}


@router.get(
    "/api/v1/lab/runs/{run_id}/steps/{step}",
    summary="One saved step of a lab run as a /api/v1/loss request (ragged rows, advantages, tokens) and its config",
    responses=NOT_FOUND,
)
async def step_input(run_id: str, step: int, request: Request, settings: SettingsDep) -> JSONResponse:
    if not re.match(RUN_NAME, run_id):
        msg = f"no run {run_id!r}: names are letters, digits, '.', '-' and '_'"
        raise _refused(404, ["path", "run_id"], msg, "not_found")
    path = settings.runs_dir / run_id / "steps" / f"{step:06d}-000.safetensors"
    if step < 1 or not path.is_file():
        raise _refused(404, ["path", "step"], f"run {run_id!r} has no saved step {step}", "not_found")
    return JSONResponse(await asyncio.to_thread(_step_request, path))


def _step_request(path: Path) -> dict[str, Any]:
    """A step file as the dashboard's input: each row cut to its counted tokens."""
    batch, config, info = load_step(path)
    lengths = batch.mask.sum(-1).tolist()
    tokens = info["meta"].get("tokens") if isinstance(info["meta"], dict) else None

    def rows(value: Any) -> list[list[float]]:
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
