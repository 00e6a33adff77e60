"""Batches in: the file formats and the field aliases (the JSON answers are assembled by the app).

Files: JSON (the ``/api/v1/loss`` body), JSONL (one row per line), safetensors, NPZ (read with
``allow_pickle=False``) and ``.pt`` (torch.save's zip, its pickle read with stand-ins for every global,
so it takes no more than ``torch.load(weights_only=True)`` would). Nothing is unpickled or executed.
Binary files are priced from their headers before anything is unpacked, and a tensor no field reads
is never unpacked. Named tensors use the request's names (aliases accepted); ``logits`` with
``token_ids`` (and ``prompt_length``) go through ``token_logprobs``.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import zipfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import simdjson
import torch
from torch import Tensor

from grpo import export
from grpo.errors import GrpoInputError
from grpo.fields import ALIASES, BATCH_FIELDS, fields_of
from grpo.logits import token_logprobs

LOGITS_FIELDS = ("logits", "token_ids", "ref_logits", "old_logits", "prompt_length", "temperature")


def canonical(fields: dict[str, Any]) -> dict[str, Any]:
    """The request's names for aliased keys; an alias and its name together is an error."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        name = ALIASES.get(key, key)
        if name in out:
            raise GrpoInputError(key, f"one of {name} or its alias {key}, not both")
        out[name] = value
    return out


# --- reading files --------------------------------------------------------------------------------
MAX_UNPACKED_BYTES = 256 * 1024 * 1024
"""What a file's read fields may unpack to by default (the server's setting ``max_unpacked_bytes``)."""


Reader = Callable[[bytes, int], dict[str, Any]]
"""(file bytes, max_unpacked_bytes) -> request fields (per-token values as ragged lists or 2-D arrays); a
binary format prices what its read fields would unpack to against max_unpacked_bytes before unpacking any."""
Writer = Callable[[dict[str, Any], "list[int] | None"], bytes]
"""(request fields, row lengths where the per-token fields are padded already) -> file bytes."""


@dataclass(frozen=True)
class UploadFormat:
    """A batch file format, whole: everything the readers, writers, lanes, CLI, API and page need.

    ``content`` is what its first bytes sniff as (formats may share one: JSON and JSONL), ``sniffer``
    recognises that content and ``content_doc`` names it in errors. ``light``: reading it copies numbers
    without a Python object per number, so the server reads it in a thread (no worker process). A format
    with a ``writer`` is offered as an export and has an example file (GET /api/v1/examples/{name}).
    ``shapes``: the shapes of the tensors its fields read, from its headers alone (``file_shapes``)."""

    name: str
    label: str
    suffixes: tuple[str, ...]
    content: str
    reader: Reader | None = None
    writer: Writer | None = None
    mime: str = "application/octet-stream"
    light: bool = False
    sniffer: Callable[[bytes], bool] | None = None
    content_doc: str = ""
    shapes: Callable[[bytes], dict[str, tuple[int, ...]]] | None = None


# load_file reads these; /api/v1/options lists them (the page's upload menu and accepted extensions);
# grpo.export writes those with a writer. Filled by register_format, in menu order.
UPLOAD_FORMATS: list[UploadFormat] = []
_BY_SUFFIX: dict[str, UploadFormat] = {}


def register_format(fmt: UploadFormat) -> UploadFormat:
    """Add a file format (its name and suffixes must be new): the upload, the CLI, the exports, the
    examples, the lanes and the page's menu then offer it."""
    taken = [s for s in fmt.suffixes if s in _BY_SUFFIX] + [fmt.name] * any(f.name == fmt.name for f in UPLOAD_FORMATS)
    if taken or fmt.reader is None:
        raise ValueError(f"a new format with a reader; taken: {', '.join(taken) or 'nothing'}")
    UPLOAD_FORMATS.append(fmt)
    _BY_SUFFIX.update(dict.fromkeys(fmt.suffixes, fmt))
    if fmt.writer is not None:
        export.WRITERS[fmt.name] = fmt.writer
        export.FORMATS[fmt.name] = fmt.mime
    return fmt


