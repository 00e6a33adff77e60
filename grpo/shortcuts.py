"""The shortcuts evaluate takes for speed (bench/core.py), each giving, bit for bit, the value of a plainer expression
(and its gradient): tests/test_breakdown_shortcuts.py holds each to the expression it replaces.

- ``clamp_symmetric``: torch.clamp to [-bound, bound], its gradient written as float arithmetic.
- ``counted_row_sum``: (x · mask).sum(-1) for an x already 0 outside the mask, without the product.
- ``filled_kl`` / ``filled_kl_is_zero``: the KL without reference log-probs, one constant filled in (and whether
  it is +0.0 everywhere), instead of the estimator's and its clamps' passes (grpo.loss.reference_free_kl).
- ``same_memory``: whether two tensors are one (a data_ptr check), so a product with the mask can be skipped.
- ``code_where_counted``: an int8 code where a token counts, from the bool mask's bytes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from grpo.objectives import above


def clamp_symmetric(x: Tensor, bound: float) -> tuple[Tensor, Tensor]:
    """(x clamped to [-bound, bound], 1.0 where the clamp touched x).

    The gradient is torch.clamp's (1 inside, boundary included; 0 outside), written as float
    arithmetic: CPU autograd of clamp runs bool kernels that cost more than the rest of the pass.
    Tests hold it equal to torch.clamp in value and gradient.
    """
    outside = above(x.detach().abs(), bound)
    return x.detach().clamp(-bound, bound) + (x - x.detach()) * (1 - outside), outside


class _CountedRowSum(torch.autograd.Function):
    """Each row's sum of an x that is already 0 wherever the mask is 0: the value of (x · mask).sum(-1) to the bit,
    without the product; the gradient that product gives, grad · mask. (B, T) -> (B, 1)"""

    @staticmethod
    def forward(ctx: Any, x: Tensor, mask: Tensor) -> Tensor:
        ctx.save_for_backward(mask)
        return x.sum(-1, keepdim=True)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def counted_row_sum(x: Tensor, mask: Tensor) -> Tensor:
    """(x · mask).sum(-1, keepdim=True) for an x already 0 wherever the mask is 0, in one pass (``_CountedRowSum``)."""
    out: Tensor = _CountedRowSum.apply(x, mask)  # type: ignore[no-untyped-call]  # torch's Function.apply is untyped
    return out


def filled_kl(like: Tensor, constant: float, ratio: Tensor | None) -> Tensor:
    """``constant`` at every position of ``like``, times ``ratio`` (detached) when given: the KL without reference
    log-probs is one value at every token (grpo.loss.reference_free_kl), so it is filled in, in one or two passes
    instead of the estimator's and its clamps' dozen. (B, T) -> (B, T)"""
    kl = torch.full_like(like.detach(), constant)
    return kl if ratio is None else kl * ratio.detach()


def filled_kl_is_zero(constant: float, ratio: Tensor | None, extent: tuple[Tensor, Tensor] | None = None) -> bool:
    """Whether ``filled_kl(like, constant, ratio)`` is +0.0 at every token: ``constant`` is +0.0 and, with a ratio,
    every ratio is finite (+0 times a finite ratio >= 0 is +0.0; times inf it is NaN). A finite sum proves every
    ratio finite; a sum that overflows says no, and the KL is then computed. ``extent``: the ratio's (min, max),
    when known."""
    if constant != 0.0 or math.copysign(1.0, constant) < 0:
        return False
    if ratio is None:
        return True
    if extent is not None:
        return bool(torch.isfinite(extent[0])) and bool(torch.isfinite(extent[1]))
    return bool(torch.isfinite(ratio.detach().sum()))


def same_memory(a: Tensor, b: Tensor, shape: torch.Size) -> bool:
    """Whether ``a`` and ``b`` broadcast to ``shape`` read the same memory the same way (so hold the same values)."""
    x, y = a.expand(shape), b.expand(shape)
    return x.data_ptr() == y.data_ptr() and x.stride() == y.stride() and x.dtype == y.dtype


def code_where_counted(counted: Tensor, code: int) -> Tensor:
    """int8 ``code`` where a token counts, else 0, from ``counted`` (int8 0/1: itself when the code is 1)."""
    return counted if code == 1 else counted * code
