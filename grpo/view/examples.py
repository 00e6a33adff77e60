"""Ready-made batches: the article's example and the dashboard's teaching scenarios.

Each scenario is data: the fields of an ``/api/v1/loss`` request (ragged rows, TRL names), a
preset, and two or three sentences on what to notice. ``scenario_batch`` turns one into a Batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from grpo.batch import Batch
from grpo.registry import by_name
from grpo.requests import batch_from_request

# The article's grpo_loss demo: log_softmax of torch.randn(3, 5, 32) logits gathered at its
# token_ids (policy, reference and old policy from independent draws; seeded here, rounded to
# 4 decimals so the numbers are stable), prompt length 3, advantages [-1, 2, 1].
ARTICLE_EXAMPLE: dict[str, Any] = {
    "per_token_logps": [
        [-4.1773, -4.2033, -4.179, -3.4714, -2.5207],
        [-3.5007, -2.8572, -3.4608, -4.0135, -3.2377],
        [-4.3337, -4.7927, -2.7413, -4.0487, -4.6678],
    ],
    "ref_per_token_logps": [
        [-3.9636, -3.7845, -5.1826, -3.2988, -4.0074],
        [-3.761, -2.5917, -4.0781, -3.7282, -3.79],
        [-4.9879, -3.298, -3.7463, -3.1562, -2.8923],
    ],
    "old_per_token_logps": [
        [-5.1682, -4.2585, -3.0502, -7.4321, -2.8974],
        [-4.6044, -3.1265, -4.0572, -2.7444, -4.8416],
        [-2.9801, -2.6088, -4.6922, -4.0029, -5.4988],
    ],
    "advantages": [-1.0, 2.0, 1.0],
    "prompt_lengths": 3,
    "tokens": [["11", "12", "13", "14", "15"], ["11", "12", "13", "15", "16"], ["11", "12", "13", "16", "17"]],
}


@dataclass(frozen=True)
class Scenario:
    """A batch the page offers as a starting point, with the setting it teaches."""

    name: str
    title: str
    """The menu's label."""
    notes: str
    """What to look at, shown beside the batch."""
    request: dict[str, Any]
    """The /api/v1/loss body, without its config."""
    preset: str = "article"
    overrides: dict[str, Any] = field(default_factory=dict)
    """Config fields set over the preset when the scenario loads."""


def _row(*values: float) -> list[float]:
    return list(values)


# The mismatch scenarios' log-probs: spread and gaps from a fixed sine, so a scenario stays data (the same
# numbers on every machine), with the look of noise.
def _logps(n: int, seed: float, low: float = -2.4, high: float = -0.2) -> list[float]:
    """n log-probs between low and high."""
    return [round(low + (high - low) * (0.5 + 0.5 * math.sin(7.3 * seed + 2.9 * k)), 3) for k in range(n)]


def _sampled(logps: list[float], bias: float, wobble: float, seed: float) -> list[float]:
    """The sampler's log-probs of the same tokens: old - (bias + a wobble), i.e. old - sampler = bias ± wobble."""
    return [round(v - bias - wobble * math.sin(3.7 * seed + 1.9 * k + 0.5), 4) for k, v in enumerate(logps)]


_BF16_LENGTHS = (7, 12, 9, 11, 6, 10, 12, 8)
_BF16 = [_logps(n, i) for i, n in enumerate(_BF16_LENGTHS)]
_LONG = [_logps(5, 10), _logps(6, 11), _logps(5, 12), _logps(40, 13)]
_ONE = [_logps(6, 20 + i) for i in range(4)]
_ONE_SAMPLED = [_sampled(row, 0.0, 0.02, 20 + i) for i, row in enumerate(_ONE)]
_ONE_SAMPLED[1][3] = round(_ONE[1][3] - 5.9, 4)  # the sampler gave this token 5.9 nats less: ratio e^5.9 ≈ 365


