"""Breakdowns to JSON: which fields and per-token arrays an answer carries, in one place.

The API's answer to /api/v1/loss and the output of ``python -m grpo eval --json`` are this module's: the
library owns the shape, the server sends it. No web framework here: grpo, NumPy and orjson only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import torch
from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import CORRECTION_CODES, MASKED, REJECTED, SEQUENCE_MASKED
from grpo.fields import ragged
from grpo.loss import Breakdown
from grpo.marks import number, parts_of, plain
from grpo.metrics import logged_metrics
from grpo.objectives import REGIONS
from grpo.view.counted import Counted, correction_acted
from grpo.view.curves import objective_curves
from grpo.view.explain import explain_parts
from grpo.view.glossary import metric_meaning_parts
from grpo.view.mismatch import mismatch_view
from grpo.view.pooling import pool_extreme, pool_factors
from grpo.view.token_fields import HEATMAP_CENTERS as HEATMAP_CENTERS
from grpo.view.token_fields import TOKEN_FIELDS as TOKEN_FIELDS
from grpo.view.token_fields import heatmap_centers, token_field_names
from grpo.view.why import TokenWhy, token_why

ROW_FIELDS = (
    "advantage",
    "reward",
    "length",
    "loss",
    "policy_loss",
    "kl_loss",
    "sequence_ratio",
    "clip_fraction",
    "group",
)


# The heatmaps' fields and the value each is centred on are the token-field table's (heatmap_centers). A
# grid past these many rows or positions has more cells than the heatmap has pixels (it is drawn at most
# ~240 px high and ~800 px wide): it is pooled.
HEATMAP_MAX_ROWS = 240
HEATMAP_MAX_TOKENS = 600


def pooled_heatmaps(bd: Breakdown, lengths: list[int], rows: list[int], drawable: bool) -> dict[str, Any] | None:
    """The heatmaps' fields over ``rows``, pooled over blocks where the grid has more cells than the
    heatmap has pixels (float32: numbers to draw). None when the grid fits and is ``drawable`` from
    the per-token arrays (they hold those rows): the page draws it cell by cell.
    """
    width = max((lengths[i] for i in rows), default=0)
    fr, ft = pool_factors(len(rows), width, HEATMAP_MAX_ROWS, HEATMAP_MAX_TOKENS)
    if width == 0 or (fr == ft == 1 and drawable):
        return None
    index = torch.tensor(rows)
    mask = bd.tokens.mask[index, :width].cpu()
    pooled = {
        f: pool_extreme(getattr(bd.tokens, f)[index, :width].detach().cpu(), mask, fr, ft, c)
        for f, c in heatmap_centers().items()
    }
    first = next(iter(pooled.values()))
    return {
        "factor_rows": fr,
        "factor_tokens": ft,
        "rows": rows,
        "width": width,
        "counted": first.counted.numpy(),
        "fields": {f: p.values.numpy().astype(np.float32) for f, p in pooled.items()},
    }


def _rows_of(t: Tensor, lengths: list[int], rows: list[int]) -> list[np.ndarray]:
    return ragged(t.detach().cpu().numpy(), lengths, rows)


def breakdown_to_json(
    bd: Breakdown,
    lengths: list[int] | None = None,
    tokens: list[list[str]] | None = None,
    rows: list[int] | None = None,
    max_tokens: int | None = None,
    every_row: bool = False,
) -> dict[str, Any]:
    """The breakdown as JSON-ready data (NumPy arrays inside: dump with ``dumps``).

    Per-token arrays are ragged: row i keeps its first ``lengths[i]`` positions (default: all).
    They cover every row when the batch has at most ``max_tokens`` positions, else only
    ``rows`` (none by default): the summary and per-row data always come whole. The heatmaps'
    grid (``heatmap``) covers those rows, or with ``every_row`` the whole batch.
    """
    B, T = bd.tokens.mask.shape
    lengths = lengths or [T] * B
    total = sum(lengths)
    if rows is None:
        rows = list(range(B)) if max_tokens is None or total <= max_tokens else []
    why, counted, config = token_why(bd), Counted(bd), bd.config.to_dict()
    mismatch = mismatch_view(bd)
    return {
        **_totals(bd),
        **_explained(bd, why, counted, config),
        **_per_row(bd, mismatch),
        "tokens": _per_token(bd, why, lengths, tokens, rows),
        "token_rows": rows,
        "tokens_complete": len(rows) == B,
        "heatmap": pooled_heatmaps(bd, lengths, list(range(B)) if every_row else rows, len(rows) == B),
        "num_positions": total,
        "curves": drawn_curves(with_why(objective_curves(bd, tokens=counted), why)),
        "clamp_counts": bd.clamp_counts,
        "zero_std_groups": list(bd.zero_std_groups),
        "config": config,
        "device": bd.device,
        "dtype": bd.dtype,
        # each warning once: its text and its parts (each number apart, tagged with the quantity it shows, as
        # explanation_parts); the page draws these. "warnings" and "warning_parts" are their texts and parts.
        "warning_sentences": [tagged_sentence(w) for w in bd.marked_warnings],
        "warnings": list(bd.warnings),
        "warning_parts": [parts_of(w) for w in bd.marked_warnings],
        # the mismatch view (grpo.view.mismatch): the sampler against the trainer and what the correction did;
        # null without the sampler's log-probs when no correction acted
        "mismatch": mismatch,
    }


def _totals(bd: Breakdown) -> dict[str, Any]:
    """The answer's scalars and metrics."""
    return {
        "loss": float(bd.loss),
        "objective": float(bd.objective),
        "policy_loss": float(bd.policy_loss),
        "kl_loss": float(bd.kl_loss),
        # the same batch with the rollout correction off; tokens.correction: codes into correction_names
        "loss_without_correction": float(bd.loss_without_correction),
        "correction_names": list(CORRECTION_CODES),
        "metrics": bd.metrics,
        # the metrics the config's trainer logs, in order (the page's table): every objective's are in metrics
        "metrics_logged": logged_metrics(bd.config, bd.metrics),
    }


