"""The counted tokens of one breakdown, read once for every sentence and chart that needs them.

On a batch of 256 x 4096 tokens a pass over a (B, T) tensor costs about a millisecond and a boolean gather
``x[mask]`` tens: the explanation's sentences share these instead of each making its own, and count with
``count_nonzero`` (a bool ``sum`` first widens every element to int64).
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor

from grpo.corrections import KEPT
from grpo.loss import Breakdown


class Counted:
    """``bd.tokens.mask`` (the tokens that count) and what is read of it: how many, per row, and the counted
    values of any (B, T) tensor in row order, as ``t[mask]`` gives them."""

    def __init__(self, bd: Breakdown) -> None:
        self.mask = bd.tokens.mask
        self._flat = self.mask.reshape(-1)

    @cached_property
    def n(self) -> int:
        """How many tokens count."""
        return sum(self.lengths)

    @cached_property
    def lengths(self) -> list[int]:
        """Per row, how many of its tokens count: the bool mask's bytes summed as int8 (count_nonzero along a
        row costs twice the pass)."""
        return self.mask.view(torch.int8).sum(-1, dtype=torch.int32).tolist()

    @cached_property
    def _index(self) -> Tensor | None:
        """The counted positions of the flattened batch; None when every token counts."""
        return None if self.n == self._flat.numel() else self._flat.nonzero().squeeze(1)

    def values(self, t: Tensor) -> Tensor:
        """``t[mask]``: the counted tokens' values in row order, the same elements in the same order (a sum over
        them is the same to the bit); a view of ``t`` when every token counts."""
        flat = t.reshape(-1)
        return flat if self._index is None else flat[self._index]


def correction_acted(bd: Breakdown) -> bool:
    """Whether a rollout correction acted on some token: a code past KEPT in ``tokens.correction`` (its largest
    code, one pass over int8)."""
    code = bd.tokens.correction
    return code.numel() > 0 and int(code.max()) > KEPT


BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
"""Each float type's integer type of the same width: its values' bits, selected as integers (``extent``)."""


def extent(values: Tensor, where: Tensor) -> tuple[float, float]:
    """(min, max) of ``values`` where the int8 indicator ``where`` (same shape (B, T), some 1) is 1: the numbers
    ``values[where.bool()]`` gives, every other token taking the value of one picked token, which moves neither
    end. The values are picked by their bits, as integers: a boolean index of a million tokens costs several
    passes, and torch.where branches on each token (slower still on two threads)."""
    row = int(where.amax(-1).argmax())  # (B, T) -> (B,): the first row with a picked token
    bits = BITS[values.dtype]
    one = values[row, int(where[row].argmax())].view(bits)
    keep = where.to(bits).neg_()  # all ones where picked, all zeros elsewhere
    picked = values.view(bits) ^ one  # then & keep, ^ one: a value's bits where picked, one's elsewhere
    picked &= keep
    picked ^= one
    low, high = torch.aminmax(picked.view(values.dtype))
    return float(low), float(high)
