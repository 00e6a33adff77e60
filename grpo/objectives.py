"""Per-token policy objectives: the term each token adds to J before aggregation.

Every objective has one signature (``grpo.surrogates.base.Objective``: the ratio, logp, advantages, its
settings and the batch's ObjectiveInputs) and returns ``ObjectiveTerms``; the policy loss of a token is
``-surrogate``. The objectives live by family in ``grpo.surrogates``; importing this module registers every
family, in the order the page and the API list them, and exposes what the rest of the library reads.
"""

from __future__ import annotations

# The families register in this order: clip; cispo, sapo, gpg; geo_mean, clip_cov, kl_cov; dppo_*, dro, vespo.
from grpo.surrogates import clip, soft, coupled, reinforce  # noqa: F401  # isort: skip
from grpo.surrogates.base import (
    OBJECTIVES,
    PER_UNIT_A,
    WEIGHT_ON_A_LOGP,
    Objective,
    ObjectiveInputs,
    ObjectiveRegistry,
    ObjectiveSettings,
    ObjectiveTerms,
    given_inputs,
    zero_outside,
)
from grpo.surrogates.clip import clipped_surrogate
from grpo.surrogates.regions import CLIP_HIGH, CLIP_LOW, DUAL_CLIP, MASKED, REGIONS, TRUST, above, below, regions

__all__ = [
    "CLIP_HIGH",
    "CLIP_LOW",
    "DUAL_CLIP",
    "MASKED",
    "OBJECTIVES",
    "PER_UNIT_A",
    "REGIONS",
    "TRUST",
    "WEIGHT_ON_A_LOGP",
    "Objective",
    "ObjectiveInputs",
    "ObjectiveRegistry",
    "ObjectiveSettings",
    "ObjectiveTerms",
    "above",
    "below",
    "clipped_surrogate",
    "given_inputs",
    "regions",
    "zero_outside",
]
