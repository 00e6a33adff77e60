// Chart functions: the API's JSON in, Plotly {data, layout} out. No numbers are computed here.

import { REGION_COLORS, fmt, plotlyText, whyColor } from "./format.js";
import { CLIP_VIEW, HOVER, LABELS, POOLED, RUN, RUN_RANKS } from "./labels.js";

const FONT = { family: "system-ui, sans-serif", size: 12 };
const base = (title, extra = {}) => ({
  title: { text: title, font: { size: 13 }, x: 0, xanchor: "left" },
  font: FONT,
  margin: { l: 60, r: 20, t: 36, b: 40 },
  paper_bgcolor: "#fff",
  plot_bgcolor: "#fff",
  ...extra,
});

// Diverging scale centred on `mid`: blue below, white at mid, red above.
const DIVERGING = [
  [0, "#2166ac"],
  [0.25, "#67a9cf"],
  [0.5, "#f7f7f7"],
  [0.75, "#ef8a62"],
  [1, "#b2182b"],
];

const rowLabel = (data, i) => `row ${i} (A ${fmt(data.rows.advantage[i], 3)})`;
const rowLabels = (data) => data.token_rows.map((i) => rowLabel(data, i));

// Ragged rows -> a rectangle (null where a row is shorter or the position does not count).
function grid(data, values) {
  const width = Math.max(...values.map((r) => r.length), 1);
  return values.map((row, k) =>
    Array.from({ length: width }, (_, j) => (j < row.length && data.tokens.mask[k][j] ? row[j] : null)),
  );
}

const HOVER_WIDTH = 72; // characters per line of the why in a hover (Plotly does not wrap)

// Long server sentences broken into lines for a hover.
function wrap(text) {
  const lines = [""];
  for (const word of text.split(" ")) {
    if (lines[lines.length - 1].length + word.length > HOVER_WIDTH) lines.push("");
    lines[lines.length - 1] += (lines[lines.length - 1] ? " " : "") + word;
  }
  return lines.join("<br>");
}

/** A subplot's title above its panel, in paper coordinates (x at its left edge unless anchored otherwise). */
function panelTitle(text, x, y, xanchor = "left") {
  return { text, xref: "paper", yref: "paper", x, y, xanchor, yanchor: "bottom", showarrow: false, font: { size: 12 } };
}

// Per cell: the numbers as format.js prints them (Plotly's own "%{x:.4g}" would print 1 + 4e-4 as
// "1"), the token, and its why: the server's code (tokens.why holds indices into data.why.names) and
// sentence (data.why.texts, with the config's numbers). Under GSPO the ratio shown is the row's; the
// token's own is added beside it. The numbers are the token-field table's hover fields (options.token_fields),
// in its order: they come first in each cell's customdata, the token, ratio, why and entropy after them.
export function hoverData(data, tokenFields) {
  const t = data.tokens;
  const columns = hoverFields(tokenFields).map((f) => t[f.name]);
  const texts = Object.fromEntries(
    Object.entries(data.why.texts).map(([code, text]) => [code, wrap(plotlyText(text))]),
  );
  return t.ratio.map((row, k) =>
    row.map((_, j) => {
      const code = data.why.names[t.why[k][j]];
      const ratio = HOVER.ratio(fmt(t.ratio[k][j]), t.token_ratio ? fmt(t.token_ratio[k][j]) : null);
      return [
        ...columns.map((c) => fmt(c[k][j])),
        plotlyText(t.text ? t.text[k][j] : ""),
        ratio,
        HOVER.why(code, texts[code]),
        // the token's line: its string when the batch gave strings (else the first line's position says it all)
        t.text ? HOVER.token(plotlyText(t.text[k][j])) : "",
        t.entropies ? HOVER.entropy(fmt(t.entropies[k][j])) : "", // the entropy the batch gave, when it gave them
      ];
    }),
  );
}

const hoverFields = (tokenFields) => tokenFields.filter((f) => f.hover !== null);

// A full grid's hover: the cell, the token, ratio and why, then the hover fields two to a line.
function hoverTemplate(tokenFields) {
  const fields = hoverFields(tokenFields);
  const at = (k) => `%{customdata[${fields.length + k}]}`; // after the numbers: text, ratio, why, token, entropy
  const numbers = fields.map((f, k) => `${f.hover} %{customdata[${k}]}`);
  const lines = [];
  for (let k = 0; k < numbers.length; k += 2) lines.push(numbers.slice(k, k + 2).join(" · "));
  const body = lines.join("<br>");
  return `%{y}, position %{x}<br>${at(3)}${at(1)}${at(4)}<br>${at(2)}<br>${body}<extra></extra>`;
}

