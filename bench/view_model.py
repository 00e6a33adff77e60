"""The answer's view-model against the loss it explains: ``breakdown_to_json`` beside ``grpo.evaluate``.

On bench/api.py's 256 x 4096 batch with three log-prob fields (verl-grpo, beta 0.01), in this process: the
breakdown is evaluated once, then ``grpo.evaluate`` (from the batch) and ``breakdown_to_json`` (of that breakdown,
as /api/v1/loss builds it: per-token arrays for no row past ``full_token_limit``) are timed taking turns, median
of ``--repeats``, so machine load hits both alike: the figure is the ratio, never the milliseconds. The view-model
should be a small fraction of the evaluation it shows (target <= 0.31x: 15 ms beside evaluate's 48 ms).

    .venv/bin/python bench/view_model.py [--rows 256] [--tokens 4096] [--repeats 15] [--clock wall|cpu]

``--clock cpu`` times this thread's CPU time with torch on one thread: on a machine shared with other work it
moves far less with the load than the wall time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpo  # noqa: E402
from grpo._allocator import keep_freed_memory  # noqa: E402
from grpo.view.answer import breakdown_to_json  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from core import time_interleaved  # noqa: E402  (the same interleaved timing as bench/core.py)

FULL_TOKEN_LIMIT = 65_536  # app.settings' default: past it the answer carries no per-token rows
TARGET = 0.31
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def view_batch(rows: int, tokens: int) -> grpo.Batch:
    """bench/api.py's batch (three log-prob fields, 0/1 rewards, groups of 8) as tensors."""
    sys.path.insert(0, str(ROOT / "bench"))
    from api import batch

    data = batch(rows, tokens, fields=3)
    fields = {k: torch.tensor(v) for k, v in data.items() if k.endswith("logps") or k == "rewards"}
    return grpo.Batch(**fields, group_size=data["group_size"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()
    keep_freed_memory()  # as the server and its workers do: large buffers reused, not page-faulted in per call
    if args.clock == "cpu":
        torch.set_num_threads(1)
    batch = view_batch(args.rows, args.tokens)
    config = grpo.LossConfig.from_preset("verl-grpo", beta=0.01)
    bd = grpo.evaluate(batch, config)
    evaluate, view = time_interleaved(
        [lambda: grpo.evaluate(batch, config), lambda: breakdown_to_json(bd, max_tokens=FULL_TOKEN_LIMIT)],
        args.repeats,
        CLOCKS[args.clock],
    )
    e_ms, v_ms = statistics.median(evaluate) * 1000, statistics.median(view) * 1000
    load = os.getloadavg()[0]
    print(f"batch {args.rows} x {args.tokens}, verl-grpo beta 0.01; clock {args.clock}; load average {load:.2f}")
    print(f"grpo.evaluate      median {e_ms:8.2f} ms  (min {min(evaluate) * 1000:.2f})")
    print(f"breakdown_to_json  median {v_ms:8.2f} ms  (min {min(view) * 1000:.2f})")
    print(f"ratio breakdown_to_json / evaluate: {v_ms / e_ms:.2f}x (target <= {TARGET}x)")


if __name__ == "__main__":
    main()
