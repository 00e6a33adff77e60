"""The app's side of the road from a request's bytes to its checked batch (``grpo.road``): the schema's checks
of the fields beside the per-token ones (pydantic, with the per-token fields swapped for tiny placeholders, so
its errors are its own, naming the field, the row and the position), and the price.

Before any (B, T) array is allocated, the request's cost is checked: B x T_max padded positions
(a ragged batch is padded to its longest row) and an estimate of the bytes it will take. The same price
picks the lane: work priced past the cheap limits stops where it runs as cheap work (``Costly``) and
``app.lanes`` starts it again in the costly lane. An uploaded file is priced from its headers before
anything in it is unpacked (``load_upload``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

import grpo
from app.errors import BODY_EXPECTED, LimitError, Loc, error_item, invalid
from app.memory import pages_for_work
from app.settings import Settings
from grpo.io import HELD_BYTES, UnpackLimitError, file_shapes, load_file, parse_json
from grpo.road import CheckedRequest, FlatRefused, read_request

# Bytes one padded position costs: each given per-token field as a float64 (B, T) array, the mask,
# and evaluate's working set (about 40 (B, T) tensors with autograd's, measured with bench/api.py's
# largest request), in the dtype it computes in.
INPUT_BYTES = 8
EVALUATE_BYTES = {"float32": 160, "float64": 320}
MB = 1024 * 1024


Prepared = CheckedRequest  # a request checked and priced (grpo.road): what the routes evaluate


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
    that must stay in this process). A worker's job this costly may go on in small pages (``pages_for_work``)."""
    pages_for_work(cost)
    if cost > limit and in_cheap_lane():
        raise Costly(f"{what}: priced at {cost // MB} MB, past {limit // MB} MB", here)


def check_cost(
    lengths: Sequence[int] | np.ndarray, fields: int, dtype: str, settings: Settings, copies: int = 1, **output: Any
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


class ModelChecks:
    """The road's ``Checks`` (``grpo.road``) for a request of ``model``: its fields beside the per-token ones
    through pydantic (locs under ``root``), the price through the settings (``copies`` configs, in ``dtype``:
    default the request's own config's)."""

    def __init__(self, model: type[BaseModel], settings: Settings, root: Loc, copies: int = 1, dtype: str = "") -> None:
        self.model, self.settings, self.root, self.copies, self.dtype = model, settings, root, copies, dtype

    def not_json(self, exc: ValueError) -> Exception:
        msg = f"JSON decode error ({str(exc)[:200]}): {BODY_EXPECTED}"
        return invalid([error_item(self.root, msg, "json_invalid")])

    def others(self, body: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        checked = validated(self.model, body, self.root)  # rewards, config, tokens, ...: pydantic's checks and errors
        return checked, checked.batch_fields()

    def whole(self, body: Any) -> tuple[Any, dict[str, Any]]:
        if not isinstance(body, dict):
            msg = f"Input should be a valid dictionary or object to extract fields from, got {type(body).__name__}"
            raise invalid([error_item(self.root, msg, "model_attributes_type")])
        return self.others(body)

    def price(self, lengths: Sequence[int] | np.ndarray, grids: int, checked: Any) -> None:
        check_cost(lengths, grids, self.dtype or _dtype(getattr(checked, "config", None)), self.settings, self.copies)


def prepare(
    body: Any,
    model: type[BaseModel],
    settings: Settings,
    root: Loc | None = None,
    copies: int = 1,
    dtype: str = "",
    from_file: bool = False,
) -> Prepared:
    """A request body (parsed JSON, or a file's fields: ``from_file``) -> checked batch fields, its per-token fields
    as padded (B, T) arrays (``grpo.road.read_request``). Per-token fields read straight from a .json file's text
    (``grpo.road.json_file_fields``) that the vectorised checks refuse raise ``NotFast``: the caller reads the file
    exactly."""
    return read_request(body, ModelChecks(model, settings, list(root or ["body"]), copies, dtype), from_file)


NotFast = FlatRefused  # fields read by ``json_file_fields`` that the vectorised checks refuse: read the file exactly


def prepare_json(
    data: bytes, model: type[BaseModel], settings: Settings, root: Loc | None = None, copies: int = 1
) -> Prepared:
    """A JSON body -> ``prepare``'s answer; the per-token fields go from the text straight into arrays
    (no Python float per number) where the text allows, else the body is read by ``read_json``."""
    return read_request(data, ModelChecks(model, settings, list(root or ["body"]), copies))


def _dtype(config: Any) -> str:
    """The compute dtype a request asks for (the presets compute in float32)."""
    dtype = getattr(config, "dtype", None) if config is not None else None
    return str(dtype) if dtype else "float32"
