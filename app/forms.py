"""Form uploads, the one way both file routes read them (/api/v1/upload, /api/v1/runs): the body's bytes,
already in memory (``app.middleware.BodyLimit`` bounds them), parsed off the event loop.

python-multipart's parser over the body in one pass, with callbacks that keep each part's slices
(Starlette's form machinery, ``UploadFile``, is built for streaming: it spools the file and copies it
again). At most 2 files and 8 fields; a field is at most 1 MiB of UTF-8 text; the file at most the
route's limit (a 413 at ``body.file``). Every other fault is a 422 naming the field, and an error
never echoes what was sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from python_multipart.multipart import MultipartParser, parse_options_header

from app.errors import ApiError, LimitError, error_item

MAX_FIELD_BYTES = 1024 * 1024  # a form field (config, token_rows, a run's name) is short text


@dataclass(frozen=True)
class FileForm:
    """A form's one file and its text fields (None where not sent)."""

    filename: str
    data: bytes
    fields: dict[str, str | None]


def file_form(body: bytes, content_type: str, max_file_bytes: int, fields: tuple[str, ...]) -> FileForm:
    """A form holding a ``file`` of at most ``max_file_bytes`` and the text ``fields``."""
    form = read_form(body, content_type)
    file = form.get("file")
    if not isinstance(file, tuple):
        raise ApiError(422, [error_item(["body", "file"], "Field required: a file", "missing")])
    filename, data = file
    if len(data) > max_file_bytes:
        raise LimitError(["body", "file"], f"file larger than {max_file_bytes} bytes (a setting)")
    texts = {name: form.get(name) for name in fields}
    for name, text in texts.items():
        if text is not None and not isinstance(text, str):
            raise ApiError(422, [error_item(["body", name], "expected text, not a file", "form_invalid")])
    return FileForm(filename, data, texts)


def read_form(body: bytes, content_type: str) -> dict[str, Any]:
    """Form data -> {name: str or (filename, bytes)}: multipart, or URL-encoded fields (then without a file)."""
    kind, params = parse_options_header(content_type)
    if kind == b"application/x-www-form-urlencoded":
        try:
            return dict(parse_qsl(body.decode("utf-8"), max_num_fields=8))
        except ValueError as exc:
            raise ApiError(422, [error_item(["body"], f"expected form data: {exc}", "form_invalid")]) from exc
    if kind != b"multipart/form-data" or not params.get(b"boundary"):
        raise ApiError(422, [error_item(["body"], "expected multipart/form-data with a boundary", "form_invalid")])
    parts: list[tuple[dict[bytes, bytes], list[bytes]]] = []
    name, value = bytearray(), bytearray()

    def header_end() -> None:
        parts[-1][0][bytes(name).lower()] = bytes(value)
        name.clear()
        value.clear()

    callbacks: dict[str, Any] = {
        "on_part_begin": lambda: parts.append(({}, [])),
        "on_header_field": lambda data, start, end: name.extend(data[start:end]),
        "on_header_value": lambda data, start, end: value.extend(data[start:end]),
        "on_header_end": header_end,
        "on_part_data": lambda data, start, end: parts[-1][1].append(data[start:end]),
    }
    try:
        parser = MultipartParser(params[b"boundary"], callbacks)  # type: ignore[arg-type]  # a TypedDict of these
        parser.write(body)
        parser.finalize()
        return _form_fields(parts)
    except ValueError as exc:  # the parser's errors, and text that is not UTF-8
        raise ApiError(422, [error_item(["body"], f"expected multipart form data: {exc}", "form_invalid")]) from exc


def _form_fields(parts: list[tuple[dict[bytes, bytes], list[bytes]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    files = fields = 0
    for headers, chunks in parts:
        _, options = parse_options_header(headers.get(b"content-disposition", b""))
        key = options.get(b"name", b"").decode("utf-8")
        data = b"".join(chunks)
        if b"filename" in options:
            files += 1
            out[key] = (options[b"filename"].decode("utf-8", errors="replace"), data)
        else:
            fields += 1
            if len(data) > MAX_FIELD_BYTES:
                raise ValueError(f"the field {key!r} is larger than {MAX_FIELD_BYTES} bytes")
            out[key] = data.decode("utf-8")
        if files > 2 or fields > 8:
            raise ValueError("at most 2 files and 8 fields")
    return out
