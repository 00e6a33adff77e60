"""grpo.objectives: each registered objective by hand, the clip objective's written-out gradient
against autograd through the plain torch.minimum / clamp form, and closed-form gradients."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from reference import Inputs, close, evaluate64, random_inputs

import grpo
from grpo.objectives import OBJECTIVES, REGIONS, clipped_surrogate

pytestmark = pytest.mark.numerical  # run again under ATEN_CPU_CAPABILITY=default by make test

T_, LO, HI, DC = (REGIONS.index(n) for n in ("trust", "clip_low", "clip_high", "dual_clip"))
# The hand ratios (row 0: A = +1, row 1: A = -1); the third of row 0 is 1.0 here (no padding).
RATIO = [[1.5, 0.9, 1.0], [0.5, 1.1, 4.0]]
LOGP = [[-1.0, -2.0, -0.5], [-3.0, -0.25, -1.5]]


def call(
    name: str, level: str = "token", **config: Any
) -> tuple[grpo.objectives.ObjectiveTerms, torch.Tensor, torch.Tensor]:
    """The objective on the hand ratios, with ratio and logp as leaves: (terms, ratio, logp)."""
    ratio = torch.tensor(RATIO, dtype=torch.float64, requires_grad=True)
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=True)
    A = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    terms = OBJECTIVES.get(name)(ratio, logp, A, grpo.LossConfig(objective=name, **config))
    return terms, ratio, logp


def grads(terms: grpo.objectives.ObjectiveTerms, *leaves: torch.Tensor) -> list[torch.Tensor]:
    out = torch.autograd.grad(terms.surrogate.sum(), leaves, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(out, leaves, strict=True)]


# --- clip ---------------------------------------------------------------------------------------------
def test_clip_by_hand() -> None:
    # ε = 0.2: A > 0 row: min(1.5, 1.2) = 1.2 flat, 0.9, 1.0 trust; A < 0 row: min(-0.5, -0.8) = -0.8
    # flat (clip_low), -1.1 and min(-4, -1.2) = -4 trust. d surrogate / d ratio = A on trust, 0 flat.
    terms, ratio, _ = call("clip")
    close(terms.surrogate, [[1.2, 0.9, 1.0], [-0.8, -1.1, -4.0]])
    close(terms.clipped_ratio, [[1.2, 0.9, 1.0], [0.8, 1.1, 1.2]])
    assert terms.region.tolist() == [[HI, T_, T_], [LO, T_, T_]]
    (g,) = grads(terms, ratio)
    close(g, [[0, 1, 1], [0, -1, -1]])
    close(terms.flags["clip_ratio/low_mean"], [[0, 0, 0], [1, 0, 0]])
    close(terms.flags["clip_ratio/high_mean"], [[1, 0, 0], [0, 0, 0]])
    assert "actor/pg_clipfrac_lower" not in terms.flags


def test_clip_dual_clip_by_hand() -> None:
    # verl's dual clip c = 3 for A < 0: max(min(-4, -1.2), -3) = -3, flat; nothing changes for A > 0.
    terms, ratio, _ = call("clip", dual_clip=3.0)
    close(terms.surrogate, [[1.2, 0.9, 1.0], [-0.8, -1.1, -3.0]])
    assert terms.region.tolist() == [[HI, T_, T_], [LO, T_, DC]]
    close(grads(terms, ratio)[0], [[0, 1, 1], [0, -1, 0]])
    close(terms.flags["actor/pg_clipfrac_lower"], [[0, 0, 0], [0, 0, 1]])


def test_clip_delta_by_hand() -> None:
    # TRL's delta caps the unclipped ratio: delta = 3 gives min(min(4, 3)·(-1), 1.2·(-1)) = -3, the same as
    # a dual clip at 3 (A < 0, delta >= 1 + ε). A > 0 tokens are unchanged.
    terms, ratio, _ = call("clip", delta=3.0)
    close(terms.surrogate, [[1.2, 0.9, 1.0], [-0.8, -1.1, -3.0]])
    assert terms.region.tolist() == [[HI, T_, T_], [LO, T_, DC]]
    close(grads(terms, ratio)[0], [[0, 1, 1], [0, -1, 0]])
    # delta = 1.1 < 1 + ε: for A > 0, min(min(1.5, 1.1), 1.2) = 1.1, flat, yet TRL's high_mean compares
    # min(r, delta) = 1.1 with 1.2 and does not count it; for A < 0, r = 4: max(min(4, 1.1), 1.2) = 1.2, flat.
    terms, ratio, _ = call("clip", delta=1.1)
    close(terms.surrogate, [[1.1, 0.9, 1.0], [-0.8, -1.1, -1.2]])
    assert terms.region.tolist() == [[HI, T_, T_], [LO, T_, DC]]
    close(terms.flags["clip_ratio/high_mean"], torch.zeros(2, 3))
    close(grads(terms, ratio)[0], [[0, 1, 1], [0, -1, 0]])


def test_clip_higher_by_hand() -> None:
    # DAPO's clip-higher ε_high = 0.6: 1.5 < 1.6 is back in the trust region.
    terms, ratio, _ = call("clip", epsilon_high=0.6)
    close(terms.surrogate, [[1.5, 0.9, 1.0], [-0.8, -1.1, -4.0]])
    close(grads(terms, ratio)[0], [[1, 1, 1], [0, -1, -1]])


CLIP_CONFIGS = [
    {"epsilon_low": lo, "epsilon_high": hi, "delta": delta, "dual_clip": dual}
    for (lo, hi), delta, dual in itertools.product(
        [(0.2, 0.2), (0.2, 0.28), (3e-4, 4e-4)], [None, 1.1, 1.5, 3.0], [None, 1.5, 3.0]
    )
]


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("settings", CLIP_CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_clip_fast_path_equals_autograd_of_the_reference_form(settings: dict[str, Any], level: str) -> None:
    """clip (the fast path) writes its gradient as a straight-through term; it must equal autograd
    through clipped_surrogate (torch.minimum / clamp, as the paper writes it), value and gradient,
    on random ratios spanning every region."""
    g = torch.Generator().manual_seed(len(str(settings)) + (level == "token"))
    B, T = 64, (32 if level == "token" else 1)
    x = (torch.randn(B, T, generator=g, dtype=torch.float64) * 0.8).requires_grad_(True)  # log-ratios
    A = torch.randn(B, 1, generator=g, dtype=torch.float64)
    A[::7] = 0.0  # zero advantages too
    config = grpo.LossConfig(**settings)
    terms = OBJECTIVES.get("clip")(x.exp(), x.detach(), A, config)
    (got,) = torch.autograd.grad(terms.surrogate.sum(), x)
    plain = clipped_surrogate(x.exp(), A, config)
    (want,) = torch.autograd.grad(plain.sum(), x)
    close(terms.surrogate, plain)
    close(got, want)
    # the region codes say exactly where autograd's gradient is 0
    flat = (terms.region > T_).expand_as(got)
    assert (want[flat] == 0).all()
    nonzero_a = (A != 0).expand_as(got)
    assert (want[~flat & nonzero_a] != 0).all()


# --- cispo, sapo, gpg ---------------------------------------------------------------------------------
def test_cispo_absolute_by_hand() -> None:
    # TRL: w = sg(min(r, ε_high)) with ε_high = 1.3 an absolute cap: w = [1.3, 0.9, 1.0], [0.5, 1.1, 1.3].
    # surrogate = w·A·logp; d/d logp = w·A (nothing is silenced), d/d ratio = 0 (detached).
    terms, ratio, logp = call("cispo", cispo_bounds="absolute", epsilon_high=1.3)
    w = torch.tensor([[1.3, 0.9, 1.0], [0.5, 1.1, 1.3]], dtype=torch.float64)
    sign = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    close(terms.clipped_ratio, w)
    close(terms.surrogate, w * sign * torch.tensor(LOGP, dtype=torch.float64))
    g_ratio, g_logp = grads(terms, ratio, logp)
    close(g_ratio, torch.zeros(2, 3))
    close(g_logp, w * sign)
    assert terms.region.tolist() == [[HI, T_, T_], [T_, T_, HI]]  # no lower bound
    close(terms.flags["cispo_clip_ratio"], [[1, 0, 0], [0, 0, 0]])  # r > 1.3 and A > 0


def test_cispo_relative_by_hand() -> None:
    # verl: w = sg(clamp(r, 1 - 0.2, 1 + 0.2)) = [1.2, 0.9, 1.0], [0.8, 1.1, 1.2]; pg_clipfrac: r != w.
    terms, ratio, logp = call("cispo", cispo_bounds="relative")
    w = torch.tensor([[1.2, 0.9, 1.0], [0.8, 1.1, 1.2]], dtype=torch.float64)
    close(terms.clipped_ratio, w)
    close(grads(terms, ratio, logp)[1], w * torch.tensor([[1.0], [-1.0]], dtype=torch.float64))
    assert terms.region.tolist() == [[HI, T_, T_], [LO, T_, HI]]
    close(terms.flags["actor/pg_clipfrac"], [[1, 0, 0], [1, 0, 1]])


def test_sapo_by_hand() -> None:
    # (4/τ)·σ(τ(r - 1))·A with τ = 1 for A > 0 and 1.05 for A <= 0; d/d ratio = 4σ(1 - σ)·A.
    terms, ratio, _ = call("sapo")
    expected, slope = [], []
    for row, a, tau in ((RATIO[0], 1.0, 1.0), (RATIO[1], -1.0, 1.05)):
        s = [1 / (1 + math.exp(-tau * (r - 1))) for r in row]
        expected.append([4 / tau * v * a for v in s])
        slope.append([4 * v * (1 - v) * a for v in s])
    close(terms.surrogate, expected)
    close(grads(terms, ratio)[0], slope)
    # on-policy (r = 1) the gate is 4σ(0)/τ = 2/τ and its slope is exactly 1: GRPO's gradient
    assert terms.region.expand(2, 3).tolist() == [[T_] * 3] * 2  # one region for all: (1, 1)


def test_gpg_by_hand() -> None:
    # REINFORCE: A·logp, no ratio: d/d logp = A, d/d ratio = 0.
    terms, ratio, logp = call("gpg")
    close(terms.surrogate, [[-1.0, -2.0, -0.5], [3.0, 0.25, 1.5]])
    g_ratio, g_logp = grads(terms, ratio, logp)
    close(g_ratio, torch.zeros(2, 3))
    close(g_logp, [[1.0] * 3, [-1.0] * 3])


# --- closed-form gradients through evaluate -----------------------------------------------------------
def _w_a(bd: grpo.Breakdown, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    return bd.tokens.weight, inputs.advantages[:, None].expand_as(bd.tokens.weight)


@pytest.mark.parametrize("preset", ["article", "trl-dapo", "verl-grpo", "verl-dapo", "trl-dr_grpo"])
def test_clip_closed_form_gradient(preset: str, inputs: Inputs) -> None:
    """d loss / d logp = -w·A·r on trust tokens, exactly 0 on flat ones."""
    bd = evaluate64(grpo.Batch(**inputs.batch_fields()), preset, beta=0.0)
    w, A = _w_a(bd, inputs)
    trust = bd.tokens.region == T_
    flat = bd.tokens.region > T_
    assert trust.any() and flat.any()
    close(bd.tokens.grad_policy[trust], (-w * A * bd.tokens.ratio)[trust])
    assert (bd.tokens.grad_policy[flat] == 0).all()


def test_cispo_gpg_sapo_closed_form_gradients(inputs: Inputs) -> None:
    batch = grpo.Batch(**inputs.batch_fields())
    bd = evaluate64(batch, "trl-cispo", epsilon_high=1.2)  # a cap some ratios exceed
    w, A = _w_a(bd, inputs)
    assert (bd.tokens.ratio > 1.2).any()
    close(bd.tokens.grad_policy, -w * bd.tokens.clipped_ratio * A)  # -w·sg(min(r, 1.2))·A, clipped or not
    bd = evaluate64(batch, "verl-dapo", objective="gpg")
    close(bd.tokens.grad_policy, -bd.tokens.weight * A)
    bd = evaluate64(batch, "trl-sapo")
    r = bd.tokens.ratio
    tau = torch.where(A > 0, A.new_tensor(1.0), A.new_tensor(1.05))
    s = torch.sigmoid(tau * (r - 1))
    close(bd.tokens.grad_policy, -bd.tokens.weight * 4 * s * (1 - s) * r * A)


def test_gspo_closed_form_gradient(inputs: Inputs) -> None:
    """TRL GSPO with seq-mean-token-mean: a trust row's tokens all get -A_i·s_i / (B·L_i)."""
    bd = evaluate64(grpo.Batch(**inputs.batch_fields()), "trl-gspo", epsilon_low=0.2, epsilon_high=0.2)
    s, L, A = bd.rows.sequence_ratio, bd.rows.length, inputs.advantages
    B = len(L)
    for i in range(B):
        if L[i] == 0:
            continue
        counted = bd.tokens.mask[i]
        if bd.tokens.region[i, counted][0] == T_:
            close(bd.tokens.grad[i, counted], (-A[i] * s[i] / (B * L[i])).expand(int(L[i])))
        else:
            assert (bd.tokens.grad[i] == 0).all()


