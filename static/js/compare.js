// Compare: the same batch under several presets, side by side (POST /api/v1/compare).

import { postJSON } from "./api.js";
import * as charts from "./charts.js";
import { $, clear, el, plot } from "./dom.js";
import { fmt } from "./format.js";
import { COMPARE_ROWS } from "./labels.js";
import { currentRequest, fromUpload, state, writeURL } from "./state.js";

const ALL_TOKENS_LIMIT = 400; // tokens: the per-token compare chart shows every token up to this

export function buildCompareChoices() {
  const box = $("#compare-presets");
  for (const p of state.ui.options.presets) {
    const input = el("input", { type: "checkbox", value: p.name, checked: state.compare.includes(p.name) });
    input.addEventListener("change", () => {
      state.compare = state.ui.options.presets.map((q) => q.name).filter((name) => box.querySelector(`input[value="${name}"]`).checked);
      writeURL();
      runCompare();
    });
    box.append(el("label", { class: "inline", title: p.doc }, input, p.name));
  }
  const edits = $("#compare-edits");
  edits.checked = state.compare_edits;
  edits.addEventListener("change", () => { state.compare_edits = edits.checked; writeURL(); runCompare(); });
}

let timer = null;
export function scheduleCompare() {
  clearTimeout(timer);
  timer = setTimeout(runCompare, 60);
}

export async function runCompare() {
  if (!state.compare.length || fromUpload()) return;
  const { preset, ...edits } = state.config;
  const configs = state.compare.map((name) => ({ ...(state.compare_edits ? edits : {}), preset: name }));
  try {
    const data = await postJSON("compare", "/api/v1/compare", { ...currentRequest(), configs });
    if (!data) return;
    renderCompare(data);
  } catch (err) {
    clear($("#compare-table")).append(el("tr", {}, el("td", { class: "error", text: err.message })));
  }
}

function renderCompare(data) {
  const names = data.results.map((r) => r.config.preset);
  const table = clear($("#compare-table"));
  table.append(el("thead", {}, el("tr", {}, el("th", { text: "" }), ...names.map((n) => el("th", { scope: "col", text: n })))));
  table.append(el("tbody", {}, ...COMPARE_ROWS.map(([label, get]) => el("tr", {}, el("td", { text: label }), ...data.results.map((r) => el("td", { class: "num", text: fmt(get(r), 5) }))))));
  plot("compare-rows", charts.compareRows(data.results, names));
  plot("compare-weights", charts.compareWeights(data.results, names, data.lengths));
  const tokens = data.lengths.reduce((a, b) => a + b, 0);
  if (tokens <= ALL_TOKENS_LIMIT && data.results[0].tokens_complete) plot("compare-grads", charts.compareGrads(data.results, names, data.text));
  document.body.dataset.compared = String((Number(document.body.dataset.compared) || 0) + 1);
}
