"""Advantage estimators: rewards of one group of G completions -> one advantage per completion.

Every estimator takes ``rewards`` of shape (n_groups, G) (consecutive rows of the batch form a
group; the whole batch, so an estimator may use batch statistics), the ``epsilon`` added to the
standard deviation, and ``lengths`` (n_groups, G), each row's counted tokens (None: all equal), and
returns (n_groups, G). The standard deviation is the unbiased (Bessel) one in TRL, verl and
OpenRLHF alike. A group of one completion gets mean 0 and std 1, as in verl
(``compute_grpo_outcome_advantage``), so its advantage is its raw reward; TRL refuses such groups
(``num_generations >= 2``).

verl 0.9.1's outcome estimators that need nothing but these (``algorithm.adv_estimator``): grpo
(``group``, ``none`` without the std), rloo, grpo_passk (``passk``, ``passk-no-std``),
reinforce_plus_plus_baseline, opo and gpg; verl writes each row's value on its every token.

Estimators that read more take a keyword ``inputs`` (AdvantageInputs) and name the batch fields they need
in their entry (``needs``): GDPO and TRL's normalize_then_sum read the rewards per reward function (n, G, K)
and their weights, ReMax the greedy baselines (``reward_baselines``), REINFORCE++ the counted tokens and
``gamma`` (it gives each token its own discounted return, (B, T): ``per_token``). Rewards given per function
reach the others combined as TRL's default ``sum_then_normalize`` combines them, Σ_k w_k·r_k.

``compute_advantages`` gives a batch's advantages as the loss reads them (BatchAdvantages): the batch's own, per
row or per token, or its rewards' by the chosen estimator, with the reward metrics and the zero-std groups.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from grpo.batch import Batch
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.registry import AdvantageRegistry

if TYPE_CHECKING:  # grpo.config imports this module for its registry
    from grpo.config import LossConfig

Advantage = Callable[..., Tensor]  # (rewards (n, G), epsilon, lengths (n, G) | None = None) -> (n, G)
ADVANTAGES: AdvantageRegistry[Advantage] = AdvantageRegistry("advantage")


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read beyond the rewards (the keyword ``inputs``, for those that declare it)."""

    per_function: Tensor
    """(n, G, K): the rewards per reward function ((n, G, 1) when the batch gives one reward per row)."""
    weights: Tensor
    """(K,): the reward functions' weights (reward_weights; all 1 when not given)."""
    mask: Tensor
    """(B, T) 1.0 where a token counts (B = n·G)."""
    gamma: float
    """The discount of a per-token return (verl algorithm.gamma)."""
    baselines: Tensor | None = None
    """(n, G): ReMax's greedy rewards (reward_baselines), None when the batch has none."""
    old: Tensor | None = None
    """(B, T): the old (sampling) policy's log-probs (the current ones when the batch has none)."""
    sum_pi_squared: Tensor | None = None
    """(B, T): Σ_v π(v)² of the distribution that scored each token (None when the batch has none)."""
    token_rewards: Tensor | None = None
    """(B, T): the rewards on tokens (token_level_rewards), None when the batch gives them per row."""


def takes_inputs(fn: Advantage) -> bool:
    """Whether an estimator reads AdvantageInputs (a keyword ``inputs``); the older ones take three arguments."""
    return "inputs" in inspect.signature(fn).parameters


def group_mean(rewards: Tensor) -> Tensor:
    """Mean over each group (last dim); 0 for a group of one (verl's rule). (n, G) -> (n, 1)."""
    mean = rewards.mean(dim=-1, keepdim=True)
    return mean if rewards.shape[-1] > 1 else torch.zeros_like(mean)


def unbiased_std(x: Tensor, dim: int | None = -1) -> Tensor:
    """Bessel-corrected std over ``dim`` (None: all elements); 1 where there is one element."""
    n = x.shape[dim] if dim is not None else x.numel()
    if n < 2:
        return torch.ones_like(x.mean(dim=dim, keepdim=dim is not None))
    return x.std(dim=dim, keepdim=dim is not None) if dim is not None else x.std()


