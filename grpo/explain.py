"""Plain-language reading of a Breakdown: why the loss has its sign and size, and a text table.

Every number here comes from the Breakdown; the page shows these sentences as they are.
"""

from __future__ import annotations

import torch

from grpo.loss import Breakdown
from grpo.objectives import OBJECTIVES, REGIONS

NEAR_ZERO = 0.01  # a loss below this share of the total size of its per-token terms is "small next to them"


def _f(x: float) -> str:
    return f"{x + 0.0:.4g}"  # + 0.0: no "-0"


def _sign_sentence(bd: Breakdown) -> str:
    """Why the loss has its sign: the weighted surrogate S against beta·KL K, since loss = K - S.

    "About 0" is relative to the size of the per-token terms being summed (their absolute sum):
    a loss of 1e-8 from terms of size 1 is cancellation, not a small batch.
    """
    loss, surrogate, kl = float(bd.loss), -float(bd.policy_loss), float(bd.kl_loss)
    policy_size = float(bd.tokens.policy_loss.abs().sum())
    size = policy_size + float(bd.tokens.kl_loss.abs().sum())
    if abs(loss) <= 1e-5 * size:
        return (
            f"The loss is about 0 ({loss:.3g}): its per-token terms, of total size {_f(size)}, cancel "
            f"(weighted surrogate {_f(surrogate)}, beta·KL {_f(kl)})."
        )
    if loss < 0:
        below = " (itself negative: see the KL estimate below)" if kl < 0 else ""
        return (
            f"The loss is negative ({_f(loss)}) because the weighted surrogate {_f(surrogate)} "
            f"exceeds beta·KL {_f(kl)}{below}.{_negative_drivers(bd)}"
        )
    if policy_size == 0:
        return f"The loss is positive ({_f(loss)}): every policy term is 0 (no advantage), so the loss is beta·KL."
    if abs(surrogate) <= 1e-5 * policy_size:
        return (
            f"The loss is positive ({_f(loss)}): the policy terms cancel to about 0 ({surrogate:.3g}, from terms of "
            f"total size {_f(policy_size)}), so what is left is beta·KL {_f(kl)}."
        )
    if surrogate > 0:
        return (
            f"The loss is positive ({_f(loss)}) because beta·KL {_f(kl)} exceeds the weighted surrogate "
            f"{_f(surrogate)}."
        )
    if kl > -surrogate:
        return (
            f"The loss is positive ({_f(loss)}), mostly from beta·KL {_f(kl)}; the weighted surrogate is negative too "
            f"({_f(surrogate)}): the tokens with A < 0 weigh more than those with A > 0."
        )
    return (
        f"The loss is positive ({_f(loss)}) because the weighted surrogate is itself negative ({_f(surrogate)}): "
        f"the tokens with A < 0 outweigh those with A > 0; beta·KL adds {_f(kl)}."
    )


def _counted(bd: Breakdown) -> torch.Tensor:
    return bd.tokens.mask.bool()


def _negative_drivers(bd: Breakdown) -> str:
    """Which rows carry the negative loss, and the tokens that make the surrogate positive:
    A > 0 tokens whose ratio rose above 1 (the policy already likes them more than when sampled)."""
    shares = bd.rows.loss
    order = [int(i) for i in torch.argsort(shares) if float(shares[i]) < 0][:2]
    rows = " and ".join(f"row {i} ({_f(float(shares[i]))})" for i in order)
    text = f" The most negative loss shares: {rows}." if rows else ""
    a = bd.advantages[:, None].expand_as(bd.tokens.ratio)  # (B,) -> (B, T)
    rose = _counted(bd) & (a > 0) & (bd.tokens.ratio > 1)
    if int(rose.sum()):
        top = float(bd.tokens.ratio[rose].max())
        text += (
            f" {int(rose.sum())} token(s) with A > 0 have a ratio above 1 (up to {_f(top)}): the policy already "
            "made them likelier than when sampled, so their surrogate A·ratio exceeds A."
        )
    return text


