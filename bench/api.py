"""Benchmark: the HTTP API over loopback against a real uvicorn (a script that prints figures, not a test).

Each figure of issue 8 beside its floor or its alone-case, in one run:

1. latency: p50/p99 of POST /api/v1/loss (the article's example) against GET /healthz, interleaved on one
   keep-alive connection (target: /loss p50 <= 3x /healthz p50).
2. JSON ingest: a 256 x 4096 batch (three log-prob fields, floats written as Python writes them) round trip
   against the floor of ``orjson.loads`` plus the array conversion, in this process, the two alternated
   (issue 33: median <= 1.5x), with where the round trip's time went (the server's ``Server-Timing`` spans).
3. safetensors upload: the same batch as a file to /api/v1/upload against its in-process floor
   (safetensors load + ``evaluate``), alternated as in 2 (issue 33: median <= 2x).
4. the largest accepted request (1024 x 4096, two log-prob fields, 4,194,304 positions as JSON): its time,
   ``/healthz`` p99 while it is handled (target <= 100 ms) against /healthz alone, the peak RSS of the
   server's processes above idle (target <= 1.5 GB) and the RSS 10 s after (target: within 400 MB of start).
5. fairness: 40 clients sending small batches about once a second, alone and then beside a stream of
   1M-token (256 x 4096) JSON uploads: their median (issue 18: <= 1.3x alone, median over 10 runs, none
   above 1.5x) and p99 (target <= 0.3 s); then the same again interleaved, 2 s windows without and with
   the uploads alternating, so that a shared machine's other load falls on both sides alike.
   Beside them, where the time went: the server's spans of the small requests (Server-Timing), the main
   process's CPU per upload and its share of a core meanwhile (its GIL is what the small requests wait for).
6. hostile bodies: a 66 KB body padded to 4,001 x 4,000 and a 1.6 MB body padded to 100,001 x 2,000:
   status, time to answer, RSS growth (target: 413, at once, no growth).
7. load: 32 concurrent clients posting the article's example for a few seconds (target: 0 errors).
8. event streams: 1,000 lab event streams opened on one training run from 50 clients (distinct forwarded
   addresses), half never reading, the caps at their defaults: accepted and refused counts, and ``/healthz``
   and small ``/loss`` p99 while they are open against alone (targets <= 100 ms and <= 300 ms).
x. hostile export bodies: the 1.2 MB body (one 200,000-token row + 2,000 one-token rows, 400 M padded
   positions) and a 133 KB one (40 M) to /api/v1/export/{fmt} for every format, beside /api/v1/loss:
   status and time to answer (target: 413 in <= 0.1 s), RSS growth.
m. memory back: for each kind of large request (a 1M-token JSON /loss, the same batch as an uploaded
   JSON file, its export as safetensors and as JSON), the RSS of the server's main process plus its
   lane workers idle, at peak, and 10 s after (target: within 400 MB of idle).
w. the worst requests of issue 33, two clients looping each (from a process of their own): a 190 KB .npz whose
   read field unpacks near the unpack limit beside a 64M-element array under an ignored name (413), REINFORCE++
   (``reinforce-pp``) over ``token_level_rewards`` at the padded-position limit (2 rows x 2,097,152 tokens, a
   32 MB safetensors upload), a run zip (12 steps x 4 micro-batches of 16 x 2048 tokens) uploaded and deleted,
   and an NPZ export padded to the position limit, while 8 clients send small /loss requests: the core
   count and load average, /healthz p99 (target <= 100 ms) and small /loss p99 (target <= 3x alone), and the
   server's RSS 10 s after (target: within 400 MB of idle).
9. run pages: 4 concurrent GETs of the page of a 40,000-member run (4,000 with --quick; uploaded as a zip,
   deleted after), first read (its summary computed once, in a worker process) and warm (kept): /healthz
   p99 (target <= 100 ms) and small /loss p99 (target <= 300 ms) meanwhile, beside the two alone.
c. run pages and event streams together: figure 9's pages read while figure 8's 1,000 streams are open
   (the "alone" row is measured before either), same targets.

Starts ``uvicorn app.main:app --http app.server:HeaderTimeoutHttpTools`` (as `make run`; ``--http``
picks another protocol, e.g. ``app.server:HeaderTimeoutH11``) on a free loopback port under a memory
cap (``--cap-gb``, RLIMIT_AS, so a server that would allocate without bound fails its request instead
of the machine), or uses --url (then RSS figures are left out). The clients run in this process on the
same machine: their CPU time competes with the server's; on a shared machine, compare the ratios, not
the absolute times.

    .venv/bin/python bench/api.py [--url URL] [--quick] [--only 5] [--worst 24] [--root ../other-checkout]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from functools import partial
from pathlib import Path
from queue import Empty
from typing import Any, NamedTuple

import httpx
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpo  # noqa: E402
from grpo.view.examples import ARTICLE_EXAMPLE  # noqa: E402

JSON = {"content-type": "application/json"}
GB = 1024**3
MB = 1024**2
STREAM_RUN_STEPS = 20_000  # the lab run the event streams watch (figures 8 and c)
STATE: dict[str, Any] = {"pid": None, "auth": {}}


# --- the server and its memory ------------------------------------------------------------------------
@contextmanager
def server(
    url: str | None, cap_gb: float, port: int, http: str = "app.server:HeaderTimeoutHttpTools", root: Path = ROOT
) -> Iterator[str]:
    """``url`` as given, or a fresh uvicorn on loopback (``port``, or a free one) stopped afterwards, serving
    the checkout at ``root`` (default: this one; bench/ab.py serves two)."""
    if url:
        yield url.rstrip("/")
        return
    if not port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]

    def cap() -> None:
        limit = int(cap_gb * GB)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port), "--http", http],
        cwd=root,
        # the event streams' lab run trains through the longest phase (figure c's first read of a 40,000-member
        # run takes minutes): a run past the lab's default step and time limits, on this bench's own server only
        env=os.environ.copy() | {"GRPO_LENS_LAB_MAX_STEPS": str(STREAM_RUN_STEPS), "GRPO_LENS_LAB_MAX_SECONDS": "3600"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=cap if cap_gb else None,
    )
    STATE["pid"] = proc.pid
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("uvicorn did not start") from None
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def _tree(pid: int) -> list[int]:
    out = [pid]
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                for child in f.read().split():
                    out += _tree(int(child))
    except OSError:
        pass
    return out


def _statm(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of process ``pid`` so far (None without one: a server given by --url)."""
    split = cpu_split(pid)
    return None if split is None else split[0] + split[1]


