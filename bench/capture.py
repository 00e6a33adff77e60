"""Capture overhead: a real TRL 1.16 GRPOTrainer training a >= 10M-parameter model on 16 x 1024-token
micro-batches, with and without grpo.capture.trl.

Generation at 1024 tokens is far too slow on a CPU, so the completions (and the sampler log-probs TRL's hook
asks for) come through TRL's own ``rollout_func``: a step is TRL's scoring of the completions, its loss, backward
and optimiser step (+ the capture). One run, one trainer: the capture records the even optimiser steps only
(``steps=``), so captured and uncaptured steps alternate under the same load; step 1 (warm-up) counts for neither.
Prints, from that run:
- the median step time with capture vs without, and their ratio (target every step: <= 1.03);
- the time the training loop itself spends recording (the hooks' ``_write``: the tensors handed to the writer
  thread, the config, the metadata) as a share of the captured steps' time, and the writer thread's drain at exit;
- capturing every 10th step (``every=10``): one captured step in ten, so the run's overhead is a tenth of the
  per-step overhead above (the nine others pay one ``wants`` check): derived from the same medians, and from the
  in-loop share (target <= 0.5%).
Run: .venv/bin/python bench/capture.py [--steps 13] [--rows 16] [--tokens 1024] [--quick] [--control]
(--control: the same run capturing nothing, to see what the even/odd split gives without the capture.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16

import torch  # noqa: E402

import grpo.capture  # noqa: E402
import grpo.runs  # noqa: E402
from grpo.capture import trl_hooks  # noqa: E402

# (hidden, intermediate, layers): 10.8M parameters with the character vocabulary; --quick: a tiny one
FULL_MODEL = (256, 1024, 11)
QUICK_MODEL = (32, 64, 2)


def build_model(model_dir: Path, shape: tuple[int, int, int], positions: int) -> int:
    """A Qwen2 built from a config (random weights, no hub) and the tests' character tokenizer, saved to
    ``model_dir``; returns its parameter count."""
    from trainers import char_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, intermediate, layers = shape
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return sum(p.numel() for p in model.parameters())


class Completions:
    """TRL's ``rollout_func``: ``tokens`` random hex digits per prompt (the last one EOS) and a log-prob for each."""

    def __init__(self, tokens: int, seed: int = 0) -> None:
        self.tokens = tokens
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        tok = trainer.processing_class
        digits = torch.tensor(tok.convert_tokens_to_ids(list("0123456789abcdef")))  # rewards with spread
        prompt_ids, completions, logprobs = [], [], []
        for prompt in prompts:
            prompt_ids.append(tok(prompt if isinstance(prompt, str) else prompt["prompt"])["input_ids"])
            ids = digits[torch.randint(0, len(digits), (self.tokens,), generator=self.g)].tolist()
            ids[-1] = tok.eos_token_id
            completions.append(ids)
            logprobs.append((-0.05 - 3 * torch.rand(self.tokens, generator=self.g)).tolist())
        return {"prompt_ids": prompt_ids, "completion_ids": completions, "logprobs": logprobs}


