"""The file formats' registry: each format one ``UploadFormat`` entry, the name's suffix picking it and its
first bytes sniffed to confirm it; ``load_file`` and ``file_shapes`` go through it."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from grpo import export
from grpo.errors import GrpoInputError
from grpo.fields import ALIASES


def canonical(fields: dict[str, Any]) -> dict[str, Any]:
    """The request's names for aliased keys; an alias and its name together is an error."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        name = ALIASES.get(key, key)
        if name in out:
            raise GrpoInputError(key, f"one of {name} or its alias {key}, not both")
        out[name] = value
    return out


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


def zip_members(data: bytes) -> list[str] | None:
    """The member names of a zip file, None when ``data`` is no zip."""
    if data[:4] != b"PK\x03\x04":
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None