def _explained(bd: Breakdown, why: TokenWhy, counted: Counted, config: dict[str, Any]) -> dict[str, Any]:
    """The summary's sentences, what each token's why means, each metric's meaning and the settings' numbers."""
    explained = explain_parts(bd, why, counted)
    return {
        "explanation": [_text(parts) for _, parts in explained],
        "explanation_keys": [key for key, _ in explained],  # what each sentence is about (explain_items)
        # the same sentences with each number apart, tagged with the quantity it shows
        "explanation_parts": [parts for _, parts in explained],
        # each token's why (tokens.why: codes into names), what each name means under this config, and the counts
        "why": {
            "names": list(why.names),
            "texts": why.texts,
            "counts": why.counts(),
            "no_gradient": sorted(why.no_gradient),
            "labels": why.labels,  # how a group of tokens with each code is named (summary, legends)
            "masks": list(why.masks),  # the codes of token masks (the entropy mask), marked apart on the heatmaps
            "selected": why.selected,  # the code of the tokens the objective's own rule picked (or null)
            "marked": list(why.marked),  # the codes the heatmaps mark over their cells
        },
        # each metric's meaning under this config, its numbers apart (the text is the parts joined)
        "metric_meaning_parts": {k: v for k, v in metric_meaning_parts(bd.config).items() if k in bd.metrics},
        # the numbers as the page prints them: enough digits to tell a value from 1 (GSPO's 1 + 4e-4)
        "config_text": {k: number(v) for k, v in config.items() if _is_number(v)},
    }


def _per_row(bd: Breakdown, mismatch: dict[str, Any] | None) -> dict[str, Any]:
    """The advantages and the rows table (with what the correction did to each row, with a mismatch block)."""
    row_data = {name: getattr(bd.rows, name) for name in ROW_FIELDS}
    if mismatch is not None:  # the rows table shows what the correction did to each row, as the Mismatch view counts
        row_data |= correction_rows(bd, mismatch)
    return {
        "advantages": bd.advantages.cpu().numpy(),
        # given per token: each row's smallest and largest counted advantage, and whether they differ (the rows
        # table shows the row's value where they do not, else its mean and range, "per token"); null per row
        "advantage_per_token": advantage_spread(bd) if bd.per_token_advantages else None,
        "rows": {k: (v.cpu().numpy() if isinstance(v, Tensor) else v) for k, v in row_data.items()},
    }


