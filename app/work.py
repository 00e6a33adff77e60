"""A request's whole handling, from the body's bytes to the answer's bytes: parse, check, evaluate, serialise.

These functions run off the event loop: in a thread of the server for small requests, in a worker
process for large ones (see ``app.lanes``), so they take and return plain picklable values and
never raise: every outcome, errors included, is a ``Reply``.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

import grpo
from app.errors import CONFIG_FIELDS, ApiError, LimitError, Loc, as_api_error, config_error, error_item, error_json
from app.forms import file_form
from app.ingest import (
    Costly,
    NotFast,
    Prepared,
    check_cost,
    check_file_size,
    load_upload,
    prepare,
    prepare_json,
    read_json,
    validated,
)
from app.schemas import BatchRequest, CompareRequest, LossRequest, UploadForm
from app.settings import Settings
from grpo.export import FORMATS, export_batch, file_bytes
from grpo.io import INPUT_DTYPES, UPLOAD_FORMATS, file_name, precision_notes
from grpo.road import PER_TOKEN, json_file_fields
from grpo.view.answer import add_warnings, breakdown_to_json, compare_notes, dumps
from grpo.view.token_fields import compare_fields


@dataclass
class Reply:
    """An answer: status, body bytes (JSON unless ``media_type`` says otherwise) and extra headers."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0  # spent in ``fn``: the rest of a request's time is reading it and handing it over
    media_type: str = "application/json"
    # A download (an export): its body is only ever sent, so a worker may hand a large one back as a file
    # (``path``: the body is that file's bytes, sent, then removed) instead of through the pool's pipe.
    download: bool = False
    path: str | None = None


def replying(where: str, fn: Any, *args: Any) -> Reply:
    """``fn(*args)`` as a 200 Reply (its JSON, or the Reply it made), or the error it raised as its Reply
    (a bug: a 500 with an error id)."""
    started = time.perf_counter()
    try:
        result = fn(*args)
        reply = result if isinstance(result, Reply) else Reply(200, dumps(result))
        del result
    except Costly:  # priced past the cheap limits: the lanes start it again in the costly lane
        raise
    except Exception as exc:
        error = as_api_error(exc, where)
        reply = Reply(error.status, error_json(error.items), error.headers)
        # ``error`` may be ``exc`` itself, whose traceback holds this frame: a cycle that would keep every frame's
        # arrays (an unpacked file refused after reading: hundreds of MB) until the garbage collector next runs
        del error
    reply.seconds = time.perf_counter() - started
    return reply


def resolve_config(
    request: BaseModel | None, settings: Settings, loc: tuple[str | int, ...] = ("body", "config")
) -> grpo.LossConfig:
    """A LossConfig from a preset and the fields the request set (null included); errors name
    the field under ``loc``, where the request holds this config."""
    fields: dict[str, Any] = {}
    if request is not None:
        fields = request.model_dump(exclude_unset=True) | dict(request.model_extra or {})
    # the server's batches arrive on the CPU: a config left at auto runs where the setting says (auto: a GPU)
    device = "cuda" if settings.device == "auto" and torch.cuda.is_available() else settings.device
    try:
        return grpo.LossConfig.resolve(fields, device=device)
    except grpo.GrpoInputError as exc:
        raise config_error([*loc], exc) from exc


def _check_tokens(tokens: list[list[str]] | None, lengths: list[int]) -> None:
    if tokens is None:
        return
    if len(tokens) != len(lengths):
        raise grpo.GrpoInputError("tokens", f"{len(lengths)} rows like per_token_logps", got=f"{len(tokens)}")
    for i, (row, n) in enumerate(zip(tokens, lengths, strict=True)):
        if len(row) != n:
            raise grpo.GrpoInputError("tokens", f"{n} strings like per_token_logps[{i}]", row=i, got=f"{len(row)}")


