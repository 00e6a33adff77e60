"""Capture inside verl's Ray workers: the ``verl.plugins`` entry point ``grpo_lens`` (pyproject.toml).

verl trains in Ray worker processes, where no ``with grpo.capture.verl(...)`` block of the driver reaches.
verl 0.9.1 loads every entry point of the group ``verl.plugins`` in every process that imports it (unless
``VERL_USE_EXTERNAL_PLUGINS`` says otherwise), so this module runs in each worker as verl is imported.

With ``GRPO_LENS_CAPTURE_DIR`` set in the worker's environment (pass it through Ray's ``runtime_env``, e.g.
``ray.init(runtime_env={"env_vars": {"GRPO_LENS_CAPTURE_DIR": "/shared/runs/my-run"}})``), the capture's hooks
are installed for the life of the process and each worker writes its own files into that run directory:
``-rank{r}`` from the rank verl gives the worker (``torch.distributed``, else the ``RANK`` variable), steps
numbered by the worker's optimiser steps (torch's global optimizer-step hook: each ``optimizer.step()`` in
the process ends a step; a process stepping other optimisers too, a colocated critic, counts those as well).
Set in the driver's environment too, the driver records verl's rollout correction
(``grpo.capture.verl_driver``), which the workers' files join. ``GRPO_LENS_CAPTURE_EVERY`` and
``GRPO_LENS_CAPTURE_MAX_BYTES`` sample a long run as ``grpo.capture.verl``'s ``every`` and ``max_bytes`` do.
Records are written at each step's end; the last status is written when the
process exits normally (a worker killed by ``ray.shutdown()`` keeps ``running``).

Unset: this module imports nothing beyond ``os`` and does nothing.
"""

from __future__ import annotations

import os

CAPTURE_DIR = "GRPO_LENS_CAPTURE_DIR"
CAPTURE_EVERY = "GRPO_LENS_CAPTURE_EVERY"
CAPTURE_MAX_BYTES = "GRPO_LENS_CAPTURE_MAX_BYTES"


def worker_rank() -> int | None:
    """This process's rank among the trainer's workers: torch.distributed's, else verl's ``RANK`` variable."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def start(run_dir: str) -> object:
    """Install the capture in this process for its whole life; the capture (``VerlCapture``)."""
    import atexit

    from torch.optim.optimizer import register_optimizer_step_post_hook

    from grpo.capture.verl_hooks import VerlCapture, finish, install, verl_writer
    from grpo.runs import Sampling

    every, max_bytes = os.environ.get(CAPTURE_EVERY), os.environ.get(CAPTURE_MAX_BYTES)
    sampling = Sampling.of(every=int(every) if every else None, max_bytes=int(max_bytes) if max_bytes else None)
    cap = VerlCapture(lambda: verl_writer(run_dir, worker_rank(), sampling), micro_batches_per_step=None)
    install(cap, run_dir)  # in the driver, verl's rollout correction is recorded (verl_driver)
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: cap.next_step())
    atexit.register(lambda: finish(cap, "done") if cap.started else None)
    return cap


if os.environ.get(CAPTURE_DIR):
    start(os.environ[CAPTURE_DIR])
