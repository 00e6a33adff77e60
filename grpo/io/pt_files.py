"""torch.save's .pt files: the zip's pickle read with stand-ins for every global (nothing unpickled or run)."""

from __future__ import annotations

import io
import math
import pickle
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo.errors import GrpoInputError
from grpo.io.formats import MAX_UNPACKED_BYTES, UploadFormat, zip_members
from grpo.io.pricing import PICKLE_BYTES, Budget, price, reads
from grpo.io.tensors import INT64_MAX, READ_DTYPES, REAL, from_tensors


def is_pt(data: bytes) -> bool:
    names = zip_members(data)
    return names is not None and any(name == "data.pkl" or name.endswith("/data.pkl") for name in names)


# --- .pt: torch.save's zip, read without running its pickle ------------------------------------------
# The pickle is read by an unpickler whose globals are stand-ins: nothing is imported or called, and a
# tensor comes back as the call that would rebuild it (storage, offset, size, stride). Those of the
# names read are checked and priced before a storage is unpacked, and only their storages are.
PT = "a .pt file of plain tensors (torch.save's zip; what torch.load(weights_only=True) reads)"
PLAIN = "a plain tensor (what torch.load(weights_only=True) reads)"


@dataclass(frozen=True)
class _Global:
    """A global the pickle names, never imported: calling it records the call."""

    name: str

    def __call__(self, *args: Any) -> _Call:
        return _Call(self.name, args)


@dataclass
class _Call:
    """A call the pickle asks for (a tensor's rebuild), never made; ``state`` what the pickle set on it."""

    name: str
    args: tuple[Any, ...]
    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


@dataclass(frozen=True)
class _Storage:
    """A storage the pickle refers to: its class (``torch.FloatStorage``), its entry's key, its size in values."""

    kind: str
    key: str
    numel: int


class _Dict(dict[Any, Any]):
    """``collections.OrderedDict``'s stand-in: a dict that takes attributes (a state dict's ``_metadata``)."""


class _PtUnpickler(pickle._Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _Dict if (module, name) == ("collections", "OrderedDict") else _Global(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Global):
            key, numel = pid[2], pid[4]
            if isinstance(key, str) and key.isalnum() and type(numel) is int and numel >= 0:
                return _Storage(pid[1].name, key, numel)
        raise pickle.UnpicklingError("a storage as torch.save refers to it")


STORAGE_DTYPES = {
    f"torch.{kind}Storage": dtype
    for kind, dtype in {
        "Bool": torch.bool, "Byte": torch.uint8, "Char": torch.int8, "Short": torch.int16, "Int": torch.int32,
        "Long": torch.int64, "Half": torch.float16, "BFloat16": torch.bfloat16, "Float": torch.float32,
        "Double": torch.float64,
    }.items()
}  # fmt: skip
DTYPE_NAMES = {f"torch.{str(dtype).removeprefix('torch.')}": dtype for dtype in READ_DTYPES}
TENSOR_TYPES = {"torch._tensor.Tensor", "torch.Tensor", "torch.nn.parameter.Parameter"}
MAX_DIMS = 8  # a batch field has at most 3 (logits)
REBUILDS = {  # what the other rebuilds torch pickles make, for the error
    "torch._utils._rebuild_sparse_tensor": "a sparse tensor",
    "torch._utils._rebuild_sparse_csr_tensor": "a sparse tensor",
    "torch._utils._rebuild_qtensor": "a quantized tensor",
    "torch._utils._rebuild_meta_tensor_no_storage": "a meta tensor (no values)",
    "torch._utils._rebuild_nested_tensor": "a nested tensor",
    "torch._utils._rebuild_wrapper_subclass": "a tensor subclass",
    "__builtin__.complex": "a complex number (its imaginary part would be lost)",
    "builtins.complex": "a complex number (its imaginary part would be lost)",
}


@dataclass(frozen=True)
class _View:
    """A tensor as the pickle describes it: ``size`` values at ``stride`` from ``offset`` in a storage."""

    storage: _Storage
    dtype: torch.dtype
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]

    def values(self) -> int:
        return math.prod(self.size)

    def storage_values(self) -> int:
        """The storage's size in values: a typed storage counts values, an untyped one (``_v3``'s) bytes."""
        return self.storage.numel if self.storage.kind in STORAGE_DTYPES else self.storage.numel // self.dtype.itemsize