def cpu_split(pid: int | None) -> tuple[float, float, int] | None:
    """User and system CPU seconds of process ``pid`` so far, and its minor page faults."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick, int(fields[7])


def rss() -> float | None:
    """Resident memory of the server and all its processes, bytes (None when the server is not ours)."""
    if STATE["pid"] is None:
        return None
    total = 0
    for pid in _tree(STATE["pid"]):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pass
    return float(total)


def mb(value: float | None) -> str:
    return "   n/a" if value is None else f"{value / MB:6.0f} MB"


class Sampler:
    """Samples the server's RSS every 20 ms in a thread; ``peak`` is the largest seen."""

    def __init__(self) -> None:
        self.peak = rss() or 0.0
        self.per_process: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss() or 0.0)
            for pid in _tree(STATE["pid"]) if STATE["pid"] else []:
                with suppress(OSError):
                    self.per_process[pid] = max(self.per_process.get(pid, 0.0), _statm(pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- figures ------------------------------------------------------------------------------------------
def pct(times: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(times), q)) if times else float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f} ms"


def batch(rows: int, tokens: int, fields: int = 3, seed: int = 0, digits: int | None = None) -> dict[str, Any]:
    """A random batch; ``digits=None`` writes floats as Python writes them (17 significant digits)."""
    g = np.random.default_rng(seed)
    old = -(g.random((rows, tokens)) * 3 + 0.05)
    logp = np.minimum(old + 0.3 * g.standard_normal((rows, tokens)), -1e-3)
    ref = np.minimum(logp + 0.1 * g.standard_normal((rows, tokens)), -1e-3)
    arrays = [logp, old, ref][:fields]
    if digits is not None:
        arrays = [a.round(digits) for a in arrays]
    names = ["per_token_logps", "old_per_token_logps", "ref_per_token_logps"][:fields]
    return {
        **{n: a.tolist() for n, a in zip(names, arrays, strict=True)},
        "rewards": g.integers(0, 2, rows).astype(float).tolist(),
        "group_size": 8,
        "config": {"preset": "verl-grpo", "beta": 0.01},
    }


def timed(fn: Callable[[], Any], repeats: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def latency(base: str, requests: int) -> None:
    body = json.dumps(ARTICLE_EXAMPLE).encode()
    health: list[float] = []
    loss: list[float] = []
    with httpx.Client(base_url=base, timeout=30, headers=STATE["auth"]) as client:
        for _ in range(20):  # warm-up: first-call costs, connection set-up
            client.get("/healthz")
            client.post("/api/v1/loss", content=body, headers=JSON)
        for _ in range(requests):
            start = time.perf_counter()
            client.get("/healthz").raise_for_status()
            health.append(time.perf_counter() - start)
            start = time.perf_counter()
            client.post("/api/v1/loss", content=body, headers=JSON).raise_for_status()
            loss.append(time.perf_counter() - start)
    h50, h99, l50, l99 = (pct(t, q) for t in (health, loss) for q in (50, 99))
    print(f"1. latency over loopback, {requests} interleaved requests each, one keep-alive connection")
    print(f"   GET  /healthz                    p50 {ms(h50)}   p99 {ms(h99)}")
    print(f"   POST /api/v1/loss (article)      p50 {ms(l50)}   p99 {ms(l99)}")
    print(f"   ratio loss / healthz             p50 {l50 / h50:8.2f}x     p99 {l99 / h99:8.2f}x   (target <= 3x)")


def against_floor(
    base: str, floor: Callable[[], Any], post: Callable[[httpx.Client, str], httpx.Response], path: str, repeats: int
) -> tuple[list[float], list[float], httpx.Response, list[dict[str, float]], list[float]]:
    """``floor()`` in this process, the round trip ``post(client, path)`` (answer parsed), and the same body
    posted to a path no route serves (its transport alone: sent, read in and spooled by the server, a 404),
    alternated (a busy moment of the machine falls on each alike) after a warm-up call of each: the seconds
    of each, the last answer, and the server's spans of each round trip (``Server-Timing``)."""
    floor_times: list[float] = []
    times: list[float] = []
    spans: list[dict[str, float]] = []
    transport: list[float] = []
    with httpx.Client(base_url=base, timeout=300, headers=STATE["auth"]) as client:
        floor()
        response = post(client, path)
        post(client, "/bench-no-route")
        for _ in range(repeats):
            floor_times += timed(floor, 1)[0]
            start = time.perf_counter()
            response = post(client, path)
            response.json()
            times.append(time.perf_counter() - start)
            spans.append(server_timing(response))
            transport += timed(lambda: post(client, "/bench-no-route"), 1)[0]
    return floor_times, times, response, spans, transport


def print_against_floor(floor_label: str, trip_label: str, found: tuple[Any, ...], target: float, size: int) -> None:
    """``against_floor``'s figures: medians, the ratio of the medians, and where the round trip's time went."""
    floor_times, times, response, spans, transport = found
    f, t = statistics.median(floor_times), statistics.median(times)
    print(f"   floor: {floor_label:25} median {ms(f)}   ({', '.join(f'{x * 1e3:.0f}' for x in floor_times)} ms)")
    runs = ", ".join(f"{x * 1e3:.0f}" for x in times)
    print(f"   {trip_label:32} median {ms(t)}   ({runs} ms), status {response.status_code}")
    span = {name: statistics.median(s.get(name, 0.0) for s in spans) for name in ("receive", "work", "compute")}
    print(
        f"   where it went (medians): the body's transport {ms(statistics.median(transport)).strip()} ({size / MB:.0f} "
        f"MB posted to no route: sent, read in, spooled), handing over {ms(span['work'] - span['compute']).strip()} "
        f"(lane, spool read), compute {ms(span['compute']).strip()} (read, check, evaluate, answer), the rest of "
        f"the round trip {ms(t - span['work'] - statistics.median(transport)).strip()}"
    )
    print(f"   ratio of the medians             {t / f:8.2f}x   (target <= {target:g}x), {len(times)} alternated runs")


def json_ingest(base: str, repeats: int) -> None:
    data = batch(256, 4096, fields=3)
    body = json.dumps(data).encode()
    names = ("per_token_logps", "old_per_token_logps", "ref_per_token_logps")

    def floor() -> None:
        parsed = orjson.loads(body)
        for name in names:
            np.asarray(parsed[name], dtype=np.float64)

    def post(client: httpx.Client, path: str) -> httpx.Response:
        return client.post(path, content=body, headers=JSON)

    found = against_floor(base, floor, post, "/api/v1/loss", repeats)
    print(f"2. JSON ingest: 256 x 4096, three log-prob fields, {len(body) / MB:.0f} MB, floats as Python writes them")
    print_against_floor("orjson.loads + arrays", "POST /api/v1/loss round trip", found, 1.5, len(body))


def safetensors_ingest(base: str, repeats: int) -> None:
    import torch
    from safetensors.torch import load, save

    data = batch(256, 4096, fields=3)
    tensors = {k: torch.tensor(v) for k, v in data.items() if k.endswith("logps") or k == "rewards"}
    tensors["group_size"] = torch.tensor(8)
    blob = save(tensors)
    config = grpo.LossConfig.from_preset("verl-grpo", beta=0.01)

    def floor() -> None:
        loaded = load(blob)
        loaded["group_size"] = int(loaded["group_size"])
        grpo.evaluate(grpo.Batch(**loaded), config)

    form = {"config": json.dumps({"preset": "verl-grpo", "beta": 0.01})}

    def post(client: httpx.Client, path: str) -> httpx.Response:
        return client.post(path, files={"file": ("b.safetensors", blob)}, data=form)

    found = against_floor(base, floor, post, "/api/v1/upload", repeats)
    print(f"3. safetensors upload: 256 x 4096, three fields, {len(blob) / MB:.0f} MB")
    print_against_floor("load + evaluate", "POST /api/v1/upload round trip", found, 2.0, len(blob))


def poll_health(base: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=base, timeout=60) as client:
        while not stop.is_set():
            start = time.perf_counter()
            with suppress(httpx.HTTPError):
                client.get("/healthz")
            out.append(time.perf_counter() - start)
            stop.wait(0.05)


def largest(base: str) -> None:
    body = json.dumps(batch(1024, 4096, fields=2, digits=4), separators=(",", ":")).encode()
    alone: list[float] = []
    stop = threading.Event()
    poller = threading.Thread(target=poll_health, args=(base, stop, alone))
    poller.start()
    time.sleep(3)
    stop.set()
    poller.join()
    time.sleep(1)
    idle = rss()
    during: list[float] = []
    stop = threading.Event()
    with Sampler() as sampler, httpx.Client(base_url=base, timeout=600, headers=STATE["auth"]) as client:
        poller = threading.Thread(target=poll_health, args=(base, stop, during))
        poller.start()
        start = time.perf_counter()
        response = client.post("/api/v1/loss", content=body, headers=JSON)
        elapsed = time.perf_counter() - start
        stop.set()
        poller.join()
    time.sleep(10)
    after = rss()
    peak = sampler.peak
    print(f"4. the largest accepted request: 1024 x 4096, two log-prob fields, {len(body) / MB:.0f} MB of JSON")
    print(f"   POST /api/v1/loss                {elapsed:8.2f} s    status {response.status_code}")
    print(
        f"   GET /healthz meanwhile           p50 {ms(pct(during, 50))}   p99 {ms(pct(during, 99))}   "
        f"max {ms(max(during, default=float('nan')))}   (target p99 <= 100 ms)"
    )
    print(f"   GET /healthz alone               p50 {ms(pct(alone, 50))}   p99 {ms(pct(alone, 99))}")
    if idle is not None:
        print(
            f"   RSS (all processes): idle {mb(idle)}, peak {mb(peak)} (+{mb(peak - idle)}, target <= +1536 MB), "
            f"10 s after {mb(after)} ({(after or 0) - idle:+.0f} B = {((after or 0) - idle) / MB:+.0f} MB, "
            "target within 400 MB)"
        )
        parts = ", ".join(f"{pid}: {mb(v).strip()}" for pid, v in sampler.per_process.items() if v > 50 * MB)
        print(f"   peak per process (the first is the server's main process): {parts}")


def server_timing(response: httpx.Response) -> dict[str, float]:
    """The server's own spans of a response (``Server-Timing: receive;dur=1.2, work;dur=...``), in seconds."""
    spans = {}
    for part in response.headers.get("server-timing", "").split(","):
        name, _, dur = part.strip().partition(";dur=")
        with suppress(ValueError):
            spans[name] = float(dur) / 1e3
    return spans


async def timed_post(
    client: httpx.AsyncClient,
    body: bytes,
    times: list[float],
    errors: list[str],
    spans: list[dict[str, float]] | None = None,
) -> float:
    """POST ``body`` to /api/v1/loss; its seconds go into ``times``, anything but a 200 into ``errors``,
    the server's own spans into ``spans`` (when given)."""
    start = time.perf_counter()
    try:
        response = await client.post("/api/v1/loss", content=body, headers=JSON)
        if response.status_code != 200:
            errors.append(str(response.status_code))
        elif spans is not None:
            spans.append(server_timing(response))
    except httpx.HTTPError as exc:
        errors.append(type(exc).__name__)
    took = time.perf_counter() - start
    times.append(took)
    return took


async def small_clients(base: str, clients: int, seconds: float, body: bytes) -> Clients:
    times: list[float] = []
    errors: list[str] = []
    spans: list[dict[str, float]] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits, headers=STATE["auth"]) as client:
        stop = time.perf_counter() + seconds
        rng = random.Random(0)

        async def one() -> None:
            await asyncio.sleep(rng.random())
            while time.perf_counter() < stop:
                took = await timed_post(client, body, times, errors, spans)
                await asyncio.sleep(max(0.0, 0.7 + 0.6 * rng.random() - took))

        await asyncio.gather(*(one() for _ in range(clients)))
    return Clients(times, errors, spans)


