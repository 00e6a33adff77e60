"""The batch's fields, written once: name, aliases, shape, dtype, bounds, doc.

Everything that reads, checks or writes a batch is derived from this table: ``grpo.Batch``'s checks,
the request model and fast ingest checks of the API, the aliases the readers accept, the exporters'
columns, the run step files' tensors and the upload help. A new input is one ``register_field`` call
(a plugin may make it: see ``grpo.plugins``); a field that is not one of ``Batch``'s own parameters
arrives checked in ``Batch.extra``.

Shapes: ``token`` (B, T) per token, ragged in requests; ``row`` (B,) one per row (an int is accepted
for every row where ``scalar_ok``; (B, T), ragged in requests, where ``per_token_ok``); ``batch`` one
number for the whole batch.

Also here: the one ragged <-> padded converter (``padded``, ``ragged``, ``present``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from grpo.errors import GrpoInputError

Shape = Literal["token", "row", "batch"]
Dtype = Literal["float", "int", "mask"]


@dataclass(frozen=True)
class BatchField:
    """One batch input and every fact about it that a reader, a check or a writer needs."""

    name: str
    """The request's (TRL's) name: JSON key, tensor name in a file, ``Batch`` argument."""
    shape: Shape
    dtype: Dtype
    doc: str
    """One line for the API schema and the upload help."""
    aliases: tuple[str, ...] = ()
    """Other trainers' names for it (verl's, the article's), accepted by every reader."""
    low: float = -math.inf
    """Smallest value allowed where the value counts."""
    high: float = math.inf
    """Largest value allowed where the value counts."""
    expected: str = ""
    """What an out-of-bounds value should have been, for the error (default: from the bounds)."""
    nan_ok: bool = False
    """NaN allowed where the value counts (e.g. "not scored"); the consumer decides what it means."""
    required: bool = False
    row_key: str = ""
    """A JSONL line's key for a per-row field (``reward`` for ``rewards``)."""
    scalar_ok: bool = False
    """A per-row field that may be one number for every row (``prompt_lengths``)."""
    per_token_ok: bool = False
    """A per-row field that may come per token instead: (B, T) like the log-probs, ragged rows in a request
    (``advantages``: verl hands its policy losses (B, T), TRL accepts them from subclasses)."""
    columns_ok: bool = False
    """A per-row field that may come as K numbers per row, (B, K) (``rewards``: one per reward function)."""
    vector_ok: bool = False
    """A batch field that may be a list, one number per reward function (``reward_weights``)."""

    def bounds_text(self) -> str:
        """The bounds in words, as an error's "expected"."""
        if self.expected:
            return self.expected
        if self.dtype == "mask":
            return "only 0 and 1"
        parts = [
            f">= {self.low:g}" if self.low > -math.inf else "",
            f"<= {self.high:g}" if self.high < math.inf else "",
        ]
        words = " and ".join(p for p in parts if p)
        return f"{self.name} {words}" if words else "finite numbers"

    def describe(self) -> dict[str, Any]:
        """JSON for ``/api/v1/options`` (the upload help)."""
        return {
            "name": self.name,
            "shape": self.shape,
            "dtype": self.dtype,
            "doc": self.doc,
            "aliases": list(self.aliases),
            "required": self.required,
            "scalar_ok": self.scalar_ok,
            "per_token_ok": self.per_token_ok,
            "columns_ok": self.columns_ok,
            "vector_ok": self.vector_ok,
        }


BATCH_FIELDS: dict[str, BatchField] = {}
ALIASES: dict[str, str] = {}
"""Every alias -> its field's name (verl's and the article's names for TRL's)."""


def register_field(field: BatchField) -> BatchField:
    """Add a batch field; its name and aliases must be new."""
    taken = [n for n in (field.name, *field.aliases) if n in BATCH_FIELDS or n in ALIASES]
    if taken:
        raise ValueError(f"batch field names already taken: {', '.join(taken)}")
    BATCH_FIELDS[field.name] = field
    ALIASES.update({alias: field.name for alias in field.aliases})
    return field


