"""`make docker-test`: build the image, run it, and check it the way a team deploying it would.

The engine is docker when its daemon answers, else podman, set up here on a Debian machine that has
neither (docker/setup-podman.sh; shared/reference/containers.md). This machine's pip settings reach the
build only as build-time mounts (the CA bundle as a secret, a local torch wheel directory as a build
context), so nothing of them is left in the image. The container is published on 127.0.0.1 only.

Checks, each printed as it passes: the installed packages equal the lock; one copy of the app, in /app;
nothing from tests, docs, benchmarks or dev tools; /healthz; POST /api/v1/loss equals the local library's
value; the page in headless Chromium scrolled through, each screen's charts drawn before the next (every
wait a condition with a deadline, never a fixed sleep), the lab's "no run yet" line and no empty chart; a
short lab run started from the page, trained by the container's lab worker, drawing every lab chart; no
console error, no request off 127.0.0.1; /docs; the HEALTHCHECK; non-root with a home; --read-only; threads
from the CPU quota; stop within 5 s; a rebuild after a source edit within 30 s (and the edit is in the new
image). Then the timings and the image size.

DOCKER_TEST_COLD=1 first removes the image and the builder's cache (dangling images; docker's build cache),
for the cold figure; DOCKER_TEST_PORT picks the port (127.0.0.1 only).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpo  # noqa: E402
from grpo.requests import batch_from_request  # noqa: E402

WORK = ROOT / "build" / "docker"
ARTIFACTS = ROOT / "test-artifacts"
BASE_IMAGE = "python:3.11.14-slim-bookworm"  # the Dockerfile's default; a stand-in replaces it offline
IMAGE = "localhost/grpo-lens:docker-test"
EDITED = "localhost/grpo-lens:docker-test-edit"
CONTAINER = "grpo-lens-docker-test"
VOLUME = "grpo-lens-docker-test-runs"
PORT = int(os.environ.get("DOCKER_TEST_PORT", "8581"))
URL = f"http://127.0.0.1:{PORT}"
CHROMIUM = "/usr/bin/chromium"
CONTEXT_PATHS = ("Dockerfile", ".dockerignore", "requirements.lock", "docker/entrypoint.sh",
                 "app", "grpo", "templates", "static", "vendor")  # fmt: skip

timings: dict[str, float] = {}


def say(check: str, detail: str = "") -> None:
    print(f"  ok  {check}" + (f": {detail}" if detail else ""), flush=True)


def fail(message: str) -> None:
    raise SystemExit(f"docker-test FAILED: {message}")


def sh(*cmd: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        fail(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    return out


# --- the engine -------------------------------------------------------------------------------------


def engine() -> str:
    """docker when its daemon answers; else podman, installed and configured when missing."""
    if shutil.which("docker") and sh("docker", "info", timeout=30, check=False).returncode == 0:
        os.environ["DOCKER_BUILDKIT"] = "1"
        return "docker"
    t0 = time.monotonic()
    setup = subprocess.run(  # its progress (apt, debootstrap) goes to stderr, shown as it runs
        ["bash", str(ROOT / "docker" / "setup-podman.sh"), str(WORK), BASE_IMAGE],
        stdout=subprocess.PIPE, text=True, timeout=1200,
    )  # fmt: skip
    if setup.returncode != 0:
        fail(f"podman setup exited {setup.returncode} (its output is above)")
    os.environ["CONTAINERS_CONF"] = str(WORK / "containers.conf")
    os.environ["GRPO_LENS_BASE"] = setup.stdout.strip().splitlines()[-1]
    timings["podman setup (install, base image; cached after the first run)"] = time.monotonic() - t0
    return "podman"


def host_pip_settings() -> dict[str, str]:
    """This machine's pip configuration (`pip config list`: key='value' lines)."""
    out = sh(sys.executable, "-m", "pip", "config", "list", check=False).stdout
    return {k.split(".")[-1]: v for k, v in re.findall(r"^(\S+)='(.*)'$", out, re.M)}


