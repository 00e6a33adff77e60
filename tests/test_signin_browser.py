"""Sign-in in real headless Chromium: a server with GRPO_LENS_AUTH_TOKEN set sends the browser to
the sign-in page, a wrong token is refused on the page, the right one opens the dashboard with an
HttpOnly cookie (page scripts cannot read it), and signing out closes it again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from api_fixtures import serve

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
TOKEN = "workshop-7c1e"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve({"GRPO_LENS_AUTH_TOKEN": TOKEN}) as url:
        yield url


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        yield browser.new_page()
        browser.close()


def test_sign_in_then_out_in_chromium(server: str, page: Any) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(f"{server}/docs")
    assert page.url == f"{server}/signin?next=/docs"
    page.fill("#token", "not-the-token")
    page.click("button[type=submit]")
    assert page.text_content("#signin-error") == "That token is not this instance's."
    page.screenshot(path=str(ARTIFACTS / "signin-refused.png"))
    page.fill("#token", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(f"{server}/docs")
    cookie = next(c for c in page.context.cookies() if c["name"] == "grpo_lens_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"]
    assert page.evaluate("document.cookie") == ""  # HttpOnly: no script on the page can read it
    page.goto(f"{server}/")
    # the dashboard, not the sign-in page (its script may already have written its state to the query)
    assert page.url.split("?")[0] == f"{server}/"
    status = page.evaluate("fetch('/api/v1/options').then(r => r.status)")
    assert status == 200  # the page's own API calls carry the cookie
    page.screenshot(path=str(ARTIFACTS / "signed-in.png"))
    page.evaluate("fetch('/signout', {method: 'POST'})")
    page.goto(f"{server}/")
    assert page.url == f"{server}/signin?next=/"
