"""Request bodies -> checked batch fields, fast: orjson, NumPy, and pydantic for the small fields.

A 256 x 4096 batch is a million numbers per field: a pydantic object per row and a check per
number cost seconds. Here the per-token fields are converted with NumPy (one flat array per field)
and checked with vectorised comparisons; the other fields (rewards, config, tokens, ...) go
through the pydantic model with the per-token fields swapped for tiny placeholders, so their
errors are pydantic's own. When a vectorised check fails, the whole body goes through the model,
whose error names the field, the row and the position, exactly as before.

Before any (B, T) array is allocated, the request's cost is checked: B x T_max padded positions
(a ragged batch is padded to its longest row) and an estimate of the bytes it will take. The same price
picks the lane: work priced past the cheap limits stops where it runs as cheap work (``Costly``) and
``app.lanes`` starts it again in the costly lane.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

import grpo
from app.errors import BODY_EXPECTED, LimitError, Loc, error_item, invalid
from app.settings import Settings
from grpo.fields import ALIASES, BATCH_FIELDS, BatchField, fields_of, given_per_token, names_of
from grpo.io import HELD_BYTES, UnpackLimitError, canonical, file_shapes, load_file, parse_json, read_arrays
from grpo.requests import PER_TOKEN_OK, Flat, padded_fields, within_bounds

# The per-token fields (grpo's batch-field table: their bounds, 0/1 or not, NaN allowed or not).
PER_TOKEN: dict[str, BatchField] = {name: BATCH_FIELDS[name] for name in fields_of("token")}
# One value inside each field's bounds: the model checks the other fields with these in the per-token ones' place.
PLACEHOLDER = {name: [[min(max(1.0 if f.dtype == "mask" else 0.0, f.low), f.high)]] for name, f in PER_TOKEN.items()}
NAMES = {name: names_of(name) for name in PER_TOKEN}
PER_TOKEN_KEYS = frozenset(chain.from_iterable(NAMES.values()))

# Bytes one padded position costs: each given per-token field as a float64 (B, T) array, the mask,
# and evaluate's working set (about 40 (B, T) tensors with autograd's, measured with bench/api.py's
# largest request), in the dtype it computes in.
INPUT_BYTES = 8
EVALUATE_BYTES = {"float32": 160, "float64": 320}
MB = 1024 * 1024


@dataclass
class Prepared:
    """A checked request: batch fields (2-D arrays or request lists), row lengths, the model's other fields."""

    fields: dict[str, Any]
    lengths: list[int]
    model: Any
    extra: dict[str, Any] = field(default_factory=dict)


def read_json(data: bytes | str, loc: Loc) -> Any:
    """JSON text -> values, or a 422 at ``loc`` saying what was expected."""
    try:
        return parse_json(data)
    except ValueError as exc:
        msg = f"JSON decode error ({str(exc)[:200]}): {BODY_EXPECTED}"
        raise invalid([error_item(loc, msg, "json_invalid")]) from exc


