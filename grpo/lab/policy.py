"""A tiny GRU language model over the lab's vocabulary, and group sampling with temperature.

The policy is small enough to train on a CPU at several optimiser steps per second (about 20k
parameters at the defaults) and real enough to show GRPO's dynamics: it scores every token of
its own completions, so the lab's log-probs, ratios and KL are a language model's, not toys'.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

VOCAB: tuple[str, ...] = ("<eos>", *"0123456789", "+", "=", "x", ".")
"""Every task speaks this vocabulary; ``<eos>`` ends a completion (and pads after it)."""
EOS = 0
TOKEN_ID = {token: i for i, token in enumerate(VOCAB)}


class Policy(nn.Module):
    """Embedding -> one GRU layer -> logits over VOCAB."""

    def __init__(self, hidden: int = 64, embed: int = 32, vocab_size: int = len(VOCAB)) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.gru = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab_size)

    def forward(self, tokens: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(B, T) token ids -> logits (B, T, V) scoring the next token, and the GRU state (1, B, H)."""
        out, state = self.gru(self.embed(tokens), state)
        return self.head(out), state


def init_policy(seed: int, hidden: int = 64, eos_probability: float = 0.15) -> Policy:
    """A policy initialised from ``seed`` alone (the global RNG is left as it was).

    The output bias starts ``<eos>`` at about ``eos_probability`` so that first completions have
    a moderate length (about 1 / eos_probability tokens) rather than running to the cap.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = Policy(hidden)
    with torch.no_grad():
        policy.head.weight.mul_(0.1)
        policy.head.bias.zero_()
        others = len(VOCAB) - 1
        policy.head.bias[EOS] = float(torch.tensor(eos_probability * others / (1 - eos_probability)).log())
    return policy


def frozen_copy(policy: Policy) -> Policy:
    """The reference policy: a copy that never trains."""
    reference = copy.deepcopy(policy)
    reference.requires_grad_(False)
    return reference.eval()


@dataclass(frozen=True)
class Rollout:
    """Prompts and their sampled completions; every row's prompt has the same length P."""

    tokens: Tensor
    """(B, P + T) int64: prompt then completion; after a row's <eos>, <eos> padding."""
    completion_mask: Tensor
    """(B, T) float 0/1: the completion's tokens up to and including its <eos>."""
    prompt_length: int


@torch.no_grad()
def sample(policy: Policy, prompts: Tensor, max_length: int, temperature: float, generator: torch.Generator) -> Rollout:
    """Complete each prompt (B, P) token by token at ``temperature``, up to ``max_length`` tokens.

    Rows that emitted <eos> keep emitting <eos> (padding, masked out); sampling stops early when
    every row has finished. The draws come from ``generator`` only, so a seed fixes them.
    """
    logits, state = policy(prompts)
    next_logits = logits[:, -1]  # (B, P, V) -> (B, V)
    B = prompts.shape[0]
    done = torch.zeros(B, dtype=torch.bool)
    columns: list[Tensor] = []
    for _ in range(max_length):
        probs = torch.softmax(next_logits / temperature, dim=-1)
        token = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (B, V) -> (B,)
        token = token.masked_fill(done, EOS)
        columns.append(token)
        done = done | (token == EOS)
        if bool(done.all()):
            break
        logits, state = policy(token[:, None], state)
        next_logits = logits[:, 0]
    completion = torch.stack(columns, dim=1)  # (B, T)
    finished_before = torch.cumsum((completion == EOS).long(), dim=1) - (completion == EOS).long()
    mask = (finished_before == 0).float()  # up to and including the first <eos>
    return Rollout(torch.cat([prompts, completion], dim=1), mask, prompts.shape[1])
