// The Mismatch view: the sampler's log-probs against the trainer's, per token (a scatter around the
// diagonal) and per row (the statistics the sequence-level bounds see), coloured by what the rollout
// correction did, with the server's sentences and the thresholds in force. Every number is the
// server's (data.mismatch, grpo/mismatch.py); without it the view says there is nothing to compare.

import * as charts from "./charts/mismatch.js";
import { $, clear, el, plot, purge } from "./dom.js";
import { fmt, tagged } from "./format.js";
import { MISMATCH } from "./labels.js";
import * as redraw from "./redraw.js";
import { sentence } from "./views.js";

const SCATTER = "mismatch-scatter";
const ROWS = "mismatch-rows";

// A chart of the view: drawn from the answer's block, emptied when the answer has none (or, for the
// scatter, no token pairs).
function drawer(id, has, build) {
  return (data) => (data.mismatch && has(data.mismatch) ? plot(id, build(data)) : purge(id));
}

export function setup() {
  redraw.register(
    SCATTER,
    "loss",
    drawer(SCATTER, (m) => m.scatter.total > 0, charts.mismatchScatter),
  );
  redraw.register(
    ROWS,
    "loss",
    drawer(ROWS, (m) => m.row_charts.length > 0, charts.mismatchRows),
  );
}

// The view's text for a new answer (before its charts are published: a chart hidden here is not drawn).
export function render(data) {
  const m = data.mismatch;
  const empty = $("#mismatch-empty");
  const section = $("#view-mismatch");
  section.dataset.active = String(Boolean(m));
  empty.hidden = Boolean(m && m.sampled);
  empty.textContent = !m ? MISMATCH.empty : m.sampled ? "" : MISMATCH.noPairs;
  $(`#${SCATTER}`).hidden = !m || m.scatter.total === 0;
  $(`#${ROWS}`).hidden = !m || m.row_charts.length === 0;
  clear($("#mismatch-sentences")).append(...(m ? m.sentence_parts.map((parts) => sentence(parts)) : []));
  const thresholds = clear($("#mismatch-thresholds"));
  if (!m) return;
  if (!m.thresholds.length) {
    thresholds.textContent = MISMATCH.noThresholds;
    return;
  }
  thresholds.append(
    MISMATCH.thresholdsHead,
    ...m.thresholds.flatMap((t, i) => [
      i ? "; " : "",
      `${t.name} `,
      el("span", { class: "num-inline", text: fmt(t.value), ...tagged(t.quantity, t.value) }),
      ` (${t.bounds})`,
    ]),
    ".",
  );
}
