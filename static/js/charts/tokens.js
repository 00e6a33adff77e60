// The Surrogate vs KL and Gradients views' figures: per row and per token bars.

import { fmt, plotlyText } from "../format.js";
import { LABELS } from "../labels.js";
import { base } from "./base.js";

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
