"""What the importers share: a run written whole or not at all, per-row advantages, the sampler mismatch.

An import writes into a hidden directory beside the target (``.NAME.import-PID-XXXX``: the run lists skip
dot names; ``remove_stale`` clears those of killed imports) and renames it into place at the end, so a
refused dump leaves nothing behind and a reader never sees half a run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from grpo.batch import Batch
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS
from grpo.runs import RunWriter, dir_mode, open_regular

# run.json's lists of the dump's files (``imported.files``, ``skipped``) keep this many names: a run's
# description stays small at any length (each step file's meta names its own dump file: ``imported_from``)
LISTED_NAMES = 100
SAMPLER_FIELD = "sampling_per_token_logps"
SAMPLER_WHERE = "step tensor sampling_per_token_logps"  # run.json says where the sampler's log-probs went


@dataclass(frozen=True)
class ImportedStep:
    """One step file to write: the trainer's step (from 1), its process, tensors and meta."""

    step: int
    rank: int | None
    tensors: dict[str, Tensor]
    meta: dict[str, Any]
    config: LossConfig | None = None
    """This step's own config (the trainer's global counts), or None: the run's."""


def number(name: str, value: Any) -> float:
    """A trainer setting that must be a number (a bool or a string is refused, naming the setting)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GrpoInputError(name, "a number", got=repr(value)[:40])
    return float(value)


def optional_number(name: str, value: Any) -> float | None:
    return None if value is None else number(name, value)


def grid(rows: Sequence[Tensor], fill: float = 0.0) -> Tensor:
    """Ragged 1-D rows -> (B, T_max) float32, ``fill`` past each row's end."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), fill, dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


# --- hostile dumps: each bound checked before what it bounds is read --------------------------------------
MAX_LINE_BYTES = 256 * 2**20
"""A dump's line (one sample) past this many bytes is refused before it is read whole (a NeMo RL line holds some 100
bytes per token: this is a sample of about 2.5M tokens)."""
MAX_FILE_BYTES = 16 * 2**30
"""A dump file past this many bytes is refused before it is read: one file is one step, held in memory whole."""


def regular_file(path: Path, max_bytes: int | None = None) -> tuple[BinaryIO, int]:
    """``path`` opened for reading, and its size: a regular file, never through a link (``grpo.runs.open_regular``:
    a dump's file that is a symbolic link, a FIFO or a directory is refused, naming it), at most ``max_bytes``
    (default MAX_FILE_BYTES), checked before anything is read."""
    limit = MAX_FILE_BYTES if max_bytes is None else max_bytes
    f, size = open_regular(path, "of the dump")
    if size > limit:
        f.close()
        raise GrpoInputError(path.name, f"a regular file of at most {limit} bytes", got=f"{size} bytes")
    return f, size


def bounded_lines(f: BinaryIO, name: str, max_line: int | None = None) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, bytes) of each line of ``f``, each read with a bounded readline: a line longer than
    ``max_line`` bytes (default MAX_LINE_BYTES, its newline included) is refused at the bound, never read whole."""
    limit = MAX_LINE_BYTES if max_line is None else max_line
    n = 0
    while line := f.readline(limit + 1):
        n += 1
        if len(line) > limit:
            raise GrpoInputError(f"{name} line {n}", f"a line of at most {limit} bytes", got="a longer one (not read)")
        yield n, line


def position(index: Sequence[int]) -> str:
    """``[0][17]``: an element's place as the dump indexes it."""
    return "".join(f"[{i}]" for i in index)


def finite(
    values: Tensor, name: str, where: str, expected: str = "a finite log-prob", prefix: Sequence[int] = ()
) -> None:
    """Refuse NaN or ±inf in ``values`` (a dump's tensor or list), naming the first as the dump does:
    ``train_data_step3.jsonl line 2: prev_logprobs[0][17]: expected a finite log-prob, got nan``. ``prefix``: the
    indices in front of ``values``'s own (``[0]`` for a batch of one)."""
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        index = [*prefix, *(int(i) for i in bad.nonzero()[0])]
        value = float(values[tuple(index[len(prefix) :])])
        raise GrpoInputError(f"{where}: {name}{position(index)}", expected, got=repr(value))


def grid_bound(rows: int, width: int, nbytes: int, where: str) -> None:
    """Refuse a (rows, width) grid larger than a dump of ``nbytes`` justifies: at most one cell per byte (a
    per-token value costs at least two bytes in each of the dump's per-token lists, so a real dump asks a fraction
    of that), so a 2 MB dump cannot ask for a 24 GB grid (a short line and a long one make rows x longest)."""
    if rows * width > max(nbytes, 1):
        raise GrpoInputError(
            where,
            f"rows x longest row at most its {nbytes} bytes (one cell per byte)",
            got=f"{rows} rows x {width} tokens",
        )


