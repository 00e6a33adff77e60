"""Plain-language reading of a Breakdown: why the loss has its sign and size, and a text table.

Every number here comes from the Breakdown; the page shows these sentences as they are. Each number in a
sentence is written with the quantity it shows (``explain_parts``), so the page can tag it and a test can
hold it equal to the same quantity shown elsewhere. A token's "why" (``token_why``, grpo.view.why: which
bound acted on it, from its objective's registry entry) is computed once; every count and sentence reads it.
The sentences live by what they explain: the loss itself (grpo.view.explain_loss), what acted on the tokens
(grpo.view.explain_tokens), the rows and the rollout correction (grpo.view.explain_rows).
"""

from __future__ import annotations

from typing import Any

from grpo.loss import Breakdown
from grpo.marks import number as number
from grpo.marks import parts_of as parts_of
from grpo.marks import plain as plain
from grpo.view.counted import Counted
from grpo.view.explain_loss import kl_sentence, negative_kl_sentence, on_policy_sentence, sign_sentence, term_sizes
from grpo.view.explain_rows import (
    correction_sentence,
    length_sentence,
    per_token_advantage_sentence,
    trl_correction_sentence,
    zero_std_sentence,
)
from grpo.view.explain_tokens import (
    clamp_sentences,
    clip_sentence,
    entropy_mask_sentence,
    gspo_sentence,
    selected_sentence,
    tool_sentence,
    unbounded_sentence,
)
from grpo.view.why import CORRECTION_WHYS as CORRECTION_WHYS
from grpo.view.why import ENTROPY_MASKED as ENTROPY_MASKED
from grpo.view.why import TOOL_OUTPUT as TOOL_OUTPUT
from grpo.view.why import ZERO_ADVANTAGE as ZERO_ADVANTAGE
from grpo.view.why import TokenWhy as TokenWhy
from grpo.view.why import token_why as token_why


def explain_parts(
    bd: Breakdown, why: TokenWhy | None = None, counted: Counted | None = None
) -> list[tuple[str, list[str | dict[str, Any]]]]:
    """``explain_items`` with each number apart: text pieces and {"quantity", "value", "text"}. ``why`` and
    ``counted``: ``token_why(bd)`` and ``Counted(bd)`` when the caller has them already (the answer does)."""
    return [(key, parts_of(text)) for key, text in _marked_items(bd, why, counted)]


def explain_items(bd: Breakdown) -> list[tuple[str, str]]:
    """The sentences of ``explain``, each with a key saying what it is about, so a reader (the page's
    compare view) finds one by its key, never by its wording: "sign", "on_policy", "tool_mask", "entropy_mask",
    "selected" (the tokens the objective's own rule picked: Clip-Cov, KL-Cov), "clip", "unbounded",
    "gspo", "negative_kl", "correction" (what the rollout correction did), "trl_correction" (a TRL preset without
    TRL's vLLM correction), "clamp", "zero_std", "per_token_advantages", "kl_off", "kl_dominates", "length"."""
    return [(key, plain(text)) for key, text in _marked_items(bd)]


def _marked_items(bd: Breakdown, why: TokenWhy | None = None, counted: Counted | None = None) -> list[tuple[str, str]]:
    why = token_why(bd) if why is None else why
    counted = Counted(bd) if counted is None else counted
    sizes = term_sizes(bd)
    candidates = (
        ("sign", sign_sentence(bd, counted, sizes)),
        ("on_policy", on_policy_sentence(bd, sizes)),
        ("tool_mask", tool_sentence(bd, why, counted)),
        ("entropy_mask", entropy_mask_sentence(bd, why, counted)),
        ("selected", selected_sentence(bd, why, counted)),
        ("clip", clip_sentence(bd, why, counted)),
        ("unbounded", unbounded_sentence(bd, why)),
        ("gspo", gspo_sentence(bd, counted)),
        ("negative_kl", negative_kl_sentence(bd, counted)),
        ("correction", correction_sentence(bd)),
        ("trl_correction", trl_correction_sentence(bd)),
    )
    out = [(key, s) for key, s in candidates if s]
    out += [("clamp", s) for s in clamp_sentences(bd)]
    after = (
        ("zero_std", zero_std_sentence(bd, counted) if bd.zero_std_groups else None),
        ("per_token_advantages", per_token_advantage_sentence(bd, counted)),
        *kl_sentence(bd),
        ("length", length_sentence(bd, counted)),
    )
    return out + [(key, s) for key, s in after if s]


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
