"""The sentences on the rows and the batch: zero-std groups, advantages given per token, the aggregation's
per-token weight of long and short rows, and what the rollout correction did (or, under a TRL preset, would do)."""

from __future__ import annotations

import torch

from grpo.corrections import CORRECTION_CODES, KEPT, MASKED, REJECTED, SEQUENCE_MASKED, TRUNCATED
from grpo.loss import Breakdown
from grpo.marks import END, SEP, START, mark, number
from grpo.trainer_config import TRL_DEFAULTS
from grpo.view.counted import Counted, correction_acted


def zero_std_sentence(bd: Breakdown, counted: Counted) -> str:
    """Zero-std groups: advantages 0, yet their tokens stay in the divisor and dilute the others."""
    m = bd.metrics
    text = (
        f"{mark('lens/why/zero_std_groups', len(bd.zero_std_groups), 12)} group(s) have zero reward std "
        f"(frac_reward_zero_std = {mark('metrics/frac_reward_zero_std', m.get('frac_reward_zero_std', 0.0))}): their "
        "advantages are 0 and they teach nothing."
    )
    zero_rows = torch.isin(bd.rows.group, torch.tensor(bd.zero_std_groups, device=bd.rows.group.device))
    rows = zero_rows.nonzero().squeeze(1)
    zero_counted = counted.mask[rows]  # (B, T) -> (k, T): the zero-std rows, whose tokens are read in row order
    total = float(counted.values(bd.tokens.weight).sum())
    silent = float(bd.tokens.weight[rows][zero_counted].sum())
    if total > 0 and silent > 0 and silent < total:
        share = (total - silent) / total
        n_zero = int(torch.count_nonzero(zero_counted))
        text += (
            f" Their {mark('lens/why/zero_std_tokens', n_zero, 12)} token(s) still count in the aggregation's "
            f"divisor: they hold {mark('lens/why/zero_std_weight_share', silent / total)} of the weight, so the other "
            f"groups' policy gradient is {mark('lens/why/signal_weight_share', share)}× what it would be with them "
            "filtered out (as DAPO's dynamic sampling does)."
        )
    return text


def per_token_advantage_sentence(bd: Breakdown, tokens: Counted) -> str | None:
    """Advantages given per token whose rows' tokens differ: how many rows, the range, and what it means."""
    if not bd.per_token_advantages:
        return None
    a, counted = bd.tokens.advantage, tokens.mask
    low = torch.where(counted, a, torch.inf).amin(-1)
    high = torch.where(counted, a, -torch.inf).amax(-1)
    varies = counted.any(-1) & (low != high)
    n = int(varies.sum())
    if not n:
        return None
    rows, total = mark("lens/why/per_token_advantage_rows", n, 12), mark("lens/why/rows", len(varies), 12)
    lo, hi = (
        mark("lens/why/advantage_min", float(tokens.values(a).min())),
        mark("lens/why/advantage_max", float(tokens.values(a).max())),
    )
    return (
        f"The advantages come per token: {rows} of {total} rows carry different ones on their tokens (from {lo} "
        f"to {hi} over the batch), so each token's term is scaled by its own A, and a row's advantage shown is the "
        "mean over its counted tokens."
    )


def length_sentence(bd: Breakdown, tokens: Counted) -> str | None:
    """What the aggregation does to long vs short answers: the per-token weight of the longest and
    the shortest row (rows of different lengths only)."""
    counted, length = tokens.mask, tokens.lengths  # per row, its counted tokens
    rows = [i for i, n in enumerate(length) if n]
    if len({length[i] for i in rows}) < 2 or not bool((bd.advantages != 0).any()):
        return None
    short = min(rows, key=lambda i: (length[i], i))
    long = max(rows, key=lambda i: (length[i], -i))
    w_short = float(bd.tokens.weight[short][counted[short]][0])
    w_long = float(bd.tokens.weight[long][counted[long]][0])
    n_short, n_long = (mark(f"rows/length/{i}", length[i], 12) for i in (short, long))
    q_short, q_long = mark(f"lens/why/row_weight/{short}", w_short), mark(f"lens/why/row_weight/{long}", w_long)
    head = (
        f"Per token, the shortest row (row {short}, {n_short} token{'' if length[short] == 1 else 's'}) "
        f"weighs {q_short} and the "
        f"longest (row {long}, {n_long} tokens) {q_long}"
    )
    if w_long > 0 and abs(w_short - w_long) <= 1e-6 * max(w_short, w_long):
        return f"{head}: every token counts the same, so this aggregation has no per-token length bias."
    if w_short > w_long:
        return (
            f"{head}, {_ratio_mark('lens/why/weight_ratio', w_short / w_long)}× less: right answers (A > 0) are "
            "pushed up hardest when short and wrong ones (A < 0) pushed down least when long, so this aggregation "
            "favours short right answers and lets wrong answers grow long."
        )
    return f"{head}: a token of a long row counts more, so long rows dominate the update."


