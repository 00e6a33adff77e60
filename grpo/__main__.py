"""python -m grpo: the breakdown of the article's example, or of a file.

python -m grpo                          the article's example, as a table
python -m grpo eval FILE [--preset NAME] [--json] [--set field=value ...]
python -m grpo check-run RUN_DIR [--rtol R] [--metric-atol A] [--json] [--jobs N | --ray ADDRESS]
                                        exit 0 match, 1 differ, 2 error, 3 unchecked
python -m grpo import {nemo-rl,slime} DIR RUN_DIR [--config FILE]
python -m grpo report RUN_DIR [--html OUT] [--json OUT] [--worst N] [--jobs N]
                                        one self-contained HTML report (needs grpo-lens[report])

A run's step file (``steps/000001-000.safetensors``) carries its config: ``eval`` uses it, ``--preset``
replaces it and ``--set`` overrides its fields.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from grpo._allocator import keep_freed_memory
from grpo.check import (
    DEFAULT_METRIC_ATOL,
    DEFAULT_RTOL,
    DIFFER,
    ERROR,
    MATCH,
    UNCHECKED,
    check_pool,
    check_run,
    format_check,
)
from grpo.config import PRESETS, LossConfig
from grpo.errors import GrpoInputError
from grpo.importers import CONFIG_READERS, IMPORTERS
from grpo.io import UPLOAD_FORMATS, load_file
from grpo.loss import evaluate
from grpo.report import DEFAULT_WORST, write_report
from grpo.requests import batch_from_request, row_lengths
from grpo.runs import is_step_metadata, load_run, load_step, read_metadata
from grpo.view.answer import breakdown_to_json, dumps
from grpo.view.examples import ARTICLE_EXAMPLE
from grpo.view.explain import summary_table


def _jobs(text: str) -> int:
    jobs = int(text)
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"a number of processes >= 1, got {jobs}")
    return jobs


def _count(text: str) -> int:
    count = int(text)
    if count < 0:
        raise argparse.ArgumentTypeError(f"a number of steps >= 0, got {count}")
    return count


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grpo", description="GRPO Lens: explain a GRPO-family loss.")
    sub = parser.add_subparsers(dest="command")
    formats = ", ".join(f.label for f in UPLOAD_FORMATS)
    ev = sub.add_parser("eval", help=f"evaluate a batch file ({formats}) or a run's step file")
    ev.add_argument("file", type=Path)
    ev.add_argument("--preset", default=None, help=f"one of {', '.join(PRESETS)} (default: the file's, else article)")
    ev.add_argument("--json", action="store_true", help="print the whole breakdown as JSON")
    ev.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a config field")
    check = sub.add_parser("check-run", help="recompute every micro-batch of a run and compare with the trainer")
    check.add_argument("run_dir", type=Path)
    check.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="relative tolerance on each loss")
    check.add_argument("--metric-atol", type=float, default=DEFAULT_METRIC_ATOL, help="absolute tolerance on metrics")
    check.add_argument("--json", action="store_true", help="print the check as JSON")
    check.add_argument(
        "--jobs",
        type=_jobs,
        default=os.cpu_count() or 1,
        help="processes evaluating files in parallel (default: cores)",
    )
    check.add_argument("--ray", metavar="ADDRESS", help="spread the files over a Ray cluster (auto, ray://..., local)")
    imp = sub.add_parser("import", help="write another trainer's dumps as a new run (nemo-rl, slime)")
    imp.add_argument("trainer", choices=sorted(IMPORTERS))
    imp.add_argument("dir", type=Path, help="the trainer's dump directory")
    imp.add_argument("run_dir", type=Path, help="the run to create (must not exist)")
    imp.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the trainer's loss settings, JSON or YAML (nemo-rl: its loss_fn section or whole config; "
        "slime: its argument names, e.g. eps_clip); default: the trainer's defaults",
    )
    _report_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-run":
        return _check_run(args)
    if args.command == "import":
        return _import(args)
    if args.command == "report":
        return _report(args)
    try:
        if args.command == "eval" and _is_step_file(args.file):
            return _eval_step_file(args)
        is_file = args.command == "eval"
        request = load_file(args.file.name, _read_file(args.file)) if is_file else dict(ARTICLE_EXAMPLE)
        config_fields = request.pop("config", None) or {}
        if not isinstance(config_fields, dict):
            raise GrpoInputError("config", "a JSON object: a preset and overrides", got=type(config_fields).__name__)
        if is_file and args.preset:
            config_fields["preset"] = args.preset
        config = LossConfig.resolve(config_fields | _sets(getattr(args, "set", [])))
        tokens = request.pop("tokens", None)
        lengths = row_lengths(request)
        bd = evaluate(batch_from_request(request), config)
    except (GrpoInputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "json", False):
        print(dumps(breakdown_to_json(bd, lengths=lengths, tokens=tokens)).decode())
    else:
        print(summary_table(bd))
    return 0


CHECK_EXIT = {ERROR: 2, DIFFER: 1, UNCHECKED: 3, MATCH: 0}
"""check-run's exit status by the run's verdict: 2 if a file could not be read (or the run itself), else 1 if a
number differs, else 3 if anything was left unchecked, else 0."""


def _check_run(args: argparse.Namespace) -> int:
    """Exit by the run's verdict (``CHECK_EXIT``); 2 on a run that cannot be read."""
    try:
        run = load_run(args.run_dir)
        with check_pool(min(args.jobs, len(run.steps)), args.ray) as pool:
            result = check_run(run, rtol=args.rtol, metric_atol=args.metric_atol, pool=pool)
    except (GrpoInputError, OSError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=1) if args.json else format_check(result))
    return CHECK_EXIT[result.verdict]


