"""Request-shaped data (the ``/api/v1/loss`` fields) -> a Batch."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from grpo.batch import Batch, from_rows
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS


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


def batch_from_request(request: dict[str, Any]) -> Batch:
    """A Batch from request fields: ragged lists (padded here) or 2-D arrays (used as they are).

    Keys outside the Batch's fields (``tokens``, ``config``, ...) are ignored.
    """
    row_lengths(request)  # per_token_logps is there and has rows
    fields = {k: request[k] for k in BATCH_FIELDS if request.get(k) is not None}
    if isinstance(fields.get("per_token_logps"), np.ndarray | Tensor):
        return Batch(**fields)
    return from_rows(**fields)