class Clients(NamedTuple):
    """What the small clients saw: each request's seconds, the errors, the server's spans of each 200."""

    times: list[float]
    errors: list[str]
    spans: list[dict[str, float]]

    def span(self, name: str) -> float:
        """The median of one server span (seconds): where a request's time went on the server."""
        return statistics.median(s.get(name, 0.0) for s in self.spans) if self.spans else float("nan")


def upload_stream(base: str, auth: dict[str, str], blob: bytes, stop: Any, statuses: Any, go: Any, idle: Any) -> None:
    """POST ``blob`` as an upload again and again until ``stop`` is set, while ``go`` is set; each status into
    ``statuses``. With ``go`` clear it sets ``idle`` (no upload of its in flight) and waits."""
    with httpx.Client(base_url=base, timeout=600, headers=auth) as client:
        while not stop.is_set():
            if not go.is_set():
                idle.set()
                go.wait(0.05)
                continue
            response = client.post("/api/v1/upload", files={"file": ("batch.json", blob)})
            statuses.put(response.status_code)
            if response.status_code == 503:
                stop.wait(float(response.headers.get("retry-after", "1")))


async def interleaved_clients(
    base: str, clients: int, seconds: float, body: bytes, go: Any, idle: Any, window: float
) -> dict[str, Clients]:
    """The small clients for ``2 * seconds``, in windows of ``window`` s that alternate between no uploads
    (``go`` clear, and the uploader's last upload answered) and uploads (``go`` set): a shared machine's
    other load falls on both sides alike, where "alone, then beside" puts a burst of it on one side only.
    A request counts for the window it started and ended in; one that straddles a change is left out."""
    phase: dict[str, str | None] = {"now": None}
    seen = {label: Clients([], [], []) for label in ("alone", "beside")}
    done = asyncio.Event()

    async def controller() -> None:
        for k in range(2 * max(1, round(seconds / window))):
            phase["now"] = None
            if k % 2 == 0:  # alone: the uploader stops, and its upload in flight is answered first
                idle.clear()
                go.clear()
                while not idle.is_set():
                    await asyncio.sleep(0.01)
            else:
                go.set()
            phase["now"] = "alone" if k % 2 == 0 else "beside"
            await asyncio.sleep(window)
        phase["now"] = None
        go.clear()
        done.set()

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits, headers=STATE["auth"]) as client:
        rng = random.Random(0)

        async def one() -> None:
            await asyncio.sleep(rng.random())
            while not done.is_set():
                label = phase["now"]
                times: list[float] = []
                errors: list[str] = []
                spans: list[dict[str, float]] = []
                took = await timed_post(client, body, times, errors, spans)
                if label is not None and phase["now"] == label:
                    seen[label].times.extend(times)
                    seen[label].errors.extend(errors)
                    seen[label].spans.extend(spans)
                await asyncio.sleep(max(0.0, 0.7 + 0.6 * rng.random() - took))

        await asyncio.gather(controller(), *(one() for _ in range(clients)))
    return seen


