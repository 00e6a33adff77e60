"""slime's debug *train* data dumps (``--save-debug-train-data``, or ``--dump-details DIR``: ``DIR/train_data/``)
-> a run. Read with ``torch.load(weights_only=True)`` only: tensors, numbers, strings, lists and dicts; a
file that needs any other object is refused, never unpickled.

Read from THUDM/slime's source, commit 624b824 (2026-08-21), ``slime/observability/train_data_utils.py``
(``save_debug_train_data``, ``_build_dump_payload``), and the layout before its commit 681b3ad (2026-08-12),
``slime/utils/train_dump_utils.py``:
- format 2 (681b3ad on): ``{"format_version": 2, "rollout_id", "rank", "samples": [...], "dp_shards": [...]}``,
  one file per rollout holding every data-parallel shard; each sample a dict of its own values.
- format 1 (before): ``{"rollout_id", "rank", "rollout_data": {column: [one value per sample]}}``, one file
  per rank (all ranks wrote; a pipeline stage other than the last holds no log-probs and is skipped).
Per sample, over the response tokens: ``log_probs`` (the actor's before the update: the old policy),
``ref_log_probs``, ``rollout_log_probs`` (the sampler's), ``advantages``, ``loss_masks``; per sample
``response_lengths`` and ``rewards``. The loss (``policy_loss_function``, ``slime/utils/ppo_utils.py``) sees
the current log-probs, which are not dumped, and returns a loss that is not either.
"""

from __future__ import annotations

import io
import re
from argparse import Namespace
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from grpo import step_schema
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.importers import common
from grpo.runs import read_regular
from grpo.trainer_config import TrainerMapping

READ = "slime commit 624b824 (2026-08-21): train dump format 2, and format 1 from before 681b3ad"
DUMP_FILE = re.compile(r".*\.pt")
# slime's argument defaults (slime/utils/arguments.py at that commit) for what its policy loss reads
SLIME_DEFAULTS: dict[str, Any] = {
    "eps_clip": 0.2,
    "eps_clip_high": None,
    "eps_clip_c": None,
    "use_kl_loss": False,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "k1",
    "calculate_per_token_loss": False,
    "entropy_coef": 0.0,
    "advantage_estimator": "grpo",
    "use_tis": False,
}
# slime's kl_loss_type -> LossConfig (compute_approx_kl: low_var_kl is k3 with the KL clamped to +-10)
KL_TYPES: dict[str, dict[str, Any]] = {
    "k1": {"kl_estimator": "k1"},
    "k2": {"kl_estimator": "k2"},
    "k3": {"kl_estimator": "k3"},
    "low_var_kl": {"kl_estimator": "k3", "kl_clamp": 10.0},
}
# what the import reads, and the fields it writes: any other registered field a sample holds (a plugin's) is
# written as it is
TAKEN = frozenset(
    {"log_probs", "ref_log_probs", "rollout_log_probs", "advantages", "loss_masks", "rewards", "response_lengths"}
    | {"per_token_logps", "old_per_token_logps", "ref_per_token_logps", "completion_mask", "sampling_per_token_logps"}
)
CANNOT_CHECK = [
    "the current policy's log-probs: the dump holds log_probs (the actor's before the update: the old policy), "
    "so the run uses them as current: every ratio is 1 and no clip acts",
    "the loss slime returned: it is not in the dump, so check-run has no trainer loss to compare (shown as -)",
]


