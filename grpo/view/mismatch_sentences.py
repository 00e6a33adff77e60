"""The mismatch view's sentences: how far the sampler and the trainer disagree and what each correction did,
every number marked with the quantity it shows and recorded in the block's ``stats`` (or ``rows``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import MASKED, REJECTED, TRUNCATED, Criterion, clamped_exp, outside, rejection_keep
from grpo.loss import Breakdown
from grpo.marks import mark
from grpo.view.mismatch_gap import Gap

ROW_LIST = 6
"""Rows a sentence names one by one; past these it says how many more."""

# What acting means for a correction, by the code its entry returns (never by its name).
ACTED_VERB = {
    MASKED: ("dropped", "weight 0: the policy term is dropped"),
    TRUNCATED: ("truncated", "weight clamped to the bound passed"),
}


@dataclass
class Sentences:
    """Sentences under construction; every number marked and recorded in ``stats`` (or ``rows``)."""

    rows: dict[str, Any]
    base: str
    """What the sampler's log-probs are compared with: "old", or in bypass mode "current"."""
    stats: dict[str, float] = field(default_factory=dict)
    items: list[tuple[str, str]] = field(default_factory=list)

    def q(self, name: str, value: float, digits: int = 4) -> str:
        self.stats[name] = float(value)
        return mark(f"mismatch/stats/{name}", value, digits)

    def n(self, name: str, value: int) -> str:
        return self.q(name, value, 12)

    def row_value(self, name: str, i: int, digits: int = 4) -> str:
        return mark(f"mismatch/rows/{name}/{i}", float(self.rows[name][i]), digits)

    def row_list(self, key: str, rows: list[int], value: str | None = None) -> tuple[str, str]:
        """("rows 3 and 7", "4.1 and 6.7"): each index and value marked; past ROW_LIST rows, how many more."""
        shown = rows[:ROW_LIST]
        names = [mark(f"rows/index/{i}", i, 12) for i in shown]
        values = [self.row_value(value, i) for i in shown] if value else []
        more = len(rows) - len(shown)
        tail = f" and {self.n(f'{key}_more_rows', more)} more" if more else ""
        word = "row" if len(rows) == 1 else "rows"
        return f"{word} {_join(names)}{tail}", _join(values) + (" …" if more and values else "")

    def add(self, key: str, text: str) -> None:
        self.items.append((key, text))


def _join(items: list[str]) -> str:
    if len(items) <= 2:
        return " and ".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _share(part: Tensor, whole: Tensor) -> float:
    total = int(whole.sum())
    return 100.0 * int(part.sum()) / total if total else 0.0


def _gap_sentence(s: Sentences, bd: Breakdown, gap: Gap) -> None:
    if gap.sampler is None:
        s.add(
            "gap",
            "The batch carries no sampler log-probs: the off-policy sequence mask measures the old log-probs "
            "against the current ones, as TRL does without vLLM.",
        )
        return
    n = int(gap.scored.sum())
    if n == 0:
        s.add("gap", "The sampler scored none of the counted tokens: there is no gap to show.")
        return
    absolute = gap.log_ratio.abs().masked_fill(~gap.scored, -1.0)
    flat = int(absolute.flatten().argmax())
    r, p = divmod(flat, absolute.shape[1])
    lengths = gap.scored.sum(-1)
    filled = [i for i in range(len(lengths)) if int(lengths[i])]
    totals = s.rows["sum_log_ratio"]
    low = min(filled, key=lambda i: (float(totals[i]), i))
    high = max(filled, key=lambda i: (float(totals[i]), -i))
    s.add(
        "gap",
        f"The sampler and the trainer disagree on the {s.n('num_scored', n)} scored tokens by "
        f"{s.q('abs_gap_mean', float(gap.log_ratio.abs()[gap.scored].mean()))} nats on average "
        f"(|{s.base} − sampler|; at most {s.q('abs_gap_max', float(absolute[r, p]))}, at row "
        f"{mark(f'rows/index/{r}', r, 12)} position {s.n('abs_gap_max_position', p)}). Summed over a row the "
        f"gaps add up: Σ ({s.base} − sampler) runs from {s.row_value('sum_log_ratio', low)} (row "
        f"{mark(f'rows/index/{low}', low, 12)}) to {s.row_value('sum_log_ratio', high)} (row "
        f"{mark(f'rows/index/{high}', high, 12)}), a sequence ratio exp(Σ) of {s.row_value('is_ratio', low)} to "
        f"{s.row_value('is_ratio', high)}.",
    )