def _read_pt(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    """Named tensors (and numbers) from torch.save's zip: its pickle read by ``_PtUnpickler`` (nothing in it
    runs), the views of the fields read checked and priced, then only their storages unpacked."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise GrpoInputError("file", PT, got="no zip") from exc
    with archive:
        pickles = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise GrpoInputError("file", PT, got=f"{len(pickles)} data.pkl entries")
        prefix, budget = pickles[0].removesuffix("data.pkl"), Budget(max_bytes)
        budget.add("data.pkl", archive.getinfo(pickles[0]).file_size * PICKLE_BYTES, "the pickle")
        try:
            loaded = _PtUnpickler(io.BytesIO(archive.read(pickles[0]))).load()
        except Exception as exc:  # anything the stand-ins cannot take: refused, nothing ran
            raise GrpoInputError("file", PT, got=type(exc).__name__) from exc
        if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
            raise GrpoInputError("file", "a .pt file holding a dict of named tensors")
        wanted = {name: _pt_value(name, v) for name, v in loaded.items() if reads(name, loaded)}
        for name, value in wanted.items():
            if isinstance(value, _View):
                nbytes = _storage_entry(archive, prefix, value, name).file_size
                dtype = str(value.dtype).removeprefix("torch.")
                budget.add(name, price(value.values(), nbytes), f"{value.values()} values of {dtype}")
        swap = _big_endian(archive, prefix)
        tensors = {n: v if isinstance(v, Tensor) else _pt_tensor(archive, prefix, v, swap) for n, v in wanted.items()}
    return from_tensors({name: tensors.get(name) for name in loaded})


PT_SHAPES_PICKLE_BYTES = 1024 * 1024  # a larger pickle is priced by the reader, not read twice


def _pt_shapes(data: bytes) -> dict[str, tuple[int, ...]]:
    """The read tensors' shapes from the pickle (read by ``_PtUnpickler``, as the reader reads it): no storage
    is decompressed."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            pickles = [n for n in archive.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
            if len(pickles) != 1 or archive.getinfo(pickles[0]).file_size > PT_SHAPES_PICKLE_BYTES:
                return {}
            loaded = _PtUnpickler(io.BytesIO(archive.read(pickles[0]))).load()
    except Exception:  # anything the stand-ins cannot take: the reader refuses it and says why
        return {}
    if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
        return {}
    wanted = {name: _pt_value(name, v) for name, v in loaded.items() if reads(name, loaded)}
    return {name: v.size if isinstance(v, _View) else tuple(v.shape) for name, v in wanted.items()}


def _pt_value(name: str, value: Any) -> _View | Tensor:
    """A read entry of the pickle's dict: a number as a 0-d tensor, a tensor as its checked ``_View``."""
    if isinstance(value, bool | int | float):
        if isinstance(value, int) and not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise GrpoInputError(name, "an integer within int64", got=f"an integer of {value.bit_length()} bits")
        return torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else None)
    for _ in range(4):  # a Parameter, or a tensor with attributes, wraps the plain rebuild
        if not isinstance(value, _Call):
            break
        args = value.args
        if value.name.startswith("torch._utils._rebuild_parameter") and args:
            value = args[0]
        elif value.name == "torch._tensor._rebuild_from_type_v2" and len(args) == 4 and _is_tensor_type(args):
            value = args[0](*args[2])
        else:
            break
    if not isinstance(value, _Call):
        got = value.name if isinstance(value, _Global) else type(value).__name__.lstrip("_")
        raise GrpoInputError(name, "a tensor or a number", got=got)
    return _view(name, value)


def _is_tensor_type(args: tuple[Any, ...]) -> bool:
    return (
        isinstance(args[0], _Global)
        and isinstance(args[1], _Global)
        and args[1].name in TENSOR_TYPES
        and isinstance(args[2], tuple)
    )


