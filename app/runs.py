"""/api/v1/runs: captured and lab runs under GRPO_LENS_RUNS_DIR, listed, checked, stepped through, replayed.

Thin routes over grpo.runs and grpo.check. Run names, run directories, uploads, deletes and
downloads belong to the run store (``app.store``): names are one full-match ASCII pattern, a run is
created atomically (409 on a taken name), read only through regular files inside it, and kept
within a disk budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any, Literal
from urllib.parse import urlencode

import anyio
from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, Request, UploadFile
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from app import summaries
from app.api import JSONBytes
from app.errors import LimitError
from app.ingest import read_json
from app.lanes import release_memory
from app.schemas import ErrorResponse
from app.settings import Settings
from app.store import LAB_REMOVE_SECONDS, RunStore, open_run
from app.store import RUN_NAME as RUN_NAME
from app.work import Reply
from grpo.runs import Run, load_run

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


def _not_found(loc: list[str | int], msg: str) -> HTTPException:
    return HTTPException(404, [{"loc": loc, "msg": msg, "type": "not_found"}])


def _run_dir(settings: Settings, name: str) -> Path:
    return open_run(Path(settings.runs_dir), name)


def _load(settings: Settings, name: str) -> Run:
    return load_run(_run_dir(settings, name))


def _config_param(config: str | None) -> dict[str, Any] | None:
    """``?config=``: JSON text of a preset and overrides, checked as /api/v1/loss checks its config."""
    return summaries.overrides(None if not config else read_json(config, ["query", "config"]), ["query", "config"])


def _opened(settings: Settings, name: str) -> Run:
    """A run to read from: its run.json within the listing's bounds (a 422 saying why not), then loaded."""
    summaries.read_info(_run_dir(settings, name))
    return _load(settings, name)


def _is_name(name: str) -> bool:
    return RUN_NAME.fullmatch(name) is not None


def _answer(reply: Reply) -> Response:
    return Response(reply.body, reply.status, headers=reply.headers, media_type="application/json")


@router.get("", response_class=JSONBytes, summary="A page of the runs under GRPO_LENS_RUNS_DIR (Link: rel=next)")
async def runs(
    request: Request,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=summaries.LIMIT_MAX, description="Runs per page")] = summaries.LIMIT_DEFAULT,
    after: Annotated[str | None, Query(max_length=256, description="The previous page's last run")] = None,
    sort: Annotated[
        Literal["time", "name"], Query(description="time: the run's last write, newest first; name: A to Z")
    ] = "time",
) -> JSONBytes:
    """Each run as its summary (name, source, created, status, steps, files, valid: true), or, when the
    rules refuse its run.json, ``{"name", "valid": false, "error"}``. A next page is named by the ``Link``
    header (rel="next"), whose ``after`` is this page's last run."""
    page, last = await run_sync(request, summaries.listing, Path(settings.runs_dir), sort, after, limit, _is_name)
    headers = {}
    if last is not None:
        headers["link"] = f'<{request.url.path}?{urlencode({"limit": limit, "after": last, "sort": sort})}>; rel="next"'
    return JSONBytes(page, headers=headers)


@router.get("/{run}", responses=NOT_FOUND, response_class=JSONBytes, summary="A run: steps, trainer vs recomputed")
async def run_detail(run: str, request: Request, settings: SettingsDep) -> Response:
    """Computed once per state of the run's files (in a worker process for a long run) and kept beside it."""
    path = _run_dir(settings, run)
    return _answer(await summaries.page(request.app.state.lanes, path, settings))


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
) -> Response:
    """Checked as /api/v1/loss is (padded size and memory from the files' headers: 413), in its lane."""
    path = _run_dir(settings, run)
    overrides = _config_param(config)
    loaded = await run_sync(request, _opened, settings, run)
    if step not in loaded.step_numbers() or (
        micro is not None and micro not in [r.micro for r in loaded.micro_batches(step)]
    ):
        where = f"step {step}" + ("" if micro is None else f" micro-batch {micro}")
        raise _not_found(["path", "step"], f"run {run!r} has no {where}")
    dtype = (overrides or {}).get("dtype")
    plan = await run_sync(request, summaries.step_plan, loaded, step, micro, settings, dtype)
    lanes = request.app.state.lanes
    return _answer(await lanes.run(plan.size, summaries.step_json, str(path), step, micro, overrides, settings))


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
async def replay_run(
    run: str,
    request: Request,
    settings: SettingsDep,
    body: dict[str, Any],
    after: Annotated[int, Query(ge=0, le=999_999, description="Replay the steps after this one")] = 0,
) -> Response:
    """At most ``GRPO_LENS_REPLAY_MAX_MICRO_BATCHES`` micro-batches, whole steps; ``next`` is the following
    page's ``after`` (null on the last page)."""
    path = _run_dir(settings, run)
    loc: list[str | int] = ["body", "config"] if "config" in body else ["body"]
    overrides = summaries.overrides(body.get("config", body), loc) or {}
    loaded = await run_sync(request, _opened, settings, run)
    plan = await run_sync(request, summaries.replay_plan, loaded, after, settings, overrides.get("dtype"))
    lanes = request.app.state.lanes
    return _answer(await lanes.run(plan.size, summaries.replay_json, str(path), plan.steps, overrides, plan.next))


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
