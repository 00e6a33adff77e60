"""The report's figures as plain plotly figure dicts: ``{"data": [traces], "layout": {...}}``.

Built here from the timeline's answer and from a step's breakdown, so that the report's page only hands
them to ``Plotly.newPlot``: plotly.js draws dicts, no plotly Python package is imported and no number is
computed in the browser. Every value is the timeline's (or the breakdown's) own float.
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from grpo.loss import Breakdown
from grpo.view.answer import HEATMAP_MAX_ROWS, HEATMAP_MAX_TOKENS
from grpo.view.pooling import pool_extreme, pool_factors

RECOMPUTED_COLOR = "#1f77b4"
LOGGED_COLOR = "#ff7f0e"
ANOMALY_COLOR = "#d62728"
RANK_DASH = "dot"
# The heatmaps: which per-token field, its title, and the value the diverging colours are centred on.
HEATMAPS = (
    ("loss", "weighted loss per token (this token's share of the loss)", 0.0),
    ("ratio", "ratio π/π_old per token", 1.0),
)
NOT_COUNTED = "#9e9e9e"
DIVERGING = [[0.0, "#2166ac"], [0.5, "#f7f7f7"], [1.0, "#b2182b"]]


def base_layout(title: str, x_title: str, y_title: str, height: int = 280) -> dict[str, Any]:
    """The one layout every figure of the report starts from."""
    return {
        "title": {"text": title, "font": {"size": 14}},
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 45},
        "xaxis": {"title": {"text": x_title}},
        "yaxis": {"title": {"text": y_title}},
        "legend": {"orientation": "h", "y": -0.25},
        "hovermode": "closest",
    }


def step_axis(layout: dict[str, Any], steps: list[int]) -> dict[str, Any]:
    """Whole-number ticks on a step axis (at most about ten of them)."""
    span = (max(steps) - min(steps)) if steps else 0
    layout["xaxis"] |= {"tick0": min(steps, default=0), "dtick": max(1, math.ceil(span / 10))}
    return layout


def _line(name: str, x: list[int], y: list[Any], color: str, dash: str = "solid") -> dict[str, Any]:
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "name": name,
        "x": x,
        "y": y,
        "line": {"color": color, "dash": dash, "width": 1.5},
        "marker": {"size": 4},
        "connectgaps": False,
    }


def anomaly_markers(anomalies: list[dict[str, Any]], value_at: dict[int, Any]) -> dict[str, Any] | None:
    """The anomalies as red markers on a series, at their step's value there, their sentence on hover."""
    marked = [a for a in anomalies if value_at.get(a["step"]) is not None]
    if not marked:
        return None
    return {
        "type": "scatter",
        "mode": "markers",
        "name": "anomaly",
        "x": [a["step"] for a in marked],
        "y": [value_at[a["step"]] for a in marked],
        "text": [a["sentence"] for a in marked],
        "hovertemplate": "%{text}<extra></extra>",
        "marker": {"color": ANOMALY_COLOR, "size": 11, "symbol": "x-thin-open", "line": {"width": 2}},
    }


def loss_figure(answer: dict[str, Any]) -> dict[str, Any]:
    """The loss per step: recomputed beside the trainer's logged loss, each rank's where there are several,
    the anomalies marked on the loss (their ``series``) at their step."""
    steps = answer["steps"]
    x = [s["step"] for s in steps]
    recomputed = [s["loss"]["recomputed"] for s in steps]
    data = [_line("loss, recomputed", x, recomputed, RECOMPUTED_COLOR)]
    logged = [s["loss"]["logged"] for s in steps]
    if any(v is not None for v in logged):
        data.append(_line("loss, logged by the trainer", x, logged, LOGGED_COLOR, "dash"))
    if len(answer.get("ranks") or []) > 1:
        for rank in answer["ranks"]:
            by_rank = [(s.get("ranks") or {}).get(str(rank), {}).get("loss") for s in steps]
            data.append(_line(f"loss, rank {rank}", x, by_rank, "#7f7f7f", RANK_DASH) | {"visible": "legendonly"})
    about = [a for a in answer["anomalies"] if a["series"] == "loss"]
    markers = anomaly_markers(about, dict(zip(x, recomputed, strict=True)))
    if markers:
        data.append(markers)
    return {"data": data, "layout": step_axis(base_layout("loss", "step", "loss"), x)}


