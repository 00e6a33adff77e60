"""The HTTP API under /api/v1: thin routes. The batch routes read the body's bytes and hand them to
``app.work`` in the lane their size calls for (``app.lanes``): nothing is parsed on the event loop."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, BinaryIO

import torch
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic.json_schema import models_json_schema

from app import work
from app.deps import LanesDep, SettingsDep
from app.errors import refused
from app.lanes import Lanes, Spooled, take_spooled
from app.options import options_json
from app.schemas import BatchRequest, CompareRequest, ErrorResponse, LossRequest
from app.settings import Settings
from app.work import Reply
from grpo.view.answer import dumps
from grpo.view.experiments import EXPERIMENTS, Experiment

router = APIRouter()
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "The instance asks for its token (GRPO_LENS_AUTH_TOKEN)"},
    413: {"model": ErrorResponse, "description": "Past a size limit (a setting): body, file, padded positions, memory"},
    422: {"model": ErrorResponse, "description": "Invalid input: the field, row and position, and what was expected"},
    503: {"model": ErrorResponse, "description": "The large-request lane is full: retry after Retry-After seconds"},
}
BODY_MODELS = (LossRequest, CompareRequest, BatchRequest)


class JSONBytes(JSONResponse):
    """JSON rendered by orjson: NumPy arrays inline, NaN as null."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return content if isinstance(content, bytes) else dumps(content)


def json_body(model: type) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads its bytes itself (the schema is ``model``'s)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def multipart_body(file: str, fields: dict[str, str]) -> dict[str, Any]:
    """The OpenAPI request body of a form route read by ``app.forms``: a required ``file`` (described by
    ``file``) and optional text ``fields`` (name: description)."""
    properties = {"file": {"type": "string", "format": "binary", "description": file}}
    properties |= {name: {"type": "string", "description": doc} for name, doc in fields.items()}
    schema = {"type": "object", "required": ["file"], "properties": properties}
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}}


UPLOAD_BODY = multipart_body(
    "JSON, JSONL, safetensors, NPZ or .pt (weights_only)",
    {
        "config": "A JSON object: preset and overrides",
        "token_rows": "A JSON list of rows to return in full",
        "heatmap_rows": 'JSON text: "shown" (default) or "all", as in /api/v1/loss',
    },
)


def body_schemas() -> dict[str, Any]:
    """The request models' JSON schemas, for the OpenAPI document's components."""
    _, top = models_json_schema([(m, "validation") for m in BODY_MODELS], ref_template="#/components/schemas/{model}")
    return dict(top.get("$defs", {}))


FILE_CHUNK_BYTES = 1024 * 1024  # a file answer is sent this much at a time (each read in a thread)


def as_response(reply: Reply, headers: dict[str, str] | None = None) -> Response:
    """A lane's Reply as the HTTP response, with ``headers`` beside its own. A body in a file (``Reply.path``)
    is sent from it chunk by chunk and the file removed at once (its pages go when the response is done),
    so the answer is never whole in this process's memory."""
    all_headers = {**reply.headers, **(headers or {})}
    if reply.path is None:
        return Response(reply.body, reply.status, headers=all_headers, media_type=reply.media_type)
    file = open(reply.path, "rb")  # noqa: SIM115  (the chunks generator closes it)
    os.unlink(reply.path)
    all_headers["content-length"] = str(os.fstat(file.fileno()).st_size)
    return StreamingResponse(_chunks(file), reply.status, headers=all_headers, media_type=reply.media_type)


def _chunks(file: BinaryIO) -> Iterator[bytes]:
    with file:
        while chunk := file.read(FILE_CHUNK_BYTES):
            yield chunk


async def answer(
    request: Request,
    lanes: Lanes,
    settings: Settings,
    fn: Any,
    *args: Any,
    light: Callable[[bytes], bool] | None = None,
) -> Response:
    """Read the body, run ``fn(body, *args, settings)`` in its lane (the thread lane whatever its size
    where ``light(body)`` says its work holds the GIL briefly), and answer what it replied."""
    started = time.perf_counter()
    # A large body is already a file (``BodyLimit`` spooled it as it came): a worker reads it, never this process.
    spooled = take_spooled(request.scope)
    head = spooled.head if spooled is not None else await request.body()  # the body, or its first 64 KiB
    body: bytes | Spooled = spooled if spooled is not None else head
    received = time.perf_counter()
    is_light = light is not None and light(head)
    reply = await lanes.run(len(body), fn, body, *args, settings, light=is_light)
    spans = {"receive": received - started, "work": time.perf_counter() - received, "compute": reply.seconds}
    timing = ", ".join(f"{name};dur={seconds * 1e3:.1f}" for name, seconds in spans.items())
    return as_response(reply, {"server-timing": timing})  # where the time went: for bench/api.py and browsers


def batch_route(path: str, summary: str, body: dict[str, Any]) -> Callable[[Any], Any]:
    """A POST route that reads its own body (``answer``), documented by ``body`` and the API's errors."""
    return router.post(path, responses=ERRORS, response_class=JSONBytes, openapi_extra=body, summary=summary)


@batch_route("/api/v1/loss", "Evaluate a batch: the loss and its breakdown", json_body(LossRequest))
async def loss(request: Request, lanes: LanesDep, settings: SettingsDep) -> Response:
    return await answer(request, lanes, settings, work.loss)


@batch_route("/api/v1/compare", "One batch under several configs, side by side", json_body(CompareRequest))
async def compare(request: Request, lanes: LanesDep, settings: SettingsDep) -> Response:
    return await answer(request, lanes, settings, work.compare)


@batch_route("/api/v1/upload", "Evaluate an uploaded batch file", UPLOAD_BODY)
async def upload(request: Request, lanes: LanesDep, settings: SettingsDep) -> Response:
    content_type = request.headers.get("content-type", "")
    return await answer(request, lanes, settings, work.upload, content_type, light=work.binary_upload)


@router.get("/api/v1/options", summary="Registries, presets, config fields and scenarios (the UI's controls)")
def options() -> dict[str, Any]:
    return options_json()


@lru_cache
def _experiments() -> dict[str, Experiment]:
    """Every experiment, computed once (they take milliseconds and never change)."""
    return {name: fn() for name, fn in EXPERIMENTS.items()}


@router.get("/api/v1/experiments", summary="The article's experiments")
def experiments() -> list[dict[str, str]]:
    return [{"name": n, "title": e.title, "article": e.article} for n, e in _experiments().items()]


@router.get(
    "/api/v1/experiments/{name}",
    responses={404: {"model": ErrorResponse, "description": "No such experiment"}},
    response_class=JSONBytes,
    summary="One experiment: data and explanation",
)
async def experiment(name: str, lanes: LanesDep) -> Response:
    if name not in EXPERIMENTS:
        msg = f"no experiment {name!r}; expected one of {', '.join(EXPERIMENTS)}"
        raise refused(404, ["path", "name"], msg, "not_found")
    found = await lanes.call(_experiments)
    return JSONBytes(dataclasses.asdict(found[name]))


@router.get("/healthz", summary="Liveness, torch version and device")
async def healthz(settings: SettingsDep) -> dict[str, Any]:
    """Answered on the event loop: it waits for no thread and no worker."""
    return {
        "status": "ok",
        "torch": torch.__version__,
        "device": "cuda" if settings.device != "cpu" and torch.cuda.is_available() else "cpu",
        "cuda_available": torch.cuda.is_available(),
    }
