"""Write a batch (the ``/api/v1/loss`` fields, ragged rows) as a file that the upload reads back:
safetensors, NPZ, JSON or JSONL. Tensors are float64 (B, T) padded with 0, with a
``completion_mask`` that marks the padding; per-row fields are 1-D; ``group_size`` is a 0-d scalar.
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np

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


def padded_arrays(fields: dict[str, Any]) -> dict[str, np.ndarray]:
    """Ragged rows -> (B, T) float64 arrays padded with 0, the mask 0 on the padding."""
    rows = fields["per_token_logps"]
    width = max((len(r) for r in rows), default=0)
    mask = np.zeros((len(rows), width))
    given = fields.get("completion_mask")
    for i, row in enumerate(rows):
        mask[i, : len(row)] = given[i] if given is not None else 1.0
    out = {"completion_mask": mask}
    for name in PER_TOKEN:
        if fields.get(name) is not None:
            grid = np.zeros((len(rows), width))
            for i, row in enumerate(fields[name]):
                grid[i, : len(row)] = row
            out[name] = grid
    for name in PER_ROW:
        value = fields.get(name)
        if isinstance(value, list):
            out[name] = np.asarray(value, dtype=np.int64 if name == "prompt_lengths" else np.float64)
        elif value is not None:
            out[name] = np.asarray(value, dtype=np.int64)  # one prompt length for every row: 0-d
    if fields.get("group_size") is not None:
        out["group_size"] = np.asarray(fields["group_size"], dtype=np.int64)  # 0-d
    return out


def to_safetensors(fields: dict[str, Any]) -> bytes:
    """Named tensors; display strings cannot be tensors and are left out."""
    from safetensors.numpy import save

    return bytes(save(padded_arrays(fields)))


def to_npz(fields: dict[str, Any]) -> bytes:
    """Named arrays; display strings as a 2-D unicode array (read back without pickle)."""
    arrays = padded_arrays(fields)
    if fields.get("tokens") is not None:
        width = arrays["completion_mask"].shape[1]
        arrays["tokens"] = np.asarray([list(r) + [""] * (width - len(r)) for r in fields["tokens"]], dtype=str)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def to_jsonl(fields: dict[str, Any]) -> bytes:
    """One line per row (its per-token lists, its reward or advantage); group_size on a line of its own."""
    lines = []
    if fields.get("group_size") is not None:
        lines.append({"group_size": fields["group_size"]})
    for i in range(len(fields["per_token_logps"])):
        row = {name: fields[name][i] for name in (*PER_TOKEN, "completion_mask", "tokens") if fields.get(name)}
        for name, key in PER_ROW.items():
            value = fields.get(name)
            if isinstance(value, list):
                row[key] = value[i]
            elif value is not None:
                row[key] = value
        lines.append(row)
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


def check(fields: dict[str, Any]) -> None:
    """The same checks as an evaluation (shapes, values), plus display strings one per token."""
    batch_from_request({k: v for k, v in fields.items() if k != "tokens"})
    tokens, rows = fields.get("tokens"), fields["per_token_logps"]
    if tokens is None:
        return
    if len(tokens) != len(rows):
        raise GrpoInputError("tokens", f"{len(rows)} rows like per_token_logps", got=f"{len(tokens)}")
    for i, (text, row) in enumerate(zip(tokens, rows, strict=True)):
        if len(text) != len(row):
            raise GrpoInputError("tokens", f"{len(row)} strings like per_token_logps[{i}]", row=i, got=f"{len(text)}")


def export_batch(fields: dict[str, Any], fmt: str) -> bytes:
    """The batch as a file of format ``fmt`` (one of FORMATS), after the checks an evaluation makes."""
    check(fields)
    if fmt == "safetensors":
        return to_safetensors(fields)
    if fmt == "npz":
        return to_npz(fields)
    if fmt == "jsonl":
        return to_jsonl(fields)
    return json.dumps(fields, indent=1).encode()
