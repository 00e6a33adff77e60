"""The dashboard in real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright).

A uvicorn server runs on a free loopback port with a low per-token limit (so the large-batch path
is exercised with a small batch). Every test also checks that no request left 127.0.0.1 and
that the page logged no errors.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FULL_TOKEN_LIMIT
from safetensors.torch import save

import grpo
from app.main import create_app
from app.settings import Settings
from grpo.examples import SCENARIOS
from grpo.requests import batch_from_request

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make test installs it)"
)
playwright_api = pytest.importorskip("playwright.sync_api")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(env: dict[str, str], port: int | None = None) -> Iterator[str]:
    """A real uvicorn on 127.0.0.1 serving ``create_app`` in a thread of this process: yields its URL, stops it
    after. Its settings are the environment's with ``env`` added, read here once, so ``env`` never reaches this
    process's other tests. In process, not ``uvicorn app.main:app``: a server process imports torch again,
    seconds for each test file. Every caller runs large requests in threads (``GRPO_LENS_PROCESS_WORKERS=0``): no
    worker process starts from the test process."""
    import uvicorn

    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        settings = Settings()
    assert settings.process_workers == 0, "serve() runs large requests in threads: GRPO_LENS_PROCESS_WORKERS=0"
    port = port or _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # a loaded 2-core machine
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def server(dashboard_server: str) -> str:
    """The session's dashboard server (conftest.py), shared with test_browser_explain.py."""
    return dashboard_server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        yield b
        b.close()


class Page:
    """A browser page with its console errors and every URL it requested."""

    def __init__(self, browser: Any, server: str):
        self.server = server
        self.context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))

    def open(self, query: str = "") -> None:
        self.page.goto(f"{self.server}/{query}")
        self.wait_drawn(0)

    def wait_for(self, expression: str, timeout: float = 60.0) -> None:
        """Poll a JS expression until it is truthy (wait_for_function would eval in-page: the CSP forbids it)."""
        deadline = time.monotonic() + timeout
        while not self.page.evaluate(expression):
            if time.monotonic() > deadline:
                status = self.page.evaluate("document.getElementById('status')?.textContent")
                raise TimeoutError(
                    f"still false after {timeout} s: {expression} (status: {status}; errors: {self.errors})"
                )
            time.sleep(0.05)

    def drawn(self) -> int:
        return int(self.page.evaluate("Number(document.body.dataset.drawn || 0)"))

    def painted(self) -> None:
        """Until two frames have been painted: a scroll or a style just added is on screen after them."""
        self.page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")

    def wait_drawn(self, after: int) -> int:
        self.wait_for(f"Number(document.body.dataset.drawn || 0) > {after}")
        return self.drawn()

    def last(self) -> dict[str, Any]:
        return dict(self.page.evaluate("window.grpoLens.last"))

    def apply_json(self, body: dict[str, Any]) -> dict[str, Any]:
        """Paste ``body`` in the JSON tab, apply it, wait for the view it draws; its answer."""
        self.page.click("#tab-json")
        self.page.fill("#json-box", json.dumps(body))
        before = self.drawn()
        self.page.click("#apply-json")
        self.wait_drawn(before)
        return self.last()

    def current_chart(self, chart_id: str) -> None:
        """Scroll a chart into view and wait until it shows the current state (charts off screen
        are brought up to date when they come into view)."""
        self.page.evaluate(f"document.getElementById('{chart_id}').scrollIntoView({{block: 'center'}})")
        self.wait_for(f"window.grpoLens.isCurrent('{chart_id}')")

    def chart_data(self, chart_id: str) -> list[dict[str, Any]]:
        self.current_chart(chart_id)
        js = f"document.getElementById('{chart_id}').data.map(t => ({{name: t.name, x: t.x, y: t.y, z: t.z}}))"
        return list(self.page.evaluate(js))

    def heatmap(self, field: str) -> list[list[float | None]]:
        """The z grid of one heatmap."""
        return list(self.chart_data(f"heat-{field}")[0]["z"])

    def check_clean(self) -> None:
        assert self.errors == [], self.errors
        assert self.dialogs == [], self.dialogs
        outside = [u for u in self.requests if not u.startswith(self.server) and not u.startswith(("data:", "blob:"))]
        assert outside == [], f"requests left 127.0.0.1: {outside}"


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Page]:
    p = Page(browser, server)
    yield p
    p.context.close()


