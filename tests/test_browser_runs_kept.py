"""A kept run page in real headless Chromium: the page's fetch of ``/api/v1/runs/{run}`` revalidates its
cached copy with the ETag, the server answers 304 without a body, and the Runs view draws the run as it
did from the full answer (a kept page is streamed from its file with an ETag)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_browser import CHROMIUM, Page, browser  # noqa: F401 (browser is a fixture)
from test_browser_runs import runs_server, shoot_section  # noqa: F401 (runs_server is a fixture)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
RUN = "trl-grpo-run"


def _kept(server: str) -> str:
    """The run's page read until it is kept (its files 2 s old when it was computed): its ETag."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        etag = httpx.get(f"{server}/api/v1/runs/{RUN}", timeout=60).headers.get("etag")
        if etag:
            return etag
        time.sleep(0.5)
    raise TimeoutError("the run's page was never kept")


def _open_run(page: Page) -> str:
    page.open()
    page.wait_for("document.getElementById('runs').dataset.count === '2'")
    page.page.select_option("#run-select", RUN)
    page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)
    return page.page.text_content("#run-info") or ""


def test_a_kept_run_page_is_revalidated_not_sent_again(browser: Any, runs_server: str) -> None:  # noqa: F811
    etag = _kept(runs_server)
    page = Page(browser, runs_server)
    answers: list[tuple[int, str | None]] = []  # (body bytes sent, the request's If-None-Match)

    def seen(response: Any) -> None:
        if response.url == f"{runs_server}/api/v1/runs/{RUN}":
            sent = response.request.sizes()["responseBodySize"]  # the bytes on the wire, not the cached copy's
            answers.append((sent, response.request.all_headers().get("if-none-match")))

    page.page.on("response", seen)
    try:
        first = _open_run(page)
        assert "Every micro-batch matches the trainer" in first
        again = _open_run(page)  # a reload in the same browser: its cached page, revalidated
        assert again == first
        loss = page.page.evaluate("document.getElementById('run-loss').data.map(t => t.y.length)")
        assert loss[:2] == [4, 4]
        # the first read sent the page; the reload sent its ETag and got the 304 (no body), which Chromium
        # answers the page's fetch from its cache with (a 200 to the script)
        assert answers[0][0] > 1000 and answers[0][1] is None, answers
        assert answers[-1] == (0, etag), answers
        shoot_section(page, "runs", "runs-view-revalidated.png")
        page.check_clean()
    finally:
        page.context.close()
