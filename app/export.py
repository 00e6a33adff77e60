"""Batch files: the input exported as safetensors, NPZ, JSON or JSONL, and an example of each format."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response

from app.schemas import BatchRequest
from grpo.examples import ARTICLE_EXAMPLE
from grpo.export import FORMATS, export_batch

router = APIRouter()
Format = Literal["json", "jsonl", "safetensors", "npz"]
FILE: dict[int | str, dict[str, Any]] = {
    200: {"description": "The batch file", "content": {media: {} for media in sorted(set(FORMATS.values()))}}
}


def _file(fields: dict[str, object], fmt: str, name: str) -> Response:
    headers = {"content-disposition": f'attachment; filename="{name}.{fmt}"'}
    return Response(export_batch(fields, fmt), media_type=FORMATS[fmt], headers=headers)


@router.post(
    "/api/v1/export/{fmt}", summary="The batch as a file the upload reads back", response_class=Response, responses=FILE
)
def export(fmt: Format, body: BatchRequest) -> Response:
    return _file({**body.batch_fields(), "tokens": body.tokens}, fmt, "grpo-lens-input")


@router.get(
    "/api/v1/examples/{fmt}",
    summary="The article's example batch as a file of this format",
    response_class=Response,
    responses=FILE,
)
def example(fmt: Format) -> Response:
    return _file(dict(ARTICLE_EXAMPLE), fmt, "grpo-lens-example")
