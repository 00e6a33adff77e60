"""``python -m grpo import slime`` against slime's own loss, when a slime source tree is at hand.

slime cannot be installed here (it needs Megatron-LM, SGLang and Ray), so CI skips this file. Given ``SLIME_SRC``
(a checkout or source snapshot, e.g. THUDM/slime at commit 624b824, the one ``grpo.importers.slime`` was read
from), it loads from there, unchanged: ``slime/backends/megatron_utils/loss.py`` (``loss_function``,
``policy_loss_function``, ``vanilla_tis_function``, ``icepop_function``) with ``cp_utils.py``,
``slime/utils/ppo_utils.py``, ``misc.py``, ``types.py`` and ``distributed_utils.py`` it imports;
``slime/utils/dp_schedule.py`` (``build_dp_schedule``: which samples go to which rank, micro-batch and optimiser
step); ``slime/observability/train_data_utils.py`` (``_build_dump_payload``: the format 2 dump file itself) and
``train_metric_utils.py`` (``reduce_train_step_metrics``: the step's loss as slime logs it). Stood in:
- ``megatron.core`` by a minimal ``mpu`` with set world sizes: context parallel 1, data parallel ``DP`` (1 or 2);
- every other module those files import but never call on this path (wandb logging, HTTP helpers, FLOPs) by an
  empty one;
- ``get_log_probs_and_entropy`` (logits -> the current policy's log-probs, which the dump does not hold) by a
  function handing slime the dump's ``log_probs`` as the current policy's, as the import takes them;
- the Ray rollout side's ``rollout_mask_sums`` (``slime/ray/rollout.py``, which imports Ray and SGLang) and
  ``DataIterator.get_next`` (``data.py``) by their few lines, quoted below;
- the all-reduce of ``reduce_train_step_metrics`` by a no-op, with the virtual ranks' values joined first, as
  slime's own tests of it do.
Each step's loss as slime logs it is compared with the import's ``check_run`` step loss (each step file under
its own config, joined over the rank files as check-run joins them) to float32 round-off.

Run: SLIME_SRC=/path/to/slime .venv/bin/python -m pytest tests/test_slime_parity.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo.check import check_run
from grpo.importers.slime import import_slime
from grpo.runs import load_run

SRC = os.environ.get("SLIME_SRC")
pytestmark = [
    pytest.mark.numerical,
    pytest.mark.skipif(SRC is None, reason="SLIME_SRC is not set: slime cannot be installed here"),
]

PACKAGES = ("slime", "slime.utils", "slime.backends", "slime.backends.megatron_utils", "slime.observability")
STOOD_IN = (
    "slime.utils.http_utils",
    "slime.observability.logging_utils",
    "slime.observability.metric_utils",
    "slime.observability.timer",
    "slime.utils.flops_utils",
)
LOADED = (
    "slime.utils.misc",
    "slime.utils.types",
    "slime.utils.distributed_utils",
    "slime.utils.ppo_utils",
    "slime.utils.seqlen_balancing",
    "slime.utils.dp_schedule",
    "slime.backends.megatron_utils.cp_utils",
    "slime.backends.megatron_utils.loss",
    "slime.observability.train_data_utils",
    "slime.observability.train_metric_utils",
)


class _Placeholder:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


def _module(name: str, path: Path | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = [str(path)] if path is not None else []

    def placeholder(attr: str) -> type:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder

    module.__getattr__ = placeholder  # type: ignore[method-assign]
    return module


class Mpu(types.ModuleType):
    """megatron.core.mpu with set world sizes: no context or tensor parallelism, ``dp`` data-parallel ranks."""

    dp = 1

    def get_context_parallel_world_size(self) -> int:
        return 1

    def get_context_parallel_rank(self) -> int:
        return 0

    def get_tensor_model_parallel_world_size(self) -> int:
        return 1

    def get_data_parallel_world_size(self, with_context_parallel: bool = False) -> int:
        return self.dp


MPU = Mpu("megatron.core.mpu")


def _load(name: str, root: Path) -> types.ModuleType:
    path = root.joinpath(*name.split(".")).with_suffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def slime() -> Any:
    root = Path(str(SRC))
    names = ("megatron", "megatron.core", "megatron.core.mpu", *PACKAGES, *STOOD_IN, *LOADED)
    saved = {k: sys.modules[k] for k in names if k in sys.modules}
    try:
        core = _module("megatron.core")
        core.mpu = MPU  # type: ignore[attr-defined]
        sys.modules |= {"megatron": _module("megatron"), "megatron.core": core, "megatron.core.mpu": MPU}
        for name in PACKAGES:  # packages as bare namespaces: their __init__ (Megatron patches, CUDA) is not run
            sys.modules[name] = _module(name, root.joinpath(*name.split(".")))
        for name in STOOD_IN:
            sys.modules[name] = _module(name)
        yield types.SimpleNamespace(**{name.rsplit(".", 1)[1]: _load(name, root) for name in LOADED})
    finally:
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


# --- one rollout, as slime's rollout side and actor hold it ---------------------------------------------------
def rollout(seed: int, n: int = 8, siblings: bool = False, far: float = 0.05) -> dict[str, Any]:
    """n samples of 1..9 response tokens (one with an empty loss mask), rewards, per-token advantages (one value
    per sample), the sampler's log-probs ``far`` from the actor's, a reference; ``siblings``: samples 0-1 and
    4-6 each one rollout (a compact rollout emitting several training samples)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 10, (n,), generator=g).tolist()
    masks = [(torch.rand(n_, generator=g) > 0.2).int() for n_ in lengths]
    masks[3] = torch.zeros(lengths[3], dtype=torch.int)  # every token masked: slime counts it as 1 token
    logp = [-(torch.rand(n_, generator=g) * 2 + 0.05) for n_ in lengths]
    rollout_ids = list(range(n))
    if siblings:
        rollout_ids = [0, 0, 1, 2, 3, 3, 3, 4][:n]
    adv = torch.randn(n, generator=g)
    return {
        "tokens": [torch.randint(0, 50, (n_ + 3,), generator=g) for n_ in lengths],
        "response_lengths": lengths,
        "total_lengths": [n_ + 3 for n_ in lengths],
        "loss_masks": masks,
        "rewards": torch.rand(n, generator=g).tolist(),
        "rollout_ids": rollout_ids,
        "log_probs": logp,
        "rollout_log_probs": [(x + far * torch.randn(len(x), generator=g)).clamp(max=-1e-4) for x in logp],
        "ref_log_probs": [(x + 0.3 * torch.randn(len(x), generator=g)).clamp(max=-1e-4) for x in logp],
        "advantages": [torch.full((n_,), float(a)) for n_, a in zip(lengths, adv, strict=True)],
    }