def row_advantages(advantages: Tensor, mask: Tensor, where: str) -> Tensor:
    """(B, T) per-token advantages -> (B,): each row's value on its counted tokens (0 for a row with none).

    An import takes one advantage per row: a row whose counted tokens carry different values (a per-token
    estimator, a KL in the reward per token) is refused rather than averaged into another loss.
    """
    counted = mask > 0  # (B, T)
    first = torch.where(counted.any(dim=1), advantages.gather(1, counted.int().argmax(dim=1, keepdim=True))[:, 0], 0)
    varies = counted & (advantages != first[:, None])  # (B, T)
    if varies.any():
        row = int(varies.any(dim=1).nonzero()[0, 0])
        raise GrpoInputError(
            "advantages",
            f"one advantage per row: the same value on every counted token ({where})",
            row=row,
            got="values that vary within the row",
        )
    return first.to(torch.float32)


def mismatch(old: Tensor, sampler: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the sampler's log-probs are from the trainer's old ones on the counted, scored tokens.

    ``token_mult_prob_error`` is NeMo RL's metric of that name (mean of exp|old - sampler|);
    ``gen_kl_k3`` its ``gen_kl_error`` with k3: KL(sampler || trainer) estimated per token.
    """
    counted = (mask > 0) & torch.isfinite(sampler)
    d = (old - sampler)[counted].double()  # (N,) trainer minus sampler, per counted token
    if d.numel() == 0:
        return {"tokens": 0}
    return {
        "tokens": int(d.numel()),
        "mean_abs_logp_diff": float(d.abs().mean()),
        "max_abs_logp_diff": float(d.abs().max()),
        "token_mult_prob_error": float(d.abs().exp().mean()),
        "gen_kl_k3": float((d.exp() - d - 1).mean()),
    }


def checked(tensors: dict[str, Tensor], where: str) -> None:
    """The step's Batch built now, so every check a reader makes refuses the dump here, naming the file."""
    fields: dict[str, Any] = {k: v for k, v in tensors.items() if k in BATCH_FIELDS}
    try:
        Batch(**fields)
    except GrpoInputError as exc:
        raise GrpoInputError(exc.field, f"{exc.expected} (in {where})", exc.row, exc.got) from exc


def _temp_prefix(name: str) -> str:
    return f".{name}.import-"


def remove_stale(parent: Path, name: str) -> list[Path]:
    """Remove what an import into ``parent/name`` killed before its clean-up left (its temporary directory,
    named with the importing process's id): those whose process is gone. The paths removed."""
    removed = []
    for path in parent.glob(f"{_temp_prefix(name)}*"):
        pid = path.name[len(_temp_prefix(name)) :].split("-")[0]
        if not pid.isdigit() or path.is_symlink() or not path.is_dir():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # gone: nothing will finish or remove it
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except PermissionError:  # alive, another user's
            continue
    return removed


def listed(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with each list of names in ``imported`` longer than LISTED_NAMES cut to its first ones, and
    ``{key}_count`` saying how many it held (a 34,000-step import's ``files`` made run.json over 1 MiB)."""
    imported = info.get("imported")
    if not isinstance(imported, dict):
        return info
    cut = {k: v for k, v in imported.items() if isinstance(v, list) and len(v) > LISTED_NAMES}
    short = {k: v[:LISTED_NAMES] for k, v in cut.items()} | {f"{k}_count": len(v) for k, v in cut.items()}
    return info | {"imported": imported | short}


def write_run(
    run_dir: str | os.PathLike[str],
    source: str,
    config: LossConfig,
    steps: Iterable[ImportedStep],
    info: dict[str, Any],
) -> Path:
    """Write ``steps`` as a run at ``run_dir`` (which must not exist): all of it, or nothing on any error."""
    target = Path(run_dir)
    if target.exists() or target.is_symlink():
        raise GrpoInputError("RUN_DIR", "a path that does not exist yet (an import never overwrites)", got=str(target))
    parent = target.parent
    if not parent.is_dir():
        raise GrpoInputError("RUN_DIR", "a path in an existing directory", got=str(parent))
    remove_stale(parent, target.name)
    tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f"{_temp_prefix(target.name)}{os.getpid()}-"))
    try:
        tmp.chmod(dir_mode())  # mkdtemp's 0700 would keep the run from a server running as another user
        writers: dict[int | None, RunWriter] = {}
        seen: set[tuple[int, int | None]] = set()
        for s in steps:  # each dump file is read, checked and written in turn: memory is one file's
            if (s.step, s.rank) in seen:
                raise GrpoInputError("step", "one dump file per step and process", got=f"step {s.step} twice")
            seen.add((s.step, s.rank))
            if s.rank not in writers:
                writers[s.rank] = RunWriter(tmp, source, config, rank=s.rank, info=listed(info))
            writers[s.rank].write_step(s.step, 0, s.tensors, s.meta, config=s.config)
        if not writers:
            raise GrpoInputError("DIR", "at least one dump file", got="none")
        # run.json's writer (RunWriter): the dump's one process or its rank 0, made for it when rank 0 wrote nothing
        describer = writers.get(None) or writers.get(0) or RunWriter(tmp, source, config, rank=0, info=listed(info))
        describer.update(status="done", **listed(info))  # info's lists as the reading left them (slime's skipped)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