// The heatmaps, one per token field with a centre (options.token_fields): a diverging scale white at the
// centre (signed quantities at 0, the KL too: k1 goes negative; the ratio at 1), fixed ends where the table
// gives them.
export function heatmapSpecs(tokenFields) {
  return tokenFields
    .filter((f) => f.heatmap !== null)
    .map((f) => ({ field: f.name, title: f.heatmap, mid: f.centre, range: f.colour_range }));
}

const CLIP_MARK_LIMIT = 3000; // past this many clipped cells, one SVG mark each would be slow: hover says it

// Cells the token's why marks (data.why.marked): those on a flat part of the objective (no policy gradient,
// one trace), and apart, each token mask's (the entropy mask) and the objective's own pick (KL-Cov's penalty,
// Clip-Cov's cut), named by the server's labels; [] when there are none or too many for one SVG mark each.
function whyMarks(data) {
  const t = data.tokens;
  const labels = rowLabels(data);
  const own = (name) => data.why.masks.includes(name) || name === data.why.selected;
  const groups = new Map();
  const byCode = new Map();
  for (const name of data.why.marked) {
    const key = own(name) ? name : "flat";
    if (!groups.has(key)) {
      const label = own(name) ? data.why.labels[name] || name : LABELS.clippedCell;
      groups.set(key, { label, marker: whyMarker(data, name), x: [], y: [] });
    }
    byCode.set(data.why.names.indexOf(name), groups.get(key));
  }
  // a token mask's cells may not count (a tool's output): marked all the same; every other mark is on a counted cell
  const masks = new Set(data.why.masks.map((name) => data.why.names.indexOf(name)));
  t.why.forEach((row, k) =>
    row.forEach((code, j) => {
      const cells = byCode.get(code);
      if (cells && (t.mask[k][j] || masks.has(code))) {
        cells.x.push(j);
        cells.y.push(labels[k]);
      }
    }),
  );
  const traces = [...groups.values()].filter((g) => g.x.length);
  if (traces.reduce((n, g) => n + g.x.length, 0) > CLIP_MARK_LIMIT) return [];
  return traces.map(({ label, marker, x, y }) => ({
    type: "scatter",
    mode: "markers",
    x,
    y,
    name: label,
    hoverinfo: "skip",
    showlegend: true,
    marker: { ...marker, size: 9, color: "#1d2330", line: { width: 1.5 } },
  }));
}

// A token mask's cells (the entropy mask) and the objective's own pick are marked apart from the flat ones.
function whyMarker(data, name) {
  if (data.why.masks.includes(name)) return { symbol: "line-ew-open" };
  if (name === data.why.selected) return { symbol: "circle-open" };
  return { symbol: "x-thin-open" };
}

// No WebGL traces (scattergl): the installed plotly.js builds its WebGL programs with new Function(),
// which the page's CSP (script-src 'self', no 'unsafe-eval') refuses. Large grids are pooled by the
// server instead (data.heatmap); a long row's per-token parts are one SVG path per trace; the clip
// view's points are capped by the server (curves.truncated).

// The background the cells that do not count (padding, masked out) leave bare: a dark grey, far from the
// diverging scale's near-white at its centre (a ratio of 1), named under the x axis.
const NOT_COUNTED = "#6b7280";

// The heatmap layout shared by the full and the pooled grid.
function heatmapLayout(title, rows, width, showlegend) {
  const height = Math.min(240, 28 + Math.max(rows, 2) * (rows <= 16 ? 24 : 4)) + 74;
  return base(title, {
    height,
    margin: { l: 110, r: 30, t: 30, b: 40 },
    plot_bgcolor: NOT_COUNTED, // the cells that do not count are gaps: this colour, unlike any on the scale
    // A hover goes right of its cell, or left where it would leave the figure: at 10 px its lines (72 characters
    // at most) keep it under half the plot's width, so flipped left it stays clear of the row labels.
    hoverlabel: { align: "left", font: { size: 10 } },
    showlegend,
    legend: { orientation: "h", x: 1, xanchor: "right", y: 1.02, yanchor: "bottom" },
    // the cells' own span: a marks trace over them (clipped, dropped) would widen an autoranged axis
    xaxis: {
      title: { text: LABELS.notCountedAxis },
      showgrid: false,
      zeroline: false,
      dtick: width <= 40 ? 1 : undefined,
      range: [-0.5, width - 0.5],
    },
    yaxis: { autorange: "reversed", showgrid: false, automargin: true },
  });
}

