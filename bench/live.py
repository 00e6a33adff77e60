"""A run watched live: from a step file written to its point drawn in Chromium, and the server's CPU per step.

A run being captured (run.json status "running") starts with --start steps; the Runs view opens it in headless
Chromium (its timeline drawn, its event stream open: static/js/live.js). Then --steps step files are written one
by one, --every seconds apart, by this process (grpo.runs.RunWriter: each renamed into place). For each step:
- latency: from the moment its file is in place (RunWriter.write_step returned) to the moment the page's loss
  chart first holds its point (the page notes Date.now() each animation frame the chart's length grows: the
  same wall clock as this process's time.time()). Median and p99 printed, and their ratio to the target (2 s);
  beside them, when the step's event reached the page (a second EventSource opened by the bench): the server's
  part of the latency, the rest being the page's drawing;
- the server's CPU: its process's user + system time (/proc/PID/stat) over the steps written, per step;
  against a baseline measured in the same run: the same server, page and stream open, the same seconds with
  nothing written (what polling costs), and the CPU this process takes to evaluate one step file afresh
  (``grpo.runs.timeline`` of a copy of the final run from nothing, divided by its steps: the floor of any
  watcher that evaluates each new file once).
Run: .venv/bin/python bench/live.py [--steps 60] [--start 5] [--every 0.5] [--interval 0.5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

import grpo
from grpo.runs import RunWriter, timeline

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
TARGET_S = 2.0
# Every animation frame: when the loss chart's recomputed trace grows, the wall time of each step it gained.
WATCH_JS = """() => { window.__drawnAt = {}; const seen = { n: 0 };
  const tick = () => { const node = document.getElementById('timeline-loss')?.firstChild;
    const t = node?.data?.find((t) => t.name && t.name.startsWith('recomputed'));
    if (t && t.x.length > seen.n) { const now = Date.now();
      for (const x of Array.from(t.x).slice(seen.n)) if (!(x in window.__drawnAt)) window.__drawnAt[x] = now;
      seen.n = t.x.length; }
    requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
  window.__cameAt = {};
  const source = new EventSource('/api/v1/runs/live/events');
  source.addEventListener('step', (e) => { const s = JSON.parse(e.data).step;
    if (!(s in window.__cameAt)) window.__cameAt[s] = Date.now(); }); }"""


def tensors(seed: int, rows: int = 16, width: int = 256) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 2 - 0.05
    lengths = torch.randint(width // 4, width + 1, (rows,), generator=g)
    return {
        "per_token_logps": (old + 0.3 * torch.randn(rows, width, generator=g)).clamp(max=-1e-3),
        "old_per_token_logps": old,
        "completion_mask": torch.arange(width)[None, :] < lengths[:, None],
        "advantages": torch.randn(rows, generator=g),
    }


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time (its children's not counted: the server has none here)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve(runs_dir: Path, port: int, interval: float) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "GRPO_LENS_RUNS_DIR": str(runs_dir),
        "GRPO_LENS_PROCESS_WORKERS": "0",
        "GRPO_LENS_WATCH_INTERVAL": str(interval),
    }
    cmd = [sys.executable, "-m", "uvicorn", "app.main:app", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1200):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the server did not start")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fresh_per_step(run_dir: Path, steps: int) -> float:
    """CPU seconds this process takes per step to compute the run's timeline from nothing (a copy, no kept file)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / run_dir.name
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns(".lens-*"))
        start = time.process_time()
        timeline(copy)
        return (time.process_time() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--start", type=int, default=5)
    parser.add_argument("--every", type=float, default=0.5, help="seconds between step files")
    parser.add_argument("--interval", type=float, default=0.5, help="the server's watch_interval")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        runs_dir = Path(scratch)
        writer = RunWriter(runs_dir / "live", "trl", grpo.LossConfig.from_preset("trl-grpo"))
        for step in range(1, args.start + 1):
            writer.write_step(step, 0, tensors(step), {})
        port = free_port()
        server = serve(runs_dir, port, args.interval)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(f"http://127.0.0.1:{port}/")
                page.wait_for_selector("#run-select option[value=live]", state="attached", timeout=120_000)
                page.select_option("#run-select", "live")
                deadline = time.monotonic() + 120
                while page.evaluate("document.getElementById('run-timeline').dataset.live") != "running":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the page never followed the run")
                    time.sleep(0.05)
                time.sleep(1.0)  # the first draw settles
                page.evaluate(WATCH_JS)
                idle_span = args.steps * args.every
                before = cpu_seconds(server.pid)
                time.sleep(idle_span)  # the baseline: stream open, nothing written
                idle = cpu_seconds(server.pid) - before
                written: dict[int, float] = {}
                before = cpu_seconds(server.pid)
                for step in range(args.start + 1, args.start + args.steps + 1):
                    writer.write_step(step, 0, tensors(step), {})
                    written[step] = time.time()
                    time.sleep(args.every)
                last = args.start + args.steps
                deadline = time.monotonic() + 60
                while not page.evaluate(f"String({last}) in (window.__drawnAt || {{}})"):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the last step was never drawn")
                    time.sleep(0.05)
                watched = cpu_seconds(server.pid) - before
                drawn, came = page.evaluate("window.__drawnAt"), page.evaluate("window.__cameAt")
                draws = page.evaluate("Number(document.getElementById('run-timeline').dataset.liveDraws)")
                browser.close()
        finally:
            server.terminate()
            server.wait(10)
        latencies = [drawn[str(step)] / 1000 - at for step, at in written.items()]
        arrivals = [came[str(step)] / 1000 - at for step, at in written.items() if str(step) in came]
        floor = fresh_per_step(runs_dir / "live", last)
    median, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {args.steps} steps, one every {args.every} s")
    print(
        f"latency, step file written -> point drawn: median {median * 1000:.0f} ms ({median / TARGET_S:.2f}x the "
        f"2 s target), p99 {p99 * 1000:.0f} ms ({p99 / TARGET_S:.2f}x), max {max(latencies) * 1000:.0f} ms"
    )
    print(f"the page drew its timeline {draws} times for {args.steps} steps (events in a draw: drawn together)")
    print(
        f"of which the event's arrival in the page (a second EventSource): median "
        f"{statistics.median(arrivals) * 1000:.0f} ms, p99 {percentile(arrivals, 0.99) * 1000:.0f} ms"
    )
    per_step, idle_step = watched / args.steps, idle / args.steps
    print(
        f"server CPU per step watched: {per_step * 1000:.1f} ms; idle with the stream open: {idle_step * 1000:.1f} ms "
        f"per same interval; per step above idle: {(per_step - idle_step) * 1000:.1f} ms"
    )
    print(
        f"floor, one step file evaluated afresh (timeline from nothing / steps, this process): {floor * 1000:.1f} ms; "
        f"watched per step / floor: {per_step / floor:.2f}x"
    )


if __name__ == "__main__":
    main()
