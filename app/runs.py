"""/api/v1/runs: captured and lab runs under GRPO_LENS_RUNS_DIR, listed, checked, stepped through, replayed.

Thin routes over grpo.runs and grpo.check. Run names, run directories, uploads, deletes and
downloads belong to the run store (``app.store``): names are one full-match ASCII pattern, a run is
created atomically (409 on a taken name), read only through regular files inside it, and kept
within a disk budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any

import anyio
from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, Request, UploadFile
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

import grpo
from app.api import JSONBytes
from app.errors import LimitError
from app.lanes import release_memory
from app.responses import breakdown_to_json
from app.schemas import ErrorResponse
from app.settings import Settings
from app.store import LAB_REMOVE_SECONDS, RunStore, open_run
from app.store import RUN_NAME as RUN_NAME
from app.work import _json_form
from grpo.check import check_run, replay, run_overview, step_batch
from grpo.errors import GrpoInputError
from grpo.requests import batch_from_request, row_lengths
from grpo.runs import Run, list_runs, load_run

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "No such run or step"}}
TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorResponse, "description": "Past a size limit (a setting): the zipped run or its contents"},
    409: {"model": ErrorResponse, "description": "A run of that name exists"},
    507: {"model": ErrorResponse, "description": "The runs directory's budget or free-space floor would be crossed"},
}


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SettingsDep = Annotated[Settings, Depends(_settings)]


def _store(request: Request) -> RunStore:
    """The app's run store (made with the app; made here for an app built without create_app's state)."""
    state = request.app.state
    if not hasattr(state, "store"):
        state.store = RunStore(request.app.state.settings)
    store: RunStore = state.store
    return store


StoreDep = Annotated[RunStore, Depends(_store)]


async def run_sync(request: Request, fn: Any, *args: Any) -> Any:
    """CPU work off the event loop, in the small-request lane's threads."""
    return await anyio.to_thread.run_sync(lambda: fn(*args), limiter=request.app.state.lanes.threads)


def _breakdown(fields: dict[str, Any], config: grpo.LossConfig, settings: Settings) -> dict[str, Any]:
    """A step's batch under ``config``, answered as /api/v1/loss answers."""
    bd = grpo.evaluate(batch_from_request(fields), config)
    return breakdown_to_json(bd, row_lengths(fields), None, max_tokens=settings.full_token_limit)


def _not_found(loc: list[str | int], msg: str) -> HTTPException:
    return HTTPException(404, [{"loc": loc, "msg": msg, "type": "not_found"}])


def _run_dir(settings: Settings, name: str) -> Path:
    return open_run(Path(settings.runs_dir), name)


def _load(settings: Settings, name: str) -> Run:
    return load_run(_run_dir(settings, name))


def _config_param(config: str | None) -> dict[str, Any] | None:
    value = _json_form("config", config)
    if value is not None and not isinstance(value, dict):
        raise GrpoInputError("config", "a JSON object: a preset and LossConfig fields", got=type(value).__name__)
    return value


@router.get("", summary="The runs under GRPO_LENS_RUNS_DIR, newest first")
def runs(settings: SettingsDep) -> list[dict[str, Any]]:
    return [run.summary() for run in list_runs(settings.runs_dir)]


@router.get("/{run}", responses=NOT_FOUND, response_class=JSONBytes, summary="A run: steps, trainer vs recomputed")
async def run_detail(run: str, request: Request, settings: SettingsDep) -> JSONBytes:
    loaded = _load(settings, run)
    return JSONBytes(await run_sync(request, lambda: run_overview(loaded, check_run(loaded))))


@router.get(
    "/{run}/steps/{step}",
    responses=NOT_FOUND,
    response_class=JSONBytes,
    summary="A step's breakdown (the whole step, or one micro-batch with ?micro=; config overrides as ?config=)",
)
async def step_detail(
    run: str,
    step: int,
    request: Request,
    settings: SettingsDep,
    micro: Annotated[int | None, Query(ge=0, le=999)] = None,
    config: Annotated[str | None, Query(description="A JSON object of LossConfig fields (preset included)")] = None,
) -> JSONBytes:
    loaded = _load(settings, run)
    if step not in loaded.step_numbers() or (
        micro is not None and micro not in [r.micro for r in loaded.micro_batches(step)]
    ):
        where = f"step {step}" + ("" if micro is None else f" micro-batch {micro}")
        raise _not_found(["path", "step"], f"run {run!r} has no {where}")
    overrides = _config_param(config)

    def compute() -> dict[str, Any]:
        from grpo.check import replay_config

        fields, stored, info = step_batch(loaded, step, micro)
        resolved = replay_config(stored, overrides)
        breakdown = _breakdown(fields, resolved, settings)
        request_body = {**fields, "config": {k: v for k, v in resolved.to_dict().items() if k not in ("device",)}}
        return {"run": run, **info, "breakdown": breakdown, "request": request_body}

    return JSONBytes(await run_sync(request, compute))


@router.delete("/{run}", responses=NOT_FOUND, status_code=204, summary="Delete a run (a running lab run is cancelled)")
async def delete_run(run: str, request: Request, store: StoreDep) -> Response:
    store.open(run)
    lab = getattr(request.app.state, "lab", None)
    if lab is not None and run in lab.runs:  # its worker lets go of the directory first
        await lab.remove(run, LAB_REMOVE_SECONDS)
    await run_sync(request, store.delete, run)
    return Response(status_code=204)


@router.get("/{run}/download", responses=NOT_FOUND, summary="The run as a zip (run.json and steps/)")
async def download(run: str, request: Request, store: StoreDep) -> StreamingResponse:
    archive, size = await run_sync(request, store.zip_run, run)
    headers = {"content-disposition": f'attachment; filename="{run}.zip"', "content-length": str(size)}
    large = size >= request.app.state.settings.large_request_bytes
    done = BackgroundTask(release_memory) if large else None  # the zip's buffers go back to the OS
    return StreamingResponse(_chunks(archive), media_type="application/zip", headers=headers, background=done)


def _chunks(file: IO[bytes]) -> Iterator[bytes]:
    with file:
        while chunk := file.read(1024 * 1024):
            yield chunk


@router.post(
    "/{run}/replay",
    responses=NOT_FOUND,
    response_class=JSONBytes,
    summary="The same captured batches under another config, step by step, beside the original",
)
async def replay_run(run: str, request: Request, settings: SettingsDep, body: dict[str, Any]) -> JSONBytes:
    loaded = _load(settings, run)
    overrides = body.get("config", body)
    if not isinstance(overrides, dict):
        raise GrpoInputError("config", "a JSON object: a preset and LossConfig fields", got=type(overrides).__name__)
    return JSONBytes(await run_sync(request, replay, loaded, overrides))


@router.post("", responses=TOO_LARGE, status_code=201, summary="Upload a zipped run (run.json and steps/*.safetensors)")
async def upload_run(
    request: Request,
    settings: SettingsDep,
    store: StoreDep,
    file: Annotated[UploadFile, File(description="A zip of run.json and steps/*.safetensors")],
    name: Annotated[str | None, Form(description="The run's name (default: the file's name)")] = None,
) -> dict[str, Any]:
    data = await file.read(settings.max_upload_bytes + 1)
    if len(data) > settings.max_upload_bytes:
        raise LimitError(["body", "file"], f"file larger than {settings.max_upload_bytes} bytes (a setting)")
    summary: dict[str, Any] = await run_sync(request, store.add_zip, name or Path(file.filename or "upload").stem, data)
    return summary
