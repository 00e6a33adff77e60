"""The Runs view says what an import does not reproduce, in real headless Chromium: run.json's
``imported.unsupported`` (setting -> why) listed under the verdict as "Not reproduced: setting — why", each setting
once; an import that reproduces every setting it was given shows no such list."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_browser import CHROMIUM, Page, browser, serve  # noqa: F401 (browser is a fixture)
from test_browser_runs import _port, shoot_section
from test_importers import nemo_jsonl, nemo_train_data

from grpo.importers import nemo_rl
from grpo.runs import load_run

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
# NeMo RL's loss settings the import maps but does not reproduce, and one NeMo RL's loss never reads
PARTLY = {"reference_policy_kl_penalty": 0.05, "positive_example_nll_weight": 0.1, "my_clip": 1.0}
WHOLLY = {"reference_policy_kl_penalty": 0.0, "ratio_clip_max": 0.28}


@pytest.fixture(scope="module")
def imports_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("imports")
    dump = root / "nemo-logs"
    dump.mkdir()
    for step in (1, 2):  # NeMo RL's train_data_step{N}.jsonl, as its Logger writes them
        (dump / f"train_data_step{step}.jsonl").write_text(nemo_jsonl(nemo_train_data(step)))
    runs = root / "runs"
    runs.mkdir()
    nemo_rl.import_nemo_rl(dump, runs / "partly", {"loss_fn": PARTLY})
    nemo_rl.import_nemo_rl(dump, runs / "wholly", {"loss_fn": WHOLLY})
    unsupported = load_run(runs / "partly").info["imported"]["unsupported"]
    env = {"GRPO_LENS_RUNS_DIR": str(runs), "GRPO_LENS_PROCESS_WORKERS": "0"}
    for url in serve(env, _port()):
        yield {"url": url, "unsupported": unsupported}


def shown(page: Page, name: str) -> dict[str, Any]:
    page.page.select_option("#run-select", name)
    page.wait_for(f"document.getElementById('runs').dataset.open === '{name}'", timeout=120)
    page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)
    return page.page.evaluate(
        """(() => {
          const list = document.getElementById('run-unsupported');
          return {
            items: [...list.querySelectorAll('li')].map((li) => li.textContent),
            visible: !list.hidden && list.getBoundingClientRect().height > 0,
            afterVerdict: list.previousElementSibling?.id,
          };
        })()"""
    )


def test_the_runs_view_lists_what_an_import_does_not_reproduce(browser: Any, imports_server: dict[str, Any]) -> None:  # noqa: F811
    page = Page(browser, imports_server["url"])
    try:
        page.open()
        page.wait_for("document.getElementById('runs').dataset.count === '2'")
        partly = shown(page, "partly")
        expected = [f"Not reproduced: {k} — {why}" for k, why in imports_server["unsupported"].items()]
        assert partly["items"] == expected and partly["visible"], partly
        assert set(imports_server["unsupported"]) == set(PARTLY)  # every setting given and not reproduced
        assert imports_server["unsupported"]["my_clip"] == nemo_rl.UNREAD
        assert partly["afterVerdict"] == "run-verdict"  # under the verdict's reasons
        shoot_section(page, "runs", "runs-imports-unsupported.png")
        wholly = shown(page, "wholly")  # the list of the run opened before is gone
        assert wholly["items"] == [] and not wholly["visible"], wholly
        page.check_clean()
    finally:
        page.context.close()
