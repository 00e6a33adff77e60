"""A file's named tensors -> request fields: the odd tensors refused (complex, sparse, quantized, unsigned past
int64), the dtype each arrived in kept for ``precision_notes``, logits turned into log-probs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo.errors import GrpoInputError
from grpo.io.formats import canonical
from grpo.io.pricing import LOGITS_FIELDS
from grpo.logits import token_logprobs

REAL = "a dense tensor of bool, integers or floats of 16, 32 or 64 bits"
READ_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint16, torch.uint32, torch.uint64,
}  # fmt: skip
INT64_MAX = 2**63 - 1


def checked_tensor(name: str, t: Tensor) -> Tensor:
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


def from_tensors(tensors: Mapping[str, Tensor | None]) -> dict[str, Any]:
    """Named tensors -> a request dict: arrays (2-D per token, float32 or, where any per-token field is,
    float64; 1-D per row), 0-d as numbers; a name no field reads stays, as None (reported as ignored)."""
    checked = {n: None if t is None else checked_tensor(n, t) for n, t in canonical(dict(tensors)).items()}
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
        for k, v in from_tensors(
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