def _bounds_text(config: LossConfig, inside: bool) -> str:
    """Where a ratio is with respect to [C_min, C_max]: "inside [C_min, C_max] = [0.5, 2]", "at most C_max = 3"
    (or, for ``inside=False``, where it left them), the bounds marked."""
    low, high = config.rollout_is_min, config.rollout_is_max
    lo = None if low is None else mark("config/rollout_is_min", low)
    hi = None if high is None else mark("config/rollout_is_max", high)
    if lo and hi:
        return f"{'inside' if inside else 'outside'} [C_min, C_max] = [{lo}, {hi}]"
    if hi:
        return f"{'at most' if inside else 'above'} C_max = {hi}"
    if lo:
        return f"{'at least' if inside else 'below'} C_min = {lo}"
    return "unbounded"


def _sequence_sentence(s: Sentences, bd: Breakdown, gap: Gap, code: int) -> None:
    """Rows whose ratio exp(Σ) left the bounds: dropped (mask) or clamped (truncate)."""
    config = bd.config
    name = config.rollout_correction
    ratio = s.rows["is_ratio"]
    filled = gap.counted.any(-1)
    verb, meaning = ACTED_VERB[code]
    tokens = gap.counted
    said = False
    for side, bound_name in (("above", "rollout_is_max"), ("below", "rollout_is_min")):
        bound = getattr(config, bound_name)
        if bound is None:
            continue
        hit = filled & ((ratio > bound) if side == "above" else (ratio < bound))
        rows = hit.nonzero().flatten().tolist()
        if not rows:
            continue
        said = True
        named, values = s.row_list(f"{side}_{bound_name}", rows, "is_ratio")
        share = s.q(f"{side}_token_percent", _share(tokens[hit], tokens))
        one = len(rows) == 1
        s.add(
            "sequence",
            f"{named[0].upper() + named[1:]} {'was' if one else 'were'} {verb} by {name}: "
            f"{'its ratio exp(Σ) is' if one else 'their ratios exp(Σ) are'} {values}, {side} "
            f"{'C_max' if side == 'above' else 'C_min'} = {mark(f'config/{bound_name}', bound)} ({meaning}); "
            f"{'it holds' if one else 'they hold'} {share}% of the batch's tokens.",
        )
    if not said:
        kept = ratio[filled]
        if kept.numel():
            s.add(
                "sequence",
                f"Every row's ratio exp(Σ) is {_bounds_text(config, True)} (from "
                f"{s.q('is_ratio_min', float(kept.min()))} to {s.q('is_ratio_max', float(kept.max()))}): "
                f"{name} keeps every row with its weight.",
            )


def _token_sentence(s: Sentences, bd: Breakdown, gap: Gap, code: int) -> None:
    """Tokens whose ratio exp(old − sampler) left the bounds."""
    config = bd.config
    name = config.rollout_correction
    ratio = clamped_exp(gap.log_ratio, config)
    hit = gap.scored & outside(ratio, config).bool()
    verb, meaning = ACTED_VERB[code]
    n = int(hit.sum())
    assert gap.sampler is not None
    if not n:
        kept = ratio[gap.scored]
        if kept.numel():
            s.add(
                "token",
                f"Every scored token's ratio exp({s.base} − sampler) is {_bounds_text(config, True)} (from "
                f"{s.q('token_ratio_min', float(kept.min()))} to {s.q('token_ratio_max', float(kept.max()))}): "
                f"{name} keeps every token with its weight.",
            )
        return
    rows = hit.any(-1).nonzero().flatten().tolist()
    named, _ = s.row_list("token_rows", rows)
    far = gap.log_ratio.abs().masked_fill(~hit, -1.0)
    r, p = divmod(int(far.flatten().argmax()), far.shape[1])
    s.add(
        "token",
        f"{s.n('token_acted', n)} token(s) were {verb} by {name} ({meaning}): "
        f"{s.q('token_acted_percent', _share(hit, gap.scored))}% of the scored tokens, in {named}. "
        f"{'Its ratio' if n == 1 else 'Their ratios'} exp({s.base} − sampler) {'is' if n == 1 else 'are'} "
        f"{_bounds_text(config, False)}; the farthest, row {mark(f'rows/index/{r}', r, 12)} "
        f"position {s.n('token_far_position', p)}, has ratio {s.q('token_far_ratio', float(ratio[r, p]))} (old "
        f"{s.q('token_far_old', float(gap.base[r, p]))}, sampler "
        f"{s.q('token_far_sampler', float(gap.sampler[r, p]))}).",
    )


