"""Capture overhead: a real TRL 1.16 GRPOTrainer step on the tiny model, with and without grpo.capture.trl.

Prints the overhead as a ratio (target <= 5% of a step), two ways:
- the time the training loop spends recording each micro-batch (the hooks' _write: tensors, config,
  handing the file to the writer thread, which writes it off the loop's path) / the training time;
- the median step time with capture / without, from runs alternated (and their order too) so load
  drifts hit both; on a shared, loaded machine this ratio is noise-bound: read it with the load.
Run: .venv/bin/python bench/capture.py [--steps N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import grpo.capture  # noqa: E402
from grpo.capture import trl_hooks  # noqa: E402


def step_times(trainer: object) -> list[float]:
    logged = [entry.get("step_time") for entry in trainer.state.log_history]  # type: ignore[attr-defined]
    return [t for t in logged if isinstance(t, float)]


def one_run(root: Path, capture: bool, steps: int) -> tuple[list[float], float, float]:
    from trainers import grpo_trainer

    trainer = grpo_trainer(root / f"out-{time.perf_counter_ns()}", "dapo", steps=steps)
    spent = [0.0]
    original = trl_hooks._TrlHooks._write

    def timed(self: trl_hooks._TrlHooks, *args: object, **kwargs: object) -> None:
        start = time.perf_counter()
        try:
            original(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            spent[0] += time.perf_counter() - start

    start = time.perf_counter()
    if capture:
        trl_hooks._TrlHooks._write = timed  # type: ignore[method-assign]
        try:
            with grpo.capture.trl(trainer, root / f"run-{time.perf_counter_ns()}"):
                trainer.train()
        finally:
            trl_hooks._TrlHooks._write = original  # type: ignore[method-assign]
    else:
        trainer.train()
    total = time.perf_counter() - start
    # steps after the first: the first carries one-off warm-up
    return step_times(trainer)[1:], spent[0], total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    plain: list[float] = []
    captured: list[float] = []
    shares = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for capture in (False, True) if repeat % 2 == 0 else (True, False):  # alternate the order
                times, spent, total = one_run(Path(tmp), capture, args.steps)
                if capture:
                    captured += times
                    shares.append(spent / total)
                else:
                    plain += times
    p, c = statistics.median(plain), statistics.median(captured)
    print(f"tiny Qwen2, TRL 1.16 dapo, {args.steps} steps x {args.repeats} runs each, 2 micro-batches a step")
    print(f"time the training loop spends recording micro-batches (capture._write): {max(shares):.2%} of training")
    print(f"median step: {c * 1e3:.0f} ms with capture vs {p * 1e3:.0f} ms without: ratio {c / p:.3f}")


if __name__ == "__main__":
    main()
