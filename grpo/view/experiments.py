"""The article's notebook experiments, reproduced exactly, and the three it asks for but never runs.

Each experiment runs in float32 (as the notebook did) and float64 side by side, so the float32
rounding noise behind the "-3.8147e-06" is visible for what it is. The notebook's own functions
are kept as written (including its ratio-of-exps KL), because reproducing its numbers is the
point; the library's evaluate() uses the stable form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from grpo.batch import Batch
from grpo.config import LossConfig
from grpo.loss import evaluate
from grpo.requests import batch_from_request
from grpo.view.examples import ARTICLE_EXAMPLE

DTYPES = {"float32": torch.float32, "float64": torch.float64}
BETA = 0.01  # the notebook's beta


@dataclass(frozen=True)
class Experiment:
    """One experiment: what the article reports, what we compute, and the actual cause."""

    name: str
    title: str
    article: str
    """What the article reports."""
    explanation: str
    """One paragraph: the actual cause."""
    x_label: str
    y_label: str
    x: list[Any]
    series: dict[str, list[float]]
    """Named y-series over x: always "float32" and "float64", sometimes more."""
    reported: list[str | None] = field(default_factory=list)
    """The article's printed value for each x, where it printed one."""
    extra: dict[str, Any] = field(default_factory=dict)


# --- the notebook's functions, as written (cells 3 and 5) ---------------------------------------
def notebook_kl(pi_logprob: Tensor, pi_ref_logprob: Tensor) -> Tensor:
    return pi_ref_logprob.exp() / pi_logprob.exp() - (pi_ref_logprob - pi_logprob) - 1


def notebook_advantage(rewards: Tensor) -> Tensor:
    epsilon = 0.00001
    return (rewards - rewards.mean()) / (rewards.std() + epsilon)


def minimal_grpo_loss(pi_logprob: Tensor, pi_old_logprob: Tensor, pi_ref_logprob: Tensor, rewards: Tensor) -> Tensor:
    """Cell 5: no min, no clip, no token dimension; one scalar ratio broadcast over the group."""
    kl = notebook_kl(pi_logprob, pi_ref_logprob)
    A = notebook_advantage(rewards)
    return -(torch.exp(pi_logprob - pi_old_logprob) * A - BETA * kl)


def notebook_sum(x: Tensor) -> Tensor:
    """x.sum() in the order a 4-lane (128-bit SIMD) float32 reduction takes.

    Summing ±50-sized terms that cancel leaves a residue whose value depends on the order. The
    notebook's printed -3.8147e-06 / 3.8147e-06 come from this order: four running lanes, then
    (l0 + l1) + (l2 + l3); a left-to-right sum of the same terms gives -1.9e-06 / 9.5e-06.
    """
    chunks = torch.nn.functional.pad(x.flatten(), (0, -x.numel() % 4)).view(-1, 4)
    lanes = chunks[0]
    for chunk in chunks[1:]:  # vector adds, one chunk at a time
        lanes = lanes + chunk
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


def _cell(pi: float, old: float, ref: float, rewards: Sequence[float], dtype: str, ordered: bool = True) -> float:
    t = DTYPES[dtype]
    pi_t, old_t, ref_t = (torch.tensor(p, dtype=t).log() for p in (pi, old, ref))
    loss = minimal_grpo_loss(pi_t, old_t, ref_t, torch.tensor(rewards, dtype=t))
    return float(notebook_sum(loss) if ordered else _left_to_right(loss))


def _left_to_right(x: Tensor) -> Tensor:
    total = x[0]
    for v in x[1:]:
        total = total + v
    return total


def _both(pi: float, old: float, ref: float, rewards: Sequence[float]) -> dict[str, float]:
    """One notebook cell in float32 and float64."""
    return {d: _cell(pi, old, ref, rewards, d) for d in DTYPES}


def _kl_floor(pi: float, ref: float, n: int) -> float:
    """n · beta · k3 in float64: what is left once the policy terms cancel."""
    x = torch.tensor(ref / pi, dtype=torch.float64)
    return float(n * BETA * (x - x.log() - 1))


def _series(cases: list[dict[str, float]]) -> dict[str, list[float]]:
    return {d: [c[d] for c in cases] for d in DTYPES}