def map_slime(args: Any = None) -> TrainerMapping:
    """slime's training arguments (a dict or an argparse Namespace; missing ones take slime's defaults) as a
    LossConfig, with where each went."""
    if isinstance(args, Namespace):
        args = vars(args)
    if not isinstance(args, Mapping | None):
        raise GrpoInputError("config", "slime's arguments: a mapping", got=type(args).__name__)
    given = {str(k): v for k, v in (args or {}).items()}
    a = {**SLIME_DEFAULTS, **given}
    kl_type = a["kl_loss_type"]
    if kl_type not in KL_TYPES:
        raise GrpoInputError("kl_loss_type", f"one of {', '.join(KL_TYPES)}", got=repr(kl_type))
    eps = common.number("eps_clip", a["eps_clip"])
    settings: dict[str, Any] = {
        "preset": None,
        "objective": "clip",
        "epsilon_low": eps,
        "epsilon_high": eps if a["eps_clip_high"] is None else common.number("eps_clip_high", a["eps_clip_high"]),
        "dual_clip": common.optional_number("eps_clip_c", a["eps_clip_c"]),
        "beta": common.number("kl_loss_coef", a["kl_loss_coef"]) if a["use_kl_loss"] else 0.0,
        "aggregation": "token-mean" if a["calculate_per_token_loss"] else "seq-mean-token-mean",
        **KL_TYPES[kl_type],
    }
    mapped = {
        "eps_clip": "epsilon_low (and epsilon_high when eps_clip_high is None)",
        "eps_clip_high": "epsilon_high",
        "eps_clip_c": "dual_clip",
        "use_kl_loss": "beta (0 when off)",
        "kl_loss_coef": "beta",
        "kl_loss_type": "kl_estimator (low_var_kl: k3, clamped to +-10)",
        "calculate_per_token_loss": "aggregation (token-mean, else seq-mean-token-mean)",
    }
    unsupported: dict[str, str] = {}
    if a["entropy_coef"]:
        unsupported["entropy_coef"] = "the entropy bonus is not part of GRPO Lens's loss"
    if a["advantage_estimator"] not in ("grpo", "reinforce_plus_plus_baseline", "ppo"):
        unsupported["advantage_estimator"] = f"{a['advantage_estimator']!r}: its loss path is not reproduced"
    if a["use_tis"]:
        unsupported["use_tis"] = "the sampler importance weights are not applied"
    captured = {"advantage_estimator": "in the dumped advantages"} if "advantage_estimator" in given else {}
    captured = {k: v for k, v in captured.items() if k not in unsupported}
    for name in ("entropy_coef", "use_tis"):
        if name in given and name not in unsupported:
            mapped[name] = "nothing: at this value it leaves the loss unchanged"
    known = set(mapped) | set(captured) | set(unsupported)
    unused = tuple(sorted(n for n in given if n not in known))
    return TrainerMapping(LossConfig(**settings), mapped, captured, unsupported, unused)


# --- the dump ------------------------------------------------------------------------------------
def dump_files(src: Path) -> list[Path]:
    """The ``*.pt`` files of ``src`` (or of ``src/train_data``, the ``--dump-details`` layout), by name."""
    if not src.is_dir():
        raise GrpoInputError("DIR", "a directory holding slime's train data dumps (*.pt)", got=str(src))
    where = src / "train_data" if (src / "train_data").is_dir() else src
    found = sorted(p for p in where.iterdir() if DUMP_FILE.fullmatch(p.name) and p.is_file() and not p.is_symlink())
    if not found:
        raise GrpoInputError("DIR", "slime's train data dumps (*.pt)", got=f"none in {where}")
    return found


def load_dump(path: Path) -> dict[str, Any]:
    """A dump file through ``torch.load(weights_only=True)``: any object beyond plain data is refused."""
    raw = read_regular(path)  # the file's own errors (missing, a link) stay OSError / named; the bytes' are below
    try:
        data = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load raises many kinds on hostile or truncated bytes: all are bad input
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise GrpoInputError(
            path.name, "a torch.save file of plain data (loadable with weights_only=True)", got=first
        ) from exc
    if not isinstance(data, dict):
        raise GrpoInputError(path.name, "a dict (slime's train dump)", got=type(data).__name__)
    return data


def samples_of(data: dict[str, Any], where: str) -> tuple[list[dict[str, Any]], int | None]:
    """(the samples, the writing rank for format 1 / None for format 2, which holds every shard)."""
    if data.get("format_version") == 2:
        samples = data.get("samples")
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise GrpoInputError("samples", f"a list of dicts ({where})", got=type(samples).__name__)
        return samples, None
    if "format_version" in data:
        raise GrpoInputError("format_version", f"2, or none (format 1) ({where})", got=repr(data["format_version"]))
    columns = data.get("rollout_data")
    if not isinstance(columns, dict) or not isinstance(columns.get("response_lengths"), list):
        raise GrpoInputError("rollout_data", f"a dict of columns with response_lengths ({where})", got="none")
    n = len(columns["response_lengths"])
    per_sample = {k: v for k, v in columns.items() if isinstance(v, list | tuple) and len(v) == n}
    rank = data.get("rank")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= 999_999:
        raise GrpoInputError("rank", f"the writing rank, a whole number ({where})", got=repr(rank)[:40])
    return [{k: v[i] for k, v in per_sample.items()} for i in range(n)], rank


def _tokens(sample: dict[str, Any], key: str, i: int, where: str, length: int | None) -> Tensor:
    value = sample[key]
    if not isinstance(value, Tensor) or value.dim() != 1:
        got = f"shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
        raise GrpoInputError(key, f"a 1-D tensor over the response tokens ({where})", row=i, got=got)
    if length is not None and len(value) != length:
        raise GrpoInputError(
            key, f"{length} values: the sample's response length ({where})", row=i, got=str(len(value))
        )
    return value.detach().to(torch.float32)