def main_cpu_per_upload(base: str, blob: bytes, uploads: int = 10) -> tuple[float, float, float] | None:
    """User and system CPU seconds the server's main process spends on one upload of ``blob``, and its
    page faults, the uploads one at a time (its work runs in a worker process: what is left here holds
    the GIL that small requests need; system time is the kernel's: socket copies, page faults)."""
    with httpx.Client(base_url=base, timeout=600, headers=STATE["auth"]) as client:
        client.post("/api/v1/upload", files={"file": ("batch.json", blob)})  # warm: the worker's first job
        before = cpu_split(STATE["pid"])
        for _ in range(uploads):
            client.post("/api/v1/upload", files={"file": ("batch.json", blob)})
        after = cpu_split(STATE["pid"])
    if before is None or after is None:
        return None
    user, system, faults = ((a - b) / uploads for a, b in zip(after, before, strict=True))
    return user, system, faults


def fairness(base: str, clients: int, seconds: float, window: float = 2.0) -> None:
    small = json.dumps(batch(8, 64, fields=3, seed=1, digits=4)).encode()
    upload = json.dumps(batch(256, 4096, fields=3, seed=2, digits=4), separators=(",", ":")).encode()
    asyncio.run(small_clients(base, clients, 2, small))  # warm-up: connections, first calls
    per_upload = main_cpu_per_upload(base, upload)
    alone = asyncio.run(small_clients(base, clients, seconds, small))
    # The uploads come from a process of their own, as from another person's machine: a thread here
    # would hold this process's GIL while it sends 60 MB, and the small clients' times would count it.
    spawn = multiprocessing.get_context("spawn")
    stop, queue, go, idle = spawn.Event(), spawn.Queue(), spawn.Event(), spawn.Event()
    go.set()
    uploader = spawn.Process(target=upload_stream, args=(base, STATE["auth"], upload, stop, queue, go, idle))
    uploader.start()
    time.sleep(1)
    cpu_before = cpu_seconds(STATE["pid"])
    beside = asyncio.run(small_clients(base, clients, seconds, small))
    cpu_after = cpu_seconds(STATE["pid"])
    mixed = asyncio.run(interleaved_clients(base, clients, seconds, small, go, idle, window))
    stop.set()
    go.set()
    statuses: list[int] = []
    while uploader.is_alive() or not queue.empty():
        with suppress(Empty):
            statuses.append(queue.get(timeout=0.1))
    uploader.join()
    a50, b50 = pct(alone.times, 50), pct(beside.times, 50)
    print(f"5. fairness: {clients} clients, an 8 x 64 batch each about once a second, {seconds:.0f} s")
    for name, seen in (("alone", alone), ("beside 1M-token JSON uploads", beside)):
        print(
            f"   {name:32} p50 {ms(pct(seen.times, 50))}   p99 {ms(pct(seen.times, 99))}   "
            f"errors {len(seen.errors)} {sorted(set(seen.errors))}"
        )
        print(
            f"     of it on the server (p50)      receive {ms(seen.span('receive'))}   "
            f"work {ms(seen.span('work'))}   compute {ms(seen.span('compute'))}"
        )
    done = {s: statuses.count(s) for s in sorted(set(statuses))}
    print(
        f"   ratio beside / alone             p50 {b50 / a50:8.2f}x   "
        "(target: median <= 1.3x over 10 runs, none above 1.5x; p99 target <= 300 ms)"
    )
    m_alone, m_beside = mixed["alone"], mixed["beside"]
    print(
        f"   interleaved, {window:g} s windows:      alone p50 {ms(pct(m_alone.times, 50))} ({len(m_alone.times)})   "
        f"beside p50 {ms(pct(m_beside.times, 50))} ({len(m_beside.times)}), p99 {ms(pct(m_beside.times, 99))}   "
        f"errors {len(m_alone.errors) + len(m_beside.errors)}"
    )
    ratio = pct(m_beside.times, 50) / pct(m_alone.times, 50)
    print(f"   ratio beside / alone, interleaved p50 {ratio:8.2f}x   (the machine's other load on both sides alike)")
    print(f"   uploads ({len(upload) / MB:.0f} MB each) answered: {done}")
    if per_upload is not None:
        user, system, faults = per_upload
        print(
            f"   the server's main process per upload, alone: {ms(user + system)} of CPU (reading it, handing it "
            f"over): user {ms(user).strip()}, system {ms(system).strip()}, {faults:.0f} page faults"
        )
    if cpu_before is not None and cpu_after is not None:
        # The main process's CPU while the uploads came (its GIL is what the small requests wait for):
        # reading the bodies, handing them over, and the small requests' own work.
        busy = (cpu_after - cpu_before) / seconds
        print(f"   the server's main process meanwhile: {100 * busy:.0f}% of a core (its workers not counted)")


