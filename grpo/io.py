"""Batches in: the file formats and the field aliases (the JSON answers are assembled by the app).

Files: JSON (the ``/api/v1/loss`` body), JSONL (one row per line), safetensors, NPZ (read with
``allow_pickle=False``) and ``.pt`` (``torch.load(weights_only=True)``). Nothing is unpickled
or executed. Named tensors use the request's names (aliases accepted); ``logits`` with
``token_ids`` (and ``prompt_length``) go through ``token_logprobs``.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable, Collection
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


Reader = Callable[[bytes, int], dict[str, Any]]
"""(file bytes, max_unpacked_bytes) -> request fields (per-token values as ragged lists or 2-D arrays)."""
Writer = Callable[[dict[str, Any], "list[int] | None"], bytes]
"""(request fields, row lengths where the per-token fields are padded already) -> file bytes."""


@dataclass(frozen=True)
class UploadFormat:
    """A batch file format, whole: everything the readers, writers, lanes, CLI, API and page need.

    ``content`` is what its first bytes sniff as (formats may share one: JSON and JSONL), ``sniffer``
    recognises that content and ``content_doc`` names it in errors. ``light``: reading it copies numbers
    without a Python object per number, so the server reads it in a thread (no worker process). A format
    with a ``writer`` is offered as an export and has an example file (GET /api/v1/examples/{name})."""

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
    Zipped formats (NPZ, torch's .pt) are refused when they would unpack past
    ``max_unpacked_bytes``, before anything is decompressed.
    """
    fmt = format_named(filename)
    found = sniff(data)
    if found is not None and found != fmt.content:
        suffix = filename.lower().rsplit(".", 1)[-1]
        raise GrpoInputError("file", f"{_content_doc(fmt.content)} (the name says .{suffix})", got=_content_doc(found))
    assert fmt.reader is not None  # register_format refuses a format without one
    return fmt.reader(data, max_unpacked_bytes)


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
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines()):
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
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return _from_tensors(load(data))
    except SafetensorError as exc:
        raise GrpoInputError("file", "a valid safetensors file", got=str(exc)) from exc


def _check_unzipped_size(data: bytes, max_bytes: int) -> None:
    """Refuse a zip (NPZ, or torch's zip format) whose members would unpack past ``max_bytes``.

    The sizes come from the zip's directory, before anything is decompressed; zipfile never
    yields more than a member's declared size, so a member cannot lie its way past the check.
    """
    if not zipfile.is_zipfile(io.BytesIO(data)):
        return
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        total = sum(info.file_size for info in archive.infolist())
    if total > max_bytes:
        raise GrpoInputError("file", f"at most {max_bytes} bytes once unpacked", got=f"{total} bytes")


NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _check_npy_headers(data: bytes) -> None:
    """Refuse an NPZ member whose .npy header claims more (or fewer) bytes than the member holds.

    numpy allocates what the header says before reading: a 328-byte file claiming 10^10 elements
    would ask for 80 GB. The header's shape x itemsize must equal the member's size after its header.
    """
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for info in archive.infolist():
            with archive.open(info) as member:
                try:
                    version = np.lib.format.read_magic(member)
                    if version not in NPY_HEADERS:
                        raise ValueError(f"unknown .npy version {version}")
                    shape, _, dtype = NPY_HEADERS[version](member, max_header_size=10_000)
                except ValueError as exc:
                    raise GrpoInputError("file", f"a valid .npy header in {info.filename}", got=str(exc)[:200]) from exc
                if dtype.hasobject:
                    raise GrpoInputError("file", "an NPZ of numeric arrays (object arrays need pickle and are refused)")
                claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if claimed != info.file_size - member.tell():
                    name = info.filename.removesuffix(".npy")
                    raise GrpoInputError(
                        name,
                        f"a .npy header that matches its data ({info.file_size - member.tell()} bytes)",
                        got=f"shape {shape} of {dtype} ({claimed} bytes)",
                    )


def _read_npz(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    try:
        _check_unzipped_size(data, max_bytes)
        if zipfile.is_zipfile(io.BytesIO(data)):
            _check_npy_headers(data)
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except GrpoInputError:
        raise
    except ValueError as exc:  # object arrays need pickle: refused
        raise GrpoInputError(
            "file", "an NPZ of numeric arrays (object arrays need pickle and are refused)", got=str(exc)[:200]
        ) from exc
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise GrpoInputError("file", "a valid NPZ file", got=str(exc)[:200]) from exc
    tokens = arrays.pop("tokens", None)
    for name, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise GrpoInputError(name, "a numeric array", got=str(array.dtype))
    # reshape: ascontiguousarray turns a 0-d array (a scalar such as group_size) into shape (1,)
    out = _from_tensors({k: torch.from_numpy(np.ascontiguousarray(v).reshape(v.shape)) for k, v in arrays.items()})
    if tokens is not None:  # display strings: a 2-D unicode array (no pickle needed)
        if tokens.dtype.kind != "U" or tokens.ndim != 2:
            raise GrpoInputError("tokens", "a 2-D array of strings", got=f"{tokens.dtype} of {tokens.ndim} dims")
        out["tokens"] = tokens.tolist()
    return out


def _read_pt(data: bytes, max_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    _check_unzipped_size(data, max_bytes)
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # weights_only refuses anything but tensors and plain containers
        raise GrpoInputError(
            "file", "a .pt file of plain tensors (loaded with weights_only=True)", got=type(exc).__name__
        ) from exc
    if not isinstance(loaded, dict) or not all(isinstance(v, Tensor | int | float) for v in loaded.values()):
        raise GrpoInputError("file", "a .pt file holding a dict of named tensors")
    return _from_tensors({str(k): torch.as_tensor(v) for k, v in loaded.items()})


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


def _from_tensors(tensors: dict[str, Tensor]) -> dict[str, Any]:
    """Named tensors -> a request dict (2-D arrays per token, lists per row, ints as ints)."""
    tensors = canonical(tensors)
    if "logits" in tensors:
        return _from_logits(tensors)
    out: dict[str, Any] = {INPUT_DTYPES: {n: str(t.dtype).removeprefix("torch.") for n, t in tensors.items()}}
    # float32 stays float32 (a float32 computation then needs no copy); float64 anywhere: all float64, so
    # no field is rounded to another's precision; bf16/fp16 widen exactly to float32.
    wide = torch.float64 if any(t.dtype == torch.float64 for t in tensors.values() if t.dim() == 2) else torch.float32
    for name, t in tensors.items():
        if t.dim() == 0:
            out[name] = t.item()
        elif t.dim() == 1:
            out[name] = t.tolist()
        else:
            out[name] = t.to(wide).numpy() if t.is_floating_point() else t.numpy()
    return out


def _from_logits(tensors: dict[str, Tensor]) -> dict[str, Any]:
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
    ),
    UploadFormat(
        "pt",
        ".pt",
        ("pt", "pth"),
        "pt",
        _read_pt,
        sniffer=_is_pt,
        content_doc="a torch .pt file (a zip holding data.pkl)",
    ),
):
    register_format(_fmt)