def _api_loss(server: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{server}/api/v1/loss", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req) as r:
        return dict(json.load(r))


CHART_HAS_DATA = """(id) => { const el = document.getElementById(id); return Boolean(el.data && el.data.some(t =>
    ['x', 'y', 'z'].some(k => Array.isArray(t[k]) && t[k].length > 0))) && el.querySelector('.main-svg') !== null; }"""


def scroll_through(page: Page) -> dict[str, bool]:
    """Scroll to every chart in page order; each must come up to date; returns id -> has data."""
    page.wait_for("Number(document.body.dataset.experiments || 0) > 0")
    ids = page.page.evaluate("[...document.querySelectorAll('.chart')].map(el => el.id)")
    seen = {}
    for chart_id in ids:
        page.current_chart(chart_id)
        seen[chart_id] = bool(page.page.evaluate(CHART_HAS_DATA, chart_id))
    return seen


def test_opens_on_the_article_example_with_every_chart_drawn(page: Page) -> None:
    page.open()
    charts = scroll_through(page)
    assert len(charts) >= 19  # 5 heatmaps, 2 contribution, clip curves, gradients, 3 compare, 8 experiments
    assert all(charts.values()), [k for k, v in charts.items() if not v]
    page.page.evaluate("window.scrollTo(0, 0)")
    # The numbers on the page are the API's: the article example under the article preset.
    expected = _api_loss(page.server, {**SCENARIOS["article"].request, "config": {"preset": "article"}})
    assert page.last()["loss"] == expected["loss"]
    cards = page.page.inner_text("#summary-cards")
    assert "8.1466" in cards  # the loss of the article's example, as the library computes it
    assert page.page.inner_text("#explanation").startswith("The loss is positive")
    assert page.page.locator("#metrics-table tbody tr").count() >= 20
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    page.check_clean()


def test_moving_a_control_redraws_and_the_url_reproduces_the_view(page: Page, browser: Any) -> None:
    page.open()
    before = page.drawn()
    heat_before = page.heatmap("loss")
    page.page.fill("#cfg-beta", "0.5")
    page.wait_drawn(before)
    assert "beta=0.5" in page.page.url
    data = page.last()
    assert data["config"]["beta"] == 0.5
    expected = _api_loss(page.server, {**SCENARIOS["article"].request, "config": {"preset": "article", "beta": 0.5}})
    assert data["loss"] == expected["loss"]
    heat_after = page.heatmap("loss")
    assert heat_after != heat_before  # the KL part of every token's loss share grew
    page.page.select_option("#cfg-aggregation", "token-mean")
    page.wait_for("window.grpoLens.last.config.aggregation === 'token-mean'")
    url = page.page.url
    assert "aggregation=token-mean" in url

    other = Page(browser, page.server)
    try:
        other.page.goto(url)
        other.wait_drawn(0)
        for chart in (
            *(f"heat-{f}" for f in ("ratio", "surrogate", "kl", "loss", "grad")),
            "contrib-rows",
            "contrib-tokens",
            "grad-tokens",
            "clip-curves",
        ):
            assert other.chart_data(chart) == page.chart_data(chart), chart
        assert other.last()["loss"] == page.last()["loss"]
        assert other.page.input_value("#cfg-beta") == "0.5"
        other.check_clean()
    finally:
        other.context.close()
    page.check_clean()


def test_an_edited_input_travels_in_the_url(page: Page, browser: Any) -> None:
    page.open()
    before = page.drawn()
    cell = page.page.locator("[aria-label='row 1 logp 4']")
    cell.fill("-0.25")
    cell.dispatch_event("change")
    page.wait_drawn(before)
    assert page.last()["tokens"]["ratio"][1][4] != pytest.approx(1.182, rel=1e-2)
    assert "input=" in page.page.url
    other = Page(browser, page.server)
    try:
        other.page.goto(page.page.url)
        other.wait_drawn(0)
        assert other.last()["loss"] == page.last()["loss"]
        assert other.page.input_value("[aria-label='row 1 logp 4']") == "-0.25"
    finally:
        other.context.close()
    page.check_clean()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_each_scenario_draws_the_apis_numbers(page: Page, name: str) -> None:
    page.open()
    scenario = SCENARIOS[name]
    before = page.drawn()
    page.page.select_option("#scenario", name)
    if name != "article":
        page.wait_drawn(before)
    page.wait_for(f"window.grpoLens.state.scenario === '{name}'")
    page.wait_for("window.grpoLens.last !== null")
    data = page.last()
    expected = _api_loss(page.server, {**scenario.request, "config": {"preset": scenario.preset, **scenario.overrides}})
    assert data["loss"] == expected["loss"]
    assert page.page.inner_text("#scenario-text") == scenario.notes
    if name == "on-policy":
        ratios = [r for row in page.heatmap("ratio") for r in row if r is not None]
        assert ratios and all(r == 1 for r in ratios)
        assert "gradient norm" in page.page.inner_text("#explanation")
    if name == "all-correct":
        assert data["metrics"]["frac_reward_zero_std"] == 1
    page.check_clean()


def test_upload_flow_safetensors_and_jsonl(page: Page, tmp_path: Path) -> None:
    page.open()
    lp = torch.tensor([[-0.5, -1.0, -0.7], [-0.2, -2.0, -0.4]], dtype=torch.float32)
    tensors = {"per_token_logps": lp, "old_per_token_logps": lp - 0.1, "advantages": torch.tensor([1.0, -1.0])}
    path = tmp_path / "batch.safetensors"
    path.write_bytes(save(tensors))
    before = page.drawn()
    page.page.click("#tab-upload")
    page.page.set_input_files("#upload-file", str(path))
    page.wait_drawn(before)
    expected = grpo.evaluate(
        grpo.Batch(per_token_logps=lp, old_per_token_logps=lp - 0.1, advantages=[1.0, -1.0]),
        grpo.LossConfig.from_preset("article"),
    )
    assert page.last()["loss"] == pytest.approx(float(expected.loss), rel=1e-6)
    # Controls still recompute an uploaded batch (the file is sent again with the new settings).
    before = page.drawn()
    page.page.select_option("#preset", "trl-dapo")
    page.wait_drawn(before)
    assert page.last()["config"]["preset"] == "trl-dapo"

    lines = [{"per_token_logps": [-0.3, -0.6], "reward": 1.0}, {"per_token_logps": [-0.9], "reward": 0.0}]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(x) for x in lines))
    before = page.drawn()
    page.page.set_input_files("#upload-file", str(jsonl))
    page.wait_drawn(before)
    batch = batch_from_request({"per_token_logps": [[-0.3, -0.6], [-0.9]], "rewards": [1.0, 0.0]})
    expected = grpo.evaluate(batch, grpo.LossConfig.from_preset("trl-dapo"))
    assert page.last()["loss"] == pytest.approx(float(expected.loss), rel=1e-6)
    page.check_clean()