def test_objective_signature_is_shared() -> None:
    """Every objective takes (ratio, logp, advantages, config) and returns ObjectiveTerms of the ratio's
    shape with float region codes, at token and sequence level."""
    for name in OBJECTIVES.names():
        for T in (3, 1):
            ratio = torch.rand(2, T, dtype=torch.float64) + 0.5
            logp = -torch.rand(2, 3, dtype=torch.float64)
            terms = OBJECTIVES.get(name)(
                ratio, logp, torch.tensor([[1.0], [-1.0]], dtype=torch.float64), grpo.LossConfig(dro_beta=0.1)
            )
            assert isinstance(terms, grpo.objectives.ObjectiveTerms)
            assert terms.surrogate.shape[0] == 2 and terms.region.is_floating_point()
            assert set(terms.region.unique().tolist()) <= set(range(len(REGIONS)))


def test_unknown_objective_lists_the_valid_names() -> None:
    with pytest.raises(grpo.GrpoInputError, match=", ".join(OBJECTIVES.names())):
        OBJECTIVES.get("ppo")


def test_hand_ratios_match_random_free_evaluate(hand_batch: grpo.Batch) -> None:
    """The same hand numbers through evaluate: article surrogate and its flat tokens."""
    bd = evaluate64(hand_batch, "article", beta=0.0)
    close(bd.tokens.surrogate, [[1.2, 0.9, 0.0], [-0.8, -1.1, -4.0]])


