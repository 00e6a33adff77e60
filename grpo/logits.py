"""From logits to per-token log-probs: the causal shift, the gather, entropies and the full KL.

A causal LM's logits at position t score the token at t + 1, so the completion token at
position t is scored by logits[t - 1]: gathering at the same position (as the article's demo
does) silently misaligns labels and logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.errors import GrpoInputError


@dataclass(frozen=True)
class TokenLogprobs:
    """Per-token results for the completion positions, all (B, W) with W = T - min(prompt_length)."""

    logps: Tensor
    """log pi(token_t | tokens_<t) under ``logits``."""
    entropies: Tensor
    """Entropy of the distribution that scored each token."""
    mask: Tensor
    """bool: position t is past its row's prompt."""
    old_logps: Tensor | None = None
    """The same under ``old_logits``, when given."""
    ref_logps: Tensor | None = None
    """The same under ``ref_logits``, when given."""
    full_kl: Tensor | None = None
    """KL(pi || pi_ref) over the whole vocabulary at each position, when ref_logits are given."""
    sum_pi_squared: Tensor | None = None
    """Σ_v π(v)² of the distribution that scored each token: the old one when old_logits are given (verl's
    actor computes it beside the old log-probs), else this one. For the optimal token baseline."""


def _log_softmax(logits: Tensor, start: int, temperature: float) -> Tensor:
    """Shifted log-softmax: (B, T, V) -> (B, T - start, V), row t scoring token start + t."""
    return F.log_softmax(logits[:, start - 1 : -1].float() / temperature, dim=-1)


def _sum_squared(probs: Tensor) -> Tensor:
    """Σ_v p(v)² per position, as a batched dot product (no (B, W, V) temporary). (B, W, V) -> (B, W)"""
    return (probs.unsqueeze(-2) @ probs.unsqueeze(-1)).squeeze(-1).squeeze(-1)


def _gather(logsm: Tensor, targets: Tensor) -> Tensor:
    return logsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, W, V) -> (B, W)


def token_logprobs(
    logits: Tensor,
    token_ids: Tensor,
    prompt_length: int | Sequence[int] | Tensor = 1,
    ref_logits: Tensor | None = None,
    old_logits: Tensor | None = None,
    temperature: float = 1.0,
) -> TokenLogprobs:
    """Log-probs and entropies of ``token_ids`` (B, T) under ``logits`` (B, T, V), causally shifted.

    ``prompt_length`` (an int, or one per row, each >= 1) is where the completion starts: the
    first completion token, at position p, is scored by logits[p - 1]. Results cover positions
    min(p) .. T - 1; ``mask`` marks those past each row's own prompt. ``temperature`` divides the
    logits first, as TRL and verl do with the sampling temperature.
    """
    if logits.dim() != 3:
        raise GrpoInputError("logits", "a 3-D tensor (B, T, V)", got=f"shape {tuple(logits.shape)}")
    B, T, V = logits.shape
    if token_ids.shape != (B, T):
        raise GrpoInputError(
            "token_ids", f"shape {(B, T)} like logits' first two dims", got=f"shape {tuple(token_ids.shape)}"
        )
    if token_ids.is_floating_point() or (token_ids.numel() and (token_ids.min() < 0 or token_ids.max() >= V)):
        raise GrpoInputError("token_ids", f"integer ids in [0, {V})")
    if temperature <= 0:
        raise GrpoInputError("temperature", "a number > 0", got=repr(temperature))
    for name, other in (("ref_logits", ref_logits), ("old_logits", old_logits)):
        if other is not None and other.shape != logits.shape:
            raise GrpoInputError(name, f"shape {tuple(logits.shape)} like logits", got=f"shape {tuple(other.shape)}")
    p = torch.as_tensor(prompt_length, device=logits.device)
    if p.dim() > 1 or (p.dim() == 1 and p.shape[0] != B) or bool((p != p.round()).any()):
        raise GrpoInputError("prompt_length", f"an int or {B} ints (one per row)", got=f"{prompt_length!r}")
    p = p.long().expand(B)
    if bool((p < 1).any()) or bool((p >= T).any()):
        raise GrpoInputError("prompt_length", f"between 1 and {T - 1}: position 0 has no logit scoring it")
    start = int(p.min())
    targets = token_ids[:, start:].long()  # (B, T) -> (B, W)
    mask = torch.arange(start, T, device=logits.device)[None, :] >= p[:, None]

    logsm = _log_softmax(logits, start, temperature)
    probs = logsm.exp()
    entropies = -(probs * logsm.masked_fill(probs == 0, 0)).sum(-1)  # (B, W, V) -> (B, W)
    ref_logps = full_kl = old_logps = None
    if ref_logits is not None:
        ref_logsm = _log_softmax(ref_logits, start, temperature)
        ref_logps = _gather(ref_logsm, targets)
        full_kl = (probs * (logsm - ref_logsm)).masked_fill(probs == 0, 0).sum(-1)
    squared = _sum_squared(probs)
    if old_logits is not None:
        old_logsm = _log_softmax(old_logits, start, temperature)
        old_logps = _gather(old_logsm, targets)
        squared = _sum_squared(old_logsm.exp())
    return TokenLogprobs(_gather(logsm, targets), entropies, mask, old_logps, ref_logps, full_kl, squared)
