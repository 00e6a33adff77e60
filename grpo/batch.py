"""Batch: the tensors of one training batch, checked once, with the trainers' defaults filled in.

Shapes: B rows (completions), T padded positions. A position counts when ``completion_mask`` is
1 there and it is not among the row's first ``prompt_lengths`` positions (the article's
``input_len``). Checks name the tensor, the row and what was expected, and raise
``GrpoInputError`` (a ``ValueError``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo.errors import GrpoInputError

TensorLike = Tensor | np.ndarray | Sequence[Any]
LOGP_FIELDS = ("per_token_logps", "old_per_token_logps", "ref_per_token_logps")


def _as_tensor(name: str, value: Any, dtype: torch.dtype | None = None, keep_graph: bool = False) -> Tensor:
    """``value`` as a tensor; detached unless ``keep_graph`` (the current log-probs: a model's output)."""
    try:
        tensor = value if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value, dtype=np.float64))
    except (ValueError, TypeError) as exc:
        raise GrpoInputError(name, "a rectangular array of numbers", got=type(value).__name__) from exc
    if tensor.is_complex():
        raise GrpoInputError(name, "real numbers", got=str(tensor.dtype))
    tensor = tensor if keep_graph else tensor.detach()
    return tensor.to(dtype) if dtype is not None else tensor


def _first_row(bad: Tensor) -> int:
    """The first row with a True entry. (B, T) bool -> int"""
    return int(bad.reshape(bad.shape[0], -1).any(-1).nonzero()[0, 0])


@dataclass(frozen=True)
class Batch:
    """Per-token log-probs of B completions and their rewards or advantages.

    Accepts tensors, NumPy arrays or nested lists; stores tensors, with 0 at every position that
    does not count. ``per_token_logps`` is the current policy (the variable the gradient is taken against;
    a model's output keeps its autograd graph, so ``grpo.compute_loss`` can backpropagate into the model);
    ``old_per_token_logps`` defaults to it (on-policy: ratio 1), ``ref_per_token_logps`` too
    (no reference: KL 0). Give exactly one of ``advantages`` (B,) or ``rewards`` (B,);
    ``group_size`` G groups consecutive rows (default: all rows are one group).
    """

    per_token_logps: TensorLike
    old_per_token_logps: TensorLike | None = None
    ref_per_token_logps: TensorLike | None = None
    completion_mask: TensorLike | None = None
    prompt_lengths: int | TensorLike | None = None
    advantages: TensorLike | None = None
    rewards: TensorLike | None = None
    group_size: int | None = None
    entropies: TensorLike | None = None

    def __post_init__(self) -> None:
        logp = _as_tensor("per_token_logps", self.per_token_logps, keep_graph=True)
        if logp.dim() != 2 or logp.shape[0] == 0 or logp.shape[1] == 0:
            raise GrpoInputError(
                "per_token_logps", "a non-empty 2-D array (B rows, T tokens)", got=f"shape {tuple(logp.shape)}"
            )
        if not logp.is_floating_point():
            logp = logp.double()
        set_ = object.__setattr__
        set_(self, "per_token_logps", logp)
        for name in ("old_per_token_logps", "ref_per_token_logps", "entropies"):
            if getattr(self, name) is not None:
                set_(self, name, self._same_shape(name, _as_tensor(name, getattr(self, name), logp.dtype)))
        mask = self._counted_mask()
        weights = mask.to(logp.dtype)
        set_(self, "_mask", mask)
        set_(self, "_mask_float", weights)
        for name in (*LOGP_FIELDS, "entropies"):
            value = getattr(self, name)
            if value is not None:
                set_(self, name, _checked(name, value, mask, weights))
        self._check_targets()

    # --- checks -----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        B, T = self.logp.shape
        return int(B), int(T)

    @property
    def logp(self) -> Tensor:
        assert isinstance(self.per_token_logps, Tensor)
        return self.per_token_logps

    @property
    def mask(self) -> Tensor:
        """(B, T) bool: the positions that count (completion mask and past the prompt)."""
        mask: Tensor = self.__dict__["_mask"]
        return mask

    @property
    def mask_float(self) -> Tensor:
        """(B, T) the same mask as 0.0 / 1.0 in the log-probs' dtype."""
        mask: Tensor = self.__dict__["_mask_float"]
        return mask

    def _same_shape(self, name: str, value: Tensor) -> Tensor:
        if value.shape != self.logp.shape:
            raise GrpoInputError(
                name, f"shape {tuple(self.logp.shape)} like per_token_logps", got=f"shape {tuple(value.shape)}"
            )
        return value.to(self.logp.device)

    def _counted_mask(self) -> Tensor:
        B, T = self.shape
        device = self.logp.device
        if self.completion_mask is None:
            mask = torch.ones(B, T, dtype=torch.bool, device=device)
        else:
            values = self._same_shape("completion_mask", _as_tensor("completion_mask", self.completion_mask))
            bad = (values != 0) & (values != 1)
            if bad.any():
                raise GrpoInputError("completion_mask", "only 0 and 1", row=_first_row(bad))
            mask = values.bool()
        prompt = self.prompt_length_tensor()
        positions = torch.arange(T, device=device)
        return mask & (positions[None, :] >= prompt[:, None])

    def prompt_length_tensor(self) -> Tensor:
        """(B,) int64 prompt lengths (0 when none were given)."""
        B, T = self.shape
        device = self.logp.device
        p = self.prompt_lengths
        if p is None:
            return torch.zeros(B, dtype=torch.long, device=device)
        if isinstance(p, int | np.integer) and not isinstance(p, bool):
            p = [int(p)] * B
        lengths = _as_tensor("prompt_lengths", p)
        if lengths.dim() == 0:
            lengths = lengths.expand(B)
        if lengths.shape != (B,):
            raise GrpoInputError(
                "prompt_lengths", f"an int or {B} ints (one per row)", got=f"shape {tuple(lengths.shape)}"
            )
        bad = (lengths < 0) | (lengths > T) | (lengths != lengths.round())
        if bad.any():
            raise GrpoInputError("prompt_lengths", f"whole numbers from 0 to {T}", row=int(bad.nonzero()[0, 0]))
        return lengths.to(device=device, dtype=torch.long)

    def _check_targets(self) -> None:
        B = self.shape[0]
        if (self.advantages is None) == (self.rewards is None):
            raise GrpoInputError("advantages", "exactly one of advantages or rewards")
        name = "advantages" if self.advantages is not None else "rewards"
        values = _as_tensor(name, getattr(self, name), self.logp.dtype)
        if values.shape != (B,):
            raise GrpoInputError(name, f"one number per row ({B})", got=f"shape {tuple(values.shape)}")
        bad = ~torch.isfinite(values)
        if bad.any():
            raise GrpoInputError(name, "finite numbers", row=int(bad.nonzero()[0, 0]))
        object.__setattr__(self, name, values.to(self.logp.device))
        G = self.group_size
        if G is not None and (isinstance(G, bool) or not isinstance(G, int | np.integer) or G < 1 or B % G):
            raise GrpoInputError("group_size", f"a positive divisor of the number of rows ({B})", got=repr(G))


