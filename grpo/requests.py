"""Request fields -> a checked Batch: the road's steps from a decoder's output to ``grpo.Batch``. A caller
takes the whole road with one call, ``grpo.road.read_request``; these are its parts (the CLI, the exporters and
the examples, whose fields need no schema, call ``batch_from_request`` alone).

1. A decoder turns bytes into request fields: ``grpo.io.read_arrays`` (JSON text: each per-token field as
   one ``Flat`` float64 array and its row lengths, no Python float per number), ``grpo.io.parse_json``
   (ragged lists), ``grpo.io.load_file`` (a file's (B, T) arrays, in the dtype they arrived in: float32
   stays float32).
2. ``padded_fields``: ``Flat`` per-token values -> (B, T) arrays padded with 0, each field's rows held to
   ``per_token_logps``' (one copy: the grid); a missing completion mask masks the padding.
3. ``batch_from_request``: ragged lists are padded (``grpo.from_rows``), 2-D arrays go in as they are, and
   ``grpo.Batch`` checks every bound once, from the batch-field table (``grpo.fields``): shapes, finite
   values and log-probs <= 0 at the counted tokens, masks of 0 and 1, prompt lengths, group sizes, rewards or
   advantages. An array of the right dtype is not copied on the way in: the Batch's own copy (the padding
   zeroed) is the only one.

The road prices a request (its padded positions, its memory: the caller's ``Checks.price``) between 1 and 2,
before any (B, T) array exists; ``within_bounds`` (the table's bounds, judged on every value given, padding
included) tells it, before step 2, whether the caller's exact checks must run to name the position of a bad value.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from torch import Tensor

from grpo.batch import Batch, from_rows
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS, BatchField, given_per_token, padded, present

PER_TOKEN_OK = tuple(name for name, f in BATCH_FIELDS.items() if f.per_token_ok)  # per row, or per token


class Flat(NamedTuple):
    """Per-token rows already read into one flat array (``grpo.io.read_arrays``)."""

    values: np.ndarray
    lengths: np.ndarray


def row_lengths(request: dict[str, Any]) -> list[int]:
    """Each row's length as given (ragged lists), or the padded width for a 2-D array."""
    rows = request.get("per_token_logps")
    if rows is None:
        raise GrpoInputError("per_token_logps", "the current policy's log-probs, one list per completion")
    if isinstance(rows, np.ndarray | Tensor):
        if rows.ndim != 2:
            raise GrpoInputError("per_token_logps", "a 2-D array (B rows, T tokens)", got=f"{rows.ndim} dims")
        return [int(rows.shape[1])] * int(rows.shape[0])
    if not isinstance(rows, list | tuple):
        raise GrpoInputError("per_token_logps", "a list of rows", got=type(rows).__name__)
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, list | tuple)), None)
    if bad is not None:
        raise GrpoInputError("per_token_logps", "a list of numbers per row", row=bad)
    return [len(r) for r in rows]


def within_bounds(field: BatchField, values: np.ndarray) -> bool:
    """Whether every value given (padding included, unlike the Batch, which judges the counted tokens) is
    inside the field's bounds: finite (NaN where the field allows it), within low and high, a mask's 0 or 1.
    Reductions only: a million values in a few milliseconds."""
    numbers = values[~np.isnan(values)] if field.nan_ok else values
    low, high = field.low, field.high
    inside = np.isfinite(numbers).all() and numbers.min(initial=low) >= low and numbers.max(initial=high) <= high
    return bool(inside) and (field.dtype != "mask" or bool(np.isin(values, (0.0, 1.0)).all()))


def padded_fields(fields: dict[str, Any], lengths: np.ndarray, names: list[str]) -> dict[str, Any]:
    """``fields`` with the ``Flat`` per-token fields ``names`` as (B, T) arrays padded with 0, each one's rows
    held to ``lengths`` (per_token_logps'); a per-row field given per token (advantages: ragged rows) is padded
    too, and a missing completion mask masks the padding."""
    for name in names:
        values, rows = fields[name]
        _same_rows(name, rows, lengths)
        fields[name] = padded(name, values, lengths)
    for name in PER_TOKEN_OK:
        if fields.get(name) is not None and given_per_token(name, fields[name]):
            fields[name] = padded(name, fields[name], lengths)
    if fields.get("completion_mask") is None:
        fields["completion_mask"] = present(lengths).astype(np.float64)
    return fields


def _same_rows(name: str, rows: np.ndarray, lengths: np.ndarray) -> None:
    """A field's rows against per_token_logps' (``grpo.fields.padded`` words ragged lists' errors alike)."""
    if len(rows) != len(lengths):
        raise GrpoInputError(name, f"{len(lengths)} rows like per_token_logps", got=f"{len(rows)} rows")
    bad = np.flatnonzero(rows != lengths)
    if bad.size:
        i = int(bad[0])
        raise GrpoInputError(name, f"{lengths[i]} values like per_token_logps[{i}]", row=i, got=f"{rows[i]}")


def batch_from_request(request: dict[str, Any]) -> Batch:
    """A Batch from request fields: ragged lists (padded here) or 2-D arrays (used as they are).

    Keys outside the Batch's fields (``tokens``, ``config``, ...) are ignored.
    """
    row_lengths(request)  # per_token_logps is there and has rows
    fields = {k: request[k] for k in BATCH_FIELDS if request.get(k) is not None}
    if isinstance(fields.get("per_token_logps"), np.ndarray | Tensor):
        return Batch(**fields)
    return from_rows(**fields)