def test_token_strings_are_shown_as_text_never_as_html(page: Page) -> None:
    page.open()
    evil = '<img src=x onerror="window.__pwned=1">'
    body = {
        "per_token_logps": [[-0.5, -0.9], [-0.3, -1.2]],
        "advantages": [1.0, -1.0],
        "tokens": [[evil, "<b>bold</b>"], ["&amp;", "<script>window.__pwned=2</script>"]],
    }
    page.apply_json(body)
    page.page.click("#tab-table")
    assert page.page.evaluate("window.__pwned === undefined")
    assert page.page.locator("img[src=x]").count() == 0
    assert page.page.input_value("[aria-label='row 0 token 0 text']") == evil
    # Hover labels carry the string escaped for Plotly, so it is drawn as written.
    page.current_chart("heat-ratio")
    # the token's text is item 7 of a cell's hover data (charts.hoverData)
    custom = page.page.evaluate("document.getElementById('heat-ratio').data[0].customdata[0][0][7]")
    assert custom == '&lt;img src=x onerror="window.__pwned=1"&gt;'
    page.page.hover("#heat-ratio .nsewdrag", position={"x": 20, "y": 20})
    assert page.page.evaluate("window.__pwned === undefined")
    page.check_clean()


def test_large_batch_shows_rows_first_and_loads_a_row_on_demand(page: Page) -> None:
    rows = 8
    body = {
        "per_token_logps": [[-0.1 - 0.01 * ((i * 7 + j) % 13) for j in range(40)] for i in range(rows)],
        "old_per_token_logps": [[-0.12 - 0.01 * ((i * 5 + j) % 11) for j in range(40)] for i in range(rows)],
        "rewards": [float(i % 2) for i in range(rows)],
        "group_size": 4,
    }
    page.open()
    data = page.apply_json(body)
    assert not data["tokens_complete"] and data["num_positions"] == rows * 40 > FULL_TOKEN_LIMIT
    assert page.page.is_visible("#large-note")
    assert data["token_rows"] == [0] and len(data["tokens"]["grad"]) == 1  # one row's tokens
    grid = data["heatmap"]  # every row, from the server's grid (8 x 40 fits: blocks of one cell)
    assert (grid["rows"], grid["width"], grid["factor_rows"], grid["factor_tokens"]) == ([*range(rows)], 40, 1, 1)
    assert page.heatmap("grad") == grid["fields"]["grad"] and len(page.heatmap("grad")) == rows
    assert "pooled" not in page.page.evaluate("document.getElementById('heat-grad').layout.title.text")
    assert page.page.locator("#rows-table tbody tr").count() == rows  # every row in the overview
    before = page.drawn()
    page.page.click("#rows-table tbody tr:nth-child(6)")
    page.wait_drawn(before)
    assert page.last()["token_rows"] == [5]
    assert "row=5" in page.page.url
    page.check_clean()