def kl_only() -> Experiment:
    cases = [_both(0.5, 0.5, 0.6, [1, 0, 0, 0, 0, 0, 0, 0])]
    floor = _kl_floor(0.5, 0.6, 8)
    return Experiment(
        "kl_only",
        "pi = pi_old = 0.5, pi_ref = 0.6: a positive loss",
        "0.0014 (cell 7)",
        "The ratio is 1 and the eight standardised advantages sum to zero, so the eight policy terms "
        f"cancel exactly in exact arithmetic. What is left is eight KL penalties: 8 · 0.01 · "
        f"(1.2 - ln 1.2 - 1) = {floor:.6f}. The loss is positive because nothing else is there, not "
        "because the policy is bad.",
        "case",
        "loss.sum()",
        ["pi = pi_old = 0.5, ref 0.6, one positive reward"],
        _series(cases) | {"8·beta·KL": [floor]},
        ["0.0014"],
    )


def ratio_20() -> Experiment:
    rewards = {"one positive reward": [1, 0, 0, 0, 0, 0, 0, 0], "two positive rewards": [1, 1, 0, 0, 0, 0, 0, 0]}
    cases = [_both(0.1, 0.005, 0.1001, r) for r in rewards.values()]
    in_order = [_cell(0.1, 0.005, 0.1001, r, "float32", ordered=False) for r in rewards.values()]
    floor = _kl_floor(0.1, 0.1001, 8)
    return Experiment(
        "ratio_20",
        "Ratio 20: loss 'negative', then 'positive'",
        "-3.8147e-06 with one positive reward, 3.8147e-06 with two (cell 9)",
        "pi / pi_old = 0.1 / 0.005 = 20 is one scalar shared by all eight responses, so the policy "
        "part is 20 · sum(A), zero in exact arithmetic. In float32 the terms are about ±50 and their "
        "sum keeps a rounding residue of a few ulps of 50 (2^-18 = 3.8147e-06), whose sign is an "
        "accident of the summation order: a 4-lane SIMD sum gives the notebook's ∓3.8147e-06, a "
        "left-to-right sum of the same eight terms gives -1.9e-06 and 9.5e-06. float64 shows the true "
        f"value: 8 · beta · KL = {floor:.3e}, positive in both cases. The sign flip is float32 noise, "
        "not a property of GRPO.",
        "case",
        "loss.sum()",
        list(rewards),
        _series(cases) | {"float32, left to right": in_order, "8·beta·KL": [floor, floor]},
        ["-3.8147e-06", "3.8147e-06"],
    )


def positive_count() -> Experiment:
    counts = [1, 4, 7, 8]
    cases = [_both(0.4, 0.3, 0.401, [1] * k + [0] * (8 - k)) for k in counts]
    floor = _kl_floor(0.4, 0.401, 8)
    return Experiment(
        "positive_count",
        "More positive rewards, same near-zero loss",
        "approximately 0 for 1, 4, 7 and 8 positive rewards (cell 11)",
        "However many of the eight responses are rewarded, the standardised advantages sum to zero "
        "and the single shared ratio (0.4 / 0.3) multiplies that sum, so the policy part cancels. With "
        "all eight rewarded the std is 0 and every advantage is exactly 0. Each loss is the KL floor "
        f"8 · beta · KL = {floor:.3e} plus float32 rounding of the cancelled terms: a shared ratio "
        "cannot break the cancellation.",
        "positive rewards (of 8)",
        "loss.sum()",
        counts,
        _series(cases) | {"8·beta·KL": [floor] * len(counts)},
        ["≈ 0"] * len(counts),
    )


def pi_equals_old() -> Experiment:
    pis = [0.4, 0.3, 0.1]
    cases = [_both(p, p, 0.401, [1, 1, 0, 0, 0, 0, 0, 0]) for p in pis]
    floors = [_kl_floor(p, 0.401, 8) for p in pis]
    return Experiment(
        "pi_equals_old",
        "pi = pi_old from 0.4 down to 0.1: 0.0000 to 0.1297",
        "0.0000 → 0.1297 (cell 13)",
        "With pi = pi_old the ratio is 1 and the policy terms cancel as before; the loss is all KL. "
        "As pi falls from 0.4 to 0.1 while pi_ref stays at 0.401, k3 = pi_ref/pi - ln(pi_ref/pi) - 1 "
        "grows from 3e-6 to 1.62, so 8 · 0.01 · KL grows from 0.0000 to 0.1297. The loss rose because "
        "the policy drifted from the reference, not because anything about reward changed.",
        "pi = pi_old",
        "loss.sum()",
        pis,
        _series(cases) | {"8·beta·KL": floors},
        ["0.0000", None, "0.1297"],
    )