def loss_json(
    prepared: Prepared,
    config: grpo.LossConfig,
    settings: Settings,
    tokens: list[list[str]] | None = None,
    token_rows: list[int] | None = None,
    heatmap_rows: str = "shown",
) -> dict[str, Any]:
    """Evaluate a checked request under ``config``: the /api/v1/loss answer."""
    lengths = prepared.lengths
    _check_tokens(tokens, lengths)
    if token_rows is not None and any(r >= len(lengths) for r in token_rows):
        bad = next(i for i, r in enumerate(token_rows) if r >= len(lengths))
        raise grpo.GrpoInputError("token_rows", f"row numbers below {len(lengths)}", row=bad)
    bd = grpo.evaluate(prepared.batch(), config)  # the request's arrays go once the batch holds its own
    limit = settings.full_token_limit
    return breakdown_to_json(bd, lengths, tokens, rows=token_rows, max_tokens=limit, every_row=heatmap_rows == "all")


def loss(body: bytes, settings: Settings) -> dict[str, Any]:
    """POST /api/v1/loss."""
    prepared = prepare_json(body, LossRequest, settings) if body else _empty()
    request: LossRequest = prepared.model
    config = resolve_config(request.config, settings)
    return loss_json(prepared, config, settings, request.tokens, request.token_rows, request.heatmap_rows)


def compare(body: bytes, settings: Settings) -> dict[str, Any]:
    """POST /api/v1/compare: one batch under several configs, side by side."""
    prepared = prepare_json(body, CompareRequest, settings) if body else _empty()
    request: CompareRequest = prepared.model
    if len(request.configs) > settings.max_compare_configs:
        msg = f"{len(request.configs)} configs; at most {settings.max_compare_configs}"
        raise LimitError(["body", "configs"], msg)
    given = sum(isinstance(prepared.fields.get(name), np.ndarray | list) for name in PER_TOKEN)
    check_cost(prepared.lengths, given, "float32", settings, copies=len(request.configs))
    configs = [resolve_config(c, settings, ("body", "configs", i)) for i, c in enumerate(request.configs)]
    lengths = prepared.lengths
    _check_tokens(request.tokens, lengths)
    batch = prepared.batch()
    results = []
    for i, config in enumerate(configs):
        try:
            bd = grpo.evaluate(batch, config)
        except grpo.GrpoInputError as exc:  # a config this machine cannot run (device): name which one
            if exc.field not in CONFIG_FIELDS:
                raise
            raise config_error(["body", "configs", i], exc) from exc
        full = breakdown_to_json(bd, lengths, None, max_tokens=settings.full_token_limit)
        tokens = full["tokens"]
        full["tokens"] = {k: tokens[k] for k in (*compare_fields(), "region")}
        results.append(full)
    notes = compare_notes(batch.sampling_per_token_logps is not None, configs)
    return {"results": results, "lengths": lengths, "text": request.tokens, "notes": notes}


def export(body: bytes, fmt: str, settings: Settings) -> Reply:
    """POST /api/v1/export/{fmt}: the batch as a file the upload reads back. Read and checked as /api/v1/loss
    reads a batch (its limits, before any (B, T) array exists), then the file's size is checked too
    before it is written: a batch padded far past what it sends never becomes a file."""
    prepared = prepare_json(body, BatchRequest, settings) if body else _empty()
    request: BatchRequest = prepared.model
    _check_tokens(request.tokens, prepared.lengths)
    fields = {**prepared.fields, "tokens": request.tokens}
    given = sum(isinstance(prepared.fields.get(name), np.ndarray | list) for name in PER_TOKEN)
    # The file and the answer's copy of it. Display strings count apart: where they make the file too
    # large (NPZ pads every one to the longest), the 413 names them.
    for strings in (False, True):
        size = file_bytes(fields if strings else {**fields, "tokens": None}, fmt, prepared.lengths)
        loc: Loc | None = ["body", "tokens"] if strings else None
        check_file_size(size, f"a {fmt} file", settings, loc)
        check_cost(
            prepared.lengths, given, "float32", settings, output_bytes=2 * size, output=f"a {fmt} file", output_loc=loc
        )
    data = export_batch(fields, fmt, prepared.lengths)
    headers = {"content-disposition": f'attachment; filename="{file_name("grpo-lens-input", fmt)}"'}
    return Reply(200, data, headers, media_type=FORMATS[fmt], download=True)


