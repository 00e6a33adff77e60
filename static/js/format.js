// Formatting and display labels: the only place numbers are turned into text.

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
  return String(s ?? "").replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
}

// Display labels for the API's field names (one map for the whole page).
export const LABELS = {
  ratio: "ratio π/π_old",
  clipped_ratio: "clipped ratio",
  surrogate: "surrogate (objective term)",
  kl: "KL estimate",
  weight: "aggregation weight",
  loss: "loss share",
  grad: "∂loss/∂logp",
  grad_policy: "∂loss/∂logp, policy part",
  grad_kl: "∂loss/∂logp, KL part",
  policy_loss: "policy part",
  kl_loss: "KL part (β·KL)",
  advantage: "advantage",
  reward: "reward",
  length: "tokens",
  sequence_ratio: "sequence ratio",
  clip_fraction: "clipped tokens",
  group: "group",
  objective: "objective J = −loss",
};

export const REGION_COLORS = {
  trust: "#4c78a8",
  clip_low: "#e45756",
  clip_high: "#f58518",
  dual_clip: "#8e44ad",
  masked: "#b0b7c3",
};
