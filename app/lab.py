"""The training lab over HTTP: start runs, stream their steps (Server-Sent Events), cancel them.

Routes stay thin: the request model validates, ``app.lab_workers.LabManager`` queues and runs,
``app.lab_streams`` streams, ``grpo.lab`` trains. A run's id is its run name under /api/v1/runs.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

import grpo
from app import summaries
from app.deps import LabDep, LanesDep, SettingsDep, StoreDep, StreamCapsDep, StreamClientDep, started_lab
from app.errors import config_error
from app.lab_streams import LastEventId, event_stream_route, first_event
from app.lab_workers import LabManager, tasks_json
from app.schemas import ConfigRequest, ErrorResponse
from app.store import RUN_NAME_PATTERN
from grpo.lab import DEFAULT_TASK, TASKS, LabConfig
from grpo.lab.train import check_lab_inputs

RUN_NAME = rf"^{RUN_NAME_PATTERN}$"  # the run store's names (pydantic's $ is the true end of the text)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    manager = started_lab(app.state)
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
RunId = Annotated[str, Path(description="The lab run's id: its run name under /api/v1/runs")]


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

    def lab_config(self, max_steps: int) -> LabConfig:
        """The run this request asks for, its loss resolved on the CPU (the lab's workers train there);
        a 422 naming the field where it cannot be."""
        if self.steps > max_steps:
            raise config_error(["body"], grpo.GrpoInputError("steps", f"at most {max_steps} (a setting)"))
        fields: dict[str, Any] = {}
        if self.config is not None:
            fields = self.config.model_dump(exclude_unset=True) | dict(self.config.model_extra or {})
        try:
            loss = grpo.LossConfig.resolve({**fields, "device": "cpu"})
            check_lab_inputs(loss)  # ReMax's greedy baselines: the lab's rollouts have none
        except grpo.GrpoInputError as exc:
            raise config_error(["body", "config"], exc) from exc
        knobs = self.model_dump(exclude={"config", "name", "task"})
        try:
            return LabConfig(task=self.task or DEFAULT_TASK, loss=loss, **knobs)
        except grpo.GrpoInputError as exc:
            raise config_error(["body"], exc) from exc


@router.get("/api/v1/lab/tasks", summary="The lab's tasks, canned comparisons, metrics and loop settings")
async def tasks() -> JSONResponse:
    return JSONResponse(tasks_json())


@router.post(
    "/api/v1/lab/runs",
    status_code=202,
    summary="Start a lab run (queued when the workers are busy)",
    responses={
        409: {"model": ErrorResponse, "description": "A run of that name exists"},
        429: {"model": ErrorResponse, "description": "The queue, or this client's share of it, is full (settings)"},
        507: {"model": ErrorResponse, "description": "The runs store is full (its budget, a setting)"},
    },
)
async def start_run(
    body: LabRunRequest, manager: LabDep, settings: SettingsDep, client: StreamClientDep
) -> JSONResponse:
    run = await manager.start_run(body.lab_config(settings.lab_max_steps), body.name, owner=client)
    return JSONResponse(manager.summary(run), status_code=202)


@router.get("/api/v1/lab/queue", summary="The lab runs of this server process, with queue positions")
async def list_lab_runs(manager: LabDep) -> JSONResponse:
    return JSONResponse({"runs": [manager.summary(r) for r in manager.runs.values()]})


@router.get("/api/v1/lab/runs/{run_id}/status", summary="One lab run's status and queue position", responses=NOT_FOUND)
async def get_lab_run(run_id: RunId, manager: LabDep) -> JSONResponse:
    return JSONResponse(manager.summary(manager.get(run_id)))


@router.delete(
    "/api/v1/lab/runs/{run_id}",
    status_code=202,
    summary="Cancel a lab run (its steps so far stay as a run)",
    responses={**NOT_FOUND, 200: {"description": "The run had already finished: its status"}},
)
async def cancel_run(run_id: RunId, manager: LabDep) -> JSONResponse:
    run = manager.cancel(manager.get(run_id).id)
    return JSONResponse(manager.summary(run), status_code=202 if not run.finished else 200)


@event_stream_route(
    router,
    "/api/v1/lab/runs/{run_id}/events",
    "Server-Sent Events: queued, started, one step per optimiser step, then done, error or cancelled; "
    "each with its id, and a reconnect with Last-Event-ID gets only the later ones",
    NOT_FOUND,
)
async def events(
    run_id: RunId,
    manager: LabDep,
    caps: StreamCapsDep,
    client: StreamClientDep,
    settings: SettingsDep,
    last_event_id: LastEventId = None,
) -> StreamingResponse:
    run = manager.get(run_id)
    start = first_event(run, last_event_id, settings.lab_stream_history)
    return caps.stream(manager, run, client, settings.lab_stream_stall_seconds, start)


@router.get(
    "/api/v1/lab/runs/{run_id}/steps/{step}",
    summary="One saved step of a lab run as a /api/v1/loss request (ragged rows, advantages, tokens) and its config",
    responses={**NOT_FOUND, 413: {"model": ErrorResponse, "description": "The step file is past a request limit"}},
)
async def step_input(run_id: RunId, step: int, store: StoreDep, lanes: LanesDep, settings: SettingsDep) -> Response:
    """The step's micro-batch 0 (the lab writes one per step; a captured run's step opens as its first)."""
    path, size = store.step_file(run_id, step, param="run_id")
    reply = await lanes.run(size, summaries.step_input, str(path), step, settings)
    return Response(reply.body, reply.status, headers=reply.headers, media_type="application/json")
