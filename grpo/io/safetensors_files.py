"""safetensors files: named tensors, priced from the header before the library unpacks them."""

from __future__ import annotations

import math
from typing import Any

import orjson

from grpo import export
from grpo.errors import GrpoInputError
from grpo.io.formats import MAX_UNPACKED_BYTES, UploadFormat
from grpo.io.pricing import Budget, price, reads
from grpo.io.tensors import from_tensors


def _is_safetensors(data: bytes) -> bool:
    return len(data) >= 9 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") <= len(data) - 8


def _read_safetensors(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    """Named tensors, priced from the header first (nothing in a safetensors file is compressed, but a
    byte of a bool mask becomes eight as float64)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    header = _safetensors_header(data)
    budget = Budget(max_bytes)
    for name, (dtype, shape, nbytes) in header.items():
        if reads(name, header):
            budget.add(name, price(math.prod(shape), nbytes), f"{math.prod(shape)} values of {dtype}")
    try:
        tensors = load(data)
    except SafetensorError as exc:
        raise GrpoInputError("file", "a valid safetensors file", got=str(exc)) from exc
    return from_tensors({name: t if reads(name, tensors) else None for name, t in tensors.items()})


def _safetensors_header(data: bytes) -> dict[str, tuple[str, list[int], int]]:
    """{name: (dtype, shape, bytes)} from a safetensors header; {} where it cannot be read (the library
    then says why)."""
    try:
        header = orjson.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
        return {
            str(name): (
                str(e["dtype"]),
                [int(n) for n in e["shape"]],
                int(e["data_offsets"][1]) - int(e["data_offsets"][0]),
            )
            for name, e in header.items()
            if name != "__metadata__"
        }
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError, IndexError):
        return {}


def _safetensors_shapes(data: bytes) -> dict[str, tuple[int, ...]]:
    header = _safetensors_header(data)
    return {name: tuple(shape) for name, (_, shape, _) in header.items() if reads(name, header)}


SAFETENSORS = UploadFormat(
    "safetensors",
    "safetensors",
    ("safetensors",),
    "safetensors",
    _read_safetensors,
    export.to_safetensors,
    light=True,
    sniffer=_is_safetensors,
    content_doc="a safetensors file",
    shapes=_safetensors_shapes,
)
