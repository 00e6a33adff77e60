"""Each token's "why": which bound of its objective acted on it, or what else silenced its policy term.

``token_why`` computes it once per breakdown, from the objective's own rule (its registry entry's ``why``) with
A = 0, the token masks and the rollout correction laid over it; every count and sentence of the explanation
(grpo.view.explain) and the answer's per-token codes read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import MASKED, REJECTED, SEQUENCE_MASKED
from grpo.loss import Breakdown, entropy_threshold
from grpo.marks import mark, number
from grpo.objectives import OBJECTIVES, REGIONS
from grpo.view.counted import extent

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


@dataclass(frozen=True)
class TokenWhy:
    """Each token's reading: a code into ``names`` and what it means under this config."""

    names: tuple[str, ...]
    codes: Tensor
    """(B, T) int8 indices into names; 0 ("masked") where a position does not count."""
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
    """(B, T) int8 indices into names: which bound of the objective acted on each token, as its rule names it
    ("unbounded" for a ratio past the trust region that no clip holds, "delta" for TRL's cap), before A = 0, the
    token masks and the corrections are laid over it; 0 where a position does not count. None: ``codes``."""

    def counts(self) -> dict[str, int]:
        """Tokens per code (masked excluded), every code listed: the counted ones, and a tool's output (the tokens
        rollout_rs rejected left the batch: not here, they are the mismatch block's counts["rejected"])."""
        return dict(self._counts)

    @cached_property
    def _counts(self) -> dict[str, int]:
        """``counts``, tallied once: the answer and the sentences each read them."""
        found = code_counts(self.codes, len(self.names)).tolist()
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

    def laid_over(self) -> bool:
        """Whether some token's why is not its bound (``bounds`` given): an overlay (A = 0, a token mask, a
        correction) took it. Each overlay's code is past every code of the objective's own (``token_why`` appends
        its name), so this is the largest code's test, one int8 reduction (torch.equal of the two is several)."""
        first = self.names.index(ZERO_ADVANTAGE)  # the first name token_why lays over the objective's
        return self.bounds is not None and self.codes.numel() > 0 and int(self.codes.max()) >= first

    def where(self, names: Iterable[str]) -> Tensor:
        """int8 (B, T): 1 on the tokens whose code is one of ``names`` (each one of ``self.names``)."""
        found = torch.zeros(self.codes.shape, dtype=torch.int8, device=self.codes.device)
        for name in names:
            found |= indicator(torch.eq, self.codes, self.names.index(name))
        return found

    def code_names(self) -> list[list[str]]:
        return [[self.names[c] for c in row] for row in self.codes.tolist()]


def code_counts(codes: Tensor, n: int) -> Tensor:
    """(n,) how many of the int8 ``codes`` (each in [0, n)) hold each code. bincount runs serially, one element
    after another: it counts the pairs of neighbouring codes instead, each pair's two bytes read as one int16 (a
    + 256·b), half as many elements; a code's count is its pairs with it as a plus those with it as b."""
    flat = codes.flatten()
    if flat.numel() % 2 or flat.storage_offset() % 2:  # no whole pairs to read: one by one
        return torch.bincount(flat, minlength=n)
    pairs = torch.bincount(flat.view(torch.int16), minlength=256 * n).view(n, 256)[:, :n]  # [b, a]
    return pairs.sum(0) + pairs.sum(1)


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
    labels, selected = dict(LABELS), None
    if rule is None:
        names, codes = REGIONS, t.region
        texts, no_gradient = dict(REGION_TEXTS), frozenset[str]()
    else:
        names, codes = rule.names, rule.codes(t.ratio, t.advantage, t.region.long(), config)
        texts = dict(_filled(config, rule.values, tuple((name, rule.texts[name]) for name in rule.names)))
        no_gradient, selected = rule.no_gradient, rule.selected
        labels |= rule.labels
    # int8 codes (a few names): every pass over them below moves an eighth of int64's bytes
    codes = codes.to(torch.int8, copy=True)
    if selected is not None and t.selected is not None:  # the objective's own pick, whatever the region
        codes.masked_fill_(t.selected > 0, names.index(selected))
    names = (*names, ZERO_ADVANTAGE, ENTROPY_MASKED)
    counted = t.mask.view(torch.int8)  # 1 where a token counts: the bool mask's bytes
    bounds = codes.mul_(counted)  # the objective's reading, before the overlays; "masked" is code 0
    zero = _zero_advantage(bd, bounds, names.index("trust"))
    codes = _laid_over(bounds.clone(), zero, names.index(ZERO_ADVANTAGE))
    if config.top_entropy_quantile < 1:  # the entropy mask acts before any bound: it silences the token
        _laid_over(codes, indicator(torch.eq, t.policy_kept, 0) & counted, names.index(ENTROPY_MASKED))
    if t.tool_output is not None:  # a tool's output does not count, but it is named apart from the padding
        names = (*names, TOOL_OUTPUT)
        _laid_over(codes, t.tool_output.to(torch.int8), names.index(TOOL_OUTPUT))
        texts[TOOL_OUTPUT] = TOOL_OUTPUT_TEXT
    names, codes, corrected = _correction_whys(bd, names, codes, texts)
    texts |= _overlay_texts(bd, zero)
    silenced = {ZERO_ADVANTAGE, *corrected} | (
        {ENTROPY_MASKED} if config.importance_sampling_level == "token" else set()
    )
    labels = {name: labels.get(name, name) for name in names}
    masks = tuple(name for name in (ENTROPY_MASKED, TOOL_OUTPUT) if name in names)
    return TokenWhy(names, codes, texts, no_gradient | silenced, labels, selected, masks, bounds)