def step_clock() -> Any:
    """A TrainerCallback timing each optimiser step (on_step_begin -> on_step_end), by global step: its wall time
    and the CPU time of the whole process over it (every thread: the capture's writer thread too). On a shared
    machine the CPU time moves far less with the load than the wall time does."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.start = (0.0, 0.0)
            self.times: dict[int, float] = {}
            self.cpu: dict[int, float] = {}

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = (time.perf_counter(), time.process_time())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = int(state.global_step)
            self.times[step] = time.perf_counter() - self.start[0]
            self.cpu[step] = time.process_time() - self.start[1]

    return Clock()


def run(
    root: Path, shape: tuple[int, int, int], rows: int, tokens: int, steps: int, control: bool = False
) -> dict[str, Any]:
    from trainers import grpo_trainer

    model_dir = root / "model"
    params = build_model(model_dir, shape, positions=tokens + 64)
    trainer = grpo_trainer(
        root / "out",
        "dapo",
        steps=steps,
        model_dir=model_dir,
        rollout_func=Completions(tokens),
        beta=0.0,  # no reference model: every step is the policy's loss, backward and optimiser step only
        per_device_train_batch_size=rows,
        num_generations=4,
        gradient_accumulation_steps=1,
        num_iterations=1,
        max_completion_length=tokens,
        learning_rate=1e-4,
        logging_steps=steps,  # TRL prints each log: once, at the end
    )
    clock = step_clock()
    trainer.add_callback(clock)
    recording = {"seconds": 0.0, "calls": 0}
    original = trl_hooks._TrlHooks._write

    def recorded(self: trl_hooks._TrlHooks, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        try:
            original(self, *args, **kwargs)
        finally:
            recording["seconds"] += time.perf_counter() - start
            recording["calls"] += 1

    import safetensors.torch

    # the writer thread's job, off the loop: serialise (safetensors' save), write and rename (write_atomic; run.json
    # too)
    writing = {"seconds": 0.0}
    write_atomic, save = grpo.runs.write_atomic, safetensors.torch.save

    def timed(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                writing["seconds"] += time.perf_counter() - start

        return call

    captured = set(range(2, steps + 1, 2))  # even steps captured, odd ones not: alternating under one load
    trl_hooks._TrlHooks._write = recorded  # type: ignore[method-assign]
    grpo.runs.write_atomic, safetensors.torch.save = timed(write_atomic), timed(save)
    try:
        # --control: the hooks installed, no step captured (the even/odd split of the same setup, capture aside)
        with grpo.capture.trl(trainer, root / "run", steps=set() if control else captured) as writer:
            trainer.train()
            drain = time.perf_counter()
        drain = time.perf_counter() - drain  # the writer thread finishing its last files (close)
    finally:
        trl_hooks._TrlHooks._write = original  # type: ignore[method-assign]
        grpo.runs.write_atomic, safetensors.torch.save = write_atomic, save
    files = sorted((root / "run" / "steps").glob("*.safetensors"))
    return {
        "params": params,
        "times": clock.times,
        "cpu": clock.cpu,
        "writing": writing["seconds"],
        "captured": captured,
        "recording": recording,
        "drain": drain,
        "files": len(files),
        "file_bytes": statistics.median(f.stat().st_size for f in files) if files else 0,
        "written": writer.written_bytes,
    }


def split(by_step: dict[int, float], captured: set[int]) -> tuple[list[float], list[float]]:
    """(uncaptured, captured) values, step 1 (warm-up) in neither."""
    plain = [v for s, v in sorted(by_step.items()) if s > 1 and s not in captured]
    return plain, [v for s, v in sorted(by_step.items()) if s in captured]


def report(result: dict[str, Any], rows: int, tokens: int, steps: int) -> dict[str, float]:
    captured = result["captured"]
    plain, taken = split(result["times"], captured)
    plain_cpu, taken_cpu = split(result["cpu"], captured)
    p, c = statistics.median(plain), statistics.median(taken)
    pc, cc = statistics.median(plain_cpu), statistics.median(taken_cpu)
    loop = result["recording"]["seconds"]
    work = loop + result["writing"]  # every second the capture spends, on the loop or on its writer thread
    files = max(result["files"], 1)
    print(
        f"TRL 1.16 dapo, Qwen2 of {result['params'] / 1e6:.1f}M parameters built from a config, micro-batches of "
        f"{rows} x {tokens} tokens (completions through rollout_func), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, {steps} steps: even steps captured ({len(taken)}), odd not "
        f"({len(plain)}; step 1 warm-up, left out)"
    )
    print("step wall, s (uncaptured): " + ", ".join(f"{t:.2f}" for t in plain))
    print("step wall, s (captured)  : " + ", ".join(f"{t:.2f}" for t in taken))
    print("step CPU, s (uncaptured) : " + ", ".join(f"{t:.2f}" for t in plain_cpu))
    print("step CPU, s (captured)   : " + ", ".join(f"{t:.2f}" for t in taken_cpu))
    print(
        f"step files: {result['files']}, {result['file_bytes'] / 1e6:.2f} MB each; per captured step: recording on "
        f"the training loop (_write) {loop / files * 1e3:.1f} ms, the writer thread (serialise + write) "
        f"{result['writing'] / files * 1e3:.1f} ms; the drain at exit {result['drain'] * 1e3:.1f} ms"
    )
    print(f"every step : median wall {c:.3f} s captured vs {p:.3f} s not: ratio {c / p:.4f} (target <= 1.03)")
    print(f"             median CPU  {cc:.3f} s captured vs {pc:.3f} s not: ratio {cc / pc:.4f}")
    share = work / files / min(p, pc)  # of the smaller of an uncaptured step's wall and CPU time: the larger share
    print(
        f"             the capture's own work (loop + writer thread): {work / files:.4f} s a step, "
        f"{share:.3%} of an uncaptured step's wall or CPU time (on the loop alone: {loop / files / min(p, pc):.3%})"
    )
    print(
        f"every=10   : one step in ten captured, the nine others pay one wants() check: over the run "
        f"{share / 10:.4%} (the capture's work), {(c / p - 1) / 10:+.3%} ((wall ratio - 1) / 10), "
        f"{(cc / pc - 1) / 10:+.3%} ((CPU ratio - 1) / 10) (target <= 0.5%)"
    )
    return {"ratio": c / p, "cpu_ratio": cc / pc, "work_share": share}


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="a smoke test: a tiny model, 4 x 32 tokens, 5 steps")
    parser.add_argument(
        "--control", action="store_true", help="capture no step: 'captured' then means the even steps, uncaptured"
    )
    args = parser.parse_args(argv)
    shape = QUICK_MODEL if args.quick else FULL_MODEL
    rows, tokens, steps = (4, 32, 5) if args.quick else (args.rows, args.tokens, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(tmp), shape, rows, tokens, steps, args.control)
    if args.control:
        print("CONTROL: no step captured; 'captured' below means the even steps, which ran uncaptured")
    return report(result, rows, tokens, steps)


if __name__ == "__main__":
    main()
