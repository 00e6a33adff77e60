"""The road from a request's bytes to its checked batch fields: ``read_request``, the one call a caller makes.

    data (JSON text, or fields a decoder read) --read_request--> CheckedRequest --.batch()--> grpo.Batch

1. The text is read with ``grpo.io.read_arrays`` (each per-token field straight into one flat float64 array, no
   Python float per number) where it can be, else with ``grpo.io.parse_json`` (ragged lists).
2. The per-token fields are judged vectorised against the batch-field table's bounds (``within_bounds``); the
   other fields go to the caller's ``Checks.others`` with a placeholder in each per-token field's place (the
   API's schema: its errors are its own). Where the vectorised checks cannot decide (a string among the
   numbers, a value out of bounds, a field given under two names), the whole body goes to ``Checks.whole``,
   whose error names the field, the row and the position.
3. ``Checks.price`` judges the request's padded positions and memory before any (B, T) array exists.
4. The per-token fields become (B, T) arrays padded with 0 (``grpo.requests.padded_fields``): one copy.
5. ``CheckedRequest.batch`` builds the ``grpo.Batch``, which checks every bound once more at the counted tokens
   (a file's float32 arrays go in as tensors: the batch stays float32, as the file was).

A binary file's named tensors (``grpo.io.load_file``) take steps 3 and 5: their shapes and dtypes are the file's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from grpo.batch import Batch
from grpo.fields import ALIASES, BATCH_FIELDS, BatchField, fields_of, given_per_token, names_of
from grpo.io import canonical, parse_json, read_arrays
from grpo.requests import PER_TOKEN_OK, Flat, batch_from_request, padded_fields, row_lengths, within_bounds

# The per-token fields (the batch-field table: their bounds, 0/1 or not, NaN allowed or not).
PER_TOKEN: dict[str, BatchField] = {name: BATCH_FIELDS[name] for name in fields_of("token")}
# One value inside each field's bounds: the caller checks the other fields with these in the per-token ones' place.
PLACEHOLDER = {name: [[min(max(1.0 if f.dtype == "mask" else 0.0, f.low), f.high)]] for name, f in PER_TOKEN.items()}
NAMES = {name: names_of(name) for name in PER_TOKEN}
PER_TOKEN_KEYS = frozenset(chain.from_iterable(NAMES.values()))
NUMBER_TYPES = (float, int)  # what a JSON number reads as (bool is an int's subclass, not one of these types)


class Checks(Protocol):
    """What the caller of ``read_request`` judges, each raising the caller's own error: the fields beside the
    per-token ones (its schema), the price of the request, and text that is not JSON."""

    def not_json(self, exc: ValueError) -> Exception:
        """The error to raise for text that is not JSON (``exc``: the parser's)."""
        ...

    def others(self, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """``body``, its per-token fields replaced by ``PLACEHOLDER``s, checked: (the checked request, its batch
        fields: the values of the fields the Batch takes, as checked)."""
        ...

    def whole(self, body: Any) -> tuple[Any, dict[str, Any]]:
        """``body`` (any value, not only an object) checked one value at a time, as ``others`` answers: an error
        names the field, the row and the position."""
        ...

    def price(self, lengths: Sequence[int] | np.ndarray, grids: int, checked: Any) -> None:
        """Refuse a request of rows of ``lengths`` and ``grids`` (B, T) fields, before any grid exists."""
        ...


@dataclass
class CheckedRequest:
    """A request checked and priced: its batch fields (per-token ones as (B, T) arrays or ragged lists), each row's
    length, and ``model``: what ``Checks`` made of the request (its schema's object; None for a file's tensors)."""

    fields: dict[str, Any]
    lengths: list[int]
    model: Any
    ignored: list[str] = field(default_factory=list)
    """A file's tensors that are no batch field: not read, reported."""

    def batch(self) -> Batch:
        """The ``grpo.Batch`` of these fields; the fields are let go (the batch holds its own tensors)."""
        batch = batch_from_request(_float32_as_tensors(self.fields))
        self.fields.clear()
        return batch


def _float32_as_tensors(fields: dict[str, Any]) -> dict[str, Any]:
    """A file's fields whose floating-point arrays are all float32 with those arrays as tensors sharing their memory:
    the Batch then keeps float32 as ``grpo.Batch`` keeps a float32 tensor, where an array that is not a tensor
    becomes float64 (a copy twice the size, and every check and the evaluation's cast on it). Every number computed
    is the same bit for bit (float32 widens to float64 exactly; the loss is computed in the config's dtype either
    way); the entropies, shown as given, are written as the float32 numbers they are. Any other mix (JSON's
    float64, a float64 field beside float32 ones) is left as it is: nothing is rounded."""
    floats = {str(v.dtype) for v in fields.values() if isinstance(v, np.ndarray) and v.dtype.kind == "f"}
    if floats != {"float32"}:
        return fields
    return {k: _shared(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for k, v in fields.items()}


def _shared(values: np.ndarray) -> Tensor:
    return torch.from_numpy(values if values.flags.writeable else values.copy())


class FlatRefused(Exception):
    """Per-token fields given as ``Flat`` arrays (a .json file's numbers, read from its text) that the vectorised
    checks refuse: the caller reads its source again exactly, so that the error names the position."""


class _NeedsExactCheck(Exception):
    """The vectorised checks cannot decide: ``Checks.whole`` judges the body."""


def read_request(data: bytes | dict[str, Any], checks: Checks, from_file: bool = False) -> CheckedRequest:
    """JSON text, or the fields a decoder read, -> the request checked and priced (the module's road).

    ``from_file``: ``data`` are a file's fields (``grpo.io.load_file``); where its ``per_token_logps`` is no list
    of rows, they are the file's named tensors (``_arrays``)."""
    refused = False  # the text's numbers, read straight into arrays, were refused: the lists would be too
    if isinstance(data, bytes | bytearray | memoryview):
        fast = read_arrays(bytes(data), PER_TOKEN_KEYS)
        if fast is not None:
            rest, arrays = fast
            try:
                return _vectorised(rest | {key: Flat(*a) for key, a in arrays.items()}, checks)
            except _NeedsExactCheck:
                refused = True
            del fast, rest, arrays
        try:
            data = parse_json(data)
        except ValueError as exc:
            raise checks.not_json(exc) from exc
    if refused or not isinstance(data, dict):
        return _exact(data, checks)
    if from_file and not isinstance(data.get("per_token_logps", []), list | Flat):
        return _arrays(data, checks)
    try:
        return _vectorised(data, checks)
    except _NeedsExactCheck:
        if any(isinstance(v, Flat) for v in data.values()):
            raise FlatRefused from None
        return _exact(data, checks)


def _vectorised(body: dict[str, Any], checks: Checks) -> CheckedRequest:
    """The per-token fields checked vectorised, the others by ``checks``; ``_NeedsExactCheck`` when undecided."""
    given = {name: [k for k in keys if body.get(k) is not None] for name, keys in NAMES.items()}
    if any(len(keys) > 1 for keys in given.values()):
        raise _NeedsExactCheck
    keys = {name: keys[0] for name, keys in given.items() if keys}
    checked, fields = checks.others({**body, **{key: PLACEHOLDER[name] for name, key in keys.items()}})
    flats = {name: _flat(body[key], PER_TOKEN[name]) for name, key in keys.items()}
    if "per_token_logps" not in flats:
        raise _NeedsExactCheck
    lengths = flats["per_token_logps"][1]
    if lengths.min() == 0:
        raise _NeedsExactCheck
    grids = len(flats) + sum(given_per_token(name, fields.get(name)) for name in PER_TOKEN_OK)  # advantages (B, T)
    checks.price(lengths, grids, checked)
    fields |= {name: Flat(*pair) for name, pair in flats.items()}
    return CheckedRequest(padded_fields(fields, lengths, list(flats)), [int(n) for n in lengths], checked)


def _flat(rows: Any, field: BatchField) -> tuple[np.ndarray, np.ndarray]:
    """Ragged rows -> (flat float64 values, row lengths), within the field's bounds; else ``_NeedsExactCheck``."""
    if isinstance(rows, Flat):
        flat, lengths = rows
        if not len(lengths):
            raise _NeedsExactCheck
    elif type(rows) is not list or not rows or any(type(r) is not list for r in rows):
        raise _NeedsExactCheck
    else:
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        if not all(type(v) in NUMBER_TYPES for v in chain.from_iterable(rows)):  # true, "0.5": not JSON numbers
            raise _NeedsExactCheck  # the exact check names the value
        try:
            flat = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=int(lengths.sum()))
        except (TypeError, ValueError, OverflowError):
            raise _NeedsExactCheck from None
    if not within_bounds(field, flat):  # the exact check names the value and its position
        raise _NeedsExactCheck
    return flat, lengths


def _exact(body: Any, checks: Checks) -> CheckedRequest:
    """The whole body through ``checks.whole``: its errors name the field, row and position; ragged lists out."""
    checked, fields = checks.whole(body)
    lengths = [len(r) for r in fields["per_token_logps"]]
    checks.price(lengths, sum(fields.get(n) is not None for n in PER_TOKEN), checked)
    return CheckedRequest(fields, lengths, checked)


def _arrays(fields: dict[str, Any], checks: Checks) -> CheckedRequest:
    """A file's named tensors: priced by their grid (the Batch checks their values); the ones that are no batch
    field (nor its display strings, ``tokens``) are reported, not silently dropped."""
    ignored = sorted(set(fields) - set(BATCH_FIELDS) - {"tokens"})
    lengths = row_lengths({"per_token_logps": np.asarray(fields["per_token_logps"])})  # a number: 0 dims
    checks.price(lengths, sum(isinstance(v, np.ndarray) for k, v in fields.items() if k != "tokens"), None)
    return CheckedRequest(fields, lengths, None, ignored)


def json_file_fields(filename: str, data: bytes) -> dict[str, Any] | None:
    """An uploaded ``.json`` file's fields, its per-token ones as ``Flat`` arrays read straight from
    the text (``grpo.io.read_arrays``), for ``read_request``; None for any other file or text, which
    ``grpo.io.load_file`` reads."""
    if not filename.lower().endswith(".json"):
        return None
    fast = read_arrays(data, PER_TOKEN_KEYS)
    if fast is None:
        return None
    fields = fast[0] | {key: Flat(*a) for key, a in fast[1].items()}
    names = [ALIASES.get(key, key) for key in fields]
    if len(set(names)) != len(names):  # a name beside its alias: the exact reader says which, in the text's order
        return None
    return canonical(fields)
