"""Batches in and breakdowns out: the file formats, the field aliases, and the JSON shape.

Files: JSON (the ``/api/v1/loss`` body), JSONL (one row per line), safetensors, NPZ (read with
``allow_pickle=False``) and ``.pt`` (``torch.load(weights_only=True)``). Nothing is unpickled
or executed. Named tensors use the request's names (aliases accepted); ``logits`` with
``token_ids`` (and ``prompt_length``) go through ``token_logprobs``.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import numpy as np
import orjson
import torch
from torch import Tensor

from grpo.curves import objective_curves
from grpo.errors import GrpoInputError
from grpo.explain import explain
from grpo.logits import token_logprobs
from grpo.loss import Breakdown
from grpo.objectives import REGIONS

# verl's and the article's names for the request's (TRL's) fields.
ALIASES: dict[str, str] = {
    "log_prob": "per_token_logps",
    "pi_logprob": "per_token_logps",
    "old_log_prob": "old_per_token_logps",
    "pi_old_logprob": "old_per_token_logps",
    "ref_log_prob": "ref_per_token_logps",
    "pi_ref_logprob": "ref_per_token_logps",
    "response_mask": "completion_mask",
    "input_len": "prompt_lengths",
}
TOKEN_FIELDS = (
    "ratio",
    "clipped_ratio",
    "surrogate",
    "kl",
    "weight",
    "loss",
    "grad",
    "grad_policy",
    "grad_kl",
    "log_ratio",
    "policy_loss",
    "kl_loss",
)
ROW_FIELDS = (
    "advantage",
    "reward",
    "length",
    "loss",
    "policy_loss",
    "kl_loss",
    "sequence_ratio",
    "clip_fraction",
    "group",
)
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


def load_file(filename: str, data: bytes, max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> dict[str, Any]:
    """A request dict from an uploaded file; per-token values as ragged lists or 2-D arrays.

    Zipped formats (NPZ, torch's .pt) are refused when they would unpack past
    ``max_unpacked_bytes``, before anything is decompressed.
    """
    suffix = filename.lower().rsplit(".", 1)[-1] if "." in filename else ""
    if suffix in ("npz", "pt", "pth"):
        reader = _read_npz if suffix == "npz" else _read_pt
        return reader(data, max_unpacked_bytes)
    readers = {"json": _read_json, "jsonl": _read_jsonl, "safetensors": _read_safetensors}
    if suffix not in readers:
        raise GrpoInputError("file", "a .json, .jsonl, .safetensors, .npz or .pt file", got=repr(filename))
    return readers[suffix](data)


def _read_json(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, too deep, an int of 4300+ digits
        raise GrpoInputError("file", "valid JSON", got=str(exc)[:200]) from exc
    if not isinstance(body, dict):
        raise GrpoInputError("file", "a JSON object with the /api/v1/loss fields", got=type(body).__name__)
    return canonical(body)


ROW_KEYS = {"reward": "rewards", "advantage": "advantages", "prompt_length": "prompt_lengths"}


def _read_jsonl(data: bytes) -> dict[str, Any]:
    """One JSON object per line: a row's per-token lists and its reward or advantage; a line
    holding only ``config`` or ``group_size`` sets that for the batch."""
    columns: dict[str, list[Any]] = {}
    batch: dict[str, Any] = {}
    for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise GrpoInputError("file", "one JSON object per line", row=number, got=str(exc)[:200]) from exc
        if not isinstance(row, dict):
            raise GrpoInputError("file", "one JSON object per line", row=number, got=type(row).__name__)
        if set(row) <= {"config", "group_size"}:
            batch.update(row)
            continue
        for key, value in canonical(row).items():
            columns.setdefault(ROW_KEYS.get(key, key), []).append(value)
    n = max((len(v) for v in columns.values()), default=0)
    for key, values in columns.items():
        if len(values) != n:
            raise GrpoInputError(key, f"a value on every row line ({n})", got=f"{len(values)}")
    return batch | columns


def _read_safetensors(data: bytes) -> dict[str, Any]:
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


def _read_npz(data: bytes, max_bytes: int) -> dict[str, Any]:
    try:
        _check_unzipped_size(data, max_bytes)
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
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


def _read_pt(data: bytes, max_bytes: int) -> dict[str, Any]:
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


def _from_tensors(tensors: dict[str, Tensor]) -> dict[str, Any]:
    """Named tensors -> a request dict (2-D arrays per token, lists per row, ints as ints)."""
    tensors = canonical(tensors)
    if "logits" in tensors:
        return _from_logits(tensors)
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        if t.dim() == 0:
            out[name] = t.item()
        elif t.dim() == 1:
            out[name] = t.tolist()
        else:
            out[name] = t.double().numpy() if t.is_floating_point() else t.numpy()
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
    if out.ref_logps is not None:
        request["ref_per_token_logps"] = out.ref_logps.double().numpy()
        request["full_kl"] = out.full_kl.double().numpy() if out.full_kl is not None else None
    if out.old_logps is not None:
        request["old_per_token_logps"] = out.old_logps.double().numpy()
    return request


# --- writing breakdowns ------------------------------------------------------------------------------
def _rows_of(t: Tensor, lengths: list[int], rows: list[int]) -> list[np.ndarray]:
    array = t.detach().cpu().numpy()
    return [array[i, : lengths[i]] for i in rows]


def breakdown_to_json(
    bd: Breakdown,
    lengths: list[int] | None = None,
    tokens: list[list[str]] | None = None,
    rows: list[int] | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The breakdown as JSON-ready data (NumPy arrays inside: dump with ``dumps``).

    Per-token arrays are ragged: row i keeps its first ``lengths[i]`` positions (default: all).
    They cover every row when the batch has at most ``max_tokens`` positions, else only
    ``rows`` (none by default): the summary and per-row data always come whole.
    """
    B, T = bd.tokens.mask.shape
    lengths = lengths or [T] * B
    total = sum(lengths)
    if rows is None:
        rows = list(range(B)) if max_tokens is None or total <= max_tokens else []
    token_data: dict[str, Any] = {name: _rows_of(getattr(bd.tokens, name), lengths, rows) for name in TOKEN_FIELDS}
    token_data["mask"] = [m.astype(np.int8) for m in _rows_of(bd.tokens.mask, lengths, rows)]
    region = bd.tokens.region.cpu().numpy()
    token_data["region"] = [[REGIONS[c] for c in region[i, : lengths[i]]] for i in rows]
    if tokens is not None:
        token_data["text"] = [tokens[i] for i in rows]
    row_data = {name: getattr(bd.rows, name) for name in ROW_FIELDS}
    return {
        "loss": float(bd.loss),
        "objective": float(bd.objective),
        "policy_loss": float(bd.policy_loss),
        "kl_loss": float(bd.kl_loss),
        "metrics": bd.metrics,
        "explanation": explain(bd),
        "advantages": bd.advantages.cpu().numpy(),
        "rows": {k: (v.cpu().numpy() if isinstance(v, Tensor) else v) for k, v in row_data.items()},
        "tokens": token_data,
        "token_rows": rows,
        "tokens_complete": len(rows) == B,
        "num_positions": total,
        "curves": objective_curves(bd),
        "clamp_counts": bd.clamp_counts,
        "zero_std_groups": list(bd.zero_std_groups),
        "config": bd.config.to_dict(),
        "device": bd.device,
        "dtype": bd.dtype,
        "warnings": list(bd.warnings),
    }


def dumps(data: Any) -> bytes:
    """JSON bytes: NumPy arrays inline, float32 in its shortest form, NaN and inf as null."""
    return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
