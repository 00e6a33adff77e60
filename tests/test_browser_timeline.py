"""The Runs view's timeline in real headless Chromium: one chart per series drawn from
/api/v1/runs/{run}/timeline as it is (the recomputed loss beside the trainer's logged one, a trace per rank),
an anomaly opened from its list entry (its step and micro-batch in the step view, its tokens outlined on the
heatmaps), a click on a point opening its step, and a second run laid beside the first."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api_timeline import SPIKE_COL, SPIKE_ROW, SPIKE_STEP, write_timeline_run
from test_browser import CHROMIUM, Page, browser, serve  # noqa: F401 (browser is a fixture)
from test_browser_runs import _port

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed")
SHOTS = Path("/tmp/shots_tpage")
MARKED = "the anomaly's tokens"  # charts.js TIMELINE_MARKED


@pytest.fixture(scope="module")
def timeline_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("timelines")
    runs = root / "runs"
    runs.mkdir()
    write_timeline_run(runs, "spiked")  # 10 steps; a spike at step 7 on row 1, position 2
    write_timeline_run(runs, "calm", spike=False, seed=3)
    write_timeline_run(runs, "ranks", ranks=(0, 1), spike=False, seed=5)
    env = {"GRPO_LENS_RUNS_DIR": str(runs), "GRPO_LENS_PROCESS_WORKERS": "0", "GRPO_LENS_CACHE_DIR": str(root / "c")}
    yield from serve(env, _port())


@pytest.fixture
def page(browser: Any, timeline_server: str) -> Iterator[Page]:  # noqa: F811
    p = Page(browser, timeline_server)
    p.open()
    p.wait_for("document.getElementById('runs').dataset.count === '3'")
    yield p
    p.context.close()


def api(server: str, name: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{server}/api/v1/runs/{name}/timeline") as r:
        return dict(json.loads(r.read()))


def open_timeline(page: Page, name: str) -> None:
    page.page.select_option("#run-select", name)
    page.wait_for(f"document.getElementById('run-timeline').dataset.open === '{name}'", timeout=120)
    page.wait_for("document.getElementById('runs').dataset.step === '1'", timeout=120)


def traces(page: Page, series: str) -> dict[str, dict[str, Any]]:
    """The traces of a series' timeline chart, by name: x, y, customdata, hovertext."""
    js = f"""[...document.querySelector('#timeline-{series} .timeline-chart').data].map(t => [t.name,
      {{x: t.x, y: t.y, customdata: t.customdata, hovertext: t.hovertext ?? null}}])"""
    return dict(page.page.evaluate(js))


