"""/api/v1/runs: captured and lab runs under GRPO_LENS_RUNS_DIR, listed, checked, stepped through, replayed.

Thin routes: what they compute is ``app.summaries``'s (the listing, a run's page, a step, a replay), run
names, run directories, uploads, deletes and downloads belong to the run store (``app.store``): names
are one full-match ASCII pattern, a run is created atomically (409 on a taken name), read only through
regular files inside it, and kept within a disk budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import IO, Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.types import DecoratedCallable
from starlette.background import BackgroundTask

from app import summaries, timelines
from app.api import JSONBytes, answer, as_response, multipart_body
from app.deps import LabDep, LanesDep, RunStreamsDep, SettingsDep, StoreDep, StreamClientDep, WatcherDep
from app.lab_streams import LastEventId, event_stream_route
from app.lanes import Lanes
from app.memory import release_memory
from app.schemas import HEATMAP_ROWS, Count, ErrorResponse, HeatmapRows
from app.settings import Settings
from app.store import LAB_REMOVE_SECONDS, RunStore, valid_name
from app.work import Reply
from grpo.view.answer import dumps

router = APIRouter(prefix="/api/v1/runs", tags=["runs"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorResponse, "description": "No such run or step"}}
TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorResponse, "description": "Past a size limit (a setting): the zipped run or its contents"},
    409: {"model": ErrorResponse, "description": "A run of that name exists"},
    422: {"model": ErrorResponse, "description": "Not a form with the zip, or a bad zip, run.json or step file"},
    507: {"model": ErrorResponse, "description": "The runs directory's budget or free-space floor would be crossed"},
}
TOKEN_ROWS = "Rows whose per-token arrays to return when the step is past the token limit (below it: every row's)"
UPLOAD_BODY = multipart_body(
    "A zip of run.json and steps/*.safetensors", {"name": "The run's name (default: the file's name)"}
)


@router.get("", response_class=JSONBytes, summary="A page of the runs under GRPO_LENS_RUNS_DIR (Link: rel=next)")
async def runs(
    request: Request,
    settings: SettingsDep,
    lanes: LanesDep,
    limit: Annotated[int, Query(ge=1, le=summaries.LIMIT_MAX, description="Runs per page")] = summaries.LIMIT_DEFAULT,
    after: Annotated[str | None, Query(max_length=256, description="The previous page's last run")] = None,
    sort: Annotated[
        Literal["time", "name"], Query(description="time: the run's last write, newest first; name: A to Z")
    ] = "time",
) -> JSONBytes:
    """Each run as its summary (name, source, created, status, steps, files, valid: true), or, when the
    rules refuse its run.json, ``{"name", "valid": false, "error"}``. A next page is named by the ``Link``
    header (rel="next"), whose ``after`` is this page's last run."""
    page, last = await lanes.call(summaries.listing, settings.runs_dir, sort, after, limit, valid_name)
    headers = {}
    if last is not None:
        headers["link"] = f'<{request.url.path}?{urlencode({"limit": limit, "after": last, "sort": sort})}>; rel="next"'
    return JSONBytes(page, headers=headers)


def _run_json(path: str, summary: str, method: str = "GET") -> Callable[[DecoratedCallable], DecoratedCallable]:
    """A route that answers JSON about one run (a 404 naming what is missing when the run or its step is not there)."""
    return router.api_route(path, methods=[method], responses=NOT_FOUND, response_class=JSONBytes, summary=summary)


@_run_json("/{run}", "A run: steps, trainer vs recomputed")
async def run_detail(
    run: str,
    store: StoreDep,
    lanes: LanesDep,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header(description="The ETag of a page read before: 304 if unchanged")] = None,
) -> Response:
    """Computed once per state of the run's files (in a worker process for a long run) and kept beside it;
    a kept page is answered from its file, chunk by chunk, with an ETag."""
    page = await summaries.page(lanes, store.open(run), settings)
    return as_response(page) if isinstance(page, Reply) else kept_response(page, lanes, if_none_match)


def kept_response(kept: summaries.Kept, lanes: Lanes, if_none_match: str | None) -> Response:
    """A kept page streamed from its file (its chunks read in the lanes' ``reads`` threads), or a 304 without
    a body when the client's ``If-None-Match`` names its ETag."""
    if _names(if_none_match, kept.etag):
        kept.close()
        return Response(status_code=304, headers=kept.headers)
    headers = {**kept.headers, "content-length": str(kept.length)}
    return StreamingResponse(kept.chunks(lanes.reads), kept.status, headers, media_type="application/json")