def _negative_kl_sentence(bd: Breakdown) -> str | None:
    """A KL estimate below 0 (k1 = logp - ref is, wherever pi < pi_ref): flagged, and whether its
    gradient is the same on every token (beta times the token's weight, as k1's is)."""
    counted = _counted(bd)
    kl = bd.tokens.kl[counted]
    negative = kl < 0
    if not int(negative.sum()):
        return None
    text = (
        f"The KL estimate is negative on {int(negative.sum())} of {int(counted.sum())} tokens (as low as "
        f"{_f(float(kl.min()))}; the batch's kl is {_f(bd.metrics.get('kl', float(kl.mean())))}): an estimator "
        "like k1 = logp - ref goes below 0 wherever the policy gives a token less probability than the "
        "reference, so beta·KL lowers the loss there instead of penalising the drift."
    )
    weight = bd.tokens.weight[counted]
    per_weight = bd.tokens.grad_kl[counted] / weight.where(weight != 0, torch.ones_like(weight))
    beta = bd.config.beta
    if beta and torch.allclose(per_weight, torch.full_like(per_weight, beta), rtol=1e-5, atol=0.0):
        text += (
            f" Its gradient is beta × the token's weight (beta = {_f(beta)}) on every token alike: it does not "
            "grow with the gap, so it cannot pull a token far below the reference back harder than any other."
        )
    return text


def _clip_sentence(bd: Breakdown) -> str | None:
    """Tokens on a flat part of the clipped surrogate, with the range of their own ratios."""
    flat = _counted(bd) & (bd.tokens.region > REGIONS.index("trust"))
    n_flat, n = int(flat.sum()), int(_counted(bd).sum())
    if not n_flat or not OBJECTIVES.entry(bd.config.objective).flat:  # '' where no token goes flat
        return None
    ratios = bd.tokens.ratio[flat]
    lo, hi = float(ratios.min()), float(ratios.max())
    span = f"ratio {_f(lo)}" if lo == hi else f"ratios {_f(lo)} to {_f(hi)}"
    return f"{n_flat} of {n} tokens sit in a flat clip region ({span}) and get no policy gradient."


def _clamp_sentences(bd: Breakdown) -> list[str]:
    return [
        f"{name} acted on {count} token(s): a clamp passes no gradient where it acts, so those tokens get none "
        "through the clamped term."
        for name, count in bd.clamp_counts.items()
        if count
    ]


def _length_sentence(bd: Breakdown) -> str | None:
    """What the aggregation does to long vs short answers: the per-token weight of the longest and
    the shortest row (rows of different lengths only)."""
    counted = _counted(bd)
    length = counted.sum(dim=1)  # (B, T) -> (B,)
    rows = [i for i in range(len(length)) if int(length[i])]
    if len({int(length[i]) for i in rows}) < 2 or not bool((bd.advantages != 0).any()):
        return None
    short = min(rows, key=lambda i: (int(length[i]), i))
    long = max(rows, key=lambda i: (int(length[i]), -i))
    w_short = float(bd.tokens.weight[short][counted[short]][0])
    w_long = float(bd.tokens.weight[long][counted[long]][0])
    head = (
        f"Per token, the shortest row (row {short}, {int(length[short])} tokens) weighs {_f(w_short)} and the "
        f"longest (row {long}, {int(length[long])} tokens) {_f(w_long)}"
    )
    if w_long > 0 and abs(w_short - w_long) <= 1e-6 * max(w_short, w_long):
        return f"{head}: every token counts the same, so this aggregation has no per-token length bias."
    if w_short > w_long:
        return (
            f"{head}, {_f(w_short / w_long)}× less: right answers (A > 0) are pushed up hardest when short and "
            "wrong ones (A < 0) pushed down least when long, so this aggregation favours short right answers and "
            "lets wrong answers grow long."
        )
    return f"{head}: a token of a long row counts more, so long rows dominate the update."