def figure_1() -> Experiment:
    n = 128

    def sweep(dtype: str) -> list[float]:
        t = DTYPES[dtype]
        pi, old, ref = (torch.tensor(p, dtype=t).log() for p in (0.1, 0.005, 0.101))
        rewards = torch.zeros(n, dtype=t)
        out = []
        for i in range(n):  # the notebook's loop over the reward vector, kept as written
            rewards[i] = 1.0
            out.append(float(notebook_sum(minimal_grpo_loss(pi, old, ref, rewards))))
        return out

    floor = _kl_floor(0.1, 0.101, n)
    series = {d: sweep(d) for d in DTYPES}
    return Experiment(
        "figure_1",
        "Figure 1: loss against the number of positive rewards, 1 to 128",
        "the loss fluctuates around a KL baseline of roughly 6e-5 (cell 15, Figure 1)",
        "The loop changes only the reward vector; the ratio 0.1 / 0.005 = 20 is shared by all 128 "
        "responses and nothing is updated. The policy part is 20 · sum(A) = 0 in exact arithmetic; "
        f"what remains is 128 · beta · KL = {floor:.3e}, the flat float64 line. The float32 curve "
        "scatters around it by the rounding of 128 terms of size up to 20 · 11: that scatter is "
        "Figure 1's 'fluctuation'. The last point (all rewards 1) has zero std, advantages exactly 0, "
        "and sits on the floor. The figure shows floating point, not a reward-loss relation.",
        "reward sum",
        "loss.sum()",
        list(range(1, n + 1)),
        series | {"128·beta·KL": [floor] * n},
        extra={"kl_floor": floor},
    )


# --- the experiments the article asks for ---------------------------------------------------------
def distinct_ratios() -> Experiment:
    """Each response its own log-prob, a separate differentiable variable."""
    rewards = [1, 1, 0, 0, 0, 0, 0, 0]
    old = [0.3] * 8
    pi = [0.36, 0.33, 0.27, 0.29, 0.25, 0.3, 0.28, 0.26]  # moved up for rewarded, down for the rest
    ref = [0.3] * 8

    def run(dtype: str, shared: bool) -> tuple[float, list[float]]:
        t = DTYPES[dtype]
        values = [sum(pi) / 8] * 8 if shared else pi
        logp = torch.tensor(values, dtype=t).log().requires_grad_(True)
        loss = minimal_grpo_loss(
            logp, torch.tensor(old, dtype=t).log(), torch.tensor(ref, dtype=t).log(), torch.tensor(rewards, dtype=t)
        ).sum()
        (grad,) = torch.autograd.grad(loss, logp)
        return float(loss.detach()), grad.tolist()

    results = {d: run(d, shared=False) for d in DTYPES}
    shared = {d: run(d, shared=True)[0] for d in DTYPES}
    return Experiment(
        "distinct_ratios",
        "Distinct per-response ratios as separate variables",
        "asked for, not run: 'give each response a distinct current/old log probability'",
        "Here the eight responses have their own current log-probs (separate leaves of the graph): the "
        "two rewarded ones moved up since sampling, the others mostly down. The ratios now correlate "
        f"with the advantages, sum(r_i·A_i) no longer cancels, and the loss is {results['float64'][0]:.4f} "
        f"against {shared['float64']:.2e} when one shared ratio (their mean) is broadcast. Each "
        "response gets its own gradient -r_i·A_i + beta·(1 - pi_ref/pi_i): negative (pushed up) for "
        "the rewarded ones, positive for the rest; nothing forces them to cancel.",
        "response",
        "d loss / d log pi_i",
        list(range(8)),
        {d: results[d][1] for d in DTYPES},
        extra={
            "loss": {d: results[d][0] for d in DTYPES},
            "loss_with_shared_ratio": shared,
            "pi": pi,
            "rewards": rewards,
        },
    )