// The server's grid (data.heatmap: every row, as the page asks), pooled where it has more cells than
// pixels: each cell is its block's token farthest from the field's centre; the title and the hover
// say so and by what factor. (A batch past the per-token limit carries one row's tokens, but its
// heatmaps still show every row.)
function pooledHeatmap(data, spec) {
  const pooled = data.heatmap;
  const fr = pooled.factor_rows;
  const ft = pooled.factor_tokens;
  const z = pooled.fields[spec.field];
  const shown = pooled.rows;
  const y = z.map((_, r) =>
    fr === 1 ? rowLabel(data, shown[r]) : POOLED.rows(shown[r * fr], shown[Math.min((r + 1) * fr, shown.length) - 1]),
  );
  const x = z[0].map((_, c) => c * ft + (ft - 1) / 2); // each block at its centre, in positions
  const width = pooled.width;
  const ranges = z[0].map((_, c) => POOLED.positions(c * ft, Math.min((c + 1) * ft, width) - 1));
  // [positions, counted tokens, the cell's value]: the value printed by format.js, as every other hover
  // prints its numbers (Plotly's own %{z:.4g} printed a GSPO ratio of 1 + 4e-4 as "1")
  const customdata = pooled.counted.map((row, r) => row.map((n, c) => [ranges[c], n, fmt(z[r][c])]));
  const trace = {
    type: "heatmap",
    z,
    x,
    y,
    customdata,
    hovertemplate: POOLED.hover(spec.field),
    hoverongaps: false,
    name: spec.field,
    colorbar: { thickness: 10 },
    zsmooth: "fast",
    colorscale: DIVERGING,
    zmid: spec.mid,
  };
  if (spec.range) Object.assign(trace, { zmin: spec.range[0], zmax: spec.range[1] });
  const marks = anomalyMarks(data);
  return {
    data: [trace, ...(marks ? [marks] : [])],
    layout: heatmapLayout(
      fr * ft === 1 ? spec.title : POOLED.title(spec.title, fr, ft, spec.mid),
      z.length,
      width,
      Boolean(marks),
    ),
  };
}

// The tokens an anomaly of the run's timeline names (data.marked: {tokens: [[row, col], ...], sentence}, set by
// runs.js on the step it opened), outlined on every heatmap; on a pooled grid, the blocks that hold them.
function anomalyMarks(data) {
  const tokens = data.marked?.tokens;
  if (!tokens?.length) return null;
  const x = [];
  const y = [];
  for (const [row, col] of tokens) {
    if (data.heatmap) {
      const { rows, factor_rows: fr, factor_tokens: ft } = data.heatmap;
      const k = rows.indexOf(row);
      if (k < 0) continue;
      const r = Math.floor(k / fr);
      x.push(Math.floor(col / ft) * ft + (ft - 1) / 2);
      y.push(
        fr === 1 ? rowLabel(data, rows[r]) : POOLED.rows(rows[r * fr], rows[Math.min((r + 1) * fr, rows.length) - 1]),
      );
      continue;
    }
    const k = data.token_rows.indexOf(row);
    if (k < 0) continue;
    x.push(col);
    y.push(rowLabel(data, row));
  }
  return {
    type: "scatter",
    mode: "markers",
    x,
    y,
    name: TIMELINE_MARKED,
    hovertext: x.map(() => wrap(data.marked.sentence)),
    hoverinfo: "text",
    showlegend: true,
    marker: { symbol: "square-open", size: 16, color: "#f59e0b", line: { width: 3 } },
  };
}
export const TIMELINE_MARKED = "the anomaly's tokens";

// One heatmap figure per field (each drawn on its own, when it is on screen). `hover()` gives the
// per-cell hover data of a full grid (not needed when the grid is pooled).
export function heatmap(data, spec, hover, tokenFields) {
  if (data.heatmap) return pooledHeatmap(data, spec);
  const customdata = hover();
  const z = grid(data, data.tokens[spec.field]);
  const rows = data.token_rows.length;
  const width = z[0].length;
  const trace = {
    type: "heatmap",
    z,
    y: rowLabels(data),
    customdata,
    hovertemplate: hoverTemplate(tokenFields),
    hoverongaps: false,
    name: spec.field,
    colorbar: { thickness: 10 },
    xgap: width <= 64 ? 1 : 0,
    ygap: rows <= 64 ? 1 : 0,
  };
  if (rows * width > 4096) trace.zsmooth = "fast"; // one pixel per cell, scaled: fast for big grids
  Object.assign(trace, { colorscale: DIVERGING, zmid: spec.mid });
  if (spec.range) Object.assign(trace, { zmin: spec.range[0], zmax: spec.range[1] });
  const marks = [...whyMarks(data), correctionMarks(data), anomalyMarks(data)].filter(Boolean);
  const layout = heatmapLayout(spec.title, rows, width, marks.length > 0);
  return { data: [trace, ...marks], layout };
}

