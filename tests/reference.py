"""Plain, loop-based references, written from shared/reference/loss-variants-spec.md, not from grpo/.

- ``trl_loss``: TRL 1.16.0 ``GRPOTrainer._compute_loss`` on one process with GA = S = P = 1
  (spec §1.4-§1.10): no log-ratio clamp, k3 times the differentiable ratio when
  ``use_bias_correction_kl``, ``delta`` on c1 only, CISPO's absolute cap, SAPO's temperatures,
  the (B, 1) GSPO ratio with the gradient through the mean, each loss_type's normaliser.
- ``verl_policy_loss`` / ``verl_agg_loss`` / ``verl_kl_penalty`` / ``verl_grpo_advantage``: verl
  0.9.1 ``core_algos`` with an empty ``global_batch_info`` (spec §2.2-§2.6): the ±20 log-ratio
  clamp, dual clip c, GSPO's token form sg(s)·π/sg(π) clamped at 10, low_var_kl's two clamps,
  rows with L > 0 and L + 1e-8, singleton groups keep their raw score.
- ``loop_evaluate``: the library's own LossConfig semantics, one token at a time, for the
  combinations no trainer has.

Every per-token quantity is a 0-d tensor built from ``logp[i, t]`` of a leaf tensor, so autograd
of the returned loss is the reference gradient. Positions with mask 0 are skipped, never read:
they may hold anything.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import grpo

# --- inputs --------------------------------------------------------------------------------------


@dataclass
class Inputs:
    """A random ragged batch: (B, T) tensors with garbage at every position that does not count."""

    logp: Tensor
    old: Tensor
    ref: Tensor
    mask: Tensor
    advantages: Tensor
    rewards: Tensor
    group_size: int

    def batch_fields(self) -> dict[str, Any]:
        """grpo.Batch's fields (advantages given; swap in rewards and group_size as needed)."""
        return {
            "per_token_logps": self.logp,
            "old_per_token_logps": self.old,
            "ref_per_token_logps": self.ref,
            "completion_mask": self.mask,
            "advantages": self.advantages,
        }

    def to(self, dtype: torch.dtype) -> Inputs:
        return Inputs(
            *(t.to(dtype) for t in (self.logp, self.old, self.ref, self.mask, self.advantages, self.rewards)),
            self.group_size,
        )


