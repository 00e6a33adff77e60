"""GRPO Lens: the GRPO-family loss of a batch, computed as TRL, verl or the article would, explained.

import grpo
batch = grpo.Batch(per_token_logps=lp, old_per_token_logps=old, ref_per_token_logps=ref,
                   completion_mask=mask, advantages=adv)
bd = grpo.evaluate(batch, grpo.LossConfig.from_preset("verl-grpo", beta=0.001))
bd.loss, bd.tokens.grad, bd.metrics["clip_ratio/region_mean"]
"""

from typing import Any

from grpo._allocator import keep_freed_memory
from grpo.advantages import ADVANTAGES
from grpo.aggregation import AGGREGATIONS
from grpo.batch import Batch, from_rows
from grpo.config import FIELD_NAMES, PRESETS, LossConfig, Preset
from grpo.errors import GrpoInputError
from grpo.kl import KL_ESTIMATORS
from grpo.logits import TokenLogprobs, token_logprobs
from grpo.loss import Breakdown, RowBreakdown, TokenBreakdown, compute_loss, evaluate
from grpo.objectives import OBJECTIVES, REGIONS
from grpo.registry import Registry

keep_freed_memory()

REGISTRIES: dict[str, Registry[Any]] = {
    "advantage": ADVANTAGES,
    "objective": OBJECTIVES,
    "kl_estimator": KL_ESTIMATORS,
    "aggregation": AGGREGATIONS,
}

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "FIELD_NAMES",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "PRESETS",
    "REGIONS",
    "REGISTRIES",
    "Batch",
    "Breakdown",
    "GrpoInputError",
    "LossConfig",
    "Preset",
    "RowBreakdown",
    "TokenBreakdown",
    "TokenLogprobs",
    "compute_loss",
    "evaluate",
    "from_rows",
    "token_logprobs",
]
