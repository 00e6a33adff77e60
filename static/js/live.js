// A run being captured, watched live: while the open run's status is "running", its event stream
// (/api/v1/runs/{run}/events: app/watch.py) pushes each new or changed step of its timeline and each new
// anomaly; they are put into the timeline answer the Runs view drew (a step replaced by its number, or added
// in order) and the view draws it again. Nothing is computed here: every number is the event's.
// #run-timeline's data-live says where the stream stands ("running", then the status that ended it), its
// data-live-steps how many steps the drawn answer holds.

import { events } from "./api.js";
import { $ } from "./dom.js";
import { state } from "./state.js";

const own = state.ui.live; // this module's state (state.js): the stream followed and its draws

// Follow the run `run` (its run.json `status`) whose timeline answer `timeline` was drawn by `draw`;
// another run followed, or one not running, closes the stream of the one before.
export function follow(run, status, timeline, draw) {
  if (own.source) own.source.close();
  own.source = null;
  own.pending = null;
  const box = $("#run-timeline");
  box.dataset.live = status === "running" ? "running" : "";
  if (status !== "running" || !timeline) return;
  let answer = timeline;
  box.dataset.liveSteps = String(answer.steps.length);
  const redraw = (next) => {
    answer = next;
    box.dataset.liveSteps = String(answer.steps.length);
    drawLatest(answer, draw);
  };
  // the last step drawn may still be filling in (micro-batches or ranks to come): asked for again
  const last = answer.steps.at(-1)?.step;
  const after = last === undefined ? "" : `?after=${Math.max(0, last - 1)}`;
  const stream = events(`/api/v1/runs/${encodeURIComponent(run)}/events${after}`, {
    step: (entry) => redraw(withStep(answer, entry)),
    anomaly: (anomaly) => redraw(withAnomaly(answer, anomaly)),
    status: (data) => {
      if (data.verdict) redraw({ ...answer, verdict: data.verdict });
    },
    done: (data) => {
      stream.close();
      if (own.source === stream) own.source = null;
      box.dataset.live = data.status ?? data.reason;
    },
  });
  own.source = stream;
}

// One draw at a time, of the newest answer, and never back to back: after a draw the page waits as long as it
// took, halved (at least GAP_MS), before the next, so the events that come meanwhile (delivered between the page's
// tasks) are drawn together, however slow a draw is on a loaded machine.
const GAP_MS = 100;

function drawLatest(answer, draw) {
  own.pending = { answer, draw };
  if (!own.drawing && !own.timer) own.timer = setTimeout(drawPending, Math.max(GAP_MS, own.cost / 2));
}

function drawPending() {
  own.timer = null;
  if (!own.pending) return;
  const { answer, draw } = own.pending;
  own.pending = null;
  const box = $("#run-timeline");
  box.dataset.liveDraws = String(Number(box.dataset.liveDraws || 0) + 1);
  const started = performance.now();
  own.drawing = Promise.resolve(draw(answer))
    .catch(() => {})
    .finally(() => {
      own.cost = performance.now() - started;
      own.drawing = null;
      if (own.pending) own.timer = setTimeout(drawPending, Math.max(GAP_MS, own.cost / 2));
    });
}

// The answer with `entry` in place of the step of its number, or added where its number goes.
function withStep(answer, entry) {
  const steps = answer.steps.filter((s) => s.step !== entry.step);
  let at = steps.length;
  while (at > 0 && steps[at - 1].step > entry.step) at -= 1;
  steps.splice(at, 0, entry);
  return { ...answer, steps };
}

const sameAnomaly = (a, b) => a.step === b.step && a.kind === b.kind && a.micro === b.micro && a.rank === b.rank;

function withAnomaly(answer, anomaly) {
  const anomalies = answer.anomalies.filter((a) => !sameAnomaly(a, anomaly));
  anomalies.push(anomaly);
  anomalies.sort((a, b) => a.step - b.step);
  return { ...answer, anomalies };
}
