"""The HTTP API under /api/v1: thin routes, parse -> grpo -> serialise."""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from typing import Annotated, Any

import anyio
import torch
from fastapi import APIRouter, Depends, File, Form, HTTPException, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from app.errors import LimitError
from app.options import options_json
from app.schemas import BatchRequest, CompareRequest, ErrorResponse, LossRequest, UploadForm
from app.serialize import compare_json, dumps, loss_json, resolve_config
from app.settings import Settings, get_settings
from grpo.experiments import EXPERIMENTS, Experiment
from grpo.io import load_file

router = APIRouter()
TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorResponse, "description": "Past a size limit (a setting): body, file, tokens or configs"}
}
SettingsDep = Annotated[Settings, Depends(get_settings)]


class JSONBytes(JSONResponse):
    """JSON rendered by orjson: NumPy arrays inline, NaN as null."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


async def run_sync(request: Request, fn: Any, *args: Any) -> Any:
    """Run CPU-bound work off the event loop, at most ``settings.threads`` at a time."""
    return await anyio.to_thread.run_sync(lambda: fn(*args), limiter=request.app.state.limiter)


@router.post(
    "/api/v1/loss",
    responses=TOO_LARGE,
    response_class=JSONBytes,
    summary="Evaluate a batch: the loss and its breakdown",
)
async def loss(body: LossRequest, request: Request, settings: SettingsDep) -> JSONBytes:
    config = resolve_config(body.config, settings)
    data = await run_sync(request, loss_json, body.batch_fields(), config, settings, body.tokens, body.token_rows)
    return JSONBytes(data)


@router.post(
    "/api/v1/compare",
    responses=TOO_LARGE,
    response_class=JSONBytes,
    summary="One batch under several configs, side by side",
)
async def compare(body: CompareRequest, request: Request, settings: SettingsDep) -> JSONBytes:
    if len(body.configs) > settings.max_compare_configs:
        raise LimitError(["body", "configs"], f"{len(body.configs)} configs; at most {settings.max_compare_configs}")
    configs = [resolve_config(c, settings, ("body", "configs", i)) for i, c in enumerate(body.configs)]
    return JSONBytes(await run_sync(request, compare_json, body, configs, settings))


@router.post("/api/v1/upload", responses=TOO_LARGE, response_class=JSONBytes, summary="Evaluate an uploaded batch file")
async def upload(
    request: Request,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="JSON, JSONL, safetensors, NPZ or .pt (weights_only)")],
    config: Annotated[str | None, Form(description="A JSON object: preset and overrides")] = None,
    token_rows: Annotated[str | None, Form(description="A JSON list of rows to return in full")] = None,
) -> JSONBytes:
    data = await file.read(settings.max_upload_bytes + 1)
    if len(data) > settings.max_upload_bytes:
        raise LimitError(["body", "file"], f"file larger than {settings.max_upload_bytes} bytes (a setting)")
    fields = await run_sync(request, load_file, file.filename or "", data, settings.max_unpacked_bytes)
    given = _overlaid(fields.pop("config", None), _json_form("config", config))
    form = _validated(UploadForm, {"config": given, "token_rows": _json_form("token_rows", token_rows)}, ["body"])
    tokens = fields.pop("tokens", None)
    fields.pop("full_kl", None)
    ignored: list[str] = []
    if isinstance(fields.get("per_token_logps", []), list):  # JSON-like uploads get /loss's checks
        checked = _validated(LossRequest, {**fields, "tokens": tokens}, ["body", "file"])
        fields, tokens = checked.batch_fields(), checked.tokens
    else:  # named tensors: the ones that are no batch field are reported, not silently dropped
        ignored = sorted(set(fields) - set(BatchRequest.model_fields))
    config_obj = resolve_config(form.config, settings)
    result = await run_sync(request, loss_json, fields, config_obj, settings, tokens, form.token_rows)
    result["warnings"] += [f"Ignored {name!r} in the file: not a batch field." for name in ignored]
    return JSONBytes(result)


def _overlaid(base: Any, over: Any) -> Any:
    """``over``'s keys over ``base``'s when both are objects, else whichever was given (validation judges it)."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **over}
    return base if over is None else over


def _json_form(name: str, text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"loc": ["body", name], "msg": f"expected JSON text: {exc}", "type": "json_invalid"}]
        ) from exc


def _validated(model: Any, data: dict[str, Any], root: list[str]) -> Any:
    """``model`` from ``data``, or a 422 whose locs start with ``root`` (where the data came from)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": [*root, *e["loc"]]} for e in exc.errors()]) from exc


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
async def experiment(name: str, request: Request) -> Response:
    if name not in EXPERIMENTS:
        msg = f"no experiment {name!r}; expected one of {', '.join(EXPERIMENTS)}"
        raise HTTPException(404, [{"loc": ["path", "name"], "msg": msg, "type": "not_found"}])
    return JSONBytes(dataclasses.asdict((await run_sync(request, _experiments))[name]))


@router.get("/healthz", summary="Liveness, torch version and device")
def healthz(settings: SettingsDep) -> dict[str, Any]:
    return {
        "status": "ok",
        "torch": torch.__version__,
        "device": "cuda" if settings.device != "cpu" and torch.cuda.is_available() else "cpu",
        "cuda_available": torch.cuda.is_available(),
    }