def indicator(compare: Callable[..., Tensor], x: Tensor, value: float) -> Tensor:
    """``compare(x, value)`` (torch.eq, torch.lt, ...) as int8 0/1: on CPU a comparison written into bool runs
    several times slower than into int8, and int8 indicators combine with ``&`` and ``|`` in cheap passes."""
    return compare(x, value, out=torch.empty(x.shape, dtype=torch.int8, device=x.device))


def _laid_over(codes: Tensor, where: Tensor, code: int) -> Tensor:
    """``codes`` set to ``code`` where the int8 indicator ``where`` is 1, in place. Each overlay's code is past
    every code laid before it (its name is appended last), so setting it is a maximum: one int8 pass, where
    ``masked_fill`` reads a bool mask at several times the cost."""
    return torch.maximum(codes, where * code, out=codes)


def _zero_advantage(bd: Breakdown, bounds: Tensor, trust: int) -> Tensor:
    """int8 (B, T): 1 on a counted token in the trust region with A = 0 (``bounds`` is 0 where nothing counts).
    Given per row, a row's A is each of its counted tokens' (tokens.advantage is it times the mask): compared
    once per row."""
    advantage = bd.tokens.advantage if bd.per_token_advantages else bd.advantages[:, None]  # (B, T) or (B, 1)
    return indicator(torch.eq, advantage, 0) & indicator(torch.eq, bounds, trust)


def _overlay_texts(bd: Breakdown, zero: Tensor) -> dict[str, str]:
    """The sentences of A = 0 (the weight its ``zero`` tokens, an int8 indicator, still carry) and of the entropy
    mask (its threshold on this batch)."""
    config = bd.config
    rows = zero.amax(-1).nonzero().squeeze(1)  # (B, T) -> (k, T): the rows with such a token
    note = "not shown: no token has A = 0"
    if rows.numel():
        note = f"{number(extent(bd.tokens.weight[rows], zero[rows])[1])} per token here"
    template = ENTROPY_MASKED_TEXT.replace("{gradient}", ENTROPY_MASKED_GRADIENT[config.importance_sampling_level])
    threshold = entropy_threshold_of(bd)
    return {
        ZERO_ADVANTAGE: ZERO_ADVANTAGE_TEXT.format(weight_note=note),
        ENTROPY_MASKED: fill(template, {"quantile": config.top_entropy_quantile, "threshold": threshold}),
    }


def _correction_whys(
    bd: Breakdown, names: tuple[str, ...], codes: Tensor, texts: dict[str, str]
) -> tuple[tuple[str, ...], Tensor, set[str]]:
    """The tokens whose policy term a rollout correction took away get its reading, over the objective's: a weight
    of 0 (IS mask), the off-policy sequence mask, or rollout_rs's rejection. Named only where a token has one; the
    codes whose tokens get no policy gradient come third (under GSPO a dropped token's log-ratio still enters its
    row's ratio, which the row's kept tokens carry)."""
    config, t = bd.config, bd.tokens
    if not t.correction.numel() or int(t.correction.max()) < MASKED:  # no token dropped or rejected: one pass
        return names, codes, set()
    counted = t.mask.view(torch.int8)
    given = (
        (IS_DROPPED, counted & indicator(torch.eq, t.correction, MASKED), IS_DROPPED_TEXT),
        (OFF_POLICY_DROPPED, counted & indicator(torch.eq, t.correction, SEQUENCE_MASKED), OFF_POLICY_DROPPED_TEXT),
        (RS_REJECTED, indicator(torch.eq, t.correction, REJECTED), RS_REJECTED_TEXT),
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
        if not int(where.max()):
            continue
        names = (*names, name)
        _laid_over(codes, where, names.index(name))
        none = name == RS_REJECTED or not bool(t.grad_policy[where.view(torch.bool)].any())
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


def marked_why_text(config: LossConfig, name: str) -> str:
    """The objective's why sentence for ``name`` (as ``TokenWhy.texts`` has it), each setting's number marked."""
    rule = OBJECTIVES.entry(config.objective).why
    assert rule is not None
    values = {k: "off" if v is None else mark(f"lens/why/setting/{k}", v) for k, v in rule.values(config).items()}
    return rule.texts[name].format_map(values)
