"""python -m grpo report: one self-contained HTML file whose numbers are the timeline's (grpo.runs.timeline).

The figures are read back out of the HTML (the JSON the page hands to plotly.js) and compared with the timeline
answer and with the worst steps' breakdowns recomputed here; the command works without plotly only to say which
extra to install, and never imports the web stack or plotly itself.
"""

from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_layering import BLOCK_WEB
from test_runs import CONFIG, step_tensors

import grpo
import grpo.check
import grpo.report
import grpo.timeline
from grpo.__main__ import main
from grpo.check import check_run, evaluate_ref
from grpo.report import REPORT_EXTRA, severity, worst_steps
from grpo.report_figures import heatmap_figure
from grpo.runs import RunWriter, load_run, load_step, timeline

ROOT = Path(__file__).resolve().parents[1]
FIGURES = re.compile(r'<script type="application/json" id="report-figures">(.*?)</script>', re.S)


def write_run(root: Path, name: str, steps: int = 8, *, differ: int | None = None, losses: bool = True) -> Path:
    """``steps`` steps of two micro-batches; each file's meta holds the loss GRPO Lens computes for it (+0.01
    in micro-batch 0 of step ``differ``: that step differs), or nothing when not ``losses`` (unchecked)."""
    writer = RunWriter(root / name, "trl", CONFIG)
    for step in range(1, steps + 1):
        for micro in (0, 1):
            tensors = step_tensors(10 * step + micro)
            path = writer.write_step(step, micro, tensors, {})
            if losses:
                batch, config, _ = load_step(path)
                loss = float(grpo.evaluate(batch, config).loss) + (0.01 if (step, micro) == (differ, 0) else 0.0)
                writer.write_step(step, micro, tensors, {"loss": loss})
    writer.update(status="done")
    return root / name