def series_figure(answer: dict[str, Any], series: dict[str, Any]) -> dict[str, Any] | None:
    """One series per step, recomputed beside the trainer's logged value where it logs one; the anomalies
    about this series marked. None when the run has no value of it at any step (the series does not apply)."""
    name, steps = series["name"], answer["steps"]
    x = [s["step"] for s in steps]
    values = [s["series"].get(name) for s in steps]
    logged = [(s.get("logged") or {}).get(name) for s in steps]
    if all(v is None for v in values) and all(v is None for v in logged):
        return None
    data = [_line(f"{series['label']}, recomputed", x, values, RECOMPUTED_COLOR)]
    if any(v is not None for v in logged):
        trainer = series.get("trainer_name") or name
        data.append(_line(f"{trainer}, logged by the trainer", x, logged, LOGGED_COLOR, "dash"))
    about = [a for a in answer["anomalies"] if a["series"] == name]
    markers = anomaly_markers(about, dict(zip(x, values, strict=True)))
    if markers:
        data.append(markers)
    layout = base_layout(series["label"], "step", series.get("trainer_name") or name)
    return {"data": data, "layout": step_axis(layout, x)}


def timeline_figures(answer: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(the loss figure then one figure per series in the answer's order, the labels of the series the run has
    no value of)."""
    figures, absent = [loss_figure(answer)], []
    for series in answer["series"]:
        figure = series_figure(answer, series)
        if figure is None:
            absent.append(series["label"])
        else:
            figures.append(figure)
    return figures, absent


def _grid(values: Tensor, mask: Tensor, center: float) -> tuple[list[list[float | None]], int, int]:
    """(the (B, T) grid as rows of floats, None where a position does not count; pooled into blocks of the
    counted value farthest from ``center`` where it has more cells than a heatmap has pixels)."""
    fr, ft = pool_factors(values.shape[0], values.shape[1], HEATMAP_MAX_ROWS, HEATMAP_MAX_TOKENS)
    pooled = pool_extreme(values.detach().cpu(), mask.cpu(), fr, ft, center).values
    rows = [[v if math.isfinite(v) else None for v in row] for row in pooled.tolist()]
    return rows, fr, ft


def heatmap_figure(bd: Breakdown, field: str, title: str, center: float, marked: list[list[int]]) -> dict[str, Any]:
    """One per-token field of a breakdown as a heatmap (rows down, token positions across), diverging about
    ``center``, the ``marked`` [row, position] tokens outlined."""
    z, fr, ft = _grid(getattr(bd.tokens, field), bd.tokens.mask, center)
    finite = [abs(v - center) for row in z for v in row if v is not None]
    reach = max(finite, default=0.0) or 1.0
    pooled = fr > 1 or ft > 1
    unit = f" (blocks of {fr} rows x {ft} positions, each its value farthest from {center:g})" if pooled else ""
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "z": z,
            "x0": (ft - 1) / 2,  # a block's cell centred on its positions: a marked token falls inside it
            "dx": ft,
            "y0": (fr - 1) / 2,
            "dy": fr,
            "colorscale": DIVERGING,
            "zmin": center - reach,
            "zmax": center + reach,
            "hoverongaps": False,
            "hovertemplate": f"row %{{y}}, position %{{x}}<br>{field} %{{z:.6g}}<extra></extra>",
            "colorbar": {"thickness": 12},
        }
    ]
    if marked:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "the anomaly's tokens",
                "x": [col for _, col in marked],
                "y": [row for row, _ in marked],
                "hovertemplate": "marked: row %{y}, position %{x}<extra></extra>",
                "marker": {"symbol": "square-open", "size": 14, "color": "#000000", "line": {"width": 2.5}},
                "showlegend": False,
            }
        )
    layout = base_layout(title + unit, "token position", "row", height=max(220, min(520, 60 + 18 * len(z))))
    layout["yaxis"]["autorange"] = "reversed"  # row 0 on top, as the page's heatmaps
    layout["plot_bgcolor"] = NOT_COUNTED  # the gaps: positions that do not count
    return {"data": data, "layout": layout}


def step_heatmaps(bd: Breakdown, marked: list[list[int]]) -> list[dict[str, Any]]:
    """The step's weighted per-token loss and ratio heatmaps, the given tokens marked on both."""
    return [heatmap_figure(bd, field, title, center, marked) for field, title, center in HEATMAPS]
