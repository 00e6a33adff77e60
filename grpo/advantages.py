"""Advantage estimators: rewards of one group of G completions -> one advantage per completion.

Every estimator takes ``rewards`` of shape (n_groups, G) (consecutive rows of the batch form a
group) and the ``epsilon`` added to the standard deviation, and returns (n_groups, G). The
standard deviation is the unbiased (Bessel) one in TRL, verl and OpenRLHF alike. A group of one
completion gets mean 0 and std 1, as in verl (``compute_grpo_outcome_advantage``), so its
advantage is its raw reward; TRL refuses such groups (``num_generations >= 2``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from grpo.registry import Registry

Advantage = Callable[[Tensor, float], Tensor]
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
def group(rewards: Tensor, epsilon: float) -> Tensor:
    """GRPO: (R - group mean) / (group std + eps), the standard group-relative advantage.

    Paper: https://arxiv.org/abs/2402.03300
    """
    return (rewards - group_mean(rewards)) / (unbiased_std(rewards) + epsilon)


@ADVANTAGES.register("batch", label="batch std (Lite PPO)", reward_std=batch_std)
def batch(rewards: Tensor, epsilon: float) -> Tensor:
    """Lite PPO: (R - group mean) / (batch std + eps); a global scale, not a per-group one.

    TRL ``scale_rewards="batch"``: the mean is still per group, the std is over the whole batch.
    Paper: https://arxiv.org/abs/2508.08221
    """
    return (rewards - group_mean(rewards)) / (unbiased_std(rewards, dim=None) + epsilon)


@ADVANTAGES.register("none", label="no std (Dr. GRPO)", reward_std=group_std_mean)
def none(rewards: Tensor, epsilon: float) -> Tensor:
    """Dr. GRPO: R - group mean, with no division by the std (which biases by difficulty).

    TRL ``scale_rewards="none"``, verl ``norm_adv_by_std_in_grpo=False``; ``epsilon`` is unused.
    Paper: https://arxiv.org/abs/2503.20783
    """
    return rewards - group_mean(rewards)