def _off_policy_sentence(s: Sentences, bd: Breakdown, gap: Gap) -> None:
    threshold = bd.config.off_policy_mask_threshold
    assert threshold is not None
    behaviour = "old" if gap.sampler is None else "sampler"
    mean_gap = s.rows["off_policy_gap"]
    negative = (bd.advantages < 0) & gap.counted.any(-1)
    dropped = negative & (mean_gap > threshold)
    t = mark("config/off_policy_mask_threshold", threshold)
    rows = dropped.nonzero().flatten().tolist()
    if rows:
        named, values = s.row_list("off_policy", rows, "off_policy_gap")
        one = len(rows) == 1
        s.add(
            "off_policy",
            f"{named[0].upper() + named[1:]} {'was' if one else 'were'} dropped by the off-policy sequence mask: "
            f"A < 0 and {'its' if one else 'their'} mean {behaviour} − current log-prob{'' if one else 's'} "
            f"{'is' if one else 'are'} {values}, above "
            f"off_policy_mask_threshold = {t}; {'it holds' if one else 'they hold'} "
            f"{s.q('off_policy_token_percent', _share(gap.counted[dropped], gap.counted))}% of the batch's tokens.",
        )
        return
    if bool(negative.any()):
        i = max(negative.nonzero().flatten().tolist(), key=lambda k: (float(mean_gap[k]), -k))
        s.add(
            "off_policy",
            f"The off-policy sequence mask drops no row: every row with A < 0 has a mean {behaviour} − current "
            f"log-prob at most off_policy_mask_threshold = {t} (the largest, row {mark(f'rows/index/{i}', i, 12)}, "
            f"{s.row_value('off_policy_gap', i)}).",
        )
    else:
        s.add("off_policy", "The off-policy sequence mask drops no row: no row has A < 0.")


def _rejection_sentence(s: Sentences, bd: Breakdown, gap: Gap, criteria: list[Criterion]) -> None:
    mask = gap.counted.to(gap.base.dtype)
    rejected = bd.tokens.correction == REJECTED
    n = int(rejected.sum())
    per = []
    for c in criteria:
        k = int((gap.counted & ~rejection_keep(gap.log_ratio, mask, [c]).bool()).sum())
        per.append(f"{c.name} rejects {s.n(f'rs_{c.name}_tokens', k)}")
    if not n:
        s.add("rejected", f"rollout_rs rejects no token: {'; '.join(per)}.")
        return
    rows = rejected.any(-1).nonzero().flatten().tolist()
    named, _ = s.row_list("rejected", rows)
    s.add(
        "rejected",
        f"rollout_rs rejected {s.n('rejected_tokens', n)} token(s), "
        f"{s.q('rejected_token_percent', _share(rejected, gap.counted))}% of the batch's, in {named}: they leave "
        f"the batch (policy term, KL and the aggregation's counts). By criterion: {'; '.join(per)}.",
    )


def _not_scored_sentence(s: Sentences, gap: Gap) -> None:
    if gap.sampler is None:
        return
    n = int((gap.counted & ~gap.scored).sum())
    if n:
        s.add(
            "not_scored",
            f"{s.n('not_scored', n)} token(s) were not scored by the sampler (NaN): they add 0 to the gap, and at "
            "token level keep weight 1 (TRL applies no correction there).",
        )


def _loss_sentence(s: Sentences, bd: Breakdown, level: str | None, criteria: list[Criterion]) -> None:
    loss, without = float(bd.loss), float(bd.loss_without_correction)
    L = mark("loss", loss)
    if level is None and bd.config.off_policy_mask_threshold is None and not criteria:
        s.add(
            "loss",
            f"No rollout correction is chosen: the gap is shown and changes nothing; the loss is {L}. Pick "
            "rollout_correction (TRL's default with vLLM is sequence_mask) to see what each would do.",
        )
        return
    s.add(
        "loss",
        f"With the correction the loss is {L}; without it (the same batch, every correction off) it would be "
        f"{mark('loss_without_correction', without)}, a change of {s.q('loss_change', loss - without)}.",
    )


def mismatch_sentences(
    bd: Breakdown, gap: Gap, rows: dict[str, Any], level: str | None, code: int, criteria: list[Criterion]
) -> Sentences:
    """The view's sentences, in the order the page shows them: ``rows`` are the block's per-row statistics,
    ``level`` and ``code`` the correction's (``correction_level``)."""
    config = bd.config
    s = Sentences(rows, "current" if config.rollout_bypass else "old")
    _gap_sentence(s, bd, gap)
    if level == "sequence" and gap.sampler is not None:
        _sequence_sentence(s, bd, gap, code)
    if level == "token" and gap.sampler is not None:
        _token_sentence(s, bd, gap, code)
    if config.off_policy_mask_threshold is not None:
        _off_policy_sentence(s, bd, gap)
    if criteria:
        _rejection_sentence(s, bd, gap, criteria)
    _not_scored_sentence(s, gap)
    _loss_sentence(s, bd, level, criteria)
    return s