def report_of(run: Path, *args: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """Write the report of ``run`` with the CLI; its HTML and its figures by element id."""
    out = run.parent / f"{run.name}.html"
    assert main(["report", str(run), "--html", str(out), "--jobs", "1", *args]) == 0
    page = out.read_text(encoding="utf-8")
    (data,) = FIGURES.findall(page)
    figures = {f["id"]: f["figure"] for f in json.loads(data)["figures"]}
    assert all(f'id="{i}"' in page for i in figures)  # each figure has its element
    return page, figures


def traces(figure: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t.get("name", t["type"]): t for t in figure["data"]}


@pytest.fixture(scope="module")
def differ_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(tmp_path_factory.mktemp("report"), "differ", differ=6)


def test_the_report_draws_the_timelines_numbers_and_marks_its_anomalies(differ_run: Path) -> None:
    page, figures = report_of(differ_run)
    answer = timeline(differ_run)
    steps = [s["step"] for s in answer["steps"]]
    loss = traces(figures["timeline-0"])
    assert loss["loss, recomputed"]["x"] == steps
    assert loss["loss, recomputed"]["y"] == [s["loss"]["recomputed"] for s in answer["steps"]]  # the same floats
    assert [a["step"] for a in answer["anomalies"]] and loss["anomaly"]["x"] == [a["step"] for a in answer["anomalies"]]
    series_figures = [f for i, f in figures.items() if i.startswith("timeline-") and i != "timeline-0"]
    drawn = {f["layout"]["title"]["text"]: f for f in series_figures}
    for series in answer["series"]:
        values = [s["series"].get(series["name"]) for s in answer["steps"]]
        if all(v is None for v in values):
            assert series["label"] not in drawn and html.escape(series["label"]) in page  # said not drawn
            continue
        assert traces(drawn[series["label"]])[f"{series['label']}, recomputed"]["y"] == values
    assert len(drawn) == len(series_figures)  # one figure per series
    for a in answer["anomalies"]:
        assert html.escape(a["sentence"]) in page
    # the run's verdict, as check-run gives it: step 6's loss moved by 0.01
    assert answer["verdict"] == check_run(load_run(differ_run)).verdict == "differ"
    assert 'id="verdict">differ</span>' in page
    assert "differ" in [a["kind"] for a in answer["anomalies"] if a["step"] == 6]


def test_the_worst_steps_heatmaps_are_their_breakdowns_with_the_anomalys_tokens_marked(differ_run: Path) -> None:
    _, figures = report_of(differ_run, "--worst", "2")
    answer = timeline(differ_run)
    chosen = worst_steps(answer, 2)
    assert len(chosen) == 2 and len({w.step for w in chosen}) == 2
    first = max(answer["anomalies"], key=severity)
    assert (chosen[0].step, chosen[0].tokens) == (first["step"], first["tokens"])
    # one anomaly only: the second is the other steps' largest |loss| (the trainer logged no loss here)
    others = [s for s in answer["steps"] if s["step"] != first["step"]]
    assert chosen[1].step == max(others, key=lambda s: abs(s["loss"]["recomputed"]))["step"] and chosen[1].micro is None
    for w in chosen:
        # the anomaly's file, else the step's file with the largest |loss|
        refs = [r for r in load_run(differ_run).micro_batches(w.step) if w.micro in (None, r.micro)]
        bd = max((evaluate_ref(r)[0] for r in refs), key=lambda b: abs(float(b.loss)))
        for k, (field, center) in enumerate((("loss", 0.0), ("ratio", 1.0))):
            heat, *marks = figures[f"step-{w.step}-{k}"]["data"]
            values, mask = getattr(bd.tokens, field), bd.tokens.mask
            # 4 x 5 tokens: one cell per token, None where the position does not count (row 1 from position 3)
            expected = [[float(values[r, c]) if mask[r, c] else None for c in range(5)] for r in range(4)]
            assert heat["z"] == expected and heat["zmin"] + heat["zmax"] == pytest.approx(2 * center)
            if w.tokens:
                assert [[y, x] for x, y in zip(marks[0]["x"], marks[0]["y"], strict=True)] == w.tokens


def test_json_writes_the_timeline_answer(differ_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "timeline.json"
    report_of(differ_run, "--json", str(out))
    assert json.loads(out.read_text()) == json.loads(json.dumps(timeline(differ_run)))


def test_an_unchecked_run_says_why_as_check_run_does(tmp_path: Path) -> None:
    run = write_run(tmp_path, "no-losses", steps=3, losses=False)
    page, _ = report_of(run)
    check = check_run(load_run(run))
    assert check.verdict == timeline(run)["verdict"] == "unchecked"
    assert 'id="verdict">unchecked</span>' in page
    reasons = check.unchecked_reasons()
    assert reasons
    for reason, count in reasons:
        assert html.escape(reason) in page and f"({count} " in page


def test_an_unchecked_run_is_evaluated_once_and_says_the_timelines_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The verdict's words come from the timeline's answer: each step file is evaluated once by the timeline
    (no second check of the run), and the report's heatmaps evaluate only the worst steps' files."""
    run = write_run(tmp_path, "no-losses", steps=3, losses=False)
    check = check_run(load_run(run))  # before counting: the reference the page is held to
    counted = {"timeline": 0, "heatmaps": 0, "check": 0}

    def counting(where: str, inner: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            counted[where] += 1
            return inner(*args, **kwargs)

        return call

    monkeypatch.setattr(grpo.timeline, "evaluate", counting("timeline", grpo.timeline.evaluate))
    monkeypatch.setattr(grpo.report, "evaluate_ref", counting("heatmaps", grpo.report.evaluate_ref))
    monkeypatch.setattr(grpo.check, "check_run", counting("check", grpo.check.check_run))
    page, _ = report_of(run)
    answer = timeline(run)  # kept: answered without evaluating a file
    worst = worst_steps(answer, grpo.report.DEFAULT_WORST)
    files = sum(len(load_run(run).micro_batches(w.step)) if w.micro is None else 1 for w in worst)
    assert counted == {"timeline": 6, "heatmaps": files, "check": 0}  # 3 steps x 2 micro-batches, each once
    assert answer["unchecked"] == check.unchecked_items() and answer["errors"] == []
    for item in answer["unchecked"]:
        assert f"<li>{html.escape(item['reason'])} ({item['count']} {item['of']})</li>" in page


def test_a_file_that_cannot_be_read_is_named_with_check_runs_error(tmp_path: Path) -> None:
    run = write_run(tmp_path, "cut", steps=4)
    step = run / "steps" / "000003-001.safetensors"
    step.write_bytes(step.read_bytes()[:-16])  # its header intact, its tensors cut short
    page, _ = report_of(run)
    check = check_run(load_run(run))
    (failed,) = [m for m in check.micro if m.error is not None]
    assert check.verdict == timeline(run)["verdict"] == "error" and 'id="verdict">error</span>' in page
    assert f"<li>step 3, {failed.file}: {html.escape(failed.error or '')}</li>" in page


def test_a_wide_step_is_pooled_into_blocks_holding_their_value_farthest_from_the_center(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "wide", "trl", CONFIG)
    path = writer.write_step(1, 0, step_tensors(3, T=1300), {})
    bd = grpo.evaluate(*load_step(path)[:2])
    figure = heatmap_figure(bd, "ratio", "ratio", 1.0, [[2, 1000]])
    heat, marks = figure["data"]
    # 1300 positions over at most 600 cells: blocks of 3 positions (434 cells), one row each
    assert (heat["dx"], heat["dy"], len(heat["z"][0])) == (3, 1, 434) and "blocks of 1 rows x 3" in str(figure)
    ratio, mask = bd.tokens.ratio, bd.tokens.mask
    for r in range(4):  # a plain loop: each block's counted ratio farthest from 1, the first of equals
        for k in range(434):
            cells = [float(ratio[r, c]) for c in range(3 * k, min(3 * k + 3, 1300)) if mask[r, c]]
            assert heat["z"][r][k] == (max(cells, key=lambda v: abs(v - 1.0)) if cells else None)
    # the marked token at position 1000 lies in block 333, drawn centred on positions 999..1001
    assert marks["x"] == [1000] and heat["x0"] + 333 * heat["dx"] == 1000


def test_worst_steps_without_anomalies_are_the_largest_gaps_then_the_largest_losses() -> None:
    def step(n: int, recomputed: float, logged: float | None) -> dict[str, Any]:
        return {"step": n, "loss": {"recomputed": recomputed, "logged": logged}}

    # |loss - logged|: step 1 0.1, step 2 0.5, step 3 0.3 (step 4 logged none: not ranked by a gap)
    logged = {"anomalies": [], "steps": [step(1, 1.0, 1.1), step(2, 0.5, 0.0), step(3, -0.2, 0.1), step(4, 9.0, None)]}
    assert [w.step for w in worst_steps(logged, 2)] == [2, 3]
    # no logged loss anywhere: the largest |loss|
    bare = {"anomalies": [], "steps": [step(1, 0.1, None), step(2, -0.7, None), step(3, 0.4, None)]}
    assert [w.step for w in worst_steps(bare, 2)] == [2, 3]
    assert all(w.micro is None and w.tokens == [] for w in worst_steps(bare, 3))


def test_worst_steps_with_anomalies_take_each_step_once_by_its_worst() -> None:
    def anomaly(step: int, value: float, baseline: float) -> dict[str, Any]:
        return {"step": step, "value": value, "baseline": baseline, "micro": 0, "rank": None, "tokens": [[0, step]],
                "sentence": f"step {step}"}  # fmt: skip

    # relative departures: step 3 |2 - 1| / 1 = 1 and 5; step 4 |0.3 - 0.1| / 0.1 = 2; step 7 from 0: inf
    anomalies = [anomaly(3, 2.0, 1.0), anomaly(4, 0.3, 0.1), anomaly(3, 6.0, 1.0), anomaly(7, 0.5, 0.0)]
    assert [severity(a) for a in anomalies] == [1.0, pytest.approx(2.0), 5.0, math.inf]
    chosen = worst_steps({"anomalies": anomalies, "steps": []}, 3)
    assert [(w.step, w.why) for w in chosen] == [(7, "step 7"), (3, "step 3"), (4, "step 4")]


def test_without_plotly_the_command_exits_2_naming_the_extra(
    differ_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = grpo.report.importlib.util.find_spec
    monkeypatch.setattr(grpo.report.importlib.util, "find_spec", lambda n, *a: None if n == "plotly" else real(n, *a))
    out = tmp_path / "r.html"
    assert main(["report", str(differ_run), "--html", str(out)]) == 2
    assert f"pip install '{REPORT_EXTRA}'" in capsys.readouterr().err and REPORT_EXTRA == "grpo-lens[report]"
    assert not out.exists()


def test_a_process_without_plotly_exits_2_and_the_report_imports_neither_plotly_nor_the_web_stack(
    differ_run: Path, tmp_path: Path
) -> None:
    report = (
        "from grpo.__main__ import main\n"
        "code = main(['report', sys.argv[1], '--html', sys.argv[2], '--jobs', '1'])\n"
        "web = {'app', 'fastapi', 'starlette', 'uvicorn', 'pydantic', 'jinja2', 'plotly'}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in web)))\n"
        "raise SystemExit(code)\n"
    )
    out = tmp_path / "r.html"

    def run(prelude: str) -> subprocess.CompletedProcess[str]:
        script = "import json, sys\n" + prelude + report
        argv = [sys.executable, "-c", script, str(differ_run), str(out)]
        return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    hidden = run(BLOCK_WEB)  # neither plotly nor the web stack importable, as after `pip install grpo-lens`
    assert hidden.returncode == 2 and "pip install 'grpo-lens[report]'" in hidden.stderr, hidden.stderr[-2000:]
    assert not out.exists()
    written = run("")  # plotly installed: read as a file, never imported
    assert written.returncode == 0, written.stderr[-2000:]
    assert json.loads(written.stdout.splitlines()[-1]) == [] and out.stat().st_size > 1_000_000


def test_the_page_is_self_contained(differ_run: Path) -> None:
    page, _ = report_of(differ_run)
    path = grpo.report.plotly_js_path()
    assert path is not None and path.read_text(encoding="utf-8") in page  # plotly.js inlined whole
    ours = page.replace(path.read_text(encoding="utf-8"), "")
    assert not re.search(r"(src|href)\s*=", ours)  # nothing loaded from a file or address: no script, no style sheet
    assert ours.count("<script") == 3  # plotly.js, the figures' JSON, the loop handing them to it
