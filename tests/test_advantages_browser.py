"""The rows table with advantages per token, in real headless Chromium (tests/test_browser.py's fixtures):
a row whose tokens carry different advantages shows its mean, its range and the words "per token"; a row whose
tokens agree shows its value; every number is the server's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_browser import Page, browser, server  # noqa: F401  (fixtures)

ARTIFACTS = Path(os.environ.get("GRPO_LENS_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))


@pytest.fixture
def page(browser: Any, server: str) -> Any:  # noqa: F811
    p = Page(browser, server)
    p.open()
    yield p
    p.context.close()


def test_the_rows_table_says_per_token(page: Page) -> None:
    body = {
        "per_token_logps": [[-1.0, -2.0, -0.5], [-0.5, -0.7], [-0.3]],
        "old_per_token_logps": [[-1.1, -1.5, -0.6], [-0.4, -0.9], [-0.2]],
        "advantages": [[1.0, -2.0, 4.0], [0.5, 0.5], [-1.0]],
        "config": {"preset": "trl-dapo"},
    }
    data = page.apply_json(body)
    assert data["advantage_per_token"]["varies"] == [True, False, False]
    page.page.locator("#rows-table").scroll_into_view_if_needed()
    cells = page.page.eval_on_selector_all(
        "#rows-table td[data-quantity^='rows/advantage/']", "cells => cells.map(c => c.textContent)"
    )
    assert cells[0] == "1 (-2 … 4, per token)", cells
    assert cells[1] == "0.5" and cells[2] == "-1", cells
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.page.locator("#rows-table").screenshot(path=str(ARTIFACTS / "rows-per-token-advantages.png"))
    page.page.click("#tab-table")  # the input editor: a per-token row's advantages are the JSON tab's to edit
    editor = page.page.locator("#input-table")
    assert editor.locator("text=per token (the JSON tab edits them)").count() == 3
    editor.screenshot(path=str(ARTIFACTS / "input-per-token-advantages.png"))
    before = page.drawn()
    editor.locator("button", has_text="+ token").first.click()  # row 0 grows: its advantages grow with it
    page.wait_drawn(before)
    assert page.last()["tokens"]["advantage"][0] == [1.0, -2.0, 4.0, 4.0]
    page.check_clean()
