"""Plain-language reading of a Breakdown: why the loss has its sign and size, and a text table.

Every number here comes from the Breakdown; the page shows these sentences as they are. Each number in a
sentence is written with the quantity it shows (``explain_parts``), so the page can tag it and a test can
hold it equal to the same quantity shown elsewhere. A token's "why" (``token_why``: which bound acted on
it, from its objective's registry entry) is computed once here; every count and sentence reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import KEPT, MASKED, REJECTED, SEQUENCE_MASKED, TRUNCATED
from grpo.loss import Breakdown, entropy_threshold
from grpo.marks import END, SEP, START, percent
from grpo.marks import mark as mark
from grpo.marks import number as number
from grpo.marks import parts_of as parts_of
from grpo.marks import plain as plain
from grpo.objectives import OBJECTIVES, REGIONS
from grpo.trainer_config import TRL_DEFAULTS

NEAR_ZERO = 0.01  # a loss below this share of the total size of its per-token terms is "small next to them"


# --- one "why" per token ------------------------------------------------------------------------
ZERO_ADVANTAGE = "zero_advantage"
ZERO_ADVANTAGE_TEXT = (
    "A = 0: the token's surrogate is 0 and it gets no policy gradient, yet it still counts in the aggregation's "
    "divisor (weight {weight_note})"
)
ENTROPY_MASKED = "entropy_masked"
ENTROPY_MASKED_TEXT = (
    "below the high-entropy mask's threshold (top_entropy_quantile {quantile}: the policy term acts on the "
    "highest-entropy tokens only, those with entropy at least {threshold}): its policy term is 0{gradient}; "
    "its KL term still counts"
)
ENTROPY_MASKED_GRADIENT = {
    "token": " and it gets no policy gradient",
    # the row's one ratio is the mean of all its log-ratios: the kept tokens' terms still move this one
    "sequence": ", yet it still gets policy gradient through the row's sequence ratio, which its log-ratio enters",
}
TOOL_OUTPUT = "tool_output"
TOOL_OUTPUT_TEXT = (
    "a tool's output inside the completion (tool_mask 0): not the model's tokens, so it does not count: no loss, "
    "no gradient, and it is left out of every divisor, as TRL's completion_mask · tool_mask"
)
# What a rollout correction did to a token, when it took the token's policy term away (grpo.corrections' codes):
# the objective's own reading ("gets a policy gradient") would be false beside a gradient of 0.
IS_DROPPED = "is_dropped"
IS_DROPPED_TEXT = (
    "dropped by the rollout correction ({correction}): its importance weight exp(old − sampler) passed a bound "
    "(C_min {low}, C_max {high}; at sequence level the row's), so its weight is 0: its policy term is "
    "dropped{gradient}; its KL term still counts"
)
CORRECTION_GRADIENT = {  # whether the dropped tokens' gradient is 0 on this batch (GSPO: a row's shared ratio)
    True: " and it gets no policy gradient",
    False: ", yet it still gets policy gradient through its row's sequence ratio, which its log-ratio enters",
}
OFF_POLICY_DROPPED = "off_policy_dropped"
OFF_POLICY_DROPPED_TEXT = (
    "dropped by the off-policy sequence mask (off_policy_mask_threshold {threshold}): its row has A < 0 and a mean "
    "sampler − current log-prob above the threshold, so its policy term is 0{gradient}; its KL term still counts"
)
RS_REJECTED = "rs_rejected"
RS_REJECTED_TEXT = (
    "rejected by verl's rollout_rs ({rs}, thresholds {threshold}): the token (or its row) failed a criterion, so "
    "it leaves the batch: no policy term, no KL, left out of the aggregation's counts, no gradient"
)
CORRECTION_WHYS = (IS_DROPPED, OFF_POLICY_DROPPED, RS_REJECTED)
REGION_TEXTS = {  # objectives without a why rule of their own: their regions, read as they are
    "masked": "does not count (prompt, padding or masked out)",
    "trust": "no bound acts on this objective's term: the token keeps its policy gradient",
    "clip_low": "bounded below by the objective",
    "clip_high": "bounded above by the objective",
    "dual_clip": "bounded by the objective's cap",
}


def fill(template: str, values: Mapping[str, float | None]) -> str:
    """A why template with the config's numbers: "{high}" -> "1.2"; a setting that is off -> "off"."""
    return template.format_map({k: "off" if v is None else number(v) for k, v in values.items()})


