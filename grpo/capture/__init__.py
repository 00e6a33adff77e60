"""Record real trainers' loss calls into runs (``grpo.runs``), without touching the trainer's code.

    with grpo.capture.trl(trainer, "runs/my-run"):
        trainer.train()

    with grpo.capture.verl("runs/my-verl-run") as cap:
        ...  # verl's actor computes its losses; cap.next_step() after each optimiser step

The modules are named ``trl_hooks`` and ``verl_hooks`` so that they never shadow the ``trl`` and
``verl`` packages; ``trl`` and ``verl`` here are functions.
"""

from grpo.capture.trl_hooks import trl
from grpo.capture.verl_hooks import VerlCapture, verl

__all__ = ["VerlCapture", "trl", "verl"]
