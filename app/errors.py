"""One error shape for the whole API: FastAPI's ``{"detail": [{"loc", "msg", "type"}]}``.

Library errors (``GrpoInputError``) become 422s whose ``loc`` names the field and row; limits
become 413s; nothing becomes a 500 with a traceback.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
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


def config_error(loc: list[str | int], exc: grpo.GrpoInputError) -> RequestValidationError:
    """A library error about a config (its preset, an unknown or invalid field), placed at ``loc``:
    ``body.config`` for /loss and /upload, ``body.configs[i]`` for /compare."""
    return RequestValidationError([{"loc": [*loc, exc.field], "msg": str(exc), "type": "value_error"}])


def grpo_loc(exc: grpo.GrpoInputError, root: str = "body") -> list[str | int]:
    """Where a library error points: a config field, or a batch field and its row."""
    loc: list[str | int] = [root]
    if exc.field in CONFIG_FIELDS:
        loc.append("config")
    loc.append(exc.field)
    if exc.row is not None:
        loc.append(exc.row)
    return loc


MAX_ERRORS = 20
BODY_EXPECTED = "expected a JSON object in UTF-8 (multipart form data for /api/v1/upload)"
LOGPROB_FIELDS = {"per_token_logps", "old_per_token_logps", "ref_per_token_logps"}


def _explain_validation(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's errors, JSON-safe, with a hint where a positive log-prob was refused.

    At most ``MAX_ERRORS`` are listed (a flat list of a million numbers is a million errors),
    then one entry that counts the rest.
    """
    out = []
    for err in errors[:MAX_ERRORS]:
        entry: dict[str, Any] = {k: err[k] for k in ("loc", "msg", "type") if k in err}
        loc = entry.get("loc", ())
        if err.get("type") == "json_invalid" and "ctx" in err:  # FastAPI's bare "JSON decode error"
            entry["msg"] += f" ({err['ctx'].get('error')}): {BODY_EXPECTED}"
        if err.get("type") == "less_than_equal" and len(loc) > 1 and loc[1] in LOGPROB_FIELDS:
            entry["msg"] += " (a log-prob is <= 0; a positive value usually means logits were passed)"
        value = err.get("input")
        if "input" in err and isinstance(value, int | float | str | bool | type(None)):
            entry["input"] = None if isinstance(value, float) and not math.isfinite(value) else value  # JSON has no inf
        out.append(entry)
    if len(errors) > MAX_ERRORS:
        more = f"{len(errors) - MAX_ERRORS} more errors not listed; the first {MAX_ERRORS} are above"
        out.append({"loc": ["body"], "msg": more, "type": "too_many_errors"})
    return out


ERROR_TEXT = {404: "There is no page here.", 405: "This address does not take that kind of request."}


def wants_html(request: Request) -> bool:
    return not request.url.path.startswith(("/api/", "/healthz", "/openapi")) and "text/html" in request.headers.get(
        "accept", ""
    )


def error_page(request: Request, status: int) -> Response:
    from app.pages import templates  # the page templates live with the HTML routes

    message = ERROR_TEXT.get(status, "Something went wrong with this request.")
    return templates.TemplateResponse(request, "error.html", {"status": status, "message": message}, status_code=status)


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
    async def http(request: Request, exc: StarletteHTTPException) -> Response:
        if wants_html(request):  # a person at a browser: the one error page, not JSON
            return error_page(request, exc.status_code)
        if exc.status_code == 400 and isinstance(exc.detail, str):  # FastAPI could not decode the body
            return JSONResponse(detail(["body"], f"{exc.detail}: {BODY_EXPECTED}", "body_invalid"), status_code=422)
        body = (
            exc.detail if isinstance(exc.detail, list) else [{"loc": [], "msg": str(exc.detail), "type": "http_error"}]
        )
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:  # Starlette names only the first matching route's methods
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
        return JSONResponse({"detail": body}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:  # a bug: log it, leak nothing
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            detail([], "internal error: the server could not compute this", "internal"), status_code=500
        )


def _allowed_methods(request: Request) -> list[str]:
    """Every method the API documents at this path (several routes share a path, one per method)."""
    methods: set[str] = set()
    for template, operations in request.app.openapi()["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}/]+\}", "[^/]+", template), request.url.path):
            methods |= {m.upper() for m in operations}
    return sorted(methods)
