"""Canned comparisons for a workshop: sets of lab runs that differ in one choice, and what to watch.

Each comparison is data: its runs (LabConfigs that differ in the setting under study, and in nothing
else: ``changes()`` lists what differs, and a test holds it to one setting), the charts that show
the lesson, and a short text saying what to look for. The page launches the runs and overlays them;
the tests hold the length comparison's claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    def changes(self) -> dict[str, list[Any]]:
        """Each setting whose value differs between the runs (loop knobs by name, loss fields under
        ``config.``), with every run's value in order."""
        flat = [_flat(run) for run in self.runs]
        keys = sorted({k for f in flat for k in f})
        return {k: [f.get(k) for f in flat] for k in keys if len({repr(f.get(k)) for f in flat}) > 1}


def _flat(run: LabConfig) -> dict[str, Any]:
    fields = run.to_dict()
    loss = fields.pop("loss")
    return fields | {f"config.{k}": v for k, v in loss.items() if k != "preset"}


_ARTICLE = LossConfig.from_preset("article")
# Dr. GRPO's aggregation, and only it: the token sum over a constant, the task's longest completion (TRL's
# trl-dr_grpo preset takes max_completion_length from GRPOConfig; Dr. GRPO's paper also drops the std
# scaling, which the preset, like this comparison, keeps: one change, one cause).
# Both runs carry the constant (only Dr. GRPO's aggregation reads it), so the aggregation is all that differs.
_GRPO_LENGTH = _ARTICLE.replace(max_completion_length=TASKS["length"].max_completion_length)
_DR_GRPO = _GRPO_LENGTH.replace(aggregation=LossConfig.from_preset("trl-dr_grpo").aggregation)
_DR_PRESET = LossConfig.from_preset("trl-dr_grpo")

COMPARISONS: dict[str, Comparison] = by_name(
    [
        Comparison(
            "length-bias",
            f"GRPO vs Dr. GRPO's aggregation ({_ARTICLE.aggregation} vs {_DR_GRPO.aggregation}) on the length task",
            "One setting changes: the aggregation. Most answers stay wrong. GRPO divides each answer's loss by "
            "its own length, so a long wrong answer is penalised less per token than a short one: mean length "
            f"climbs. Dr. GRPO's {_DR_GRPO.aggregation} divides every answer's token sum by one constant "
            f"(max_completion_length = {_DR_GRPO.max_completion_length}, the task's longest answer): a long wrong "
            "answer's tokens weigh what a short one's do, and length climbs far more slowly. Both keep "
            f"{_ARTICLE.advantage} advantages "
            f"(the trl-dr_grpo preset too: advantage = {_DR_PRESET.advantage}, max_completion_length = "
            f"{_DR_PRESET.max_completion_length}, TRL's default).",
            ("completions/mean_length", "completions/max_length", "reward"),
            (
                LabConfig(task="length", loss=_GRPO_LENGTH, steps=100),
                LabConfig(task="length", loss=_DR_GRPO, steps=100),
            ),
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
