"""grpo.logits.token_logprobs: the causal shift, entropies and the full-vocabulary KL against direct
formulas, per-row prompt lengths, temperature, and bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reference import close

import grpo

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

B, T, V = 3, 6, 11


@pytest.fixture
def logits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(B, T, V, generator=g, dtype=torch.float64) * 2,
        torch.randint(0, V, (B, T), generator=g),
        torch.randn(B, T, V, generator=g, dtype=torch.float64),
    )


def test_logits_at_t_score_token_t_plus_1() -> None:
    """Logits at position t that put all their mass on token t + 1: the shifted gather reads log-probs
    of ~0; gathering at the same position (the article's demo) would read ~-40."""
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    logits = torch.zeros(1, T, 10, dtype=torch.float64)
    for t in range(T - 1):
        logits[0, t, ids[0, t + 1]] = 40.0  # position t predicts token t + 1
    out = grpo.token_logprobs(logits, ids, prompt_length=1)
    assert out.logps.shape == (1, T - 1)
    assert (out.logps > -1e-12).all()
    same_position = F.log_softmax(logits, -1).gather(-1, ids[..., None])[0, 1:, 0]
    assert (same_position < -30).sum() >= 3  # the misaligned read is far off


def test_a_token_depends_only_on_the_previous_position(logits: tuple[torch.Tensor, ...]) -> None:
    """Changing logits[:, s] moves the log-prob of token s + 1 only."""
    lg, ids, _ = logits
    base = grpo.token_logprobs(lg, ids, prompt_length=2).logps  # covers positions 2..T-1
    for s in range(1, T - 1):
        changed = lg.clone()
        changed[:, s] += torch.randn(B, V, dtype=torch.float64)
        diff = (grpo.token_logprobs(changed, ids, prompt_length=2).logps - base).abs().sum(0)
        moved = (diff > 0).nonzero().flatten().tolist()
        assert moved == [s + 1 - 2], (s, moved)  # column j holds position j + 2


def test_logps_entropies_and_full_kl_by_direct_formula(logits: tuple[torch.Tensor, ...]) -> None:
    lg, ids, ref = logits
    p = [1, 3, 2]
    out = grpo.token_logprobs(lg, ids, prompt_length=p, ref_logits=ref, old_logits=ref * 0.5, temperature=0.7)
    start = min(p)
    for b in range(B):
        for j, t in enumerate(range(start, T)):
            z = lg[b, t - 1] / 0.7
            logq = F.log_softmax(ref[b, t - 1] / 0.7, -1)
            logp = F.log_softmax(z, -1)
            close(out.logps[b, j], logp[ids[b, t]], 1e-6, 1e-6)  # computed in float32
            close(out.entropies[b, j], -(logp.exp() * logp).sum(), 1e-5, 1e-6)
            assert out.full_kl is not None and out.ref_logps is not None and out.old_logps is not None
            close(out.full_kl[b, j], (logp.exp() * (logp - logq)).sum(), 1e-5, 1e-6)
            close(out.ref_logps[b, j], logq[ids[b, t]], 1e-6, 1e-6)
            close(out.old_logps[b, j], F.log_softmax(ref[b, t - 1] * 0.5 / 0.7, -1)[ids[b, t]], 1e-6, 1e-6)
            assert bool(out.mask[b, j]) == (t >= p[b])
    assert (out.full_kl >= -1e-6).all()
    assert out.logps.dtype == torch.float32  # like TRL: log-softmax in fp32


def test_prompt_lengths_per_row_feed_a_batch(logits: tuple[torch.Tensor, ...]) -> None:
    lg, ids, ref = logits
    out = grpo.token_logprobs(lg, ids, prompt_length=[2, 4, 2], ref_logits=ref)
    assert out.mask.tolist() == [[True] * 4, [False, False, True, True], [True] * 4]
    batch = grpo.Batch(
        per_token_logps=out.logps, ref_per_token_logps=out.ref_logps, completion_mask=out.mask, rewards=[1.0, 0.0, 1.0]
    )
    bd = grpo.evaluate(batch)
    assert bd.tokens.mask.tolist() == out.mask.tolist()


def test_entropy_of_a_one_hot_is_zero_not_nan() -> None:
    logits = torch.full((1, 3, 4), -1e4)
    logits[..., 0] = 0.0  # probabilities 1, 0, 0, 0 (exp underflows to exactly 0)
    out = grpo.token_logprobs(logits, torch.zeros(1, 3, dtype=torch.long), ref_logits=logits)
    assert out.full_kl is not None
    assert (out.entropies == 0).all() and (out.full_kl == 0).all()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"logits": torch.zeros(2, 5)}, "logits: expected a 3-D tensor"),
        ({"token_ids": torch.zeros(2, 4, dtype=torch.long)}, r"token_ids: expected shape \(2, 5\)"),
        ({"token_ids": torch.full((2, 5), 7)}, r"token_ids: expected integer ids in \[0, 7\)"),
        ({"token_ids": torch.full((2, 5), -1)}, r"token_ids: expected integer ids"),
        ({"token_ids": torch.zeros(2, 5)}, r"token_ids: expected integer ids"),
        ({"prompt_length": 0}, "prompt_length: expected between 1 and 4"),
        ({"prompt_length": 5}, "prompt_length: expected between 1 and 4"),
        ({"prompt_length": [1, 2, 3]}, "prompt_length: expected an int or 2 ints"),
        ({"prompt_length": 1.5}, "prompt_length: expected an int or 2 ints"),
        ({"temperature": 0.0}, "temperature: expected a number > 0"),
        ({"ref_logits": torch.zeros(2, 5, 6)}, r"ref_logits: expected shape \(2, 5, 7\)"),
        ({"old_logits": torch.zeros(1, 5, 7)}, r"old_logits: expected shape"),
    ],
)
def test_bad_input(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"logits": torch.zeros(2, 5, 7), "token_ids": torch.zeros(2, 5, dtype=torch.long)}
    with pytest.raises(grpo.GrpoInputError, match=match):
        grpo.token_logprobs(**{**args, **kwargs})  # type: ignore[arg-type]
