"""Batch files: the input exported as safetensors, NPZ, JSON or JSONL, and an example of each format.

An export reads its body as /api/v1/loss does and runs in the same lanes (``app.api.answer``): the same
limits on padded positions and memory, the file's own size counted, large bodies in a worker process."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request, Response

from app import work
from app.api import ERRORS, answer, json_body
from app.deps import LanesDep, SettingsDep
from app.schemas import BatchRequest
from grpo.export import FORMATS, export_batch
from grpo.io import file_name
from grpo.view.examples import ARTICLE_EXAMPLE

router = APIRouter()
# The formats grpo writes (a plugin's too): the path parameter's choices, in the API's schema.
Format = Literal[tuple(FORMATS)]  # type: ignore[valid-type]
FILE: dict[int | str, dict[str, Any]] = {
    200: {"description": "The batch file", "content": {media: {} for media in sorted(set(FORMATS.values()))}}
}


@router.post(
    "/api/v1/export/{fmt}",
    summary="The batch as a file the upload reads back",
    response_class=Response,
    responses={**FILE, **ERRORS},
    openapi_extra=json_body(BatchRequest),
)
async def export(fmt: Format, request: Request, lanes: LanesDep, settings: SettingsDep) -> Response:  # type: ignore[valid-type]
    return await answer(request, lanes, settings, work.export, fmt)


@router.get(
    "/api/v1/examples/{fmt}",
    summary="The article's example batch as a file of this format",
    response_class=Response,
    responses=FILE,
)
def example(fmt: Format) -> Response:  # type: ignore[valid-type]
    """The article's batch: 3 rows of 5 tokens, a few kilobytes in any format."""
    headers = {"content-disposition": f'attachment; filename="{file_name("grpo-lens-example", fmt)}"'}
    return Response(export_batch(dict(ARTICLE_EXAMPLE), fmt), media_type=FORMATS[fmt], headers=headers)
