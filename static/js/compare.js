// Compare: the same batch under several presets, side by side (POST /api/v1/compare).

import { postJSON } from "./api.js";
import * as charts from "./charts/compare.js";
import { $, clear, el, plot, purge } from "./dom.js";
import { fmt, tagged } from "./format.js";
import { COMPARE, COMPARE_ROWS } from "./labels.js";
import * as redraw from "./redraw.js";
import { currentRequest, fromUpload, state, writeURL } from "./state.js";

const ALL_TOKENS_LIMIT = 400; // tokens: the per-token compare chart shows every token up to this

function buildCompareChoices() {
  const box = $("#compare-presets");
  for (const p of state.ui.options.presets) {
    const input = el("input", { type: "checkbox", value: p.name, checked: state.compare.includes(p.name) });
    input.addEventListener("change", () => {
      state.compare = state.ui.options.presets
        .map((q) => q.name)
        .filter((name) => box.querySelector(`input[value="${name}"]`).checked);
      writeURL();
      redraw.invalidate("compare");
    });
    box.append(el("label", { class: "inline", title: p.doc }, input, p.name));
  }
  // The normaliser constant as a control: Dr. GRPO's L (max_completion_length) for every preset.
  const field = state.ui.options.fields.find((f) => f.name === "max_completion_length");
  if (field) {
    const own = [...new Set(state.ui.options.presets.map((p) => p.config.max_completion_length).filter(Boolean))];
    const input = el("input", {
      id: "compare-L",
      type: "number",
      min: 1,
      step: 1,
      value: state.compare_constants.max_completion_length ?? "",
      placeholder: `${COMPARE.normaliserOwn}${own.length ? `: ${own.join(", ")}` : ""}`,
      title: field.doc,
    });
    input.addEventListener("change", () => {
      const v = input.value === "" ? null : Number(input.value);
      if (v === null) delete state.compare_constants.max_completion_length;
      else state.compare_constants.max_completion_length = v;
      writeURL();
      redraw.invalidate("compare");
    });
    $("#compare-constants").append(el("label", { for: "compare-L", text: COMPARE.normaliser }), input);
  }
  const edits = $("#compare-edits");
  edits.checked = state.compare_edits;
  edits.addEventListener("change", () => {
    state.compare_edits = edits.checked;
    writeURL();
    redraw.invalidate("compare");
  });
}

// The compare charts are views of the compare response, fetched only when one of them is on
// screen (or in idle time) after the batch or the settings changed.
export function setup() {
  redraw.setRefresh("compare", runCompare);
  redraw.register("compare-rows", "compare", (data) =>
    plot("compare-rows", charts.compareRows(data.results, names(data))),
  );
  redraw.register("compare-weights", "compare", (data) =>
    plot("compare-weights", charts.compareWeights(data.results, names(data))),
  );
  redraw.register("compare-grads", "compare", (data) => {
    const tokens = data.lengths.reduce((a, b) => a + b, 0);
    if (tokens <= ALL_TOKENS_LIMIT && data.results[0].tokens_complete)
      return plot("compare-grads", charts.compareGrads(data.results, names(data), data.text));
    purge("compare-grads"); // too many tokens for one bar each: no chart rather than an old one
    return null;
  });
  buildCompareChoices();
}

const names = (data) => data.results.map((r) => r.config.preset);

async function runCompare() {
  if (!state.compare.length || fromUpload()) {
    redraw.settle("compare");
    return;
  }
  const { preset, ...edits } = state.config;
  const constants = state.compare_constants;
  const configs = state.compare.map((name) => ({ ...(state.compare_edits ? edits : {}), ...constants, preset: name }));
  try {
    const data = await postJSON("compare", "/api/v1/compare", { ...currentRequest(), configs });
    if (!data) return;
    renderCompare(data);
  } catch (err) {
    redraw.settle("compare");
    clear($("#compare-table")).append(el("tr", {}, el("td", { class: "error", text: err.message })));
  }
}

async function renderCompare(data) {
  const table = clear($("#compare-table"));
  table.append(
    el(
      "thead",
      {},
      el("tr", {}, el("th", { text: "" }), ...names(data).map((n) => el("th", { scope: "col", text: n }))),
    ),
  );
  table.append(
    el(
      "tbody",
      {},
      ...COMPARE_ROWS.filter(([, get]) => data.results.some((r) => get(r) != null)).map(([label, get, quantity]) =>
        el(
          "tr",
          {},
          el("td", { text: label }),
          ...data.results.map((r) =>
            el("td", {
              class: "num",
              text: get(r) == null ? "—" : fmt(get(r), 5),
              ...(quantity && get(r) != null ? tagged(quantity, get(r)) : {}),
              "data-preset": r.config.preset,
            }),
          ),
        ),
      ),
    ),
  );
  // One computed sentence per preset (the library's, from its explanation) on length weighting,
  // found by its key (explanation_keys), never by its wording.
  const lengths = data.results
    .map((r, k) => [names(data)[k], r.explanation[r.explanation_keys.indexOf("length")]])
    .filter(([, t]) => t);
  clear($("#compare-lengths")).append(
    ...(lengths.length ? [el("li", { class: "head", text: COMPARE.lengthsHead })] : []),
    ...lengths.map(([n, t]) => el("li", {}, el("strong", { text: `${n}: ` }), t)),
  );
  // What a column leaves out of the batch's off-policy part (the library's notes: a preset without the
  // rollout correction, or corrections that differ), shown above the table.
  let notes = $("#compare-notes");
  if (!notes) {
    notes = el("ul", { id: "compare-notes", class: "explanation" });
    table.closest(".table-wrap").before(notes);
  }
  clear(notes).append(...(data.notes || []).map((note) => el("li", { "data-preset": note.preset, text: note.text })));
  await redraw.publish("compare", data);
  document.body.dataset.compared = String((Number(document.body.dataset.compared) || 0) + 1);
}