def file_name(stem: str, fmt: str) -> str:
    """A file name for format ``fmt`` (its first suffix): ``grpo-lens-input.npz``."""
    return f"{stem}.{next(f.suffixes[0] for f in UPLOAD_FORMATS if f.name == fmt)}"


def format_named(filename: str) -> UploadFormat:
    """The format a file's name selects (its suffix), or an error listing the formats read."""
    suffix = filename.lower().rsplit(".", 1)[-1] if "." in filename else ""
    if suffix not in _BY_SUFFIX:
        names = [f".{f.suffixes[0]}" for f in UPLOAD_FORMATS]
        raise GrpoInputError("file", f"a {', '.join(names[:-1])} or {names[-1]} file", got=repr(filename))
    return _BY_SUFFIX[suffix]


def load_file(filename: str, data: bytes, max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    """A request dict from an uploaded file; per-token values as ragged lists or 2-D arrays.

    The name's suffix says which format is expected, and the content must be that format (its
    first bytes are sniffed): a ``.pt`` under an ``.npz`` name is refused, not handed to numpy.
    Binary formats (safetensors, NPZ, torch's .pt) are priced from their headers and zip directory:
    what the fields read would unpack to, at least 8 bytes a value (``UnpackLimitError`` past
    ``max_unpacked_bytes``), before anything is decompressed; a tensor no field reads is never unpacked.
    """
    fmt = format_named(filename)
    found = sniff(data)
    if found is not None and found != fmt.content:
        suffix = filename.lower().rsplit(".", 1)[-1]
        raise GrpoInputError("file", f"{_content_doc(fmt.content)} (the name says .{suffix})", got=_content_doc(found))
    assert fmt.reader is not None  # register_format refuses a format without one
    return fmt.reader(data, max_unpacked_bytes)


def file_shapes(filename: str, data: bytes) -> dict[str, tuple[int, ...]]:
    """{field: shape} of the tensors a binary file's fields read (aliases as their fields), from its headers
    alone: nothing is decompressed, so a request can be priced by its padded positions before it is unpacked.
    {} for a format without headers (text) or headers that cannot be read: its reader then says why."""
    fmt = format_named(filename)
    if fmt.shapes is None or sniff(data) != fmt.content:
        return {}
    shapes = fmt.shapes(data)
    names = [ALIASES.get(name, name) for name in shapes]
    return dict(zip(names, shapes.values(), strict=True)) if len(set(names)) == len(names) else {}


def _content_doc(content: str) -> str:
    return next(f.content_doc for f in UPLOAD_FORMATS if f.content == content and f.content_doc)


def sniff(data: bytes) -> str | None:
    """The content of ``data`` from its first bytes (json, safetensors, npz, pt, a plugin's), None when unknown."""
    return next((f.content for f in UPLOAD_FORMATS if f.sniffer is not None and f.sniffer(data)), None)


def _zip_members(data: bytes) -> list[str] | None:
    """The member names of a zip file, None when ``data`` is no zip."""
    if data[:4] != b"PK\x03\x04":
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None


def _is_pt(data: bytes) -> bool:
    names = _zip_members(data)
    return names is not None and any(name == "data.pkl" or name.endswith("/data.pkl") for name in names)


def _is_npz(data: bytes) -> bool:
    names = _zip_members(data)
    return bool(names) and not _is_pt(data) and all(name.endswith(".npy") for name in names or ())


def _is_safetensors(data: bytes) -> bool:
    return len(data) >= 9 and data[8:9] == b"{" and int.from_bytes(data[:8], "little") <= len(data) - 8


def _is_json(data: bytes) -> bool:
    return data[:64].lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"[")