export function contributionRows(data) {
  const x = data.rows.loss.map((_, i) => `row ${i}`);
  return {
    data: [
      { type: "bar", name: LABELS.policy_loss, x, y: data.rows.policy_loss, marker: { color: "#4c78a8" } },
      { type: "bar", name: LABELS.kl_loss, x, y: data.rows.kl_loss, marker: { color: "#e45756" } },
      {
        type: "scatter",
        mode: "markers",
        name: "row's loss share",
        x,
        y: data.rows.loss,
        marker: { symbol: "diamond", size: 10, color: "#1d2330" },
      },
    ],
    layout: base(`Per row: policy part + KL part = the row's loss share (they sum to the loss, ${fmt(data.loss)})`, {
      barmode: "relative",
      height: 300,
      legend: { orientation: "h", y: -0.2 },
      yaxis: { title: { text: "loss share" }, zeroline: true },
    }),
  };
}

const CATEGORY_LIMIT = 120; // past this many tokens, a numeric axis (category labels are slow)

// The counted tokens of the rows at positions `ks` of data.token_rows, with display labels.
function tokensOf(data, ks) {
  const t = data.tokens;
  const keys = [];
  const labels = [];
  for (const k of ks) {
    t.mask[k].forEach((m, j) => {
      if (!m) return;
      keys.push([k, j]);
      const text = plotlyText(t.text ? t.text[k][j] : "");
      labels.push(ks.length > 1 ? `r${data.token_rows[k]}·${j} ${text}` : `${j}: ${text}`);
    });
  }
  const numeric = ks.length === 1 && keys.length > CATEGORY_LIMIT;
  const x = numeric ? keys.map(([, j]) => j) : labels;
  return { keys, labels, x, numeric, pick: (field) => keys.map(([k, j]) => t[field][k][j]) };
}

// Bars per token; for a long row (numeric axis) lines, since a thousand SVG bars draw slowly.
function tokenTrace(name, x, y, labels, color, numeric) {
  const common = { name, x, y, text: labels, hoverinfo: "text+y", marker: { color } };
  return numeric
    ? { ...common, type: "scatter", mode: "lines", line: { color, width: 1 }, fill: "tozeroy" }
    : { ...common, type: "bar", textposition: "none" };
}

function tokenAxis(numeric) {
  return numeric ? { title: { text: "position" } } : { type: "category", automargin: true };
}

const scope = (data, ks) => (ks.length > 1 ? "All rows" : `Row ${data.token_rows[ks[0]]}`);

export function contributionTokens(data, ks) {
  const { labels, x, numeric, pick } = tokensOf(data, ks);
  return {
    data: [
      tokenTrace(LABELS.policy_loss, x, pick("policy_loss"), labels, "#4c78a8", numeric),
      tokenTrace(LABELS.kl_loss, x, pick("kl_loss"), labels, "#e45756", numeric),
    ],
    layout: base(`${scope(data, ks)}, per token: policy part and KL part of the loss`, {
      barmode: "relative",
      height: 320,
      legend: { orientation: "h", y: -0.35 },
      xaxis: tokenAxis(numeric),
      yaxis: { title: { text: "loss share" } },
    }),
  };
}

export function gradientTokens(data, ks) {
  const { labels, x, numeric, pick } = tokensOf(data, ks);
  return {
    data: [
      tokenTrace("policy part", x, pick("grad_policy"), labels, "#4c78a8", numeric),
      tokenTrace("KL part", x, pick("grad_kl"), labels, "#e45756", numeric),
    ],
    layout: base(
      `${scope(data, ks)}: ∂loss/∂logp per token; the axis is flipped, so up = gradient descent raises the log-prob`,
      {
        barmode: "relative",
        height: 340,
        legend: { orientation: "h", y: -0.35 },
        xaxis: tokenAxis(numeric),
        // the short title fits the plot's height (the chart's title says the rest); automargin keeps it and the
        // ticks inside the figure
        yaxis: {
          autorange: "reversed",
          title: { text: LABELS.gradAxisShort },
          automargin: true,
          ticks: "outside",
          exponentformat: "e",
          zeroline: true,
          zerolinewidth: 2,
        },
      },
    ),
  };
}

// --- the Mismatch view (data.mismatch, grpo/mismatch.py) ------------------------------------------------------
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

// Cells whose policy term the rollout correction dropped or that its rejection took out of the batch,
// as marks over the heatmap (none without tokens.correction, or past CLIP_MARK_LIMIT cells).
const DROPPED = new Set(["masked", "sequence_masked", "rejected"]);
function correctionMarks(data) {
  const t = data.tokens;
  if (!t.correction) return null;
  const labels = rowLabels(data);
  const x = [];
  const y = [];
  t.correction.forEach((row, k) =>
    row.forEach((c, j) => {
      if (DROPPED.has(data.correction_names[c])) {
        x.push(j);
        y.push(labels[k]);
      }
    }),
  );
  if (!x.length || x.length > CLIP_MARK_LIMIT) return null;
  return {
    type: "scatter",
    mode: "markers",
    x,
    y,
    name: LABELS.correctedCell,
    hoverinfo: "skip",
    showlegend: true,
    marker: { symbol: "square-open", size: 11, color: "#b91c1c", line: { width: 1.5 } },
  };
}

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

