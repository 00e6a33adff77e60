"""Write a batch (the ``/api/v1/loss`` fields) as a file that the upload reads back: safetensors, NPZ,
JSON or JSONL. Tensors are float64 (B, T) padded with 0, with a ``completion_mask`` that marks the
padding; per-row fields are 1-D; ``group_size`` is a 0-d scalar.

The per-token fields come as ragged rows (lists), or as (B, T) arrays already padded with the rows'
``lengths`` (what the server's reader makes of a request). ``file_bytes`` bounds a file's size from
those sizes alone, so a server can refuse a batch whose file would be too large before writing it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np
import orjson

from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS, fields_of, given_per_token, padded, present, ragged
from grpo.requests import batch_from_request

# The formats written and their MIME types, filled by ``grpo.io.register_format`` from its entries (the
# one place a format is described): a format with a writer is exported here.
FORMATS: dict[str, str] = {}
# From the batch-field table: the mask is written apart (it also marks the padding).
PER_TOKEN = tuple(name for name in fields_of("token") if name != "completion_mask")
PER_ROW = {name: BATCH_FIELDS[name].row_key or name for name in fields_of("row")}
# A float64 as JSON text at its longest ("-2.2250738585072014e-308", shortest round-trip form) and its comma.
NUMBER_BYTES = 25
# A display string in JSON: each character escaped at worst ("\u001f": 6 bytes), quotes and a comma.
CHAR_BYTES, STRING_BYTES = 6, 3


def row_lengths(fields: dict[str, Any], lengths: list[int] | None = None) -> list[int]:
    """Each row's length: ``lengths`` where given, else the ragged rows' (a 2-D array's rows are full)."""
    rows = fields["per_token_logps"]
    if lengths is not None:
        return list(lengths)
    return [int(rows.shape[1])] * len(rows) if isinstance(rows, np.ndarray) else [len(r) for r in rows]


def padded_arrays(fields: dict[str, Any], lengths: list[int] | None = None) -> dict[str, np.ndarray]:
    """Ragged rows, or (B, T) arrays padded already -> (B, T) float64 arrays padded with 0, the mask 0
    on the padding; per-row fields 1-D (0-d when one number stands for every row), batch fields 0-d."""
    lengths = row_lengths(fields, lengths)
    counted = present(lengths)
    mask = fields.get("completion_mask")
    out = {"completion_mask": counted.astype(np.float64) if mask is None else padded("completion_mask", mask, lengths)}
    for name in PER_TOKEN:
        if fields.get(name) is not None:
            out[name] = padded(name, fields[name], lengths)
    for name in (*PER_ROW, *fields_of("batch")):
        if fields.get(name) is not None and given_per_token(name, fields[name]):  # advantages per token: (B, T)
            out[name] = padded(name, fields[name], lengths)
        elif fields.get(name) is not None:
            out[name] = np.asarray(fields[name], dtype=np.int64 if BATCH_FIELDS[name].dtype == "int" else np.float64)
    return out


def file_bytes(fields: dict[str, Any], fmt: str, lengths: list[int] | None = None) -> int:
    """At most the bytes of ``export_batch(fields, fmt, lengths)``'s file, from the batch's sizes alone.

    Binary formats hold every (B, T) grid (the mask, advantages per token too) as float64, NPZ the display
    strings as a (B, T) unicode array as wide as the longest (4 bytes a character); JSON and JSONL hold
    the rows as text."""
    lengths = row_lengths(fields, lengths)
    rows, width, positions = len(lengths), max(lengths, default=0), sum(lengths)
    grids = 1 + len(_token_fields(fields))
    tokens = fields.get("tokens") or []
    if fmt in ("safetensors", "npz"):
        size = 8 * rows * (width * grids + len(PER_ROW)) + 4096
        if fmt == "npz" and tokens:
            size += 4 * rows * width * max(map(len, chain.from_iterable(tokens)), default=1)
        return size
    text = sum(map(len, chain.from_iterable(tokens))) * CHAR_BYTES + positions * STRING_BYTES if tokens else 0
    return positions * grids * NUMBER_BYTES + text + rows * 128 + 4096


def _token_fields(fields: dict[str, Any]) -> list[str]:
    """The fields given per token: the per-token ones, and the per-row ones given per token (advantages)."""
    per_token = [name for name in PER_TOKEN if fields.get(name) is not None]
    return per_token + [
        name for name in PER_ROW if fields.get(name) is not None and given_per_token(name, fields[name])
    ]


def to_safetensors(fields: dict[str, Any], lengths: list[int] | None = None) -> bytes:
    """Named tensors; display strings cannot be tensors and are left out."""
    from safetensors.numpy import save

    return bytes(save(padded_arrays(fields, lengths)))


def to_npz(fields: dict[str, Any], lengths: list[int] | None = None) -> bytes:
    """Named arrays; display strings as a 2-D unicode array (read back without pickle)."""
    arrays = padded_arrays(fields, lengths)
    if fields.get("tokens") is not None:  # filled row by row: no padded Python list of B x T strings
        longest = max(map(len, chain.from_iterable(fields["tokens"])), default=1)
        arrays["tokens"] = np.zeros(arrays["completion_mask"].shape, dtype=f"<U{max(longest, 1)}")
        for i, row in enumerate(fields["tokens"]):
            arrays["tokens"][i, : len(row)] = row
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _rows(fields: dict[str, Any], lengths: list[int] | None) -> dict[str, list[Any]]:
    """The fields given per token (advantages too, where per token) as ragged rows (NumPy slices, written by
    orjson without a Python float each); the mask only where it masks a token (else it is the default, all 1)."""
    arrays = padded_arrays(fields, lengths)
    lengths = row_lengths(fields, lengths)
    out = {name: ragged(arrays[name], lengths) for name in _token_fields(fields)}
    mask = arrays["completion_mask"]
    if not mask[present(lengths)].all():
        out["completion_mask"] = ragged(mask.astype(np.int8), lengths)
    if fields.get("tokens") is not None:
        out["tokens"] = fields["tokens"]
    return out


def to_json(fields: dict[str, Any], lengths: list[int] | None = None) -> bytes:
    """One JSON object: the /api/v1/loss fields, rows ragged."""
    rows = _rows(fields, lengths)
    rest = {n: fields[n] for n in (*PER_ROW, *fields_of("batch")) if fields.get(n) is not None and n not in rows}
    return orjson.dumps({**rows, **rest}, option=orjson.OPT_SERIALIZE_NUMPY)


def to_jsonl(fields: dict[str, Any], lengths: list[int] | None = None) -> bytes:
    """One line per row (its per-token lists, its reward or advantage: a list where given per token);
    group_size on a line of its own."""
    lines = []
    batch = {name: fields[name] for name in fields_of("batch") if fields.get(name) is not None}
    if batch:
        lines.append(orjson.dumps(batch))
    rows = _rows(fields, lengths)
    for i in range(len(row_lengths(fields, lengths))):
        line = {PER_ROW.get(name, name): values[i] for name, values in rows.items()}
        for name, key in PER_ROW.items():
            value = fields.get(name)
            if name in rows:
                continue
            if isinstance(value, list) or (isinstance(value, np.ndarray) and value.ndim > 0):
                line[key] = value[i]
            elif value is not None:
                line[key] = value
        lines.append(orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY))
    return b"\n".join(lines) + b"\n"


def check(fields: dict[str, Any], lengths: list[int] | None = None) -> None:
    """The same checks as an evaluation (shapes, values), plus display strings one per token."""
    batch_from_request({k: v for k, v in fields.items() if k != "tokens"})
    tokens, lengths = fields.get("tokens"), row_lengths(fields, lengths)
    if tokens is None:
        return
    if len(tokens) != len(lengths):
        raise GrpoInputError("tokens", f"{len(lengths)} rows like per_token_logps", got=f"{len(tokens)}")
    for i, (text, n) in enumerate(zip(tokens, lengths, strict=True)):
        if len(text) != n:
            raise GrpoInputError("tokens", f"{n} strings like per_token_logps[{i}]", row=i, got=f"{len(text)}")


WRITERS: dict[str, Callable[[dict[str, Any], list[int] | None], bytes]] = {}  # filled as FORMATS is


def export_batch(fields: dict[str, Any], fmt: str, lengths: list[int] | None = None) -> bytes:
    """The batch as a file of format ``fmt`` (one of FORMATS), after the checks an evaluation makes.
    ``lengths``: the rows' lengths where the per-token fields are (B, T) arrays padded already."""
    check(fields, lengths)
    return WRITERS[fmt](fields, lengths)
