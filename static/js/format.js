// Formatting: the only place numbers are turned into text. Labels live in labels.js.

const MAX_DIGITS = 12; // a number never prints with more significant digits than this

// `digits` significant digits, or more where fewer would print a whole number the value is not:
// 1 + 4e-4 prints "1.0004", never "1" (grpo.explain.number, the server's sentences, does the same).
export function fmt(x, digits = 4) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (!Number.isFinite(x)) return String(x);
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(digits - 1);
  let d = digits;
  let text = Number(x.toPrecision(d)).toString();
  while (d < MAX_DIGITS && Number(text) !== x && Number.isInteger(Number(text))) {
    d += 1;
    text = Number(x.toPrecision(d)).toString();
  }
  return text;
}

export function pct(x) {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`;
}

// The attributes of an element that prints a number: the quantity it shows (the API's path to it,
// e.g. "metrics/kl", "rows/loss/2") and the exact value, so a test can hold every view to one value.
export function tagged(quantity, value) {
  return { "data-quantity": quantity, "data-value": value === null || value === undefined ? "" : String(value) };
}

// Plotly reads a few HTML-like tags in labels; escape token text so it is shown as written.
export function plotlyText(s) {
  return String(s ?? "")
    .replace(/&/g, "&amp;")
    .replace(/</g, "&lt;")
    .replace(/>/g, "&gt;");
}

export const REGION_COLORS = {
  trust: "#4c78a8",
  clip_low: "#e45756",
  clip_high: "#f58518",
  dual_clip: "#8e44ad",
  masked: "#b0b7c3",
};

// Colours for the other why codes (the objectives' own: delta, unbounded, cov_clipped, kl_penalized, ...): one
// per name, the same on every draw, without a list of names here.
const WHY_PALETTE = ["#54a24b", "#b279a2", "#9d755d", "#17becf", "#bcbd22", "#ff9da6", "#72b7b2", "#eeca3b"];

export function whyColor(name) {
  if (REGION_COLORS[name]) return REGION_COLORS[name];
  let h = 0;
  for (const c of String(name)) h = (h * 31 + c.codePointAt(0)) >>> 0;
  return WHY_PALETTE[h % WHY_PALETTE.length];
}
