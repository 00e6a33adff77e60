"""Write a batch (the ``/api/v1/loss`` fields) as a file that the upload reads back: safetensors, NPZ,
JSON or JSONL. Tensors are float64 (B, T) padded with 0, with a ``completion_mask`` that marks the
padding; per-row fields are 1-D; ``group_size`` is a 0-d scalar.

The per-token fields come as ragged rows (lists), or as (B, T) arrays already padded with the rows'
``lengths`` (what the server's reader makes of a request). ``file_bytes`` bounds a file's size from
those sizes alone, so a server can refuse a batch whose file would be too large before writing it.
"""

from __future__ import annotations

import io
from itertools import chain
from typing import Any

import numpy as np
import orjson

from grpo.errors import GrpoInputError
from grpo.requests import batch_from_request

FORMATS: dict[str, str] = {
    "json": "application/json",
    "jsonl": "application/x-ndjson",
    "safetensors": "application/octet-stream",
    "npz": "application/octet-stream",
}
PER_TOKEN = ("per_token_logps", "old_per_token_logps", "ref_per_token_logps", "entropies")
PER_ROW = {"rewards": "reward", "advantages": "advantage", "prompt_lengths": "prompt_length"}
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
    on the padding."""
    lengths = row_lengths(fields, lengths)
    width = max(lengths, default=0)
    present = np.arange(width)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]  # (B, T)
    mask = fields.get("completion_mask")
    out = {"completion_mask": present.astype(np.float64) if mask is None else _grid(mask, present)}
    for name in PER_TOKEN:
        if fields.get(name) is not None:
            out[name] = _grid(fields[name], present)
    for name in PER_ROW:
        value = fields.get(name)
        if isinstance(value, list):
            out[name] = np.asarray(value, dtype=np.int64 if name == "prompt_lengths" else np.float64)
        elif value is not None:
            out[name] = np.asarray(value, dtype=np.int64)  # one prompt length for every row: 0-d
    if fields.get("group_size") is not None:
        out["group_size"] = np.asarray(fields["group_size"], dtype=np.int64)  # 0-d
    return out


def _grid(value: Any, present: np.ndarray) -> np.ndarray:
    """A per-token field as a (B, T) float64 array padded with 0 (an array is padded already)."""
    if isinstance(value, np.ndarray):
        return np.asarray(value, dtype=np.float64)
    grid = np.zeros(present.shape)
    for i, row in enumerate(value):
        grid[i, : len(row)] = row
    return grid


def file_bytes(fields: dict[str, Any], fmt: str, lengths: list[int] | None = None) -> int:
    """At most the bytes of ``export_batch(fields, fmt, lengths)``'s file, from the batch's sizes alone.

    Binary formats hold every (B, T) grid (the mask too) as float64, NPZ the display strings as a
    (B, T) unicode array as wide as the longest (4 bytes a character); JSON and JSONL hold the rows
    as text."""
    lengths = row_lengths(fields, lengths)
    rows, width, positions = len(lengths), max(lengths, default=0), sum(lengths)
    grids = 1 + sum(fields.get(name) is not None for name in PER_TOKEN)
    tokens = fields.get("tokens") or []
    if fmt in ("safetensors", "npz"):
        size = 8 * rows * (width * grids + len(PER_ROW)) + 4096
        if fmt == "npz" and tokens:
            size += 4 * rows * width * max(map(len, chain.from_iterable(tokens)), default=1)
        return size
    text = sum(map(len, chain.from_iterable(tokens))) * CHAR_BYTES + positions * STRING_BYTES if tokens else 0
    return positions * grids * NUMBER_BYTES + text + rows * 128 + 4096


def to_safetensors(fields: dict[str, Any], lengths: list[int] | None = None) -> bytes:
    """Named tensors; display strings cannot be tensors and are left out."""
    from safetensors.numpy import save

    return bytes(save(padded_arrays(fields, lengths)))


def to_npz(fields: dict[str, Any], lengths: list[int] | None = None) -> bytes:
    """Named arrays; display strings as a 2-D unicode array (read back without pickle)."""
    arrays = padded_arrays(fields, lengths)
    if fields.get("tokens") is not None:
        width = arrays["completion_mask"].shape[1]
        arrays["tokens"] = np.asarray([list(r) + [""] * (width - len(r)) for r in fields["tokens"]], dtype=str)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _rows(fields: dict[str, Any], lengths: list[int] | None) -> dict[str, list[Any]]:
    """The per-token fields as ragged rows (NumPy slices, written by orjson without a Python float each);
    the mask only where it masks a token (else it is the default, all 1)."""
    arrays = padded_arrays(fields, lengths)
    lengths = row_lengths(fields, lengths)
    present = np.arange(arrays["completion_mask"].shape[1])[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]
    out = {}
    for name in PER_TOKEN:
        if name in arrays:
            out[name] = [grid_row[:n] for grid_row, n in zip(arrays[name], lengths, strict=True)]
    mask = arrays["completion_mask"]
    if not mask[present].all():
        out["completion_mask"] = [row[:n] for row, n in zip(mask.astype(np.int8), lengths, strict=True)]
    if fields.get("tokens") is not None:
        out["tokens"] = fields["tokens"]
    return out


def to_json(fields: dict[str, Any], lengths: list[int] | None = None) -> bytes:
    """One JSON object: the /api/v1/loss fields, rows ragged."""
    rows = _rows(fields, lengths)
    rest = {name: fields[name] for name in (*PER_ROW, "group_size") if fields.get(name) is not None}
    return orjson.dumps({**rows, **rest}, option=orjson.OPT_SERIALIZE_NUMPY)


def to_jsonl(fields: dict[str, Any], lengths: list[int] | None = None) -> bytes:
    """One line per row (its per-token lists, its reward or advantage); group_size on a line of its own."""
    lines = []
    if fields.get("group_size") is not None:
        lines.append(orjson.dumps({"group_size": fields["group_size"]}))
    rows = _rows(fields, lengths)
    for i in range(len(row_lengths(fields, lengths))):
        line = {name: values[i] for name, values in rows.items()}
        for name, key in PER_ROW.items():
            value = fields.get(name)
            if isinstance(value, list):
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


WRITERS = {"safetensors": to_safetensors, "npz": to_npz, "json": to_json, "jsonl": to_jsonl}


def export_batch(fields: dict[str, Any], fmt: str, lengths: list[int] | None = None) -> bytes:
    """The batch as a file of format ``fmt`` (one of FORMATS), after the checks an evaluation makes.
    ``lengths``: the rows' lengths where the per-token fields are (B, T) arrays padded already."""
    check(fields, lengths)
    return WRITERS[fmt](fields, lengths)