LABELS = {  # how the summary and the heatmaps' legend name a group of tokens by a code every rule may have
    "clip_low": "clipped low",
    "clip_high": "clipped high",
    ZERO_ADVANTAGE: "with A = 0",
    ENTROPY_MASKED: "masked by the entropy mask",
    TOOL_OUTPUT: "tool output (tool_mask 0)",
    IS_DROPPED: "dropped by the rollout correction (weight 0)",
    OFF_POLICY_DROPPED: "dropped by the off-policy sequence mask",
    RS_REJECTED: "rejected by rollout_rs (out of the batch)",
}
WHY_LABELS = LABELS  # the name it had


@dataclass(frozen=True)
class TokenWhy:
    """Each token's reading: a code into ``names`` and what it means under this config."""

    names: tuple[str, ...]
    codes: Tensor
    """(B, T) int64 indices into names; 0 ("masked") where a position does not count."""
    texts: dict[str, str]
    """code name -> sentence, with the numbers of the config."""
    no_gradient: frozenset[str]
    """The codes whose tokens get no policy gradient."""
    labels: dict[str, str] = field(default_factory=dict)
    """code name -> how a group of its tokens is named ("clipped high", "kl_cov: KL penalty applied"); every name."""
    selected: str | None = None
    """The code of the tokens the objective's own rule picked (its Why.selected), or None."""
    masks: tuple[str, ...] = (ENTROPY_MASKED,)
    """The codes of token masks (they act before any bound; a tool's output when the batch has a tool mask): the
    heatmaps mark them apart."""
    bounds: Tensor | None = None
    """(B, T) int64 indices into names: which bound of the objective acted on each token, as its rule names it
    ("unbounded" for a ratio past the trust region that no clip holds, "delta" for TRL's cap), before A = 0, the
    token masks and the corrections are laid over it; 0 where a position does not count. None: ``codes``."""

    def counts(self) -> dict[str, int]:
        """Tokens per code (masked excluded), every code listed: the counted ones, and a tool's output (the tokens
        rollout_rs rejected left the batch: not here, they are the mismatch block's counts["rejected"])."""
        found = torch.bincount(self.codes.flatten(), minlength=len(self.names)).tolist()
        return {name: int(n) for name, n in zip(self.names, found, strict=True) if name not in ("masked", RS_REJECTED)}

    @property
    def marked(self) -> tuple[str, ...]:
        """The codes the heatmaps mark: those that silence the policy gradient (A = 0 aside: every token of a
        zero-std group would be), the token masks, and the objective's own pick."""
        return tuple(
            name
            for name in self.names
            if ((name in self.no_gradient and name != ZERO_ADVANTAGE) or name in self.masks or name == self.selected)
            and name not in CORRECTION_WHYS  # the heatmaps mark these as the correction's (tokens.correction)
        )

    def code_names(self) -> list[list[str]]:
        return [[self.names[c] for c in row] for row in self.codes.tolist()]


