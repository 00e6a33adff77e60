"""One self-contained HTML report of a run: its verdict, its timeline, its anomalies and the worst steps' tokens.

``python -m grpo report RUN_DIR`` writes it: a single file to attach to a pull request or a CI run, opened
offline (plotly.js is inlined from the installed ``plotly`` package: no CDN, no server, no network). The numbers
are the timeline's (``grpo.runs.timeline``) and the worst steps' breakdowns (``grpo.check.evaluate_ref``); the
figures are plotly figure dicts built in ``grpo.report_figures``, which the page only hands to plotly.js.

The plotting dependency is the extra ``grpo-lens[report]``: nothing here imports plotly, the report reads
plotly.js's file from where the package is installed (``plotly_js_path``), so the core wheel stays free of it.
"""

from __future__ import annotations

import html
import importlib.metadata
import importlib.util
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo.check import evaluate_ref
from grpo.errors import GrpoInputError
from grpo.loss import Breakdown
from grpo.marks import number, plain
from grpo.report_figures import step_heatmaps, timeline_figures
from grpo.run_directory import Run, StepRef, load_run, utc_now, write_atomic
from grpo.runs import timeline

REPORT_EXTRA = "grpo-lens[report]"
NO_PLOTLY = f"the report needs plotly.js from the plotly package: pip install '{REPORT_EXTRA}'"
DEFAULT_WORST = 3
"""How many of the worst steps the report draws token heatmaps of."""
STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #222; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-bottom: 1px solid #ddd; padding-bottom: 4px; margin-top: 32px; }
.verdict { display: inline-block; padding: 2px 10px; border-radius: 4px; font-weight: 600; color: #fff; }
.verdict-match { background: #2e7d32; } .verdict-differ { background: #c62828; }
.verdict-unchecked { background: #8d6e00; } .verdict-error { background: #6a1b9a; }
table { border-collapse: collapse; } td, th { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: left;
  vertical-align: top; }
.chart { border: 1px solid #eee; margin: 10px 0; } .muted { color: #666; }
"""
DRAW = """
const report = JSON.parse(document.getElementById("report-figures").textContent);
for (const {id, figure} of report.figures) {
  Plotly.newPlot(document.getElementById(id), figure.data, figure.layout, {displaylogo: false, responsive: true});
}
"""


def plotly_js_path() -> Path | None:
    """Where the installed plotly package keeps plotly.min.js (found without importing plotly); None when
    plotly is not installed (``pip install 'grpo-lens[report]'``)."""
    try:
        spec = importlib.util.find_spec("plotly")
    except (ImportError, ValueError):  # a finder that refuses it: not importable here either
        spec = None
    for base in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(base, "package_data", "plotly.min.js")
        if path.is_file():
            return path
    return None


@dataclass(frozen=True)
class WorstStep:
    """A step the report draws the tokens of, and why it was chosen."""

    step: int
    micro: int | None
    """The micro-batch (step file) to draw; None: the step's file with the largest |loss|."""
    rank: int | None
    tokens: list[list[int]]
    """[row, position] of the tokens to mark (an anomaly's)."""
    why: str


def severity(anomaly: dict[str, Any]) -> float:
    """How far an anomaly's value is from its baseline, relative to the baseline's size (inf from a zero
    baseline): the order in which the report picks the worst steps."""
    value, baseline = anomaly.get("value"), anomaly.get("baseline")
    if not isinstance(value, int | float) or not isinstance(baseline, int | float):
        return 0.0
    gap = abs(value - baseline)
    return gap / abs(baseline) if baseline else (math.inf if gap else 0.0)


def worst_steps(answer: dict[str, Any], n: int) -> list[WorstStep]:
    """The ``n`` worst steps: those with anomalies first (each step once, by its worst anomaly's ``severity``),
    then, while fewer than ``n``, the others by ``_largest``."""
    by_step: dict[int, dict[str, Any]] = {}
    for a in sorted(answer["anomalies"], key=severity, reverse=True):
        by_step.setdefault(a["step"], a)
    chosen = [WorstStep(a["step"], a["micro"], a["rank"], a["tokens"], plain(a["sentence"])) for a in by_step.values()]
    rest = [s for s in answer["steps"] if s["step"] not in by_step and s["loss"]["recomputed"] is not None]
    return (chosen + _largest(rest))[:n]


def _largest(steps: list[dict[str, Any]]) -> list[WorstStep]:
    """Steps by the largest |loss - logged| where the trainer logged its loss, else by the largest |loss|."""
    logged = [s for s in steps if s["loss"]["logged"] is not None]
    if logged:
        gaps = sorted(((abs(s["loss"]["recomputed"] - s["loss"]["logged"]), s["step"]) for s in logged), reverse=True)
        return [
            WorstStep(
                step, None, None, [], f"The step's |loss − logged loss| {number(gap)} is among the run's largest."
            )
            for gap, step in gaps
        ]
    losses = sorted(((abs(s["loss"]["recomputed"]), s["loss"]["recomputed"], s["step"]) for s in steps), reverse=True)
    return [
        WorstStep(step, None, None, [], f"The step's loss {number(loss)} is among the run's largest in size.")
        for _, loss, step in losses
    ]


def _file_of(run: Run, worst: WorstStep) -> tuple[StepRef, Breakdown]:
    """The step file to draw and its breakdown: the named micro-batch, else the step's largest |loss|."""
    files = run.micro_batches(worst.step)
    refs = [r for r in files if worst.micro is None or (r.micro, r.rank) == (worst.micro, worst.rank)] or files
    done = [(ref, evaluate_ref(ref)[0]) for ref in refs]
    return max(done, key=lambda rb: abs(float(rb[1].loss)))  # the first of equals: the run's file order


def _where(micro: int, rank: int | None) -> str:
    return f"micro-batch {micro}" + ("" if rank is None else f", rank {rank}")


def worst_step_figures(run: Run, worst: list[WorstStep]) -> list[dict[str, Any]]:
    """Per chosen step: which file, why, and its weighted-loss and ratio heatmaps with the tokens marked."""
    out = []
    for w in worst:
        try:
            ref, bd = _file_of(run, w)
        except (GrpoInputError, OSError) as exc:  # the step's verdict is error: say why instead of drawing it
            out.append({"step": w.step, "where": "its step file", "why": f"{w.why} Not drawn: {exc}", "figures": []})
            continue
        where = _where(ref.micro, ref.rank)
        if w.micro is None and len(run.micro_batches(w.step)) > 1:
            where += f" (of the step's {len(run.micro_batches(w.step))} files, the one with the largest |loss|)"
        out.append({"step": w.step, "where": where, "why": w.why, "figures": step_heatmaps(bd, w.tokens)})
    return out


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def verdict_html(answer: dict[str, Any]) -> str:
    """The run's verdict, its steps by verdict, what was not compared with why and the files that could not be
    read, as check-run says them (the timeline's ``unchecked`` and ``errors``)."""
    verdict = answer["verdict"]
    counts: dict[str, int] = {}
    for s in answer["steps"]:
        counts[s["verdict"]] = counts.get(s["verdict"], 0) + 1
    said = ", ".join(f"{n} {v}" for v, n in counts.items()) or "none"
    parts = [
        f'<p><span class="verdict verdict-{_e(verdict)}" id="verdict">{_e(verdict)}</span> '
        f"{len(answer['steps'])} steps ({_e(said)})</p>"
    ]
    reasons = answer["unchecked"]
    if reasons:
        items = "".join(f"<li>{_e(r['reason'])} ({r['count']} {_e(r['of'])})</li>" for r in reasons)
        parts.append(f'<p>not compared:</p><ul id="unchecked">{items}</ul>')
    errors = answer["errors"]
    if errors:
        items = "".join(f"<li>step {e['step']}, {_e(e['file'])}: {_e(e['error'])}</li>" for e in errors)
        parts.append(f'<p>could not be read or evaluated:</p><ul id="errors">{items}</ul>')
    return "".join(parts)


def anomalies_html(answer: dict[str, Any]) -> str:
    """The anomalies as a table: step, kind, where, and the sentence computed for that step."""
    if not answer["anomalies"]:
        return '<p class="muted">No anomaly found with these thresholds.</p>'
    rows = []
    for a in answer["anomalies"]:
        where = "" if a.get("micro") is None else _where(a["micro"], a.get("rank"))
        rows.append(
            f'<tr class="anomaly"><td>{a["step"]}</td><td>{_e(a["kind"])}</td><td>{_e(where)}</td>'
            f'<td class="sentence">{_e(plain(a["sentence"]))}</td></tr>'
        )
    head = "<tr><th>step</th><th>kind</th><th>file</th><th>what</th></tr>"
    return f'<table id="anomalies">{head}{"".join(rows)}</table>'


def _thresholds_html(answer: dict[str, Any]) -> str:
    items = ", ".join(f"{_e(k)} {_e(v)}" for k, v in answer.get("thresholds", {}).items())
    return f'<p class="muted">Thresholds: {items}.</p>' if items else ""


def _json_in_script(data: Any) -> str:
    """JSON to put inside a <script> element: no "<" in it can close the element (as \\u003c it parses the same)."""
    return json.dumps(data, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def report_html(answer: dict[str, Any], run: Run, worst: list[dict[str, Any]], plotly_js: str) -> str:
    """The report's page: everything inline, the figures as JSON data handed to plotly.js."""
    figures, absent = timeline_figures(answer)
    placed = [{"id": f"timeline-{i}", "figure": f} for i, f in enumerate(figures)]
    steps_html = []
    for w in worst:
        ids = [f"step-{w['step']}-{k}" for k in range(len(w["figures"]))]
        placed += [{"id": i, "figure": f} for i, f in zip(ids, w["figures"], strict=True)]
        charts = "".join(f'<div class="chart" id="{i}"></div>' for i in ids)
        steps_html.append(f"<h3>Step {w['step']}, {_e(w['where'])}</h3><p>{_e(w['why'])}</p>{charts}")
    timeline_charts = "".join(f'<div class="chart" id="timeline-{i}"></div>' for i in range(len(figures)))
    not_drawn = ""
    if absent:
        not_drawn = f'<p class="muted">Not drawn (the run has no value of them): {_e(", ".join(absent))}.</p>'
    info = run.info
    about = f"source {info.get('source')}, status {info.get('status')}, created {info.get('created')}"
    version = _version()
    inlined = plotly_js.replace("</script", "<\\/script")  # cannot end its element (it holds none today)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>GRPO Lens report: {_e(answer["run"])}</title>
<style>{STYLE}</style>
<script>{inlined}</script></head>
<body>
<h1>GRPO Lens report: {_e(answer["run"])}</h1>
<p class="muted">{_e(about)}; written {_e(utc_now())} by grpo-lens {_e(version)} (python -m grpo report).</p>
<h2>Verdict</h2>{verdict_html(answer)}
<h2>Anomalies</h2>{anomalies_html(answer)}{_thresholds_html(answer)}
<h2>Timeline</h2>{timeline_charts}{not_drawn}
<h2>Worst steps</h2>{"".join(steps_html) or '<p class="muted">No step to draw.</p>'}
<script type="application/json" id="report-figures">{_json_in_script({"figures": placed})}</script>
<script>{DRAW}</script>
</body></html>
"""


def _version() -> str:
    try:
        return importlib.metadata.version("grpo-lens")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def write_report(
    run_dir: str | os.PathLike[str],
    html_path: str | os.PathLike[str] | None,
    json_path: str | os.PathLike[str] | None = None,
    *,
    worst: int = DEFAULT_WORST,
    jobs: int = 1,
) -> dict[str, Any]:
    """Write the run's report to ``html_path`` (and the timeline's answer to ``json_path``); return the answer.
    Raises ``FileNotFoundError`` naming the extra when plotly is not installed and an HTML file is asked for."""
    js = plotly_js_path()
    if html_path is not None and js is None:
        raise FileNotFoundError(NO_PLOTLY)
    run = load_run(run_dir)
    answer = timeline(run.path, jobs=jobs)
    if json_path is not None:
        write_atomic(Path(json_path), json.dumps(answer, allow_nan=False).encode())
    if html_path is not None and js is not None:
        chosen = worst_step_figures(run, worst_steps(answer, worst))
        page = report_html(answer, run, chosen, js.read_text(encoding="utf-8"))
        write_atomic(Path(html_path), page.encode())
    return answer
