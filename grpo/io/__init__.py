"""Batches in: the file formats and the field aliases (the JSON answers are assembled by the app).

Files: JSON (the ``/api/v1/loss`` body), JSONL (one row per line), safetensors, NPZ (read with
``allow_pickle=False``) and ``.pt`` (torch.save's zip, its pickle read with stand-ins for every global,
so it takes no more than ``torch.load(weights_only=True)`` would). Nothing is unpickled or executed.
Binary files are priced from their headers before anything is unpacked, and a tensor no field reads
is never unpacked. Named tensors use the request's names (aliases accepted); ``logits`` with
``token_ids`` (and ``prompt_length``) go through ``token_logprobs``.

One module a concern: ``formats`` (the registry, ``load_file``, ``file_shapes``, sniffing), ``pricing``
(what a file unpacks to, before it is unpacked), ``tensors`` (a file's tensors -> request fields, the odd
ones refused), and one module a format family: ``json_files``, ``safetensors_files``, ``npz_files``,
``pt_files``, each holding its ``UploadFormat`` entry, registered here in menu order.
"""

from __future__ import annotations

from grpo.fields import ALIASES
from grpo.io.formats import (
    MAX_UNPACKED_BYTES,
    UPLOAD_FORMATS,
    Reader,
    UploadFormat,
    Writer,
    canonical,
    file_name,
    file_shapes,
    format_named,
    load_file,
    register_format,
    sniff,
)
from grpo.io.json_files import JSON, JSONL, ROW_KEYS, parse_json, read_arrays
from grpo.io.npz_files import NPZ
from grpo.io.pricing import HELD_BYTES, LOGITS_FIELDS, PICKLE_BYTES, STRING_BYTES, UnpackLimitError
from grpo.io.pt_files import PT_FORMAT
from grpo.io.safetensors_files import SAFETENSORS
from grpo.io.tensors import FLOAT_BITS, INPUT_DTYPES, precision_notes

__all__ = [
    "ALIASES",
    "FLOAT_BITS",
    "HELD_BYTES",
    "INPUT_DTYPES",
    "LOGITS_FIELDS",
    "MAX_UNPACKED_BYTES",
    "PICKLE_BYTES",
    "ROW_KEYS",
    "STRING_BYTES",
    "UPLOAD_FORMATS",
    "Reader",
    "UnpackLimitError",
    "UploadFormat",
    "Writer",
    "canonical",
    "file_name",
    "file_shapes",
    "format_named",
    "load_file",
    "parse_json",
    "precision_notes",
    "read_arrays",
    "register_format",
    "sniff",
]

for _fmt in (JSON, JSONL, SAFETENSORS, NPZ, PT_FORMAT):
    register_format(_fmt)