def test_a_table_of_many_rows_holds_only_the_rows_in_view(page: Page) -> None:
    """1,000 completions: the rows table scrolls in its own box with about a window of rows in the DOM;
    scrolling and sorting show the right rows, and a row clicked deep down loads its tokens."""
    rows = 1000
    body = {
        "per_token_logps": [[-0.1 - 0.001 * ((i * 7 + j) % 97) for j in range(3)] for i in range(rows)],
        "old_per_token_logps": [[-0.12 - 0.001 * ((i * 5 + j) % 89) for j in range(3)] for i in range(rows)],
        "rewards": [float(i % 3 == 0) for i in range(rows)],
        "group_size": 8,
    }
    page.open()
    data = page.apply_json(body)
    page.page.evaluate("document.getElementById('view-rows').scrollIntoView()")
    table = "#rows-table tbody tr:not(.spacer)"
    shown = lambda: [int(t) for t in page.page.locator(f"{table} td:first-child").all_text_contents()]  # noqa: E731
    first_window = shown()
    assert first_window[0] == 0 and 20 <= len(first_window) <= 100  # a window, not 1,000 rows
    assert page.page.get_attribute("#rows-table", "aria-rowcount") == str(rows + 1)
    # the spacers keep the full height: scrolled to the bottom, the last rows are there
    page.page.evaluate("(() => { const w = document.getElementById('rows-wrap'); w.scrollTop = w.scrollHeight; })()")
    page.wait_for(
        "[...document.querySelectorAll('#rows-table tbody tr:not(.spacer) td:first-child')]"
        ".some((td) => td.textContent === '999')"
    )
    assert len(shown()) <= 100
    # sorted by loss, descending: the window starts again at the top, with the largest losses
    page.page.evaluate("document.getElementById('rows-wrap').scrollTop = 0")
    header = page.page.locator("#rows-table th", has_text="loss").first
    header.click()
    header = page.page.locator("#rows-table th", has_text="loss").first
    header.click()
    page.wait_for("document.querySelector('#rows-table th[aria-sort=descending]') !== null")
    losses = data["rows"]["loss"]
    want = sorted(range(rows), key=lambda i: -losses[i])[:10]
    assert [losses[i] for i in shown()[:10]] == [losses[i] for i in want]
    # a row deep in the table, scrolled to and clicked, loads its tokens
    top = shown()
    page.page.evaluate("document.getElementById('rows-wrap').scrollTop = 600 * 30")
    page.wait_for(f"document.querySelector('#rows-table tbody tr:not(.spacer) td').textContent !== '{top[0]}'")
    assert set(shown()).isdisjoint(top)
    target = shown()[len(shown()) // 2]
    before = page.drawn()
    page.page.locator(table).filter(has=page.page.locator("td:first-child", has_text=f"{target}")).first.click()
    page.wait_drawn(before)
    assert page.last()["token_rows"] == [target]
    assert page.page.evaluate("document.getElementById('rows-wrap').scrollTop") > 10_000  # a redraw keeps it
    page.page.locator("#view-rows").screenshot(path=str(ARTIFACTS / "rows-virtual.png"))
    page.check_clean()


def test_exports_and_labelled_controls(page: Page) -> None:
    page.open()
    with page.page.expect_download() as info:
        page.page.click("#export-csv")
    csv = Path(info.value.path()).read_text()
    assert csv.splitlines()[0].startswith("row,position,token,region,ratio")
    assert len(csv.splitlines()) == 1 + 15  # the article example: 3 rows x 5 positions
    with page.page.expect_download() as info:
        page.page.click("#export-input")
    exported = json.loads(Path(info.value.path()).read_text())
    assert exported["per_token_logps"] == SCENARIOS["article"].request["per_token_logps"]
    unlabelled = page.page.evaluate(
        """[...document.querySelectorAll('#controls input, #controls select')].filter(el =>
            !(el.labels && el.labels.length) && !el.getAttribute('aria-label')).map(el => el.id || el.outerHTML)"""
    )
    assert unlabelled == []
    tooltips = page.page.evaluate("[...document.querySelectorAll('#controls label[title]')].length")
    assert tooltips >= 20
    page.check_clean()


def test_page_and_docs_headers_and_offline_assets(page: Page) -> None:
    page.open()
    with urllib.request.urlopen(f"{page.server}/") as r:
        csp = r.headers["content-security-policy"]
        assert "script-src 'self'" in csp and r.headers["x-content-type-options"] == "nosniff"
    page.page.goto(f"{page.server}/docs")
    page.page.wait_for_selector(".opblock", timeout=20_000)
    assert page.page.locator(".opblock").count() >= 6
    page.check_clean()


def _masked(response: dict[str, Any], field: str) -> list[list[float | None]]:
    """The response's per-token field as the heatmap shows it: None where a position does not count."""
    t = response["tokens"]
    width = max(len(r) for r in t[field])
    return [
        [row[j] if j < len(row) and t["mask"][k][j] else None for j in range(width)] for k, row in enumerate(t[field])
    ]


def test_a_control_move_redraws_the_view_on_screen_and_a_view_scrolled_to_later_is_current(page: Page) -> None:
    page.open()
    page.current_chart("heat-loss")
    before = page.drawn()
    page.page.fill("#cfg-beta", "0.5")
    page.wait_drawn(before)
    data = page.last()
    assert data["config"]["beta"] == 0.5
    # The view on screen was redrawn with the new response before anything was scrolled.
    assert page.page.evaluate("window.grpoLens.isCurrent('heat-loss')")
    z = page.page.evaluate("document.getElementById('heat-loss').data[0].z")
    assert z == _masked(data, "loss")
    # A view far below, scrolled to afterwards, shows the new state, not the one before the move.
    grads = page.chart_data("grad-tokens")
    kl_part = [
        v for k, row in enumerate(data["tokens"]["grad_kl"]) for j, v in enumerate(row) if data["tokens"]["mask"][k][j]
    ]
    assert grads[1]["name"] == "KL part" and grads[1]["y"] == kl_part
    # Scrolling through the page shows every chart drawn with the current state.
    assert all(scroll_through(page).values())
    page.check_clean()


def test_the_first_view_is_drawn_from_the_answer_the_page_carries(page: Page) -> None:
    """The page carries the options and the first answer (app/boot.py): the first view is drawn with
    no request to the API, with the API's numbers, for a plain visit and for a link with settings."""
    for query in ("", "?scenario=article&preset=verl-grpo&beta=0.5"):
        page.requests.clear()
        page.open(query)
        first = page.requests[: page.requests.index(f"{page.server}/{query}") + 1]
        asked = [u for u in page.requests if "/api/v1/loss" in u or "/api/v1/options" in u]
        assert first and asked == [], asked  # the first view came from the page itself
        config = {"preset": "verl-grpo", "beta": 0.5} if query else {"preset": "article"}
        expected = _api_loss(page.server, {**SCENARIOS["article"].request, "config": config})
        assert page.last() == expected
        assert page.page.inner_text("#summary-cards").count(f"{expected['loss']:.5g}"[:6]) >= 1
        assert page.page.input_value("#preset") == config["preset"]
    # a control moved afterwards asks the API as always
    before = page.drawn()
    page.page.fill("#cfg-beta", "0.25")
    page.wait_drawn(before)
    assert page.last()["config"]["beta"] == 0.25 and any("/api/v1/loss" in u for u in page.requests)
    page.check_clean()


def test_a_heatmap_wider_than_its_pixels_is_pooled_and_says_so(page: Page) -> None:
    """A row of 1300 tokens: the server pools the heatmaps by 3 positions; the title and the hover say
    so, and the cells are the server's pooled numbers."""
    g = torch.Generator().manual_seed(1)
    old = (-torch.rand(2, 1300, generator=g) * 2 - 0.01).tolist()
    new = (torch.tensor(old) + 0.3 * torch.randn(2, 1300, generator=g)).clamp(max=0).tolist()
    body = {"per_token_logps": new, "old_per_token_logps": old, "rewards": [1.0, 0.0]}
    page.open()
    data = page.apply_json(body)
    assert data["heatmap"]["factor_tokens"] == 3  # 1300 positions, at most 600 columns
    page.current_chart("heat-surrogate")
    figure = page.page.evaluate(
        "(() => { const el = document.getElementById('heat-surrogate'); return {title: el.layout.title.text, "
        "z: el.data[0].z, hover: el.data[0].hovertemplate, cell: el.data[0].customdata[0][1]}; })()"
    )
    assert "pooled by 3 positions" in figure["title"]
    assert figure["z"] == data["heatmap"]["fields"]["surrogate"] and len(figure["z"][0]) == 434
    assert "counted tokens" in figure["hover"] and figure["cell"][:2] == ["positions 3–5", 3]
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.locator("#heatmaps").screenshot(path=str(ARTIFACTS / "heatmaps-pooled.png"))
    page.check_clean()
