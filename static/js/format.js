// Formatting: the only place numbers are turned into text. Labels live in labels.js.

export function fmt(x, digits = 4) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (!Number.isFinite(x)) return String(x);
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(digits - 1);
  return Number(x.toPrecision(digits)).toString();
}

export function pct(x) {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)}%`;
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