LOGP_HIGH = "log-probs <= 0 (a positive value usually means logits were passed)"
for _field in (
    BatchField(
        "per_token_logps",
        "token",
        "float",
        "Current policy log-probs, one list per completion (ragged).",
        ("log_prob", "pi_logprob"),
        high=0.0,
        expected=LOGP_HIGH,
        required=True,
    ),
    BatchField(
        "old_per_token_logps",
        "token",
        "float",
        "Old (sampling) policy log-probs; default: the current ones (ratio 1).",
        ("old_log_prob", "pi_old_logprob"),
        high=0.0,
        expected=LOGP_HIGH,
    ),
    BatchField(
        "ref_per_token_logps",
        "token",
        "float",
        "Reference policy log-probs; default: the current ones (KL 0).",
        ("ref_log_prob", "pi_ref_logprob"),
        high=0.0,
        expected=LOGP_HIGH,
    ),
    BatchField("completion_mask", "token", "mask", "0/1 per token; default all 1.", ("response_mask",), 0.0, 1.0),
    # TRL's multi-turn tool calls: a tool's output sits inside the completion but is not the model's tokens;
    # TRL's loss counts completion_mask · tool_mask (the Batch folds it in and keeps the tool's tokens apart)
    BatchField(
        "tool_mask",
        "token",
        "mask",
        "0/1 per token: 0 on a tool's output inside the completion (not the model's tokens: no loss, no gradient, "
        "out of the divisor), as TRL's tool_mask; default all 1.",
        ("env_mask",),
        0.0,
        1.0,
    ),
    BatchField(
        "prompt_lengths",
        "row",
        "int",
        "Leading positions of each row that are prompt (excluded).",
        ("input_len",),
        low=0.0,
        row_key="prompt_length",
        scalar_ok=True,
    ),
    BatchField(
        "advantages",
        "row",
        "float",
        "One advantage per row, or one per token (a list per row, ragged like per_token_logps); give this or rewards.",
        row_key="advantage",
        per_token_ok=True,
    ),
    BatchField(
        "rewards",
        "row",
        "float",
        "One reward per row, or K per row (one per reward function: TRL's rewards_per_func, verl GDPO's "
        "gdpo_reward_keys), combined by reward_weights; give this or advantages.",
        row_key="reward",
        columns_ok=True,
    ),
    # verl hands every estimator token_level_rewards (B, T): REINFORCE++ runs its discounted return back over
    # them; the others read each row's sum, as verl's (scores = token_level_rewards.sum(-1))
    BatchField(
        "token_level_rewards",
        "token",
        "float",
        "Rewards placed on tokens (verl's token_level_rewards: a process or per-turn reward), 0 where a token "
        "does not count; REINFORCE++'s discounted return runs back over them, every other estimator reads each "
        "row's sum; give this, rewards or advantages.",
    ),
    BatchField("group_size", "batch", "int", "Consecutive rows per prompt; default: all rows are one group.", low=1.0),
    BatchField(
        "entropies",
        "token",
        "float",
        "Per-token entropies, for the entropy metric.",
        low=0.0,
        expected="entropies >= 0",
    ),
    # The only field where NaN may stand at a counted token: vLLM gives NaN (JSON null) for a token it could
    # not score; TRL then applies no correction there (ratio 1) and leaves it out of its sampling/* metrics.
    BatchField(
        "sampling_per_token_logps",
        "token",
        "float",
        "The sampler's (vLLM's, SGLang's) log-probs of the same tokens, for the rollout correction; "
        "NaN or null where it did not score a token. Default: none (no correction).",
        ("rollout_log_probs", "generation_logprobs"),
        high=0.0,
        expected=LOGP_HIGH,
        nan_ok=True,
    ),
    BatchField(
        "reward_weights",
        "batch",
        "float",
        "One weight per reward function (TRL reward_weights, verl gdpo_reward_weights), for rewards given "
        "per function; default all 1.",
        vector_ok=True,
    ),
    BatchField(
        "reward_baselines",
        "row",
        "float",
        "ReMax: the reward of the prompt's greedy completion, one per row (verl's reward_baselines).",
        row_key="reward_baseline",
    ),
    BatchField(
        "sum_pi_squared",
        "token",
        "float",
        "Σπ² over the vocabulary per token, of the distribution that scored it (verl's sum_pi_squared), for the "
        "optimal token baseline; the logits path computes it.",
        low=0.0,
        high=1.0,
        expected="0 <= sum_pi_squared <= 1",
    ),
):
    register_field(_field)