def hostile(base: str) -> None:
    cases = {
        "66 KB: 4,000 tokens + 4,000 one-token rows": {
            "per_token_logps": [[-1.0] * 4000] + [[-1.0]] * 4000,
            "advantages": [1.0] * 4001,
        },
        "1.6 MB: 2,000 tokens + 100,000 one-token rows": {
            "per_token_logps": [[-1.0] * 2000] + [[-1.0]] * 100_000,
            "advantages": [1.0] * 100_001,
        },
    }
    print("6. hostile bodies (padded far past what they send)")
    with httpx.Client(base_url=base, timeout=120, headers=STATE["auth"]) as client:
        for name, data in cases.items():
            body = json.dumps(data).encode()
            before = rss()
            with Sampler() as sampler:
                start = time.perf_counter()
                try:
                    status = str(client.post("/api/v1/loss", content=body, headers=JSON).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                elapsed = time.perf_counter() - start
            growth = None if before is None else sampler.peak - before
            print(f"   {name:46} {status:>14} in {elapsed:6.2f} s, peak RSS {'+' + mb(growth).strip():>9}")
            try:
                client.get("/healthz", timeout=30)
            except httpx.HTTPError as exc:
                print(f"   the server no longer answers: {type(exc).__name__}")
                return


def export_hostile(base: str) -> None:
    """The export bodies of issue 18: padded far past what they send, to every format; /loss beside them."""
    cases = {
        "1.2 MB: 200,000 tokens + 2,000 one-token rows": (200_000, 2000),
        "133 KB: 20,000 tokens + 2,000 one-token rows": (20_000, 2000),
    }
    print("x. hostile export bodies (padded far past what they send), each route once after a warm-up of each")
    with httpx.Client(base_url=base, timeout=120, headers=STATE["auth"]) as client:
        for name, (width, rows) in cases.items():
            data = {"per_token_logps": [[-1.0] * width] + [[-1.0]] * rows, "advantages": [1.0] * (rows + 1)}
            body = json.dumps(data).encode()
            paths = ["/api/v1/loss", *(f"/api/v1/export/{fmt}" for fmt in ("json", "jsonl", "safetensors", "npz"))]
            for path in paths:  # warm: each route's first call, and the worker's (a large body goes there)
                client.post(path, content=body, headers=JSON)
            for path in paths:
                before = rss()
                with Sampler() as sampler:
                    start = time.perf_counter()
                    try:
                        status = str(client.post(path, content=body, headers=JSON).status_code)
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    elapsed = time.perf_counter() - start
                growth = None if before is None else sampler.peak - before
                print(
                    f"   {name:46} {path:26} {status:>5} in {elapsed:6.3f} s (target 413 in <= 0.1 s), "
                    f"peak RSS {'+' + mb(growth).strip():>9}"
                )


def memory_back(base: str) -> None:
    """RSS idle, at peak and 10 s after each kind of large request (the main process and its workers)."""
    data = batch(256, 4096, fields=3, seed=3, digits=4)
    body = json.dumps(data, separators=(",", ":")).encode()
    batch_only = json.dumps({k: v for k, v in data.items() if k != "config"}, separators=(",", ":")).encode()
    kinds: dict[str, Callable[[httpx.Client], httpx.Response]] = {
        "POST /api/v1/loss, 1M-token JSON": lambda c: c.post("/api/v1/loss", content=body, headers=JSON),
        "POST /api/v1/upload, the same as a .json file": lambda c: c.post(
            "/api/v1/upload", files={"file": ("batch.json", body)}
        ),
        "POST /api/v1/export/safetensors, the same": lambda c: c.post(
            "/api/v1/export/safetensors", content=batch_only, headers=JSON
        ),
        "POST /api/v1/export/json, the same": lambda c: c.post("/api/v1/export/json", content=batch_only, headers=JSON),
    }
    print(f"m. memory back: RSS of the main process + lane workers, idle / peak / 10 s after ({len(body) / MB:.0f} MB)")
    with httpx.Client(base_url=base, timeout=600, headers=STATE["auth"]) as client:
        for name, send in kinds.items():
            time.sleep(2)
            idle = rss()
            with Sampler() as sampler:
                start = time.perf_counter()
                response = send(client)
                elapsed = time.perf_counter() - start
            time.sleep(10)
            after = rss()
            if idle is None or after is None:
                print(f"   {name:46} {response.status_code} in {elapsed:5.2f} s (RSS n/a: not our server)")
                continue
            back = after - idle
            print(
                f"   {name:46} {response.status_code} in {elapsed:5.2f} s   idle {mb(idle)}  peak {mb(sampler.peak)}  "
                f"10 s after {mb(after)} ({back / MB:+.0f} MB, target within 400 MB)"
            )


# --- w: the worst requests of issue 33 beside small ones ----------------------------------------------
NPZ_ROWS = 8000  # x 4,096 float16 zeros: 262 MB priced at 8 bytes a value, under the default 256 MiB unpack limit


def worst_requests(quick: bool) -> list[tuple[str, str, str, bytes, dict[str, str]]]:
    """The requests of issue 33 that cost the server most, each as (label, path, kind, body, form fields):
    kind ``file`` posts ``body`` as a form's file (its name in the label's last word), ``json`` as JSON."""
    import io

    import torch
    from safetensors.torch import save

    zeros = io.BytesIO()  # a read field near the unpack limit beside a 64M-element array no field reads
    np.savez_compressed(
        zeros, per_token_logps=np.zeros((NPZ_ROWS, 4096), np.float16), ignored=np.zeros(64 * MB, np.float16)
    )
    T = 2 * MB  # 2 rows x T: the padded-position limit (4,194,304), in rows as long as they come
    token_rewards = torch.zeros(2, T)
    token_rewards[:, -1] = torch.tensor([1.0, 0.0])
    long_rows = save({"per_token_logps": -torch.rand(2, T) - 0.1, "token_level_rewards": token_rewards})
    estimator = {"config": json.dumps({"preset": "verl-grpo", "advantage": "reinforce-pp"})}
    # a run as a trainer writes it: 12 steps x 4 micro-batches of 16 x 2048 tokens (--quick: 2 steps)
    run = long_run_zip(8 if quick else 48, rows=16, tokens=2048)
    # one row of 4,096 tokens and 1,023 of one token: 4,194,304 padded positions, a 100 MB NPZ
    ragged = {name: [[-1.0] * 4096] + [[-1.0]] * 1023 for name in ("per_token_logps", "old_per_token_logps")} | {
        "advantages": [1.0] * 1024
    }
    return [
        (f"npz upload, {len(zeros.getvalue()) / 1024:.0f} KB compressed: worst.npz", "/api/v1/upload", "file",
         zeros.getvalue(), {}),
        (f"reinforce-pp, 2 x {T} tokens, {len(long_rows) / MB:.0f} MB: rpp.safetensors", "/api/v1/upload", "file",
         long_rows, estimator),
        (f"run zip, {len(run) / MB:.0f} MB: run.zip", "/api/v1/runs", "file", run, {}),
        (f"NPZ export of 4,194,304 padded positions, {len(json.dumps(ragged)) / 1024:.0f} KB body: -",
         "/api/v1/export/npz", "json", json.dumps(ragged).encode(), {}),
    ]  # fmt: skip


def heavy_loop(
    base: str, auth: dict[str, str], request: Any, client_id: int, stop: Any, out: Any, member: int = 0
) -> None:
    """Send ``request`` (a ``worst_requests`` entry) again and again until ``stop``; (label, status, seconds)
    of each into ``out``. A run zip is uploaded under a new name each time and deleted once answered. On a
    loopback server each ``member`` sends from its own address (127.0.0.<member + 2>), as from its own machine:
    the server shares its costly lane per member."""
    label, path, kind, body, form = request
    filename = label.rsplit(" ", 1)[-1]
    own = httpx.HTTPTransport(local_address=f"127.0.0.{member + 2}") if "//127.0.0.1:" in base else None
    with httpx.Client(base_url=base, timeout=600, headers=auth, transport=own) as client:
        i = 0
        while not stop.is_set():
            i += 1
            name = f"bench-worst-{os.getpid()}-{client_id}-{i}"
            start = time.perf_counter()
            status: int | str
            response: httpx.Response | None
            try:
                if kind == "json":
                    response = client.post(path, content=body, headers=JSON)
                else:
                    data = form | ({"name": name} if path == "/api/v1/runs" else {})
                    response = client.post(path, files={"file": (filename, body)}, data=data)
                status = response.status_code
            except httpx.HTTPError as exc:
                status, response = type(exc).__name__, None
            out.put((label, status, time.perf_counter() - start))
            if path == "/api/v1/runs" and status == 201:
                client.delete(f"/api/v1/runs/{name}")
            if response is not None and status in (429, 503):
                stop.wait(float(response.headers.get("retry-after", "1")))


def heavy_clients(base: str, auth: dict[str, str], requests: list[Any], clients: int, stop: Any, out: Any) -> None:
    """``clients`` threads per request of ``requests`` looping it (``heavy_loop``; the clients of one request are
    one member), in a process of its own (as from other members' machines: sending 30 MB bodies here would hold
    the small clients' GIL); then None."""
    threads = [
        threading.Thread(target=heavy_loop, args=(base, auth, request, k * clients + j, stop, out, k))
        for k, request in enumerate(requests)
        for j in range(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.put(None)


async def small_and_health(base: str, clients: int, seconds: float) -> tuple[list[float], Clients]:
    """/healthz every 50 ms from one client and ``clients`` clients posting a small batch to /api/v1/loss,
    each 100 ms after its last answer, for ``seconds``."""
    small = json.dumps(batch(8, 64, fields=3, seed=1, digits=4)).encode()
    health: list[float] = []
    seen = Clients([], [], [])
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients + 1, max_keepalive_connections=clients + 1)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits, headers=STATE["auth"]) as client:

        async def healthz() -> None:
            while time.perf_counter() < stop:
                start = time.perf_counter()
                with suppress(httpx.HTTPError):
                    await client.get("/healthz")
                health.append(time.perf_counter() - start)
                await asyncio.sleep(0.05)

        async def one() -> None:
            while time.perf_counter() < stop:
                await timed_post(client, small, seen.times, seen.errors, seen.spans)
                await asyncio.sleep(0.1)

        await asyncio.gather(healthz(), *(one() for _ in range(clients)))
    return health, seen


def worst_beside_small(
    base: str, seconds: float, quick: bool, which: str = "", clients: int = 8, heavy: int = 2
) -> None:
    """Issue 33's figure: ``heavy`` clients looping each of the worst requests (``which``: the numbers of
    those to send, 1-4, default all) while ``clients`` send small /loss requests; /healthz and small /loss
    p99 against alone, and the server's RSS 10 s after."""
    requests = [r for i, r in enumerate(worst_requests(quick), 1) if not which or str(i) in which]
    asyncio.run(small_and_health(base, clients, 2))  # warm-up: connections, first calls
    load_before = os.getloadavg()
    alone_health, alone = asyncio.run(small_and_health(base, clients, seconds))
    time.sleep(1)
    idle = rss()
    spawn = multiprocessing.get_context("spawn")
    stop, out = spawn.Event(), spawn.Queue()
    sender = spawn.Process(target=heavy_clients, args=(base, STATE["auth"], requests, heavy, stop, out))
    sender.start()
    first = out.get(timeout=600)  # the first heavy request answered: every client is sending by then
    done = [first]
    with Sampler() as sampler:
        health, beside = asyncio.run(small_and_health(base, clients, seconds))
        stop.set()
        while (item := out.get(timeout=600)) is not None:
            done.append(item)
        sender.join()
    time.sleep(10)
    after = rss()
    load_after = os.getloadavg()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"w. the worst requests of issue 33, {heavy} clients looping each, beside {clients} small /loss clients, "
        f"{seconds:.0f} s"
    )
    print(
        f"   {cores} cores; load average (1, 5, 15 min) {', '.join(f'{v:.2f}' for v in load_before)} before, "
        f"{', '.join(f'{v:.2f}' for v in load_after)} after"
    )
    for label, *_ in requests:
        mine = [(status, took) for name, status, took in done if name == label]
        statuses = dict(sorted(Counter(str(status) for status, _ in mine).items()))
        took = [t for _, t in mine]
        print(
            f"   {label.rsplit(':', 1)[0]:58} answered {statuses}, p50 {ms(pct(took, 50))}, max "
            f"{ms(max(took, default=float('nan')))}"
        )
    h_alone, h_beside = pct(alone_health, 99), pct(health, 99)
    l_alone, l_beside = pct(alone.times, 99), pct(beside.times, 99)
    errors = sorted(set(alone.errors + beside.errors))
    print(f"   GET  /healthz                    p99 alone {ms(h_alone)}   beside {ms(h_beside)}   (target <= 100 ms)")
    print(
        f"   POST /api/v1/loss (small)        p99 alone {ms(l_alone)}   beside {ms(l_beside)}   "
        f"{l_beside / l_alone:5.2f}x (target <= 3x); p50 {ms(pct(alone.times, 50)).strip()} -> "
        f"{ms(pct(beside.times, 50)).strip()}; {len(beside.times)} requests, errors {len(alone.errors)} / "
        f"{len(beside.errors)} {errors}"
    )
    print(
        f"     of it on the server (p50)      receive {ms(beside.span('receive'))}   work {ms(beside.span('work'))}   "
        f"compute {ms(beside.span('compute'))}"
    )
    met = [h_beside <= 0.1, l_beside <= 3 * l_alone]
    if idle is not None and after is not None:
        met.append(after - idle <= 400 * MB)
        print(
            f"   RSS (all processes): idle {mb(idle)}, peak {mb(sampler.peak)}, 10 s after {mb(after)} "
            f"({(after - idle) / MB:+.0f} MB, target within 400 MB)"
        )
    print(f"   targets met: {sum(met)} of {len(met)}")