def group_std_mean(rewards: Tensor) -> Tensor:
    """TRL's reward_std under group (and no) scaling: the mean of the per-group stds. (n, G) -> ()"""
    return unbiased_std(rewards).mean()


def batch_std(rewards: Tensor) -> Tensor:
    """TRL's reward_std under batch scaling: the std over the whole batch. (n, G) -> ()"""
    return unbiased_std(rewards, dim=None)


@ADVANTAGES.register("group", label="group (GRPO)", reward_std=group_std_mean)
def group(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """GRPO: (R - group mean) / (group std + eps), the standard group-relative advantage.

    Paper: https://arxiv.org/abs/2402.03300
    """
    return (rewards - group_mean(rewards)) / (unbiased_std(rewards) + epsilon)


@ADVANTAGES.register("batch", label="batch std (Lite PPO)", reward_std=batch_std)
def batch(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """Lite PPO: (R - group mean) / (batch std + eps); a global scale, not a per-group one.

    TRL ``scale_rewards="batch"``: the mean is still per group, the std is over the whole batch.
    Paper: https://arxiv.org/abs/2508.08221
    """
    return (rewards - group_mean(rewards)) / (unbiased_std(rewards, dim=None) + epsilon)


@ADVANTAGES.register("none", label="no std (Dr. GRPO)", reward_std=group_std_mean)
def none(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """Dr. GRPO: R - group mean, with no division by the std (which biases by difficulty).

    TRL ``scale_rewards="none"``, verl ``norm_adv_by_std_in_grpo=False``; ``epsilon`` is unused.
    Paper: https://arxiv.org/abs/2503.20783
    """
    return rewards - group_mean(rewards)


def _counted(rewards: Tensor, lengths: Tensor | None) -> Tensor:
    return torch.ones_like(rewards) if lengths is None else lengths.to(rewards.dtype)


@ADVANTAGES.register("rloo", label="RLOO (leave-one-out)", reward_std=group_std_mean)
def rloo(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """RLOO: R minus the mean of the group's other rewards, G/(G-1)·(R - group mean); no std.

    verl ``rloo`` (and ``rloo_vectorized``); a group of one keeps its raw reward.
    Paper: https://arxiv.org/abs/2402.14740
    """
    G = rewards.shape[-1]
    if G == 1:
        return rewards.clone()
    return rewards * G / (G - 1) - rewards.mean(dim=-1, keepdim=True) * G / (G - 1)


def _passk(rewards: Tensor, epsilon: float, by_std: bool) -> Tensor:
    G = rewards.shape[-1]
    if G < 2:
        raise GrpoInputError("group_size", "at least 2 completions per group for pass@k", got=str(G))
    top, where = torch.topk(rewards, 2, dim=-1)
    gap = top[:, :1] - top[:, 1:]  # (n, 1): best minus second best; 0 on a tie, whichever row is "best"
    if by_std:
        gap = gap / (unbiased_std(rewards) + epsilon)
    return torch.zeros_like(rewards).scatter_(-1, where[:, :1], gap)


@ADVANTAGES.register("passk", label="pass@k (best minus second, / std)", reward_std=group_std_mean)
def passk(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """Pass@k: only the group's best completion gets an advantage, (best - second best) / (std + eps).

    verl ``grpo_passk`` with ``norm_adv_by_std_in_grpo=True``; groups need two completions.
    Paper: https://arxiv.org/abs/2503.19595
    """
    return _passk(rewards, epsilon, by_std=True)


@ADVANTAGES.register("passk-no-std", label="pass@k (best minus second)", reward_std=group_std_mean)
def passk_no_std(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """Pass@k without the std: the best completion gets best - second best, the rest 0.

    verl ``grpo_passk`` with ``norm_adv_by_std_in_grpo=False``.
    Paper: https://arxiv.org/abs/2503.19595
    """
    return _passk(rewards, epsilon, by_std=False)


def _token_mean(values: Tensor, weights: Tensor) -> Tensor:
    """verl's ``masked_mean`` of a per-row value written on each of its tokens: Σ w·v / (Σ w + 1e-8)."""
    return (values * weights).sum() / (weights.sum() + 1e-8)


def whiten_tokens(values: Tensor, weights: Tensor) -> Tensor:
    """verl's ``masked_whiten``: (v - mean)·rsqrt(var + 1e-8) with the mean and the unbiased variance over the
    counted tokens, each value weighing by its tokens (``weights``: a row's length for a per-row value, the
    0/1 mask for a per-token one)."""
    tokens = weights.sum()
    if tokens < 2:
        raise GrpoInputError(
            "completion_mask", "at least 2 counted tokens in the batch to whiten over", got=str(int(tokens))
        )
    mean = _token_mean(values, weights)
    var = _token_mean((values - mean).square(), weights) * (tokens / (tokens - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


@ADVANTAGES.register("reinforce-pp-baseline", label="REINFORCE++ baseline", reward_std=group_std_mean)
def reinforce_pp_baseline(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """REINFORCE++ with baseline: R - group mean, then whitened over the batch's counted tokens.

    verl ``reinforce_plus_plus_baseline``: each row's value is written on its tokens and
    ``masked_whiten`` takes the mean and the unbiased variance over all of them, so a long
    completion weighs more in both; (v - mean)·rsqrt(var + 1e-8). ``epsilon`` is unused.
    Paper: https://arxiv.org/abs/2501.03262
    """
    return whiten_tokens(rewards - group_mean(rewards), _counted(rewards, lengths))


@ADVANTAGES.register("opo", label="OPO (length-weighted baseline)", reward_std=group_std_mean)
def opo(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """OPO: R minus the group's length-weighted mean reward Σ len·R / Σ len (the optimal baseline
    for a sequence-level policy gradient); no std. A group of one keeps its raw reward.

    verl ``opo``. ``epsilon`` is unused.
    Paper: https://arxiv.org/abs/2505.23585
    """
    if rewards.shape[-1] == 1:
        return rewards.clone()
    weights = _counted(rewards, lengths)
    baseline = (weights * rewards).sum(dim=-1, keepdim=True) / weights.sum(dim=-1, keepdim=True)
    return rewards - baseline


@ADVANTAGES.register("gpg", label="GPG (batch-rescaled)", reward_std=group_std_mean)
def gpg(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """GPG: α·(R - group mean) with α = batch size / the number of nonzero rewards (at least 1),
    which scales a batch of mostly-zero rewards back up; no std.

    verl ``gpg`` (its ``f_norm`` is 1). ``epsilon`` is unused. α is a float32 number whatever the rewards'
    dtype, as verl's ``bsz / count_nonzero(scores)`` makes it.
    Paper: https://arxiv.org/abs/2504.02546
    """
    alpha = rewards.numel() / torch.count_nonzero(rewards).clamp(min=1)
    return alpha * (rewards - group_mean(rewards))


# --- estimators that read more than one reward per row ------------------------------------------------
def _per_function(rewards: Tensor, inputs: AdvantageInputs | None) -> AdvantageInputs:
    if inputs is None:  # called on its own: one reward function, weight 1
        mask = torch.ones(rewards.numel(), 1, dtype=rewards.dtype, device=rewards.device)
        return AdvantageInputs(rewards[..., None], torch.ones(1, dtype=rewards.dtype), mask, 1.0)
    return inputs


@ADVANTAGES.register("gdpo", label="GDPO (per-reward GRPO, whitened)", reward_std=group_std_mean)
def gdpo(
    rewards: Tensor, epsilon: float, lengths: Tensor | None = None, inputs: AdvantageInputs | None = None
) -> Tensor:
    """GDPO: each reward function's rewards normalised within the group, (r_k - mean) / (std + eps), then
    Σ_k w_k·A_k, whitened over the batch's counted tokens as REINFORCE++ baseline is.

    verl ``gdpo`` (``gdpo_reward_keys``, ``gdpo_reward_weights``): its GRPO per reward key, then
    ``masked_whiten`` (token-weighted mean and unbiased variance, rsqrt(var + 1e-8)). With one reward per
    row it is GRPO then the whitening, as verl's fallback to the token-level rewards. Always by the std:
    verl's trainer calls it without its norm_adv_by_std_in_grpo (the function's default, True).
    Paper: https://arxiv.org/abs/2601.05242
    """
    given = _per_function(rewards, inputs)
    normalised = group(given.per_function.movedim(-1, 0), epsilon)  # (n, G, K) -> (K, n, G), GRPO per function
    weights = given.weights.to(normalised.dtype)[:, None, None]
    return whiten_tokens((weights * normalised).sum(0), _counted(rewards, lengths))


@ADVANTAGES.register("normalize-then-sum", label="normalise per reward, then sum", reward_std=batch_std)
def normalize_then_sum(
    rewards: Tensor, epsilon: float, lengths: Tensor | None = None, inputs: AdvantageInputs | None = None
) -> Tensor:
    """TRL's multi_objective_aggregation="normalize_then_sum": each reward function's rewards normalised
    within the group, (r_k - mean) / (std + eps), summed with reward_weights, then normalised over the batch,
    (s - batch mean) / (batch std + eps).

    TRL 1.16 ``GRPOTrainer._generate_and_score_completions``; std unbiased (its ``nanstd``); a group of one
    gets std 0, a batch of one too. The same eps at both steps (TRL's 1e-4).
    Paper: https://arxiv.org/abs/2601.05242
    """
    given = _per_function(rewards, inputs)
    scores = given.per_function  # (n, G, K)
    G = scores.shape[1]
    mean = scores.mean(dim=1, keepdim=True)
    std = scores.std(dim=1, keepdim=True) if G > 1 else torch.zeros_like(mean)
    summed = (((scores - mean) / (std + epsilon)) * given.weights.to(scores.dtype)).sum(-1)  # (n, G)
    spread = summed.std() if summed.numel() > 1 else torch.zeros((), dtype=summed.dtype)
    return (summed - summed.mean()) / (spread + epsilon)


@ADVANTAGES.register(
    "remax", label="ReMax (minus the greedy reward)", reward_std=group_std_mean, needs=("reward_baselines",)
)
def remax(
    rewards: Tensor, epsilon: float, lengths: Tensor | None = None, inputs: AdvantageInputs | None = None
) -> Tensor:
    """ReMax: R minus the reward of the prompt's greedy completion (reward_baselines), no std.

    verl ``remax``: the return (the outcome reward, on every token up to it) minus the baseline. ``epsilon``
    is unused.
    Paper: https://arxiv.org/abs/2310.10505
    """
    if inputs is None or inputs.baselines is None:
        raise GrpoInputError("reward_baselines", "the greedy completion's reward per row: advantage remax reads it")
    if inputs.token_rewards is not None:  # verl's return is the reward-to-go: one per row only when it is constant
        togo = reward_to_go(inputs.token_rewards.to(rewards.dtype), inputs.mask.to(rewards.dtype))
        if bool(((togo - rewards.reshape(-1, 1)) * inputs.mask).ne(0).any()):
            raise GrpoInputError(
                "token_level_rewards", "advantage remax: rewards on each row's last counted token only (one per row)"
            )
    return rewards - inputs.baselines.to(rewards.dtype)


def reward_to_go(rewards: Tensor, mask: Tensor) -> Tensor:
    """Σ_(s >= t) r_s·m_s at every position t, as verl's remax and optimal token baseline take it. (B, T)."""
    return (rewards * mask).flip(-1).cumsum(-1).flip(-1)


@ADVANTAGES.register("reinforce-pp", label="REINFORCE++ (discounted return)", per_token=True)
def reinforce_pp(
    rewards: Tensor, epsilon: float, lengths: Tensor | None = None, inputs: AdvantageInputs | None = None
) -> Tensor:
    """REINFORCE++: each token's discounted return γ^k·R (k: the row's counted tokens after it; the reward sits
    on the row's last counted token), whitened over the batch's counted tokens. (B, T): one per token.

    verl ``reinforce_plus_plus`` (``algorithm.gamma``): the return runs back over the counted tokens and
    carries across masked ones, then ``masked_whiten``. ``epsilon`` is unused; no group baseline.
    Paper: https://arxiv.org/abs/2501.03262
    """
    if inputs is None:
        raise GrpoInputError("completion_mask", "the counted tokens: advantage reinforce-pp returns one per token")
    mask = inputs.mask.to(rewards.dtype)
    if inputs.token_rewards is not None:
        returns = discounted_returns(inputs.token_rewards.to(mask.dtype), mask, inputs.gamma)
    else:  # the row's reward on its last counted token: its return γ^k·R in closed form
        after = mask.flip(-1).cumsum(-1).flip(-1) - mask  # counted tokens after each position
        returns = rewards.reshape(-1, 1) * torch.pow(torch.as_tensor(inputs.gamma, dtype=mask.dtype), after) * mask
    return whiten_tokens(returns, mask) * mask


SCAN_CHUNK = 32  # positions a chunk of the return's scan runs over one by one (the loop's length, not the row's)


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + γ·G_(next counted token) on each counted token, 0 elsewhere; a masked span (an observation)
    carries the return across unchanged. verl's loop over the positions as a chunked scan. (B, T); mask 0/1.

    The running return obeys G_t = m_t·r_t + a_t·G_(t+1), a_t = γ on a counted token and 1 on a masked one
    (verl's ``new·m + running·(1 - m)``, the same numbers for a 0/1 mask), so ``linear_scan`` runs it back and the
    counted tokens keep theirs."""
    a = torch.where(mask > 0, torch.as_tensor(gamma, dtype=rewards.dtype, device=rewards.device), 1.0)
    return linear_scan(rewards * mask, a) * mask


def linear_scan(b: Tensor, a: Tensor, chunk: int = SCAN_CHUNK) -> Tensor:
    """y_t = b_t + a_t·y_(t+1) along the last dim, y past the end 0, for 0 <= a <= 1. (B, N) -> (B, N).

    Chunks of ``chunk`` positions run back at once, each one position at a time (verl's arithmetic: a row no
    longer than a chunk gets its numbers exactly), giving each chunk's return with nothing carried in and the
    factor Π a (a power of γ no higher than the chunk's length: no γ^-k, nothing overflows) by which what comes
    after reaches each position; the chunks' own recurrence (one value per chunk) is the same scan, one level
    up, and its values carry back into every chunk. ⌈log_chunk N⌉ levels of ``chunk`` steps each: the work grows
    with B·N, the Python steps with log N."""
    rows, length = b.shape
    if length <= chunk:
        y = torch.empty_like(b)
        running = torch.zeros_like(b[:, 0])
        for t in reversed(range(length)):
            running = b[:, t] + a[:, t] * running
            y[:, t] = running
        return y
    n = -(-length // chunk)
    pad = n * chunk - length
    # (B, N) -> (chunk, B, n): the t-th position of every chunk is one contiguous slice
    bs, as_ = (F.pad(x, (0, pad)).reshape(rows, n, chunk).permute(2, 0, 1).contiguous() for x in (b, a))
    local, reach = torch.empty_like(bs), torch.empty_like(as_)
    running, factor = torch.zeros_like(bs[0]), torch.ones_like(as_[0])
    for t in reversed(range(chunk)):  # chunk steps, each over every chunk at once: (B, n)
        running = bs[t] + as_[t] * running
        factor = as_[t] * factor
        local[t], reach[t] = running, factor  # y_t = local_t + reach_t·(the return at the next chunk's start)
    starts = linear_scan(running, factor, chunk)  # (B, n): the return at each chunk's first position
    after = F.pad(starts[:, 1:], (0, 1))  # (B, n): what the next chunk carries in
    y = local + reach * after  # (chunk, B, n)
    return y.permute(1, 2, 0).reshape(rows, n * chunk)[:, :length]


OTB_EPSILON = 1e-8  # verl's default for compute_optimal_token_baseline_advantage (its trainer passes none)


@ADVANTAGES.register(
    "optimal-token-baseline", label="optimal token baseline", needs=("sum_pi_squared",), per_token=True
)
def optimal_token_baseline(
    rewards: Tensor, epsilon: float, lengths: Tensor | None = None, inputs: AdvantageInputs | None = None
) -> Tensor:
    """Optimal token baseline: each token's return minus a baseline per response position, the group's
    returns weighted by each path's cumulative variance W_t = Σ_{j<=t} (1 - 2π_j + Σπ²_j). (B, T).

    verl ``optimal_token_baseline`` (``actor.calculate_sum_pi_squared``): π_j from the old log-probs, Σπ² per
    token (``sum_pi_squared``; the logits path computes it), B_t = Σ_i G_t·W_t / (Σ_i W_t + 1e-8) over the
    group's rows at position t, 0 for a group of one; the longest row, when it alone is the longest, gets
    baseline 0 past the second longest (``handle_zero_tail``). Positions are the batch's columns (verl's
    response layout). No rollout IS weights; ``epsilon`` is unused.
    Paper: https://arxiv.org/abs/2510.16880
    """
    if inputs is None or inputs.sum_pi_squared is None or inputs.old is None:
        raise GrpoInputError("sum_pi_squared", "Σπ² per token: advantage optimal-token-baseline reads it")
    mask = inputs.mask.to(rewards.dtype)
    n, G = rewards.shape
    B, T = mask.shape
    positions = torch.arange(T, device=mask.device)
    if inputs.token_rewards is not None:  # the reward-to-go of the rewards on tokens
        returns = reward_to_go(inputs.token_rewards.to(mask.dtype), mask)
    else:  # the reward on the row's last counted token: R up to it
        last = torch.where(mask > 0, positions, -1).amax(-1)
        returns = rewards.reshape(B, 1) * (positions[None, :] <= last[:, None]).to(mask.dtype)
    w = 1 - 2 * inputs.old.to(mask.dtype).exp() + inputs.sum_pi_squared.to(mask.dtype)
    cumulative = (w * mask).cumsum(-1)
    g, W, m = (x.reshape(n, G, T) for x in (returns, cumulative, mask))
    baseline = (g * W * m).sum(1, keepdim=True) / ((W * m).sum(1, keepdim=True) + OTB_EPSILON)  # (n, 1, T)
    baseline = baseline.expand(n, G, T) if G > 1 else torch.zeros_like(g)
    if G > 1:  # handle_zero_tail: a group's one longest row gets 0 past the second longest
        length = m.sum(-1)  # (n, G)
        top = length.topk(2, dim=-1).values  # (n, 2)
        alone = ((length == top[:, :1]).sum(-1) == 1) & (top[:, 0] > top[:, 1])
        longest = (length == top[:, :1]) & alone[:, None]  # (n, G)
        tail = longest[:, :, None] & (positions[None, None, :] >= top[:, 1, None, None])
        baseline = baseline.masked_fill(tail, 0.0)
    return ((g - baseline) * m).reshape(B, T)


# --- the batch's advantages: given, or from its rewards by the chosen estimator ---------------------------------


@dataclass(frozen=True)
class BatchAdvantages:
    """The batch's advantages on the compute device, with what the breakdown reports of them."""

    values: Tensor
    """(B,) one per row, or (B, T) when the batch gives them per token (0 where nothing counts)."""
    reward: Tensor | None
    metrics: dict[str, float]
    zero_std_groups: tuple[int, ...]
    group_size: int

    @property
    def per_token(self) -> bool:
        return self.values.dim() == 2

    def on_tokens(self) -> Tensor:
        """(B, 1) or (B, T): what the objectives multiply each token's term by (broadcast over the row)."""
        return self.values if self.per_token else self.values[:, None]

    def of_rows(self, mask: Tensor) -> Tensor:
        """(B,): one per row; given per token, a row's value where it is the same on every counted token
        (bit for bit the per-row input's), else its mean over them (0 for a row with none)."""
        if not self.per_token:
            return self.values
        return row_values(self.values, mask)


def row_values(per_token: Tensor, mask: Tensor) -> Tensor:
    """(B, T) per-token values -> (B,): the row's value where its counted tokens agree, else their mean.
    ``mask`` (B, T) 0.0/1.0 (or bool)."""
    weights = mask.to(per_token.dtype)
    first = per_token.gather(-1, weights.argmax(-1, keepdim=True)).squeeze(-1)  # first counted token's value
    length = weights.sum(-1)
    varies = ((per_token != first[:, None]) & (weights > 0)).any(-1)
    mean = (per_token * weights).sum(-1) / length.clamp(min=1)
    return torch.where(varies, mean, first * (length > 0))


def compute_advantages(batch: Batch, config: LossConfig, device: torch.device, dtype: torch.dtype) -> BatchAdvantages:
    """Advantages (B,) from the batch: given (per row, or per token (B, T)), or from rewards by
    ``config.advantage``."""
    B = batch.shape[0]
    G = int(batch.group_size or B)
    if batch.rewards is None:
        assert batch.advantages is not None  # the Batch holds exactly one of the two
        return BatchAdvantages(batch.advantages.to(device, dtype), None, {}, (), G)
    entry = ADVANTAGES.entry(config.advantage)
    missing = [name for name in entry.needs if name not in batch.extra]
    if missing:
        doc = BATCH_FIELDS[missing[0]].doc.rstrip(".")
        raise GrpoInputError(missing[0], f"{doc}: advantage {config.advantage} reads it")
    per_function, weights = reward_columns(batch, device, dtype)
    rewards = (per_function * weights).sum(-1)  # TRL's Σ_k w_k·r_k (one reward function: r, as given)
    grouped = rewards.view(-1, G)  # (B,) -> (B/G, G)
    lengths = batch.mask.sum(dim=-1).to(device, dtype).view(-1, G)  # counted tokens per row
    if takes_inputs(entry.fn):
        baselines = batch.extra.get("reward_baselines")
        given = AdvantageInputs(
            per_function=per_function.view(-1, G, per_function.shape[-1]),
            weights=weights,
            mask=batch.mask_float.to(device, dtype),
            gamma=config.gamma,
            baselines=None if baselines is None else baselines.to(device, dtype).view(-1, G),
            old=(batch.per_token_logps if batch.old_per_token_logps is None else batch.old_per_token_logps)
            .detach()
            .to(device, dtype),
            sum_pi_squared=batch.extra.get("sum_pi_squared"),
            token_rewards=batch.extra.get("token_level_rewards"),
        )
        values = entry.fn(grouped, config.advantage_epsilon, lengths, inputs=given)
    else:
        values = entry.fn(grouped, config.advantage_epsilon, lengths)
    values = values.reshape(batch.shape) if entry.per_token else values.reshape(B)
    group_std = unbiased_std(grouped)  # (B/G, 1)
    zero = (
        torch.isclose(group_std, torch.zeros_like(group_std)).reshape(-1)
        if G > 1
        else torch.zeros(B // G, dtype=torch.bool, device=device)
    )
    spread = ADVANTAGES.entry(config.advantage).reward_std or group_std_mean  # TRL's reward_std
    metrics = {
        "reward": float(rewards.mean()),
        "reward_std": float(spread(grouped)),
        "frac_reward_zero_std": float(zero.to(dtype).mean()),
    }
    zero_groups = tuple(int(g) for g in zero.nonzero().flatten().tolist())
    return BatchAdvantages(values, rewards, metrics, zero_groups, G)


def reward_columns(batch: Batch, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(rewards (B, K), weights (K,)): the batch's rewards per reward function (K = 1 for one per row) and
    reward_weights (all 1 when not given), whose length must be K."""
    assert batch.rewards is not None
    rewards = batch.rewards.to(device, dtype)
    per_function = rewards if rewards.dim() == 2 else rewards[:, None]
    K = per_function.shape[-1]
    given = batch.extra.get("reward_weights")
    if given is None:
        return per_function, torch.ones(K, device=device, dtype=dtype)
    weights = given.to(device, dtype).reshape(-1)
    if weights.numel() != K:
        raise GrpoInputError(
            "reward_weights",
            f"{K} weights, one per reward function (rewards has {K} per row)",
            got=f"{weights.numel()}",
        )
    return per_function, weights
