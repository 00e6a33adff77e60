"""Capture verl 0.9.1's loss calls: ``with grpo.capture.verl(run_dir) as cap: ...``.

verl's actor (``verl.workers.utils.losses.ppo_loss``) composes each micro-batch's loss from three
functions of ``verl.trainer.ppo.core_algos``, which the hooks wrap while the block runs:
- the registered policy loss (``POLICY_LOSS_REGISTRY[loss_mode]``, as ``get_policy_loss_fn`` returns
  it): log-probs, old log-probs, advantages, mask, the actor config and its ``global_batch_info``,
  and the ``pg_loss`` and metrics it returns;
- ``kl_penalty``: the reference log-probs and the estimator;
- ``agg_loss`` (outside the policy loss): the aggregated KL (and entropy) terms.
The micro-batch's loss is then ``pg_loss + kl_loss_coef · kl_loss − entropy_coeff · entropy_loss``,
exactly what ``ppo_loss`` returns. A record is written when the next policy-loss call starts, at
``cap.next_step()``, and when the block ends. Steps count from 1; ``next_step()`` starts the next
optimiser step (or pass ``micro_batches_per_step`` to count them).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import Tensor

import grpo.capture.verl_driver as verl_driver
from grpo.config import LossConfig
from grpo.runs import RunWriter, Sampling, package_versions
from grpo.trainer_config import map_verl


def _float(value: Any) -> float:
    return float(value.detach()) if isinstance(value, Tensor) else float(value)


class VerlCapture:
    """The state of one ``grpo.capture.verl`` block: the writer, the step and micro counters."""

    def __init__(self, make_writer: Callable[[], RunWriter], micro_batches_per_step: int | None) -> None:
        self._make_writer = make_writer
        self._writer: RunWriter | None = None
        self.micro_batches_per_step = micro_batches_per_step
        self.step = 1
        self.micro = 0
        self.pending: dict[str, Any] | None = None
        self.in_policy = 0
        self.unsupported: dict[str, str] = {}

    @property
    def writer(self) -> RunWriter:
        """The run's writer, made at its first use (a Ray worker knows its rank only once verl set it up)."""
        if self._writer is None:
            self._writer = self._make_writer()
        return self._writer

    @property
    def started(self) -> bool:
        """Whether a loss call was seen (a writer made, or a record pending)."""
        return self._writer is not None or self.pending is not None

    def next_step(self) -> None:
        """The optimiser stepped: later loss calls belong to the next step."""
        self.flush()
        self.step += 1
        self.micro = 0

    # --- hooks -------------------------------------------------------------------------------
    def policy_hook(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.flush()
            names = ("old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode", "config")
            call = dict(zip(names, args, strict=False)) | kwargs
            self.in_policy += 1
            try:
                pg_loss, pg_metrics = fn(*args, **kwargs)
            finally:
                self.in_policy -= 1
            # read the values now: ppo_loss adds the KL and entropy terms to pg_loss in place
            metrics = {k: _float(v) for k, v in pg_metrics.items()}
            # and the config now: ppo_loss rewrites global_batch_info for every micro-batch
            actor = call["config"]
            mapping = map_verl(actor)
            self.unsupported |= mapping.unsupported
            info = dict(getattr(actor, "global_batch_info", None) or {})
            self.pending = {
                "call": call,
                "pg_loss": _float(pg_loss),
                "pg_metrics": metrics,
                "config": _with_batch_info(mapping.config, info),
                "scaling": {k: (None if v is None else _float(v)) for k, v in info.items() if k != "loss_scale_factor"},
            }
            return pg_loss, pg_metrics

        return wrapped

    def kl_hook(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
            out: Tensor = fn(logprob, ref_logprob, kl_penalty)
            if self.pending is not None and not self.in_policy:
                self.pending |= {"ref_log_prob": ref_logprob, "kl_type": kl_penalty, "kld": out}
            return out

        return wrapped

    def agg_hook(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(loss_mat: Tensor, *args: Any, **kwargs: Any) -> Tensor:
            out: Tensor = fn(loss_mat, *args, **kwargs)
            if self.pending is not None and not self.in_policy:
                key = "kl_loss" if loss_mat is self.pending.get("kld") else "entropy_loss"
                self.pending[key] = _float(out)
                if key == "entropy_loss":  # the model output's entropies (B, T), as the bonus reads them
                    self.pending["entropies"] = loss_mat.detach()
            return out

        return wrapped

    # --- recording ------------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the pending micro-batch, if any."""
        record, self.pending = self.pending, None
        if record is None:
            return
        if not self.writer.wants(self.step):  # sampled out (or the byte budget is spent): counted, not written
            self.writer.skipped += 1
            self._next_micro()
            return
        call = record["call"]
        actor = call["config"]
        # the policy loss's tensors under verl's names, the batch table's aliases (log_prob, old_log_prob,
        # response_mask; advantages (B, T) per token, kept as they are), any other registered field it was handed
        # included: the step schema (grpo.step_schema) keeps the fields, renamed, and leaves the rest
        tensors: dict[str, Any] = {k: v for k, v in call.items() if isinstance(v, Tensor)}
        tensors["response_mask"] = call["response_mask"].bool()
        config = record["config"]
        weights = call.get("rollout_is_weights")
        driver = self.writer.run_dir / verl_driver.DRIVER_DIR
        joined = verl_driver.join(self.writer.run_dir, call["old_log_prob"]) if driver.is_dir() else None
        if joined is not None:  # the driver's view of these rows: the correction is recomputed from the sampler
            tensors |= {"sampling_per_token_logps": joined.sampler, "response_mask": joined.mask.bool()}
            config = dataclasses.replace(config, **joined.settings)
            if weights is not None:  # what verl applied, compared token by token by check-run
                tensors["importance_sampling_ratio"] = weights.detach()
        elif weights is not None:
            self.unsupported["rollout_is_weights"] = (
                "the IS weights verl computed on the driver: no driver record holds this call's rows (capture the "
                "driver too: grpo.capture.verl around the trainer's fit, or the plugin in the driver's environment)"
            )
        pg_loss = record["pg_loss"]
        loss = pg_loss
        metrics = record["pg_metrics"] | {"actor/pg_loss": pg_loss}
        if "kl_loss" in record and "ref_log_prob" in record:
            tensors["ref_log_prob"] = record["ref_log_prob"]
            kl_loss = record["kl_loss"]
            loss += float(actor.kl_loss_coef) * kl_loss
            metrics |= {"actor/kl_loss": kl_loss, "actor/kl_coef": float(actor.kl_loss_coef)}
        if "entropy_loss" in record:
            tensors["entropies"] = record["entropies"]
            loss -= float(actor.entropy_coeff) * record["entropy_loss"]
            metrics["actor/entropy_loss"] = record["entropy_loss"]  # as ppo_loss returns it: agg_loss(entropy)
        meta = {"loss": loss, "metrics": metrics, "scaling": record["scaling"]}
        epochs = getattr(actor, "ppo_epochs", None)
        if isinstance(epochs, int):
            # the passes over each rollout; which rollout and pass this call is, the loss functions do not see
            meta["rollout"] = {"iterations": epochs}
        self.writer.write_step(self.step, self.micro, tensors, meta, config=config)
        if self.unsupported != self.writer.info.get("unsupported", {}):  # said at once: a Ray worker may never exit
            self.writer.update(unsupported=dict(self.unsupported))
        self._next_micro()

    def _next_micro(self) -> None:
        self.micro += 1
        if self.micro_batches_per_step and self.micro >= self.micro_batches_per_step:
            self.step += 1
            self.micro = 0


def _with_batch_info(config: LossConfig, info: Any) -> LossConfig:
    """The config with verl's global normalisers (spec §2.2): agg_loss divides by them and multiplies by dp_size."""
    dp = _float(info.get("dp_size") or 1)
    tokens, rows = info.get("batch_num_tokens"), info.get("global_batch_size")
    return dataclasses.replace(
        config,
        token_normalizer=None if tokens is None else _float(tokens) / dp,
        sequence_normalizer=None if rows is None else _float(rows) / dp,
    )


def install(cap: VerlCapture, run_dir: str | Path | None = None) -> Callable[[], None]:
    """Wrap verl's registered policy losses, ``kl_penalty`` and ``agg_loss`` with ``cap``'s hooks, in every verl
    module already imported (modules imported later bind the wrapped functions by name), and, with ``run_dir``,
    the driver's rollout correction (``verl_driver``: imported where it is called); return the undo."""
    from verl.trainer.ppo import core_algos, rollout_corr_helper

    driver_fn = "compute_rollout_correction_and_add_to_batch"  # ray_trainer imports it by name at each call
    correction = getattr(rollout_corr_helper, driver_fn)
    if run_dir is not None:
        setattr(rollout_corr_helper, driver_fn, verl_driver.hook(run_dir, correction))

    registry = core_algos.POLICY_LOSS_REGISTRY
    saved_registry = dict(registry)
    patched: list[tuple[Any, str, Any]] = []
    originals = {"kl_penalty": core_algos.kl_penalty, "agg_loss": core_algos.agg_loss}
    hooks = {"kl_penalty": cap.kl_hook(core_algos.kl_penalty), "agg_loss": cap.agg_hook(core_algos.agg_loss)}
    for name, fn in saved_registry.items():
        registry[name] = cap.policy_hook(fn)
    for module in [m for n, m in list(sys.modules.items()) if n.startswith("verl") and m is not None]:
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                patched.append((module, name, original))
                setattr(module, name, hooks[name])

    def remove() -> None:
        setattr(rollout_corr_helper, driver_fn, correction)
        registry.clear()
        registry.update(saved_registry)
        for module, name, original in patched:
            setattr(module, name, original)
        # modules first imported inside the block bound the hooks by name: give them the originals
        for module in [m for n, m in list(sys.modules.items()) if n.startswith("verl") and m is not None]:
            for name, hook in hooks.items():
                if getattr(module, name, None) is hook:
                    setattr(module, name, originals[name])

    return remove


def world_size(rank: int | None) -> int:
    """How many processes train: torch.distributed's world, else the ``WORLD_SIZE`` variable, else one (and
    never fewer than ``rank`` + 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    size = os.environ.get("WORLD_SIZE", "")
    return max(int(size) if size.isdigit() else 1, (rank or 0) + 1)


def verl_writer(run_dir: str | Path, rank: int | None, sampling: Sampling) -> RunWriter:
    """The process's writer (run.json: rank 0's, captured or not); sampling that chooses none of the run's
    ranks or steps warns and is said in run.json (``capture.chooses_nothing``)."""
    writer = RunWriter(
        run_dir,
        "verl",
        LossConfig.from_preset("verl-grpo"),
        versions=package_versions("verl"),
        rank=rank,
        sampling=sampling,
        resume=True,
    )
    writer.check_sampling(world_size(rank), who="grpo.capture.verl")
    return writer


def finish(cap: VerlCapture, status: str) -> None:
    """Write what is pending and say how the capture ended in run.json (with the last call's config)."""
    cap.flush()
    writer = cap.writer
    writer.close()
    if status != "done":
        writer.update(status=status, unsupported=cap.unsupported)
        return
    # run.json's config: the config of the last call (the actor's), without per-call normalisers
    last = load_last_config(writer)
    writer.update(status="done", unsupported=cap.unsupported, **({"config": last} if last else {}))


@contextmanager
def verl(
    run_dir: str | Path,
    micro_batches_per_step: int | None = None,
    rank: int | None = None,
    every: int | None = None,
    steps: Iterable[int] | None = None,
    ranks: Iterable[int] | None = None,
    max_bytes: int | None = None,
) -> Iterator[VerlCapture]:
    """Record verl 0.9.1's policy-loss, KL and aggregation calls made inside the block into ``run_dir``.

    ``every``, ``steps``, ``ranks`` and ``max_bytes`` choose what is recorded of a long run, as for
    ``grpo.capture.trl``; a job restarted into the same ``run_dir`` resumes it without overwriting.
    (In verl's Ray workers, where no block can be opened: ``grpo.capture.verl_plugin``.)"""
    writer = verl_writer(run_dir, rank, Sampling.of(every, steps, ranks, max_bytes))
    cap = VerlCapture(lambda: writer, micro_batches_per_step)
    remove = install(cap, run_dir)
    try:
        yield cap
    except BaseException:
        finish(cap, "failed")
        raise
    else:
        finish(cap, "done")
    finally:
        remove()
        verl_driver.clear(run_dir)


def load_last_config(writer: RunWriter) -> dict[str, Any] | None:
    from grpo.runs import load_run, load_step

    run = load_run(writer.run_dir)
    if not run.steps:
        return None
    config = load_step(run.steps[-1].path)[1]
    return dataclasses.replace(config, token_normalizer=None, sequence_normalizer=None).to_dict()


__all__ = ["VerlCapture", "verl"]