def parse_json(data: bytes | str) -> Any:
    """JSON text -> Python values, with orjson (no Python recursion; nesting deeper than 1024 refused).

    Text orjson refuses is read again by Python's json, which accepts NaN and Infinity (the request
    checks then name them as non-finite) and lone UTF-16 surrogates (``"\\ud800"``), which are
    replaced by U+FFFD so the answer can be encoded. Raises ValueError with orjson's message.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):  # bad JSON or UTF-8, too deep, an int of 4300+ digits
            raise ValueError(str(exc)) from None
        return _replace_surrogates(value)


def read_arrays(
    data: bytes, names: Collection[str]
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]] | None:
    """A JSON object whose fields ``names`` (where given) are arrays of number arrays, read without a
    Python float per number: (its other fields as Python values, {name: (flat float64 values, row lengths)}).

    simdjson parses the text and copies each such field's numbers straight into one flat array (a
    256 x 4096 batch in a fraction of ``orjson.loads``'s time). None when the text is anything
    else (invalid JSON, NaN, lone surrogates, a field of another shape, duplicate keys): the
    caller then reads it with ``parse_json``, whose checks name what is wrong. The shape is
    proven, not assumed: the flat copy would also flatten deeper arrays, so the text's ``[``
    count must be exactly the arrays the answer accounts for.
    """
    try:
        doc = simdjson.Parser().parse(data)
    except (ValueError, TypeError, RuntimeError):  # invalid JSON, too deep, numbers out of range, bad UTF-8
        return None
    if not isinstance(doc, simdjson.Object):
        return None
    keys = list(doc)
    if len(set(keys)) != len(keys):
        return None
    rest: dict[str, Any] = {}
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    brackets = 0  # the "[" of the arrays read here
    for key in keys:
        value = doc[key]
        if key not in names or value is None:
            rest[key] = _plain(value)
            continue
        if not isinstance(value, simdjson.Array):
            return None
        rows = list(value)
        lengths = [len(row) if isinstance(row, simdjson.Array) else -1 for row in rows]
        if -1 in lengths:
            return None
        try:
            flat = np.frombuffer(value.as_buffer(of_type="d"), dtype=np.float64)
        except (TypeError, ValueError):  # a string, bool or null among the numbers
            return None
        arrays[key] = flat, np.array(lengths, dtype=np.int64)
        brackets += 1 + len(rows)
    if not arrays:
        return None
    try:
        brackets += orjson.dumps(rest).count(b"[")  # and those of the other fields: arrays and "[" in strings
    except orjson.JSONEncodeError:  # nested past orjson's depth: the exact reader judges it
        return None
    return (rest, arrays) if data.count(b"[") == brackets else None  # else an array nested deeper


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _fix(text: str) -> str:
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace") if _has_surrogate(text) else text


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _replace_surrogates(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) replaced by U+FFFD (in place, no recursion)."""
    if isinstance(value, str):
        return _fix(value)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            for i, v in enumerate(item):
                if isinstance(v, str):
                    item[i] = _fix(v)
                elif isinstance(v, list | dict):
                    stack.append(v)
        elif isinstance(item, dict):
            for key in list(item):
                v = item.pop(key)
                item[_fix(key) if isinstance(key, str) else key] = _fix(v) if isinstance(v, str) else v
                if isinstance(v, list | dict):
                    stack.append(v)
    return value


