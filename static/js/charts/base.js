// The one base layout and the helpers every view's figures share. No numbers are computed here.

import { fmt } from "../format.js";

const FONT = { family: "system-ui, sans-serif", size: 12 };
export const base = (title, extra = {}) => ({
  title: { text: title, font: { size: 13 }, x: 0, xanchor: "left" },
  font: FONT,
  margin: { l: 60, r: 20, t: 36, b: 40 },
  paper_bgcolor: "#fff",
  plot_bgcolor: "#fff",
  ...extra,
});

// Diverging scale centred on `mid`: blue below, white at mid, red above.
export const DIVERGING = [
  [0, "#2166ac"],
  [0.25, "#67a9cf"],
  [0.5, "#f7f7f7"],
  [0.75, "#ef8a62"],
  [1, "#b2182b"],
];

export const rowLabel = (data, i) => `row ${i} (A ${fmt(data.rows.advantage[i], 3)})`;
export const rowLabels = (data) => data.token_rows.map((i) => rowLabel(data, i));

// Ragged rows -> a rectangle (null where a row is shorter or the position does not count).
export function grid(data, values) {
  const width = Math.max(...values.map((r) => r.length), 1);
  return values.map((row, k) =>
    Array.from({ length: width }, (_, j) => (j < row.length && data.tokens.mask[k][j] ? row[j] : null)),
  );
}

const HOVER_WIDTH = 72; // characters per line of the why in a hover (Plotly does not wrap)

// Long server sentences broken into lines for a hover.
export function wrap(text) {
  const lines = [""];
  for (const word of text.split(" ")) {
    if (lines[lines.length - 1].length + word.length > HOVER_WIDTH) lines.push("");
    lines[lines.length - 1] += (lines[lines.length - 1] ? " " : "") + word;
  }
  return lines.join("<br>");
}

/** A subplot's title above its panel, in paper coordinates (x at its left edge unless anchored otherwise). */
export function panelTitle(text, x, y, xanchor = "left") {
  return { text, xref: "paper", yref: "paper", x, y, xanchor, yanchor: "bottom", showarrow: false, font: { size: 12 } };
}