def _import(args: argparse.Namespace) -> int:
    """Exit 0 with the run written, 2 on bad input (one line; nothing written)."""
    try:
        read = CONFIG_READERS.get(args.trainer, _settings_file)  # NeMo RL's defaults: relative to the file
        settings = None if args.config is None else read(args.config)
        path = IMPORTERS[args.trainer](args.dir, args.run_dir, settings)
        run = load_run(path)
    except (GrpoInputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"imported {len(run.steps)} step files from {args.dir} into {path} (python -m grpo check-run {path})")
    return 0


def _report_parser(sub: Any) -> None:
    rep = sub.add_parser("report", help="write one self-contained HTML report of a run (needs grpo-lens[report])")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--html", type=Path, default=None, help="the HTML file to write (default: RUN-report.html here)")
    rep.add_argument("--json", type=Path, default=None, help="also write the run's timeline as JSON")
    rep.add_argument("--worst", type=_count, default=DEFAULT_WORST, help="steps drawn token by token (default: 3)")
    rep.add_argument("--jobs", type=_jobs, default=os.cpu_count() or 1, help="processes reading step files")


def _report(args: argparse.Namespace) -> int:
    """Exit 0 with the report written, 2 on a run that cannot be read or without plotly (the extra named)."""
    out = args.html if args.html is not None else Path(f"{args.run_dir.resolve().name}-report.html")
    try:
        answer = write_report(args.run_dir, out, args.json, worst=args.worst, jobs=args.jobs)
    except (GrpoInputError, OSError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    anomalies = len(answer["anomalies"])
    print(f"wrote {out}: {len(answer['steps'])} steps, {answer['verdict']}, {anomalies} anomalies")
    return 0


def _settings_file(path: Path) -> Any:
    """A trainer's settings from a JSON file, or YAML (safe_load, when PyYAML is installed)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # optional: only a YAML config needs it
        except ImportError as exc:
            raise GrpoInputError("--config", "a JSON file (PyYAML is not installed for YAML)") from exc
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise GrpoInputError("--config", "valid YAML", got=str(exc).splitlines()[0][:120]) from exc
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise GrpoInputError("--config", "valid JSON (or a .yaml file)", got=str(exc)[:120]) from exc


def _sets(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = _value(value)
    return out


def _read_file(path: Path) -> bytes:
    """A regular file's bytes (through a link too); a FIFO, a device or a directory is refused at once: a
    FIFO's read would wait for a writer forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of waiting for a writer
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise GrpoInputError("file", "a regular file", got=f"{path}, which is not one")
        return f.read()


def _is_step_file(path: Path) -> bool:
    if path.suffix != ".safetensors" or not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else 0
        data = head + f.read(min(size, 100_000_000))
    try:
        return is_step_metadata(read_metadata(data))
    except GrpoInputError:
        return False


def _eval_step_file(args: argparse.Namespace) -> int:
    """A run's step file under its own config (``--preset`` replaces it, ``--set`` overrides fields)."""
    try:
        batch, stored, _ = load_step(args.file)
        config = LossConfig.resolve({"preset": args.preset, **_sets(args.set)}, base=stored)
        bd = evaluate(batch, config)
    except (GrpoInputError, OSError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(dumps(breakdown_to_json(bd)).decode())
    else:
        print(summary_table(bd))
    return 0


if __name__ == "__main__":
    keep_freed_memory()  # the CLI's process: a large file's (B, T) buffers stay in the heap
    code = main()
    # At exit the interpreter's last collections walk every object torch's import made: 0.2-0.4 s of a
    # check-run's wall on a 2-core machine. Frozen, they are skipped; nothing of ours runs after this.
    gc.freeze()
    raise SystemExit(code)
