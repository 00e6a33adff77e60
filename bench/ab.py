"""A/B benchmark: small /api/v1/loss requests against two checkouts' servers, alternated (a script, not a test).

Starts one uvicorn per checkout (as bench/api.py does: ``--http app.server:HeaderTimeoutHttpTools``), both
up for the whole run, then alternates them ``--rounds`` times: each round, each server in turn gets
``bench/api.py``'s small clients (40 clients, an 8 x 64 batch each about once a second) for ``--seconds``.
Per phase: p50 and p99 latency, the server main process's CPU per request (user + system from /proc,
its thread lane included: small requests are computed there), and the bytes of one answer. The machine
is shared: the rounds alternate so that noise falls on both sides, and the medians over rounds and
their ratios (B / A) are the figures to quote.

    .venv/bin/python bench/ab.py --base ../base46 [--rounds 5] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

import api  # bench/api.py: its server, clients and /proc readers


class Phase(NamedTuple):
    p50: float
    p99: float
    cpu_per_request: float
    requests: int
    errors: list[str]


def phase(base: str, pid: int, body: bytes, clients: int, seconds: float) -> Phase:
    """One server's small clients for ``seconds``, with its main process's CPU over the same span."""
    gc.collect()
    before = api.cpu_seconds(pid)
    seen = asyncio.run(api.small_clients(base, clients, seconds, body))
    after = api.cpu_seconds(pid)
    cpu = (after - before) / max(len(seen.times), 1) if before is not None and after is not None else float("nan")
    return Phase(api.pct(seen.times, 50), api.pct(seen.times, 99), cpu, len(seen.times), seen.errors)


def answer_bytes(base: str, body: bytes) -> int:
    response = httpx.post(f"{base}/api/v1/loss", content=body, headers=api.JSON, timeout=60)
    response.raise_for_status()
    return len(response.content)


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the baseline checkout (A)")
    parser.add_argument(
        "--head", type=Path, default=api.ROOT, help="the checkout measured against it (B; default: this one)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=40)
    args = parser.parse_args()
    body = json.dumps(api.batch(8, 64, fields=3, seed=1, digits=4)).encode()
    sides = {"A": args.base.resolve(), "B": args.head.resolve()}
    with ExitStack() as stack:
        bases: dict[str, tuple[str, int]] = {}
        for name, root in sides.items():
            base = stack.enter_context(api.server(None, 8.0, 0, root=root))
            bases[name] = (base, api.STATE["pid"])
        sizes = {name: answer_bytes(base, body) for name, (base, _) in bases.items()}
        for base, _ in bases.values():  # warm: connections, first calls
            asyncio.run(api.small_clients(base, args.clients, 2, body))
        time.sleep(1)
        seen: dict[str, list[Phase]] = {name: [] for name in sides}
        for r in range(args.rounds):
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]  # who goes first alternates too
            for name in order:
                base, pid = bases[name]
                got = phase(base, pid, body, args.clients, args.seconds)
                seen[name].append(got)
                print(
                    f"round {r + 1} {name}: p50 {api.ms(got.p50)}  p99 {api.ms(got.p99)}  "
                    f"main CPU/request {api.ms(got.cpu_per_request)}  requests {got.requests}  "
                    f"errors {len(got.errors)} {sorted(set(got.errors))}",
                    flush=True,
                )
    print(f"\nA = {sides['A']}\nB = {sides['B']}")
    print(
        f"{args.clients} clients, an 8 x 64 batch each about once a second, {args.seconds:.0f} s x {args.rounds} rounds"
    )
    print(f"{'':18}{'A (median)':>14}{'B (median)':>14}{'B / A':>9}")
    for label, key in (("p50", "p50"), ("p99", "p99"), ("CPU per request", "cpu_per_request")):
        a = median([getattr(p, key) for p in seen["A"]])
        b = median([getattr(p, key) for p in seen["B"]])
        print(f"{label:18}{api.ms(a):>14}{api.ms(b):>14}{b / a:8.2f}x")
    print(f"{'bytes per answer':18}{sizes['A']:>14,}{sizes['B']:>14,}{sizes['B'] / sizes['A']:8.2f}x")


if __name__ == "__main__":
    main()
