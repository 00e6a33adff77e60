"""The Runs view evaluates a shown step once, and the page shows every warning of an answer.

A step is evaluated by the step endpoint, whose answer is the breakdown the page draws: the batch never
travels through the browser to /api/v1/loss. The server runs in this process (a uvicorn thread, no worker
process) with ``grpo.evaluate`` wrapped, so the test counts the evaluations each shown step costs as well
as the page's requests. Its per-token limit is low: a joined step (8 rows) is past it, a micro-batch is not,
so both the "tokens of the shown row only" path and the "every row" path are counted.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save
from test_api_runs import write_run
from test_browser import CHROMIUM, Page, browser  # noqa: F401 (browser is a fixture)
from test_browser_runs import shoot_section

import grpo
from app.main import create_app
from app.settings import Settings
from grpo.runs import load_step

TOKEN_LIMIT = 30  # a joined step of write_run (8 rows, 39 positions) is past it; a micro-batch (19) is not
EVALUATING = ("/api/v1/runs/r/steps/", "/api/v1/loss", "/api/v1/upload", "/api/v1/compare")


class Counted:
    """``grpo.evaluate`` wrapped: how many times the server called it."""

    def __init__(self, evaluate: Any) -> None:
        self.evaluate, self.calls, self.lock = evaluate, 0, threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.calls += 1
        return self.evaluate(*args, **kwargs)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Counted, Path]]:
    """A uvicorn thread of this process serving a two-step run, with ``grpo.evaluate`` counted."""
    import uvicorn

    root = tmp_path_factory.mktemp("runs")
    write_run(root, "r")
    settings = Settings(runs_dir=str(root), process_workers=0, full_token_limit=TOKEN_LIMIT)
    counted = Counted(grpo.evaluate)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grpo, "evaluate", counted)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        try:
            yield f"http://127.0.0.1:{port}", counted, root
        finally:
            server.should_exit = True
            thread.join(10)


class Requests:
    """Every request the page makes, as (method, path)."""

    def __init__(self, page: Page) -> None:
        self.seen: list[tuple[str, str]] = []
        page.page.on("request", lambda r: self.seen.append((r.method, r.url.removeprefix(page.server))))

    def evaluating(self, since: int) -> list[tuple[str, str]]:
        return [(m, u) for m, u in self.seen[since:] if u.startswith(EVALUATING)]


def settle(page: Page) -> None:
    """Wait until the page has been quiet a moment (no request in flight, nothing more scheduled)."""
    time.sleep(1.5)
    page.wait_for("document.getElementById('status').className !== 'busy'")


def show(page: Page, counted: Counted, requests: Requests, act: Any, ready: str) -> tuple[list[Any], int]:
    """Do ``act``, wait for ``ready`` and the views drawn; the evaluating requests and evaluations it cost."""
    since, calls, drawn = len(requests.seen), counted.calls, page.drawn()
    act()
    page.wait_for(ready, timeout=120)
    page.wait_drawn(drawn)
    settle(page)
    return requests.evaluating(since), counted.calls - calls


def slide(page: Page, step: int) -> None:
    page.page.evaluate(
        f"(() => {{ const s = document.getElementById('run-step'); s.value = '{step}';"
        " s.dispatchEvent(new Event('input')); })()"
    )


def test_a_shown_step_is_evaluated_once(browser: Any, served: tuple[str, Counted, Path]) -> None:  # noqa: F811
    """Opening a run, sliding to a step, picking a micro-batch and moving a setting each cost one GET of the
    step endpoint and one evaluation; nothing is POSTed to /api/v1/loss. The views still draw it all."""
    url, counted, root = served
    page = Page(browser, url)
    requests = Requests(page)
    runs = "document.getElementById('runs').dataset"
    try:
        page.open()
        page.wait_for(f"{runs}.count === '1'")
        page.page.evaluate("fetch('/api/v1/runs/r').then((r) => r.json())")  # the run's page, checked, kept
        settle(page)
        cost = {
            "open": show(
                page, counted, requests, lambda: page.page.select_option("#run-select", "r"), f"{runs}.step === '1'"
            )
        }
        step1, step1_body = page.last(), drawn_request(page)
        for name in ("summary", "view-heatmaps", "runs"):
            shoot_section(page, name, f"step-once-{name}.png")
        cost["slide"] = show(page, counted, requests, lambda: slide(page, 2), f"{runs}.step === '2'")
        cost["micro"] = show(
            page, counted, requests, lambda: page.page.select_option("#run-micro", "1"), f"{runs}.micro === '1'"
        )
        micro = page.last()
        cost["setting"] = show(
            page,
            counted,
            requests,
            lambda: page.page.fill("#cfg-beta", "0.5"),
            "window.grpoLens.last.config.beta === 0.5",
        )
        replayed, replayed_body = page.last(), drawn_request(page)
        print(cost)  # the request counts of each action (the note quotes them)

        for action, (seen, calls) in cost.items():
            assert len(seen) == 1 and seen[0][0] == "GET", (action, seen)
            assert calls == 1, (action, calls)
        assert [u.split("?")[0] for _, u in [c[0][0] for c in cost.values()]] == [
            "/api/v1/runs/r/steps/1",
            "/api/v1/runs/r/steps/2",
            "/api/v1/runs/r/steps/2",
            "/api/v1/runs/r/steps/2",
        ]
        assert not [u for m, u in requests.seen if m == "POST" and u.startswith("/api/v1/loss")]
        # What is drawn: the joined step past the token limit (the shown row's tokens, every row's heatmap),
        # the micro-batch below it (every row's tokens), the replay under beta 0.5 as the step endpoint answers it.
        assert len(step1["rows"]["loss"]) == 8 and step1["token_rows"] == [0] and step1["heatmap"] is not None
        assert len(micro["rows"]["loss"]) == 4 and micro["tokens_complete"]
        batch, stored, _ = load_step(root / "r" / "steps" / "000002-001.safetensors")
        expected = counted.evaluate(batch, dataclasses.replace(stored, beta=0.5))
        assert replayed["config"]["beta"] == 0.5 and replayed["loss"] == pytest.approx(float(expected.loss), rel=1e-6)
        # What the page drew is what /api/v1/loss answers for the same batch and settings (the old round trip).
        assert httpx.post(f"{url}/api/v1/loss", json=step1_body).json() == step1
        assert httpx.post(f"{url}/api/v1/loss", json=replayed_body).json() == replayed
        page.check_clean()
    finally:
        page.context.close()


def drawn_request(page: Page) -> dict[str, Any]:
    """The /api/v1/loss body the page sent before for what it shows (its batch and settings; every row's
    heatmaps, and past the token limit the shown row's tokens)."""
    read = "({input: window.grpoLens.state.input, config: window.grpoLens.state.config})"
    state, last = page.page.evaluate(read), page.last()
    rows = {} if last["tokens_complete"] else {"token_rows": last["token_rows"]}
    return {**state["input"], "config": state["config"], "heatmap_rows": "all", **rows}


# --- every warning of an answer, on the page ---------------------------------------------------------------
def upload_file(tmp_path: Path) -> Path:
    """A batch whose upload warns twice: a tensor that is no batch field, and log-probs in bfloat16."""
    lp = torch.tensor([[-0.5, -1.0, -0.7], [-0.2, -2.0, -0.4]], dtype=torch.bfloat16)
    tensors = {"per_token_logps": lp, "old_per_token_logps": lp.float() - 0.1, "advantages": torch.tensor([1.0, -1.0])}
    path = tmp_path / "warned.safetensors"
    path.write_bytes(save({**tensors, "old_logps_typo": lp.float()}))
    return path


def test_an_upload_answer_carries_its_warnings_once_tagged(tmp_path: Path) -> None:
    """`warning_parts` holds every sentence of `warnings`, one for one (the upload's own included)."""
    path = upload_file(tmp_path)
    with TestClient(create_app(Settings(process_workers=0))) as http:
        answer = http.post("/api/v1/upload", files={"file": (path.name, path.read_bytes())}).json()
    warnings = answer["warnings"]
    assert any(w.startswith("Ignored 'old_logps_typo'") for w in warnings), warnings
    assert any(w.startswith("per_token_logps arrived as bfloat16") for w in warnings), warnings
    joined = ["".join(p if isinstance(p, str) else p["text"] for p in parts) for parts in answer["warning_parts"]]
    assert joined == warnings


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
def test_the_page_shows_an_uploads_warnings(browser: Any, served: tuple[str, Counted, Path], tmp_path: Path) -> None:  # noqa: F811
    url, _, _ = served
    page = Page(browser, url)
    try:
        page.open()
        before = page.drawn()
        page.page.click("#tab-upload")
        page.page.set_input_files("#upload-file", str(upload_file(tmp_path)))
        page.wait_drawn(before)
        shown = page.page.evaluate("[...document.querySelectorAll('#warnings li')].map((li) => li.textContent)")
        assert shown == page.last()["warnings"]
        assert any(w.startswith("Ignored 'old_logps_typo' in the file") for w in shown), shown
        assert any(w.startswith("per_token_logps arrived as bfloat16") for w in shown), shown
        shoot_section(page, "summary", "upload-warnings.png")
        page.check_clean()
    finally:
        page.context.close()