def _ratio_mark(quantity: str, x: float) -> str:
    """A ratio of two weights marked with 4 significant digits and no more: 1/0.1 computed in floats is
    9.9999999..., which ``number`` would spell out to tell it from 10; a "× less" reads 10."""
    return f"{START}{quantity}{SEP}{float(x)!r}{SEP}{number(float(f'{x:.4g}'))}{END}"


def _rows_named(rows: list[int]) -> str:
    """ "row 3", "rows 0, 1 and 2": each index marked as the rows table tags it."""
    names = [mark(f"rows/index/{i}", i, 12) for i in rows]
    joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"{'row' if len(rows) == 1 else 'rows'} {joined}"


def correction_sentence(bd: Breakdown) -> str | None:
    """What the rollout correction did, counted as the Mismatch view counts it (``mismatch/counts/<code>``): the
    rows it dropped whole, the tokens it dropped, truncated or rejected, and the loss without it."""
    code, counted = bd.tokens.correction, bd.tokens.mask
    if bd.rollout_logps is None or not correction_acted(bd):
        return None

    def n(name: str, value: int) -> str:
        return mark(f"mismatch/counts/{name}", value, 12)

    said = []
    tally = torch.bincount(code.flatten().long(), minlength=len(CORRECTION_CODES)).tolist()  # tokens per code
    dropped = counted & ((code == MASKED) | (code == SEQUENCE_MASKED))
    whole = (counted.any(-1) & (dropped | ~counted).all(-1)).nonzero().flatten().tolist()
    if tally[MASKED]:
        rows = f", the whole of {_rows_named(whole)}" if whole else ""
        said.append(
            f"{bd.config.rollout_correction} dropped the policy term of {n('masked', tally[MASKED])} "
            f"token(s) (weight 0{rows})"
        )
    if tally[SEQUENCE_MASKED]:
        said.append(
            f"the off-policy sequence mask dropped the policy term of {n('sequence_masked', tally[SEQUENCE_MASKED])} "
            "token(s)"
        )
    if tally[TRUNCATED]:
        said.append(
            f"{bd.config.rollout_correction} truncated the weight of {n('truncated', tally[TRUNCATED])} token(s)"
        )
    if tally[REJECTED]:
        hit = (code == REJECTED).any(-1).nonzero().flatten().tolist()
        said.append(
            f"rollout_rs rejected {n('rejected', tally[REJECTED])} token(s) in {_rows_named(hit)}, which left the "
            "batch (policy term, KL and the aggregation's counts)"
        )
    if not said:
        return None
    text = "; ".join(said)
    kept_at = (code == KEPT) & counted
    kept, weights = int(kept_at.sum()), bd.tokens.is_weight[kept_at]
    spread = ""  # a mask mode keeps the IS weight exp(old − sampler) as it is: not 1 (TRL's sequence_mask: 1.17)
    if kept and bool((weights != 1).any()):
        low, high = float(weights.min()), float(weights.max())
        spread = f" ({mark('lens/why/kept_is_weight_min', low)} to {mark('lens/why/kept_is_weight_max', high)})"
    return (
        f"The rollout correction acted: {text}. {n('kept', kept)} token(s) kept their IS weight as it is{spread}; "
        "the loss "
        f"without the correction would be {mark('loss_without_correction', float(bd.loss_without_correction))} "
        "(the Mismatch view shows each)."
    )


TRL_CORRECTION = (
    "This preset ({preset}) applies no rollout correction: TRL v1.16 weighs the sampler's log-probs only when use_vllm "
    "is set (then by default vllm_importance_sampling_correction = True, mode sequence_mask, clip_max C_max = {cap}). "
    "To mirror a vLLM run, set rollout_correction = sequence_mask and rollout_is_max = {cap}, and give the sampler's "
    "log-probs (sampling_per_token_logps)."
)
TRL_VLLM_CLIP_MAX = float(TRL_DEFAULTS["vllm_importance_sampling_clip_max"])  # TRL 1.16's default, 3


def trl_correction_sentence(bd: Breakdown) -> str | None:
    """A TRL preset mirrors TRL without vLLM: no correction. Said on the page, with how to turn TRL's default on."""
    config = bd.config
    if not (config.preset or "").startswith("trl") or config.rollout_correction != "none":
        return None
    text = TRL_CORRECTION.format(preset=config.preset, cap=mark("lens/trl/vllm_clip_max", TRL_VLLM_CLIP_MAX))
    if config.objective == "vespo":  # TRL's VESPO takes the weight inside its own φ (docs/variants.md)
        text += " Under loss_type vespo TRL takes that weight inside its own φ instead, which is not reproduced here."
    return text
