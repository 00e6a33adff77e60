"""NPZ files (read with ``allow_pickle=False``): every read entry's .npy header checked and priced first."""

from __future__ import annotations

import io
import math
import zipfile
from typing import Any

import numpy as np
import torch

from grpo import export
from grpo.errors import GrpoInputError
from grpo.io.formats import MAX_UNPACKED_BYTES, UploadFormat, zip_members
from grpo.io.pricing import STRING_BYTES, Budget, price, reads
from grpo.io.pt_files import is_pt
from grpo.io.tensors import INT64_MAX, from_tensors


def _is_npz(data: bytes) -> bool:
    names = zip_members(data)
    return bool(names) and not is_pt(data) and all(name.endswith(".npy") for name in names or ())


NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
NUMERIC = "a numeric array (bool, integers, floats of 16, 32 or 64 bits)"


def _read_npz(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    """Named arrays: every read entry's .npy header checked and priced before any entry is unpacked; an
    entry no field reads is never opened."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = _npz_entries(archive, max_bytes)
            arrays = {name: None if info is None else _npy(archive, info, name) for name, info in entries.items()}
    except GrpoInputError:
        raise
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as exc:  # not a zip, a member cut short
        raise GrpoInputError("file", "an NPZ archive (a zip of .npy arrays), whole", got=str(exc)[:200]) from exc
    tokens = arrays.pop("tokens", None)
    out = from_tensors({k: None if v is None else torch.from_numpy(v) for k, v in arrays.items()})
    if tokens is not None:  # display strings: a 2-D unicode array (no pickle needed)
        out["tokens"] = tokens.tolist()
    return out


def _npz_entries(archive: zipfile.ZipFile, max_bytes: int) -> dict[str, zipfile.ZipInfo | None]:
    """{array name: its zip entry, None where no field reads it}, each read entry's header checked and priced.

    numpy allocates what a header says before reading: a 328-byte file claiming 10^10 elements would
    ask for 80 GB, so the header's shape x itemsize must equal the entry's size after its header, and
    that size comes from the zip's directory (zipfile never yields more than it)."""
    infos = archive.infolist()
    names = [info.filename.removesuffix(".npy") for info in infos]
    if len(set(names)) != len(names):
        raise GrpoInputError("file", "an NPZ naming each array once")
    budget = Budget(max_bytes)
    out: dict[str, zipfile.ZipInfo | None] = {}
    for name, info in zip(names, infos, strict=True):
        out[name] = info if reads(name, names) else None
        if out[name] is None:
            continue
        shape, dtype = _npy_header(archive, info, name)
        values = math.prod(shape)
        if name == "tokens":
            if dtype.kind != "U" or len(shape) != 2:
                raise GrpoInputError("tokens", "a 2-D array of strings", got=f"{dtype} of {len(shape)} dims")
            budget.add(name, values * (dtype.itemsize + STRING_BYTES), f"{values} strings")
            continue
        if dtype.kind not in "biuf" or (dtype.kind == "f" and dtype.itemsize not in (2, 4, 8)):
            raise GrpoInputError(name, NUMERIC, got=str(dtype))
        budget.add(name, price(values, values * dtype.itemsize), f"{values} values of {dtype}")
    return out


def _npz_shapes(data: bytes) -> dict[str, tuple[int, ...]]:
    """The read arrays' shapes from their .npy headers: each member's first bytes, not its data, decompressed."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            names = [info.filename.removesuffix(".npy") for info in infos]
            read = [(name, info) for name, info in zip(names, infos, strict=True) if reads(name, names)]
            return {name: _npy_header(archive, info, name)[0] for name, info in read}
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return {}


def _npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """An entry's (shape, dtype), read from its header alone and held to the entry's size."""
    with archive.open(info) as member:
        try:
            version = np.lib.format.read_magic(member)
            if version not in NPY_HEADERS:
                raise ValueError(f"unknown .npy version {version}")
            shape, _, dtype = NPY_HEADERS[version](member, max_header_size=10_000)
        except ValueError as exc:
            raise GrpoInputError("file", f"a valid .npy header in {info.filename}", got=str(exc)[:200]) from exc
        data_bytes = info.file_size - member.tell()
    if dtype.hasobject:
        raise GrpoInputError("file", "an NPZ of numeric arrays (object arrays need pickle and are refused)")
    claimed = math.prod(shape) * dtype.itemsize
    if claimed != data_bytes:
        expected = f"a .npy header that matches its data ({data_bytes} bytes)"
        raise GrpoInputError(name, expected, got=f"shape {shape} of {dtype} ({claimed} bytes)")
    return shape, dtype


def _npy(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> np.ndarray:
    """An entry's array, C-ordered in native byte order (a big-endian or Fortran-ordered array is copied)."""
    with archive.open(info) as member:
        array = np.lib.format.read_array(member, allow_pickle=False, max_header_size=10_000)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if array.dtype.kind == "u" and array.dtype.itemsize > 1:  # torch reads unsigned bytes only
        if array.size and int(array.max()) > INT64_MAX:
            raise GrpoInputError(name, "integers within int64", got=f"{int(array.max())}")
        array = array.astype(np.int64)
    return np.ascontiguousarray(array).reshape(array.shape)  # reshape: ascontiguousarray makes a 0-d array 1-d


NPZ = UploadFormat(
    "npz",
    "NPZ",
    ("npz",),
    "npz",
    _read_npz,
    export.to_npz,
    light=True,
    sniffer=_is_npz,
    content_doc="an NPZ archive (a zip of .npy arrays)",
    shapes=_npz_shapes,
)
