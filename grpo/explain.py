"""Plain-language reading of a Breakdown: why the loss has its sign and size, and a text table.

Every number here comes from the Breakdown; the page shows these sentences as they are.
"""

from __future__ import annotations

from grpo.loss import Breakdown
from grpo.objectives import REGIONS


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
        return (
            f"The loss is negative ({_f(loss)}) because the weighted surrogate {_f(surrogate)} "
            f"exceeds beta·KL {_f(kl)}."
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


def explain(bd: Breakdown) -> list[str]:
    """Sentences on this batch: the sign of the loss, the ratio, clipping, zero-signal groups."""
    policy, kl, surrogate = float(bd.policy_loss), float(bd.kl_loss), -float(bd.policy_loss)
    beta = bd.config.beta
    m = bd.metrics
    out = []
    out.append(_sign_sentence(bd))
    if m.get("lens/ratio/min") == 1.0 and m.get("lens/ratio/max") == 1.0:
        out.append(
            f"The ratio is 1 everywhere (on-policy), so the policy part is minus the weighted mean advantage, "
            f"{_f(policy)}, and nothing can clip; yet the gradient norm is {_f(m['lens/grad_norm_logps'])}: "
            "a near-zero loss does not mean a zero gradient."
        )
    regions = bd.tokens.region
    n = int(bd.tokens.mask.sum())
    flat = int((regions > REGIONS.index("trust")).sum())
    if n and flat and bd.config.objective == "clip":
        out.append(
            f"{flat} of {n} tokens sit in a flat clip region "
            f"(ratio {_f(m['lens/ratio/min'])} to {_f(m['lens/ratio/max'])}) and get no policy gradient."
        )
    if bd.zero_std_groups:
        out.append(
            f"{len(bd.zero_std_groups)} group(s) have zero reward std (frac_reward_zero_std = "
            f"{_f(m.get('frac_reward_zero_std', 0.0))}): their advantages are 0 and they teach nothing."
        )
    if beta == 0:
        out.append("beta = 0: the KL term is off, so the loss is the policy term alone.")
    elif kl and abs(kl) > 10 * abs(surrogate) and abs(kl) > 1e-8:
        out.append(f"beta·KL ({_f(kl)}) dominates the loss; the KL gradient pushes tokens back toward the reference.")
    return out


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