def shoot(page: Page, element: str, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    page.page.evaluate(f"document.getElementById('{element}').scrollIntoView()")
    page.painted()  # the scroll's repaint
    page.page.screenshot(path=str(SHOTS / name), full_page=False)


def test_the_timeline_draws_every_series_of_the_answer(page: Page, timeline_server: str) -> None:
    answer = api(timeline_server, "spiked")
    open_timeline(page, "spiked")
    drawn = page.page.evaluate("[...document.querySelectorAll('#timeline-charts figure')].map(f => f.dataset.series)")
    names = [s["name"] for s in answer["series"]]
    with_values = [n for n in names if any(step["series"][n] is not None for step in answer["steps"])]
    assert drawn == ["loss", *with_values]  # a series null at every step (no sampler: no mismatch) is not drawn
    steps = [s["step"] for s in answer["steps"]]
    loss = traces(page, "loss")
    assert list(loss) == ["recomputed", "logged by the trainer", "anomalies"]
    assert loss["recomputed"]["x"] == steps and loss["recomputed"]["customdata"] == steps
    assert loss["recomputed"]["y"] == [s["loss"]["recomputed"] for s in answer["steps"]]
    assert loss["logged by the trainer"]["y"] == [s["loss"]["logged"] for s in answer["steps"]]
    on_loss = [a for a in answer["anomalies"] if a.get("series", "loss") == "loss" and a["kind"] != "kl_blowup"]
    assert loss["anomalies"]["x"] == [a["step"] for a in on_loss] and SPIKE_STEP in loss["anomalies"]["x"]
    assert [h.replace("<br>", " ") for h in loss["anomalies"]["hovertext"]] == [a["sentence"] for a in on_loss]
    for name in with_values:
        got = traces(page, name)["recomputed"]["y"]
        assert got == [s["series"][name] for s in answer["steps"]], name
    kl_marks = traces(page, "kl")["anomalies"]
    assert kl_marks["x"] == [a["step"] for a in answer["anomalies"] if a["kind"] == "kl_blowup"]
    listed = page.page.evaluate("[...document.querySelectorAll('#timeline-anomalies li')].map(li => li.textContent)")
    assert len(listed) == len(answer["anomalies"])
    assert all(a["sentence"] in text for a, text in zip(answer["anomalies"], listed, strict=True))
    shoot(page, "run-timeline", "timeline-spiked.png")
    shoot(page, "timeline-anomalies", "timeline-anomaly-list.png")

    ranks = api(timeline_server, "ranks")
    open_timeline(page, "ranks")
    by_rank = traces(page, "loss")
    assert [n for n in by_rank if n.startswith("rank ")] == ["rank 0", "rank 1"]
    assert by_rank["recomputed (2 ranks joined)"]["y"] == [s["loss"]["recomputed"] for s in ranks["steps"]]
    for rank in ("0", "1"):
        assert by_rank[f"rank {rank}"]["y"] == [s["ranks"][rank]["loss"] for s in ranks["steps"]]
    assert traces(page, "kl")["rank 1"]["y"] == [s["ranks"]["1"]["series"]["kl"] for s in ranks["steps"]]
    shoot(page, "run-timeline", "timeline-ranks.png")
    page.check_clean()


def test_an_anomaly_opens_its_step_with_its_tokens_marked(page: Page, timeline_server: str) -> None:
    answer = api(timeline_server, "spiked")
    spike = next(a for a in answer["anomalies"] if a["kind"] == "loss_spike")
    open_timeline(page, "spiked")
    page.page.click("#timeline-anomalies li[data-kind=loss_spike] button")
    page.wait_for(f"document.getElementById('runs').dataset.step === '{SPIKE_STEP}'")
    page.wait_for(f"document.getElementById('runs').dataset.micro === '{spike['micro']}'")
    page.wait_for("document.getElementById('status').className !== 'busy'")
    assert page.page.evaluate("document.getElementById('runs').dataset.anomaly") == f"{SPIKE_STEP}:loss_spike"
    for field in ("ratio", "loss"):
        page.current_chart(f"heat-{field}")
        page.wait_for(f"document.getElementById('heat-{field}').data.some(t => t.name === \"{MARKED}\")")
        heat = page.chart_data(f"heat-{field}")
        marks = next(t for t in heat if t["name"] == MARKED)
        assert marks["x"] == [col for _, col, *_ in spike["tokens"]]
        assert [label.split(" (")[0] for label in marks["y"]] == [f"row {row}" for row, *_ in spike["tokens"]]
        rows = heat[0]["y"]
        for (_, col, *_), label in zip(spike["tokens"], marks["y"], strict=True):
            assert heat[0]["z"][rows.index(label)][col] is not None  # a counted cell of the grid
    assert spike["tokens"][0][:2] == [SPIKE_ROW, SPIKE_COL]  # the planted token is the first named
    shoot(page, "view-heatmaps", "timeline-anomaly-marked.png")

    # a click on a point of the loss chart opens its step; the anomaly's marks go with the step they belong to
    page.page.evaluate(
        """(() => { const n = document.querySelector('#timeline-loss .timeline-chart');
        n.emit('plotly_click', {points: [{data: n.data[0], customdata: 3, x: 3}]}); })()"""
    )
    page.wait_for("document.getElementById('runs').dataset.step === '3'")
    page.current_chart("heat-ratio")
    assert MARKED not in [t["name"] for t in page.chart_data("heat-ratio")]
    page.check_clean()


def test_two_runs_side_by_side(page: Page, timeline_server: str) -> None:
    spiked, calm = api(timeline_server, "spiked"), api(timeline_server, "calm")
    open_timeline(page, "spiked")
    page.page.select_option("#timeline-other", "calm")
    page.wait_for("document.getElementById('run-timeline').dataset.beside === 'calm'")
    loss = traces(page, "loss")
    assert {"spiked: recomputed", "calm: recomputed", "spiked: logged by the trainer"} <= set(loss)
    assert loss["spiked: recomputed"]["y"] == [s["loss"]["recomputed"] for s in spiked["steps"]]
    assert loss["calm: recomputed"]["y"] == [s["loss"]["recomputed"] for s in calm["steps"]]
    assert loss["calm: recomputed"]["x"] == [s["step"] for s in calm["steps"]]
    kl = traces(page, "kl")
    assert kl["calm: recomputed"]["y"] == [s["series"]["kl"] for s in calm["steps"]]
    shoot(page, "run-timeline", "timeline-two-runs.png")
    axes = page.page.evaluate("[...document.querySelectorAll('#timeline-x option')].map(o => o.value)")
    assert axes == ["step", "cumulative"]  # every answer carries its cumulative counted tokens
    page.page.select_option("#timeline-x", "cumulative")  # aligned by the counted tokens so far
    page.wait_for("document.getElementById('run-timeline').dataset.axis === 'cumulative'")
    loss = traces(page, "loss")
    assert loss["calm: recomputed"]["x"] == [s["tokens"]["cumulative"] for s in calm["steps"]]
    assert loss["spiked: recomputed"]["x"] == [s["tokens"]["cumulative"] for s in spiked["steps"]]
    shoot(page, "run-timeline", "timeline-two-runs-by-tokens.png")
    page.page.select_option("#timeline-other", "")
    page.wait_for("document.getElementById('run-timeline').dataset.beside === ''")
    assert list(traces(page, "loss")) == ["recomputed", "logged by the trainer", "anomalies"]
    page.check_clean()
