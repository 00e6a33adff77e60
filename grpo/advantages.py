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
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo.errors import GrpoInputError
from grpo.registry import Registry

Advantage = Callable[..., Tensor]  # (rewards (n, G), epsilon, lengths (n, G) | None = None) -> (n, G)
ADVANTAGES: Registry[Advantage] = Registry("advantage")


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


@ADVANTAGES.register("reinforce-pp-baseline", label="REINFORCE++ baseline", reward_std=group_std_mean)
def reinforce_pp_baseline(rewards: Tensor, epsilon: float, lengths: Tensor | None = None) -> Tensor:
    """REINFORCE++ with baseline: R - group mean, then whitened over the batch's counted tokens.

    verl ``reinforce_plus_plus_baseline``: each row's value is written on its tokens and
    ``masked_whiten`` takes the mean and the unbiased variance over all of them, so a long
    completion weighs more in both; (v - mean)·rsqrt(var + 1e-8). ``epsilon`` is unused.
    Paper: https://arxiv.org/abs/2501.03262
    """
    weights = _counted(rewards, lengths)
    centred = rewards - group_mean(rewards)
    tokens = weights.sum()
    if tokens < 2:
        raise GrpoInputError(
            "completion_mask", "at least 2 counted tokens in the batch to whiten over", got=str(int(tokens))
        )
    mean = _token_mean(centred, weights)
    var = _token_mean((centred - mean).square(), weights) * (tokens / (tokens - 1))
    return (centred - mean) * torch.rsqrt(var + 1e-8)


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