def build_options(eng: str) -> list[str]:
    """This machine's build inputs, as build-time mounts and build arguments only."""
    opts = ["--format", "docker"] if eng == "podman" else []
    base = os.environ.get("GRPO_LENS_BASE", BASE_IMAGE)
    if base != BASE_IMAGE:
        opts += ["--build-arg", f"BASE_IMAGE={base}"]
    pip = host_pip_settings()
    ca = pip.get("cert") or os.environ.get("PIP_CERT", "")
    if ca and Path(ca).is_file():
        opts += ["--secret", f"id=pip_ca,src={ca}"]
    index = pip.get("index-url", "")
    if index.startswith(("http://", "https://")):
        conf = WORK / "pip.conf"
        conf.write_text(f"[global]\nindex-url = {index}\n")
        opts += ["--secret", f"id=pip_conf,src={conf}"]
    wheels = [d for d in pip.get("find-links", "").split() if list(Path(d).glob("torch-*.whl"))]
    if wheels:
        opts += ["--build-context", f"torch-wheels={wheels[0]}"]
        try:
            socket.getaddrinfo("download.pytorch.org", 443)
        except OSError:  # the torch index is unreachable here: the local wheel only, no network tries
            opts += ["--build-arg", "TORCH_INDEX_URL="]
    return opts


def make_context() -> Path:
    """A copy of what the build reads, so the source-edit check never touches the working tree."""
    context = WORK / "context"
    shutil.rmtree(context, ignore_errors=True)
    for rel in CONTEXT_PATHS:
        src, dst = ROOT / rel, context / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dst)
    return context


def build(eng: str, tag: str, context: Path, label: str, extra: tuple[str, ...] = ()) -> None:
    log = WORK / f"build-{tag.rpartition(':')[2]}.log"  # written as the build goes: tail -f it
    t0 = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(
            [eng, "build", *build_options(eng), *extra, "-t", tag, str(context)],
            stdout=out, stderr=subprocess.STDOUT, timeout=1800,
        ).returncode  # fmt: skip
    timings[label] = time.monotonic() - t0
    if code != 0:
        fail(f"{label} exited {code} (log: {log}):\n{log.read_text()[-4000:]}")
    print(f"  --  {label}: {timings[label]:.1f} s", flush=True)


# --- inside the container -----------------------------------------------------------------------------

INSPECT_LAYOUT = r"""
import glob, importlib.metadata as md, json, os, sysconfig, app, grpo
site = sysconfig.get_paths()["purelib"]
leftovers = sorted(
    glob.glob(site + "/pip*") + glob.glob(site + "/*.egg-info") + glob.glob("/opt/venv/bin/pip*")
    + [w for top in ("/app", "/opt", "/home", "/root", "/tmp") for w in glob.glob(top + "/**/*.whl", recursive=True)]
    + glob.glob("/root/.cache/*") + glob.glob("/tmp/*")
    + glob.glob("/app/**/__pycache__", recursive=True) + glob.glob("/opt/venv/*.egg-info")
)
print(json.dumps({
    "app": app.__file__, "grpo": grpo.__file__, "site": site, "in_site": sorted(os.listdir(site)),
    "dists": {d.metadata["Name"].lower().replace("_", "-"): d.version for d in md.distributions()},
    "leftovers": leftovers, "app_dir": sorted(os.listdir("/app")),
}))
"""


def locked_pins() -> dict[str, str]:
    text = (ROOT / "requirements.lock").read_text()
    return {m[0].lower(): m[1] for m in re.findall(r"^([A-Za-z0-9_.-]+)==([^ \\\n]+)", text, re.M)}


def check_image_layout(eng: str) -> None:
    data = json.loads(sh(eng, "run", "--rm", "--user", "0", IMAGE, "python", "-c", INSPECT_LAYOUT, timeout=120).stdout)
    pins, dists = locked_pins(), dict(data["dists"])
    torch_version = dists.pop("torch", "")
    if dists != pins:
        diff = sorted(set(dists.items()) ^ set(pins.items()))
        fail(f"the image's packages differ from requirements.lock: {diff}")
    if not torch_version.startswith("2.13.0"):
        fail(f"torch {torch_version!r} in the image, expected 2.13.0")
    say("packages", f"{len(pins)} exactly as in requirements.lock, plus torch {torch_version}")
    if not (data["app"].startswith("/app/app/") and data["grpo"].startswith("/app/grpo/")):
        fail(f"app and grpo should import from /app: {data['app']}, {data['grpo']}")
    doubles = [n for n in data["in_site"] if n.split("-")[0] in ("app", "grpo", "grpo_lens")]
    if doubles:
        fail(f"a second copy in site-packages: {doubles}")
    say("one copy of the app", f"app, grpo from /app; nothing of them in {data['site']}")
    if data["leftovers"] or data["app_dir"] != ["app", "grpo", "static", "templates", "vendor"]:
        fail(f"leftovers in the image: {data['leftovers'][:10]}; /app holds {data['app_dir']}")
    say("no leftovers", f"/app holds {', '.join(data['app_dir'])} only (no tests, docs, bench, build/, egg-info); "
                        "no pip in the venv, no wheels, no pip cache, /tmp empty")  # fmt: skip