export function compareRows(results, names) {
  const x = results[0].rows.loss.map((_, i) => `row ${i}`);
  return {
    data: results.map((r, n) => ({ type: "bar", name: names[n], x, y: r.rows.loss })),
    layout: base("Each row's share of the loss, per preset", {
      barmode: "group",
      height: 300,
      legend: { orientation: "h", y: -0.25 },
    }),
  };
}

// Per token of each row: its aggregation weight (the same for every counted token of a row), one
// panel per preset with its own scale: Dr. GRPO's 1/(B·L) would be invisible beside 1/|o_i|.
export function compareWeights(results, names) {
  const counted = results[0].rows.length;
  const x = counted.map((n, i) => LABELS.rowCounted(i, n));
  const firstWeight = (r) =>
    r.tokens.weight.map((row, i) => {
      const j = r.tokens.region[i].findIndex((g) => g !== "masked");
      return j >= 0 ? row[j] : 0;
    });
  const n = results.length;
  const gap = 0.06;
  const width = (1 - gap * (n - 1)) / n;
  const layout = base(LABELS.compareWeightsTitle, {
    height: 320,
    showlegend: false,
    annotations: [],
    margin: { l: 60, r: 20, t: 56, b: 70 },
  });
  const data = results.map((r, k) => {
    const axis = k === 0 ? "" : String(k + 1);
    const x0 = k * (width + gap);
    layout[`xaxis${axis}`] = {
      domain: [x0, x0 + width],
      anchor: `y${axis}`,
      type: "category",
      title: { text: LABELS.rowCountedAxis },
    };
    layout[`yaxis${axis}`] = {
      anchor: `x${axis}`,
      exponentformat: "e",
      title: k === 0 ? { text: LABELS.weight } : undefined,
    };
    layout.annotations.push(panelTitle(names[k], x0 + width / 2, 1.02, "center"));
    return { type: "bar", name: names[k], x, y: firstWeight(r), xaxis: `x${axis}`, yaxis: `y${axis}` };
  });
  return { data, layout };
}

// ∂loss/∂logp per token, one panel per preset stacked (each its own scale: a preset whose weights
// are 1000× smaller would otherwise draw no visible bar).
export function compareGrads(results, names, text) {
  const labels = [];
  const keys = [];
  results[0].tokens.region.forEach((row, i) =>
    row.forEach((g, j) => {
      if (g !== "masked") {
        labels.push(`r${i}:${j} ${plotlyText(text ? text[i][j] : "")}`);
        keys.push([i, j]);
      }
    }),
  );
  const n = results.length;
  const gap = 0.08;
  const height = (1 - gap * (n - 1)) / n;
  // each panel tall enough for its axis title, the top one below the chart's title (its ticks were cut off)
  const layout = base(LABELS.compareGradsTitle, {
    height: 150 + 170 * n,
    margin: { l: 60, r: 20, t: 60, b: 40 },
    showlegend: false,
    annotations: [],
  });
  const data = results.map((r, k) => {
    const axis = k === 0 ? "" : String(k + 1);
    const top = 1 - k * (height + gap);
    // One sign convention with the Gradients view: the axis flipped, up = descent raises the log-prob.
    layout[`yaxis${axis}`] = {
      domain: [top - height, top],
      anchor: "x",
      exponentformat: "e",
      autorange: "reversed",
      automargin: true,
      zeroline: true,
      title: { text: LABELS.gradAxisShort, font: { size: 10 } },
    };
    layout.annotations.push(panelTitle(names[k], 0, top));
    return {
      type: "bar",
      name: names[k],
      x: labels,
      y: keys.map(([i, j]) => r.tokens.grad[i][j]),
      xaxis: "x",
      yaxis: `y${axis}`,
    };
  });
  layout.xaxis = { type: "category", automargin: true, anchor: `y${n === 1 ? "" : n}` };
  return { data, layout };
}

const SERIES_STYLE = {
  float32: { color: "#e45756" },
  float64: { color: "#4c78a8" },
  "float32, left to right": { color: "#f2a7a6" },
};

