"""Runs on disk: one directory per run, one self-describing safetensors file per micro-batch.

    run_dir/run.json                                   format, source, versions, config, created, status
    run_dir/logged.jsonl                               the metrics the trainer logged, a line per log call
    run_dir/steps/{step:06d}-{micro:03d}.safetensors   ("-rank{r}" before the extension per process)

This module writes runs (``RunWriter``, ``Sampling``) and is the public face of the rest: the directory's
layout and readers (``grpo.run_directory``).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from grpo.anomalies import AnomalyThresholds
from grpo.config import LossConfig
from grpo.errors import GrpoInputError
from grpo.run_directory import (
    BATCH_TENSORS,
    FORMAT,
    LOGGED_FILE,
    MAX_HEADER_BYTES,
    MAX_JSON_DEPTH,
    MAX_LOGGED_BYTES,
    SOURCES,
    STEP_DTYPES,
    STEP_FILE,
    SUPERSEDED,
    Run,
    StepRef,
    batch_tensors,
    check_info,
    config_dict,
    config_from_dict,
    create_atomic,
    dir_mode,
    file_mode,
    is_step_metadata,
    json_depth_ok,
    json_text,
    list_runs,
    load_run,
    load_step,
    open_regular,
    package_versions,
    plain_json,
    process_umask,
    read_header,
    read_logged,
    read_metadata,
    read_regular,
    step_request,
    utc_now,
    write_atomic,
)
from grpo.step_schema import step_tensors
from grpo.timeline import timeline

__all__ = [
    "BATCH_TENSORS",
    "FORMAT",
    "LOGGED_FILE",
    "MAX_HEADER_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_LOGGED_BYTES",
    "SOURCES",
    "STEP_DTYPES",
    "STEP_FILE",
    "SUPERSEDED",
    "AnomalyThresholds",
    "Run",
    "RunWriter",
    "Sampling",
    "StepRef",
    "batch_tensors",
    "check_info",
    "config_dict",
    "config_from_dict",
    "create_atomic",
    "dir_mode",
    "file_mode",
    "is_step_metadata",
    "json_depth_ok",
    "json_text",
    "list_runs",
    "load_run",
    "load_step",
    "open_regular",
    "package_versions",
    "plain_json",
    "process_umask",
    "read_header",
    "read_logged",
    "read_metadata",
    "read_regular",
    "step_request",
    "timeline",
    "utc_now",
    "write_atomic",
]


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
            "created": utc_now(),
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
        self.info |= keep | {"attempts": [*attempts, utc_now("milliseconds")]}

    def _info_bytes(self) -> bytes:
        return (json.dumps(self.info, indent=1, default=plain_json) + "\n").encode()

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
        line = (json.dumps({"step": step, "metrics": metrics}, default=plain_json) + "\n").encode()
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
            "config": json_text(self.config if config is None else config_dict(config)),
            "step": str(step),
            "micro": str(micro),
            "rank": "" if self.rank is None else str(self.rank),
            "meta": json_text(meta),
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
