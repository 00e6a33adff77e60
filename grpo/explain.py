"""Plain-language reading of a Breakdown: why the loss has its sign and size, and a text table.

Every number here comes from the Breakdown; the page shows these sentences as they are.
"""

from __future__ import annotations

from grpo.loss import Breakdown
from grpo.objectives import REGIONS


def _f(x: float) -> str:
    return f"{x:.4g}"


def explain(bd: Breakdown) -> list[str]:
    """Sentences on this batch: the sign of the loss, the ratio, clipping, zero-signal groups."""
    loss, policy, kl = float(bd.loss), float(bd.policy_loss), float(bd.kl_loss)
    surrogate = -policy  # the weighted surrogate: what the policy term adds to the objective
    beta = bd.config.beta
    m = bd.metrics
    out = []
    scale = max(abs(policy), abs(kl), 1e-30)
    if abs(loss) <= 1e-6 * scale or loss == 0:
        out.append(
            f"The loss is about 0 ({loss:.3g}): the weighted surrogate {_f(surrogate)} and beta·KL {_f(kl)} cancel."
        )
    elif loss < 0:
        out.append(
            f"The loss is negative ({_f(loss)}) because the weighted surrogate {_f(surrogate)} "
            f"exceeds beta·KL {_f(kl)}."
        )
    elif surrogate < 0:
        out.append(
            f"The loss is positive ({_f(loss)}) because the weighted surrogate is itself negative "
            f"({_f(surrogate)}): "
            f"the tokens with A < 0 outweigh those with A > 0; beta·KL adds {_f(kl)}."
        )
    else:
        out.append(
            f"The loss is positive ({_f(loss)}) because beta·KL {_f(kl)} exceeds the weighted surrogate "
            f"{_f(surrogate)}."
        )
    if m.get("ratio/min") == 1.0 and m.get("ratio/max") == 1.0:
        out.append(
            f"The ratio is 1 everywhere (on-policy), so the policy part is minus the weighted mean advantage, "
            f"{_f(policy)}, and nothing can clip; yet the gradient norm is {_f(m['grad_norm'])}: a near-zero loss "
            "does not mean a zero gradient."
        )
    regions = bd.tokens.region
    n = int(bd.tokens.mask.sum())
    flat = int((regions > REGIONS.index("trust")).sum())
    if n and flat and bd.config.objective == "clip":
        out.append(
            f"{flat} of {n} tokens sit in a flat clip region (ratio {_f(m['ratio/min'])} to {_f(m['ratio/max'])}) "
            "and get no policy gradient."
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
