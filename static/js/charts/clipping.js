// The Clipping view's figure: the objective against the ratio.

import { REGION_COLORS, fmt, whyColor } from "../format.js";
import { CLIP_VIEW } from "../labels.js";
import { base, panelTitle } from "./base.js";

const LOG_TICKS = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000];

// The objective against the ratio for A > 0 (left) and A < 0 (right), one figure of two panels.
// `options` is /api/v1/options (the objective's axis title comes from its registry entry).
export function clipCurves(data, options) {
  const c = data.curves;
  const p = c.points;
  const cfg = data.config;
  const traces = [];
  const shapes = [];
  const annotations = [];
  const shown = new Set();
  const panels = [
    { sign: 1, curve: c.positive, axis: "", domain: [0, 0.46], title: "A > 0 (good completion)" },
    { sign: -1, curve: c.negative, axis: "2", domain: [0.54, 1], title: "A < 0 (bad completion)" },
  ];
  for (const panel of panels) {
    const xref = `x${panel.axis}`;
    const yref = `y${panel.axis}`;
    traces.push({
      type: "scatter",
      mode: "lines",
      name: "objective",
      x: c.x,
      y: panel.curve.y,
      xaxis: xref,
      yaxis: yref,
      line: { color: "#1d2330", width: 2 },
      hoverinfo: "skip",
      legendgroup: "objective",
      showlegend: !panel.axis,
    });
    // each point coloured by its token's why (the server's code name: Clip-Cov's cut is not a dual clip)
    for (const region of data.why.names) {
      const idx = p.sign.map((s, i) => (s === panel.sign && p.why[i] === region ? i : -1)).filter((i) => i >= 0);
      if (!idx.length) continue;
      traces.push({
        type: "scatter",
        mode: "markers",
        name: data.why.labels[region] || region,
        xaxis: xref,
        yaxis: yref,
        legendgroup: region,
        showlegend: !shown.has(region),
        x: idx.map((i) => p.ratio[i]),
        y: idx.map((i) => p.y[i]),
        text: idx.map((i) => `row ${p.row[i]}, position ${p.position[i]}`),
        hovertemplate:
          `%{text}<br>ratio %{x:.4g}<br>${c.per_row ? CLIP_VIEW.rowTerm : CLIP_VIEW.tokenTerm} %{y:.4g}<extra>` +
          region +
          "</extra>",
        marker: { color: whyColor(region), size: 9, line: { color: "#fff", width: 1 } },
      });
      shown.add(region);
    }
    shapes.push({
      type: "line",
      xref,
      yref: `${yref} domain`,
      x0: 1,
      x1: 1,
      y0: 0,
      y1: 1,
      line: { color: "#888", width: 1, dash: "dot" },
    });
    shapes.push(
      ...panel.curve.flat.map((span) => ({
        type: "rect",
        xref,
        yref: `${yref} domain`,
        x0: span.x0,
        x1: span.x1,
        y0: 0,
        y1: 1,
        fillcolor: REGION_COLORS[span.region],
        opacity: 0.13,
        line: { width: 0 },
        layer: "below",
      })),
    );
    annotations.push(panelTitle(panel.title, panel.domain[0], 1.0));
  }
  const settings =
    `${cfg.objective} · ε_low ${fmt(cfg.epsilon_low)} · ε_high ${fmt(cfg.epsilon_high)}` +
    (cfg.dual_clip ? ` · dual clip ${fmt(cfg.dual_clip)}` : "") +
    (cfg.delta ? ` · delta ${fmt(cfg.delta)}` : "") +
    (c.truncated ? ` · the first ${p.ratio.length} tokens shown` : "") +
    (c.per_row ? ` · ${CLIP_VIEW.rowPoints}` : "");
  const yTitle = options.registries.objective.find((o) => o.name === cfg.objective)?.axis || "objective"; // from the registry
  // Log-axis ticks written out (Plotly's own read "2 5 1 2 5 10" for 0.2 0.5 1 2 5 10).
  const ticks = LOG_TICKS.filter((v) => v >= c.x[0] && v <= c.x[c.x.length - 1]);
  const xaxis = (domain) => ({
    type: "log",
    domain,
    title: { text: "ratio π/π_old (log scale)" },
    tickvals: ticks,
    ticktext: ticks.map(String),
  });
  return {
    data: traces,
    layout: base(`Objective per unit advantage · ${settings}`, {
      height: 380,
      shapes,
      annotations,
      margin: { l: 60, r: 20, t: 60, b: 40 },
      xaxis: xaxis(panels[0].domain),
      xaxis2: xaxis(panels[1].domain),
      yaxis: { title: { text: yTitle }, domain: [0, 0.92] },
      yaxis2: { anchor: "x2", domain: [0, 0.92] },
      legend: { orientation: "h", y: -0.25 },
    }),
  };
}
