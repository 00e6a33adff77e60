"""A run's directory: its layout, atomic writes, run.json and step files read back, headers.

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
from grpo.step_schema import DISPLAY_TENSORS, TRAINER_TENSORS  # what a step file holds

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


def json_text(value: Any) -> str:
    return json.dumps(value, allow_nan=True, default=plain_json)


def plain_json(value: Any) -> Any:
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


def utc_now(timespec: str = "seconds") -> str:
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


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