def _read_json(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    try:
        body = parse_json(data)
    except ValueError as exc:
        raise GrpoInputError("file", "valid JSON", got=str(exc)[:200]) from exc
    if not isinstance(body, dict):
        raise GrpoInputError("file", "a JSON object with the /api/v1/loss fields", got=type(body).__name__)
    return canonical(body)


ROW_KEYS = {f.row_key: name for name, f in BATCH_FIELDS.items() if f.row_key}
BATCH_ONLY = fields_of("batch")  # a JSONL line holding only these (and config) sets them for the batch


def _read_jsonl(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    """One JSON object per line: a row's per-token lists and its reward or advantage; a line
    holding only ``config`` or batch-wide fields (``group_size``) sets them for the batch."""
    columns: dict[str, list[Any]] = {}
    batch: dict[str, Any] = {}
    # lines end at "\n" alone: str.splitlines would also split at U+2028 and the like, which JSON strings hold
    for number, line in enumerate(data.decode("utf-8", errors="replace").split("\n")):
        if not line.strip():
            continue
        try:
            row = parse_json(line)
        except ValueError as exc:
            raise GrpoInputError("file", "one JSON object per line", row=number, got=str(exc)[:200]) from exc
        if not isinstance(row, dict):
            raise GrpoInputError("file", "one JSON object per line", row=number, got=type(row).__name__)
        if set(row) <= {"config", *BATCH_ONLY}:
            batch.update(row)
            continue
        for key, value in canonical(row).items():
            columns.setdefault(ROW_KEYS.get(key, key), []).append(value)
    n = max((len(v) for v in columns.values()), default=0)
    for key, values in columns.items():
        if len(values) != n:
            raise GrpoInputError(key, f"a value on every row line ({n})", got=f"{len(values)}")
    return batch | columns


def _read_safetensors(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    """Named tensors, priced from the header first (nothing in a safetensors file is compressed, but a
    byte of a bool mask becomes eight as float64)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    header = _safetensors_header(data)
    budget = _Budget(max_bytes)
    for name, (dtype, shape, nbytes) in header.items():
        if _reads(name, header):
            budget.add(name, _price(math.prod(shape), nbytes), f"{math.prod(shape)} values of {dtype}")
    try:
        tensors = load(data)
    except SafetensorError as exc:
        raise GrpoInputError("file", "a valid safetensors file", got=str(exc)) from exc
    return _from_tensors({name: t if _reads(name, tensors) else None for name, t in tensors.items()})


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
    return {name: tuple(shape) for name, (_, shape, _) in header.items() if _reads(name, header)}


# --- what a file unpacks to, priced before it is unpacked --------------------------------------------
HELD_BYTES = 8
"""Bytes one value takes as the batch holds it (float64 or int64): a tensor read is priced at least this."""
STRING_BYTES = 80
"""A display string's Python object, beyond its characters."""
PICKLE_BYTES = 64
"""What one byte of a .pt file's pickle may make as it is read (about one Python object per opcode)."""


class UnpackLimitError(GrpoInputError):
    """A file whose read fields would unpack past the limit, refused before any is unpacked (the server
    answers 413); ``field`` names the entry that passed it."""

    def __init__(
        self, field: str, expected: str = "a smaller file once unpacked", row: int | None = None, got: str | None = None
    ):
        super().__init__(field, expected, row, got)


@dataclass
class _Budget:
    """What a file's read entries would unpack to, added up against ``limit`` entry by entry."""

    limit: int
    total: int = 0

    def add(self, name: str, size: int, what: str) -> None:
        self.total += size
        if self.total > self.limit:
            expected = f"at most {self.limit} bytes once unpacked (a setting)"
            raise UnpackLimitError(name, expected, got=f"{self.total} bytes with {name} ({what})")


def _price(values: int, nbytes: int) -> int:
    """A read tensor's cost: its bytes unpacked, or its values as the batch holds them, the larger."""
    return max(nbytes, values * HELD_BYTES)


def _reads(name: str, names: Collection[str]) -> bool:
    """Whether the readers keep a file's tensor ``name``: a batch field or its alias, the display strings, the
    logits fields beside ``logits``. Any other is reported as ignored and never unpacked."""
    if name in LOGITS_FIELDS:
        return "logits" in names
    return name in BATCH_FIELDS or name in ALIASES or name == "tokens"


REAL = "a dense tensor of bool, integers or floats of 16, 32 or 64 bits"
READ_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint16, torch.uint32, torch.uint64,
}  # fmt: skip
INT64_MAX = 2**63 - 1


def _checked(name: str, t: Tensor) -> Tensor:
    """A file's tensor as the batch reads it: dense, on the CPU, in native order, contiguous, of a real dtype;
    unsigned integers wider than a byte as int64 (within its range)."""
    dtype = str(t.dtype).removeprefix("torch.")
    if t.is_complex():
        raise GrpoInputError(name, REAL, got=f"{dtype} (its imaginary part would be lost)")
    if t.layout != torch.strided or t.is_quantized or t.device.type != "cpu":
        kind = "sparse" if t.layout != torch.strided else "quantized" if t.is_quantized else t.device.type
        raise GrpoInputError(name, REAL, got=f"a {kind} tensor of {dtype}")
    if t.dtype not in READ_DTYPES:
        raise GrpoInputError(name, REAL, got=dtype)
    if t.dtype in (torch.uint16, torch.uint32, torch.uint64):
        values = t.contiguous().numpy()
        if values.size and int(values.max()) > INT64_MAX:
            raise GrpoInputError(name, "integers within int64", got=f"{int(values.max())}")
        return torch.from_numpy(values.astype(np.int64))
    return t.contiguous()


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
    out = _from_tensors({k: None if v is None else torch.from_numpy(v) for k, v in arrays.items()})
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
    budget = _Budget(max_bytes)
    out: dict[str, zipfile.ZipInfo | None] = {}
    for name, info in zip(names, infos, strict=True):
        out[name] = info if _reads(name, names) else None
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
        budget.add(name, _price(values, values * dtype.itemsize), f"{values} values of {dtype}")
    return out


def _npz_shapes(data: bytes) -> dict[str, tuple[int, ...]]:
    """The read arrays' shapes from their .npy headers: each member's first bytes, not its data, decompressed."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            names = [info.filename.removesuffix(".npy") for info in infos]
            read = [(name, info) for name, info in zip(names, infos, strict=True) if _reads(name, names)]
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
        prefix, budget = pickles[0].removesuffix("data.pkl"), _Budget(max_bytes)
        budget.add("data.pkl", archive.getinfo(pickles[0]).file_size * PICKLE_BYTES, "the pickle")
        try:
            loaded = _PtUnpickler(io.BytesIO(archive.read(pickles[0]))).load()
        except Exception as exc:  # anything the stand-ins cannot take: refused, nothing ran
            raise GrpoInputError("file", PT, got=type(exc).__name__) from exc
        if not isinstance(loaded, dict) or not all(isinstance(k, str) for k in loaded):
            raise GrpoInputError("file", "a .pt file holding a dict of named tensors")
        wanted = {name: _pt_value(name, v) for name, v in loaded.items() if _reads(name, loaded)}
        for name, value in wanted.items():
            if isinstance(value, _View):
                nbytes = _storage_entry(archive, prefix, value, name).file_size
                dtype = str(value.dtype).removeprefix("torch.")
                budget.add(name, _price(value.values(), nbytes), f"{value.values()} values of {dtype}")
        swap = _big_endian(archive, prefix)
        tensors = {n: v if isinstance(v, Tensor) else _pt_tensor(archive, prefix, v, swap) for n, v in wanted.items()}
    return _from_tensors({name: tensors.get(name) for name in loaded})


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
    wanted = {name: _pt_value(name, v) for name, v in loaded.items() if _reads(name, loaded)}
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


INPUT_DTYPES = "input_dtypes"  # the key under which a file's tensors report the dtype they arrived in
FLOAT_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def precision_notes(input_dtypes: dict[str, str], compute_dtype: str) -> list[str]:
    """A note for each floating-point input stored in fewer bits than the computation uses: its values
    were rounded before GRPO Lens saw them (a bf16 log-prob carries about 3 significant digits)."""
    bits = FLOAT_BITS.get(compute_dtype, 32)
    return [
        f"{name} arrived as {dtype}: its values were rounded to {FLOAT_BITS[dtype]}-bit floats before this "
        f"{compute_dtype} computation, so ratios and KL carry that rounding."
        for name, dtype in input_dtypes.items()
        if FLOAT_BITS.get(dtype, 64) < bits
    ]


def _from_tensors(tensors: Mapping[str, Tensor | None]) -> dict[str, Any]:
    """Named tensors -> a request dict: arrays (2-D per token, float32 or, where any per-token field is,
    float64; 1-D per row), 0-d as numbers; a name no field reads stays, as None (reported as ignored)."""
    checked = {n: None if t is None else _checked(n, t) for n, t in canonical(dict(tensors)).items()}
    if checked.get("logits") is not None:
        return _from_logits(
            {n: t for n, t in checked.items() if t is not None}, [n for n, t in checked.items() if t is None]
        )
    given = {n: t for n, t in checked.items() if t is not None}
    out: dict[str, Any] = {INPUT_DTYPES: {n: str(t.dtype).removeprefix("torch.") for n, t in given.items()}}
    # float32 stays float32 (a float32 computation then needs no copy); float64 anywhere: all float64, so
    # no field is rounded to another's precision; bf16/fp16 widen exactly to float32.
    wide = torch.float64 if any(t.dtype == torch.float64 for t in given.values() if t.dim() == 2) else torch.float32
    for name, t in checked.items():
        if t is None or t.dim() == 0:
            out[name] = None if t is None else t.item()
        else:
            out[name] = t.to(wide).numpy() if t.is_floating_point() else t.numpy()
    return out


def _from_logits(tensors: dict[str, Tensor], ignored: list[str]) -> dict[str, Any]:
    if "token_ids" not in tensors:
        raise GrpoInputError("token_ids", "token ids (B, T) beside logits (B, T, V)")
    prompt = tensors.get("prompt_length", tensors.get("prompt_lengths", torch.tensor(1)))
    temperature = float(tensors["temperature"]) if "temperature" in tensors else 1.0
    out = token_logprobs(
        tensors["logits"],
        tensors["token_ids"],
        prompt.tolist() if prompt.dim() else int(prompt),
        ref_logits=tensors.get("ref_logits"),
        old_logits=tensors.get("old_logits"),
        temperature=temperature,
    )
    request: dict[str, Any] = {
        k: v
        for k, v in _from_tensors(
            {k: t for k, t in tensors.items() if k not in LOGITS_FIELDS and k != "prompt_lengths"}
            | dict.fromkeys(ignored)
        ).items()
    }
    mask = out.mask.double()
    if "completion_mask" in request:  # given on the token positions: keep the completion part
        given = np.asarray(request["completion_mask"], dtype=np.float64)
        mask = mask * torch.from_numpy(given[:, -mask.shape[1] :])
    request |= {
        "per_token_logps": out.logps.double().numpy(),
        "completion_mask": mask.numpy(),
        "entropies": out.entropies.double().numpy(),
    }
    if out.sum_pi_squared is not None:  # for the optimal token baseline (an advantage that reads it)
        request["sum_pi_squared"] = out.sum_pi_squared.double().clamp(0.0, 1.0).numpy()
    if out.ref_logps is not None:
        request["ref_per_token_logps"] = out.ref_logps.double().numpy()
        request["full_kl"] = out.full_kl.double().numpy() if out.full_kl is not None else None
    if out.old_logps is not None:
        request["old_per_token_logps"] = out.old_logps.double().numpy()
    return request


# The built-in formats, one entry each (menu order). ``max_bytes`` bounds what a zip would unpack to.
JSON_TEXT = "JSON text"
for _fmt in (
    UploadFormat(
        "json", "JSON", ("json",), "json", _read_json, export.to_json, "application/json", False, _is_json, JSON_TEXT
    ),
    UploadFormat("jsonl", "JSONL", ("jsonl",), "json", _read_jsonl, export.to_jsonl, "application/x-ndjson"),
    UploadFormat(
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
    ),
    UploadFormat(
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
    ),
    UploadFormat(
        "pt",
        ".pt",
        ("pt", "pth"),
        "pt",
        _read_pt,
        sniffer=_is_pt,
        content_doc="a torch .pt file (a zip holding data.pkl)",
        shapes=_pt_shapes,
    ),
):
    register_format(_fmt)