def run_container(eng: str) -> float:
    sh(eng, "rm", "-f", CONTAINER, check=False)
    sh(eng, "volume", "rm", "-f", VOLUME, check=False)
    t0 = time.monotonic()
    # As compose.yaml runs it: read-only root, tmpfs /tmp, no capabilities, a CPU quota, the runs volume.
    sh(eng, "run", "-d", "--name", CONTAINER, "--read-only", "--tmpfs", "/tmp", "--cpus", "1",
       "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
       "-p", f"127.0.0.1:{PORT}:8000", "-v", f"{VOLUME}:/data/runs", IMAGE)  # fmt: skip
    deadline = t0 + 90
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{URL}/healthz", timeout=2) as r:
                health = json.loads(r.read())
            break
        except OSError:
            time.sleep(0.25)
    else:
        logs = sh(eng, "logs", CONTAINER, check=False)
        fail(f"/healthz did not answer within 90 s:\n{logs.stdout[-2000:]}{logs.stderr[-2000:]}")
    timings["start -> /healthz answers"] = time.monotonic() - t0
    if health.get("status") != "ok":
        fail(f"/healthz said {health}")
    say("/healthz", json.dumps(health))
    return t0


def check_process(eng: str) -> None:
    uid = sh(eng, "exec", CONTAINER, "id", "-u").stdout.strip()
    status = sh(eng, "exec", CONTAINER, "cat", "/proc/1/status").stdout
    home = sh(eng, "exec", CONTAINER, "sh", "-c", 'echo "$HOME"; test -d "$HOME" && echo dir').stdout.split()
    uids = re.search(r"^Uid:\s+(.*)$", status, re.M)
    if uid == "0" or uids is None or "0" in uids[1].split() or home != ["/home/lens", "dir"]:
        fail(f"expected a non-root user with a home: uid {uid}, /proc/1 Uid {uids}, home {home}")
    say("non-root", f"uid {uid} (PID 1 Uid: {uids[1].split()[0]}), home /home/lens")
    write = sh(eng, "exec", CONTAINER, "sh", "-c", "touch /app/x", check=False)
    tmp = sh(eng, "exec", CONTAINER, "sh", "-c", "touch /tmp/x /data/runs/x && rm /tmp/x /data/runs/x", check=False)
    if write.returncode == 0 or "Read-only" not in write.stderr or tmp.returncode != 0:
        fail(f"--read-only: /app write {write.returncode} {write.stderr.strip()!r}; /tmp, runs: {tmp.returncode}")
    say("--read-only", f"/app refuses writes ({write.stderr.strip()}); /tmp (tmpfs) and /data/runs (volume) take them")
    env = sh(eng, "exec", CONTAINER, "cat", "/proc/1/environ").stdout.split("\0")
    threads = [e for e in env if e.startswith(("GRPO_LENS_TORCH_THREADS=", "OMP_NUM_THREADS="))]
    nproc = sh(eng, "exec", CONTAINER, "nproc").stdout.strip()
    if sorted(threads) != ["GRPO_LENS_TORCH_THREADS=1", "OMP_NUM_THREADS=1"]:
        fail(f"with --cpus 1 the entrypoint should set one thread: {threads}")
    say("threads from the CPU quota", f"--cpus 1 on {nproc} visible CPUs -> {', '.join(sorted(threads))}")


