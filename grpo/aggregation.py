"""Aggregations: the coefficient each token's loss gets in the scalar, as a (B, T) weight.

Every aggregation takes the 0/1 ``mask`` (B, T) of the tokens that count, its ``settings`` (the
fields of AggregationSettings; a LossConfig is one) and the padded completion width, and returns
``weight`` (B, T), zero where the mask is: the loss is sum(weight * per_token_loss). ``n_rows``
is the number of rows a sequence mean divides by: all of them (TRL), or those with at least one
token (verl, ``skip_empty_rows``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import Tensor

from grpo.marks import mark
from grpo.registry import AggregationRegistry


class AggregationSettings(Protocol):
    """The settings aggregations read (LossConfig fields)."""

    @property
    def skip_empty_rows(self) -> bool: ...
    @property
    def length_epsilon(self) -> float: ...
    @property
    def max_completion_length(self) -> int | None: ...
    @property
    def token_normalizer(self) -> float | None: ...
    @property
    def sequence_normalizer(self) -> float | None: ...


Aggregation = Callable[[Tensor, AggregationSettings, int], Tensor]
AGGREGATIONS: AggregationRegistry[Aggregation] = AggregationRegistry("aggregation")


def n_rows(mask: Tensor, config: AggregationSettings) -> Tensor:
    """Rows a sequence mean divides by (at least 1): the trainer's global count when given. (B, T) -> ()"""
    if config.sequence_normalizer is not None:
        return mask.new_tensor(config.sequence_normalizer)
    if config.skip_empty_rows:
        return (mask.sum(-1) > 0).sum().clamp(min=1).to(mask.dtype)
    return mask.new_tensor(mask.shape[0])


@AGGREGATIONS.register("seq-mean-token-mean", label="per-sequence token mean")
def seq_mean_token_mean(mask: Tensor, config: AggregationSettings, width: int) -> Tensor:
    """Per-sequence token mean, then the mean over sequences (GRPO paper, the article).

    Each row weighs the same whatever its length, so a token of a short answer counts more than
    one of a long answer: the length bias Dr. GRPO points out. TRL ``grpo``/``sapo``, verl
    ``seq-mean-token-mean``. Weight 1 / (n_rows · (L_i + length_epsilon)).
    Paper: https://arxiv.org/abs/2402.03300
    """
    lengths = mask.sum(-1, keepdim=True).clamp(min=1) + config.length_epsilon  # (B, 1)
    return mask / (lengths * n_rows(mask, config))


@AGGREGATIONS.register("token-mean", label="token mean")
def token_mean(mask: Tensor, config: AggregationSettings, width: int) -> Tensor:
    """Mean over every token of the batch: each token weighs the same (DAPO, BNPO).

    TRL ``dapo`` (default), ``bnpo``, ``cispo`` on one process; verl ``token-mean``.
    Weight 1 / (total tokens), or 1 / token_normalizer: the trainer's count over the whole
    generation or mini-batch, so that micro-batch losses add up to one global token mean.
    Paper: https://arxiv.org/abs/2503.14476
    """
    if config.token_normalizer is not None:
        return mask / config.token_normalizer
    return mask / mask.sum().clamp(min=1)


@AGGREGATIONS.register("seq-mean-token-sum", label="per-sequence token sum")
def seq_mean_token_sum(mask: Tensor, config: AggregationSettings, width: int) -> Tensor:
    """Per-sequence token sum, then the mean over sequences: longer rows weigh more.

    verl ``seq-mean-token-sum``; TRL ``luspo``. Weight 1 / n_rows.
    Paper: https://arxiv.org/abs/2503.20783
    """
    return mask / n_rows(mask, config)


def constant_warnings(config: AggregationSettings, longest_row: int) -> list[str]:
    """A constant divisor far from the batch's longest row: usually a max_completion_length that
    is not the run's (TRL's default 512 for a run that used 16 makes the loss 32x too small)."""
    constant = config.max_completion_length
    if constant is None or not longest_row or 0.5 * longest_row <= constant <= 2 * longest_row:
        return []
    return [
        f"max_completion_length = {mark('config/max_completion_length', constant, 12)} is far from the longest "
        f"counted row ({mark('metrics/completions/max_length', longest_row, 12)} tokens): the loss is divided by it, "
        f"so it comes out {mark('lens/warnings/constant_scale', longest_row / constant)}x what a constant of "
        f"{mark('metrics/completions/max_length', longest_row, 12)} gives; set it to the run's max_completion_length."
    ]


@AGGREGATIONS.register("seq-mean-token-sum-norm", label="Dr. GRPO constant", warnings=constant_warnings)
def seq_mean_token_sum_norm(mask: Tensor, config: AggregationSettings, width: int) -> Tensor:
    """Dr. GRPO: token sum / (n_rows · a constant), the constant max_completion_length.

    Unbiased in length: every token weighs the same, and the scale does not move with the
    batch's lengths. TRL ``dr_grpo``; verl ``seq-mean-token-sum-norm`` with ``loss_scale_factor``
    (None there and here: the padded completion width). Weight 1 / (n_rows · C).
    Paper: https://arxiv.org/abs/2503.20783
    """
    constant = config.max_completion_length or max(width, 1)  # width 0: every position is prompt
    return mask / (n_rows(mask, config) * constant)
