"""The lab: a tiny GRU policy trained with GRPO on synthetic tasks, one ``grpo.compute_loss`` per step.

from grpo.lab import LabConfig, train
metrics = train(LabConfig(task="count", steps=150, seed=0))
metrics[-1]["reward"], metrics[-1]["loss"]
"""

from grpo.lab.comparisons import COMPARISONS, Comparison
from grpo.lab.policy import VOCAB, Policy, Rollout, frozen_copy, init_policy, sample
from grpo.lab.tasks import DEFAULT_TASK, TASKS, Task, get_task
from grpo.lab.train import METRICS, LabConfig, Trainer, run, train

__all__ = [
    "COMPARISONS",
    "DEFAULT_TASK",
    "METRICS",
    "TASKS",
    "VOCAB",
    "Comparison",
    "LabConfig",
    "Policy",
    "Rollout",
    "Task",
    "Trainer",
    "frozen_copy",
    "get_task",
    "init_policy",
    "run",
    "sample",
    "train",
]
