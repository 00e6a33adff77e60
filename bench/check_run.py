"""check-run at scale: its wall time against its floor, and its peak memory as the run grows.

A run of FILES micro-batches of ROWS x WIDTH tokens is generated (random log-probs, ragged rows, the loss each
file's config gives recorded as the trainer's). Then, side by side:
- floor = max(reading every file cold (each file's pages dropped first with posix_fadvise DONTNEED),
  evaluating them serially in this process / the cores): no parallel check can beat both;
- `python -m grpo check-run RUN --jobs CORES`, cold too, its wall time (process start and spawning its pool
  included) and its ratio to the floor (target <= 1.5x);
- the peak RSS of that command (its own process and the largest of its pool's) at 20 files and at FILES
  (target: FILES's <= 1.2x the peak at 20): flat in the number of files.
Run: .venv/bin/python bench/check_run.py [--files 200] [--rows 64] [--width 2048] [--jobs CORES]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpo  # noqa: E402
from grpo.check import check_run  # noqa: E402
from grpo.runs import RunWriter, load_run, load_step  # noqa: E402

# The CLI in a child that reports its own peak RSS and its children's (the pool), in KiB (Linux's ru_maxrss).
MEASURED = """
import json, resource, sys
from grpo.__main__ import main
code = main(sys.argv[1:])
peak = {"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}
print(json.dumps(peak), file=sys.stderr)
raise SystemExit(code)
"""


def generate(run_dir: Path, files: int, rows: int, width: int) -> None:
    config = grpo.LossConfig.from_preset("trl-dapo")
    writer = RunWriter(run_dir, "trl", config)
    g = torch.Generator().manual_seed(0)
    for i in range(files):
        lengths = torch.randint(width // 4, width + 1, (rows,), generator=g)
        mask = torch.arange(width)[None, :] < lengths[:, None]
        old = -torch.rand(rows, width, generator=g) * 3 - 0.01
        tensors = {
            "per_token_logps": (old + 0.05 * torch.randn(rows, width, generator=g)).clamp(max=0),
            "old_per_token_logps": old,
            "completion_mask": mask,
            "advantages": torch.randn(rows, generator=g),
        }
        step, micro = i // 4 + 1, i % 4
        path = writer.write_step(step, micro, tensors, {})
        assert path is not None
        batch, stored, _ = load_step(path)
        loss = float(grpo.evaluate(batch, stored).loss)
        writer.write_step(step, micro, tensors, {"loss": loss})
    writer.update(status="done")


def drop_cache(run_dir: Path) -> None:
    for path in run_dir.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def read_cold(run_dir: Path) -> float:
    drop_cache(run_dir)
    start = time.perf_counter()
    for ref in load_run(run_dir).steps:
        ref.path.read_bytes()
    return time.perf_counter() - start


def serial_eval(run_dir: Path) -> float:
    run = load_run(run_dir)
    start = time.perf_counter()
    check = check_run(run)
    elapsed = time.perf_counter() - start
    assert check.ok
    return elapsed


def check_run_cli(run_dir: Path, jobs: int) -> tuple[float, int]:
    """Wall seconds (cold) and peak RSS in MiB (the CLI's process or its largest pool process)."""
    drop_cache(run_dir)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, "check-run", str(run_dir), "--jobs", str(jobs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"check-run exited {done.returncode}: {done.stderr[-2000:]}")
    peak = json.loads(done.stderr.strip().splitlines()[-1])
    return elapsed, max(peak["self"], peak["children"]) // 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--small", type=int, default=20, help="the smaller run, for the memory figure")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        big, small = Path(tmp) / "big", Path(tmp) / "small"
        start = time.perf_counter()
        generate(big, args.files, args.rows, args.width)
        generate(small, args.small, args.rows, args.width)
        size = sum(p.stat().st_size for p in big.rglob("*.safetensors")) / 2**20
        print(
            f"generated {args.files} + {args.small} files of {args.rows} x {args.width} in "
            f"{time.perf_counter() - start:.0f} s ({size:.0f} MiB for the large run)"
        )
        cold = read_cold(big)
        serial = serial_eval(big)
        floor = max(cold, serial / cores)
        wall, peak_big = check_run_cli(big, args.jobs)
        _, peak_small = check_run_cli(small, args.jobs)
    print(f"{'':34}{'seconds':>10}")
    print(f"{'read cold':34}{cold:>10.2f}")
    print(f"{'evaluate serially':34}{serial:>10.2f}")
    print(f"{f'floor = max(read, serial / {cores} cores)':34}{floor:>10.2f}")
    print(f"{f'check-run --jobs {args.jobs} (cold)':34}{wall:>10.2f}   {wall / floor:.2f}x the floor (target <= 1.5x)")
    print(
        f"peak RSS: {peak_small} MiB at {args.small} files, {peak_big} MiB at {args.files} files: "
        f"{peak_big / peak_small:.2f}x (target <= 1.2x)"
    )


if __name__ == "__main__":
    main()