@lru_cache(maxsize=256)
def _filled(
    config: LossConfig, values: Callable[[Any], Mapping[str, float | None]], templates: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    """A rule's sentences under ``config``: the same for every batch, so filled once per config (an answer
    is built per request). The rule's ``values`` and templates are part of the key: a plugin that registers
    an objective again gets its own sentences."""
    numbers = values(config)
    return tuple((name, fill(text, numbers)) for name, text in templates)


def token_why(bd: Breakdown) -> TokenWhy:
    """Which bound acted on each token, from the objective's own rule (its registry entry's ``why``),
    plus A = 0 (no policy gradient under any objective, since each scales by A)."""
    config, t = bd.config, bd.tokens
    rule = OBJECTIVES.entry(config.objective).why
    a = t.advantage  # (B, T): each token's A (its row's, or its own when given per token)
    region = t.region.long()
    labels, selected = dict(LABELS), None
    if rule is None:
        names, codes = REGIONS, region
        texts, no_gradient = dict(REGION_TEXTS), frozenset[str]()
    else:
        names, codes = rule.names, rule.codes(t.ratio, a, region, config)
        texts = dict(_filled(config, rule.values, tuple((name, rule.texts[name]) for name in rule.names)))
        no_gradient, selected = rule.no_gradient, rule.selected
        labels |= rule.labels
        if selected is not None and t.selected is not None:  # the objective's own pick, whatever the region
            codes = torch.where(t.selected > 0, torch.full_like(codes, names.index(selected)), codes)
    names = (*names, ZERO_ADVANTAGE, ENTROPY_MASKED)
    bounds = torch.where(t.mask, codes, torch.zeros_like(codes))  # the objective's reading, before the overlays
    zero = t.mask & (a == 0) & (codes == names.index("trust"))
    codes = torch.where(zero, torch.full_like(codes, names.index(ZERO_ADVANTAGE)), codes)
    entropy_masked = t.mask & (t.policy_kept == 0)  # the mask acts before any bound: it silences the token
    codes = torch.where(entropy_masked, torch.full_like(codes, names.index(ENTROPY_MASKED)), codes)
    codes = torch.where(t.mask, codes, torch.zeros_like(codes))  # "masked" is the first name of every rule
    if t.tool_output is not None:  # a tool's output does not count, but it is named apart from the padding
        names = (*names, TOOL_OUTPUT)
        codes = codes.masked_fill(t.tool_output, names.index(TOOL_OUTPUT))
        texts[TOOL_OUTPUT] = TOOL_OUTPUT_TEXT
    names, codes, corrected = _correction_whys(bd, names, codes, texts)
    weight = t.weight[zero]
    note = "not shown: no token has A = 0" if not weight.numel() else f"{number(float(weight.max()))} per token here"
    texts[ZERO_ADVANTAGE] = ZERO_ADVANTAGE_TEXT.format(weight_note=note)
    gradient = ENTROPY_MASKED_GRADIENT[config.importance_sampling_level]
    template = ENTROPY_MASKED_TEXT.replace("{gradient}", gradient)
    threshold = entropy_threshold_of(bd)
    texts[ENTROPY_MASKED] = fill(template, {"quantile": config.top_entropy_quantile, "threshold": threshold})
    silenced = {ZERO_ADVANTAGE, *corrected} | (
        {ENTROPY_MASKED} if config.importance_sampling_level == "token" else set()
    )
    labels = {name: labels.get(name, name) for name in names}
    masks = tuple(name for name in (ENTROPY_MASKED, TOOL_OUTPUT) if name in names)
    return TokenWhy(names, codes, texts, no_gradient | silenced, labels, selected, masks, bounds)


def _correction_whys(
    bd: Breakdown, names: tuple[str, ...], codes: Tensor, texts: dict[str, str]
) -> tuple[tuple[str, ...], Tensor, set[str]]:
    """The tokens whose policy term a rollout correction took away get its reading, over the objective's: a weight
    of 0 (IS mask), the off-policy sequence mask, or rollout_rs's rejection. Named only where a token has one; the
    codes whose tokens get no policy gradient come third (under GSPO a dropped token's log-ratio still enters its
    row's ratio, which the row's kept tokens carry)."""
    config, t = bd.config, bd.tokens
    given = (
        (IS_DROPPED, t.mask & (t.correction == MASKED), IS_DROPPED_TEXT),
        (OFF_POLICY_DROPPED, t.mask & (t.correction == SEQUENCE_MASKED), OFF_POLICY_DROPPED_TEXT),
        (RS_REJECTED, t.correction == REJECTED, RS_REJECTED_TEXT),
    )
    values = {
        "correction": config.rollout_correction,
        "low": "off" if config.rollout_is_min is None else number(config.rollout_is_min),
        "high": "off" if config.rollout_is_max is None else number(config.rollout_is_max),
        "threshold": "off" if config.off_policy_mask_threshold is None else number(config.off_policy_mask_threshold),
        "rs": config.rollout_rs or "off",
    }
    silenced = set()
    for name, where, text in given:
        if not bool(where.any()):
            continue
        names = (*names, name)
        codes = codes.masked_fill(where, names.index(name))
        none = name == RS_REJECTED or not bool(t.grad_policy[where].any())
        if none:
            silenced.add(name)
        values_here = {**values, "threshold": config.rollout_rs_threshold or "off"} if name == RS_REJECTED else values
        texts[name] = text.format_map({**values_here, "gradient": CORRECTION_GRADIENT[none]})
    return names, codes, silenced


def entropy_threshold_of(bd: Breakdown) -> float | None:
    """The high-entropy mask's threshold on this batch (the entropy a token needs to keep its policy term),
    or None when the mask is off or no token counts."""
    if bd.config.top_entropy_quantile >= 1 or bd.entropies is None:
        return None
    threshold = entropy_threshold(bd.entropies, bd.tokens.mask, bd.config.top_entropy_quantile)
    return None if threshold is None else float(threshold)


def _sign_sentence(bd: Breakdown) -> str:
    """Why the loss has its sign: the weighted surrogate S against beta·KL K, since loss = K - S.

    "About 0" is relative to the size of the per-token terms being summed (their absolute sum):
    a loss of 1e-8 from terms of size 1 is cancellation, not a small batch.
    """
    loss, surrogate, kl = float(bd.loss), -float(bd.policy_loss), float(bd.kl_loss)
    policy_size = float(bd.tokens.policy_loss.abs().sum())
    size = policy_size + float(bd.tokens.kl_loss.abs().sum())
    L, S, K = mark("loss", loss), mark("weighted_surrogate", surrogate), mark("kl_loss", kl)
    if abs(loss) <= 1e-5 * size:
        return (
            f"The loss is about 0 ({mark('loss', loss, 3)}): its per-token terms, of total size "
            f"{mark('lens/why/term_size', size)}, cancel (weighted surrogate {S}, beta·KL {K})."
        )
    if loss < 0:
        below = " (itself negative: see the KL estimate below)" if kl < 0 else ""
        return f"The loss is negative ({L}) because the weighted surrogate {S} exceeds beta·KL {K}{below}." + (
            _negative_drivers(bd)
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


def _counted(bd: Breakdown) -> torch.Tensor:
    return bd.tokens.mask.bool()


def _negative_drivers(bd: Breakdown) -> str:
    """Which rows carry the negative loss, and the tokens that make the surrogate positive:
    A > 0 tokens whose ratio rose above 1 (the policy already likes them more than when sampled)."""
    shares = bd.rows.loss
    order = [int(i) for i in torch.argsort(shares) if float(shares[i]) < 0][:2]
    rows = " and ".join(f"row {i} ({mark(f'rows/loss/{i}', float(shares[i]))})" for i in order)
    text = f" The most negative loss shares: {rows}." if rows else ""
    a = bd.tokens.advantage  # (B, T): each token's A
    rose = _counted(bd) & (a > 0) & (bd.tokens.ratio > 1)
    if int(rose.sum()):
        top = float(bd.tokens.ratio[rose].max())
        clipped = rose & (bd.tokens.clipped_ratio < bd.tokens.ratio) & (bd.tokens.region > REGIONS.index("trust"))
        free = rose & ~clipped
        n_rose, top_q = mark("lens/why/rose", int(rose.sum()), 12), mark("lens/why/rose_ratio_max", top)
        text += (
            f" {n_rose} token(s) with A > 0 have a ratio above 1 (up to {top_q}): the policy already "
            "made them likelier than when sampled"
        )
        if int(free.sum()):
            text += (
                f"; {mark('lens/why/rose_unclipped', int(free.sum()), 12)} unclipped, whose surrogate A·ratio exceeds A"
            )
        if int(clipped.sum()):
            high = mark("config/1+epsilon_high", 1 + bd.config.epsilon_high)
            n_clipped = mark("lens/why/rose_clipped", int(clipped.sum()), 12)
            text += f"; {n_clipped} clipped at 1 + ε_high = {high}, whose surrogate is the clipped {high}·A"
        text += "."
    return text


def _negative_kl_sentence(bd: Breakdown) -> str | None:
    """A KL estimate below 0 (k1 = logp - ref is, wherever pi < pi_ref): flagged, and whether its
    gradient is the same on every token (beta times the token's weight, as k1's is)."""
    counted = _counted(bd)
    kl = bd.tokens.kl[counted]
    negative = kl < 0
    if not int(negative.sum()):
        return None
    n_negative, n = (
        mark("lens/why/kl_negative", int(negative.sum()), 12),
        mark("lens/num_tokens", int(counted.sum()), 12),
    )
    batch_kl = mark("metrics/kl", bd.metrics.get("kl", float(kl.mean())))
    text = (
        f"The KL estimate is negative on {n_negative} of {n} tokens (as low as "
        f"{mark('lens/why/kl_min', float(kl.min()))}; the batch's kl is {batch_kl}): an estimator "
        "like k1 = logp - ref goes below 0 wherever the policy gives a token less probability than the "
        "reference, so beta·KL lowers the loss there instead of penalising the drift."
    )
    weight = bd.tokens.weight[counted]
    per_weight = bd.tokens.grad_kl[counted] / weight.where(weight != 0, torch.ones_like(weight))
    beta = bd.config.beta
    if beta and torch.allclose(per_weight, torch.full_like(per_weight, beta), rtol=1e-5, atol=0.0):
        text += (
            f" Its gradient is beta × the token's weight (beta = {mark('config/beta', beta)}) on every token alike: it "
            "does not grow with the gap, so it cannot pull a token far below the reference back harder than any other."
        )
    return text


def _clip_sentence(bd: Breakdown, why: TokenWhy) -> str | None:
    """The tokens that get no policy gradient, by what silenced them (their why), with their ratios;
    which of them the clip metrics count."""
    counts = why.counts()
    silent = {name: counts[name] for name in why.names if name in why.no_gradient and counts.get(name)}
    clipped = {k: n for k, n in silent.items() if k != ZERO_ADVANTAGE and k not in why.masks}
    if not clipped:
        return None
    n = sum(counts.values())
    flat = torch.zeros_like(why.codes, dtype=torch.bool)
    for name in clipped:
        if name not in CORRECTION_WHYS:  # a bound of the objective's; a correction's weight 0 is not one
            flat |= why.codes == why.names.index(name)
    span = ""
    if bool(flat.any()):
        ratios = bd.tokens.ratio[flat]
        lo, hi = float(ratios.min()), float(ratios.max())
        span = (
            f"ratio {mark('lens/why/flat_ratio_min', lo)}"
            if lo == hi
            else (f"ratios {mark('lens/why/flat_ratio_min', lo)} to {mark('lens/why/flat_ratio_max', hi)}")
        )
        span = f" ({span} on the bounded ones)"
    parts = ", ".join(f"{mark(f'why/{k}', v, 12)} {why.labels[k]}" for k, v in silent.items())
    total = sum(silent.values())
    n_silent, n_all = mark("why/no_gradient", total, 12), mark("lens/num_tokens", n, 12)
    text = f"{n_silent} of {n_all} tokens get no policy gradient: {parts}{span}."
    held = [k for k in clipped if k in ("dual_clip", "delta")]
    if held:
        text += (
            " clip_ratio/region_mean and actor/pg_clipfrac count only the clipped ones "
            f"({mark('metrics/clip_ratio/region_mean', bd.metrics.get('clip_ratio/region_mean', 0.0))}); "
            + "; ".join(_held_note(bd, k) for k in held)
            + "."
        )
    return text


def _selected_sentence(bd: Breakdown, why: TokenWhy) -> str | None:
    """The tokens the objective's own rule picked (Clip-Cov's cut, KL-Cov's penalised): how many, and what the
    rule did to them (its why text, with the config's numbers)."""
    if why.selected is None:
        return None
    picked = why.codes == why.names.index(why.selected)
    k, n = int(picked.sum()), int(bd.tokens.mask.sum())
    n_picked, n_all = mark(f"why/{why.selected}", k, 12), mark("lens/num_tokens", n, 12)
    text = f"{n_picked} of {n_all} tokens picked by the objective's rule"
    if k:
        top = float(bd.tokens.log_ratio[picked].abs().max())
        text += f" (|log-ratio| up to {mark('lens/why/selected_log_ratio_max', top)})"
    return f"{text}; a picked token is {marked_why_text(bd.config, why.selected)}."


def marked_why_text(config: LossConfig, name: str) -> str:
    """The objective's why sentence for ``name`` (as ``TokenWhy.texts`` has it), each setting's number marked."""
    rule = OBJECTIVES.entry(config.objective).why
    assert rule is not None
    values = {k: "off" if v is None else mark(f"lens/why/setting/{k}", v) for k, v in rule.values(config).items()}
    return rule.texts[name].format_map(values)


def _entropy_mask_sentence(bd: Breakdown, why: TokenWhy) -> str | None:
    """What the high-entropy mask kept: the share and number of tokens, the threshold, and what the rest lose."""
    threshold = entropy_threshold_of(bd)
    if threshold is None:
        return None
    counted = bd.tokens.mask
    n = int(counted.sum())
    masked = int((why.codes == why.names.index(ENTROPY_MASKED)).sum())
    kept = n - masked
    rest = (
        "the rest carry no policy gradient"
        if ENTROPY_MASKED in why.no_gradient
        else "the rest add no policy term of their own, yet their log-ratios still enter their row's sequence ratio"
    )
    quantile = mark("config/top_entropy_quantile", bd.config.top_entropy_quantile)
    share = percent("lens/why/entropy_kept_share", kept / n if n else 0.0)
    return (
        f"The entropy mask (top_entropy_quantile = {quantile}) kept {share} of the "
        f"{mark('lens/num_tokens', n, 12)} tokens: the {mark('lens/why/entropy_kept', kept, 12)} with entropy at least "
        f"{mark('lens/why/entropy_threshold', threshold)}; {rest} "
        f"({mark(f'why/{ENTROPY_MASKED}', masked, 12)} tokens), while their KL term still counts."
    )


def _tool_sentence(bd: Breakdown, why: TokenWhy) -> str | None:
    """How many of the completions' tokens are a tool's output (tool_mask 0), and what that leaves them."""
    if TOOL_OUTPUT not in why.names:
        return None
    tools = int((why.codes == why.names.index(TOOL_OUTPUT)).sum())
    counted = int(bd.tokens.mask.sum())
    completion = mark("lens/completion_tokens", tools + counted, 12)
    return (
        f"{mark(f'why/{TOOL_OUTPUT}', tools, 12)} of the completions' {completion} tokens are a tool's output "
        "(tool_mask = 0): not the model's tokens, so they carry no loss and no gradient "
        f"and are left out of every divisor; the loss counts the other {mark('lens/num_tokens', counted, 12)}."
    )


def _rows_named(rows: list[int]) -> str:
    """ "row 3", "rows 0, 1 and 2": each index marked as the rows table tags it."""
    names = [mark(f"rows/index/{i}", i, 12) for i in rows]
    joined = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"{'row' if len(rows) == 1 else 'rows'} {joined}"


def _correction_sentence(bd: Breakdown) -> str | None:
    """What the rollout correction did, counted as the Mismatch view counts it (``mismatch/counts/<code>``): the
    rows it dropped whole, the tokens it dropped, truncated or rejected, and the loss without it."""
    code, counted = bd.tokens.correction, bd.tokens.mask
    if not bool((code > KEPT).any()) or bd.rollout_logps is None:
        return None

    def n(name: str, value: int) -> str:
        return mark(f"mismatch/counts/{name}", value, 12)

    said = []
    dropped = counted & ((code == MASKED) | (code == SEQUENCE_MASKED))
    whole = (counted.any(-1) & (dropped | ~counted).all(-1)).nonzero().flatten().tolist()
    if int((code == MASKED).sum()):
        rows = f", the whole of {_rows_named(whole)}" if whole else ""
        said.append(
            f"{bd.config.rollout_correction} dropped the policy term of {n('masked', int((code == MASKED).sum()))} "
            f"token(s) (weight 0{rows})"
        )
    if int((code == SEQUENCE_MASKED).sum()):
        said.append(
            f"the off-policy sequence mask dropped the policy term of "
            f"{n('sequence_masked', int((code == SEQUENCE_MASKED).sum()))} token(s)"
        )
    if int((code == TRUNCATED).sum()):
        said.append(
            f"{bd.config.rollout_correction} truncated the weight of "
            f"{n('truncated', int((code == TRUNCATED).sum()))} token(s)"
        )
    rejected = code == REJECTED
    if int(rejected.sum()):
        hit = rejected.any(-1).nonzero().flatten().tolist()
        said.append(
            f"rollout_rs rejected {n('rejected', int(rejected.sum()))} token(s) in {_rows_named(hit)}, which left the "
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


def _trl_correction_sentence(bd: Breakdown) -> str | None:
    """A TRL preset mirrors TRL without vLLM: no correction. Said on the page, with how to turn TRL's default on."""
    config = bd.config
    if not (config.preset or "").startswith("trl") or config.rollout_correction != "none":
        return None
    text = TRL_CORRECTION.format(preset=config.preset, cap=mark("lens/trl/vllm_clip_max", TRL_VLLM_CLIP_MAX))
    if config.objective == "vespo":  # TRL's VESPO takes the weight inside its own φ (docs/variants.md)
        text += " Under loss_type vespo TRL takes that weight inside its own φ instead, which is not reproduced here."
    return text


def _held_note(bd: Breakdown, code: str) -> str:
    if code == "dual_clip":
        lower = bd.metrics.get("actor/pg_clipfrac_lower", 0.0)
        lower_q = mark("metrics/actor/pg_clipfrac_lower", lower)
        return f"verl counts the dual-clip ones as actor/pg_clipfrac_lower ({lower_q})"
    return "no trainer metric counts those capped by delta"


def _unbounded_sentence(bd: Breakdown, why: TokenWhy) -> str | None:
    """A < 0 tokens above 1 + ε_high with no cap set: the story the trust-region label would hide."""
    if "unbounded" not in why.names:
        return None
    free = why.codes == why.names.index("unbounded")
    k = int(free.sum())
    if not k:
        return None
    top = float(bd.tokens.ratio[free].max())
    if "delta" not in why.names:  # another objective's (GMPO, Clip-Cov): its rule's own sentence, no clip advice
        ratio = mark("lens/why/unbounded_ratio_max", top)
        return (
            f"{mark('why/unbounded', k, 12)} token(s) (ratio up to {ratio}) are unbounded: A < 0 and past the "
            "objective's upper bound, where no clip holds them, so the loss and gradient of their rows grow with "
            "their ratio (each token's hover says how, under this objective)."
        )
    return (
        f"{mark('why/unbounded', k, 12)} token(s) with A < 0 have a ratio above 1 + ε_high = "
        f"{mark('config/1+epsilon_high', 1 + bd.config.epsilon_high)} "
        f"(up to {mark('lens/why/unbounded_ratio_max', top)}) and nothing bounds them: the pessimistic min keeps "
        "A·ratio, so their loss and gradient grow with the ratio. "
        "Setting dual_clip (verl clip_ratio_c) or delta bounds them."
    )


def _gspo_sentence(bd: Breakdown) -> str | None:
    """At sequence level the ratio shown per token is its row's; the token ratios can differ widely."""
    if bd.config.importance_sampling_level != "sequence":
        return None
    counted = bd.tokens.mask
    if not bool(counted.any()):
        return None
    token_max = float(bd.tokens.log_ratio[counted].exp().max())
    seq_max = bd.metrics.get("lens/ratio/max", 1.0)
    return (
        f"Sequence-level ratio (GSPO): each token uses its row's ratio exp(mean log-ratio), at most "
        f"{mark('metrics/lens/ratio/max', seq_max)} here (lens/ratio/max), while the token ratios themselves reach "
        f"{mark('lens/token_ratio/max', token_max)}."
    )


def _clamp_sentences(bd: Breakdown) -> list[str]:
    return [
        f"{name} acted on {mark(f'clamp_counts/{name}', count, 12)} token(s): a clamp passes no gradient where it "
        "acts, so those tokens get none through the clamped term."
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
    n_short, n_long = (mark(f"rows/length/{i}", int(length[i]), 12) for i in (short, long))
    q_short, q_long = mark(f"lens/why/row_weight/{short}", w_short), mark(f"lens/why/row_weight/{long}", w_long)
    head = (
        f"Per token, the shortest row (row {short}, {n_short} token{'' if int(length[short]) == 1 else 's'}) "
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


def _per_token_advantage_sentence(bd: Breakdown) -> str | None:
    """Advantages given per token whose rows' tokens differ: how many rows, the range, and what it means."""
    if not bd.per_token_advantages:
        return None
    a, counted = bd.tokens.advantage, bd.tokens.mask
    low = torch.where(counted, a, torch.inf).amin(-1)
    high = torch.where(counted, a, -torch.inf).amax(-1)
    varies = counted.any(-1) & (low != high)
    n = int(varies.sum())
    if not n:
        return None
    rows, total = mark("lens/why/per_token_advantage_rows", n, 12), mark("lens/why/rows", len(varies), 12)
    lo, hi = (
        mark("lens/why/advantage_min", float(a[counted].min())),
        mark("lens/why/advantage_max", float(a[counted].max())),
    )
    return (
        f"The advantages come per token: {rows} of {total} rows carry different ones on their tokens (from {lo} "
        f"to {hi} over the batch), so each token's term is scaled by its own A, and a row's advantage shown is the "
        "mean over its counted tokens."
    )


def _zero_std_sentence(bd: Breakdown) -> str:
    """Zero-std groups: advantages 0, yet their tokens stay in the divisor and dilute the others."""
    m = bd.metrics
    text = (
        f"{mark('lens/why/zero_std_groups', len(bd.zero_std_groups), 12)} group(s) have zero reward std "
        f"(frac_reward_zero_std = {mark('metrics/frac_reward_zero_std', m.get('frac_reward_zero_std', 0.0))}): their "
        "advantages are 0 and they teach nothing."
    )
    zero_rows = torch.isin(bd.rows.group, torch.tensor(bd.zero_std_groups, device=bd.rows.group.device))
    counted = bd.tokens.mask
    total = float(bd.tokens.weight[counted].sum())
    silent = float(bd.tokens.weight[counted & zero_rows[:, None]].sum())
    if total > 0 and silent > 0 and silent < total:
        share = (total - silent) / total
        n_zero = int((counted & zero_rows[:, None]).sum())
        text += (
            f" Their {mark('lens/why/zero_std_tokens', n_zero, 12)} token(s) still count in the aggregation's "
            f"divisor: they hold {mark('lens/why/zero_std_weight_share', silent / total)} of the weight, so the other "
            f"groups' policy gradient is {mark('lens/why/signal_weight_share', share)}× what it would be with them "
            "filtered out (as DAPO's dynamic sampling does)."
        )
    return text


def explain_parts(bd: Breakdown, why: TokenWhy | None = None) -> list[tuple[str, list[str | dict[str, Any]]]]:
    """``explain_items`` with each number apart: text pieces and {"quantity", "value", "text"}. ``why``:
    ``token_why(bd)`` when the caller has it already (the answer does)."""
    return [(key, parts_of(text)) for key, text in _marked_items(bd, why)]


def explain_items(bd: Breakdown) -> list[tuple[str, str]]:
    """The sentences of ``explain``, each with a key saying what it is about, so a reader (the page's
    compare view) finds one by its key, never by its wording: "sign", "on_policy", "tool_mask", "entropy_mask",
    "selected" (the tokens the objective's own rule picked: Clip-Cov, KL-Cov), "clip", "unbounded",
    "gspo", "negative_kl", "correction" (what the rollout correction did), "trl_correction" (a TRL preset without
    TRL's vLLM correction), "clamp", "zero_std", "per_token_advantages", "kl_off", "kl_dominates", "length"."""
    return [(key, plain(text)) for key, text in _marked_items(bd)]


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


def _marked_items(bd: Breakdown, why: TokenWhy | None = None) -> list[tuple[str, str]]:
    policy, kl, surrogate = float(bd.policy_loss), float(bd.kl_loss), -float(bd.policy_loss)
    beta = bd.config.beta
    m = bd.metrics
    out = [("sign", _sign_sentence(bd))]
    if m.get("lens/ratio/min") == 1.0 and m.get("lens/ratio/max") == 1.0:
        on_policy = f"The ratio is 1 everywhere {_ratio_one(bd)}, {mark('policy_loss', policy)}, and nothing can clip"
        size = float(bd.tokens.policy_loss.abs().sum() + bd.tokens.kl_loss.abs().sum())
        grad_norm = m.get("lens/grad_norm_logps", 0.0)
        if abs(float(bd.loss)) <= NEAR_ZERO * size and grad_norm > 0:
            on_policy += (
                "; the loss is small next to its terms, yet the gradient norm is "
                f"{mark('metrics/lens/grad_norm_logps', grad_norm)}: a near-zero loss does not mean a zero gradient"
            )
        out.append(("on_policy", on_policy + "."))
    why = token_why(bd) if why is None else why
    candidates = (
        ("tool_mask", _tool_sentence(bd, why)),
        ("entropy_mask", _entropy_mask_sentence(bd, why)),
        ("selected", _selected_sentence(bd, why)),
        ("clip", _clip_sentence(bd, why)),
        ("unbounded", _unbounded_sentence(bd, why)),
        ("gspo", _gspo_sentence(bd)),
        ("negative_kl", _negative_kl_sentence(bd)),
        ("correction", _correction_sentence(bd)),
        ("trl_correction", _trl_correction_sentence(bd)),
    )
    out += [(key, s) for key, s in candidates if s]
    out += [("clamp", s) for s in _clamp_sentences(bd)]
    if bd.zero_std_groups:
        out.append(("zero_std", _zero_std_sentence(bd)))
    per_token = _per_token_advantage_sentence(bd)
    if per_token:
        out.append(("per_token_advantages", per_token))
    if beta == 0:
        out.append(("kl_off", "beta = 0: the KL term is off, so the loss is the policy term alone."))
    elif kl > 0 and kl > 10 * abs(surrogate) and kl > 1e-8:
        out.append(
            (
                "kl_dominates",
                f"beta·KL ({mark('kl_loss', kl)}) dominates the loss; the KL gradient pushes tokens back toward the "
                "reference.",
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