def _per_token(
    bd: Breakdown, why: TokenWhy, lengths: list[int], tokens: list[list[str]] | None, rows: list[int]
) -> dict[str, Any]:
    """The per-token arrays of ``rows``, each row its first ``lengths[i]`` positions."""
    token_data: dict[str, Any] = {
        name: _rows_of(getattr(bd.tokens, name), lengths, rows) for name in token_field_names()
    }
    token_data["mask"] = [m.astype(np.int8) for m in _rows_of(bd.tokens.mask, lengths, rows)]
    region = bd.tokens.region.cpu().numpy()
    token_data["region"] = [[REGIONS[c] for c in row] for row in ragged(region, lengths, rows)]
    if tokens is not None:
        token_data["text"] = [tokens[i] for i in rows]
    # a code per token into why.names (the page maps codes to names): a name per token was a string
    # per position, a sixth of the answer's bytes on a small batch
    token_data["why"] = ragged(why.codes.to(torch.int8).cpu().numpy(), lengths, rows)
    if why.bounds is not None and why.laid_over():  # a token whose why is not its bound
        # which bound acted on each token (into why.names), where A = 0, a mask or a correction is its why:
        # the page's region column and the CSV's ("unbounded", not the region code's "trust")
        token_data["bound"] = ragged(why.bounds.to(torch.int8).cpu().numpy(), lengths, rows)
    return token_data | _optional_per_token(bd, lengths, rows)


def _optional_per_token(bd: Breakdown, lengths: list[int], rows: list[int]) -> dict[str, Any]:
    """The per-token arrays only some batches and configs have."""
    token_data: dict[str, Any] = {}
    # the off-policy mismatch and what the correction did, per token: with the sampler's log-probs, or when a
    # correction acted without them (TRL's off-policy mask falls back to the old log-probs)
    if bd.sampled or correction_acted(bd):
        token_data["sampler_log_ratio"] = _rows_of(bd.tokens.sampler_log_ratio, lengths, rows)
        token_data["is_weight"] = _rows_of(bd.tokens.is_weight, lengths, rows)
        token_data["correction"] = ragged(bd.tokens.correction.to(torch.int8).cpu().numpy(), lengths, rows)
    if bd.per_token_advantages:  # each token's own advantage (a row's may vary)
        token_data["advantage"] = _rows_of(bd.tokens.advantage, lengths, rows)
    if bd.entropies is not None:  # the batch's per-token entropies as given (the hover shows them)
        token_data["entropies"] = _rows_of(bd.entropies, lengths, rows)
    if bd.config.importance_sampling_level == "sequence":  # the token's own ratio beside its row's (GSPO)
        token_data["token_ratio"] = _rows_of(bd.tokens.log_ratio.exp() * bd.tokens.mask, lengths, rows)
    return token_data


def tagged_sentence(marked: str) -> dict[str, Any]:
    """A marked sentence (grpo.marks) as the answer sends it: its plain text and its parts."""
    return {"text": plain(marked), "parts": parts_of(marked)}


def add_warnings(answer: dict[str, Any], sentences: list[str]) -> None:
    """``sentences`` (marked or plain) added to an answer's warnings: to ``warning_sentences``, which the page
    draws, and to ``warnings`` and ``warning_parts``, which stay one for one with it."""
    tagged = [tagged_sentence(s) for s in sentences]
    answer["warning_sentences"] += tagged
    answer["warnings"] += [t["text"] for t in tagged]
    answer["warning_parts"] += [t["parts"] for t in tagged]


CORRECTION_ROW_FIELDS = ("rollout_is_ratio", "rollout_weight", "rollout_dropped", "rollout_rejected")
"""The rows table's columns on the rollout correction (with a mismatch block): the sampler ratio exp(Σ old −
sampler) (sequence_ratio is current/old, the policy's), the sequence-level weight applied (0 for a dropped row),
and per row the tokens whose policy term a correction dropped and those rollout_rs rejected."""


def correction_rows(bd: Breakdown, mismatch: dict[str, Any]) -> dict[str, Any]:
    """Per row, from the same codes as the Mismatch view's counts (their sums are its counts)."""
    code = bd.tokens.correction
    out: dict[str, Any] = {}
    rows = mismatch["rows"]
    if "is_ratio" in rows:
        out["rollout_is_ratio"] = rows["is_ratio"]
    if "is_weight" in rows:
        out["rollout_weight"] = rows["is_weight"]
    dropped = (code == MASKED) | (code == SEQUENCE_MASKED)
    out["rollout_dropped"] = dropped.sum(-1).to(torch.int32).cpu().numpy()
    out["rollout_rejected"] = (code == REJECTED).sum(-1).to(torch.int32).cpu().numpy()
    return out