def validated(model: type[BaseModel], data: Any, root: Loc) -> Any:
    """``model`` from ``data``, or a 422 whose locs start with ``root`` (where the data came from)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise invalid([{**e, "loc": [*root, *e["loc"]]} for e in exc.errors()]) from exc
    except RecursionError as exc:  # orjson keeps nesting under 1024; a Python caller may not
        raise invalid([error_item(root, "nesting too deep", "json_invalid")]) from exc


class Costly(Exception):
    """Work priced past what the small-request threads take, raised where its price is known and before its
    costly part: ``app.lanes`` starts it again in the costly lane. ``here``: it must stay in this process
    (a run zip: the store's disk claims are this process's), so it goes to the costly threads (niced)."""

    def __init__(self, what: str, here: bool = False) -> None:
        super().__init__(what)
        self.here = here


_LANE = threading.local()  # ``cheap``: this thread runs work that leaves its lane once priced costly


@contextmanager
def cheap_work() -> Iterator[None]:
    """Run the body as cheap work (the small-request threads, the large lane's): a price past the cheap limits
    raises ``Costly``."""
    _LANE.cheap = True
    try:
        yield
    finally:
        _LANE.cheap = False


def in_cheap_lane() -> bool:
    return bool(getattr(_LANE, "cheap", False))


def price(cost: int, limit: int, what: str, here: bool = False) -> None:
    """``Costly`` when work priced at ``cost`` bytes is past ``limit`` and runs as cheap work (``here``: work
    that must stay in this process)."""
    if cost > limit and in_cheap_lane():
        raise Costly(f"{what}: priced at {cost // MB} MB, past {limit // MB} MB", here)


class _NeedsModel(Exception):
    """The fast path cannot decide: the model validates the whole body (and names the error)."""


NUMBER_TYPES = (float, int)  # what a JSON number reads as (bool is an int's subclass, not one of these types)


def _flat(rows: Any, field: BatchField) -> tuple[np.ndarray, np.ndarray]:
    """Ragged rows -> (flat float64 values, row lengths), checked; ``_NeedsModel`` when anything is off."""
    if isinstance(rows, Flat):
        flat, lengths = rows
        if not len(lengths):
            raise _NeedsModel
    elif type(rows) is not list or not rows or any(type(r) is not list for r in rows):
        raise _NeedsModel
    else:
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        if not all(type(v) in NUMBER_TYPES for v in chain.from_iterable(rows)):  # true, "0.5": not JSON numbers
            raise _NeedsModel  # the model names the value
        try:
            flat = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=int(lengths.sum()))
        except (TypeError, ValueError, OverflowError):
            raise _NeedsModel from None
    if not within_bounds(field, flat):  # the model names the value and its position
        raise _NeedsModel
    return flat, lengths


def check_cost(
    lengths: list[int] | np.ndarray, fields: int, dtype: str, settings: Settings, copies: int = 1, **output: Any
) -> None:
    """413 when the padded grid (B x T_max positions) or its estimated memory is past the settings;
    ``output``: what the answer takes beyond evaluating, as ``check_padded`` takes it. Within the limits, work
    priced past ``cheap_request_bytes`` leaves the lane of cheap work (``Costly``)."""
    estimate = check_padded(len(lengths), int(max(lengths, default=0)), fields, dtype, settings, copies, **output)
    price(estimate, settings.cheap_request_bytes, "the request's working memory")


def check_padded(
    B: int,
    T: int,
    fields: int,
    dtype: str,
    settings: Settings,
    copies: int = 1,
    output_bytes: int = 0,
    output: str = "",
    output_loc: Loc | None = None,
) -> int:
    """413 when B rows padded to T positions (x ``copies`` configs), or their estimated memory, are past the
    settings. ``output_bytes``: memory the answer takes beyond evaluating (an exported file and its copies),
    ``output`` what it is, for the message; ``output_loc`` the field a memory 413 names (default:
    per_token_logps, whose rows make the grid). Returns the estimate: the work's price in bytes."""
    padded = B * T * copies
    estimate = B * T * (INPUT_BYTES * (fields + 1) + EVALUATE_BYTES.get(dtype, 320) * copies) + output_bytes
    what = f"{B} rows padded to the longest ({T} positions): {B * T} positions"
    if copies > 1:
        what += f" x {copies} configs"
    if padded > settings.max_tokens:
        raise LimitError(
            ["body", "per_token_logps"],
            f"{what}; at most {settings.max_tokens} padded positions per request (a setting)",
        )
    if estimate > settings.max_request_bytes:
        of_it = f" ({output_bytes // MB} MB of it for {output})" if output else ""
        raise LimitError(
            output_loc or ["body", "per_token_logps"],
            f"{what} would take about {estimate // MB} MB to compute{of_it}; at most "
            f"{settings.max_request_bytes // MB} MB per request (a setting)",
        )
    return estimate


def load_upload(filename: str, data: bytes, settings: Settings) -> dict[str, Any]:
    """An uploaded file's fields (``grpo.io.load_file``), priced before anything is unpacked: a file whose
    read fields would unpack past ``max_unpacked_bytes`` is a 413 naming the entry that passed it. As cheap
    work (``cheap_work``) it is read under ``cheap_unpack_bytes``: a file priced past that (from its headers,
    nothing unpacked yet) is ``Costly``, and the costly lane reads it under the whole limit. Its padded positions
    are priced from its headers first (``check_file_grid``)."""
    check_file_grid(file_shapes(filename, data), settings)
    cheap = in_cheap_lane() and settings.cheap_unpack_bytes < settings.max_unpacked_bytes
    try:
        return load_file(filename, data, settings.cheap_unpack_bytes if cheap else settings.max_unpacked_bytes)
    except UnpackLimitError as exc:
        if cheap:
            raise Costly(f"{filename}: {exc}") from None
        raise LimitError(["body", "file", exc.field], str(exc)) from exc


def check_file_grid(shapes: dict[str, tuple[int, ...]], settings: Settings) -> None:
    """A binary file's padded grid, priced from its headers' shapes (``grpo.io.file_shapes``) before anything
    is unpacked: 413 past ``max_tokens`` or ``max_request_bytes`` (as ``check_padded`` words it, at the
    float32 the presets compute in: the least a request may cost), ``Costly`` past ``cheap_request_bytes``.
    A file of logits is priced by its bytes alone (its completion is known once its prompt length is read), as is
    one whose values alone are past ``max_unpacked_bytes``: its reader refuses it from its headers, naming the entry."""
    logp = shapes.get("per_token_logps")
    held = sum(math.prod(shape) for shape in shapes.values()) * HELD_BYTES  # the least the reader prices it at
    if logp is None or "logits" in shapes or held > settings.max_unpacked_bytes:
        return
    if len(logp) != 2:
        raise grpo.GrpoInputError("per_token_logps", "a 2-D array (B rows, T tokens)", got=f"{len(logp)} dims")
    grids = sum(len(shape) > 0 for name, shape in shapes.items() if name != "tokens")
    price(check_padded(logp[0], logp[1], grids, "float32", settings), settings.cheap_request_bytes, "the file's grid")


def check_file_size(size: int, what: str, settings: Settings, loc: Loc | None = None) -> None:
    """413 when a file to be written (an export of ``size`` bytes at most) is past ``max_unpacked_bytes``, the
    budget its upload would be read under: an export never builds a file the upload would refuse."""
    if size > settings.max_unpacked_bytes:
        raise LimitError(
            loc or ["body", "per_token_logps"],
            f"{what} of up to {size // MB} MB (every field padded to the longest row, NPZ's display strings to the "
            f"longest string); at most {settings.max_unpacked_bytes // MB} MB per file (a setting)",
        )


def prepare(
    body: Any, model: type[BaseModel], settings: Settings, root: Loc | None = None, copies: int = 1, dtype: str = ""
) -> Prepared:
    """A request body (parsed JSON) -> checked batch fields, its per-token fields as padded (B, T) arrays.

    Per-token fields may come as ``Flat`` arrays (``json_file_fields``); the exact reader is then the
    caller's to run when they are refused (``NotFast``)."""
    root = list(root or ["body"])
    if not isinstance(body, dict):
        msg = f"Input should be a valid dictionary or object to extract fields from, got {type(body).__name__}"
        raise invalid([error_item(root, msg, "model_attributes_type")])
    try:
        return _fast(body, model, settings, root, copies, dtype)
    except _NeedsModel:
        if any(isinstance(v, Flat) for v in body.values()):
            raise NotFast from None
        return _slow(body, model, settings, root, copies)


class NotFast(Exception):
    """Fields read by ``json_file_fields`` that the vectorised checks refuse: read the file exactly."""


def json_file_fields(filename: str, data: bytes) -> dict[str, Any] | None:
    """An uploaded ``.json`` file's fields, its per-token ones as ``Flat`` arrays read straight from
    the text (``grpo.io.read_arrays``); None for any other file or text, which ``load_file`` reads."""
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


def prepare_json(
    data: bytes, model: type[BaseModel], settings: Settings, root: Loc | None = None, copies: int = 1
) -> Prepared:
    """A JSON body -> ``prepare``'s answer; the per-token fields go from the text straight into arrays
    (no Python float per number) where the text allows, else the body is read by ``read_json``."""
    root = list(root or ["body"])
    fast = read_arrays(data, PER_TOKEN_KEYS)
    if fast is not None:
        rest, arrays = fast
        try:
            return _fast(rest | {key: Flat(*a) for key, a in arrays.items()}, model, settings, root, copies)
        except _NeedsModel:  # a value the vectorised checks refuse: the exact reader names it
            pass
        del fast, rest, arrays
    return prepare(read_json(data, root), model, settings, root, copies)


def _fast(
    body: dict[str, Any], model: type[BaseModel], settings: Settings, root: Loc, copies: int, dtype: str = ""
) -> Prepared:
    """``prepare`` with the per-token fields checked vectorised; ``_NeedsModel`` when they must go through the model."""
    given = {name: [k for k in keys if body.get(k) is not None] for name, keys in NAMES.items()}
    if any(len(keys) > 1 for keys in given.values()):
        raise _NeedsModel
    keys = {name: keys[0] for name, keys in given.items() if keys}
    rest = {**body, **{key: PLACEHOLDER[name] for name, key in keys.items()}}
    checked = validated(model, rest, root)  # rewards, config, tokens, ...: pydantic's checks and errors
    flats = {name: _flat(body[key], PER_TOKEN[name]) for name, key in keys.items()}
    if "per_token_logps" not in flats:
        raise _NeedsModel
    lengths = flats["per_token_logps"][1]
    if lengths.min() == 0:
        raise _NeedsModel
    config = getattr(checked, "config", None)
    fields = checked.batch_fields()
    grids = len(flats) + sum(given_per_token(name, fields.get(name)) for name in PER_TOKEN_OK)  # advantages (B, T)
    check_cost(lengths, grids, dtype or _dtype(config), settings, copies)
    fields |= {name: Flat(*pair) for name, pair in flats.items()}
    return Prepared(padded_fields(fields, lengths, list(flats)), [int(n) for n in lengths], checked)


def _dtype(config: Any) -> str:
    """The compute dtype a request asks for (the presets compute in float32)."""
    dtype = getattr(config, "dtype", None) if config is not None else None
    return str(dtype) if dtype else "float32"


def _slow(body: dict[str, Any], model: type[BaseModel], settings: Settings, root: Loc, copies: int) -> Prepared:
    """The whole body through the model: its errors name the field, row and position; ragged lists out."""
    checked = validated(model, body, root)
    fields = checked.batch_fields()
    lengths = [len(r) for r in fields["per_token_logps"]]
    given = [n for n in PER_TOKEN if fields.get(n) is not None]
    check_cost(lengths, len(given), _dtype(getattr(checked, "config", None)), settings, copies)
    return Prepared(fields, lengths, checked)