def random_inputs(
    seed: int,
    B: int = 6,
    T: int = 7,
    *,
    noise: float = 0.5,
    empty_rows: int = 1,
    group_size: int = 3,
    garbage: float | None = float("nan"),
    dtype: torch.dtype = torch.float64,
) -> Inputs:
    """Ragged rows (right padding, lengths 1..T), ``empty_rows`` of them fully masked.

    ``logp`` = ``old`` + N(0, noise): with noise 0.5 about half the ratios leave [0.8, 1.2].
    Rows alternate advantage signs so both clip sides are hit. Padding holds ``garbage`` (NaN by
    default; None leaves the random values) in logp, old and ref alike.
    """
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[torch.randperm(B, generator=g)[:empty_rows]] = 0
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.float64)
    old = -(torch.rand(B, T, generator=g, dtype=torch.float64) * 3 + 0.05)
    logp = (old + noise * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    ref = (logp + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).clamp(max=-1e-3)
    advantages = torch.randn(B, generator=g, dtype=torch.float64).abs() * torch.tensor(
        [(-1.0) ** i for i in range(B)], dtype=torch.float64
    )
    rewards = torch.randint(0, 3, (B,), generator=g).to(torch.float64)
    if garbage is not None:
        pad = mask == 0
        logp, old, ref = (t.masked_fill(pad, garbage) for t in (logp, old, ref))
    return Inputs(
        logp.to(dtype),
        old.to(dtype),
        ref.to(dtype),
        mask.to(dtype),
        advantages.to(dtype),
        rewards.to(dtype),
        group_size,
    )


def leaf(logp: Tensor) -> Tensor:
    """The current log-probs as the variable, with 0 where padding held NaN (it is never read)."""
    return torch.nan_to_num(logp.detach(), nan=0.0).clone().requires_grad_(True)


def _mask(mask: Tensor | Sequence[Sequence[float]]) -> list[list[bool]]:
    return [[bool(v) for v in row] for row in (mask.tolist() if isinstance(mask, Tensor) else mask)]


# --- TRL 1.16.0 -----------------------------------------------------------------------------------
CLIP_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def trl_loss(
    logp: Tensor,
    old: Tensor | None,
    ref: Tensor | None,
    advantages: Sequence[float] | Tensor,
    mask: Tensor,
    *,
    loss_type: str = "dapo",
    beta: float = 0.0,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    use_bias_correction_kl: bool = True,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    max_completion_length: int = 512,
) -> tuple[Tensor, dict[str, float]]:
    """TRL's ``_compute_loss`` (spec §1.4-§1.10), one process, GA = S = 1: (loss, metrics)."""
    B, T = logp.shape
    m = _mask(mask)
    A = [float(a) for a in advantages]
    L = [sum(row) for row in m]
    eps_lo, eps_hi = epsilon, (epsilon if epsilon_high is None else epsilon_high)
    old_ = logp.detach() if old is None else old  # §1.4: no old log-probs -> sg(ℓ), ratio exactly 1

    # §1.4 ratio c1: per token, or per row exp(Σ m·(ℓ - ℓold) / max(L, 1)) with the gradient through the mean.
    c1: list[list[Tensor | None]] = [[None] * T for _ in range(B)]
    for i in range(B):
        if importance_sampling_level == "token":
            for t in range(T):
                if m[i][t]:
                    c1[i][t] = torch.exp(logp[i, t] - old_[i, t])
        else:
            total = logp.new_zeros(())
            for t in range(T):
                if m[i][t]:
                    total = total + (logp[i, t] - old_[i, t])
            seq = torch.exp(total / max(L[i], 1))
            for t in range(T):
                c1[i][t] = seq

    # §1.6 per-token policy loss l; §1.5 KL added after it; both only where m = 1.
    per_token: list[list[Tensor | None]] = [[None] * T for _ in range(B)]
    names = ("low", "high", "region", "cispo")
    flags: dict[str, list[list[float]]] = {k: [[0.0] * T for _ in range(B)] for k in names}
    kls: list[float] = []
    for i in range(B):
        for t in range(T):
            ratio = c1[i][t]
            if not m[i][t] or ratio is None:
                continue
            if loss_type in CLIP_LOSS_TYPES:
                coef_2 = torch.clamp(ratio, 1 - eps_lo, 1 + eps_hi)
                coef_1 = ratio if delta is None else torch.clamp(ratio, max=delta)  # c1 <- min(c1, delta)
                loss = -torch.minimum(coef_1 * A[i], coef_2 * A[i])
                flags["low"][i][t] = float(coef_1 < 1 - eps_lo and A[i] < 0)
                flags["high"][i][t] = float(coef_1 > 1 + eps_hi and A[i] > 0)  # c1 after delta
                flags["region"][i][t] = max(flags["low"][i][t], flags["high"][i][t])
            elif loss_type == "cispo":
                weight = torch.clamp(ratio, max=eps_hi).detach()  # an absolute cap, no lower clip
                loss = -weight * A[i] * logp[i, t]
                flags["cispo"][i][t] = float(ratio > eps_hi and A[i] > 0)
            elif loss_type == "sapo":
                tau = sapo_temperature_pos if A[i] > 0 else sapo_temperature_neg
                loss = -(4 / tau) * torch.sigmoid(tau * (ratio - 1)) * A[i]
            else:
                raise ValueError(loss_type)
            if beta != 0:
                r_ref = (logp.detach() if ref is None else ref)[i, t]
                kl = torch.exp(r_ref - logp[i, t]) - (r_ref - logp[i, t]) - 1
                if use_bias_correction_kl:
                    kl = kl * ratio  # the differentiable c1, before delta; the row's at sequence level
                kls.append(kl.item())
                loss = loss + beta * kl
            per_token[i][t] = loss

    # §1.8 normalisers with P = GA = S = 1 (N_gen = Σ m).
    n_tokens = sum(L)
    total = logp.new_zeros(())
    for i in range(B):
        row = logp.new_zeros(())
        for t in range(T):
            value = per_token[i][t]
            if value is not None:
                row = row + value
        if loss_type in ("grpo", "sapo"):
            total = total + row / max(L[i], 1) / B
        elif loss_type in ("bnpo", "dapo", "cispo"):
            total = total + row / max(n_tokens, 1)
        elif loss_type == "dr_grpo":
            total = total + row / (B * max_completion_length)
        elif loss_type == "luspo":
            total = total + row / B
        else:
            raise ValueError(loss_type)

    # §1.10 metrics: token-weighted masked means; at sequence level one value per row, all B rows
    # (an empty row has c1 = exp(0) = 1, so its flags are 0).
    def batch_mean(name: str) -> float:
        if importance_sampling_level == "sequence":
            return sum(_row_flag(name, c1[i][0].item(), A[i], eps_lo, eps_hi, delta) for i in range(B)) / B
        return sum(flags[name][i][t] for i in range(B) for t in range(T) if m[i][t]) / max(n_tokens, 1)

    metrics: dict[str, float] = {}
    if loss_type in CLIP_LOSS_TYPES:
        for name in ("low", "high", "region"):
            metrics[f"clip_ratio/{name}_mean"] = batch_mean(name)

        # TRL 1.16 logs nanmin / nanmax over sequences of masked_seq_mean(flag): each row's own clip
        # fraction, NaN (skipped) for a row without a counted token; at sequence level the row's flag.
        def seq_fraction(name: str, i: int) -> float:
            if importance_sampling_level == "sequence":
                return _row_flag(name, c1[i][0].item(), A[i], eps_lo, eps_hi, delta)
            if L[i] == 0:
                return math.nan
            return sum(flags[name][i][t] for t in range(T) if m[i][t]) / L[i]

        for key, name, pick in (("clip_ratio/low_min", "low", min), ("clip_ratio/high_max", "high", max)):
            values = [v for v in (seq_fraction(name, i) for i in range(B)) if not math.isnan(v)]
            metrics[key] = pick(values) if values else math.nan
    if loss_type == "cispo":
        metrics["cispo_clip_ratio"] = batch_mean("cispo")
    if beta != 0:
        metrics["kl"] = sum(kls) / max(n_tokens, 1)  # the masked mean, after the ratio correction
    return total, metrics


def _row_flag(name: str, ratio: float, a: float, eps_lo: float, eps_hi: float, delta: float | None) -> float:
    r = ratio if delta is None else min(ratio, delta)
    if name == "low":
        return float(r < 1 - eps_lo and a < 0)
    if name == "high":
        return float(r > 1 + eps_hi and a > 0)
    if name == "region":
        return max(
            _row_flag("low", ratio, a, eps_lo, eps_hi, delta), _row_flag("high", ratio, a, eps_lo, eps_hi, delta)
        )
    return float(ratio > eps_hi and a > 0)  # cispo


def trl_advantages(rewards: Sequence[float], num_generations: int, scale_rewards: str = "group") -> list[float]:
    """§1.3, sum_then_normalize with one reward function: group mean, unbiased std, + 1e-4."""
    R = [float(r) for r in rewards]
    groups = [R[k : k + num_generations] for k in range(0, len(R), num_generations)]
    batch_std = statistics.stdev(R)
    out = []
    for group in groups:
        mean, std = statistics.fmean(group), statistics.stdev(group)
        for r in group:
            if scale_rewards == "group":
                out.append((r - mean) / (std + 1e-4))
            elif scale_rewards == "batch":
                out.append((r - mean) / (batch_std + 1e-4))
            elif scale_rewards == "none":
                out.append(r - mean)
            else:
                raise ValueError(scale_rewards)
    return out


# --- verl 0.9.1 -----------------------------------------------------------------------------------
def verl_agg_loss(
    loss_mat: list[list[Tensor | None]], mask: Tensor, loss_agg_mode: str, loss_scale_factor: float | None = None
) -> Tensor:
    """§2.2 agg_loss with dp_size 1 and no global info (the local fallbacks)."""
    m = _mask(mask)
    B, T = len(m), len(m[0])
    L = [sum(row) for row in m]
    zero = torch.zeros((), dtype=torch.float64)
    sums = []
    for i in range(B):
        row = zero
        for t in range(T):
            if m[i][t]:
                v = loss_mat[i][t]
                assert v is not None
                row = row + v
        sums.append(row)
    rows = [i for i in range(B) if L[i] > 0]
    if loss_agg_mode == "token-mean":
        return sum(sums, zero) / sum(L)
    if loss_agg_mode == "seq-mean-token-sum":
        return sum((sums[i] for i in rows), zero) / len(rows)
    if loss_agg_mode == "seq-mean-token-mean":
        return sum((sums[i] / (L[i] + 1e-8) for i in rows), zero) / len(rows)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        C = loss_scale_factor if loss_scale_factor is not None else T  # loss_mask.shape[-1]
        return sum((sums[i] for i in rows), zero) / len(rows) / C
    raise ValueError(loss_agg_mode)


def verl_policy_loss(
    old: Tensor,
    logp: Tensor,
    advantages: Sequence[float] | Tensor,
    mask: Tensor,
    *,
    loss_mode: str = "vanilla",
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """§2.3 registered policy losses (A broadcast per row): (pg_loss, pg_metrics)."""
    m = _mask(mask)
    B, T = len(m), len(m[0])
    L = [sum(row) for row in m]
    A = [float(a) for a in advantages]
    eps_l = clip_ratio if clip_ratio_low is None else clip_ratio_low
    eps_h = clip_ratio if clip_ratio_high is None else clip_ratio_high
    loss_mat: list[list[Tensor | None]] = [[None] * T for _ in range(B)]
    clipfrac, clipfrac_lower, kl_terms = [], [], []
    log_s = []
    for i in range(B):  # gspo: log s_i = Σ m (ℓ - ℓold) / max(L_i, 1), unclamped and detached
        total = 0.0
        for t in range(T):
            if m[i][t]:
                total += logp[i, t].item() - float(old[i, t])
        log_s.append(total / max(L[i], 1))
    for i in range(B):
        for t in range(T):
            if not m[i][t]:
                continue
            lp, a = logp[i, t], A[i]
            log_ratio = torch.clamp(lp - old[i, t], -20.0, 20.0)
            rho = torch.exp(log_ratio)
            if loss_mode == "vanilla":
                assert clip_ratio_c > 1
                l1 = -a * rho
                l2 = -a * torch.clamp(rho, 1 - eps_l, 1 + eps_h)
                lc = torch.maximum(l1, l2)
                l3 = -a * torch.tensor(clip_ratio_c, dtype=rho.dtype)
                loss = torch.minimum(l3, lc) if a < 0 else lc
                clipfrac.append(float(l2 > l1))
                clipfrac_lower.append(float(lc > l3 and a < 0))
                kl_terms.append(-log_ratio.item())
            elif loss_mode == "gspo":
                log_hat = torch.clamp(lp - lp.detach() + log_s[i], max=10.0)  # ℓ - sg(ℓ) + sg(log s_i) <= 10
                s_hat = torch.exp(log_hat)
                l1 = -a * s_hat
                l2 = -a * torch.clamp(s_hat, 1 - eps_l, 1 + eps_h)
                loss = torch.maximum(l1, l2)
                clipfrac.append(float(l2 > l1))
                clipfrac_lower.append(0.0)
            elif loss_mode == "sapo":
                tau = tau_pos if a > 0 else tau_neg
                loss = -torch.sigmoid(tau * (rho - 1)) * (4 / tau) * a
            elif loss_mode == "cispo":
                clipped = torch.clamp(rho, 1 - eps_l, 1 + eps_h)
                loss = -clipped.detach() * a * lp
                clipfrac.append(float(rho != clipped))
            elif loss_mode == "gpg":
                loss = -lp * a
            else:
                raise ValueError(loss_mode)
            loss_mat[i][t] = loss
    mode = "seq-mean-token-mean" if loss_mode == "sapo" else loss_agg_mode  # sapo ignores loss_agg_mode
    pg_loss = verl_agg_loss(loss_mat, mask, mode, loss_scale_factor)
    metrics: dict[str, float] = {}
    if clipfrac:
        metrics["actor/pg_clipfrac"] = statistics.fmean(clipfrac)
    if clipfrac_lower:
        metrics["actor/pg_clipfrac_lower"] = statistics.fmean(clipfrac_lower)
    if kl_terms:
        metrics["actor/ppo_kl"] = statistics.fmean(kl_terms)
    return pg_loss, metrics


def verl_kl_penalty(logp: Tensor, ref: Tensor, mask: Tensor, kl_penalty: str) -> list[list[Tensor | None]]:
    """§2.4 kl_penalty per counted token."""
    m = _mask(mask)
    out: list[list[Tensor | None]] = [[None] * len(m[0]) for _ in m]
    for i, row in enumerate(m):
        for t, counted in enumerate(row):
            if not counted:
                continue
            lp, r = logp[i, t], ref[i, t]
            if kl_penalty in ("kl", "k1"):
                out[i][t] = lp - r
            elif kl_penalty in ("mse", "k2"):
                out[i][t] = 0.5 * (lp - r) ** 2
            elif kl_penalty in ("low_var_kl", "k3"):
                x = torch.clamp(r - lp, -20.0, 20.0)
                out[i][t] = torch.clamp(torch.exp(x) - x - 1, -10.0, 10.0)
            else:
                raise ValueError(kl_penalty)
    return out


def verl_actor_loss(
    old: Tensor,
    logp: Tensor,
    ref: Tensor,
    advantages: Sequence[float] | Tensor,
    mask: Tensor,
    *,
    loss_agg_mode: str,
    kl_loss_coef: float = 0.0,
    kl_loss_type: str = "low_var_kl",
    **policy: Any,
) -> tuple[Tensor, dict[str, float]]:
    """§2.6 ppo_loss without entropy: pg_loss + kl_loss_coef · agg(kl_penalty), same agg mode."""
    pg_loss, metrics = verl_policy_loss(old, logp, advantages, mask, loss_agg_mode=loss_agg_mode, **policy)
    metrics["actor/pg_loss"] = pg_loss.item()
    if kl_loss_coef == 0:
        return pg_loss, metrics
    kl = verl_agg_loss(
        verl_kl_penalty(logp, ref, mask, kl_loss_type), mask, loss_agg_mode, policy.get("loss_scale_factor")
    )
    metrics["actor/kl_loss"] = kl.item()
    return pg_loss + kl_loss_coef * kl, metrics


def verl_grpo_advantage(
    scores: Sequence[float], index: Sequence[Any], epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True
) -> list[float]:
    """§2.5 compute_grpo_outcome_advantage: groups by equal index; a singleton has mean 0, std 1."""
    groups: dict[Any, list[float]] = {}
    for s, idx in zip(scores, index, strict=True):
        groups.setdefault(idx, []).append(float(s))
    stats = {
        idx: (0.0, 1.0) if len(g) == 1 else (statistics.fmean(g), statistics.stdev(g)) for idx, g in groups.items()
    }
    out = []
    for s, idx in zip(scores, index, strict=True):
        mean, std = stats[idx]
        out.append((float(s) - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else float(s) - mean)
    return out


# --- the library's own semantics, one token at a time -----------------------------------------------
@dataclass
class LoopResult:
    loss: Tensor
    ratio: list[list[float]]
    surrogate: list[list[float]]
    kl: list[list[float]]
    weight: list[list[float]]
    token_loss: list[list[float]]
    region: list[list[str]]


def _known(table: dict[str, Any], kind: str, name: str) -> Any:
    """table[name]; a name the loop reference does not know is an error, never a silent default."""
    if name not in table:
        raise KeyError(f"the loop reference has no {kind} {name!r}: add it to tests/reference.py")
    return table[name]


# Each objective for one token: (r, A, logp) -> (surrogate, region), as plain scalar code.
def _loop_clip(c: Any, r: Tensor, a: float, lp: Tensor) -> tuple[Tensor, str]:
    low, high = 1 - c.epsilon_low, 1 + c.epsilon_high
    capped = r if c.delta is None else torch.clamp(r, max=c.delta)
    surrogate = torch.minimum(capped * a, torch.clamp(r, low, high) * a)
    rv, region = r.item(), "trust"
    if a > 0 and rv > min(high, c.delta or math.inf):
        region = "clip_high"
    elif a < 0 and rv < low:
        region = "clip_low"
    elif a < 0 and rv > max(high, c.delta or math.inf):
        region = "dual_clip"
    if c.dual_clip is not None and a < 0:
        if surrogate.item() < c.dual_clip * a:
            region = "dual_clip"
        surrogate = torch.maximum(surrogate, torch.tensor(c.dual_clip * a, dtype=r.dtype))
    return surrogate, region


def _loop_cispo(c: Any, r: Tensor, a: float, lp: Tensor) -> tuple[Tensor, str]:
    absolute = {"absolute": True, "relative": False}[c.cispo_bounds]
    low, high = (None, c.epsilon_high) if absolute else (1 - c.epsilon_low, 1 + c.epsilon_high)
    w = torch.clamp(r, low, high).detach()
    region = "clip_low" if low is not None and r.item() < low else "clip_high" if r.item() > high else "trust"
    return w * a * lp, region


def _loop_sapo(c: Any, r: Tensor, a: float, lp: Tensor) -> tuple[Tensor, str]:
    tau = c.sapo_temperature_pos if a > 0 else c.sapo_temperature_neg
    return (4 / tau) * torch.sigmoid(tau * (r - 1)) * a, "trust"


def _loop_gpg(c: Any, r: Tensor, a: float, lp: Tensor) -> tuple[Tensor, str]:
    return a * lp, "trust"


LOOP_OBJECTIVES = {"clip": _loop_clip, "cispo": _loop_cispo, "sapo": _loop_sapo, "gpg": _loop_gpg}


def loop_evaluate(inputs: Inputs, config: Any, logp: Tensor | None = None) -> LoopResult:
    """What ``evaluate`` should compute for ``config`` (a LossConfig), written as plain loops."""
    c = config
    lp = leaf(inputs.logp) if logp is None else logp
    m = _mask(inputs.mask)
    B, T = len(m), len(m[0])
    L = [sum(row) for row in m]
    A = [float(a) for a in inputs.advantages]
    old, ref = inputs.old, inputs.ref
    zero = lp.new_zeros(())

    def log_ratio(i: int, t: int) -> Tensor:
        x = lp[i, t] - old[i, t]
        return x if c.log_ratio_clamp is None else torch.clamp(x, -c.log_ratio_clamp, c.log_ratio_clamp)

    def ratio_of(i: int, t: int) -> Tensor:
        if c.importance_sampling_level == "token":
            return torch.exp(log_ratio(i, t))
        total = zero
        for u in range(T):
            if m[i][u]:
                total = total + log_ratio(i, u)
        mean = total / max(L[i], 1)
        if c.seq_log_ratio_clamp is not None:
            mean = torch.clamp(mean, max=c.seq_log_ratio_clamp)
        return torch.exp(mean)

    # weights
    n_rows = sum(1 for x in L if x > 0) if c.skip_empty_rows else B
    n_rows = max(n_rows, 1)
    width = T

    weights: dict[str, Callable[[int], float]] = {
        "seq-mean-token-mean": lambda i: 1 / (n_rows * (max(L[i], 1) + c.length_epsilon)),
        "token-mean": lambda i: 1 / max(sum(L), 1),
        "seq-mean-token-sum": lambda i: 1 / n_rows,
        "seq-mean-token-sum-norm": lambda i: 1 / (n_rows * (c.max_completion_length or width)),
    }
    weight = _known(weights, "aggregation", c.aggregation)
    objective = _known(LOOP_OBJECTIVES, "objective", c.objective)

    shape = [[0.0] * T for _ in range(B)]
    out = LoopResult(zero, *([row[:] for row in shape] for _ in range(5)), [["masked"] * T for _ in range(B)])
    total = zero
    for i in range(B):
        for t in range(T):
            if not m[i][t]:
                continue
            r, a = ratio_of(i, t), A[i]
            surrogate, region = objective(c, r, a, lp[i, t])
            x = ref[i, t] - lp[i, t]
            if c.kl_log_ratio_clamp is not None:
                x = torch.clamp(x, -c.kl_log_ratio_clamp, c.kl_log_ratio_clamp)
            estimates = {"k1": -x, "k2": 0.5 * x * x, "k3": torch.exp(x) - x - 1, "abs": torch.abs(x)}
            kl = _known(estimates, "kl_estimator", c.kl_estimator)
            if c.kl_clamp is not None:
                kl = torch.clamp(kl, -c.kl_clamp, c.kl_clamp)
            if c.kl_gradient == "k2":  # verl's "+" types: this value, the gradient of ½(logp - ref)², unclamped
                k2 = 0.5 * (lp[i, t] - ref[i, t]) ** 2
                kl = k2 - k2.detach() + kl.detach()
            if c.kl_bias_correction:
                kl = kl * r
            w_i = weight(i)
            token = w_i * (-surrogate + c.beta * kl)
            total = total + token
            out.ratio[i][t], out.surrogate[i][t], out.kl[i][t] = r.item(), surrogate.item(), kl.item()
            out.weight[i][t], out.token_loss[i][t], out.region[i][t] = w_i, token.item(), region
    out.loss = total
    return out


# --- the hand batch and helpers ---------------------------------------------------------------------
# The hand batch (float64), used by the hand-derived tests across files:
#
#     row 0, A = +1: pi = 0.3, 0.45, [padding]   pi_old = 0.2, 0.5      -> r = 1.5, 0.9
#     row 1, A = -1: pi = 0.1, 0.55, 0.8         pi_old = 0.2, 0.5, 0.2 -> r = 0.5, 1.1, 4.0
#     pi_ref = pi except at the first token of each row:
#         row 0: pi_ref = 0.6  -> x = ln(pi_ref / pi) = ln 2
#         row 1: pi_ref = 0.05 -> x = ln(1/2)
#
# With epsilon 0.2 the trust region is [0.8, 1.2]: r = 1.5 (A > 0) is clipped high, r = 0.5 (A < 0)
# clipped low, r = 0.9 and 1.1 are inside, r = 4.0 with A < 0 is unclipped by PPO and capped by a
# dual clip c = 3. The padding holds NaN: it must never be read.
LN = math.log
NAN = float("nan")
HAND: dict[str, Any] = {
    "per_token_logps": [[LN(0.3), LN(0.45), NAN], [LN(0.1), LN(0.55), LN(0.8)]],
    "old_per_token_logps": [[LN(0.2), LN(0.5), NAN], [LN(0.2), LN(0.5), LN(0.2)]],
    "ref_per_token_logps": [[LN(0.6), LN(0.45), NAN], [LN(0.05), LN(0.55), LN(0.8)]],
    "completion_mask": [[1, 1, 0], [1, 1, 1]],
    "advantages": [1.0, -1.0],
}
HAND_RATIOS = [[1.5, 0.9, 0.0], [0.5, 1.1, 4.0]]
K3_ROW0 = 1 - LN(2)  # e^x - x - 1 at x = ln 2:   2 - ln 2 - 1
K3_ROW1 = LN(2) - 0.5  # at x = -ln 2: 1/2 + ln 2 - 1


def evaluate64(batch: grpo.Batch, preset: str = "article", **overrides: Any) -> grpo.Breakdown:
    return grpo.evaluate(batch, grpo.LossConfig.from_preset(preset, dtype="float64", **overrides))


def close(actual: Any, expected: Any, rtol: float = 1e-12, atol: float = 1e-14) -> None:
    """assert_close in float64 with explicit tolerances (defaults: float64 round-off)."""
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        rtol=rtol,
        atol=atol,
    )


# --- tolerances that follow from the computation ---------------------------------------------------
# Two computations of one formula differ by round-off: a few ulps of each term they add, and the
# order of the sums, which differs between CPU kernel sets (AVX-512 reduces 8 or 16 lanes at a time,
# AVX2 4, the default kernels one) and between a vectorised pass and a loop. A sum of n terms t_i
# agrees to about n·eps·Σ|t_i| in any order, so an absolute tolerance must scale with the size of
# the terms that cancel, not with the size of the result: at ref - logp = 25, k3's gradient
# -(e^x - 1)·r + (e^x - x - 1)·r = -x·r is a difference of terms near e^25 ≈ 7e10.
# ULPS bounds n (at most 6 x 7 tokens in these tests) times the few roundings of each term.
ULPS = 64


def eps(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps)


def _counted(x: Tensor, mask: Tensor) -> Tensor:
    return torch.nan_to_num(x.detach().to(torch.float64), nan=0.0) * (mask > 0)


def term_scales(inputs: Inputs, weight: Tensor, beta: float, sequence: bool = False) -> dict[str, Tensor]:
    """Bounds on the terms summed into each counted token's loss and gradient, (B, T) each.

    A token's loss is w·(-A·s + beta·k(x)·c), with r = e^(logp - old), x = ref - logp and c = r
    (TRL's bias correction) or 1. Its gradient adds w·A·r·s'(r) and beta·w·(k'(x)·c, k(x)·c').
    Every objective keeps |s| and |r·s'| within r + 4 + |logp| (clip: r; SAPO: 4/τ; CISPO and GPG:
    |logp|), r being the token's ratio or, at ``sequence`` level, the row's exp(mean log-ratio);
    every estimator keeps |k|, |k'| within e^x + x² + |x| + 1. The clamps only make terms smaller.
    ``policy`` and ``kl`` (without w and beta) per token; ``token`` = |w|·(policy + beta·kl).
    """
    mask = inputs.mask
    logp, old, ref = (_counted(t, mask) for t in (inputs.logp, inputs.old, inputs.ref))
    counted = mask > 0
    log_ratio = logp - old
    if sequence:  # (B, T) -> (B, 1), the row's mean log-ratio
        log_ratio = log_ratio.sum(-1, keepdim=True) / counted.sum(-1, keepdim=True).clamp(min=1)
    r = log_ratio.exp()
    x = ref - logp
    A = inputs.advantages.to(torch.float64).abs()[:, None]
    policy = A * (r + 4 + logp.abs()) * counted
    kl = (x.exp() + x.square() + x.abs() + 1) * (1 + r) * counted
    token = weight.detach().to(torch.float64).abs() * (policy + beta * kl)
    return {"policy": policy, "kl": kl, "token": token}


def close_to_scale(actual: Any, expected: Any, scale: Any, rtol: float, floor: float, dtype: torch.dtype) -> None:
    """Elementwise |actual - expected| <= rtol·|expected| + floor + ULPS·eps(dtype)·scale.

    ``scale`` (broadcastable) is the size of the terms that cancel in each element; ``floor`` the
    absolute tolerance of a result of order 1.
    """
    a = torch.as_tensor(actual, dtype=torch.float64).detach()
    e = torch.as_tensor(expected, dtype=torch.float64).detach()
    assert a.shape == e.shape, (a.shape, e.shape)
    allowed = rtol * e.abs() + floor + ULPS * eps(dtype) * torch.as_tensor(scale, dtype=torch.float64)
    bad = ~((a - e).abs() <= allowed)  # NaN on either side fails
    if bad.any():
        i = tuple(int(k) for k in bad.nonzero()[0]) if bad.dim() else ()
        raise AssertionError(
            f"{int(bad.sum())} of {bad.numel()} elements differ; first at {i}: actual {float(a[i])!r}, "
            f"expected {float(e[i])!r}, difference {float((a - e).abs()[i]):.3g} > allowed {float(allowed[i]):.3g}"
        )


def metric_scale(name: str, scales: dict[str, Tensor], inputs: Inputs) -> float:
    """The size of the per-token terms a metric sums or averages (1 for fractions and counts)."""
    if name == "kl":
        return float(scales["kl"].max())
    if name == "actor/ppo_kl":
        return float(_counted(inputs.logp - inputs.old, inputs.mask).abs().max())
    if name in ("actor/pg_loss", "actor/kl_loss"):
        return float(scales["token"].sum() + scales["kl"].sum())
    return 1.0


def close_breakdown(
    bd: grpo.Breakdown,
    inputs: Inputs,
    loss: Any,
    grad: Any,
    metrics: dict[str, float],
    rtol: float,
    floor: float,
) -> None:
    """A Breakdown against a reference's loss, gradient and metrics, each to the round-off of the
    terms it is made of (see term_scales)."""
    dtype = bd.loss.dtype
    sequence = bd.config.importance_sampling_level == "sequence"
    scales = term_scales(inputs, bd.tokens.weight, bd.config.beta, sequence)
    close_to_scale(bd.loss, loss, scales["token"].sum(), rtol, floor, dtype)
    close_to_scale(bd.tokens.grad, grad, scales["token"], rtol, floor, dtype)
    for name, value in metrics.items():
        close_to_scale(bd.metrics[name], value, metric_scale(name, scales, inputs), rtol, floor, dtype)