def test_random_inputs_reach_every_clip_region() -> None:
    """The random batches used across the suite do exercise both clip sides (guards the generator)."""
    bd = evaluate64(grpo.Batch(**random_inputs(0).batch_fields()), "verl-grpo")
    present = set(bd.tokens.region.unique().tolist())
    assert {T_, LO, HI} <= present


def test_clip_cov_with_a_ratio_per_row_cuts_tokens() -> None:
    """Clip-Cov picks tokens, also when the importance ratio is one per row (importance_sampling_level "sequence"):
    its cut was shaped like the (B, 1) ratio, and the draw's token index raised an IndexError (a 500 in the API)."""
    x = random_inputs(6, B=6, T=7)
    config = grpo.LossConfig(
        objective="clip_cov",
        importance_sampling_level="sequence",
        clip_cov_ratio=0.5,
        clip_cov_lb=-100.0,
        clip_cov_ub=100.0,
        beta=0.0,
        dtype="float64",
    )
    bd = grpo.evaluate(grpo.Batch(**x.batch_fields()), config)
    assert bd.tokens.selected is not None and bd.tokens.selected.shape == x.mask.shape
    cut = bd.tokens.selected > 0
    assert bool(cut.any()) and not bool((cut & ~bd.tokens.mask).any())
    assert (bd.tokens.loss[cut] == 0).all()  # its term is 0; its log-prob still moves its row's ratio (a gradient)
