"""Sign-in in real headless Chromium: a server with GRPO_LENS_AUTH_TOKEN set sends the browser to
the sign-in page, a wrong token is refused on the page, the right one opens the dashboard with an
HttpOnly cookie (page scripts cannot read it), and signing out ends the session on the server (a copy
of the cookie no longer opens anything). Signed in, the page's own writes (apply JSON, a file upload,
a lab run) pass the same-origin rule; a page on another port of the same host, whose requests carry
the SameSite=Strict cookie, is refused."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from api_fixtures import ARTICLE, serve
from safetensors.torch import save
from test_api_runs import write_run
from test_browser import Page

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TOKEN = "workshop-7c1e"
BEARER = {"authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    runs = tmp_path_factory.mktemp("runs")
    env = {"GRPO_LENS_AUTH_TOKEN": TOKEN, "GRPO_LENS_RUNS_DIR": str(runs), "GRPO_LENS_LAB_NICE": "0"}
    env["GRPO_LENS_PROCESS_WORKERS"] = "0"  # small requests only: a large-request worker would import torch, unused
    with serve(env) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Page]:
    p = Page(browser, server)
    yield p
    p.context.close()


def sign_in(page: Page) -> dict[str, Any]:
    page.page.goto(f"{page.server}/signin")
    page.page.fill("#token", TOKEN)
    page.page.click("button[type=submit]")
    page.page.wait_for_url(f"{page.server}/")
    return dict(next(c for c in page.context.cookies() if c["name"] == "grpo_lens_session"))


def test_sign_in_then_out_in_chromium(page: Page, server: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    tab = page.page
    tab.goto(f"{server}/docs")
    assert tab.url == f"{server}/signin?next=/docs"
    tab.fill("#token", "not-the-token")
    tab.click("button[type=submit]")
    assert tab.text_content("#signin-error") == "That token is not this instance's."
    tab.screenshot(path=str(ARTIFACTS / "signin-refused.png"))
    tab.fill("#token", TOKEN)
    tab.click("button[type=submit]")
    tab.wait_for_url(f"{server}/docs")
    cookie = next(c for c in page.context.cookies() if c["name"] == "grpo_lens_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"]
    # a session that ends (12 h, the default), not one for the browser's lifetime
    assert abs(cookie["expires"] - (time.time() + 12 * 3600)) < 600
    assert tab.evaluate("document.cookie") == ""  # HttpOnly: no script on the page can read it
    tab.goto(f"{server}/")
    # the dashboard, not the sign-in page (its script may already have written its state to the query)
    assert tab.url.split("?")[0] == f"{server}/"
    status = tab.evaluate("fetch('/api/v1/options').then(r => r.status)")
    assert status == 200  # the page's own API calls carry the cookie
    tab.screenshot(path=str(ARTIFACTS / "signed-in.png"))
    assert tab.evaluate("fetch('/signout', {method: 'POST'}).then(r => r.ok)")
    tab.goto(f"{server}/")
    assert tab.url == f"{server}/signin?next=/"
    # The cookie as it was before signing out, put back: the server ended that session.
    page.context.add_cookies([cookie])
    tab.goto(f"{server}/")
    assert tab.url == f"{server}/signin?next=/"
    copied = httpx.get(f"{server}/api/v1/options", headers={"cookie": f"{cookie['name']}={cookie['value']}"})
    assert copied.status_code == 401


def test_signed_in_the_page_still_writes(page: Page, server: str, tmp_path: Path) -> None:
    """Apply JSON, a file upload and a lab run: the page's fetches send this origin, and pass."""
    sign_in(page)
    page.open()
    data = page.apply_json(ARTICLE)
    assert data["num_positions"] == 15

    path = tmp_path / "batch.safetensors"
    lp = torch.tensor([[-0.5, -1.0, -0.7], [-0.2, -2.0, -0.4]])
    path.write_bytes(save({"per_token_logps": lp, "advantages": torch.tensor([1.0, -1.0])}))
    page.page.click("#tab-upload")
    with page.page.expect_response(lambda r: r.url.endswith("/api/v1/upload")) as upload:
        page.page.set_input_files("#upload-file", str(path))
    assert upload.value.status == 200
    assert upload.value.request.header_value("origin") == server

    page.page.evaluate("document.getElementById('view-lab').scrollIntoView()")
    page.wait_for("document.querySelectorAll('#lab-comparisons button').length >= 5", timeout=120)
    page.page.fill("#lab-steps", "3")
    with page.page.expect_response(lambda r: r.url.endswith("/api/v1/lab/runs")) as started:
        page.page.click("#lab-start")
    assert started.value.status == 202, started.value.text()
    page.wait_for("!!document.querySelector('#lab-runs li[data-status=done]')", timeout=180)  # its events came
    page.check_clean()


class Attacker(BaseHTTPRequestHandler):
    """A page on another port of the same host (same site: the SameSite=Strict cookie goes along)."""

    html = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def attacker() -> Iterator[tuple[str, type[Attacker]]]:
    handler = type("Page", (Attacker,), {})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


def _run_zip(tmp_path: Path) -> bytes:
    run = write_run(tmp_path, "planted")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member in sorted(run.rglob("*")):
            archive.write(member, member.relative_to(run).as_posix())
    return buffer.getvalue()


def test_a_page_on_another_port_cannot_ride_the_cookie(
    page: Page, server: str, attacker: tuple[str, type[Attacker]], tmp_path: Path
) -> None:
    """The issue's finding, in Chromium: a plain form (text/plain, a JSON body) and a no-cors upload."""
    sign_in(page)
    evil_url, handler = attacker
    zipped = base64.b64encode(_run_zip(tmp_path)).decode()
    # A text/plain form sends name + "=" + value: a JSON body whose last token string is that "=".
    tokens = [["t"] * len(row) for row in ARTICLE["per_token_logps"]]
    tokens[-1][-1] = "="
    full = json.dumps({**ARTICLE, "tokens": tokens})
    name, value = full[: full.rindex('"="') + 1], full[full.rindex('"="') + 2 :]
    handler.html = f"""<!doctype html><body>
<form id="f" method="post" action="{server}/api/v1/loss" enctype="text/plain">
<input type="hidden" name='{name}' value='{value}'></form>
<script>
const bytes = Uint8Array.from(atob("{zipped}"), c => c.charCodeAt(0));
const form = new FormData();
form.append("file", new Blob([bytes]), "planted.zip");
window.planted = fetch("{server}/api/v1/runs", {{method: "POST", mode: "no-cors", credentials: "include", body: form}})
  .then(() => "sent", e => String(e));
</script></body>""".encode()
    tab = page.page
    tab.goto(evil_url)
    assert tab.evaluate("window.planted") == "sent"
    assert httpx.get(f"{server}/api/v1/runs/planted", headers=BEARER).status_code == 404  # nothing uploaded
    with tab.expect_navigation():
        tab.evaluate("document.getElementById('f').submit()")
    answer = json.loads(tab.inner_text("body"))
    # 403, not 401: the browser did send the cookie; the origin check is what stopped it
    assert answer["detail"][0]["loc"] == ["header", "origin"], answer
    tab.screenshot(path=str(ARTIFACTS / "signin-cross-origin-refused.png"))
