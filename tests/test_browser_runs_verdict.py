"""The Runs view's verdict (the three-state verdict) in real headless Chromium: it says a run matches its trainer only
when the check's verdict is "match". A real NeMo RL import (its dump holds no loss) is "unchecked", with the
reason, and never called a match; a tampered run names the steps past tolerance; a step file that cannot be
read is named with the error. Each step is marked by its verdict in the loss chart and in its label."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api_runs import write_run
from test_browser import CHROMIUM, Page, browser, serve  # noqa: F401 (browser is a fixture)
from test_browser_runs import _port, shoot_section
from test_importers import nemo_jsonl, nemo_train_data

from grpo.__main__ import main

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
MATCH_WORD = re.compile(r"\bmatch(es|ed|ing)?\b", re.IGNORECASE)  # "mismatch" is not the word


@pytest.fixture(scope="module")
def verdict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("verdicts")
    dump = root / "nemo-logs"
    dump.mkdir()
    for step in (1, 2):  # NeMo RL's train_data_step{N}.jsonl, as its Logger writes them
        (dump / f"train_data_step{step}.jsonl").write_text(nemo_jsonl(nemo_train_data(step)))
    runs = root / "runs"
    runs.mkdir()
    assert main(["import", "nemo-rl", str(dump), str(runs / "nemo")]) == 0
    write_run(runs, "tampered", tamper=True)  # step 2's returned losses 0.01 off
    unreadable = write_run(runs, "unreadable")
    step = unreadable / "steps" / "000002-001.safetensors"
    step.write_bytes(step.read_bytes()[:-16])  # its header intact, its tensors cut short
    shutil.rmtree(dump)
    yield from serve({"GRPO_LENS_RUNS_DIR": str(runs), "GRPO_LENS_PROCESS_WORKERS": "0"}, _port())


def open_run(page: Page, name: str) -> dict[str, Any]:
    """Open ``name`` in the Runs view; what it says (the verdict sentence, its list, the step label, the text
    of the whole view) and the loss chart's traces by name."""
    page.page.select_option("#run-select", name)
    page.wait_for(f"document.getElementById('runs').dataset.open === '{name}'", timeout=120)
    page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)
    page.wait_for("document.getElementById('status').className !== 'busy'")
    return page.page.evaluate(
        """(() => ({
          info: document.getElementById('run-info').textContent,
          infoClass: document.getElementById('run-info').className,
          verdict: document.getElementById('runs').dataset.verdict,
          reasons: [...document.querySelectorAll('#run-verdict li')].map((li) => li.textContent),
          label: document.getElementById('run-step-label').textContent,
          title: document.getElementById('run-step-label').title,
          text: document.getElementById('runs').textContent,
          traces: Object.fromEntries(document.getElementById('run-loss').data.map((t) => [t.name, t.x])),
        }))()"""
    )


def test_a_nemo_rl_import_is_unchecked_with_its_reason_never_a_match(browser: Any, verdict_server: str) -> None:  # noqa: F811
    page = Page(browser, verdict_server)
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '3'")
        shown = open_run(page, "nemo")
        assert not MATCH_WORD.search(shown["text"]), shown["info"]
        assert shown["verdict"] == "unchecked" and shown["infoClass"] == "run-info unchecked"
        assert "Not checked against the trainer" in shown["info"], shown["info"]
        assert shown["reasons"] and all(r.startswith("Not checked: ") for r in shown["reasons"]), shown["reasons"]
        assert any("not in the dump" in r and "(2 micro-batches)" in r for r in shown["reasons"]), shown["reasons"]
        assert shown["label"].endswith(" · not checked") and "not in the dump" in shown["title"], shown["label"]
        assert shown["traces"]["not checked"] == [1, 2]  # both steps marked on the loss chart
        assert page.page.input_value("#preset") == ""  # "none: the run's own config" (no preset), never "article"
        shoot_section(page, "runs", "runs-verdict-unchecked.png")
        page.check_clean()
    finally:
        page.context.close()


def test_a_run_past_tolerance_and_a_run_with_an_unreadable_file(browser: Any, verdict_server: str) -> None:  # noqa: F811
    page = Page(browser, verdict_server)
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '3'")
        shown = open_run(page, "tampered")
        assert shown["verdict"] == "differ" and shown["infoClass"] == "run-info error"
        assert "Mismatch at steps 2." in shown["info"] and not MATCH_WORD.search(shown["info"]), shown["info"]
        assert shown["traces"]["mismatch (past tolerance)"] == [2]
        assert "matches the trainer" in shown["label"]  # step 1's own verdict is a match
        shoot_section(page, "runs", "runs-verdict-differ.png")

        shown = open_run(page, "unreadable")
        assert shown["verdict"] == "error" and shown["infoClass"] == "run-info error"
        assert "could not be read, at steps 2" in shown["info"] and not MATCH_WORD.search(shown["info"])
        assert shown["reasons"][0].startswith("Could not read 000002-001.safetensors: "), shown["reasons"]
        assert shown["traces"]["could not be read"] == [2]
        shoot_section(page, "runs", "runs-verdict-error.png")
        page.check_clean()
    finally:
        page.context.close()
