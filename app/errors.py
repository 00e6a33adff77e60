"""One error shape for the whole API: FastAPI's ``{"detail": [{"loc", "msg", "type"}]}``.

Library errors (``GrpoInputError``) become 422s whose ``loc`` names the field and row; limits
become 413s; nothing becomes a 500 with a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import grpo

log = logging.getLogger("grpo_lens")
CONFIG_FIELDS = set(grpo.FIELD_NAMES)


class LimitError(Exception):
    """A request past a size limit (413)."""

    def __init__(self, loc: list[str | int], msg: str):
        self.loc, self.msg = loc, msg


def detail(loc: list[str | int], msg: str, kind: str) -> dict[str, Any]:
    return {"detail": [{"loc": loc, "msg": msg, "type": kind}]}


def grpo_loc(exc: grpo.GrpoInputError, root: str = "body") -> list[str | int]:
    """Where a library error points: a config field, or a batch field and its row."""
    loc: list[str | int] = [root]
    if exc.field in CONFIG_FIELDS:
        loc.append("config")
    loc.append(exc.field)
    if exc.row is not None:
        loc.append(exc.row)
    return loc


LOGPROB_FIELDS = {"per_token_logps", "old_per_token_logps", "ref_per_token_logps"}


def _explain_validation(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's errors, JSON-safe, with a hint where a positive log-prob was refused."""
    out = []
    for err in errors:
        entry: dict[str, Any] = {k: err[k] for k in ("loc", "msg", "type") if k in err}
        loc = entry.get("loc", ())
        if err.get("type") == "less_than_equal" and len(loc) > 1 and loc[1] in LOGPROB_FIELDS:
            entry["msg"] += " (a log-prob is <= 0; a positive value usually means logits were passed)"
        if "input" in err and isinstance(err["input"], int | float | str | bool | type(None)):
            entry["input"] = (
                err["input"] if not isinstance(err["input"], float) or err["input"] == err["input"] else None
            )
        out.append(entry)
    return out


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _explain_validation(list(exc.errors()))}, status_code=422)

    @app.exception_handler(grpo.GrpoInputError)
    async def library(_: Request, exc: grpo.GrpoInputError) -> JSONResponse:
        return JSONResponse(detail(grpo_loc(exc), str(exc), "value_error"), status_code=422)

    @app.exception_handler(LimitError)
    async def limit(_: Request, exc: LimitError) -> JSONResponse:
        return JSONResponse(detail(exc.loc, exc.msg, "too_large"), status_code=413)

    @app.exception_handler(StarletteHTTPException)
    async def http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = (
            exc.detail if isinstance(exc.detail, list) else [{"loc": [], "msg": str(exc.detail), "type": "http_error"}]
        )
        return JSONResponse({"detail": body}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:  # a bug: log it, leak nothing
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            detail([], "internal error: the server could not compute this", "internal"), status_code=500
        )