// float32/float64 (and other computed series) as bars, or lines when x is long; reference values
// (a closed form such as 8·beta·KL) as a horizontal tick or a dashed line.
export function experimentChart(exp) {
  const many = exp.x.length > 12;
  const data = Object.entries(exp.series).map(([name, y]) => {
    const style = SERIES_STYLE[name];
    const x = exp.x.map(String);
    if (!style) {
      return many
        ? { type: "scatter", mode: "lines", name, x, y, line: { color: "#333", dash: "dash", width: 1.5 } }
        : {
            type: "scatter",
            mode: "markers",
            name,
            x,
            y,
            marker: { symbol: "line-ew-open", size: 46, color: "#333", line: { width: 2 } },
          };
    }
    return many
      ? {
          type: "scatter",
          mode: "lines+markers",
          name,
          x,
          y,
          marker: { color: style.color, size: 4 },
          line: { color: style.color, width: 1 },
        }
      : { type: "bar", name, x, y, marker: { color: style.color } };
  });
  return {
    data,
    layout: base("", {
      height: 300,
      barmode: "group",
      legend: { orientation: "h", y: -0.3 },
      margin: { l: 70, r: 20, t: 12, b: 40 },
      xaxis: { title: { text: exp.x_label }, type: many ? "linear" : "category" },
      yaxis: { title: { text: exp.y_label }, exponentformat: "e" },
    }),
  };
}

// --- a run's steps (the Runs view) ------------------------------------------------------------------
// A chart over a run's optimiser steps.
// Steps are whole numbers: a short run gets a tick per step, never 1.5 (a long one Plotly's own spacing).
const STEP_TICKS_UP_TO = 20;
const stepsLayout = (title, steps, extra = {}) =>
  base(title, {
    height: 280,
    // automargin: the tick labels push the axis title out instead of printing over it
    xaxis: {
      title: { text: "optimiser step", standoff: 8 },
      automargin: true,
      ...(steps.length <= STEP_TICKS_UP_TO ? { tickmode: "array", tickvals: steps } : {}),
    },
    yaxis: { automargin: true },
    legend: { orientation: "h", y: -0.35 },
    ...extra,
  });

export function lossChart(data) {
  const x = data.steps.map((s) => s.step);
  const ranks = Math.max(1, ...data.steps.map((s) => s.ranks ?? 1)); // the legends say how ranks are joined
  const logged = data.steps.filter((s) => s.logged_loss); // the trainer's logged loss, where it was compared
  // each step marked by its verdict (app/runview.py); a matching step carries no marker
  const marked = (verdict, name, marker) => {
    const steps = data.steps.filter((s) => s.verdict === verdict);
    const y = steps.map((s) => s.lens_loss ?? s.trainer_loss ?? 0); // an unreadable step may have no loss
    return { x: steps.map((s) => s.step), y, name, mode: "markers", marker };
  };
  return {
    data: [
      {
        x,
        y: data.steps.map((s) => s.trainer_loss),
        name: RUN_RANKS.trainerLegend(ranks),
        mode: "lines+markers",
        line: { color: "#6b7280" },
      },
      {
        x,
        y: data.steps.map((s) => s.lens_loss),
        name: RUN_RANKS.lensLegend(ranks),
        mode: "lines+markers",
        line: { color: "#2563eb", dash: "dot" },
      },
      marked("differ", `mismatch (${RUN.step.differ})`, { color: "#dc2626", size: 14, symbol: "x" }),
      marked("unchecked", RUN.step.unchecked, {
        color: "#d97706",
        size: 13,
        symbol: "circle-open",
        line: { width: 2 },
      }),
      marked("error", RUN.step.error, { color: "#111827", size: 13, symbol: "square-x-open" }),
      ...(logged.length
        ? [
            {
              x: logged.map((s) => s.step),
              y: logged.map((s) => s.logged_loss.trainer),
              name: RUN_RANKS.loggedLegend,
              mode: "markers",
              marker: { symbol: "diamond-open", size: 12, color: "#059669", line: { width: 2 } },
            },
          ]
        : []),
    ],
    layout: stepsLayout("Loss per step: trainer vs recomputed", x, {
      yaxis: { title: { text: "loss", standoff: 10 }, automargin: true },
    }),
  };
}

// One of the run's charts as the server built it (app/runview.py): one unit on the y-axis; a logged series
// is null at the steps the trainer did not log, drawn as a gap (never joined across it).
export function runSeriesChart(data, chart) {
  const x = data.steps.map((s) => s.step);
  const colours = ["#dc2626", "#f97316", "#eab308", "#db2777", "#7c3aed", "#16a34a", "#0891b2", "#64748b"];
  const traces = chart.series.map((series, i) => ({
    x,
    y: series.values,
    name: series.name,
    connectgaps: false,
    mode: series.source === "logged" ? "markers" : "lines+markers",
    marker: series.source === "logged" ? { symbol: "circle-open", size: 11 } : { size: 5 },
    line: { color: colours[Math.floor(i / 2) % colours.length] },
    meta: series.source,
  }));
  return {
    data: traces,
    layout: stepsLayout(`${chart.title} (filled: GRPO Lens; rings: logged by the trainer; gaps: not logged)`, x, {
      height: 300,
      yaxis: { title: { text: chart.unit, standoff: 10 }, automargin: true },
    }),
  };
}

