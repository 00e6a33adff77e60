"""Runs on disk: one directory per run, one self-describing safetensors file per micro-batch.

    run_dir/run.json                                   format, source, versions, config, created, status
    run_dir/logged.jsonl                               the metrics the trainer logged, a line per log call
    run_dir/steps/{step:06d}-{micro:03d}.safetensors   ("-rank{r}" before the extension per process)

``step`` is the trainer's optimiser step (from 1), ``micro`` the micro-batch within it (from 0).
Each step file holds the loss's tensors under the API's names (``per_token_logps``,
``old_per_token_logps``, ``ref_per_token_logps``, ``completion_mask``, ``advantages``; ``row_rewards``
and ``row_groups`` for display; ``rewards``/``group_size`` when the source has them) and, as JSON
strings in the safetensors metadata, the resolved ``config``, ``step``, ``micro`` and ``meta`` (the
trainer's returned loss, its logged metrics...). Every write goes to a temporary file in the same
directory and is renamed over the target (``os.replace``), so a crash leaves the old file or none,
never half of one.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import struct
import tempfile
import threading
import warnings
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from grpo.batch import Batch
from grpo.config import PRESETS, LossConfig
from grpo.errors import GrpoInputError
from grpo.fields import BATCH_FIELDS, fields_of
from grpo.step_schema import DISPLAY_TENSORS, TRAINER_TENSORS, step_tensors  # what a step file holds

FORMAT = 1
SOURCES = ("trl", "verl", "lab", "upload", "nemo-rl", "slime")  # the last two: grpo.importers
# Matched whole (``fullmatch``), ASCII digits only: ``\d`` takes other scripts' digits (a file named with
# Arabic-Indic digits read as a second micro 0 of step 1) and ``$`` matches before a trailing newline.
STEP_FILE = re.compile(r"([0-9]{6})-([0-9]{3})(?:-rank([0-9]{1,6}))?\.safetensors")
# group_size (and any field for the whole batch): a 0-d tensor, read as a number
BATCH_TENSORS = tuple(name for name in BATCH_FIELDS if name not in fields_of("batch"))


def batch_tensors() -> tuple[str, ...]:
    """The Batch fields a step file holds as tensors, from the table as it is now (a plugin's field included)."""
    return tuple(name for name in BATCH_FIELDS if name not in fields_of("batch"))


# The trainer's logged metrics, appended a line per log call (``-rank{r}``: a process other than the first):
# a rewrite of run.json per call would cost the whole history at every step of a run of thousands.
LOGGED_FILE = re.compile(r"logged(?:-rank([0-9]{1,6}))?\.jsonl")
MAX_LOGGED_BYTES = 64_000_000  # ~30,000 steps of 50 metrics
SUPERSEDED = "superseded"  # steps/superseded/{attempt}/: a resumed job's earlier files of the steps it redoes
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the JSON header
MAX_JSON_DEPTH = 32  # nesting of run.json and a step's config/meta: every reader and JSON writer copes
# Tensor dtypes a step file may hold: what the loss computes with (float8, complex, unsigned wide ints: refused)
STEP_DTYPES = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
)


# --- atomic writes ------------------------------------------------------------------------------
_UMASK_LOCK = threading.Lock()


def process_umask() -> int:
    """The process's umask, read without changing it: Linux's ``/proc/self/status``. Elsewhere it is set and
    put back (``os.umask`` is process-wide: a file another thread creates meanwhile gets the mode it sets)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode of a run's files: what ``open`` gives a new file under the process's umask (0644 under 022)."""
    return 0o666 & ~process_umask()


def dir_mode() -> int:
    """The mode of a run's directories under the process's umask (0755 under 022), for those made 0700
    (``tempfile.mkdtemp``): a server running as another user reads the run."""
    return 0o777 & ~process_umask()