def explain_items(bd: Breakdown) -> list[tuple[str, str]]:
    """The sentences of ``explain``, each with a key saying what it is about, so a reader (the page's
    compare view) finds one by its key, never by its wording: "sign", "on_policy", "clip",
    "negative_kl", "clamp", "zero_std", "kl_off", "kl_dominates", "length"."""
    policy, kl, surrogate = float(bd.policy_loss), float(bd.kl_loss), -float(bd.policy_loss)
    beta = bd.config.beta
    m = bd.metrics
    out = [("sign", _sign_sentence(bd))]
    if m.get("lens/ratio/min") == 1.0 and m.get("lens/ratio/max") == 1.0:
        on_policy = (
            f"The ratio is 1 everywhere (on-policy), so the policy part is minus the weighted mean advantage, "
            f"{_f(policy)}, and nothing can clip"
        )
        size = float(bd.tokens.policy_loss.abs().sum() + bd.tokens.kl_loss.abs().sum())
        grad_norm = m.get("lens/grad_norm_logps", 0.0)
        if abs(float(bd.loss)) <= NEAR_ZERO * size and grad_norm > 0:
            on_policy += (
                f"; the loss is small next to its terms, yet the gradient norm is {_f(grad_norm)}: a near-zero "
                "loss does not mean a zero gradient"
            )
        out.append(("on_policy", on_policy + "."))
    out += [(key, s) for key, s in (("clip", _clip_sentence(bd)), ("negative_kl", _negative_kl_sentence(bd))) if s]
    out += [("clamp", s) for s in _clamp_sentences(bd)]
    if bd.zero_std_groups:
        out.append(
            (
                "zero_std",
                f"{len(bd.zero_std_groups)} group(s) have zero reward std (frac_reward_zero_std = "
                f"{_f(m.get('frac_reward_zero_std', 0.0))}): their advantages are 0 and they teach nothing.",
            )
        )
    if beta == 0:
        out.append(("kl_off", "beta = 0: the KL term is off, so the loss is the policy term alone."))
    elif kl > 0 and kl > 10 * abs(surrogate) and kl > 1e-8:
        out.append(
            (
                "kl_dominates",
                f"beta·KL ({_f(kl)}) dominates the loss; the KL gradient pushes tokens back toward the reference.",
            )
        )
    length = _length_sentence(bd)
    if length:
        out.append(("length", length))
    return out


def explain(bd: Breakdown) -> list[str]:
    """Sentences on this batch: the sign of the loss, the ratio, clipping, zero-signal groups."""
    return [text for _, text in explain_items(bd)]


def summary_table(bd: Breakdown) -> str:
    """A readable text table: the scalars, the metrics, then one line per row."""
    lines = [
        f"preset {bd.config.preset or '(custom)'}  objective {bd.config.objective}  "
        f"aggregation {bd.config.aggregation}  "
        f"kl {bd.config.kl_estimator}  beta {bd.config.beta:g}  device {bd.device}  dtype {bd.dtype}",
        "",
        f"  loss         {float(bd.loss): .6g}",
        f"  objective    {float(bd.objective): .6g}",
        f"  policy_loss  {float(bd.policy_loss): .6g}",
        f"  kl_loss      {float(bd.kl_loss): .6g}",
        "",
    ]
    width = max(len(k) for k in bd.metrics)
    lines += [f"  {k:<{width}}  {v: .6g}" for k, v in bd.metrics.items()]
    lines += ["", "  row  group  reward   advantage  length  ratio     clip%   loss share"]
    r = bd.rows
    for i in range(len(r.advantage)):
        reward = f"{float(r.reward[i]): .3g}" if r.reward is not None else "    -"
        lines.append(
            f"  {i:>3}  {int(r.group[i]):>5}  {reward:>7}  {float(r.advantage[i]): 9.4g}  {int(r.length[i]):>6}  "
            f"{float(r.sequence_ratio[i]):8.4g}  {100 * float(r.clip_fraction[i]):5.1f}  {float(r.loss[i]): .5g}"
        )
    lines += [""] + [f"  - {s}" for s in explain(bd)]
    if bd.warnings:
        lines += [""] + [f"  ! {w}" for w in bd.warnings]
    return "\n".join(lines)
