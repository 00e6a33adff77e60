"""Benchmark: the HTTP API over loopback, against a real uvicorn (a script that prints figures, not a test).

1. latency: p50 and p99 of POST /api/v1/loss with the article's example against a bare GET /healthz,
   interleaved on one keep-alive connection. Target: /loss p50 <= 3x /healthz p50.
2. round trip of a 64 x 1024 batch: client JSON encoding, POST, evaluation and serialisation, the
   client parsing the response (every per-token array: 65,536 positions is within the full-token
   limit). Target: median <= 1 s.
3. load: 32 concurrent clients posting the article's example for 20 s: throughput, p50, p99 and
   errors (target: 0 errors).

Starts ``uvicorn app.main:app`` on a free loopback port (or uses --url) and stops it after. The
clients run in this process, on the same machine: their CPU time competes with the server's.

    .venv/bin/python bench/api.py [--url URL] [--requests 1000] [--clients 32] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grpo.examples import ARTICLE_EXAMPLE  # noqa: E402


@contextmanager
def server(url: str | None) -> Iterator[str]:
    """``url`` as given, or a fresh uvicorn on a free loopback port (stopped afterwards)."""
    if url:
        yield url.rstrip("/")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("uvicorn did not start") from None
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def percentile(times: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(times), q))


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f} ms"


def latency(base: str, requests: int) -> None:
    body = json.dumps(ARTICLE_EXAMPLE).encode()
    headers = {"content-type": "application/json"}
    health: list[float] = []
    loss: list[float] = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(20):  # warm-up: first-call costs, connection set-up
            client.get("/healthz")
            client.post("/api/v1/loss", content=body, headers=headers)
        for _ in range(requests):
            start = time.perf_counter()
            client.get("/healthz").raise_for_status()
            health.append(time.perf_counter() - start)
            start = time.perf_counter()
            client.post("/api/v1/loss", content=body, headers=headers).raise_for_status()
            loss.append(time.perf_counter() - start)
    h50, h99, l50, l99 = (percentile(t, q) for t in (health, loss) for q in (50, 99))
    print(f"1. latency over loopback, {requests} interleaved requests each, one keep-alive connection")
    print(f"   GET  /healthz                    p50 {ms(h50)}   p99 {ms(h99)}")
    print(f"   POST /api/v1/loss (article)      p50 {ms(l50)}   p99 {ms(l99)}")
    print(f"   ratio loss / healthz             p50 {l50 / h50:8.2f}x     p99 {l99 / h99:8.2f}x   (target <= 3x)")


def big_batch(rows: int, tokens: int, seed: int = 0) -> dict[str, Any]:
    g = np.random.default_rng(seed)
    old = -(g.random((rows, tokens)) * 3 + 0.05)
    logp = np.minimum(old + 0.3 * g.standard_normal((rows, tokens)), -1e-3)
    ref = np.minimum(logp + 0.1 * g.standard_normal((rows, tokens)), -1e-3)
    return {
        "per_token_logps": logp.round(5).tolist(),
        "old_per_token_logps": old.round(5).tolist(),
        "ref_per_token_logps": ref.round(5).tolist(),
        "rewards": g.integers(0, 2, rows).astype(float).tolist(),
        "group_size": 8,
        "config": {"preset": "verl-grpo", "beta": 0.01},
    }


def round_trip(base: str, rows: int, tokens: int, repeats: int) -> None:
    batch = big_batch(rows, tokens)
    times: list[float] = []
    encode: list[float] = []
    sizes = (0, 0)
    with httpx.Client(base_url=base, timeout=120) as client:
        for i in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            body = json.dumps(batch).encode()
            encoded = time.perf_counter()
            response = client.post("/api/v1/loss", content=body, headers={"content-type": "application/json"})
            response.raise_for_status()
            data = response.json()
            done = time.perf_counter()
            assert data["tokens_complete"] and data["num_positions"] == rows * tokens
            if i:
                times.append(done - start)
                encode.append(encoded - start)
            sizes = (len(body), len(response.content))
    print(f"2. round trip of a {rows} x {tokens} batch ({rows * tokens} positions, every per-token array back)")
    print(f"   request {sizes[0] / 2**20:.1f} MiB, response {sizes[1] / 2**20:.1f} MiB")
    print(f"   client JSON encoding             median {ms(statistics.median(encode))}")
    print(
        f"   whole round trip                 median {ms(statistics.median(times))}   "
        f"min {ms(min(times))}   (of {repeats}; target <= 1 s)"
    )


async def load(base: str, clients: int, seconds: float) -> None:
    body = json.dumps(ARTICLE_EXAMPLE).encode()
    headers = {"content-type": "application/json"}
    times: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        for _ in range(clients):  # open the connections
            await client.get("/healthz")
        stop = time.perf_counter() + seconds

        async def one_client() -> None:
            while time.perf_counter() < stop:
                start = time.perf_counter()
                try:
                    response = await client.post("/api/v1/loss", content=body, headers=headers)
                    if response.status_code != 200:
                        errors.append(str(response.status_code))
                except httpx.HTTPError as exc:
                    errors.append(type(exc).__name__)
                times.append(time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    print(f"3. load: {clients} concurrent clients, POST /api/v1/loss (article) for {seconds:.0f} s")
    print(f"   requests {len(times)}   throughput {len(times) / elapsed:8.1f} req/s")
    print(f"   latency                          p50 {ms(percentile(times, 50))}   p99 {ms(percentile(times, 99))}")
    print(f"   errors {len(errors)}{' ' + str(sorted(set(errors))) if errors else ''}   (target 0)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one on loopback)")
    parser.add_argument("--requests", type=int, default=1000, help="latency requests per endpoint")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5, help="round trips of the big batch")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    with server(args.url) as base:
        health = httpx.get(f"{base}/healthz").json()
        print(f"server {base}: torch {health['torch']}, device {health['device']}, {os.cpu_count()} CPUs here")
        latency(base, args.requests)
        round_trip(base, args.rows, args.tokens, args.repeats)
        asyncio.run(load(base, args.clients, args.seconds))


if __name__ == "__main__":
    main()