def mask_sums(data: dict[str, Any]) -> list[int]:
    """slime/ray/rollout.py ``_convert_samples_to_train_data``: each sample's rollout's loss-mask total."""
    rollout_total_mask: dict[int, int] = {}
    for rid, ms in zip(data["rollout_ids"], [int(m.sum()) for m in data["loss_masks"]], strict=True):
        rollout_total_mask[rid] = rollout_total_mask.get(rid, 0) + ms
    return [rollout_total_mask[rid] for rid in data["rollout_ids"]]


def shards(slime: Any, data: dict[str, Any], dp: int, global_batch_size: int) -> list[dict[str, Any]]:
    """Each data-parallel rank's rollout_data, split by slime's own ``build_dp_schedule`` (static micro-batches of
    2 samples)."""
    args = Namespace(use_dynamic_batch_size=False, micro_batch_size=2, balance_data=False, balance_by_flops=False)
    config = {"dp_size": dp, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    partitions, mbs, num_mbs, sizes = slime.dp_schedule.build_dp_schedule(
        args, config, data["total_lengths"], global_batch_size=global_batch_size, rollout_indices=data["rollout_ids"]
    )
    sums = mask_sums(data)
    out = []
    for r in range(dp):
        local: dict[str, Any] = {k: [v[j] for j in partitions[r]] for k, v in data.items()}
        local["rollout_mask_sums"] = torch.tensor([sums[j] for j in partitions[r]], dtype=torch.float32)
        local |= {"partition": partitions[r], "micro_batch_indices": mbs[r], "num_microbatches": num_mbs}
        out.append(local | {"global_batch_sizes": sizes})
    return out


# slime/utils/arguments.py's defaults at 624b824 for what loss_function and policy_loss_function read
ARGUMENTS: dict[str, Any] = {
    "loss_type": "policy_loss",
    "advantage_estimator": "grpo",
    "eps_clip": 0.2,
    "eps_clip_high": None,
    "eps_clip_c": None,
    "use_kl_loss": False,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "k1",
    "use_unbiased_kl": False,
    "entropy_coef": 0.0,
    "calculate_per_token_loss": False,
    "use_rollout_logprobs": False,
    "use_tis": False,
    "get_mismatch_metrics": False,
    "custom_tis_function_path": None,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "use_opsm": False,
    "custom_pg_loss_reducer_function_path": None,
    "rollout_top_p": 1.0,
    "allgather_cp": False,
    "recompute_loss_function": False,
}


def slime_args(settings: dict[str, Any]) -> Namespace:
    a = {**ARGUMENTS, **settings}
    if a["eps_clip_high"] is None:  # slime/utils/arguments.py: eps_clip_high defaults to eps_clip
        a["eps_clip_high"] = a["eps_clip"]
    return Namespace(**a)


def slime_step_losses(
    slime: Any, monkeypatch: Any, settings: dict[str, Any], ranks: list[dict[str, Any]]
) -> list[float]:
    """Each optimiser step's loss as slime logs it: ``loss_function`` on every micro-batch of every rank, joined
    by ``reduce_train_step_metrics``."""
    args = slime_args(settings)
    current: list[torch.Tensor] = []

    def log_probs(logits: torch.Tensor, **kwargs: Any) -> tuple[None, dict[str, list[torch.Tensor]]]:
        return None, {
            "log_probs": [x.clone().requires_grad_(True) for x in current],
            "entropy": [x * 0 for x in current],
        }

    monkeypatch.setattr(slime.loss, "get_log_probs_and_entropy", log_probs)
    monkeypatch.setattr(slime.train_metric_utils.dist, "all_reduce", lambda *a, **k: None)
    MPU.dp = len(ranks)
    steps = len(ranks[0]["num_microbatches"])
    out = []
    for s in range(steps):
        logged = []
        for rd in ranks:
            first = sum(rd["num_microbatches"][:s])
            for indices in rd["micro_batch_indices"][first : first + rd["num_microbatches"][s]]:
                batch = {k: [rd[k][i] for i in indices] for k in KEYS if k in rd}  # data.py DataIterator.get_next
                batch["unconcat_tokens"] = batch["tokens"]  # data.py get_batch
                current[:] = batch["log_probs"]
                _, _, log = slime.loss.loss_function(
                    args, batch, rd["num_microbatches"][s], rd["global_batch_sizes"][s], torch.zeros(1, 1, 1)
                )
                logged.append(log)
        reduced = slime.train_metric_utils.reduce_train_step_metrics(
            logged,
            calculate_per_token_loss=args.calculate_per_token_loss,
            step_global_batch_size=ranks[0]["global_batch_sizes"][s],
            cp_size=1,
            dp_with_cp_group=None,
        )
        out.append(reduced["loss"])
    return out


# the keys model.py's forward_step asks get_batch for (partition only when dumping; unconcat_tokens: get_batch's)
KEYS = (
    "tokens",
    "total_lengths",
    "response_lengths",
    "loss_masks",
    "log_probs",
    "ref_log_probs",
    "advantages",
    "rollout_log_probs",
    "rollout_mask_sums",
)


def dump(slime: Any, tmp_path: Path, ranks: list[dict[str, Any]], fmt: int) -> Path:
    """The dump slime writes: format 2 through its own ``_build_dump_payload``, format 1 as ``save_debug_train_data``
    before 681b3ad (``slime/utils/train_dump_utils.py``: ``dict(rollout_id=, rank=, rollout_data=)`` per rank)."""
    d = tmp_path / "dump"
    d.mkdir()
    if fmt == 2:
        dp_shards = [{"rank": r, "data_parallel_rank": r, "rollout_data": rd} for r, rd in enumerate(ranks)]
        torch.save(slime.train_data_utils._build_dump_payload(dp_shards, rollout_id=0, writer_rank=0), d / "0.pt")
    else:
        for r, rd in enumerate(ranks):
            torch.save({"rollout_id": 0, "rank": r, "rollout_data": rd}, d / f"0_{r}.pt")
    return d


def imported_step_losses(tmp_path: Path, d: Path, settings: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(each step's loss, the size of its terms) from ``check_run`` of the imported run."""
    result = check_run(load_run(import_slime(d, tmp_path / "run", settings)))
    scales = [sum(abs(m.lens_loss or 0.0) for m in result.micro if m.step == s.step) for s in result.steps]
    return [float(s.lens_loss or 0.0) for s in result.steps], scales


KL = [{"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": t} for t in ("k1", "k2", "k3", "low_var_kl")]
VANILLA = "slime.backends.megatron_utils.loss.vanilla_tis_function"
ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"
# (settings, far: how far the sampler is from the actor, siblings, dp, global batch size, format)
CASES: list[tuple[dict[str, Any], float, bool, int, int, int]] = [
    ({}, 0.05, False, 1, 8, 2),
    ({"calculate_per_token_loss": True}, 0.05, False, 1, 8, 2),
    *[(kl, 0.05, False, 1, 8, 2) for kl in KL],
    *[(kl | {"calculate_per_token_loss": True}, 0.05, False, 1, 8, 2) for kl in KL],
    ({"eps_clip": 0.1, "eps_clip_high": 0.3, "eps_clip_c": 3.0, "use_rollout_logprobs": True}, 0.5, False, 1, 8, 2),
    ({"use_rollout_logprobs": True}, 0.5, False, 1, 8, 2),
    ({"use_rollout_logprobs": True, "calculate_per_token_loss": True}, 0.5, False, 1, 8, 2),
    ({"use_rollout_logprobs": True, **KL[2], "use_unbiased_kl": True}, 0.5, False, 1, 8, 2),
    ({"use_tis": True, "tis_clip": 1.5, "tis_clip_low": 0.5}, 0.5, False, 1, 8, 2),
    ({"get_mismatch_metrics": True, "custom_tis_function_path": VANILLA}, 0.5, False, 1, 8, 2),
    (
        {"get_mismatch_metrics": True, "custom_tis_function_path": ICEPOP, "tis_clip": 1.3, "tis_clip_low": 0.7},
        0.5,
        False,
        1,
        8,
        2,
    ),
    (
        {"get_mismatch_metrics": True, "custom_tis_function_path": VANILLA, "calculate_per_token_loss": True},
        0.5,
        False,
        1,
        8,
        2,
    ),
    ({}, 0.05, True, 1, 5, 2),  # several samples per rollout: one token mean per rollout
    ({"calculate_per_token_loss": True}, 0.05, True, 1, 5, 2),
    ({}, 0.05, False, 1, 4, 2),  # two optimiser steps per rollout
    ({"calculate_per_token_loss": True}, 0.05, False, 1, 4, 2),
    ({}, 0.05, False, 2, 8, 2),  # two data-parallel shards in one file
    ({"calculate_per_token_loss": True}, 0.05, False, 2, 4, 2),
    ({}, 0.05, False, 2, 8, 1),  # format 1: one file per rank
    ({"calculate_per_token_loss": True}, 0.05, False, 2, 8, 1),
    ({"calculate_per_token_loss": True, **KL[3]}, 0.05, False, 2, 4, 1),
    ({}, 0.05, True, 1, 5, 1),
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("seed", [0, 1])
def test_each_step_loss_equals_slime(
    slime: Any, monkeypatch: Any, tmp_path: Path, case: tuple[Any, ...], seed: int
) -> None:
    settings, far, siblings, dp, global_batch_size, fmt = case
    ranks = shards(slime, rollout(seed, siblings=siblings, far=far), dp, global_batch_size)
    theirs = slime_step_losses(slime, monkeypatch, settings, ranks)
    ours, scales = imported_step_losses(tmp_path, dump(slime, tmp_path, ranks, fmt), settings)
    assert len(ours) == len(theirs)  # one step file (per rank) per optimiser step
    for a, b, scale in zip(ours, theirs, scales, strict=True):
        # float32 on both sides, sums of a few dozen terms of size <= ~10: a few ulps of the terms' size
        assert abs(a - b) <= 1e-6 * max(scale, abs(b), 1.0), (a, b)
