"""The page takes its per-token fields from the server's table (options.token_fields, headless Chromium): a row
given a heatmap is drawn, pooled or cell by cell, with no edit to the page; the CSV's columns are the table's;
an upload's own warnings (a field the file holds that is no batch field) show beside the engine's.
Screenshots go to test-artifacts/token_fields/."""

# ruff: noqa: F811  (the fixtures imported from test_browser are the test functions' parameters)
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from api_fixtures import serve
from conftest import FULL_TOKEN_LIMIT
from safetensors.torch import save
from test_browser import ARTIFACTS, Page, browser, page, server  # noqa: F401  (fixtures)

from grpo.view.token_fields import TOKEN_FIELD_TABLE

SHOTS = ARTIFACTS / "token_fields"

# A plugin that gives the log-ratio's row a heatmap: the one edit a new heatmap takes.
PLUGIN = """
import dataclasses
from grpo.view import token_fields

token_fields.TOKEN_FIELD_TABLE = tuple(
    dataclasses.replace(f, heatmap="log ratio per token (white at 0)", centre=0.0) if f.name == "log_ratio" else f
    for f in token_fields.TOKEN_FIELD_TABLE
)
"""


@pytest.fixture(scope="module")
def plugin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "log_ratio_heatmap.py").write_text(PLUGIN)
    env = {
        "GRPO_LENS_PLUGINS": "log_ratio_heatmap",
        "PYTHONPATH": str(folder),
        "GRPO_LENS_FULL_TOKEN_LIMIT": str(FULL_TOKEN_LIMIT),
        "GRPO_LENS_PROCESS_WORKERS": "0",
    }
    with serve(env) as url:
        yield url


def _wide(width: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    old = (-torch.rand(2, width, generator=g) * 2 - 0.01).tolist()
    new = (torch.tensor(old) + 0.3 * torch.randn(2, width, generator=g)).clamp(max=0).tolist()
    return {"per_token_logps": new, "old_per_token_logps": old, "rewards": [1.0, 0.0]}


def _figure(page: Page, chart: str) -> dict[str, Any]:
    page.current_chart(chart)
    return dict(
        page.page.evaluate(
            f"(() => {{ const el = document.getElementById('{chart}'); return {{title: el.layout.title.text, "
            "z: el.data[0].z, hover: el.data[0].hovertemplate || ''}; })()"
        )
    )


def _shot(page: Page, selector: str, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.page.locator(selector).scroll_into_view_if_needed()
    page.page.locator(selector).screenshot(path=str(SHOTS / name))


def test_a_row_given_a_heatmap_is_drawn_pooled_and_cell_by_cell(browser: Any, plugin_server: str) -> None:
    page = Page(browser, plugin_server)
    try:
        page.open()
        heatmaps = page.page.eval_on_selector_all("#heatmaps .chart", "els => els.map((el) => el.id)")
        assert heatmaps == ["heat-ratio", "heat-surrogate", "heat-kl", "heat-loss", "heat-grad", "heat-log_ratio"]
        # 2 x 1300 positions: more cells than pixels, the server pools every heatmap of the table, this one too
        data = page.apply_json(_wide(1300))
        assert data["heatmap"]["factor_tokens"] == 3
        pooled = _figure(page, "heat-log_ratio")
        assert pooled["z"] == data["heatmap"]["fields"]["log_ratio"] and "pooled by 3 positions" in pooled["title"]
        _shot(page, "#heat-log_ratio", "log-ratio-pooled.png")
        # 2 x 4: drawn cell by cell from the answer's per-token arrays, with the hover the other heatmaps have
        data = page.apply_json(_wide(4))
        cells = _figure(page, "heat-log_ratio")
        assert cells["z"] == data["tokens"]["log_ratio"] and cells["title"] == "log ratio per token (white at 0)"
        assert cells["hover"] == _figure(page, "heat-ratio")["hover"]
        _shot(page, "#heat-log_ratio", "log-ratio-cells.png")
        page.check_clean()
    finally:
        page.context.close()


def test_the_csv_columns_are_the_tables(page: Page) -> None:
    page.open()
    with page.page.expect_download() as info:
        page.page.click("#export-csv")
    header = Path(info.value.path()).read_text().splitlines()[0].split(",")
    assert header == ["row", "position", "token", "region", *(f.name for f in TOKEN_FIELD_TABLE if f.csv)]
    page.check_clean()


def test_an_uploads_warning_shows_on_the_page(page: Page, tmp_path: Path) -> None:
    """The file holds a tensor that is no batch field: the server says it ignored it, and the page shows that
    sentence beside the engine's own (no old log-probs: the ratio is 1)."""
    page.open()
    lp = torch.tensor([[-0.5, -1.0, -0.7], [-0.2, -2.0, -0.4]])
    path = tmp_path / "batch.safetensors"
    path.write_bytes(save({"per_token_logps": lp, "advantages": torch.tensor([1.0, -1.0]), "extra_scores": lp.clone()}))
    before = page.drawn()
    page.page.click("#tab-upload")
    page.page.set_input_files("#upload-file", str(path))
    page.wait_drawn(before)
    answer = page.last()
    shown = page.page.inner_text("#warnings")
    assert [w["text"] for w in answer["warning_sentences"]] == answer["warnings"]
    assert "Ignored 'extra_scores' in the file: not a batch field." in shown
    assert "No old_per_token_logps" in shown  # the engine's warning, still there
    assert len(page.page.query_selector_all("#warnings > *")) == len(answer["warning_sentences"])
    _shot(page, "#warnings", "upload-warnings.png")
    page.check_clean()