def _names(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (or any, ``*``)."""
    tags = {tag.strip().removeprefix("W/") for tag in (if_none_match or "").split(",")}
    return etag in tags or "*" in tags


@_run_json(
    "/{run}/timeline",
    "The run's timeline: per step every recomputed number beside the trainer's, and the anomalies found",
)
async def run_timeline(
    run: str,
    store: StoreDep,
    lanes: LanesDep,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header(description="A timeline's ETag read before: 304 if unchanged")] = None,
) -> Response:
    """``grpo.runs.timeline`` under the server's thresholds (the ``timeline_*`` settings; the answer names them),
    computed once per state of the run's files in its lane (a worker process for a long run) and kept beside the
    run, or in ``cache_dir`` when the run directory cannot be written."""
    path = store.open(run)
    found, etag = await summaries.timeline_tag(lanes, path, settings)
    headers = {"etag": etag, "cache-control": "private, no-cache"} if etag else {}
    if etag and _names(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    reply = await timelines.timeline_reply(lanes, path, found, etag, settings)
    return as_response(reply, headers if reply.status == 200 else {})


@_run_json(
    "/{run}/steps/{step}",
    "A step's breakdown (the whole step, a micro-batch with ?micro=, a rank's with ?rank=; config as ?config=)",
)
async def step_detail(
    run: str,
    step: int,
    store: StoreDep,
    lanes: LanesDep,
    settings: SettingsDep,
    micro: Annotated[int | None, Query(ge=0, le=999)] = None,
    rank: Annotated[int | None, Query(ge=0, le=65535, description="One rank's micro-batches (default: all)")] = None,
    config: Annotated[str | None, Query(description="A JSON object of LossConfig fields (preset included)")] = None,
    token_rows: Annotated[list[Count] | None, Query(max_length=1000, description=TOKEN_ROWS)] = None,
    heatmap_rows: Annotated[HeatmapRows, Query(description=HEATMAP_ROWS)] = "shown",
) -> Response:
    """One evaluation: ``breakdown`` is /api/v1/loss's answer for ``request`` (what the page draws, no second
    request); checked as /api/v1/loss is (padded size and memory from the files' headers: 413), in its lane."""
    shown = summaries.Shown(token_rows, heatmap_rows)
    return as_response(await summaries.step(lanes, store.open(run), step, micro, config, settings, shown, rank))


@event_stream_route(
    router,
    "/{run}/events",
    "Server-Sent Events of a running run: status, each new or changed step of its timeline, new anomalies, "
    "done; a reconnect with Last-Event-ID gets only the later ones",
    NOT_FOUND,
)
async def run_events(
    run: str,
    store: StoreDep,
    watcher: WatcherDep,
    streams: RunStreamsDep,
    client: StreamClientDep,
    after: Annotated[
        int | None, Query(ge=0, le=999_999, description="Skip the steps up to this one (the page has them)")
    ] = None,
    last_event_id: LastEventId = None,
) -> StreamingResponse:
    """Watched while someone listens and run.json says running (``app.watch``); ends with ``done``."""
    return await watcher.stream(store.open(run), streams, client, after, last_event_id)


@router.delete("/{run}", responses=NOT_FOUND, status_code=204, summary="Delete a run (a running lab run is cancelled)")
async def delete_run(run: str, store: StoreDep, lab: LabDep, lanes: LanesDep) -> Response:
    store.open(run)
    if run in lab.runs:  # its worker lets go of the directory first
        await lab.remove(run, LAB_REMOVE_SECONDS)
    await lanes.call(store.delete, run)
    return Response(status_code=204)


@router.get("/{run}/download", responses=NOT_FOUND, summary="The run as a zip (run.json and steps/)")
async def download(run: str, store: StoreDep, lanes: LanesDep, settings: SettingsDep) -> StreamingResponse:
    archive, size = await lanes.call(store.zip_run, run)
    headers = {"content-disposition": f'attachment; filename="{run}.zip"', "content-length": str(size)}
    large = size >= settings.large_request_bytes
    done = BackgroundTask(release_memory) if large else None  # the zip's buffers go back to the OS
    return StreamingResponse(_chunks(archive), media_type="application/zip", headers=headers, background=done)


def _chunks(file: IO[bytes]) -> Iterator[bytes]:
    with file:
        while chunk := file.read(1024 * 1024):
            yield chunk


@_run_json("/{run}/replay", "The same captured batches under another config, step by step, beside the original", "POST")
async def replay_run(
    run: str,
    body: dict[str, Any],
    store: StoreDep,
    lanes: LanesDep,
    settings: SettingsDep,
    after: Annotated[int, Query(ge=0, le=999_999, description="Replay the steps after this one")] = 0,
) -> Response:
    """At most ``GRPO_LENS_REPLAY_MAX_MICRO_BATCHES`` micro-batches, whole steps; ``next`` is the following
    page's ``after`` (null on the last page)."""
    return as_response(await summaries.replay_page(lanes, store.open(run), body, after, settings))


@router.post(
    "",
    responses=TOO_LARGE,
    status_code=201,
    openapi_extra=UPLOAD_BODY,
    summary="Upload a zipped run (a form: file, the zip of run.json and steps/*.safetensors; name, optional)",
)
async def upload_run(request: Request, store: StoreDep, lanes: LanesDep, settings: SettingsDep) -> Response:
    """Read as /api/v1/upload reads its form (``app.forms``); unpacked and checked in its lane by size, a large
    zip in the large lane's threads, never the small requests' (zip members are copied, not parsed)."""
    content_type = request.headers.get("content-type", "")
    return await answer(request, lanes, settings, _unpacked, store, content_type, light=_a_zip)


def _unpacked(body: bytes, store: RunStore, content_type: str, settings: Settings) -> Reply:
    return Reply(201, dumps(store.add_upload(body, content_type)))


def _a_zip(head: bytes) -> bool:
    """A run zip is light work whatever its size (its members are copied, not parsed): the thread lane, never a
    worker process, so the store's disk-budget claims stay in this process."""
    return True