SCENARIOS: dict[str, Scenario] = by_name(
    [
        Scenario(
            "article",
            "The article's example",
            "Three responses to one prompt, five positions of which the first three are the prompt "
            "(masked out), advantages [-1, 2, 1]. The old and reference policies are independent "
            "random draws, so the ratios are far from 1 (0.28 to 52) and two of the six completion "
            "tokens sit in a flat clip region: look at which tokens still get a gradient (the ratio-52 "
            "token with A < 0 keeps an unbounded one), and why the loss has its sign.",
            ARTICLE_EXAMPLE,
        ),
        Scenario(
            "on-policy",
            "On-policy: ratio 1, loss about 0, gradient not",
            "The first update after sampling: old = current, so every ratio is exactly 1 and no token "
            "can clip. The advantages of the group sum to zero, so the policy part of the loss is "
            "about 0; only beta times the KL remains. Yet the gradient is far from zero: each token is "
            "pushed up or down by its row's advantage.",
            {
                "per_token_logps": [
                    _row(-0.9, -1.4, -0.3, -2.0),
                    _row(-1.1, -0.7, -1.9),
                    _row(-0.4, -0.6, -1.2, -0.8, -1.5),
                    _row(-2.2, -0.5),
                ],
                "ref_per_token_logps": [
                    _row(-1.0, -1.3, -0.35, -1.9),
                    _row(-1.0, -0.8, -1.7),
                    _row(-0.5, -0.6, -1.0, -0.9, -1.4),
                    _row(-2.0, -0.6),
                ],
                "rewards": [1.0, 0.0, 1.0, 0.0],
                "group_size": 4,
                "tokens": [
                    ["The", " answer", " is", " 4"],
                    ["It", " is", " 5"],
                    ["2", "+", "2", " =", " 4"],
                    ["Five", "."],
                ],
            },
        ),
        Scenario(
            "off-policy-clipping",
            "Off-policy: clipping on both sides",
            "The policy has moved since sampling: some ratios are above 1 + epsilon, some below "
            "1 - epsilon. A token is clipped only when the move goes the way the advantage wants "
            "(up for A > 0, down for A < 0): those sit on the flat parts of the curve and get no "
            "policy gradient, while tokens that moved the wrong way keep theirs.",
            {
                "per_token_logps": [
                    _row(-0.5, -0.9, -1.2, -0.4),
                    _row(-1.6, -0.6, -2.3, -0.8),
                    _row(-0.7, -2.6, -0.9, -1.1),
                    _row(-1.9, -0.5, -0.6, -2.8),
                ],
                "old_per_token_logps": [
                    _row(-0.9, -1.0, -0.9, -0.8),
                    _row(-1.2, -0.9, -1.8, -0.7),
                    _row(-0.8, -2.0, -1.3, -1.1),
                    _row(-1.4, -0.9, -0.8, -2.0),
                ],
                "ref_per_token_logps": [
                    _row(-0.8, -1.0, -1.0, -0.7),
                    _row(-1.3, -0.8, -1.9, -0.7),
                    _row(-0.8, -2.1, -1.2, -1.0),
                    _row(-1.5, -0.8, -0.8, -2.1),
                ],
                "rewards": [1.0, 0.0, 1.0, 0.0],
                "group_size": 4,
            },
        ),
        Scenario(
            "all-correct",
            "An all-correct group: zero std, no signal",
            "Every completion got the same reward, so the group's reward std is 0 and every advantage "
            "is 0 (frac_reward_zero_std = 1). The policy term vanishes, loss and gradient alike: only "
            "the KL term is left. All-wrong groups look the same; GRPO cannot tell them apart.",
            {
                "per_token_logps": [
                    _row(-0.3, -0.8, -0.2),
                    _row(-0.4, -0.5, -0.9, -0.3),
                    _row(-0.6, -0.2),
                    _row(-0.5, -0.4, -0.7),
                ],
                "old_per_token_logps": [
                    _row(-0.35, -0.7, -0.25),
                    _row(-0.4, -0.6, -0.8, -0.3),
                    _row(-0.5, -0.25),
                    _row(-0.5, -0.45, -0.6),
                ],
                "ref_per_token_logps": [
                    _row(-0.5, -0.9, -0.3),
                    _row(-0.6, -0.6, -1.0, -0.4),
                    _row(-0.8, -0.3),
                    _row(-0.7, -0.6, -0.8),
                ],
                "rewards": [1.0, 1.0, 1.0, 1.0],
                "group_size": 4,
            },
        ),
        Scenario(
            "length-bias",
            "A long wrong answer and a short right one",
            "On-policy, two right answers of 3 tokens and two wrong answers of 12. With the per-sequence "
            "mean (GRPO, the article) each token of a short answer weighs 4 times a token of a long one, "
            "so the long wrong answers are pushed down gently per token: switch the aggregation to "
            "token-mean or seq-mean-token-sum-norm (Dr. GRPO), or open Compare, to see the weights change.",
            {
                "per_token_logps": [
                    _row(-0.2, -0.5, -0.3),
                    [-0.9, -1.1, -0.7, -1.3, -0.8, -1.0, -1.2, -0.9, -1.4, -0.6, -1.1, -0.8],
                    _row(-0.3, -0.4, -0.2),
                    [-1.0, -0.8, -1.2, -0.9, -1.5, -0.7, -1.1, -1.3, -0.9, -1.0, -0.8, -1.2],
                ],
                "rewards": [1.0, 0.0, 1.0, 0.0],
                "group_size": 4,
            },
        ),
        Scenario(
            "kl-blowup",
            "KL blow-up: pi far below pi_ref",
            "Some tokens the reference finds likely now have tiny probability under the policy "
            "(log-prob -9 against -0.4). k3 = exp(ref - logp) - (ref - logp) - 1 grows exponentially, so "
            "a handful of tokens dominate the loss through beta times the KL, and their gradient pushes "
            "them back up hard. verl clamps k3 at 10 (kl_clamp): try the verl-grpo preset. Switch "
            "kl_estimator: k2 = (logp - ref)²/2 grows only quadratically, and k1 = logp - ref is -8.6 on "
            "those tokens: negative, so it lowers the loss, with the same gradient on every token.",
            {
                "per_token_logps": [_row(-0.5, -9.0, -0.6), _row(-0.7, -0.4, -8.5, -0.5), _row(-0.6, -0.5, -0.4)],
                "old_per_token_logps": [_row(-0.5, -8.8, -0.6), _row(-0.7, -0.4, -8.4, -0.5), _row(-0.6, -0.5, -0.4)],
                "ref_per_token_logps": [_row(-0.6, -0.4, -0.5), _row(-0.6, -0.5, -0.3, -0.6), _row(-0.5, -0.6, -0.5)],
                "rewards": [1.0, 0.0, 0.5],
                "group_size": 3,
            },
            overrides={"beta": 0.04},
        ),
        Scenario(
            "negative-loss",
            "A negative loss: the good tokens already moved up",
            "After a few updates on this batch the right answers (rewards 1) became likelier than when "
            "they were sampled (ratios 1.04 to 1.11) and the wrong ones less likely (0.87 to 0.95), all "
            "inside the trust region. The surrogate A·ratio is then larger than A on every row, so the "
            "weighted surrogate is positive and exceeds beta·KL (k3, small): the loss is negative. "
            "Nothing is wrong: a negative loss says this batch's tokens already moved the way their advantages "
            "want since sampling. It is not a measure of progress (the reward is): the sign follows the ratios.",
            {
                "per_token_logps": [
                    _row(-0.40, -0.86, -0.25),
                    _row(-1.34, -0.74, -1.10),
                    _row(-0.56, -0.35, -0.95),
                    _row(-1.09, -1.64, -0.90),
                ],
                "old_per_token_logps": [
                    _row(-0.50, -0.95, -0.30),
                    _row(-1.20, -0.65, -1.05),
                    _row(-0.60, -0.45, -1.05),
                    _row(-1.00, -1.50, -0.80),
                ],
                "ref_per_token_logps": [
                    _row(-0.52, -0.93, -0.31),
                    _row(-1.22, -0.66, -1.04),
                    _row(-0.61, -0.44, -1.02),
                    _row(-1.02, -1.48, -0.82),
                ],
                "rewards": [1.0, 0.0, 1.0, 0.0],
                "group_size": 4,
            },
        ),
        Scenario(
            "k1-negative",
            "k1: a negative KL estimate",
            "The same kind of drift as the KL blow-up, estimated with k1 = logp - ref, the plain log-ratio "
            "(TRL's and verl's default is k3). Where the policy gives a token less probability than the "
            "reference, k1 is negative (-8.6 here): the batch's kl can go below 0 and beta·KL then lowers "
            "the loss. k1's gradient is beta times the token's weight on every token alike, however far it "
            "drifted; k2 = (logp - ref)²/2 and k3 = exp(ref - logp) - (ref - logp) - 1 are never negative "
            "and grow with the gap.",
            {
                "per_token_logps": [_row(-0.5, -9.0, -0.6), _row(-0.7, -0.4, -0.5), _row(-0.6, -0.5, -0.4)],
                "old_per_token_logps": [_row(-0.5, -8.9, -0.6), _row(-0.7, -0.4, -0.5), _row(-0.6, -0.5, -0.4)],
                "ref_per_token_logps": [_row(-0.6, -0.4, -0.5), _row(-0.6, -0.5, -0.4), _row(-0.5, -0.6, -0.5)],
                "rewards": [1.0, 0.0, 0.5],
                "group_size": 3,
            },
            overrides={"beta": 0.04, "kl_estimator": "k1"},
        ),
        Scenario(
            "mismatch-bf16",
            "Sampler vs trainer: bf16 noise everywhere",
            "The first update after sampling (old = current), but the log-probs came from a different engine: "
            "the sampler (vLLM, SGLang, bf16 kernels) and the trainer disagree by a few hundredths of a nat on "
            "every token, both ways. TRL's default with vLLM is sequence_mask with C_max 3: a row's ratio "
            "exp(Σ old − sampler) stays near 1 here, so every row keeps its weight. Open the Mismatch view: "
            "the tokens hug the diagonal. Switch rollout_correction to see that none of its modes acts on noise "
            "this small.",
            {
                "per_token_logps": _BF16,
                "sampling_per_token_logps": [_sampled(row, 0.005, 0.04, i) for i, row in enumerate(_BF16)],
                "rewards": [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0],
                "group_size": 4,
            },
            preset="trl-grpo",
            overrides={"rollout_correction": "sequence_mask", "rollout_is_max": 3.0},
        ),
        Scenario(
            "mismatch-long-row",
            "Sampler vs trainer: a long row's small gaps add up",
            "Each token's gap is small (about 0.03 nats: a token ratio of 1.03, inside any token bound), but "
            "the 40-token row has the same small bias on every token. At sequence level the gaps multiply: "
            "its ratio exp(Σ) is about 3.4, past sequence_mask's C_max 3, so TRL drops the whole row, a right "
            "answer and most of the batch's tokens. Try sequence_truncate (the row keeps weight 3) or "
            "token_truncate (nothing acts): the Mismatch view's sentences say what each did and the loss "
            "without it.",
            {
                "per_token_logps": _LONG,
                "sampling_per_token_logps": [_sampled(row, 0.031, 0.01, 10 + i) for i, row in enumerate(_LONG)],
                "rewards": [0.0, 1.0, 0.0, 1.0],
                "group_size": 4,
            },
            preset="trl-grpo",
            overrides={"rollout_correction": "sequence_mask", "rollout_is_max": 3.0},
        ),
        Scenario(
            "mismatch-one-token",
            "Sampler vs trainer: one token scored far lower",
            "The sampler gave one token (row 1, position 3) 5.9 nats less than the trainer does: its ratio "
            "exp(old − sampler) is about 365, a token the trainer would never have sampled this way. verl's "
            "IcePop (token_mask with [0.5, 2]) zeroes that token's policy term and keeps the rest of the row; "
            "sequence_mask would drop the whole row, token_truncate would keep it at weight 2. The Mismatch "
            "view shows it far off the diagonal.",
            {
                "per_token_logps": _ONE,
                "sampling_per_token_logps": _ONE_SAMPLED,
                "rewards": [1.0, 0.0, 0.0, 1.0],
                "group_size": 4,
            },
            preset="verl-grpo",
            overrides={
                "rollout_correction": "token_mask",
                "rollout_is_min": 0.5,
                "rollout_is_max": 2.0,
                "rollout_is_log_ratio_clamp": 20.0,
            },
        ),
    ]
)


def scenario_batch(name: str) -> Batch:
    return batch_from_request(SCENARIOS[name].request)
