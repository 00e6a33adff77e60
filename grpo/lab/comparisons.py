"""Canned comparisons for a workshop: sets of lab runs that differ in one choice, and what to watch.

Each comparison is data: its runs (LabConfigs that differ in the setting under study), the charts
that show the lesson, and a short text saying what to look for. The page launches the runs and
overlays them; the tests hold the length comparison's claim.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo.config import LossConfig
from grpo.lab.tasks import TASKS
from grpo.lab.train import LabConfig
from grpo.registry import by_name


@dataclass(frozen=True)
class Comparison:
    name: str
    title: str
    watch: str
    """What to look for, in two or three sentences."""
    metrics: tuple[str, ...]
    """The charts that carry the lesson (the page puts them first)."""
    runs: tuple[LabConfig, ...]
    overlay: bool = False
    """Draw ``metrics`` on one chart (two y-axes) instead of one chart each."""


_ARTICLE = LossConfig.from_preset("article")
_DR_GRPO = LossConfig.from_preset(
    "article",
    aggregation="seq-mean-token-sum-norm",
    advantage="none",
    max_completion_length=TASKS["length"].max_completion_length,
)

COMPARISONS: dict[str, Comparison] = by_name(
    [
        Comparison(
            "length-bias",
            "GRPO vs Dr. GRPO on the length task",
            "Most answers stay wrong. GRPO divides each answer's loss by its own length, so a long wrong "
            "answer is penalised less per token than a short one: mean length climbs. Dr. GRPO divides by a "
            "constant and drops the std scaling: every token weighs the same and lengths do not climb.",
            ("completions/mean_length", "completions/max_length", "reward"),
            (LabConfig(task="length", loss=_ARTICLE, steps=100), LabConfig(task="length", loss=_DR_GRPO, steps=100)),
        ),
        Comparison(
            "kl-leash",
            "beta 0 vs beta 0.04",
            "With beta 0 nothing pulls the policy back to the reference: kl grows without a leash. With beta "
            "0.04 the KL term (kl_loss) pushes back and kl levels off lower, at a small cost in reward speed.",
            ("kl", "kl_loss", "reward"),
            (
                LabConfig(loss=_ARTICLE.replace(beta=0.0, preset=None)),
                LabConfig(loss=_ARTICLE.replace(beta=0.04, preset=None)),
            ),
        ),
        Comparison(
            "clip-higher",
            "epsilon_high 0.2 vs 0.28 (DAPO clip-higher)",
            "Samples are reused (4 iterations), so ratios leave 1 and clip. A symmetric clip caps how fast a "
            "rare token's probability can rise; clip-higher (0.28) loosens that cap, so fewer tokens clip high "
            "and entropy collapses more slowly.",
            ("entropy", "clip_ratio/high_mean", "reward"),
            (
                LabConfig(loss=_ARTICLE.replace(epsilon_high=0.2), num_iterations=4, learning_rate=1e-2),
                LabConfig(loss=_ARTICLE.replace(epsilon_high=0.28), num_iterations=4, learning_rate=1e-2),
            ),
        ),
        Comparison(
            "iterations",
            "1 vs 4 iterations per rollout",
            "With one optimiser step per rollout the ratio is exactly 1 and nothing ever clips. Reusing each "
            "rollout for 4 steps moves the policy away from the one that sampled: ratios leave 1 and the clip "
            "fractions jump on the 2nd, 3rd and 4th step of each rollout.",
            ("clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean"),
            (LabConfig(loss=_ARTICLE, num_iterations=1), LabConfig(loss=_ARTICLE, num_iterations=4)),
        ),
        Comparison(
            "loss-not-progress",
            "The loss is not progress",
            "The article's Figure 1: reward climbs while the loss hovers near zero. On-policy, the clipped "
            "surrogate's value is the mean advantage, which is zero by construction in every group; what is "
            "left is beta times the KL. The loss's gradient trains the model; its value says little.",
            ("reward", "loss"),
            (LabConfig(loss=_ARTICLE),),
            overlay=True,
        ),
    ]
)
