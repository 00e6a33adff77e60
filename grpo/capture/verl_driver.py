"""verl's rollout correction on the driver, joined to the actor's loss calls.

verl 0.9.1 corrects for the sampler on the driver, over the whole batch, before the actor splits it into
micro-batches (``ray_trainer.py`` calls ``rollout_corr_helper.compute_rollout_correction_and_add_to_batch``):
IS weights (token or sequence, truncated or IcePop-masked, divided by the whole batch's mean when
``rollout_is_batch_normalize``) and the rejection (``rollout_rs``), which it folds into ``response_mask``. The
actor's loss call then sees the weights and the mask after rejection only: not the sampler's log-probs, not
the mask before, not the batch's mean.

The hook here records, at each driver call, the batch's old and sampler log-probs, its mask before rejection,
the correction's settings and the batch's normaliser (``run_dir/driver/``; the newest ``KEEP`` records, deleted
when the capture ends: a run's files stay what the run store accepts). The actor's capture (``verl_hooks``)
finds each row of a loss call among them by its old log-probs' bytes (verl splits the batch by rows without
touching them) and writes the step file with the sampler's log-probs, the mask before rejection, the settings
and the normaliser, and the weights verl applied as the trainer's ``importance_sampling_ratio``: GRPO Lens
recomputes the weights and the rejection from the sampler, and check-run compares both with verl's. The driver
and the workers share the run directory (one machine, or a shared filesystem).
"""

from __future__ import annotations

import atexit
import json
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from grpo.config import LossConfig
from grpo.corrections import CORRECTIONS, batch_normalizer, sampler_log_ratio
from grpo.trainer_config import map_verl

DRIVER_DIR = "driver"
KEEP = 2  # the actor trains on a batch right after the driver corrects it: the newest records are enough
SETTINGS = (
    "rollout_correction",
    "rollout_is_min",
    "rollout_is_max",
    "rollout_is_log_ratio_clamp",
    "rollout_is_batch_normalize",
    "rollout_rs",
    "rollout_rs_threshold",
)


def _row_keys(old: Tensor) -> list[bytes]:
    rows = old.detach().to("cpu", torch.float32).contiguous()
    return [row.numpy().tobytes() for row in rows]


def whole_batch_normalizer(old: Tensor, sampler: Tensor, mask: Tensor, config: LossConfig) -> float | None:
    """The mean verl divides the IS weights by (``rollout_is_batch_normalize``), over the whole batch, in float64;
    None when the weights are not normalised."""
    if not config.rollout_is_batch_normalize or config.rollout_correction == "none":
        return None
    old64, sampler64, mask64 = (t.detach().to("cpu", torch.float64) for t in (old, sampler, mask))
    log_ratio = sampler_log_ratio(old64, sampler64, mask64)
    weights = CORRECTIONS.get(config.rollout_correction)(log_ratio, mask64, config).weight
    return float(batch_normalizer(weights, mask64, None))


def record(run_dir: str | Path, batch: Any, rollout_corr_config: Any) -> Path:
    """Write one driver call's record (atomically) and drop all but the newest ``KEEP``; its path."""
    config = map_verl({}, {"rollout_correction": rollout_corr_config}).config  # verl's settings, checked
    settings = {name: getattr(config, name) for name in SETTINGS}
    old, sampler = batch.batch["old_log_probs"], batch.batch["rollout_log_probs"]
    mask = batch.batch["response_mask"].to(torch.float32)
    normalizer = whole_batch_normalizer(old, sampler, mask, config)
    folder = Path(run_dir) / DRIVER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    number = 1 + max((int(p.stem.split("-")[1]) for p in folder.glob("correction-*.safetensors")), default=0)
    path = folder / f"correction-{number:06d}.safetensors"
    tensors = {
        "old_log_probs": old.detach().to("cpu", torch.float32).contiguous(),
        "rollout_log_probs": sampler.detach().to("cpu", torch.float32).contiguous(),
        "response_mask": mask.detach().cpu().contiguous(),
    }
    meta = {"settings": json.dumps(settings), "normalizer": json.dumps(normalizer)}
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file(tensors, temp, metadata=meta)
    os.replace(temp, path)
    for stale in sorted(folder.glob("correction-*.safetensors"))[:-KEEP]:
        stale.unlink(missing_ok=True)
    return path


def hook(run_dir: str | Path, fn: Any) -> Any:
    """``compute_rollout_correction_and_add_to_batch`` that records its batch before verl changes the mask."""

    def wrapped(batch: Any, rollout_corr_config: Any) -> Any:
        if not recorded:  # the process that records clears its records when it exits (a driver under the plugin)
            recorded.append(atexit.register(clear, run_dir))
        record(run_dir, batch, rollout_corr_config)
        return fn(batch, rollout_corr_config)

    recorded: list[Any] = []

    return wrapped


def clear(run_dir: str | Path) -> None:
    """Remove the driver's records (the capture ended: the step files hold what they joined)."""
    folder = Path(run_dir) / DRIVER_DIR
    for path in folder.glob("correction-*.safetensors"):
        path.unlink(missing_ok=True)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


@dataclass(frozen=True)
class Joined:
    """A loss call's rows as the driver saw them."""

    sampler: Tensor
    """(B, T) the sampler's log-probs."""
    mask: Tensor
    """(B, T) the response mask before the rejection."""
    settings: dict[str, Any]
    """The LossConfig fields of the correction, with ``rollout_is_normalizer`` (the batch's)."""


_loaded: OrderedDict[str, tuple[dict[str, Tensor], dict[str, Any], dict[bytes, int]]] = OrderedDict()


def _records(run_dir: str | Path) -> list[tuple[dict[str, Tensor], dict[str, Any], dict[bytes, int]]]:
    """The driver records on disk, newest first, each loaded once per process (the newest ``KEEP`` kept)."""
    paths = sorted((Path(run_dir) / DRIVER_DIR).glob("correction-*.safetensors"), reverse=True)[:KEEP]
    out = []
    for path in paths:
        key = str(path)
        if key not in _loaded:
            try:
                tensors = load_file(path)
                with safe_open(str(path), "pt") as f:
                    meta = f.metadata()
            except (OSError, ValueError):
                continue  # removed meanwhile: the newer records hold the rows
            extra = {"settings": json.loads(meta["settings"]), "normalizer": json.loads(meta["normalizer"])}
            index = {k: i for i, k in reversed(list(enumerate(_row_keys(tensors["old_log_probs"]))))}
            _loaded[key] = (tensors, extra, index)
            while len(_loaded) > KEEP:
                _loaded.popitem(last=False)
        out.append(_loaded[key])
    return out


def join(run_dir: str | Path, old_log_prob: Tensor) -> Joined | None:
    """The driver's view of a loss call's rows (found by their old log-probs), or None when no record holds
    them all (the driver was not captured, or the actor reshaped the rows)."""
    keys = _row_keys(old_log_prob)
    for tensors, extra, index in _records(run_dir):
        if tensors["old_log_probs"].shape[-1] != old_log_prob.shape[-1] or not all(k in index for k in keys):
            continue
        rows = torch.tensor([index[k] for k in keys], dtype=torch.long)
        settings = {k: v for k, v in extra["settings"].items() if k in SETTINGS}
        device = old_log_prob.device
        return Joined(
            sampler=tensors["rollout_log_probs"][rows].to(device, old_log_prob.dtype),
            mask=tensors["response_mask"][rows].to(device),
            settings=settings | {"rollout_is_normalizer": extra["normalizer"]},
        )
    return None


__all__ = ["DRIVER_DIR", "Joined", "clear", "hook", "join", "record"]