async def load(base: str, clients: int, seconds: float) -> None:
    body = json.dumps(ARTICLE_EXAMPLE).encode()
    times: list[float] = []
    errors: list[str] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits, headers=STATE["auth"]) as client:
        for _ in range(clients):
            await client.get("/healthz")
        stop = time.perf_counter() + seconds

        async def one_client() -> None:
            while time.perf_counter() < stop:
                await timed_post(client, body, times, errors)

        began = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    print(f"7. load: {clients} concurrent clients, POST /api/v1/loss (article) for {seconds:.0f} s")
    print(f"   requests {len(times)}   throughput {len(times) / elapsed:8.1f} req/s")
    print(f"   latency                          p50 {ms(pct(times, 50))}   p99 {ms(pct(times, 99))}")
    print(f"   errors {len(errors)}{' ' + str(sorted(set(errors))) if errors else ''}   (target 0)")


def probe(base: str, seconds: float) -> tuple[list[float], list[float]]:
    """/healthz and small /loss (the article's example) times, each from its own client, for ``seconds``."""
    body = json.dumps(ARTICLE_EXAMPLE).encode()
    out: tuple[list[float], list[float]] = ([], [])
    stop = threading.Event()

    def loop(i: int) -> None:
        with httpx.Client(base_url=base, timeout=60, headers=STATE["auth"]) as client:
            while not stop.is_set():
                start = time.perf_counter()
                with suppress(httpx.HTTPError):
                    if i == 0:
                        client.get("/healthz")
                    else:
                        client.post("/api/v1/loss", content=body, headers=JSON)
                out[i].append(time.perf_counter() - start)
                stop.wait(0.02)

    threads = [threading.Thread(target=loop, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return out


async def open_streams(host: str, port: int, path: str, total: int, sessions: int, held: list[Any]) -> dict[str, int]:
    """``total`` event streams on ``path`` from ``sessions`` client addresses, every other one never read
    past its status line; the accepted ones stay open (in ``held``) until the caller closes them."""
    counts = {"accepted": 0, "refused": 0, "failed": 0}
    auth = "".join(f"{k}: {v}\r\n" for k, v in STATE["auth"].items())
    gate = asyncio.Semaphore(64)  # connections being opened at once: the listen backlog is finite

    async def read_on(reader: asyncio.StreamReader) -> None:
        with suppress(Exception):
            while await reader.read(65536):
                pass

    async def one(i: int) -> None:
        async with gate:
            try:
                reader, writer = await asyncio.open_connection(host, port)
                # a client per forwarded address (uvicorn trusts X-Forwarded-For from 127.0.0.1 by default)
                client = f"127.0.{1 + i % sessions // 250}.{1 + i % sessions % 250}"
                writer.write(f"GET {path} HTTP/1.1\r\nhost: {host}\r\nx-forwarded-for: {client}\r\n{auth}\r\n".encode())
                status = (await reader.readline()).split()
            except OSError:
                counts["failed"] += 1
                return
        if status[1:2] == [b"200"]:
            counts["accepted"] += 1
            held.append((writer, asyncio.ensure_future(read_on(reader)) if i % 2 else None))
        else:
            counts["refused" if status[1:2] == [b"429"] else "failed"] += 1
            writer.close()

    await asyncio.gather(*(one(i) for i in range(total)))
    return counts


@contextmanager
def streams_open(base: str, total: int = 1000, sessions: int = 50) -> Iterator[dict[str, Any]]:
    """A training lab run with ``total`` event streams open on it from ``sessions`` clients, half never
    reading; yields the accepted/refused/failed counts (and, once closed, the steps the run trained)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a descriptor per stream here...
    if STATE["pid"] is not None:
        resource.prlimit(STATE["pid"], resource.RLIMIT_NOFILE, (hard, hard))  # ... and in the server
    name = f"bench-streams-{os.getpid()}-{time.monotonic_ns()}"  # one per phase: names are never reused
    headers = STATE["auth"]
    steps = STREAM_RUN_STEPS if STATE["pid"] is not None else 1000  # a server of its own allows more (see server)
    started = httpx.post(f"{base}/api/v1/lab/runs", json={"name": name, "steps": steps}, headers=headers)
    started.raise_for_status()
    status = f"{base}/api/v1/lab/runs/{name}/status"
    for _ in range(1200):  # its worker starts (seconds: spawn, imports) and trains while the streams are open
        if httpx.get(status, headers=headers).json().get("steps_done"):
            break
        time.sleep(0.1)
    host, port = base.removeprefix("http://").split(":")
    loop = asyncio.new_event_loop()
    held: list[Any] = []
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    counts: dict[str, Any] = {"soft": soft, "hard": hard}
    try:
        path = f"/api/v1/lab/runs/{name}/events"
        opening = asyncio.run_coroutine_threadsafe(open_streams(host, int(port), path, total, sessions, held), loop)
        counts.update(opening.result(timeout=300))
        yield counts
        state = httpx.get(status, headers=headers).json()
        counts |= {"steps": state.get("steps_done"), "status": state.get("status")}
    finally:
        for writer, reading in held:
            loop.call_soon_threadsafe(writer.close)
            if reading is not None:
                loop.call_soon_threadsafe(reading.cancel)
        httpx.delete(f"{base}/api/v1/lab/runs/{name}", headers=headers)
        for _ in range(100):  # the worker stops after its step; then the run's directory can go
            if httpx.get(status, headers=headers).json().get("status") != "running":
                break
            time.sleep(0.1)
        httpx.delete(f"{base}/api/v1/runs/{name}", headers=headers)
        loop.call_soon_threadsafe(loop.stop)


def print_streams(counts: dict[str, Any], total: int = 1000, sessions: int = 50, indent: str = "   ") -> None:
    print(f"{indent}{total} event streams opened on one training lab run from {sessions} clients, half never reading:")
    print(f"{indent}accepted {counts['accepted']}   refused (429) {counts['refused']}   failed {counts['failed']}")
    # a run still training at the end held its streams open through the whole measurement
    still = "still training" if counts.get("status") == "running" else f"{counts.get('status')}: its streams had ended"
    print(
        f"{indent}the run had trained {counts.get('steps')} steps at the end ({still}); descriptors: soft limit "
        f"{counts['soft']} raised to {counts['hard']}"
    )


def event_streams(base: str, seconds: float) -> None:
    alone = probe(base, seconds)
    with streams_open(base) as counts:
        during = probe(base, seconds)
    print("8. event streams")
    print_streams(counts)
    for label, i, target in (("GET  /healthz", 0, 0.1), ("POST /api/v1/loss (small)", 1, 0.3)):
        a, d = pct(alone[i], 99), pct(during[i], 99)
        print(f"   {label:27s} p99 alone {ms(a)}   with the streams {ms(d)}   (target <= {ms(target).strip()})")


def long_run_zip(members: int, micro_batches: int = 4, rows: int = 4, tokens: int = 8) -> bytes:
    """A zipped run of ``members`` step files (micro-batches of ``rows`` x ``tokens``, tiny by default), written
    by RunWriter on tmpfs where there is one (it syncs every file)."""
    import io
    import tempfile
    import zipfile

    import torch

    from grpo.runs import RunWriter

    config = grpo.LossConfig.from_preset("trl-grpo", beta=0.04, gradient_accumulation_steps=micro_batches)
    g = torch.Generator().manual_seed(0)
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        writer = RunWriter(Path(tmp) / "run", "trl", config)
        for i in range(members):
            old = -torch.rand(rows, tokens, generator=g) - 0.05
            tensors = {
                "per_token_logps": old + 0.01,
                "old_per_token_logps": old,
                "ref_per_token_logps": old - 0.05,
                "completion_mask": torch.ones(rows, tokens),
                "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]).repeat(rows // 4 + 1)[:rows],
            }
            writer.write_step(1 + i // micro_batches, i % micro_batches, tensors, {"loss": 0.0})
        writer.update(status="done")
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted((Path(tmp) / "run").rglob("*")):
                if path.is_file():
                    archive.write(path, str(path.relative_to(Path(tmp) / "run")))
        return buffer.getvalue()


def fetch_pages(base: str, auth: dict[str, str], path: str, clients: int, seconds: float, out: Any, done: Any) -> None:
    """``clients`` threads GET ``path`` (each once when ``seconds`` is 0, else again and again for ``seconds``);
    each (status, seconds) into ``out``, then None; ``done`` set when the last answer came. (The caller stops
    on ``done``, not on this process's end: a process whose queue holds more than its pipe takes cannot end
    until someone reads it, and the warm phase's answers can fill it.)"""

    def one() -> None:
        with httpx.Client(base_url=base, timeout=1800, headers=auth) as client:
            stop = time.perf_counter() + seconds
            while True:
                start = time.perf_counter()
                status = client.get(path).status_code
                out.put((status, time.perf_counter() - start))
                if time.perf_counter() >= stop:
                    return

    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    out.put(None)


async def beside(
    base: str, seconds: float, fetching: Callable[[], bool] | None = None
) -> tuple[list[float], list[float], list[str]]:
    """/healthz every 50 ms and a small /loss every 100 ms, for ``seconds`` or while ``fetching()`` holds."""
    small = json.dumps(batch(8, 64, fields=3, seed=1, digits=4)).encode()
    health: list[float] = []
    loss: list[float] = []
    errors: list[str] = []
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=120, headers=STATE["auth"]) as client:

        def running() -> bool:
            return fetching() if fetching is not None else time.perf_counter() < stop

        async def healthz() -> None:
            while running():
                start = time.perf_counter()
                with suppress(httpx.HTTPError):
                    await client.get("/healthz")
                health.append(time.perf_counter() - start)
                await asyncio.sleep(0.05)

        async def small_loss() -> None:
            while running():
                await timed_post(client, small, loss, errors)
                await asyncio.sleep(0.1)

        await asyncio.gather(healthz(), small_loss())
    return health, loss, errors


def _fetching(done: Any, pages: Any) -> bool:
    """The pages process still fetching: its last answer not come, and the process not gone (a crash)."""
    return not done.is_set() and pages.is_alive()


def run_pages(base: str, members: int, seconds: float, streams: bool = False) -> None:
    """Four concurrent pages of a long run beside /healthz and small /loss: the first read (the summary
    computed, once, in a worker process) and warm reads (the kept summary), against the two alone; with
    ``streams``, the pages are read while 1,000 event streams are open on a training lab run."""
    name = f"bench-run-pages-{os.getpid()}"
    started = time.perf_counter()
    blob = long_run_zip(members)
    made = time.perf_counter() - started
    with httpx.Client(base_url=base, timeout=1800, headers=STATE["auth"]) as client:
        up = client.post("/api/v1/runs", files={"file": (f"{name}.zip", blob)}, data={"name": name})
        if up.status_code != 201:
            print(f"9. run pages: the upload of the {members}-member run answered {up.status_code}: {up.text[:300]}")
            return
    time.sleep(2.5)  # a summary is kept once the run's files are 2 s old
    spawn = multiprocessing.get_context("spawn")
    rows = [("alone", *asyncio.run(beside(base, seconds)), [], {})]
    for label, repeat in (("first read (summary computed)", 0.0), ("warm (summary kept)", seconds)):
        # each phase opens its streams on a lab run of its own: a stream ends with its run's last event, and a
        # first read longer than the lab run's training would leave the warm phase without streams
        with streams_open(base) if streams else nullcontext({}) as counts:
            queue, done = spawn.Queue(), spawn.Event()
            path = f"/api/v1/runs/{name}"
            pages = spawn.Process(target=fetch_pages, args=(base, STATE["auth"], path, 4, repeat, queue, done))
            pages.start()
            fetching = partial(_fetching, done, pages)
            health, loss, errors = asyncio.run(beside(base, 0, fetching))
            got = []
            while (item := queue.get(timeout=600)) is not None:
                got.append(item)
            pages.join()
        rows.append((label, health, loss, errors, got, counts))
    with httpx.Client(base_url=base, timeout=600, headers=STATE["auth"]) as client:
        client.delete(f"/api/v1/runs/{name}")
    size = f"zip {len(blob) / MB:.1f} MB, made in {made:.0f} s"
    figure = "c. run pages and event streams together" if streams else "9. run pages"
    print(f"{figure}: a {members}-member run ({size}), 4 concurrent GETs of its page")
    for label, health, loss, errors, got, counts in rows:
        print(
            f"   {label:30} /healthz p99 {ms(pct(health, 99))} (target <= 100 ms)   small /loss p99 "
            f"{ms(pct(loss, 99))} (target <= 300 ms), errors {len(errors)}"
        )
        if got:
            statuses = sorted({s for s, _ in got})
            times = [t for _, t in got]
            print(f"     the pages: {len(got)} answered {statuses}, p50 {ms(pct(times, 50))}, max {ms(max(times))}")
        if counts:
            print_streams(counts, indent="     ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running server (default: start one on loopback)")
    parser.add_argument("--port", type=int, default=0, help="port of the server started here (default: a free one)")
    parser.add_argument("--cap-gb", type=float, default=8.0, help="RLIMIT_AS of the server started here (0: none)")
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter phases")
    parser.add_argument("--only", default="123456789xmwc", help="which figures to print, e.g. 245")
    parser.add_argument("--worst", default="", help="figure w: which worst requests (1-4, e.g. 24; default all)")
    parser.add_argument("--http", default="app.server:HeaderTimeoutHttpTools", help="uvicorn's --http (started here)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout the server started here serves (A/B)")
    parser.add_argument("--token", default=os.environ.get("GRPO_LENS_AUTH_TOKEN"), help="bearer token, if set")
    args = parser.parse_args()
    if args.token:
        STATE["auth"] = {"authorization": f"Bearer {args.token}"}
    repeats = 3 if args.quick else 9
    seconds = 8.0 if args.quick else 15.0
    with server(args.url, args.cap_gb, args.port, args.http, args.root) as base:
        health = httpx.get(f"{base}/healthz").json()
        time.sleep(2)
        print(
            f"server {base}: torch {health['torch']}, device {health['device']}, {os.cpu_count()} CPUs here; "
            f"RSS at start {mb(rss())}"
        )
        steps: dict[str, Callable[[], Any]] = {
            "1": lambda: latency(base, 200 if args.quick else 500),
            "2": lambda: json_ingest(base, repeats),
            "3": lambda: safetensors_ingest(base, repeats),
            "4": lambda: largest(base),
            "5": lambda: fairness(base, 40, seconds),
            "6": lambda: hostile(base),
            "7": lambda: asyncio.run(load(base, 32, seconds / 2)),
            "8": lambda: event_streams(base, seconds / 2),
            "x": lambda: export_hostile(base),
            "m": lambda: memory_back(base),
            "w": lambda: worst_beside_small(base, seconds, args.quick, args.worst),
            "9": lambda: run_pages(base, 4000 if args.quick else 40_000, seconds),
            "c": lambda: run_pages(base, 4000 if args.quick else 40_000, seconds, streams=True),
        }
        for key in args.only:
            steps[key]()
            sys.stdout.flush()
        main_rss = rss() if STATE["pid"] is None else _statm(STATE["pid"])
        print(f"RSS at the end {mb(rss())} (the server's main process {mb(main_rss)}, the rest its workers)")


if __name__ == "__main__":
    main()
