"""The sentences on the loss itself: why it has its sign and size, what the ratio of 1 means on-policy, and
what the KL estimate does (a negative estimate, a KL that dominates or is off)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from grpo.corrections import MASKED, REJECTED, SEQUENCE_MASKED
from grpo.loss import Breakdown
from grpo.marks import mark
from grpo.objectives import REGIONS
from grpo.view.counted import Counted

NEAR_ZERO = 0.01  # a loss below this share of the total size of its per-token terms is "small next to them"


@dataclass(frozen=True)
class TermSizes:
    """The total size of the per-token terms: Σ|policy term| and Σ|KL term| (0-d tensors, summed once)."""

    policy: Tensor
    kl: Tensor


def term_sizes(bd: Breakdown) -> TermSizes:
    return TermSizes(bd.tokens.policy_loss.abs().sum(), bd.tokens.kl_loss.abs().sum())


def sign_sentence(bd: Breakdown, counted: Counted, sizes: TermSizes) -> str:
    """Why the loss has its sign: the weighted surrogate S against beta·KL K, since loss = K - S.

    "About 0" is relative to the size of the per-token terms being summed (their absolute sum):
    a loss of 1e-8 from terms of size 1 is cancellation, not a small batch.
    """
    loss, surrogate, kl = float(bd.loss), -float(bd.policy_loss), float(bd.kl_loss)
    policy_size = float(sizes.policy)
    size = policy_size + float(sizes.kl)
    L, S, K = mark("loss", loss), mark("weighted_surrogate", surrogate), mark("kl_loss", kl)
    if abs(loss) <= 1e-5 * size:
        return (
            f"The loss is about 0 ({mark('loss', loss, 3)}): its per-token terms, of total size "
            f"{mark('lens/why/term_size', size)}, cancel (weighted surrogate {S}, beta·KL {K})."
        )
    if loss < 0:
        below = " (itself negative: see the KL estimate below)" if kl < 0 else ""
        return f"The loss is negative ({L}) because the weighted surrogate {S} exceeds beta·KL {K}{below}." + (
            _negative_drivers(bd, counted)
        )
    if policy_size == 0:
        return f"The loss is positive ({L}): every policy term is 0 (no advantage), so the loss is beta·KL."
    if abs(surrogate) <= 1e-5 * policy_size:
        return (
            f"The loss is positive ({L}): the policy terms cancel to about 0 "
            f"({mark('weighted_surrogate', surrogate, 3)}, from terms of total size "
            f"{mark('lens/why/policy_term_size', policy_size)}), so what is left is beta·KL {K}."
        )
    if surrogate > 0:
        return f"The loss is positive ({L}) because beta·KL {K} exceeds the weighted surrogate {S}."
    if kl > -surrogate:
        return (
            f"The loss is positive ({L}), mostly from beta·KL {K}; the weighted surrogate is negative too "
            f"({S}): the tokens with A < 0 weigh more than those with A > 0."
        )
    return (
        f"The loss is positive ({L}) because the weighted surrogate is itself negative ({S}): "
        f"the tokens with A < 0 outweigh those with A > 0; beta·KL adds {K}."
    )


def _negative_drivers(bd: Breakdown, counted: Counted) -> str:
    """Which rows carry the negative loss, and the tokens that make the surrogate positive:
    A > 0 tokens whose ratio rose above 1 (the policy already likes them more than when sampled)."""
    shares = bd.rows.loss.tolist()
    order = sorted((i for i, share in enumerate(shares) if share < 0), key=lambda i: (shares[i], i))[:2]
    rows = " and ".join(f"row {i} ({mark(f'rows/loss/{i}', shares[i])})" for i in order)
    text = f" The most negative loss shares: {rows}." if rows else ""
    t = bd.tokens
    rose = (t.advantage > 0) & (t.ratio > 1) & counted.mask
    n_rose = int(torch.count_nonzero(rose))
    if n_rose:
        top = float(t.ratio[rose].max())
        clipped = rose & (t.clipped_ratio < t.ratio) & (t.region > REGIONS.index("trust"))
        n_clipped = int(torch.count_nonzero(clipped))
        n_free = n_rose - n_clipped  # rose & ~clipped
        text += (
            f" {mark('lens/why/rose', n_rose, 12)} token(s) with A > 0 have a ratio above 1 (up to "
            f"{mark('lens/why/rose_ratio_max', top)}): the policy already made them likelier than when sampled"
        )
        if n_free:
            text += f"; {mark('lens/why/rose_unclipped', n_free, 12)} unclipped, whose surrogate A·ratio exceeds A"
        if n_clipped:
            high = mark("config/1+epsilon_high", 1 + bd.config.epsilon_high)
            text += (
                f"; {mark('lens/why/rose_clipped', n_clipped, 12)} clipped at 1 + ε_high = {high}, whose "
                f"surrogate is the clipped {high}·A"
            )
        text += "."
    return text


def on_policy_sentence(bd: Breakdown, sizes: TermSizes) -> str | None:
    """At ratio 1 everywhere: what the policy part is, that nothing can clip, and that a near-zero loss (next to
    the size of its terms) does not mean a zero gradient. None when some ratio is not 1."""
    m = bd.metrics
    if not (m.get("lens/ratio/min") == 1.0 and m.get("lens/ratio/max") == 1.0):
        return None
    policy = mark("policy_loss", float(bd.policy_loss))
    text = f"The ratio is 1 everywhere {_ratio_one(bd)}, {policy}, and nothing can clip"
    size = float(sizes.policy + sizes.kl)
    grad_norm = m.get("lens/grad_norm_logps", 0.0)
    if abs(float(bd.loss)) <= NEAR_ZERO * size and grad_norm > 0:
        text += (
            "; the loss is small next to its terms, yet the gradient norm is "
            f"{mark('metrics/lens/grad_norm_logps', grad_norm)}: a near-zero loss does not mean a zero gradient"
        )
    return text + "."


def kl_sentence(bd: Breakdown) -> list[tuple[str, str]]:
    """The KL term off (beta = 0), or dominating the loss: its key and sentence, or none."""
    kl, surrogate = float(bd.kl_loss), -float(bd.policy_loss)
    if bd.config.beta == 0:
        return [("kl_off", "beta = 0: the KL term is off, so the loss is the policy term alone.")]
    if kl > 0 and kl > 10 * abs(surrogate) and kl > 1e-8:
        return [
            (
                "kl_dominates",
                f"beta·KL ({mark('kl_loss', kl)}) dominates the loss; the KL gradient pushes tokens back toward the "
                "reference.",
            )
        ]
    return []


def _ratio_one(bd: Breakdown) -> str:
    """Why the policy part is what it is at ratio 1: on-policy it is minus the weighted mean advantage; with the
    sampler's log-probs the batch is on-policy for the trainer only (π = π_old, the sampler differs), and where a
    rollout correction reweighted or dropped tokens, each A enters times its weight."""
    t = bd.tokens
    dropped = (t.correction == MASKED) | (t.correction == SEQUENCE_MASKED) | (t.correction == REJECTED)
    corrected = bool((((t.is_weight != 1) & t.mask) | dropped).any())  # reweighted, or dropped
    where = "(π = π_old: the trainer's own old policy; the sampler's log-probs differ)" if bd.sampled else "(on-policy)"
    if corrected:
        return (
            f"{where}, so the policy part is minus the weighted mean of each token's A times its rollout-correction "
            "weight (0 where the correction dropped it)"
        )
    return f"{where}, so the policy part is minus the weighted mean advantage"


def negative_kl_sentence(bd: Breakdown, counted: Counted) -> str | None:
    """A KL estimate below 0 (k1 = logp - ref is, wherever pi < pi_ref): flagged, and whether its
    gradient is the same on every token (beta times the token's weight, as k1's is)."""
    kl = counted.values(bd.tokens.kl)
    low = float(kl.min()) if kl.numel() else 0.0
    if low >= 0:  # no negative estimate (NaN is not >= 0: counted below): one reduction, no count
        return None
    n_negative = int(torch.count_nonzero(kl < 0))
    if not n_negative:
        return None
    n = mark("lens/num_tokens", counted.n, 12)
    batch_kl = mark("metrics/kl", bd.metrics["kl"] if "kl" in bd.metrics else float(kl.mean()))
    text = (
        f"The KL estimate is negative on {mark('lens/why/kl_negative', n_negative, 12)} of {n} tokens (as low as "
        f"{mark('lens/why/kl_min', low)}; the batch's kl is {batch_kl}): an estimator "
        "like k1 = logp - ref goes below 0 wherever the policy gives a token less probability than the "
        "reference, so beta·KL lowers the loss there instead of penalising the drift."
    )
    beta = bd.config.beta
    if beta and _kl_gradient_is_beta(bd, counted):
        text += (
            f" Its gradient is beta × the token's weight (beta = {mark('config/beta', beta)}) on every token alike: it "
            "does not grow with the gap, so it cannot pull a token far below the reference back harder than any other."
        )
    return text


def _kl_gradient_is_beta(bd: Breakdown, counted: Counted) -> bool:
    """Whether every counted token's KL gradient is beta times its weight (to rtol 1e-5; a weight of 0 is read
    as 1)."""
    weight = counted.values(bd.tokens.weight)
    per_weight = counted.values(bd.tokens.grad_kl) / weight.where(weight != 0, 1.0)
    return torch.allclose(per_weight, torch.full_like(per_weight, bd.config.beta), rtol=1e-5, atol=0.0)