def check_loss() -> None:
    """The container's /api/v1/loss against this checkout's library, same batch, float64."""
    # Two groups of two ragged rows, off-policy (ratios away from 1, some clipped), with a reference.
    request: dict[str, Any] = {
        "per_token_logps": [[-1.2, -0.7, -2.3, -0.4], [-0.9, -1.6], [-2.2, -0.3, -1.1], [-0.5, -1.9, -0.8, -1.4]],
        "old_per_token_logps": [[-1.0, -0.9, -2.0, -0.6], [-1.3, -1.1], [-2.4, -0.2, -1.5], [-0.6, -1.2, -0.9, -1.1]],
        "ref_per_token_logps": [[-1.1, -0.8, -2.1, -0.5], [-1.0, -1.4], [-2.0, -0.4, -1.2], [-0.7, -1.5, -0.7, -1.3]],
        "rewards": [1.0, 0.0, 0.5, 2.0],
        "group_size": 2,
        "config": {"preset": "trl-grpo", "dtype": "float64", "beta": 0.04},
    }
    body = json.dumps(request).encode()
    req = urllib.request.Request(f"{URL}/api/v1/loss", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        served = json.loads(r.read())
    config = grpo.LossConfig.from_preset("trl-grpo", dtype="float64", beta=0.04)
    local = grpo.evaluate(batch_from_request(request), config)
    for name in ("loss", "policy_loss", "kl_loss"):
        mine, theirs = float(getattr(local, name)), float(served[name])
        # float64 end to end, a handful of terms: any difference beyond rounding is a different computation
        if not math.isclose(mine, theirs, rel_tol=1e-12, abs_tol=1e-15):
            fail(f"/api/v1/loss {name} {theirs!r} != the local library's {mine!r}")
    say("POST /api/v1/loss", f"loss {served['loss']!r} (trl-grpo, float64) = the local library's {float(local.loss)!r}")


# A chart is drawn when Plotly has data in it and has rendered its SVG.
DRAWN = "(n) => !!(n.data && n.data.length && n.querySelector('.main-svg'))"
CHARTS = "[...new Set(document.querySelectorAll('.chart, .js-plotly-plot'))]"
ALL_DRAWN = f"{CHARTS}.every({DRAWN})"
# Every chart inside the viewport (a reader looking at it) is drawn.
ON_SCREEN_DRAWN = f"""{CHARTS}.filter((n) => {{
    const r = n.getBoundingClientRect(); return r.height > 0 && r.bottom > 0 && r.top < innerHeight;
}}).every({DRAWN})"""
LAB_STEPS = 3  # a short lab run: its worker process trains in the container, its charts grow on the page


def check_pages() -> None:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    args = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        outside: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: None if r.url.startswith(URL) else outside.append(r.url))
        page.goto(f"{URL}/", timeout=30_000)
        wait(page, "Number(document.body.dataset.drawn || 0) > 0", 60, "the first view")
        # The sections below the first view are built once the page is quiet: the experiments, the lab's form.
        wait(page, "Number(document.body.dataset.experiments || 0) > 0 && document.body.dataset.lab === 'ready'",
             120, "the experiments and the lab set up")  # fmt: skip
        height = int(page.evaluate("document.body.scrollHeight"))
        for y in range(0, height + 900, 450):  # scrolled through, as a reader would: each screen drawn in turn
            page.evaluate(f"window.scrollTo(0, {y})")
            wait(page, ON_SCREEN_DRAWN, 60, f"the charts on screen at {y} px", undrawn_ids)
        wait(page, ALL_DRAWN, 60, "every chart after the scroll", undrawn_ids)
        count = int(page.evaluate(f"{CHARTS}.length"))
        lab_charts = int(page.evaluate("document.querySelectorAll('#lab-charts .lab-chart').length"))
        if not count or lab_charts or not page.is_visible("#lab-empty") or errors or outside:
            fail(f"page: {count} charts, lab charts before a run {lab_charts}, lab note shown "
                 f"{page.is_visible('#lab-empty')}, console errors {errors}, requests out {outside}")  # fmt: skip
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(ARTIFACTS / "docker-page.png"), full_page=True)
        say("the page", f"scrolled through {height} px: {count} charts, each drawn once on screen; the lab shows "
                        f"its 'no run yet' line and no empty chart; no console error; no request left 127.0.0.1 "
                        f"(screenshot {ARTIFACTS / 'docker-page.png'})")  # fmt: skip
        check_lab_run(page)
        if errors or outside:
            fail(f"the lab run: console errors {errors}, requests out {outside}")
        page.goto(f"{URL}/docs", timeout=30_000)
        wait(page, "document.querySelectorAll('.opblock').length > 0", 30, "/docs")
        ops = int(page.evaluate("document.querySelectorAll('.opblock').length"))
        if errors or outside:
            fail(f"/docs: console errors {errors}, non-local requests {outside}")
        say("/docs", f"Swagger UI drew {ops} operations from the vendored bundle; no console error")
        browser.close()


