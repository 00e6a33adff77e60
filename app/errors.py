"""One error shape for the whole API: FastAPI's ``{"detail": [{"loc", "msg", "type"}]}``.

``error_item`` builds every entry. Library errors (``GrpoInputError``) become 422s whose ``loc``
names the field and row; limits become 413s; a full large-request lane a 503 with Retry-After.
A bug is a 500 that says nothing internal: an error id, whose traceback goes to the log.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

import grpo
from grpo.errors import shown

log = logging.getLogger("grpo_lens")
CONFIG_FIELDS = set(grpo.FIELD_NAMES)
Loc = list[str | int]


def error_item(loc: Loc, msg: str, kind: str) -> dict[str, Any]:
    """One entry of the API's error list: where, what was expected and given, and its kind (a key of the
    request's own, such as an unknown config field, named in ``loc`` as ``grpo.errors.shown`` cuts it)."""
    return {"loc": [shown(part) if isinstance(part, str) else part for part in loc], "msg": msg, "type": kind}


def refused(status: int, loc: Loc, msg: str, kind: str) -> ApiError:
    """An answer other than 200 with one entry, its ``loc`` naming the path parameter or body field at fault."""
    return ApiError(status, [error_item(loc, msg, kind)])


def detail(loc: Loc, msg: str, kind: str) -> dict[str, Any]:
    return {"detail": [error_item(loc, msg, kind)]}


class ApiError(Exception):
    """An answer other than 200, raised anywhere in a request's handling (threads and worker processes too)."""

    def __init__(self, status: int, items: list[dict[str, Any]], headers: dict[str, str] | None = None):
        super().__init__(items[0]["msg"] if items else str(status))
        self.status, self.items, self.headers = status, items, headers or {}

    def __reduce__(self) -> tuple[Any, ...]:
        # the default rebuild calls __init__ with ``args`` (the message), which no __init__ here takes
        return _unpickled, (type(self), self.args), self.__dict__


def _unpickled(cls: type[ApiError], args: tuple[Any, ...]) -> ApiError:
    """An ApiError (or subclass) back from pickle, as it crosses a process: made without its __init__,
    its attributes then restored from its ``__dict__``."""
    return cls.__new__(cls, *args)


class LimitError(ApiError):
    """A request past a size limit (413)."""

    def __init__(self, loc: Loc, msg: str):
        super().__init__(413, [error_item(loc, msg, "too_large")])
        self.loc, self.msg = loc, msg


def invalid(items: list[dict[str, Any]]) -> ApiError:
    """A 422 from pydantic-style error entries (capped and explained)."""
    return ApiError(422, explain_validation(items))


def config_error(loc: Loc, exc: grpo.GrpoInputError) -> ApiError:
    """A library error about a config (its preset, an unknown or invalid field), placed at ``loc``:
    ``body.config`` for /loss and /upload, ``body.configs[i]`` for /compare."""
    return ApiError(422, [error_item([*loc, exc.field], str(exc), "value_error")])


def grpo_loc(exc: grpo.GrpoInputError, root: str = "body") -> Loc:
    """Where a library error points: a config field, or a batch field and its row."""
    loc: Loc = [root]
    if exc.field in CONFIG_FIELDS:
        loc.append("config")
    loc.append(exc.field)
    if exc.row is not None:
        loc.append(exc.row)
    return loc


MAX_ERRORS = 20
MAX_ECHO = 200  # characters of a string input an error entry repeats
BODY_EXPECTED = "expected a JSON object in UTF-8 (multipart form data for /api/v1/upload)"
LOGPROB_FIELDS = {"per_token_logps", "old_per_token_logps", "ref_per_token_logps"}


def explain_validation(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """pydantic's errors, JSON-safe, with a hint where a positive log-prob was refused.

    At most ``MAX_ERRORS`` are listed (a flat list of a million numbers is a million errors),
    then one entry that counts the rest.
    """
    out = []
    for err in errors[:MAX_ERRORS]:
        entry = error_item(list(err.get("loc", ())), str(err.get("msg", "")), str(err.get("type", "value_error")))
        loc = entry["loc"]
        if err.get("type") == "json_invalid" and "ctx" in err:  # FastAPI's bare "JSON decode error"
            entry["msg"] += f" ({err['ctx'].get('error')}): {BODY_EXPECTED}"
        if err.get("type") == "less_than_equal" and len(loc) > 1 and loc[1] in LOGPROB_FIELDS:
            entry["msg"] += " (a log-prob is <= 0; a positive value usually means logits were passed)"
        value = err.get("input")
        if isinstance(value, str) and len(value) > MAX_ECHO:  # a client's megabyte is not sent back
            value = f"{value[:MAX_ECHO]}... ({len(value)} characters)"
        if "input" in err and isinstance(value, int | float | str | bool | type(None)):
            entry["input"] = None if isinstance(value, float) and not math.isfinite(value) else value  # JSON has no inf
        out.append(entry)
    if len(errors) > MAX_ERRORS:
        more = f"{len(errors) - MAX_ERRORS} more errors not listed; the first {MAX_ERRORS} are above"
        out.append(error_item(["body"], more, "too_many_errors"))
    return out


def error_json(items: list[dict[str, Any]]) -> bytes:
    """The error body. ASCII-escaped JSON: any string a client sent (a lone surrogate too) encodes."""
    return json.dumps({"detail": items}, ensure_ascii=True, allow_nan=False, default=str).encode()


def internal_error(exc: BaseException, where: str) -> ApiError:
    """A bug: its traceback goes to the log under a fresh error id; the answer says only the id."""
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s on %s", error_id, where, exc_info=exc)
    msg = f"internal error {error_id}: the server could not compute this; the id finds it in the server's log"
    return ApiError(500, [error_item([], msg, "internal")])


def as_api_error(exc: BaseException, where: str) -> ApiError:
    """Any exception a request's handling raised, as the answer it gets."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, grpo.GrpoInputError):
        return ApiError(422, [error_item(grpo_loc(exc), str(exc), "value_error")])
    if isinstance(exc, RequestValidationError):
        return invalid(list(exc.errors()))
    if isinstance(exc, MemoryError):
        msg = "the server ran out of memory for this request; send a smaller batch"
        return ApiError(503, [error_item(["body"], msg, "out_of_memory")], {"retry-after": "10"})
    return internal_error(exc, where)


def error_response(error: ApiError) -> Response:
    return Response(error_json(error.items), error.status, headers=error.headers, media_type="application/json")
