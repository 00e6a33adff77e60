"""JSON and JSONL files: the text read with orjson (simdjson straight into arrays where it can)."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import numpy as np
import orjson
import simdjson

from grpo import export
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS, fields_of
from grpo.io.formats import MAX_UNPACKED_BYTES, UploadFormat, canonical


def _is_json(data: bytes) -> bool:
    return data[:64].lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"[")


def parse_json(data: bytes | str) -> Any:
    """JSON text -> Python values, with orjson (no Python recursion; nesting deeper than 1024 refused).

    Text orjson refuses is read again by Python's json, which accepts NaN and Infinity (the request
    checks then name them as non-finite) and lone UTF-16 surrogates (``"\\ud800"``), which are
    replaced by U+FFFD so the answer can be encoded. Raises ValueError with orjson's message.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):  # bad JSON or UTF-8, too deep, an int of 4300+ digits
            raise ValueError(str(exc)) from None
        return _replace_surrogates(value)


def read_arrays(
    data: bytes, names: Collection[str]
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]] | None:
    """A JSON object whose fields ``names`` (where given) are arrays of number arrays, read without a
    Python float per number: (its other fields as Python values, {name: (flat float64 values, row lengths)}).

    simdjson parses the text and copies each such field's numbers straight into one flat array (a
    256 x 4096 batch in a fraction of ``orjson.loads``'s time). None when the text is anything
    else (invalid JSON, NaN, lone surrogates, a field of another shape, duplicate keys): the
    caller then reads it with ``parse_json``, whose checks name what is wrong. The shape is
    proven, not assumed: the flat copy would also flatten deeper arrays, so the text's ``[``
    count must be exactly the arrays the answer accounts for.
    """
    try:
        doc = simdjson.Parser().parse(data)
    except (ValueError, TypeError, RuntimeError):  # invalid JSON, too deep, numbers out of range, bad UTF-8
        return None
    if not isinstance(doc, simdjson.Object):
        return None
    keys = list(doc)
    if len(set(keys)) != len(keys):
        return None
    rest: dict[str, Any] = {}
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    brackets = 0  # the "[" of the arrays read here
    for key in keys:
        value = doc[key]
        if key not in names or value is None:
            rest[key] = _plain(value)
            continue
        if not isinstance(value, simdjson.Array):
            return None
        rows = list(value)
        lengths = [len(row) if isinstance(row, simdjson.Array) else -1 for row in rows]
        if -1 in lengths:
            return None
        try:
            flat = np.frombuffer(value.as_buffer(of_type="d"), dtype=np.float64)
        except (TypeError, ValueError):  # a string, bool or null among the numbers
            return None
        arrays[key] = flat, np.array(lengths, dtype=np.int64)
        brackets += 1 + len(rows)
    if not arrays:
        return None
    try:
        brackets += orjson.dumps(rest).count(b"[")  # and those of the other fields: arrays and "[" in strings
    except orjson.JSONEncodeError:  # nested past orjson's depth: the exact reader judges it
        return None
    return (rest, arrays) if data.count(b"[") == brackets else None  # else an array nested deeper


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _fix(text: str) -> str:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace") if _has_surrogate(text) else text


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _replace_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD (in place, no recursion)."""
    if isinstance(value, str):
        return _fix(value)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            for i, v in enumerate(item):
                if isinstance(v, str):
                    item[i] = _fix(v)
                elif isinstance(v, list | dict):
                    stack.append(v)
        elif isinstance(item, dict):
            for key in list(item):
                v = item.pop(key)
                item[_fix(key) if isinstance(key, str) else key] = _fix(v) if isinstance(v, str) else v
                if isinstance(v, list | dict):
                    stack.append(v)
    return value


def _read_json(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    try:
        body = parse_json(data)
    except ValueError as exc:
        raise GrpoInputError("file", "valid JSON", got=str(exc)[:200]) from exc
    if not isinstance(body, dict):
        raise GrpoInputError("file", "a JSON object with the /api/v1/loss fields", got=type(body).__name__)
    return canonical(body)


ROW_KEYS = {f.row_key: name for name, f in BATCH_FIELDS.items() if f.row_key}
BATCH_ONLY = fields_of("batch")  # a JSONL line holding only these (and config) sets them for the batch


def _read_jsonl(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    """One JSON object per line: a row's per-token lists and its reward or advantage; a line
    holding only ``config`` or batch-wide fields (``group_size``) sets them for the batch."""
    columns: dict[str, list[Any]] = {}
    batch: dict[str, Any] = {}
    # lines end at "\n" alone: str.splitlines would also split at U+2028 and the like, which JSON strings hold
    for number, line in enumerate(data.decode("utf-8", errors="replace").split("\n")):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except ValueError as exc:
            raise GrpoInputError("file", "one JSON object per line", row=number, got=str(exc)[:200]) from exc
        if not isinstance(row, dict):
            raise GrpoInputError("file", "one JSON object per line", row=number, got=type(row).__name__)
        if set(row) <= {"config", *BATCH_ONLY}:
            batch.update(row)
            continue
        for key, value in canonical(row).items():
            columns.setdefault(ROW_KEYS.get(key, key), []).append(value)
    n = max((len(v) for v in columns.values()), default=0)
    for key, values in columns.items():
        if len(values) != n:
            raise GrpoInputError(key, f"a value on every row line ({n})", got=f"{len(values)}")
    return batch | columns


JSON = UploadFormat(
    "json", "JSON", ("json",), "json", _read_json, export.to_json, "application/json", False, _is_json, "JSON text"
)
JSONL = UploadFormat("jsonl", "JSONL", ("jsonl",), "json", _read_jsonl, export.to_jsonl, "application/x-ndjson")
