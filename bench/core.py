"""Benchmark: grpo.evaluate (forward, backward, the whole breakdown) against the bare article loss.

Both run on the same ragged 256 x 4096 batch in this process; prints the medians and their ratio.
Target: ratio <= 1.0 (the whole breakdown costs no more than the bare loss).

    .venv/bin/python bench/core.py [--rows 256] [--tokens 4096] [--repeats 15] [--preset article]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

import grpo
from grpo._allocator import keep_freed_memory


def ragged_batch(B: int, T: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 8, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # right padding
    old = -torch.rand(B, T, generator=g) * 4 - 0.01
    logp = (old + 0.3 * torch.randn(B, T, generator=g)).clamp(max=0)
    ref = (old + 0.1 * torch.randn(B, T, generator=g)).clamp(max=0)
    adv = torch.randn(B, generator=g)
    return {"logp": logp, "old": old, "ref": ref, "mask": mask, "adv": adv}


def as_batch(t: dict[str, torch.Tensor]) -> grpo.Batch:
    """``ragged_batch``'s tensors as a grpo.Batch (with its checks)."""
    return grpo.Batch(
        per_token_logps=t["logp"],
        old_per_token_logps=t["old"],
        ref_per_token_logps=t["ref"],
        completion_mask=t["mask"],
        advantages=t["adv"],
    )


def article_kl(pi_logprob: torch.Tensor, pi_ref_logprob: torch.Tensor) -> torch.Tensor:
    """The article's grpo_kl, as written."""
    return pi_ref_logprob.exp() / pi_logprob.exp() - (pi_ref_logprob - pi_logprob) - 1


def article_loss(
    pi: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The article's grpo_loss, line for line, with a ragged mask and per-row lengths in place of
    its input_len slice and its one shared len_oi."""
    epsilon, beta = 0.2, 0.01
    bs = pi.shape[0]
    len_oi = mask.sum(-1).clamp(min=1)
    ratio = torch.exp(pi - old)
    ratio_clip = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
    advantage = adv.unsqueeze(dim=1)
    policy_gradient = torch.minimum(ratio * advantage, ratio_clip * advantage)
    kl = article_kl(pi, ref)
    loss = (policy_gradient - beta * kl) * mask
    loss = (-1 / bs) * (1 / len_oi.unsqueeze(dim=1)) * loss
    return loss.sum()


def time_interleaved(fns: list[Callable[[], object]], repeats: int) -> list[list[float]]:
    """Times each function ``repeats`` times, taking turns, so machine noise hits all alike."""
    for fn in fns:
        fn()  # warm-up
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for times, fn in zip(out, fns, strict=True):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return out


def main() -> None:
    keep_freed_memory()  # the program decides: large (B, T) buffers stay in the heap between calls
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--preset", default="article")
    args = parser.parse_args()
    t = ragged_batch(args.rows, args.tokens)
    batch = as_batch(t)
    config = grpo.LossConfig.from_preset(args.preset)

    def bare() -> None:
        pi = t["logp"].clone().requires_grad_(True)
        article_loss(pi, t["old"], t["ref"], t["adv"], t["mask"]).backward()

    def full() -> None:
        grpo.evaluate(batch, config)

    def full_with_checks() -> None:
        grpo.evaluate(as_batch(t), config)

    bare_t, full_t, checked_t = (
        statistics.median(times) for times in time_interleaved([bare, full, full_with_checks], args.repeats)
    )
    tokens = int(t["mask"].sum())
    print(
        f"batch: {args.rows} x {args.tokens} ragged ({tokens} counted tokens), preset {args.preset}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"bare article loss, forward + backward : {bare_t * 1e3:8.2f} ms (median of {args.repeats})")
    print(f"grpo.evaluate, whole breakdown        : {full_t * 1e3:8.2f} ms")
    print(f"grpo.Batch checks + grpo.evaluate     : {checked_t * 1e3:8.2f} ms")
    print(f"ratio evaluate / bare                 : {full_t / bare_t:8.2f}  (target <= 1.0)")


if __name__ == "__main__":
    main()