def _empty() -> Any:
    raise ApiError(422, [error_item(["body"], "Field required: expected a JSON object in the body", "missing")])


# --- uploads ------------------------------------------------------------------------------------------
FILENAME = re.compile(rb'\r\nContent-Disposition: form-data; name="file"; filename="([^"\r\n]*)"', re.IGNORECASE)
# The formats whose reading copies numbers without a Python object each (their entries say ``light``).
BINARY_SUFFIXES = tuple(f".{suffix}".encode() for f in UPLOAD_FORMATS if f.light for suffix in f.suffixes)


def binary_upload(body: bytes) -> bool:
    """A multipart upload whose file is named as a light format (.safetensors, .npz; its header among the
    body's first 64 KiB): reading it copies numbers and holds the GIL for milliseconds, so it needs no worker
    process. The content is still sniffed: a JSON text under such a name is refused at once."""
    found = FILENAME.search(body, 0, 65536)
    return found is not None and found.group(1).lower().endswith(BINARY_SUFFIXES)


def upload(body: bytes, content_type: str, settings: Settings) -> dict[str, Any]:
    """POST /api/v1/upload: a batch file (JSON, JSONL, safetensors, NPZ, .pt) and optional form fields."""
    form = file_form(body, content_type, settings.max_upload_bytes, ("config", "token_rows", "heatmap_rows"))
    del body
    filename, data, texts = form.filename, form.data, form.fields
    del form
    fast = json_file_fields(filename, data)  # a .json file's numbers straight into arrays, where it can
    if fast is not None:
        try:
            return _upload(fast, texts, settings)
        except NotFast:  # a value the vectorised checks refuse: the exact reader names it
            del fast
    return _upload(load_upload(filename, data, settings), texts, settings)


def _upload(fields: dict[str, Any], texts: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """An uploaded file's fields and the form's JSON texts -> the /api/v1/loss answer."""
    given = _overlaid(fields.pop("config", None), json_form("config", texts["config"]))
    given_form = {"config": given, **{k: json_form(k, texts[k]) for k in ("token_rows", "heatmap_rows")}}
    form_model = validated(UploadForm, {k: v for k, v in given_form.items() if v is not None}, ["body"])
    fields.pop("full_kl", None)
    input_dtypes = fields.pop(INPUT_DTYPES, {})
    # JSON-like fields get /loss's checks; a binary file's named tensors are priced by their grid
    prepared = prepare(fields, LossRequest, settings, ["body", "file"], dtype=_dtype(form_model.config), from_file=True)
    tokens = prepared.fields.pop("tokens", None) if prepared.model is None else prepared.model.tokens
    config = resolve_config(form_model.config, settings)
    result = loss_json(prepared, config, settings, tokens, form_model.token_rows, form_model.heatmap_rows)
    ignored_notes = [f"Ignored {name!r} in the file: not a batch field." for name in prepared.ignored]
    add_warnings(result, ignored_notes + precision_notes(input_dtypes, config.dtype))
    return result


def _dtype(config: Any) -> str:
    return str(getattr(config, "dtype", None) or "float32")


def _overlaid(base: Any, over: Any) -> Any:
    """``over``'s keys over ``base``'s when both are objects, else whichever was given (validation judges it)."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **over}
    return base if over is None else over


def json_form(name: str, text: str | None) -> Any:
    if text is None or text == "":
        return None
    return read_json(text, ["body", name])