export function replayChart(data, preset) {
  const x = data.steps.map((s) => s.step);
  const series = [
    ["loss", "#2563eb"],
    ["policy_loss", "#16a34a"],
    ["kl_loss", "#7c3aed"],
    ["clip_ratio/region_mean", "#dc2626"],
  ];
  const traces = [];
  for (const [key, color] of series) {
    traces.push({
      x,
      y: data.steps.map((s) => s.original[key]),
      name: `${key} (as captured)`,
      mode: "lines+markers",
      line: { color },
    });
    traces.push({
      x,
      y: data.steps.map((s) => s.replay[key]),
      name: `${key} (${preset})`,
      mode: "lines+markers",
      line: { color, dash: "dash" },
    });
  }
  return { data: traces, layout: stepsLayout(`These same batches under ${preset}`, x, { height: 320 }) };
}

// --- a run's timeline (the Runs view): one small chart per series, a second run beside it ---------------
// The x-axes a timeline can be drawn against: each reads a number the answer carries (never computed here).
export const TIMELINE_AXES = {
  step: { title: "optimiser step", of: (s) => s.step },
  cumulative: { title: "counted tokens so far (cumulative)", of: (s) => s.tokens?.cumulative ?? null },
};
// The loss is the first chart: the step's recomputed loss beside the trainer's logged one.
export const TIMELINE_LOSS = {
  name: "loss",
  label: "loss",
  trainer_name: null,
  description:
    "The step's loss as the trainer logs it (ranks and micro-batches joined), recomputed; the trainer's logged loss beside it.",
};
// The legend of the step's own trace: over several ranks, every rank's files joined as the trainer joins them.
const joined = (ranks) => (ranks > 1 ? `recomputed (${ranks} ranks joined)` : "recomputed");
const TIMELINE_COLOURS = [
  { own: "#2563eb", logged: "#059669", ranks: ["#60a5fa", "#1e3a8a", "#93c5fd", "#3b82f6"] },
  { own: "#ea580c", logged: "#a16207", ranks: ["#fdba74", "#9a3412", "#fed7aa", "#f97316"] },
];

// A step entry's value of `name`: recomputed, the trainer's logged one, or one rank's (null where absent).
const timelineValue = {
  recomputed: (name) => (s) => (name === "loss" ? s.loss.recomputed : (s.series[name] ?? null)),
  logged: (name) => (s) => (name === "loss" ? s.loss.logged : (s.logged?.[name] ?? null)),
  rank: (name, rank) => (s) => {
    const own = s.ranks?.[String(rank)];
    if (!own) return null;
    return name === "loss" ? (own.loss ?? null) : (own.series?.[name] ?? null);
  },
};

// The traces of one run on one series' chart: recomputed, the trainer's logged values (rings, where it logs
// them), one dotted trace per rank (over several ranks), and the open run's anomalies (amber markers whose hover
// is the anomaly's sentence). `customdata` is the step (a click opens it) or, on a marker, the anomaly's index.
function timelineTraces(run, index, series, axis) {
  const { answer, name } = run;
  const colours = TIMELINE_COLOURS[index % TIMELINE_COLOURS.length];
  const x = answer.steps.map(TIMELINE_AXES[axis].of);
  const steps = answer.steps.map((s) => s.step);
  const who = (what) => (run.both ? `${name}: ${what}` : what);
  const meta = (kind) => ({ run: name, kind });
  const line = (what, y, style) => ({
    x,
    y,
    name: who(what),
    customdata: steps,
    connectgaps: false,
    legendgroup: name,
    meta: meta(what),
    ...style,
  });
  const traces = [
    line(joined(answer.ranks.length), answer.steps.map(timelineValue.recomputed(series.name)), {
      mode: "lines+markers",
      marker: { size: 5, color: colours.own },
      line: { color: colours.own, width: 2 },
    }),
  ];
  const logged = answer.steps.map(timelineValue.logged(series.name));
  if (logged.some((v) => v !== null))
    traces.push(
      line("logged by the trainer", logged, {
        mode: "markers",
        marker: { symbol: "diamond-open", size: 9, color: colours.logged, line: { width: 2 } },
      }),
    );
  if (answer.ranks.length > 1)
    answer.ranks.forEach((rank, i) =>
      traces.push(
        line(`rank ${rank}`, answer.steps.map(timelineValue.rank(series.name, rank)), {
          mode: "lines",
          line: { color: colours.ranks[i % colours.ranks.length], width: 1, dash: "dot" },
        }),
      ),
    );
  if (index === 0) traces.push(anomalyTrace(run, series, axis, x));
  return traces;
}

