// The Heatmaps view's figures: one heatmap per token field, with the why, correction and anomaly marks.

import { fmt, plotlyText } from "../format.js";
import { HOVER, LABELS, POOLED } from "../labels.js";
import { base, DIVERGING, grid, rowLabel, rowLabels, wrap } from "./base.js";

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