def check_lab_run(page: Any) -> None:
    """A lab run started from the page trains in the container's worker and draws every lab chart."""
    page.locator("#view-lab").scroll_into_view_if_needed()
    page.fill("#lab-steps", str(LAB_STEPS))
    page.click("#lab-start")
    wait(page, "!!document.querySelector('#lab-runs li[data-status=done]')", 300, "the lab run done",
         lambda pg: pg.text_content("#lab-runs") or pg.text_content("#lab-error") or "")  # fmt: skip
    # A lab chart draws its points when it is on screen: each one, scrolled to, shows every step.
    ids = page.evaluate("[...document.querySelectorAll('#lab-charts .lab-chart')].map((n) => n.id)")
    for chart in ids:
        page.locator(f"#{chart}").scroll_into_view_if_needed()
        node = f"document.getElementById('{chart}')"
        wait(page, f"({DRAWN})({node}) && {node}.data.every((t) => t.x.length === {LAB_STEPS})", 60,
             f"{chart} drawn with the run's {LAB_STEPS} steps", undrawn_ids)  # fmt: skip
    if page.is_visible("#lab-empty"):
        fail("the lab's 'no run yet' line is still shown beside a run")
    # Sections off screen skip rendering (content-visibility: auto) and change size as they render: for the
    # picture, every one renders, and it waits for two frames painted with that layout.
    style = page.add_style_tag(content=".view { content-visibility: visible !important; }")
    page.locator("#view-lab").scroll_into_view_if_needed()
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")
    page.locator("#view-lab").screenshot(path=str(ARTIFACTS / "docker-lab.png"))
    style.evaluate("(node) => node.remove()")
    say("a lab run", f"{LAB_STEPS} steps trained in the container's lab worker; {len(ids)} lab charts, each "
                     f"drawn with every step once scrolled to (screenshot {ARTIFACTS / 'docker-lab.png'})")  # fmt: skip


def undrawn_ids(page: Any) -> str:
    ids = page.evaluate(f"{CHARTS}.filter((n) => !({DRAWN})(n)).map((n) => n.id || n.className)")
    return "undrawn: " + ", ".join(ids)


def wait(page: Any, expression: str, seconds: float, what: str, explain: Any = None) -> None:
    """Wait until `expression` holds in the page, evaluated every 100 ms, or fail after `seconds` saying what
    was missing. (Not page.wait_for_function: it evals its predicate in the page, which the CSP refuses.)"""
    deadline = time.monotonic() + seconds
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            fail(f"{what}: still false after {seconds:g} s: {expression}" + (f"\n{explain(page)}" if explain else ""))
        page.wait_for_timeout(100)


def check_healthcheck(eng: str) -> None:
    config = sh(eng, "image", "inspect", "--format", "{{json .Config.Healthcheck}}", IMAGE).stdout.strip()
    if "StartPeriod" not in config:
        fail(f"the image's HEALTHCHECK has no start period: {config}")
    if eng == "podman":
        out = sh(eng, "healthcheck", "run", CONTAINER, check=False)
        state = sh(eng, "inspect", "--format", "{{.State.Health.Status}}", CONTAINER, check=False).stdout.strip()
        if out.returncode != 0:
            fail(f"podman healthcheck run exited {out.returncode}: {out.stdout} {out.stderr}")
    else:
        deadline = time.monotonic() + 120
        health = (eng, "inspect", "--format", "{{.State.Health.Status}}", CONTAINER)
        while (state := sh(*health).stdout.strip()) != "healthy":
            if state == "unhealthy" or time.monotonic() > deadline:
                fail(f"the container's health is {state!r}")
            time.sleep(1)
    say("HEALTHCHECK", f"{state or 'healthy'}; {config}")