def _checked(name: str, value: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """``value`` with 0 wherever nothing counts, after checking the positions that do.

    Log-probs that count must be finite and <= 0 (a positive one usually means logits were
    passed); entropies finite and >= 0. Padding may hold anything, NaN included: it is zeroed.
    The common case costs one multiply and two reductions; the exact search for the offending
    row runs only when they say something is wrong.
    """
    kept = value * weights
    if not bool(torch.isfinite(kept.sum())):
        bad = mask & ~torch.isfinite(value)
        if bad.any():
            row = _first_row(bad)
            pos = int(bad[row].nonzero()[0, 0])
            raise GrpoInputError(
                name,
                "finite numbers at every counted token",
                row=row,
                got=f"{float(value[row, pos])} at position {pos}",
            )
        kept = torch.nan_to_num(kept, nan=0.0, posinf=0.0, neginf=0.0)  # only padding was non-finite
    entropy = name == "entropies"
    extreme = kept.min() < 0 if entropy else kept.max() > 0
    if bool(extreme):
        bad = mask & ((value < 0) if entropy else (value > 0))
        row = _first_row(bad)
        pos = int(bad[row].nonzero()[0, 0])
        expected = "entropies >= 0" if entropy else "log-probs <= 0 (a positive value usually means logits were passed)"
        raise GrpoInputError(name, expected, row=row, got=f"{float(value[row, pos]):g} at position {pos}")
    return kept


def from_rows(
    per_token_logps: Sequence[Sequence[float]],
    old_per_token_logps: Sequence[Sequence[float]] | None = None,
    ref_per_token_logps: Sequence[Sequence[float]] | None = None,
    completion_mask: Sequence[Sequence[float]] | None = None,
    entropies: Sequence[Sequence[float]] | None = None,
    **rest: Any,
) -> Batch:
    """A Batch from ragged rows (each row its own length): padded on the right, padding masked."""
    lengths = [len(row) for row in per_token_logps]
    if not lengths or min(lengths) == 0:
        row = lengths.index(0) if lengths else None
        raise GrpoInputError("per_token_logps", "at least one row, each with at least one token", row=row)
    T = max(lengths)

    def pad(name: str, rows: Sequence[Sequence[float]] | None, fill: float) -> np.ndarray | None:
        if rows is None:
            return None
        if len(rows) != len(lengths):
            raise GrpoInputError(name, f"{len(lengths)} rows like per_token_logps", got=f"{len(rows)} rows")
        out = np.full((len(lengths), T), fill, dtype=np.float64)
        for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
            if len(row) != n:
                raise GrpoInputError(name, f"{n} values like per_token_logps[{i}]", row=i, got=f"{len(row)}")
            try:
                out[i, :n] = row
            except (ValueError, TypeError) as exc:
                raise GrpoInputError(name, "a list of numbers", row=i) from exc
        return out

    present = np.zeros((len(lengths), T))
    for i, n in enumerate(lengths):
        present[i, :n] = 1
    mask = pad("completion_mask", completion_mask, 0.0)
    logps = pad("per_token_logps", per_token_logps, 0.0)
    assert logps is not None
    return Batch(
        per_token_logps=logps,
        old_per_token_logps=pad("old_per_token_logps", old_per_token_logps, 0.0),
        ref_per_token_logps=pad("ref_per_token_logps", ref_per_token_logps, 0.0),
        completion_mask=present if mask is None else mask * present,
        entropies=pad("entropies", entropies, 0.0),
        **rest,
    )
