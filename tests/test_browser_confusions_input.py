"""The confusions at the input (headless Chromium, test_browser.py's fixtures): per-token fields
such as entropies are entered in the table, an optional setting says it is off until ticked, and a
refused request (a 422) is told in sentences that say where (the setting; the field, row and token)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from test_browser import ARTIFACTS, CHROMIUM, Page, browser, server  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(not __import__("pathlib").Path(CHROMIUM).exists(), reason="no chromium")

ALWAYS_SHOWN = {"per_token_logps", "old_per_token_logps", "ref_per_token_logps"}
STALE = "document.getElementById('stale-note')"


@pytest.fixture
def page(browser: Any, server: str) -> Any:  # noqa: F811
    p = Page(browser, server)
    p.page.set_default_timeout(5000)  # a control the page lacks fails in seconds, not half a minute
    yield p
    p.context.close()


def _options(server: str) -> dict[str, Any]:  # noqa: F811
    with urllib.request.urlopen(f"{server}/api/v1/options") as r:
        return dict(json.load(r))


def _shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.page.screenshot(path=str(ARTIFACTS / name), full_page=False)


def _loaded_errors(page: Page) -> list[str]:
    """Console errors other than the browser's own line for a refused request (a 4xx is expected here)."""
    return [e for e in page.errors if "Failed to load resource" not in e]


def test_every_per_token_field_of_the_options_is_entered_in_the_table(page: Page, server: str) -> None:  # noqa: F811
    page.open()
    request = page.page.evaluate("window.grpoLens.request()")
    token_fields = [f["name"] for f in _options(server)["batch_fields"] if f["shape"] == "token"]
    offered = page.page.eval_on_selector_all(
        "#in-add-field option[value]:not([value=''])", "os => os.map(o => o.value)"
    )
    # the menu offers exactly the API's per-token fields the batch lacks (no hand list in the page)
    assert offered == [n for n in token_fields if n not in ALWAYS_SHOWN and n not in request], offered
    assert "entropies" in offered
    page.page.select_option("#in-add-field", "entropies")
    page.wait_for("document.querySelector('[aria-label=\"row 0 entropies 0\"]') !== null")
    rows = [len(r) for r in request["per_token_logps"]]
    assert page.page.evaluate("window.grpoLens.request().entropies") == [[0] * n for n in rows]  # a new field: 0
    before = page.drawn()
    page.page.fill("[aria-label='row 0 entropies 0']", "2.5")
    page.page.dispatch_event("[aria-label='row 0 entropies 0']", "change")
    page.wait_drawn(before)
    assert page.page.evaluate("window.grpoLens.request().entropies[0][0]") == 2.5
    # with the entropies given, an entropy bonus is computed instead of refused
    before = page.drawn()
    page.page.fill("#cfg-entropy_coef", "0.01")
    page.wait_drawn(before)
    # a redraw from the entropies' edit may land after ``before``: wait for the one that answers this edit
    page.wait_for("window.grpoLens.last?.config?.entropy_coef === 0.01")
    assert page.last()["config"]["entropy_coef"] == 0.01
    assert not page.page.is_visible("#stale-note")
    page.page.evaluate("document.getElementById('input-panel').scrollIntoView()")
    _shot(page, "confusions-input-entropies.png")
    page.check_clean()


def test_an_optional_setting_says_it_is_off_until_its_box_is_ticked(page: Page, server: str) -> None:  # noqa: F811
    page.open()
    nullable = [f["name"] for f in _options(server)["fields"] if f.get("nullable") and f["type"] == "number"]
    after = "(name) => getComputedStyle(document.getElementById('cfg-' + name).parentElement, '::after').content"
    off = [n for n in nullable if not page.page.is_checked(f"[aria-label='{n} on']")]
    assert off, "no optional setting is off in the article example"
    for name in off:
        assert "off: tick to set" in page.page.evaluate(after, name), name
    name = off[0]
    page.page.evaluate(f"document.getElementById('cfg-{name}').scrollIntoView({{block: 'center', inline: 'nearest'}})")
    page.page.evaluate("document.querySelector('.sidebar').scrollLeft = 0")
    _shot(page, "confusions-optional-setting-off.png")
    before = page.drawn()
    page.page.check(f"[aria-label='{name} on']")
    page.wait_drawn(before)
    assert page.page.evaluate(after, name) == "none"  # ticked: the box is on, no hint
    page.check_clean()


def test_a_refused_request_is_told_in_sentences_saying_where(page: Page) -> None:
    page.open("?scenario=mismatch-one-token")
    # rollout_rs with no threshold: a setting refused
    page.page.fill("#cfg-rollout_rs", "token_k1")
    page.page.dispatch_event("#cfg-rollout_rs", "change")
    page.wait_for(f"!{STALE}.hidden")
    note = page.page.inner_text("#stale-note")
    assert "The setting rollout_rs_threshold (under Loss settings): expected one threshold" in note, note
    assert "body" not in note and "›" not in note, note
    page.page.evaluate("window.scrollTo(0, 0)")
    _shot(page, "confusions-refused-setting.png")
    # entropies missing for an entropy bonus: a field of the input refused, with where to enter it
    page.page.fill("#cfg-rollout_rs", "")
    page.page.dispatch_event("#cfg-rollout_rs", "change")
    page.wait_for(f"{STALE}.hidden")
    page.page.fill("#cfg-entropy_coef", "0.01")
    page.page.wait_for_timeout(300)
    page.wait_for(f"!{STALE}.hidden")
    note = page.page.inner_text("#stale-note")
    assert "The input's entropies: expected per-token entropies" in note and "+ per-token field" in note, note
    status = page.page.inner_text("#status")
    assert "entropies" in status and "body" not in status, status
    page.page.evaluate("window.scrollTo(0, 0)")
    _shot(page, "confusions-refused-entropies.png")
    assert _loaded_errors(page) == [], page.errors