def _view(name: str, call: _Call) -> _View:
    """The view ``_rebuild_tensor_v2`` (a typed storage) or ``_v3`` (an untyped one and a dtype) would make."""
    if call.name == "torch._utils._rebuild_tensor_v2" and len(call.args) in (6, 7):
        storage, offset, size, stride = call.args[:4]
        dtype = STORAGE_DTYPES.get(getattr(storage, "kind", ""))
        metadata = call.args[6] if len(call.args) == 7 else None
    elif call.name == "torch._utils._rebuild_tensor_v3" and len(call.args) in (7, 8):
        storage, offset, size, stride = call.args[:4]
        dtype = (
            DTYPE_NAMES.get(getattr(call.args[6], "name", ""))
            if getattr(storage, "kind", "").endswith("UntypedStorage")
            else None
        )
        metadata = call.args[7] if len(call.args) == 8 else None
    elif call.name in REBUILDS:
        raise GrpoInputError(name, REAL, got=REBUILDS[call.name])
    else:
        raise GrpoInputError(name, PLAIN, got=call.name)
    if dtype is None:
        kind = getattr(storage, "kind", "") or getattr(call.args[6], "name", "")
        lost = " (its imaginary part would be lost)" if "Complex" in kind or "complex" in kind else ""
        raise GrpoInputError(name, REAL, got=f"{kind.removeprefix('torch.')}{lost}")
    ok = isinstance(storage, _Storage) and isinstance(size, tuple) and isinstance(stride, tuple)
    ok = ok and len(size) == len(stride) <= MAX_DIMS
    if not ok or not all(type(n) is int and 0 <= n <= INT64_MAX for n in (offset, *size, *stride)):
        raise GrpoInputError(name, "a tensor as torch.save writes it", got=f"a view ({offset}, {size}, {stride})")
    if metadata:  # a lazily negated or conjugated view: its values are not what its storage holds
        raise GrpoInputError(name, REAL, got=f"a tensor with flags {metadata}")
    view = _View(storage, dtype, offset, size, stride)
    if view.values() and offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) >= view.storage_values():
        raise GrpoInputError(name, "a view inside its storage", got=f"{size} at {offset} with strides {stride}")
    return view


def _storage_entry(archive: zipfile.ZipFile, prefix: str, view: _View, name: str) -> zipfile.ZipInfo:
    """The zip entry holding a view's storage, whose size (from the zip's directory) must be the storage's."""
    try:
        info = archive.getinfo(f"{prefix}data/{view.storage.key}")
    except KeyError:
        raise GrpoInputError(name, PT, got=f"no entry for its storage {view.storage.key}") from None
    if info.file_size != view.storage_values() * view.dtype.itemsize:
        expected = f"a storage of {view.storage_values() * view.dtype.itemsize} bytes"
        raise GrpoInputError(name, expected, got=f"{info.file_size} bytes")
    return info


def _big_endian(archive: zipfile.ZipFile, prefix: str) -> bool:
    """Whether the storages are big-endian (the file's ``byteorder`` entry; little without one)."""
    names = set(archive.namelist())
    if f"{prefix}byteorder" not in names or archive.getinfo(f"{prefix}byteorder").file_size > 16:
        return False
    order = archive.read(f"{prefix}byteorder").strip()
    if order not in (b"big", b"little"):
        raise GrpoInputError("file", "a byteorder entry of big or little", got=repr(order)[:40])
    return order == b"big"


def _pt_tensor(archive: zipfile.ZipFile, prefix: str, view: _View, swap: bool) -> Tensor:
    """A view's values, unpacked from its storage's entry (native order), as a contiguous tensor."""
    if not view.values():
        return torch.empty(view.size, dtype=view.dtype)
    info = _storage_entry(archive, prefix, view, "file")
    buffer, chunk = bytearray(info.file_size), 1 << 20
    with archive.open(info) as member:
        for start in range(0, len(buffer), chunk):  # into one buffer, a chunk at a time: no second copy
            part = member.read(chunk)
            if len(part) != min(chunk, len(buffer) - start):
                raise GrpoInputError("file", PT, got=f"a storage entry cut short at {start + len(part)} bytes")
            buffer[start : start + len(part)] = part
    if swap and view.dtype.itemsize > 1:
        np.frombuffer(buffer, dtype=f"u{view.dtype.itemsize}").byteswap(inplace=True)
    flat = torch.frombuffer(buffer, dtype=view.dtype)
    return flat.as_strided(view.size, view.stride, view.offset).contiguous()


PT_FORMAT = UploadFormat(
    "pt",
    ".pt",
    ("pt", "pth"),
    "pt",
    _read_pt,
    sniffer=is_pt,
    content_doc="a torch .pt file (a zip holding data.pkl)",
    shapes=_pt_shapes,
)