def _number(sample: dict[str, Any], key: str, i: int, where: str) -> float:
    value = sample[key]
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GrpoInputError(key, f"one number per sample ({where})", row=i, got=type(value).__name__)
    return float(value)


def read_dump(path: Path) -> common.ImportedStep | None:
    """One dump file as a step (None: a file with no training log-probs, a pipeline stage before the last)."""
    data = load_dump(path)
    where = path.name
    samples, rank = samples_of(data, where)
    if not samples or not all("log_probs" in s for s in samples):
        if rank is None:
            raise GrpoInputError("log_probs", f"the actor's log-probs in every sample ({where})", got="missing")
        return None
    rollout_id = data.get("rollout_id")
    if not isinstance(rollout_id, int) or isinstance(rollout_id, bool) or not 0 <= rollout_id < 999_999:
        raise GrpoInputError("rollout_id", f"a whole number from 0 ({where})", got=repr(rollout_id)[:40])
    logps, masks, advs, refs, gens, rewards = [], [], [], [], [], []
    more: dict[str, list[Any]] = {}  # the other registered fields, by the samples that hold them
    for i, s in enumerate(samples):
        n = s.get("response_lengths")
        length = int(n) if isinstance(n, int) and not isinstance(n, bool) else None
        logp = _tokens(s, "log_probs", i, where, length)
        if "advantages" not in s:
            raise GrpoInputError("advantages", f"per-token advantages in every sample ({where})", row=i, got="missing")
        advs.append(_tokens(s, "advantages", i, where, len(logp)))
        masks.append(_tokens(s, "loss_masks", i, where, len(logp)) if "loss_masks" in s else torch.ones(len(logp)))
        logps.append(logp)
        if "ref_log_probs" in s:
            refs.append(_tokens(s, "ref_log_probs", i, where, len(logp)))
        if "rollout_log_probs" in s:
            gens.append(_tokens(s, "rollout_log_probs", i, where, len(logp)))
        reward = s.get("rewards")
        rewards.append(float(reward) if isinstance(reward, int | float) and not isinstance(reward, bool) else None)
        for name, key in step_schema.dumped_fields(s, TAKEN).items():
            per_token = BATCH_FIELDS[name].shape == "token"
            value = _tokens(s, key, i, where, len(logp)) if per_token else _number(s, key, i, where)
            more.setdefault(name, []).append(value)
    mask = common.grid(masks)
    current = common.grid(logps)
    tensors = {
        "per_token_logps": current,
        "old_per_token_logps": current.clone(),
        "completion_mask": mask,
        "advantages": common.row_advantages(common.grid(advs), mask, where),
    }
    if len(refs) == len(samples):
        tensors["ref_per_token_logps"] = common.grid(refs)
    if all(r is not None for r in rewards):
        tensors["row_rewards"] = torch.tensor(rewards, dtype=torch.float32)
    meta: dict[str, Any] = {"imported_from": where, "trainer": "slime", "rollout_id": rollout_id}
    cannot = list(CANNOT_CHECK)
    if len(refs) != len(samples):
        cannot.append("the KL penalty: ref_log_probs are not dumped, so the reference is the current policy (KL 0)")
    if len(gens) == len(samples):
        sampler, sampler_meta = common.sampler_entry(gens)
        tensors |= sampler
        meta |= {"sampler_vs_old": common.mismatch(current, common.grid(gens, fill=float("nan")), mask), **sampler_meta}
    meta["cannot_check"] = cannot
    tensors |= step_schema.sample_tensors(more, len(samples), where)
    common.checked(tensors, where)
    return common.ImportedStep(rollout_id + 1, rank, tensors, meta)


def steps(files: list[Path], skipped: list[str]) -> Iterator[common.ImportedStep]:
    for path in files:
        step = read_dump(path)
        if step is None:
            skipped.append(path.name)
            continue
        yield step


def import_slime(src: str | Path, run_dir: str | Path, args: Any = None) -> Path:
    """Write slime's train dumps in ``src`` as a run at ``run_dir`` (new), under ``map_slime(args)``."""
    src = Path(src)
    mapping = map_slime(args)
    files = dump_files(src)
    skipped: list[str] = []
    info = {
        "imported": {
            "trainer": "slime",
            "read_as": READ,
            "from": str(src),
            "files": [p.name for p in files],
            "skipped": skipped,  # filled while the files are read, before run.json's final write
            "cannot_check": CANNOT_CHECK,
            "unsupported": mapping.unsupported,
            "mapped": mapping.mapped,
            "sampler_log_probs": common.SAMPLER_WHERE[common.sampler_is_a_field()],
        }
    }
    return common.write_run(run_dir, "slime", mapping.config, steps(files, skipped), info)