def check_stop(eng: str) -> None:
    t0 = time.monotonic()
    sh(eng, "stop", "-t", "10", CONTAINER, timeout=30)
    timings["stop"] = time.monotonic() - t0
    code = sh(eng, "inspect", "--format", "{{.State.ExitCode}}", CONTAINER).stdout.strip()
    if timings["stop"] >= 5:
        fail(f"stop took {timings['stop']:.1f} s (limit 5 s)")
    say("stop", f"{timings['stop']:.1f} s, exit code {code}")


def check_edit_rebuild(eng: str, context: Path) -> None:
    marker = f"# docker-test source edit {time.time_ns()}"
    target = context / "grpo" / "loss.py"
    target.write_text(target.read_text() + marker + "\n")
    build(eng, EDITED, context, "rebuild after a source edit (grpo/loss.py)")
    tail = sh(eng, "run", "--rm", EDITED, "tail", "-n", "1", "/app/grpo/loss.py").stdout.strip()
    if tail != marker:
        fail(f"the edited image does not hold the edit: {tail!r}")
    if (seconds := timings["rebuild after a source edit (grpo/loss.py)"]) >= 30:
        fail(f"a source edit took {seconds:.1f} s to rebuild (limit 30 s)")
    say("source edit rebuild", "the new image holds the edit; the dependency layers came from the cache")


def image_size(eng: str) -> str:
    size = int(sh(eng, "image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    history = sh(eng, "history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", IMAGE).stdout.splitlines()
    rows = (line.partition("\t") for line in history)
    layers = [f"      {s:>9}  {describe(c)}" for s, _, c in rows if s.strip() != "0 B"]
    return f"{size / 1e6:.0f} MB; its layers that hold files, newest first:\n" + "\n".join(layers)


def describe(created_by: str) -> str:
    """A history line, readable: no build-arg prefix, no content hashes, RUN steps named by what they install."""
    step = re.sub(r"^(\|\d+ (\S+=\S* )*)?/bin/sh -c (#\(nop\) )?", "", created_by.strip())
    step = re.sub(r"(dir|file):[0-9a-f]{64}", r"\1", " ".join(step.split()))
    if "install" in step and "requirements.lock" in step:
        return "RUN pip install --require-hashes -r requirements.lock"
    if "install" in step and "torch==" in step:
        return "RUN pip install torch==${TORCH_VERSION}+${TORCH_VARIANT}"
    return step[:100]


def forget_cache(eng: str) -> None:
    """For a cold build: drop this image's tags and every dangling layer (the builder's cache) first."""
    sh(eng, "rmi", "-f", IMAGE, EDITED, check=False)
    if eng == "docker":
        sh(eng, "builder", "prune", "-af", timeout=300, check=False)
    for _ in range(20):  # podman prunes one generation of dangling images at a time
        if not sh(eng, "image", "prune", "-f", timeout=300, check=False).stdout.strip():
            break


def main() -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    eng = engine()
    print(f"docker-test: {eng}, base {os.environ.get('GRPO_LENS_BASE', BASE_IMAGE)}, port 127.0.0.1:{PORT}", flush=True)
    context = make_context()
    cold = os.environ.get("DOCKER_TEST_COLD") == "1"
    if cold:
        forget_cache(eng)
        build(eng, IMAGE, context, "cold build (no layer cache; base image present)")
    else:
        build(eng, IMAGE, context, "first build (layer cache as found; DOCKER_TEST_COLD=1 for a cold one)")
    build(eng, IMAGE, context, "warm rebuild, nothing changed")
    try:
        check_image_layout(eng)
        run_container(eng)
        check_loss()
        check_pages()
        check_healthcheck(eng)
        check_process(eng)
        check_stop(eng)
        check_edit_rebuild(eng, context)
    finally:
        sh(eng, "rm", "-f", CONTAINER, check=False)
        sh(eng, "volume", "rm", "-f", VOLUME, check=False)
        sh(eng, "rmi", "-f", EDITED, check=False)
    print("docker-test: timings")
    for label, seconds in timings.items():
        print(f"  {seconds:7.1f} s  {label}")
    print(f"docker-test: image size {image_size(eng)}")
    print("docker-test: passed")


if __name__ == "__main__":
    main()