def zero_loss_nonzero_grad() -> Experiment:
    """On-policy, no reference: the loss is 0 (up to rounding) and the gradient is not."""
    request = {
        **ARTICLE_EXAMPLE,
        "old_per_token_logps": None,
        "ref_per_token_logps": None,
        "advantages": None,
        "rewards": [1.0, 0.0, 1.0],
        "tokens": None,
    }
    request = {k: v for k, v in request.items() if v is not None}
    out = {}
    for d in DTYPES:
        bd = evaluate(batch_from_request(request), LossConfig.from_preset("article", dtype=d))
        out[d] = (float(bd.loss), bd.metrics["lens/grad_norm_logps"], bd.tokens.grad[bd.tokens.mask].tolist())
    return Experiment(
        "zero_loss_nonzero_grad",
        "Zero loss, non-zero gradient",
        "asked for, not run: 'a function can equal zero at a point without having zero gradient there'",
        "The article's example batch evaluated on-policy (old = current, so every ratio is 1) with "
        "rewards [1, 0, 1] and no reference (KL 0). The loss is -mean(A_i) over rows = 0 up to "
        f"rounding ({out['float32'][0]:.1e} in float32, {out['float64'][0]:.1e} in float64), but each "
        "completion token's gradient is -A_i / (3 · 2): the rewarded rows are pushed up, the other "
        f"down, with gradient norm {out['float64'][1]:.4f}. The value of the loss says nothing about "
        "the size of the update.",
        "completion token",
        "d loss / d logp",
        list(range(len(out["float64"][2]))),
        {d: out[d][2] for d in DTYPES},
        extra={"loss": {d: out[d][0] for d in DTYPES}, "grad_norm": {d: out[d][1] for d in DTYPES}},
    )


def constant_shift() -> Experiment:
    """loss + C for several C: the gradient does not move."""
    constants = [-10.0, -1.0, 0.0, 1.0, 100.0]

    def run(dtype: str) -> tuple[list[float], list[float]]:
        t = DTYPES[dtype]
        ex = ARTICLE_EXAMPLE
        lp = torch.tensor(ex["per_token_logps"], dtype=t)
        base = None
        losses, diffs = [], []
        for c in constants:
            logp = lp.clone().requires_grad_(True)
            bd_loss = (
                _article_grpo_loss(
                    logp,
                    torch.tensor(ex["old_per_token_logps"], dtype=t),
                    torch.tensor(ex["ref_per_token_logps"], dtype=t),
                    torch.tensor(ex["advantages"], dtype=t),
                    3,
                )
                + c
            )
            (grad,) = torch.autograd.grad(bd_loss, logp)
            base = grad if base is None else base
            losses.append(float(bd_loss.detach()))
            diffs.append(float((grad - base).abs().max()))
        return losses, diffs

    results = {d: run(d) for d in DTYPES}
    return Experiment(
        "constant_shift",
        "A constant added to the loss leaves the gradient unchanged",
        "stated, not run: 'adding any constant to the loss changes its sign without changing its gradient'",
        "The article's example loss plus C for C from -10 to 100: the loss takes either sign, while the "
        "largest difference between any token's gradient and the gradient at C = -10 is exactly 0 in "
        "both precisions. The zero point of a loss is a convention; only its gradient moves the policy.",
        "C",
        "loss + C",
        constants,
        {d: results[d][0] for d in DTYPES},
        extra={"max_abs_grad_difference": {d: results[d][1] for d in DTYPES}},
    )


def _article_grpo_loss(pi: Tensor, old: Tensor, ref: Tensor, advantage: Tensor, input_len: int) -> Tensor:
    """The article's grpo_loss on a (B, T) batch with equal lengths, via the library's article preset."""
    batch = Batch(
        per_token_logps=pi,
        old_per_token_logps=old,
        ref_per_token_logps=ref,
        advantages=advantage,
        prompt_lengths=input_len,
    )
    return _loss_with_grad(
        batch, LossConfig.from_preset("article", dtype="float64" if pi.dtype == torch.float64 else "float32"), pi
    )


def _loss_with_grad(batch: Batch, config: LossConfig, leaf: Tensor) -> Tensor:
    """A loss tensor that carries the breakdown's gradient back to ``leaf`` (d loss = grad · d leaf)."""
    bd = evaluate(batch, config)
    return bd.loss + (bd.tokens.grad * (leaf - leaf.detach())).sum()


EXPERIMENTS: dict[str, Callable[[], Experiment]] = {
    fn.__name__: fn
    for fn in (
        kl_only,
        ratio_20,
        positive_count,
        pi_equals_old,
        figure_1,
        distinct_ratios,
        zero_loss_nonzero_grad,
        constant_shift,
    )
}


def run(name: str) -> Experiment:
    return EXPERIMENTS[name]()