function anomalyTrace(run, series, axis, x) {
  const at = new Map(run.answer.steps.map((s, i) => [s.step, i]));
  const marked = run.answer.anomalies.map((a, i) => [a, i]).filter(([a]) => a.series === series.name && at.has(a.step));
  const entry = (a) => run.answer.steps[at.get(a.step)];
  return {
    x: marked.map(([a]) => x[at.get(a.step)]),
    y: marked.map(([a]) => timelineValue.recomputed(series.name)(entry(a))),
    customdata: marked.map(([, i]) => i),
    hovertext: marked.map(([a]) => wrap(a.sentence)),
    hoverinfo: "text",
    name: run.both ? `${run.name}: anomalies` : "anomalies",
    mode: "markers",
    meta: { run: run.name, kind: "anomaly" },
    marker: { symbol: "star-diamond", size: 15, color: "#f59e0b", line: { width: 1.5, color: "#78350f" } },
  };
}

// One series' chart over the runs ({answer, name}: the open run first, then the one beside it), against `axis`
// (a key of TIMELINE_AXES). The label is the title, with the trainer's own name for the series.
export function timelineChart(runs, series, axis) {
  const both = runs.length > 1;
  const data = runs.flatMap((run, i) => timelineTraces({ ...run, both }, i, series, axis));
  const title = series.trainer_name ? `${series.label} (the trainer's ${series.trainer_name})` : series.label;
  const steps = runs[0].answer.steps.map((s) => s.step);
  const ticks = axis === "step" && !both && steps.length <= STEP_TICKS_UP_TO;
  return {
    data,
    layout: base(title, {
      height: 250,
      margin: { l: 56, r: 12, t: 32, b: 36 },
      hovermode: "closest",
      showlegend: true,
      legend: { orientation: "h", y: -0.32, font: { size: 10 } },
      xaxis: {
        title: { text: TIMELINE_AXES[axis].title, standoff: 4 },
        automargin: true,
        ...(ticks ? { tickmode: "array", tickvals: steps } : {}),
      },
      yaxis: { automargin: true, exponentformat: "e" },
    }),
  };
}

// Whether a series has a value to draw in any of the runs (a run without a sampler has no mismatch).
export const timelineDrawn = (runs, series) =>
  runs.some(({ answer }) =>
    answer.steps.some(
      (s) => timelineValue.recomputed(series.name)(s) !== null || timelineValue.logged(series.name)(s) !== null,
    ),
  );

// --- the Lab: live runs (lab.js draws each chart with every run's points so far, then extends it) --------
const LAB_CHART = {
  height: 220,
  margin: { l: 50, r: 50, t: 30, b: 25 },
  xaxis: { rangemode: "tozero" },
  showlegend: false,
  hovermode: "closest", // the run list above the charts is the key
};

// One metric's chart: a trace per run ({id, colour, points: [step data]}), named by `labels`.
export function labMetric(metric, runs, labels) {
  return { data: runs.map((run, i) => labTrace(run, labels[i], metric)), layout: base(metric, LAB_CHART) };
}

// Reward and loss of every run on one figure: the loss is not progress.
export function labOverlay(runs, labels) {
  return {
    data: runs.flatMap((run, i) => [
      labTrace(run, `${labels[i]}: reward`, "reward"),
      labTrace(run, `${labels[i]}: loss`, "loss", "loss"),
    ]),
    layout: base("reward (solid, left axis) and loss (dotted, right axis): the loss is not progress", {
      ...LAB_CHART,
      height: 300,
      showlegend: true,
      legend: { orientation: "h", y: -0.12 },
      margin: { l: 50, r: 60, t: 30, b: 40 },
      yaxis: { title: { text: "reward" } },
      yaxis2: { title: { text: "loss" }, overlaying: "y", side: "right" },
    }),
  };
}

// One run's trace of `field` over its steps: `kind` is "metric", or "loss" (the overlay's, dotted on its
// right axis). The arrays are the trace's own: lab.js extends them as new steps arrive.
export function labTrace(run, name, field, kind = "metric") {
  const line = { color: run.colour, width: 2, ...(kind === "loss" ? { dash: "dot" } : {}) };
  return {
    x: run.points.map((d) => d.step),
    y: run.points.map((d) => d[field]),
    name,
    mode: "lines+markers",
    marker: { size: 4 },
    line,
    meta: run.id,
    ...(kind === "loss" ? { yaxis: "y2" } : {}),
  };
}
