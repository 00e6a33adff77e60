"""Batch: the tensors of one training batch, checked once, with the trainers' defaults filled in.

Shapes: B rows (completions), T padded positions. A position counts when ``completion_mask`` is
1 there and it is not among the row's first ``prompt_lengths`` positions (the article's
``input_len``). Checks name the tensor, the row and what was expected, and raise
``GrpoInputError`` (a ``ValueError``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo.errors import GrpoInputError
from grpo.fields import (
    ALIASES,
    BATCH_FIELDS,
    LOGP_HIGH,
    BatchField,
    fields_of,
    given_per_token,
    padded,
    present,
    ragged,
)

TensorLike = Tensor | np.ndarray | Sequence[Any]
LOGP_FIELDS = tuple(name for name, f in BATCH_FIELDS.items() if f.expected == LOGP_HIGH)


def _as_tensor(name: str, value: Any, dtype: torch.dtype | None = None, keep_graph: bool = False) -> Tensor:
    """``value`` as a tensor; detached unless ``keep_graph`` (the current log-probs: a model's output)."""
    try:
        tensor = value if isinstance(value, Tensor) else torch.as_tensor(np.asarray(value, dtype=np.float64))
    except (ValueError, TypeError) as exc:
        raise GrpoInputError(name, "a rectangular array of numbers", got=type(value).__name__) from exc
    if tensor.is_complex():
        raise GrpoInputError(name, "real numbers", got=str(tensor.dtype))
    tensor = tensor if keep_graph else tensor.detach()
    return tensor.to(dtype) if dtype is not None else tensor


def _values(name: str, value: TensorLike, dtype: torch.dtype) -> Tensor:
    """A per-token field as a tensor in ``dtype``; a decoder's (B, T) float32 array, where ``dtype`` is float64,
    is shared, not copied: the masked copy the Batch makes of it (``_checked``: times the float64 weights)
    widens it, exactly."""
    if isinstance(value, np.ndarray) and dtype == torch.float64 and _narrow(value):
        return torch.from_numpy(value)
    return _as_tensor(name, value, dtype)


def _narrow(value: np.ndarray) -> bool:
    """A (B, T) float32 array torch can share (native order, writeable)."""
    return value.dtype == np.float32 and value.dtype.isnative and value.ndim == 2 and value.flags.writeable


def _first_row(bad: Tensor) -> int:
    """The first row with a True entry. (B, T) bool -> int"""
    return int(bad.reshape(bad.shape[0], -1).any(-1).nonzero()[0, 0])


@dataclass(frozen=True, init=False, eq=False)
class Batch:
    """Per-token log-probs of B completions and their rewards or advantages, as checked tensors.

    The constructor converts: it accepts tensors, NumPy arrays or nested lists and stores tensors,
    with 0 at every position that does not count. ``per_token_logps`` is the current policy (the
    variable the gradient is taken against; a model's output keeps its autograd graph, so
    ``grpo.compute_loss`` can backpropagate into the model); ``old_per_token_logps`` defaults to
    it (on-policy: ratio 1), ``ref_per_token_logps`` too (no reference: KL 0). Give exactly one of
    ``advantages`` (B,) or (B, T) (one per token, as verl hands them to its policy losses) or ``rewards``
    (B,); ``group_size`` G groups consecutive rows (default: all
    rows are one group). ``prompt_lengths`` (an int, or one per row) excludes each row's leading
    positions. Rebuilding from the fields, ``Batch(**dataclasses.asdict``-style, gives the same batch.
    Any other field registered in ``grpo.fields`` is passed by name (or in ``extra``) and arrives
    checked in ``extra``.
    """

    per_token_logps: Tensor
    """(B, T) floating point; 0 where nothing counts."""
    old_per_token_logps: Tensor | None
    ref_per_token_logps: Tensor | None
    completion_mask: Tensor
    """(B, T) bool: the given mask, past each row's prompt: the positions that count, less a tool's output when
    ``tool_mask`` is given (``mask``)."""
    prompt_lengths: Tensor
    """(B,) int64 (0 when none were given)."""
    advantages: Tensor | None
    """(B,), or (B, T) when given per token (0 wherever nothing counts), in per_token_logps' dtype; None when
    rewards were given."""
    rewards: Tensor | None
    """(B,), or (B, K) one per reward function; None when advantages were given."""
    group_size: int | None
    entropies: Tensor | None
    sampling_per_token_logps: Tensor | None
    """(B, T) the sampler's log-probs (vLLM's), NaN at a counted token it did not score; None when not given."""
    extra: dict[str, Tensor]
    """Registered fields beyond these (``grpo.fields.register_field``), checked like their kind."""

    def __init__(
        self,
        per_token_logps: TensorLike,
        old_per_token_logps: TensorLike | None = None,
        ref_per_token_logps: TensorLike | None = None,
        completion_mask: TensorLike | None = None,
        prompt_lengths: int | TensorLike | None = None,
        advantages: TensorLike | None = None,
        rewards: TensorLike | None = None,
        group_size: int | None = None,
        entropies: TensorLike | None = None,
        sampling_per_token_logps: TensorLike | None = None,
        extra: Mapping[str, TensorLike] | None = None,
        **more: TensorLike,
    ) -> None:
        given = _canonical({**(extra or {}), **more}, sampling_per_token_logps is not None)
        if "sampling_per_token_logps" in given:  # verl's rollout_log_probs, NeMo RL's generation_logprobs
            sampling_per_token_logps = given.pop("sampling_per_token_logps")
        logp = _log_probs(per_token_logps)
        dtype = logp.dtype if isinstance(per_token_logps, Tensor) else torch.float64
        B, T = logp.shape
        prompt = _prompt_lengths(prompt_lengths, int(B), int(T), logp.device)
        mask = _counted_mask(completion_mask, prompt, logp)
        completion = mask
        tool = given.pop("tool_mask", None)
        if tool is not None:  # TRL counts completion_mask · tool_mask: a tool's output is not the model's tokens
            tool = _mask_values("tool_mask", tool, logp)
            mask = mask & tool
        weights = mask.to(dtype)

        def per_token(name: str, value: TensorLike | None) -> Tensor | None:
            if value is None:
                return None
            return _checked(name, _same_shape(name, _values(name, value, dtype), logp), mask, weights)

        set_ = object.__setattr__
        set_(self, "per_token_logps", logp := _checked("per_token_logps", logp, mask, weights))  # in ``dtype``
        set_(self, "old_per_token_logps", per_token("old_per_token_logps", old_per_token_logps))
        set_(self, "ref_per_token_logps", per_token("ref_per_token_logps", ref_per_token_logps))
        set_(self, "entropies", per_token("entropies", entropies))
        set_(self, "sampling_per_token_logps", per_token("sampling_per_token_logps", sampling_per_token_logps))
        set_(self, "completion_mask", completion)
        set_(self, "_counted", mask)
        set_(self, "prompt_lengths", prompt)
        set_(self, "_mask_float", weights)
        token_rewards = given.pop("token_level_rewards", None)
        if token_rewards is not None:  # rewards on tokens: each row's reward is their sum
            token_rewards = _token_rewards(token_rewards, advantages is None and rewards is None, logp, mask, weights)
            rewards = token_rewards.sum(-1)
        advantages_, rewards_ = _targets(advantages, rewards, logp, mask, weights)
        set_(self, "advantages", advantages_)
        set_(self, "rewards", rewards_)
        set_(self, "group_size", _group_size(group_size, int(B)))
        extra_ = {name: _extra(name, value, logp, mask, weights) for name, value in given.items()}
        if tool is not None:
            extra_["tool_mask"] = tool.to(dtype)
        if token_rewards is not None:
            extra_["token_level_rewards"] = token_rewards
        set_(self, "extra", extra_)

    @property
    def shape(self) -> tuple[int, int]:
        B, T = self.per_token_logps.shape
        return int(B), int(T)

    @property
    def logp(self) -> Tensor:
        return self.per_token_logps

    @property
    def mask(self) -> Tensor:
        """(B, T) bool: the positions that count (completion mask, past the prompt, and not a tool's output)."""
        counted: Tensor = self.__dict__["_counted"]
        return counted

    @property
    def mask_float(self) -> Tensor:
        """(B, T) the same mask as 0.0 / 1.0 in the log-probs' dtype."""
        mask: Tensor = self.__dict__["_mask_float"]
        return mask

    @property
    def tool_output(self) -> Tensor | None:
        """(B, T) bool: the completion's tokens ``tool_mask`` took out (a tool's output, not the model's tokens:
        no loss, no gradient, out of every divisor), or None without a tool mask."""
        tool = self.extra.get("tool_mask")
        return None if tool is None else self.completion_mask & (tool == 0)

    def prompt_length_tensor(self) -> Tensor:
        """(B,) int64 prompt lengths (0 when none were given)."""
        return self.prompt_lengths


# Batch's own fields; every other registered field arrives checked in ``Batch.extra``.
OWN_FIELDS = frozenset(f.name for f in fields(Batch)) - {"extra"}


# --- checks ---------------------------------------------------------------------------------------
def _log_probs(per_token_logps: TensorLike) -> Tensor:
    """The policy's (B, T) log-probs as a floating tensor (its graph kept), or a GrpoInputError."""
    if isinstance(per_token_logps, Tensor):
        logp = _as_tensor("per_token_logps", per_token_logps, keep_graph=True)
    else:  # an array or lists: float64 (a float32 array widened in its masked copy)
        logp = _values("per_token_logps", per_token_logps, torch.float64)
    if logp.dim() != 2 or logp.shape[0] == 0 or logp.shape[1] == 0:
        raise GrpoInputError(
            "per_token_logps", "a non-empty 2-D array (B rows, T tokens)", got=f"shape {tuple(logp.shape)}"
        )
    return logp if logp.is_floating_point() else logp.double()


def _group_size(group_size: int | None, rows: int) -> int | None:
    """``group_size`` as an int when it divides the rows, None when not given, else a GrpoInputError."""
    if group_size is None:
        return None
    if (
        isinstance(group_size, bool)
        or not isinstance(group_size, int | np.integer)
        or group_size < 1
        or rows % group_size
    ):
        raise GrpoInputError("group_size", f"a positive divisor of the number of rows ({rows})", got=repr(group_size))
    return int(group_size)


def _canonical(given: Mapping[str, TensorLike], sampler_given: bool) -> dict[str, TensorLike]:
    """Extra fields under their table names (aliases accepted); a field named twice is an error."""
    out: dict[str, TensorLike] = {}
    for key, value in given.items():
        name = ALIASES.get(key, key)
        if name in out or (name == "sampling_per_token_logps" and sampler_given):
            raise GrpoInputError(key, f"one of {name} or its aliases, not both")
        out[name] = value
    return out


def _same_shape(name: str, value: Tensor, logp: Tensor) -> Tensor:
    if value.shape != logp.shape:
        raise GrpoInputError(name, f"shape {tuple(logp.shape)} like per_token_logps", got=f"shape {tuple(value.shape)}")
    return value.to(logp.device)


def _prompt_lengths(p: int | TensorLike | None, B: int, T: int, device: torch.device) -> Tensor:
    """(B,) int64 prompt lengths from an int, one per row, or None (0)."""
    if p is None:
        return torch.zeros(B, dtype=torch.long, device=device)
    if isinstance(p, int | np.integer) and not isinstance(p, bool):
        p = [int(p)] * B
    lengths = _as_tensor("prompt_lengths", p)
    if lengths.dim() == 0:
        lengths = lengths.expand(B)
    if lengths.shape != (B,):
        raise GrpoInputError("prompt_lengths", f"an int or {B} ints (one per row)", got=f"shape {tuple(lengths.shape)}")
    bad = (lengths < 0) | (lengths > T) | (lengths != lengths.round())
    if bad.any():
        raise GrpoInputError("prompt_lengths", f"whole numbers from 0 to {T}", row=int(bad.nonzero()[0, 0]))
    return lengths.to(device=device, dtype=torch.long)


def _counted_mask(completion_mask: TensorLike | None, prompt: Tensor, logp: Tensor) -> Tensor:
    """(B, T) bool: the completion mask (all ones when None), past each row's prompt."""
    B, T = logp.shape
    if completion_mask is None:
        mask = torch.ones(B, T, dtype=torch.bool, device=logp.device)
    else:
        mask = _mask_values("completion_mask", completion_mask, logp)
    positions = torch.arange(T, device=logp.device)
    return mask & (positions[None, :] >= prompt[:, None])


def _mask_values(name: str, value: TensorLike, logp: Tensor) -> Tensor:
    """(B, T) bool from a 0/1 mask shaped like the log-probs, every position checked."""
    values = _same_shape(name, _as_tensor(name, value), logp)
    bad = (values != 0) & (values != 1)
    if bad.any():
        raise GrpoInputError(name, "only 0 and 1", row=_first_row(bad))
    return values.bool()


def _extra(name: str, value: TensorLike, logp: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """A registered field beyond Batch's own, checked as its table entry says."""
    field = BATCH_FIELDS.get(name)
    if field is None or name in OWN_FIELDS:
        raise GrpoInputError(name, f"a batch field: one of {', '.join(BATCH_FIELDS)}")
    tensor = _as_tensor(name, value, logp.dtype)
    if field.shape == "token":
        return _checked(name, _same_shape(name, tensor, logp), mask, weights)
    B = logp.shape[0]
    if field.shape == "row" and tensor.shape != (B,):
        raise GrpoInputError(name, f"one number per row ({B})", got=f"shape {tuple(tensor.shape)}")
    bad = _out_of_bounds(field, tensor.reshape(-1)) if tensor.dim() else _out_of_bounds(field, tensor.reshape(1))
    if bad.any():
        raise GrpoInputError(name, field.bounds_text(), row=int(bad.nonzero()[0, 0]) if tensor.dim() else None)
    return tensor.to(logp.device)


def _out_of_bounds(field: BatchField, values: Tensor) -> Tensor:
    """(N,) bool: the values outside the field's bounds (NaN only where the field allows it)."""
    finite = torch.isfinite(values) | (
        torch.isnan(values) if field.nan_ok else torch.zeros_like(values, dtype=torch.bool)
    )
    inside = (values >= field.low) & (values <= field.high)
    return ~finite | (~inside & ~torch.isnan(values))


def _targets(
    advantages: TensorLike | None, rewards: TensorLike | None, logp: Tensor, mask: Tensor, weights: Tensor
) -> tuple[Tensor | None, ...]:
    """(advantages, rewards): exactly one given, as (B,) finite numbers in logp's dtype; advantages may
    also come per token, (B, T) like the log-probs (finite where a token counts, 0 elsewhere), rewards per
    reward function (B, K)."""
    if (advantages is None) == (rewards is None):
        raise GrpoInputError("advantages", "exactly one of advantages or rewards (or token_level_rewards)")
    name, given = ("advantages", advantages) if advantages is not None else ("rewards", rewards)
    B = logp.shape[0]
    values = _as_tensor(name, given, logp.dtype)
    if BATCH_FIELDS[name].per_token_ok and values.dim() == 2:
        if values.shape != logp.shape:
            raise GrpoInputError(
                name,
                f"one number per row ({B}) or one per token, shape {tuple(logp.shape)} like per_token_logps",
                got=f"shape {tuple(values.shape)}",
            )
        return _checked(name, values.to(logp.device), mask, weights), None
    if BATCH_FIELDS[name].columns_ok and values.dim() == 2:  # rewards per reward function (B, K)
        if values.shape[0] != B or values.shape[1] == 0:
            raise GrpoInputError(
                name,
                f"one number per row ({B}), or K per row (one per reward function)",
                got=f"shape {tuple(values.shape)}",
            )
    elif values.shape != (B,):
        raise GrpoInputError(name, f"one number per row ({B})", got=f"shape {tuple(values.shape)}")
    bad = ~torch.isfinite(values)
    if bad.any():
        raise GrpoInputError(
            name, "finite numbers", row=_first_row(bad) if bad.dim() == 2 else int(bad.nonzero()[0, 0])
        )
    values = values.to(logp.device)
    return (values, None) if name == "advantages" else (None, values)


def _token_rewards(value: TensorLike, alone: bool, logp: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """(B, T) rewards on tokens: finite, and 0 wherever a token does not count (verl's REINFORCE++ drops a reward
    there while its other estimators sum it: placed only on counted tokens, the two agree). ``alone``: neither
    advantages nor rewards were given beside them."""
    name = "token_level_rewards"
    if not alone:
        raise GrpoInputError(name, "exactly one of advantages or rewards (or token_level_rewards)")
    values = _same_shape(name, _as_tensor(name, value, logp.dtype), logp)
    bad = ~mask & (values != 0)
    if bad.any():
        row = _first_row(bad)
        pos = int(bad[row].nonzero()[0, 0])
        raise GrpoInputError(
            name, "0 wherever a token does not count", row=row, got=f"{float(values[row, pos])} at position {pos}"
        )
    return _checked(name, values, mask, weights)


def _checked(name: str, value: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """``value`` with 0 wherever nothing counts, after checking the positions that do.

    The field's table entry gives the bounds (log-probs <= 0: a positive one usually means logits
    were passed; entropies >= 0) and whether NaN may stand at a counted token. Padding may hold
    anything, NaN included: it is zeroed. The common case costs one multiply and two reductions;
    the exact search for the offending row runs only when they say something is wrong.
    """
    field = BATCH_FIELDS[name]
    kept = value * weights
    if not bool(torch.isfinite(kept.sum())):
        allowed = torch.isfinite(value) | torch.isnan(value) if field.nan_ok else torch.isfinite(value)
        bad = mask & ~allowed
        if bad.any():
            row = _first_row(bad)
            pos = int(bad[row].nonzero()[0, 0])
            raise GrpoInputError(
                name,
                "finite numbers at every counted token",
                row=row,
                got=f"{float(value[row, pos])} at position {pos}",
            )
        counted_nan = mask & torch.isnan(value) if field.nan_ok else None
        kept = torch.nan_to_num(kept, nan=0.0, posinf=0.0, neginf=0.0)  # only padding (or allowed NaN)
        if counted_nan is not None and bool(counted_nan.any()):
            kept = kept.masked_fill(counted_nan, float("nan"))  # "not scored": the consumer decides
    numbers = torch.nan_to_num(kept, nan=0.0) if field.nan_ok else kept
    low, high = field.low > -math.inf, field.high < math.inf
    if (low and bool(numbers.min() < field.low)) or (high and bool(numbers.max() > field.high)):
        bad = mask & ((value < field.low) | (value > field.high))
        row = _first_row(bad)
        pos = int(bad[row].nonzero()[0, 0])
        raise GrpoInputError(name, field.bounds_text(), row=row, got=f"{float(value[row, pos]):g} at position {pos}")
    return kept


def from_rows(per_token_logps: Sequence[Sequence[float]], **rest: Any) -> Batch:
    """A Batch from ragged rows (each row its own length): every per-token field padded on the right,
    the padding masked."""
    lengths = [len(row) for row in per_token_logps]
    if not lengths or min(lengths) == 0:
        row = lengths.index(0) if lengths else None
        raise GrpoInputError("per_token_logps", "at least one row, each with at least one token", row=row)
    counted = present(lengths).astype(np.float64)
    rest = dict[str, Any](_canonical(rest, sampler_given=False))
    given = {name: rest.pop(name, None) for name in fields_of("token") if name != "per_token_logps"}
    grids: dict[str, Any] = {name: padded(name, value, lengths) for name, value in given.items() if value is not None}
    for name in fields_of("row"):  # a per-row field given per token (advantages): ragged rows, padded like the rest
        if rest.get(name) is not None and given_per_token(name, rest[name]):
            grids[name] = padded(name, rest.pop(name), lengths)
    mask = grids.pop("completion_mask", None)
    return Batch(
        per_token_logps=padded("per_token_logps", per_token_logps, lengths),
        completion_mask=counted if mask is None else mask * counted,
        **grids,
        **rest,
    )


def request_advantages(advantages: Tensor, lengths: Sequence[int], per_token: bool = False) -> list[Any]:
    """Advantages as a request gives them: one float per row, or each row's first ``lengths[i]`` values when
    they are per token (B, T); ``per_token`` writes per-row ones on each of the row's positions too (to join
    batches of both kinds)."""
    if advantages.dim() == 2:
        return [row.tolist() for row in ragged(advantages.detach().cpu(), lengths)]
    values = advantages.detach().cpu().tolist()
    return [[a] * n for a, n in zip(values, lengths, strict=True)] if per_token else values
