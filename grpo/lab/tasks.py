"""Synthetic tasks for the lab: prompts to sample, a reward to verify, and what each one teaches.

Every task draws prompts of one fixed length from a ``torch.Generator`` (so a seed fixes them)
and scores a completion (its tokens before ``<eos>``) with a reward in [0, 1]. Rewards are plain
Python over a few tokens: cheap next to the policy's forward pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo.errors import GrpoInputError
from grpo.lab.policy import TOKEN_ID
from grpo.registry import by_name

Reward = Callable[[list[int], list[int]], float]


@dataclass(frozen=True)
class Task:
    """A prompt distribution and a verifiable reward."""

    name: str
    doc: str
    """One line: what the task asks (the UI's label)."""
    teaches: str
    """What watching a run on it shows."""
    prompt_length: int
    max_completion_length: int
    draw: Callable[[int, torch.Generator], Tensor]
    """n, generator -> (n, prompt_length) int64 prompt tokens."""
    reward: Reward
    """prompt tokens, completion tokens before <eos> -> reward in [0, 1]."""

    def prompts(self, n: int, generator: torch.Generator) -> Tensor:
        return self.draw(n, generator)

    def rewards(self, tokens: Tensor, completion_mask: Tensor) -> Tensor:
        """Rewards (B,) of a rollout: tokens (B, P + T), completion_mask (B, T) counting the <eos>."""
        P = self.prompt_length
        lengths = completion_mask.sum(-1).long().tolist()
        rows = tokens.tolist()
        out = []
        for row, n in zip(rows, lengths, strict=True):
            completion = row[P : P + n]
            if completion and completion[-1] == TOKEN_ID["<eos>"]:
                completion = completion[:-1]
            out.append(self.reward(row[:P], completion))
        return torch.tensor(out, dtype=torch.float32)


def _digits(low: int, high: int, n: int, generator: torch.Generator) -> Tensor:
    """(n,) token ids of digits drawn uniformly from low..high."""
    return torch.randint(low, high + 1, (n,), generator=generator) + TOKEN_ID["0"]


def _value(token: int) -> int:
    return token - TOKEN_ID["0"]


# --- count: emit exactly k "x" tokens ---------------------------------------------------------
def _count_prompts(n: int, generator: torch.Generator) -> Tensor:
    return _digits(1, 4, n, generator)[:, None]  # (n,) -> (n, 1)


def _count_reward(prompt: list[int], completion: list[int]) -> float:
    """1 for exactly k x's, a quarter less per x too many or too few, never below 0."""
    k = _value(prompt[0])
    return max(0.0, 1.0 - abs(completion.count(TOKEN_ID["x"]) - k) / 4)


# --- add: a + b = ? ---------------------------------------------------------------------------
def _add_prompts(n: int, generator: torch.Generator) -> Tensor:
    a, b = _digits(0, 4, n, generator), _digits(0, 4, n, generator)
    return torch.stack([a, torch.full_like(a, TOKEN_ID["+"]), b, torch.full_like(a, TOKEN_ID["="])], dim=1)


def _add_reward(prompt: list[int], completion: list[int]) -> float:
    """1 for exactly the sum's digit, 0.5 when the sum comes first and more follows, else 0."""
    answer = TOKEN_ID[str(_value(prompt[0]) + _value(prompt[2]))]
    if completion == [answer]:
        return 1.0
    return 0.5 if completion[:1] == [answer] else 0.0


# --- length: a hard answer that comes last; a correct answer pays for its length ------------------
LENGTH_COST = 0.04


def _length_prompts(n: int, generator: torch.Generator) -> Tensor:
    return torch.stack([_digits(0, 9, n, generator), _digits(0, 9, n, generator)], dim=1)


def _length_reward(prompt: list[int], completion: list[int]) -> float:
    """The last token must be (a + b) mod 10; a correct answer loses 0.04 per token before it."""
    answer = TOKEN_ID[str((_value(prompt[0]) + _value(prompt[1])) % 10)]
    if not completion or completion[-1] != answer:
        return 0.0
    return max(0.0, 1.0 - LENGTH_COST * (len(completion) - 1))


TASKS: dict[str, Task] = by_name(
    [
        Task(
            "count",
            "Given a digit k (1-4), write exactly k 'x' tokens; partial credit for a near miss.",
            "The default: reward climbs within a hundred steps while the loss hovers near zero.",
            1,
            10,
            _count_prompts,
            _count_reward,
        ),
        Task(
            "add",
            "Given 'a + b =' (a, b in 0-4), answer the sum's digit; the answer is checked exactly.",
            "A verifiable answer: all-correct and all-wrong groups have zero reward std and teach nothing.",
            4,
            4,
            _add_prompts,
            _add_reward,
        ),
        Task(
            "length",
            "Given digits a b, end with (a + b) mod 10; a correct answer loses 0.04 per token before it.",
            "Length bias: most answers stay wrong, and under per-sequence normalisation (GRPO) a long wrong "
            "answer is penalised less per token, so lengths grow; Dr. GRPO weighs every token alike and they do not.",
            2,
            16,
            _length_prompts,
            _length_reward,
        ),
    ]
)
DEFAULT_TASK = "count"


def get_task(name: str | None) -> Task:
    """The task called ``name`` (None: the default task); the error lists the valid names."""
    name = DEFAULT_TASK if name is None else name
    if name not in TASKS:
        raise GrpoInputError("task", f"one of {', '.join(TASKS)}", got=repr(name))
    return TASKS[name]
