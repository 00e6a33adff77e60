// The Mismatch view's figures (data.mismatch, grpo/mismatch.py).

import { fmt } from "../format.js";
import { base, panelTitle } from "./base.js";

// What the rollout correction did to a token or a row (data.correction_names), one colour each.
const CORRECTION_COLORS = {
  kept: "#4c78a8",
  truncated: "#f58518",
  masked: "#e45756",
  not_scored: "#b0b7c3",
  sequence_masked: "#8e44ad",
  rejected: "#1d2330",
};

// Per token, two panels: trainer-old (x) against sampler (y) log-prob around the diagonal, and the same
// tokens' gap old − sampler (the log of their ratio, where a few hundredths of a nat show), one trace per
// action; the diagonal and the token bounds are the lines the server gives (their ends and levels too).
export function mismatchScatter(data) {
  const m = data.mismatch;
  const s = m.scatter;
  const names = data.correction_names;
  const traces = s.lines.map((line, i) => ({
    type: "scatter",
    mode: "lines",
    name: line.label,
    x: line.x,
    y: line.y,
    hoverinfo: "name",
    line: i === 0 ? { color: "#1d2330", width: 1 } : { color: "#6b7280", width: 1, dash: "dash" },
  }));
  const shapes = s.lines.map((line, i) => ({
    type: "line",
    xref: "x2 domain",
    yref: "y2",
    x0: 0,
    x1: 1,
    y0: line.log_ratio,
    y1: line.log_ratio,
    line: i === 0 ? { color: "#1d2330", width: 1 } : { color: "#6b7280", width: 1, dash: "dash" },
  }));
  const codes = [...new Set(s.code)].sort((a, b) => a - b);
  for (const code of codes) {
    const idx = s.code.map((c, i) => (c === code ? i : -1)).filter((i) => i >= 0);
    const name = names[code];
    const common = {
      type: "scatter",
      mode: "markers",
      name,
      legendgroup: name,
      text: idx.map((i) => `row ${s.row[i]}, position ${s.position[i]}`),
      customdata: idx.map((i) => [fmt(s.x[i]), fmt(s.y[i]), fmt(s.log_ratio[i])]),
      hovertemplate: `%{text}<br>old %{customdata[0]} · sampler %{customdata[1]}<br>old − sampler %{customdata[2]}<extra>${name}</extra>`,
      marker: { color: CORRECTION_COLORS[name] || "#888", size: 8, line: { color: "#fff", width: 1 } },
    };
    traces.push(
      { ...common, x: idx.map((i) => s.x[i]), y: idx.map((i) => s.y[i]) },
      {
        ...common,
        x: idx.map((i) => s.x[i]),
        y: idx.map((i) => s.log_ratio[i]),
        xaxis: "x2",
        yaxis: "y2",
        showlegend: false,
      },
    );
  }
  const shown = s.x.length < s.total ? ` · ${s.x.length} of ${s.total} tokens shown (acted on first)` : "";
  const xaxis = (domain) => ({ domain, range: s.range, title: { text: m.x_label }, zeroline: false });
  return {
    data: traces,
    layout: base(`Per token: trainer vs sampler · ${m.correction_label}${shown}`, {
      height: 420,
      shapes,
      legend: { orientation: "h", y: -0.22 },
      xaxis: xaxis([0, 0.46]),
      yaxis: { range: s.range, title: { text: m.y_label }, zeroline: false },
      xaxis2: xaxis([0.56, 1]),
      yaxis2: { anchor: "x2", title: { text: "old − sampler (log of the token's ratio)" } },
    }),
  };
}

// One panel per row statistic the server charts (data.mismatch.row_charts), stacked: a dot per row
// coloured by what the correction did to it, the bounds as dashed lines.
export function mismatchRows(data) {
  const m = data.mismatch;
  const names = data.correction_names;
  const n = m.row_charts.length;
  const gap = 0.12;
  const height = (1 - gap * (n - 1)) / n;
  const x = m.rows.code.map((_, i) => `row ${i}`);
  const layout = base("Per row, coloured by the strongest action on its tokens", {
    height: 120 + 220 * n,
    shapes: [],
    annotations: [],
    legend: { orientation: "h", y: -0.12 },
    margin: { l: 70, r: 20, t: 50, b: 60 },
  });
  const traces = [];
  const shown = new Set();
  m.row_charts.forEach((chart, k) => {
    const axis = k === 0 ? "" : String(k + 1);
    const top = 1 - k * (height + gap);
    layout[`yaxis${axis}`] = { domain: [top - height, top], anchor: "x", title: { text: chart.y_label } };
    layout.annotations.push(panelTitle(chart.title, 0, top));
    const values = m.rows[chart.field];
    for (const code of [...new Set(m.rows.code)].sort((a, b) => a - b)) {
      const idx = m.rows.code.map((c, i) => (c === code ? i : -1)).filter((i) => i >= 0);
      const name = names[code];
      traces.push({
        type: "scatter",
        mode: "markers",
        name,
        legendgroup: name,
        showlegend: !shown.has(name),
        x: idx.map((i) => x[i]),
        y: idx.map((i) => values[i]),
        yaxis: `y${axis}`,
        hovertemplate: `%{x}: %{y}<extra>${name}</extra>`,
        marker: { color: CORRECTION_COLORS[name] || "#888", size: 10, symbol: "diamond" },
      });
      shown.add(name);
    }
    for (const line of chart.lines) {
      layout.shapes.push({
        type: "line",
        xref: "paper",
        yref: `y${axis}`,
        x0: 0,
        x1: 1,
        y0: line.value,
        y1: line.value,
        line: { color: "#6b7280", width: 1, dash: "dash" },
      });
      layout.annotations.push({
        text: line.label,
        xref: "paper",
        yref: `y${axis}`,
        x: 1,
        y: line.value,
        xanchor: "right",
        yanchor: "bottom",
        showarrow: false,
        font: { size: 10, color: "#6b7280" },
      });
    }
  });
  layout.xaxis = { type: "category", categoryorder: "array", categoryarray: x, anchor: `y${n === 1 ? "" : n}` };
  return { data: traces, layout };
}