def fields_of(shape: Shape) -> tuple[str, ...]:
    """The names of the fields of one shape, in the table's order."""
    return tuple(name for name, f in BATCH_FIELDS.items() if f.shape == shape)


def given_per_token(name: str, value: Any) -> bool:
    """Whether a ``per_token_ok`` field's value comes per token: a 2-D array, or a list of rows (lists);
    a list that mixes numbers and rows is refused, naming the first row that breaks the pattern."""
    if not BATCH_FIELDS[name].per_token_ok:
        return False
    ndim = getattr(value, "ndim", None)
    if ndim is not None:
        return int(ndim) == 2
    if not isinstance(value, list | tuple) or not value:
        return False
    nested = [isinstance(v, list | tuple | np.ndarray) for v in value]
    if all(nested):
        return True
    if any(nested):
        first = nested.index(not nested[0])
        raise GrpoInputError(
            name, "one number per row, or a list per row (one per token), not both", row=first, got="a mix"
        )
    return False


def names_of(name: str) -> list[str]:
    """A field's name and its aliases: every key a request or file may give it under."""
    return [name, *BATCH_FIELDS[name].aliases]


# --- ragged <-> padded ------------------------------------------------------------------------------
def present(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """(B, T_max) bool: True on each row's first ``lengths[i]`` positions (row-major: a flat array's order)."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    width = int(lengths.max(initial=0))
    return np.arange(width)[None, :] < lengths[:, None]


def padded(name: str, value: Any, lengths: Sequence[int] | np.ndarray, fill: float = 0.0) -> np.ndarray:
    """A per-token field -> a (B, T_max) float64 array, ``fill`` past each row's length.

    ``value``: ragged rows (each ``lengths[i]`` long), one flat array of all rows' values in order,
    or a (B, T) array padded already (returned as float64). Errors name the field and the row."""
    lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if isinstance(value, np.ndarray) and value.ndim == 2:
        return np.asarray(value, dtype=np.float64)
    where = present(lengths)
    out = np.zeros(where.shape) if fill == 0 else np.full(where.shape, fill, dtype=np.float64)  # zeros: no write
    if isinstance(value, np.ndarray):  # flat: every row's values, row after row
        out[where] = value
        return out
    if len(value) != len(lengths):
        raise GrpoInputError(name, f"{len(lengths)} rows like per_token_logps", got=f"{len(value)} rows")
    for i, (row, n) in enumerate(zip(value, lengths, strict=True)):
        if len(row) != n:
            raise GrpoInputError(name, f"{n} values like per_token_logps[{i}]", row=i, got=f"{len(row)}")
        try:
            out[i, :n] = row
        except (ValueError, TypeError) as exc:
            raise GrpoInputError(name, "a list of numbers", row=i) from exc
    return out


def ragged(grid: Any, lengths: Sequence[int], rows: Sequence[int] | None = None) -> list[Any]:
    """A (B, T) array or tensor -> its rows cut to their lengths (views, no copy), for ``rows`` (default all)."""
    rows = range(len(lengths)) if rows is None else rows
    return [grid[i, : lengths[i]] for i in rows]
