"""GRPO Lens: the GRPO-family loss of a batch, computed as TRL, verl or the article would, explained.

import grpo
batch = grpo.Batch(per_token_logps=lp, old_per_token_logps=old, ref_per_token_logps=ref,
                   completion_mask=mask, advantages=adv)
bd = grpo.evaluate(batch, grpo.LossConfig.from_preset("verl-grpo", beta=0.001))
bd.loss, bd.tokens.grad, bd.metrics["clip_ratio/region_mean"]
loss = grpo.compute_loss(batch, config)  # for training: differentiable in per_token_logps

Plugins: set GRPO_LENS_PLUGINS to comma-separated module names; each is imported at the end of
``import grpo`` and may register variants (``grpo.OBJECTIVES.register(...)``) and presets
(``grpo.register_preset(...)``), batch fields (``grpo.register_field(...)``) and file formats
(``grpo.register_format(...)``), which every part of GRPO Lens then offers (docs/extending.md).

Importing grpo changes nothing else in the process: no allocator tuning, thread counts or seeds
(``grpo._allocator.keep_freed_memory()`` is there for programs that want it).
"""

from grpo import capture
from grpo.advantages import ADVANTAGES
from grpo.aggregation import AGGREGATIONS
from grpo.batch import Batch, from_rows
from grpo.config import FIELD_NAMES, FIELDS, PRESETS, REGISTRIES, LossConfig, Preset, register_preset
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS, BatchField, register_field
from grpo.io import UPLOAD_FORMATS, UploadFormat, register_format  # registers the built-in formats
from grpo.kl import KL_ESTIMATORS
from grpo.logits import TokenLogprobs, token_logprobs
from grpo.loss import Breakdown, RowBreakdown, TokenBreakdown, compute_loss, evaluate
from grpo.objectives import OBJECTIVES, REGIONS
from grpo.plugins import PLUGINS_VARIABLE, load_plugins
from grpo.registry import Registry
from grpo.runs import RunWriter, list_runs, load_run, load_step
from grpo.trainer_config import TrainerMapping, map_trl, map_verl

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "BATCH_FIELDS",
    "FIELDS",
    "FIELD_NAMES",
    "KL_ESTIMATORS",
    "OBJECTIVES",
    "PLUGINS_VARIABLE",
    "PRESETS",
    "REGIONS",
    "REGISTRIES",
    "UPLOAD_FORMATS",
    "Batch",
    "BatchField",
    "Breakdown",
    "GrpoInputError",
    "LossConfig",
    "Preset",
    "Registry",
    "RowBreakdown",
    "RunWriter",
    "TokenBreakdown",
    "TokenLogprobs",
    "TrainerMapping",
    "UploadFormat",
    "capture",
    "compute_loss",
    "evaluate",
    "from_rows",
    "list_runs",
    "load_plugins",
    "load_run",
    "load_step",
    "map_trl",
    "map_verl",
    "register_field",
    "register_format",
    "register_preset",
    "token_logprobs",
]

load_plugins()  # last: a plugin imports grpo and finds it whole
