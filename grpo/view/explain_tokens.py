"""The sentences on what acted on the tokens: a tool's output, the entropy mask, the objective's own pick, the
bounds that silenced a token's policy gradient (and which clip metrics count them), the tokens no bound holds,
GSPO's sequence ratio, and the clamps."""

from __future__ import annotations

from grpo.loss import Breakdown
from grpo.marks import mark, percent
from grpo.view.counted import Counted, extent
from grpo.view.why import (
    CORRECTION_WHYS,
    ENTROPY_MASKED,
    TOOL_OUTPUT,
    ZERO_ADVANTAGE,
    TokenWhy,
    entropy_threshold_of,
    marked_why_text,
)


def tool_sentence(bd: Breakdown, why: TokenWhy, tokens: Counted) -> str | None:
    """How many of the completions' tokens are a tool's output (tool_mask 0), and what that leaves them."""
    if TOOL_OUTPUT not in why.names:
        return None
    tools = why.counts()[TOOL_OUTPUT]
    counted = tokens.n
    completion = mark("lens/completion_tokens", tools + counted, 12)
    return (
        f"{mark(f'why/{TOOL_OUTPUT}', tools, 12)} of the completions' {completion} tokens are a tool's output "
        "(tool_mask = 0): not the model's tokens, so they carry no loss and no gradient "
        f"and are left out of every divisor; the loss counts the other {mark('lens/num_tokens', counted, 12)}."
    )


def entropy_mask_sentence(bd: Breakdown, why: TokenWhy, counted: Counted) -> str | None:
    """What the high-entropy mask kept: the share and number of tokens, the threshold, and what the rest lose."""
    threshold = entropy_threshold_of(bd)
    if threshold is None:
        return None
    n = counted.n
    masked = why.counts()[ENTROPY_MASKED]
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


def selected_sentence(bd: Breakdown, why: TokenWhy, counted: Counted) -> str | None:
    """The tokens the objective's own rule picked (Clip-Cov's cut, KL-Cov's penalised): how many, and what the
    rule did to them (its why text, with the config's numbers)."""
    if why.selected is None:
        return None
    k = why.counts()[why.selected]
    n_picked, n_all = mark(f"why/{why.selected}", k, 12), mark("lens/num_tokens", counted.n, 12)
    text = f"{n_picked} of {n_all} tokens picked by the objective's rule"
    if k:
        low, high = extent(bd.tokens.log_ratio, why.where([why.selected]))
        top = max(abs(low), abs(high))  # the largest |log-ratio| is one of the two ends
        text += f" (|log-ratio| up to {mark('lens/why/selected_log_ratio_max', top)})"
    return f"{text}; a picked token is {marked_why_text(bd.config, why.selected)}."


def clip_sentence(bd: Breakdown, why: TokenWhy, counted: Counted) -> str | None:
    """The tokens that get no policy gradient, by what silenced them (their why), with their ratios;
    which of them the clip metrics count."""
    counts = why.counts()
    silent = {name: counts[name] for name in why.names if name in why.no_gradient and counts.get(name)}
    clipped = {k: n for k, n in silent.items() if k != ZERO_ADVANTAGE and k not in why.masks}
    if not clipped:
        return None
    n = sum(counts.values())
    bounded = [name for name in clipped if name not in CORRECTION_WHYS]  # a correction's weight 0 is no bound
    parts = ", ".join(f"{mark(f'why/{k}', v, 12)} {why.labels[k]}" for k, v in silent.items())
    total = sum(silent.values())
    n_silent, n_all = mark("why/no_gradient", total, 12), mark("lens/num_tokens", n, 12)
    text = f"{n_silent} of {n_all} tokens get no policy gradient: {parts}{_flat_span(bd, why, bounded)}."
    held = [k for k in clipped if k in ("dual_clip", "delta")]
    if held:
        text += (
            " clip_ratio/region_mean and actor/pg_clipfrac count only the clipped ones "
            f"({mark('metrics/clip_ratio/region_mean', bd.metrics.get('clip_ratio/region_mean', 0.0))}); "
            + "; ".join(_held_note(bd, k) for k in held)
            + "."
        )
    return text


def _flat_span(bd: Breakdown, why: TokenWhy, bounded: list[str]) -> str:
    """The ratios of the tokens a bound of the objective's holds (``bounded``: their codes, each with a token)."""
    if not bounded:
        return ""
    lo, hi = extent(bd.tokens.ratio, why.where(bounded))
    span = (
        f"ratio {mark('lens/why/flat_ratio_min', lo)}"
        if lo == hi
        else (f"ratios {mark('lens/why/flat_ratio_min', lo)} to {mark('lens/why/flat_ratio_max', hi)}")
    )
    return f" ({span} on the bounded ones)"


def _held_note(bd: Breakdown, code: str) -> str:
    if code == "dual_clip":
        lower = bd.metrics.get("actor/pg_clipfrac_lower", 0.0)
        lower_q = mark("metrics/actor/pg_clipfrac_lower", lower)
        return f"verl counts the dual-clip ones as actor/pg_clipfrac_lower ({lower_q})"
    return "no trainer metric counts those capped by delta"


def unbounded_sentence(bd: Breakdown, why: TokenWhy) -> str | None:
    """A < 0 tokens above 1 + ε_high with no cap set: the story the trust-region label would hide."""
    if "unbounded" not in why.names:
        return None
    k = why.counts()["unbounded"]
    if not k:
        return None
    top = extent(bd.tokens.ratio, why.where(["unbounded"]))[1]
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


def gspo_sentence(bd: Breakdown, counted: Counted) -> str | None:
    """At sequence level the ratio shown per token is its row's; the token ratios can differ widely."""
    if bd.config.importance_sampling_level != "sequence" or not counted.n:
        return None
    token_max = float(counted.values(bd.tokens.log_ratio).exp().max())
    seq_max = bd.metrics.get("lens/ratio/max", 1.0)
    return (
        f"Sequence-level ratio (GSPO): each token uses its row's ratio exp(mean log-ratio), at most "
        f"{mark('metrics/lens/ratio/max', seq_max)} here (lens/ratio/max), while the token ratios themselves reach "
        f"{mark('lens/token_ratio/max', token_max)}."
    )


def clamp_sentences(bd: Breakdown) -> list[str]:
    return [
        f"{name} acted on {mark(f'clamp_counts/{name}', count, 12)} token(s): a clamp passes no gradient where it "
        "acts, so those tokens get none through the clamped term."
        for name, count in bd.clamp_counts.items()
        if count
    ]