def advantage_spread(bd: Breakdown) -> dict[str, Any]:
    """Per row: the smallest and largest advantage over its counted tokens (0 for a row with none), and whether
    the row's tokens carry different ones (``rows.advantage`` is then their mean)."""
    a, counted = bd.tokens.advantage.detach(), bd.tokens.mask
    any_counted = counted.any(-1)
    low = torch.where(counted, a, torch.inf).amin(-1).where(any_counted, 0.0)
    high = torch.where(counted, a, -torch.inf).amax(-1).where(any_counted, 0.0)
    return {"min": low.cpu().numpy(), "max": high.cpu().numpy(), "varies": (low != high).cpu().tolist()}


def with_why(curves: dict[str, Any], why: TokenWhy) -> dict[str, Any]:
    """The clip view's points with each token's why (its code's name, as the hovers and counts read it): the
    chart colours a point by it, so a token Clip-Cov cut is not drawn as a dual-clip one."""
    points = curves["points"]
    codes = why.codes[points["row"], points["position"]].tolist() if points["row"] else []
    return {**curves, "points": {**points, "why": [why.names[c] for c in codes]}}


def drawn_curves(curves: dict[str, Any]) -> dict[str, Any]:
    """The clip view's curves with their numbers as float32 (numbers to draw: float64's 17 digits were a
    quarter of a small answer) and the points' signs as integers. Flat spans keep float64 ends."""
    f32 = np.float32
    points = curves["points"]
    return {
        **curves,
        "x": np.asarray(curves["x"], f32),
        **{name: {**curves[name], "y": np.asarray(curves[name]["y"], f32)} for name in ("positive", "negative")},
        "points": {
            **points,
            "ratio": np.asarray(points["ratio"], f32),
            "y": np.asarray(points["y"], f32),
            "sign": np.asarray(points["sign"], np.int8),
        },
    }


def _text(parts: list[Any]) -> str:
    return "".join(p if isinstance(p, str) else p["text"] for p in parts)


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
INT64 = (-(2**63), 2**64 - 1)  # the integers orjson writes (signed 64-bit, and unsigned up to 2**64 - 1)


def dumps(data: Any) -> bytes:
    """JSON bytes: NumPy arrays inline, float32 in its shortest form, NaN and inf as null.

    An integer past 64 bits (Python reads any, from a stored run.json or a page's query) is written
    as the float it rounds to (past float's range, null), where orjson would refuse the whole answer.
    """
    try:
        return orjson.dumps(data, option=OPTIONS)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):
            raise
        return orjson.dumps(_wide_ints_as_floats(data), option=OPTIONS)


def _wide_ints_as_floats(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _wide_ints_as_floats(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_wide_ints_as_floats(v) for v in data]
    if isinstance(data, int) and not isinstance(data, bool) and not INT64[0] <= data <= INT64[1]:
        try:
            return float(data)
        except OverflowError:
            return None
    return data


def _correction_text(config: LossConfig) -> str | None:
    """The rollout correction ``config`` applies, in its settings' names; None when it applies none."""
    parts = []
    if config.rollout_correction != "none":
        bounds = f"C_min {config.rollout_is_min}, C_max {config.rollout_is_max}"
        parts.append(f"rollout_correction {config.rollout_correction} ({bounds})")
    if config.rollout_rs is not None:
        parts.append(f"rollout_rs {config.rollout_rs} (threshold {config.rollout_rs_threshold})")
    if config.rollout_bypass:
        parts.append("rollout_bypass")
    return ", ".join(parts) or None


def compare_notes(has_sampler: bool, configs: list[LossConfig]) -> list[dict[str, Any]]:
    """What each compared column leaves out of the batch's off-policy part: with the sampler's log-probs
    (sampling_per_token_logps), a config that applies no rollout correction ignores them, and configs whose
    corrections differ differ by it too. One note per such config, ``preset`` naming its column; none without
    the sampler's log-probs."""
    if not has_sampler:
        return []
    applied = [_correction_text(c) for c in configs]
    differ = len(set(applied)) > 1
    notes = []
    for i, (config, text) in enumerate(zip(configs, applied, strict=True)):
        name = config.preset or f"config {i + 1}"
        if text is None:
            sentence = (
                f"{name} applies no rollout correction: the batch's sampler log-probs (sampling_per_token_logps) "
                "are left out of its column, so a run's correction is not in it (tick 'apply my edits to every "
                "preset' to compare under the run's settings)."
            )
        elif differ:
            sentence = f"{name} corrects with {text}: the columns correct differently, and their numbers differ by it."
        else:
            continue
        notes.append({"preset": name, "index": i, "correction": text, "text": sentence})
    return notes