def _staged(path: Path, data: bytes) -> str:
    """``data`` in a temporary file beside ``path``, on disk, with a run file's mode (mkstemp makes it 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), file_mode())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return tmp


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename."""
    tmp = _staged(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def create_atomic(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` only if nothing is there; whether this call made it. The staged file is linked
    into place (``os.link`` refuses a name that exists): of two processes creating it, one does, whole, and the
    other learns it did not. (A filesystem without hard links: replaced, as ``write_atomic``.)"""
    tmp = _staged(path, data)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        os.replace(tmp, path)
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)


def _json(value: Any) -> str:
    return json.dumps(value, allow_nan=True, default=_plain)


def _plain(value: Any) -> Any:
    """JSON for the numbers trainers log: tensors and NumPy scalars become floats or lists."""
    if isinstance(value, Tensor):
        return value.detach().cpu().tolist()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def config_dict(config: LossConfig | dict[str, Any]) -> dict[str, Any]:
    return config.to_dict() if isinstance(config, LossConfig) else dict(config)


def config_from_dict(fields: dict[str, Any]) -> LossConfig:
    """A LossConfig from a stored dict: a whole resolved config, or a preset and overrides."""
    if not isinstance(fields, dict):
        raise GrpoInputError("config", "a JSON object: LossConfig fields, or a preset and overrides")
    fields = dict(fields)
    preset = fields.get("preset")
    if preset is not None and not isinstance(preset, str):
        raise GrpoInputError("preset", f"a preset name: one of {', '.join(PRESETS)}", got=type(preset).__name__)
    if preset not in PRESETS:  # a plugin's preset no longer registered: the stored fields as they are
        fields.pop("preset", None)
    return LossConfig.resolve(fields, base=LossConfig())


def package_versions(*names: str) -> dict[str, str]:
    out = {"torch": str(torch.__version__)}
    for name in ("grpo-lens", *names):
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            continue
    return out


def _now(timespec: str = "seconds") -> str:
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


# --- writing ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sampling:
    """Which loss calls a capture records, for runs too long to record whole.

    ``every=N``: optimiser steps 1, N+1, 2N+1, ... (the first step always); ``steps``: these steps; both: either;
    neither: every step. ``ranks``: only these processes (rank 0 when the run has one process). ``max_bytes``:
    the step files this process writes stop, for the rest of the run, at the first that would cross it; training
    goes on, and run.json's ``capture`` says where capturing stopped.
    """

    every: int | None = None
    steps: frozenset[int] | None = None
    ranks: frozenset[int] | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.every is not None and (isinstance(self.every, bool) or self.every < 1):
            raise GrpoInputError("every", "a whole number of steps >= 1", got=repr(self.every))
        if self.max_bytes is not None and self.max_bytes < 1:
            raise GrpoInputError("max_bytes", "a number of bytes >= 1", got=repr(self.max_bytes))
        for name in ("steps", "ranks"):
            chosen = getattr(self, name)
            if chosen is not None and not all(isinstance(v, int) and v >= 0 for v in chosen):
                raise GrpoInputError(name, "whole numbers >= 0", got=repr(sorted(chosen, key=str))[:80])

    @classmethod
    def of(
        cls,
        every: int | None = None,
        steps: Iterable[int] | None = None,
        ranks: Iterable[int] | None = None,
        max_bytes: int | None = None,
    ) -> Sampling:
        return cls(
            every, None if steps is None else frozenset(steps), None if ranks is None else frozenset(ranks), max_bytes
        )

    def wants(self, step: int, rank: int | None) -> bool:
        """Whether ``rank`` records optimiser step ``step`` (the byte budget aside)."""
        if self.ranks is not None and (rank or 0) not in self.ranks:
            return False
        if self.every is None and self.steps is None:
            return True
        return (self.every is not None and (step - 1) % self.every == 0) or (
            self.steps is not None and step in self.steps
        )

    def chooses_nothing(self, world_size: int, last_step: int | None = None) -> str | None:
        """Why this sampling records no loss call of a run of ``world_size`` processes (ranks 0..world_size-1)
        and, when known, ``last_step`` optimiser steps; None when it may record some."""
        if self.ranks is not None and not any(r < world_size for r in self.ranks):
            return f"ranks {sorted(self.ranks)} but the run has ranks 0..{world_size - 1}"
        if self.every is None and self.steps is not None:
            last = "" if last_step is None else f"..{last_step}"
            if not any(s >= 1 and (last_step is None or s <= last_step) for s in self.steps):
                return f"steps {sorted(self.steps)[:10]} but the run has steps 1{last}"
        return None

    def settings(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "steps": None if self.steps is None else sorted(self.steps),
            "ranks": None if self.ranks is None else sorted(self.ranks),
            "max_bytes": self.max_bytes,
        }


class RunWriter:
    """Writes one run: ``run.json`` at creation, then one file per captured micro-batch.

    ``config`` is the run's config (a LossConfig, or a dict of its fields); a step may carry its own
    (``write_step(..., config=...)``) when the trainer's scaling changes between micro-batches.
    ``rank`` names the writing process when several write into one run. ``info`` adds fields to
    run.json (a status, a name...) in its first write, or keeps those of an earlier writer of the run
    (``created``): a run.json written once per change of state, not once per field.

    One process writes run.json: rank 0 (or the one writer, ``rank=None``), whether or not it writes step
    files. Another rank never creates or rewrites it (its ``update`` changes only its own ``info``), and
    never needs it to exist: its step files and ``logged-rank{r}.jsonl`` are its part of the run.

    ``sampling`` chooses the steps written (``write_step`` returns None for the others). ``resume``: a
    restarted job writing into its run again keeps run.json's ``created`` and what it logged, counts the
    attempt, and moves a step file an earlier attempt wrote to ``steps/superseded/{attempt}/`` before
    writing that step again: nothing is overwritten. A fresh run.json is then created atomically
    (``create_atomic``): a writer that finds one made meanwhile resumes it. (The lab starts its runs afresh:
    no resume.) Files and directories get the modes the process's umask gives (0644 and 0755 under 022).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        source: str,
        config: LossConfig | dict[str, Any],
        versions: dict[str, Any] | None = None,
        rank: int | None = None,
        background: bool = False,
        info: dict[str, Any] | None = None,
        sampling: Sampling | None = None,
        resume: bool = False,
    ) -> None:
        if source not in SOURCES:
            raise GrpoInputError("source", f"one of {', '.join(SOURCES)}", got=repr(source))
        self.run_dir = Path(run_dir)
        self.steps_dir = self.run_dir / "steps"
        self.steps_dir.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.config = config_dict(config)
        # background: step files are written by one worker thread, off the training loop's path;
        # close() waits for them and raises the first failure (a failed write also raises at the next call)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grpo-runs") if background else None
        self._pending: list[Future[None]] = []
        self.info: dict[str, Any] = {
            "format": FORMAT,
            "source": source,
            "versions": {**package_versions(), **(versions or {})},
            "config": self.config,
            "created": _now(),
            "status": "running",
            **(info or {}),
        }
        self.sampling = sampling or Sampling()
        self.written_bytes, self.files, self.skipped = 0, 0, 0
        self.budget_reached_at: int | None = None
        self.incomplete_step: int | None = None  # the budget was reached after some of its micro-batches
        self._last_step: int | None = None
        self._mine: set[Path] = set()  # the step files this writer wrote: anything else is an earlier attempt's
        self.resume = resume
        self.chosen_nothing: str | None = None  # check_sampling's finding, kept in run.json's ``capture``
        self.attempt = 1  # another rank's: counted by the first process, read from run.json when needed
        self._attempt_known = rank in (None, 0)
        if sampling is not None:
            self.info["capture"] = self.sampling.settings()
        if not self.writes_info:
            return
        for _ in range(3):  # a run.json another writer creates between the read and the create: resumed
            earlier = self._read_info() if resume else None
            if earlier is not None:
                self._resume(earlier, source)
            if earlier is not None or not resume:
                self._write_info()
                return
            if create_atomic(self.run_dir / "run.json", self._info_bytes()):
                return
        raise GrpoInputError("run.json", "a file that stays in place while a writer resumes it", got="replaced")

    @property
    def writes_info(self) -> bool:
        """Whether this process writes run.json: rank 0, or the run's one writer."""
        return self.rank in (None, 0)

    def _read_info(self) -> dict[str, Any] | None:
        path = self.run_dir / "run.json"
        try:
            earlier = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        if not isinstance(earlier, dict):
            raise GrpoInputError("run.json", "a JSON object: the run's description", got=type(earlier).__name__)
        return earlier

    def _resume(self, earlier: dict[str, Any], source: str) -> None:
        """Count this attempt after ``earlier``'s (run.json as an earlier attempt left it), keeping its
        ``created`` and what it logged; a run of another source is written over."""
        if earlier.get("source") != source:
            return
        attempts = earlier.get("attempts") or [earlier.get("created")]
        self.attempt = len(attempts) + 1
        keep = {k: earlier[k] for k in ("created", "logged") if k in earlier}
        # milliseconds: two attempts (two writers of one run) never read as one repeated entry
        self.info |= keep | {"attempts": [*attempts, _now("milliseconds")]}

    def _info_bytes(self) -> bytes:
        return (json.dumps(self.info, indent=1, default=_plain) + "\n").encode()

    def _write_info(self) -> None:
        if self.writes_info:
            write_atomic(self.run_dir / "run.json", self._info_bytes())

    def _superseded(self) -> Path:
        """Where an earlier attempt's step file goes: ``steps/superseded/{attempt - 1}``. Another rank reads
        the attempt from run.json at its first resumed step file (the first process counted it at its start;
        no run.json: the second)."""
        if not self._attempt_known:
            try:
                earlier = self._read_info()
            except (OSError, ValueError):
                earlier = None
            attempts = earlier.get("attempts") if earlier is not None else None
            self.attempt = len(attempts) if isinstance(attempts, list) and attempts else 2
            self._attempt_known = True
        return self.steps_dir / SUPERSEDED / str(self.attempt - 1)

    def _capture(self) -> dict[str, Any]:
        chosen = {} if self.chosen_nothing is None else {"chooses_nothing": self.chosen_nothing}
        return self.sampling.settings() | chosen

    def check_sampling(self, world_size: int, last_step: int | None = None, who: str = "grpo.runs") -> str | None:
        """Warn, and say in run.json's ``capture.chooses_nothing``, when the sampling records nothing of a run of
        ``world_size`` processes and ``last_step`` optimiser steps (when known): ``ranks=[1]`` on one process.
        The reason, or None."""
        self.chosen_nothing = self.sampling.chooses_nothing(world_size, last_step)
        if self.chosen_nothing is not None:
            warnings.warn(f"{who}: {self.chosen_nothing}: this capture records no step file", stacklevel=3)
            self.update(capture=self._capture())
        return self.chosen_nothing

    def step_path(self, step: int, micro: int) -> Path:
        rank = "" if self.rank is None else f"-rank{self.rank}"
        return self.steps_dir / f"{step:06d}-{micro:03d}{rank}.safetensors"

    def wants(self, step: int) -> bool:
        """Whether this process records optimiser step ``step``: a hook asks before it gathers anything."""
        return self.budget_reached_at is None and self.sampling.wants(step, self.rank)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Append what the trainer logged for ``step`` to ``logged.jsonl`` (one line, one write: a crash leaves
        at most a torn last line, which readers skip). Later lines of a step add to and replace earlier ones."""
        name = "logged.jsonl" if self.rank in (None, 0) else f"logged-rank{self.rank}.jsonl"
        line = (json.dumps({"step": step, "metrics": metrics}, default=_plain) + "\n").encode()
        fd = os.open(self.run_dir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)  # the umask applies
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def _account(self) -> None:
        """run.json's ``capture``: the sampling settings and what this process wrote and skipped."""
        if not self.writes_info:
            return  # one process describes the run; the others' step files speak for themselves
        account = {"files": self.files, "bytes": self.written_bytes, "skipped_calls": self.skipped}
        if self.budget_reached_at is not None:
            account["budget_reached_at_step"] = self.budget_reached_at
        if self.incomplete_step is not None:
            account["incomplete_step"] = self.incomplete_step
        self.update(capture=self._capture() | account)

    def write_step(
        self,
        step: int,
        micro: int,
        tensors: dict[str, Tensor],
        meta: dict[str, Any],
        config: LossConfig | dict[str, Any] | None = None,
    ) -> Path | None:
        """Write one micro-batch's tensors with its config, step, micro and ``meta``; return the path (None:
        the step is not sampled, or the byte budget is spent)."""
        from safetensors.torch import save

        if step < 0 or micro < 0 or step > 999_999 or micro > 999:
            raise GrpoInputError("step", "0 <= step <= 999999 and 0 <= micro <= 999", got=f"{step}, {micro}")
        if not self.wants(step):
            self.skipped += 1
            return None
        given = self.config if config is None else config
        tensors = step_tensors(tensors, given if isinstance(given, LossConfig) else config_from_dict(given))
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.sampling.max_bytes is not None and self.written_bytes + size > self.sampling.max_bytes:
            self.budget_reached_at, self.skipped = step, self.skipped + 1
            self.incomplete_step = step if step == self._last_step else None
            warnings.warn(
                f"grpo.runs: the capture's budget of {self.sampling.max_bytes} bytes is reached at step {step}: "
                "no step file is written from here on (training goes on)",
                stacklevel=2,
            )
            self._account()
            return None
        self.written_bytes, self.files, self._last_step = self.written_bytes + size, self.files + 1, step
        copy = self._executor is not None  # the trainer may reuse its buffers after the call returns
        stored = {name: _cpu(t, copy) for name, t in tensors.items()}
        metadata = {
            "format": str(FORMAT),
            "config": _json(self.config if config is None else config_dict(config)),
            "step": str(step),
            "micro": str(micro),
            "rank": "" if self.rank is None else str(self.rank),
            "meta": _json(meta),
        }
        path = self.step_path(step, micro)
        if self.resume and path not in self._mine and path.exists():  # an earlier attempt's: kept, not replaced
            aside = self._superseded()
            aside.mkdir(parents=True, exist_ok=True)
            os.replace(path, aside / path.name)
        self._mine.add(path)
        if self._executor is None:
            write_atomic(path, save(stored, metadata=metadata))
            return path
        self._raise_failed()
        self._pending.append(self._executor.submit(lambda: write_atomic(path, save(stored, metadata=metadata))))
        return path

    def _raise_failed(self) -> None:
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        for future in done:
            future.result()

    def close(self) -> None:
        """Wait for the background writes (when ``background``); raise the first that failed. A sampled
        capture's account goes into run.json."""
        if self.sampling != Sampling() or self.skipped:
            self._account()
        if self._executor is None:
            return
        pending, self._pending = self._pending, []
        try:
            for future in pending:
                future.result()
        finally:
            self._executor.shutdown(wait=True)
            self._executor = None

    def update(self, **fields: Any) -> None:
        """Set fields of run.json (``status="done"``...) and rewrite it atomically (in rank 0 or the one
        writer: another rank's ``info`` only)."""
        self.info.update(fields)
        self._write_info()


def _cpu(t: Tensor, copy: bool) -> Tensor:
    out = t.detach().to("cpu")
    if copy and out.data_ptr() == t.data_ptr():
        out = out.clone()
    return out.contiguous()


# --- reading ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepRef:
    """One step file: where it is and which step, micro-batch and process it holds."""

    step: int
    micro: int
    rank: int | None
    path: Path


@dataclass(frozen=True)
class Run:
    """A run directory: its run.json and its step files, in (step, rank, micro) order."""

    name: str
    path: Path
    info: dict[str, Any]
    steps: tuple[StepRef, ...]

    def step_numbers(self) -> list[int]:
        return sorted({s.step for s in self.steps})

    def micro_batches(self, step: int) -> list[StepRef]:
        return [s for s in self.steps if s.step == step]

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.info.get("source"),
            "created": self.info.get("created"),
            "status": self.info.get("status"),
            "steps": len(self.step_numbers()),
            "files": len(self.steps),
        }


def open_regular(path: str | os.PathLike[str], inside: str = "inside the run") -> tuple[BinaryIO, int]:
    """``path`` opened for reading, never through a link, and its size: a file that is a symbolic link (to
    /etc/passwd, /proc/self/environ), a FIFO or a directory is refused, naming it (``inside``: what it is a file
    of), before anything is read."""
    path = Path(path)
    try:  # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise GrpoInputError(path.name, f"a regular file {inside}, not a link", got="a link") from exc
        raise
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        f.close()
        raise GrpoInputError(path.name, f"a regular file {inside}", got="not a regular file")
    return f, st.st_size


def read_regular(path: str | os.PathLike[str], max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file of a run (``open_regular``); ``max_bytes``: refused past that size, before
    reading."""
    f, size = open_regular(path)
    with f:
        if max_bytes is not None and size > max_bytes:
            raise GrpoInputError(Path(path).name, f"at most {max_bytes} bytes", got=f"{size} bytes")
        return f.read()


def json_depth_ok(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests at most ``limit`` lists/objects deep (without recursing)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_info(info: Any) -> dict[str, Any]:
    """run.json's fields as the readers use them, each checked (a GrpoInputError names the first bad one).

    Fields the format does not name may hold any JSON, at most ``MAX_JSON_DEPTH`` deep.
    """
    if not isinstance(info, dict):
        raise GrpoInputError("run.json", "a JSON object: a run's format, source and config", got=type(info).__name__)
    deep = next((str(k) for k, v in info.items() if not json_depth_ok(v, MAX_JSON_DEPTH - 1)), None)
    if deep is not None:
        raise GrpoInputError(deep, f"JSON at most {MAX_JSON_DEPTH} levels deep in run.json", got="deeper")
    fmt = info.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or not 1 <= fmt <= FORMAT:
        raise GrpoInputError("run.json", f"a run of format <= {FORMAT}", got=repr(fmt)[:50])
    if info.get("source") not in SOURCES:
        raise GrpoInputError("source", f"one of {', '.join(SOURCES)}", got=repr(info.get("source"))[:50])
    for name in ("status", "name"):  # "created" is shown as given (a number too)
        if name in info and not isinstance(info[name], str | None):
            raise GrpoInputError(name, "a string", got=type(info[name]).__name__)
    versions = info.get("versions", {})
    if not isinstance(versions, dict) or not all(isinstance(v, str) for v in versions.values()):
        raise GrpoInputError("versions", "an object of package names to version strings", got=repr(versions)[:50])
    if "config" in info:
        config_from_dict(info["config"])
    logged = info.get("logged", {})
    if logged is not None and (not isinstance(logged, dict) or not all(isinstance(v, dict) for v in logged.values())):
        raise GrpoInputError("logged", "an object of steps to objects of metrics", got=repr(logged)[:50])
    return info


def load_run(run_dir: str | os.PathLike[str]) -> Run:
    """The run in ``run_dir``: run.json (checked) and the list of step files (not their contents).

    Only regular files are read: run.json, a ``steps`` directory or a step file that is a link is
    not part of the run.
    """
    path = Path(run_dir)
    info_path = path / "run.json"
    try:
        info = json.loads(read_regular(info_path))
    except FileNotFoundError as exc:
        raise GrpoInputError("run", f"a run directory with run.json ({path})") from exc
    except ValueError as exc:
        raise GrpoInputError("run.json", "valid JSON", got=str(exc)[:200]) from exc
    except RecursionError as exc:  # json.loads recurses once per nesting level
        raise GrpoInputError("run.json", "valid JSON", got="nesting too deep") from exc
    check_info(info)
    logged = read_logged(path)
    if logged:
        merged = {step: dict(metrics) for step, metrics in (info.get("logged") or {}).items()}
        for step, metrics in logged.items():
            merged.setdefault(step, {}).update(metrics)
        info["logged"] = merged
    refs = []
    steps_dir = path / "steps"
    entries = sorted(os.scandir(steps_dir), key=lambda e: e.name) if _is_real_dir(steps_dir) else []
    for entry in entries:
        match = STEP_FILE.fullmatch(entry.name)
        if match and entry.is_file(follow_symlinks=False):
            rank = None if match[3] is None else int(match[3])
            refs.append(StepRef(int(match[1]), int(match[2]), rank, Path(entry.path)))
    refs.sort(key=lambda s: (s.step, -1 if s.rank is None else s.rank, s.micro))
    return Run(path.name, path, info, tuple(refs))


def read_logged(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The metrics of ``logged*.jsonl``, by step (the first process's file last: its lines win). A torn last
    line (a crash mid-write) is skipped; any other bad line is refused, naming the file and line."""
    files = [e for e in os.scandir(run_dir) if LOGGED_FILE.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
    files.sort(key=lambda e: -1 if e.name == "logged.jsonl" else int(e.name[len("logged-rank") : -len(".jsonl")]))
    logged: dict[str, dict[str, Any]] = {}
    for entry in reversed(files):
        lines = read_regular(entry.path, MAX_LOGGED_BYTES).split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                if number == len(lines):  # no newline after it: the write was cut
                    continue
                raise GrpoInputError(entry.name, "a JSON object per line", got=f"line {number}") from None
            step, metrics = (record.get("step"), record.get("metrics")) if isinstance(record, dict) else (None, None)
            if not isinstance(step, int) or isinstance(step, bool) or not isinstance(metrics, dict):
                raise GrpoInputError(entry.name, '{"step": <int>, "metrics": {...}} per line', got=f"line {number}")
            if not all(v is None or _is_number(v) for v in metrics.values()):
                raise GrpoInputError(entry.name, "metrics that are numbers or null", got=f"line {number}")
            logged.setdefault(str(step), {}).update(metrics)
    return logged


def _is_real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def list_runs(root: str | os.PathLike[str]) -> list[Run]:
    """Every run directly under ``root``, newest first; directories that are not runs are skipped, and so
    are links (a run is a directory of the runs directory itself, never one reached through a link)."""
    root = Path(root)
    runs = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        if not child.name.startswith(".") and _is_real_dir(child):  # dot: being written or deleted
            try:
                runs.append(load_run(child))
            except (GrpoInputError, OSError):
                continue
    return sorted(runs, key=lambda r: str(r.info.get("created", "")), reverse=True)


def read_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header (empty when it has none)."""
    if len(data) < 8:
        raise GrpoInputError("file", "a valid safetensors file", got=f"{len(data)} bytes")
    (size,) = struct.unpack("<Q", data[:8])
    if size > min(MAX_HEADER_BYTES, len(data) - 8):
        raise GrpoInputError("file", "a valid safetensors file", got="a header past the end of the file")
    try:
        header = json.loads(data[8 : 8 + size])
    except (ValueError, RecursionError) as exc:
        raise GrpoInputError("file", "a valid safetensors file", got="an unreadable header") from exc
    found = header.get("__metadata__") if isinstance(header, dict) else None
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def read_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A safetensors file's JSON header (each tensor's dtype, shape and offsets; ``__metadata__``), read
    without its tensors: what a step costs to evaluate is known before it is loaded."""
    with open(path, "rb") as f:
        head = f.read(8)
        (size,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
        if size is None or size > min(MAX_HEADER_BYTES, os.fstat(f.fileno()).st_size - 8):
            raise GrpoInputError("file", f"a valid safetensors file (in the step file {Path(path).name})")
        text = f.read(size)
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise GrpoInputError("file", f"a valid safetensors file (in the step file {Path(path).name})") from exc
    if not isinstance(header, dict):
        raise GrpoInputError("file", f"a valid safetensors file (in the step file {Path(path).name})")
    return header


def is_step_metadata(metadata: dict[str, str]) -> bool:
    return "config" in metadata and "step" in metadata and "format" in metadata


def step_request(tensors: dict[str, Tensor], metadata: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the Batch's fields, the rest: step, micro, rank, meta, config dict, display tensors).

    The trainer's advantages are the input: when a file holds both advantages and rewards, the
    rewards ride along for display only. Every field is checked here, so a reader (the CLI, the
    server's views) gets a GrpoInputError naming it, never a TypeError from deep inside.
    """
    try:
        config = json.loads(metadata["config"])
        meta = json.loads(metadata.get("meta", "{}"))
        step, micro = int(metadata["step"]), int(metadata.get("micro", "0"))
        rank = None if not metadata.get("rank") else int(metadata["rank"])
    except (KeyError, ValueError, RecursionError) as exc:
        raise GrpoInputError("file", "a run step file (config, step, micro, rank, meta in its metadata)") from exc
    for name, value in (("config", config), ("meta", meta)):
        if not json_depth_ok(value):
            raise GrpoInputError(name, f"JSON at most {MAX_JSON_DEPTH} levels deep", got="deeper")
    if "per_token_logps" not in tensors:
        raise GrpoInputError("file", "a run step file holding per_token_logps", got=", ".join(sorted(tensors)))
    for name, tensor in tensors.items():
        if tensor.dtype not in STEP_DTYPES:
            kinds = "float16, bfloat16, float32, float64, bool or integers"
            raise GrpoInputError(name, f"a tensor of {kinds}", got=str(tensor.dtype).removeprefix("torch."))
    # the batch fields registered now (a plugin's included: BATCH_TENSORS is the table at import)
    fields: dict[str, Any] = {k: tensors[k] for k in batch_tensors() if k in tensors}
    if "group_size" in tensors:
        fields["group_size"] = _group_size(tensors["group_size"])
    display = {k: tensors[k] for k in DISPLAY_TENSORS if k in tensors}
    if "advantages" in fields and "rewards" in fields:
        display["rewards"] = fields.pop("rewards")
        fields.pop("group_size", None)
    rows = int(tensors["per_token_logps"].shape[0]) if tensors["per_token_logps"].dim() else 0
    for name, tensor in display.items():  # shown one number per row
        if tuple(tensor.shape) != (rows,):
            raise GrpoInputError(name, f"one number per row ({rows})", got=f"shape {tuple(tensor.shape)}")
    applied = {k: tensors[k] for k in TRAINER_TENSORS if k in tensors}
    width = int(tensors["per_token_logps"].shape[-1]) if tensors["per_token_logps"].dim() == 2 else 0
    for name, tensor in applied.items():
        if tensor.dim() != 2 or tensor.shape[0] != rows or tensor.shape[1] not in (1, width):
            raise GrpoInputError(name, f"({rows}, {width}) or ({rows}, 1)", got=f"shape {tuple(tensor.shape)}")
    info = {
        "step": step,
        "micro": micro,
        "rank": rank,
        "meta": meta,
        "config": config,
        "tensors": display,
        "trainer": applied,
    }
    return fields, info


def _group_size(tensor: Tensor) -> int:
    """A step file's group_size: one finite whole number (a 0-d tensor)."""
    got = f"shape {tuple(tensor.shape)}"
    if tensor.numel() == 1:
        value = float(tensor.reshape(()).double())
        if math.isfinite(value) and value == int(value):
            return int(value)
        got = repr(value)
    raise GrpoInputError("group_size", "one whole number (a 0-d tensor)", got=got)


def load_step(path: str | os.PathLike[str]) -> tuple[Batch, LossConfig, dict[str, Any]]:
    """(the Batch, its config, info) of a step file; info holds step, micro, rank, meta and the
    display tensors (``row_rewards``, ``row_groups``) under ``tensors``."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    path = Path(path)
    try:
        data = read_regular(path)
        try:
            tensors = load(data)
        except SafetensorError as exc:
            raise GrpoInputError("file", "a valid safetensors file", got=str(exc)[:200]) from exc
        fields, info = step_request(tensors, read_metadata(data))
        return Batch(**fields), config_from_dict(info["config"]), info
    except GrpoInputError as exc:  # a run holds many step files: say which one
        raise GrpoInputError(exc.field, f"{exc.expected} (in the step file {path.name})", exc.row, exc.got) from exc
