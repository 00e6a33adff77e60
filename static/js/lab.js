// The Lab view: start GRPO runs on the server's synthetic tasks and watch every logged metric grow
// live. Steps arrive as Server-Sent Events (no polling) and are kept with their run; each animation
// frame draws them on the charts on screen only: a chart not drawn yet (or drawn for other runs) in one
// Plotly.react holding every run's points, else one Plotly.extendTraces with the new ones. A chart off
// screen is drawn when it is scrolled to. (Every chart extended on every frame held a loaded machine's
// main thread for seconds per frame; building all 18 charts empty, then adding and renaming each run's
// traces, was 90 full Plotly redraws in one task before a reopened comparison showed a point:
// bench/page.py --only reload.) Runs overlay in distinct colours, the legend names what differs
// between them, and a click on a point opens that step's batch in the breakdown views. The runs on the
// page are in the link (#lab=ids&comparison=name): reopening it draws them again, from the live stream
// while this server process knows the run, else from the run's saved steps (a lab run is a run:
// /api/v1/runs/{id}). The form shows what the last started run ran. The numbers all come from the
// server; this module only draws them.

import { events, getJSON, remove, sendJSON } from "./api.js";
import { labMetric, labOverlay } from "./charts/lab.js";
import { $, clear, el, loadPlotly, plot, purge } from "./dom.js";
import { fmt } from "./format.js";
import { load, state } from "./state.js";

const COLOURS = ["#2f5bd3", "#e45756", "#1a7f4b", "#f58518", "#8e44ad", "#17becf", "#8c564b", "#bcbd22"];
const TERMINAL = new Set(["done", "error", "cancelled", "interrupted"]);
const OVERLAY = "lab-overlay"; // the "loss is not progress" chart: reward and loss on one figure

const lab = state.ui.lab; // this module's state (state.js): the runs on the page and their charts

const MARGIN = "150px 0px"; // a chart this close to the viewport counts as on screen
const observer = new IntersectionObserver(
  (entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) lab.visible.delete(entry.target);
      else {
        lab.visible.add(entry.target);
        schedule();
      }
    }
  },
  { rootMargin: MARGIN },
);

const NEAR = 150; // px: MARGIN's distance
function nearScreen(node) {
  const r = node.getBoundingClientRect();
  return r.height > 0 && r.bottom > -NEAR && r.top < innerHeight + NEAR;
}

const chartId = (metric) => `lab-chart-${metric.replace(/[^a-z0-9]+/gi, "-")}`;

export async function setup() {
  lab.info = await getJSON("/api/v1/lab/tasks");
  const task = $("#lab-task");
  for (const t of lab.info.tasks) task.append(el("option", { value: t.name, text: `${t.name}: ${t.doc}` }));
  task.value = lab.info.default;
  const preset = $("#lab-preset");
  for (const p of state.ui.options.presets) preset.append(el("option", { value: p.name, text: p.name, title: p.doc }));
  preset.value = "article";
  const canned = $("#lab-comparisons");
  for (const c of lab.info.comparisons) {
    canned.append(
      el("button", {
        type: "button",
        text: c.title,
        dataset: { comparison: c.name },
        onclick: () => startComparison(c),
      }),
    );
  }
  $("#lab-start").addEventListener("click", startFromForm);
  $("#lab-clear").addEventListener("click", clearRuns);
  $("#lab-empty-metrics").textContent = String(lab.info.metrics.length);
  await restore();
  document.body.dataset.lab = "ready";
}

// --- the link: the runs on the page ---------------------------------------------------------------
function linked() {
  const params = new URLSearchParams(location.hash.slice(1));
  return { ids: (params.get("lab") || "").split(",").filter(Boolean), comparison: params.get("comparison") };
}

function writeLink() {
  const params = new URLSearchParams();
  if (lab.runs.length) params.set("lab", lab.runs.map((r) => r.id).join(","));
  if (lab.runs.length && lab.comparison) params.set("comparison", lab.comparison);
  const hash = params.toString();
  history.replaceState(null, "", `${location.pathname}${location.search}${hash ? `#${hash}` : ""}`);
}

// The linked runs, drawn again: each one's steps from its live stream (this process knows it), else
// from its saved run; all of them on the page before the first frame draws a chart, so each chart on
// screen is drawn once, with every run. One that is gone is said under the form.
async function restore() {
  const { ids, comparison } = linked();
  if (!ids.length) return;
  const canned = lab.info.comparisons.find((c) => c.name === comparison);
  if (canned) showWatch(canned);
  lab.comparison = canned ? canned.name : null;
  lab.focus = canned && !canned.overlay ? canned.metrics : [];
  const live = new Map((await getJSON("/api/v1/lab/queue")).runs.map((r) => [r.id, r])); // this process's runs
  const loaded = await Promise.all(ids.map((id) => reopen(id, live.get(id)).catch((err) => ({ id, err }))));
  for (const item of loaded) {
    if (item.err) {
      $("#lab-error").textContent = `lab run ${item.id}: ${item.err.message}`;
      continue;
    }
    attach(item);
  }
  if (lab.runs.length) showForm(lab.runs.at(-1).body);
  document.body.dataset.labRestored = String(lab.runs.length);
}

// A linked run: from this process's live list (its stream replays every step), else its saved steps.
async function reopen(id, known) {
  if (known) return { id, body: known.lab, status: known.status, live: true };
  const saved = await getJSON(`/api/v1/runs/${encodeURIComponent(id)}`); // the run's page: each step's log
  const metrics = [...lab.info.metrics, "reward", "loss"];
  const steps = saved.steps.map((s) => ({
    step: s.step,
    ...Object.fromEntries(metrics.map((m) => [m, s.logged[m] ?? null])),
  }));
  return { id, body: saved.info.lab, status: saved.info.status || "done", live: false, steps };
}

function showWatch(comparison) {
  $("#lab-watch-title").textContent = comparison.title;
  $("#lab-watch-text").textContent = comparison.watch;
  $("#lab-watch").hidden = false;
}

// The form says what ran: the run's task, preset, seed, steps, iterations, and the loss settings it set
// apart from its preset (the preset's own values come from /api/v1/options).
function showForm(body) {
  const preset = body.config.preset || "article";
  const base = state.ui.options.presets.find((p) => p.name === preset)?.config || {};
  const overrides = Object.fromEntries(
    Object.entries(body.config).filter(
      ([k, v]) => !["preset", "device", "dtype"].includes(k) && JSON.stringify(v) !== JSON.stringify(base[k]),
    ),
  );
  $("#lab-task").value = body.task;
  $("#lab-preset").value = preset;
  $("#lab-seed").value = String(body.seed);
  $("#lab-steps").value = String(body.steps);
  $("#lab-iterations").value = String(body.num_iterations);
  $("#lab-overrides").value = Object.keys(overrides).length ? JSON.stringify(overrides) : "";
}

// The charts exist only while there are runs. Before the first one, an empty box per metric would be a
// wall of blank boxes between the form and the next section; one line (#lab-empty) says what will be
// drawn instead. The first run adds a box per chart (the current comparison's metrics first); each is
// drawn once it is on screen.
function buildCharts() {
  if (lab.charts.size) return;
  $("#lab-empty").hidden = true;
  const box = clear($("#lab-charts"));
  for (const metric of [null, ...orderedMetrics()]) {
    const id = metric === null ? OVERLAY : chartId(metric);
    const node = el("div", { class: "lab-chart", id });
    lab.charts.set(id, { node, metric, drawn: null });
    box.append(node);
    observer.observe(node);
  }
}

// No run on the page: no charts, the line that says what a run draws.
function removeCharts() {
  for (const { node } of lab.charts.values()) {
    observer.unobserve(node);
    purge(node);
  }
  lab.charts.clear();
  lab.visible.clear();
  clear($("#lab-charts"));
  $("#lab-empty").hidden = false;
}

// The runs on the page changed: every chart is drawn again (for these runs) when next on screen.
function runsChanged() {
  for (const chart of lab.charts.values()) chart.drawn = null;
  schedule();
}

function orderedMetrics() {
  const all = lab.info.metrics;
  return [...lab.focus.filter((m) => all.includes(m)), ...all.filter((m) => !lab.focus.includes(m))];
}

// --- starting runs ------------------------------------------------------------------------------
function formBody() {
  let overrides = {};
  const text = $("#lab-overrides").value.trim();
  if (text) overrides = JSON.parse(text);
  return {
    task: $("#lab-task").value,
    config: { ...overrides, preset: $("#lab-preset").value },
    seed: Number($("#lab-seed").value),
    steps: Number($("#lab-steps").value),
    num_iterations: Number($("#lab-iterations").value),
  };
}

async function startFromForm() {
  $("#lab-error").textContent = "";
  let body;
  try {
    body = formBody();
  } catch (err) {
    $("#lab-error").textContent = `overrides: ${err.message}`;
    return;
  }
  lab.comparison = null;
  await startRun(body);
}

async function startComparison(comparison) {
  showWatch(comparison);
  clearRuns();
  lab.comparison = comparison.name;
  lab.focus = comparison.overlay ? [] : comparison.metrics;
  for (const body of comparison.runs) await startRun(body);
}

async function startRun(body) {
  let data;
  try {
    data = await sendJSON("/api/v1/lab/runs", body);
  } catch (err) {
    $("#lab-error").textContent = err.message;
    return;
  }
  showForm(data.lab);
  attach({ id: data.id, body: data.lab, status: data.status, live: true });
}

// A run on the page, and its steps: from the live stream, or (`steps`) all at once.
function attach({ id, body, status, live, steps }) {
  const run = { id, body, colour: COLOURS[lab.runs.length % COLOURS.length], status, steps: 0, points: [] };
  lab.runs.push(run);
  writeLink();
  buildCharts();
  runsChanged();
  if (!live) {
    run.points = steps;
    run.steps = steps.at(-1)?.step ?? 0;
    renderRunList();
    return;
  }
  renderRunList();
  const kinds = ["queued", "started", "step", "done", "error", "cancelled", "interrupted"];
  run.source = events(
    `/api/v1/lab/runs/${encodeURIComponent(run.id)}/events`,
    Object.fromEntries(kinds.map((kind) => [kind, (data) => onEvent(run, kind, data)])),
  );
}

// The run's end comes as an event; a cancel the server refuses (the run is gone) is said under the form.
function cancel(run) {
  remove(`/api/v1/lab/runs/${encodeURIComponent(run.id)}`).catch((err) => {
    $("#lab-error").textContent = err.message;
  });
}

function clearRuns() {
  for (const run of lab.runs) {
    run.source?.close();
    if (!TERMINAL.has(run.status)) cancel(run);
  }
  lab.runs = [];
  writeLink();
  renderRunList();
  removeCharts();
}

// --- events -> charts ---------------------------------------------------------------------------
function onEvent(run, kind, data) {
  if (kind === "step") {
    run.points.push(data);
    run.steps = data.step;
    schedule();
    return;
  }
  if (kind === "queued") run.status = `queued (position ${data.position})`;
  else if (kind === "started") run.status = "running";
  else {
    cancelAnimationFrame(lab.frame);
    flush(); // every step on the charts before the run says it has finished
    run.status = kind;
    run.reason = data.reason || data.message || "";
    run.source.close();
  }
  renderRunList();
}

function schedule() {
  if (!lab.frame) lab.frame = requestAnimationFrame(flush);
}

// One frame: each chart on screen shows every point that arrived. The observer's set, and a chart's
// own place: a page reopened mid-way (a reload keeps the scroll position) lays out its sections after
// the charts are observed, and may report none intersecting.
function flush() {
  lab.frame = 0;
  if (!lab.charts.size) return;
  if (!window.Plotly) {
    loadPlotly().then(schedule, (err) => {
      $("#lab-error").textContent = err.message;
    });
    return;
  }
  const labels = runLabels(lab.runs);
  for (const chart of lab.charts.values())
    if (lab.visible.has(chart.node) || nearScreen(chart.node)) draw(chart, labels);
  renderRunList();
  const count = String(lab.runs.reduce((n, r) => n + r.points.length, 0));
  if (document.body.dataset.labPoints !== count) document.body.dataset.labPoints = count;
}

// The run's trace indexes on a chart and the step field each draws: one per run on a metric's chart,
// reward and loss per run on the overlay (the order of charts/lab.js's figures).
const traces = (chart, i) =>
  chart.metric === null
    ? [
        [2 * i, "reward"],
        [2 * i + 1, "loss"],
      ]
    : [[i, chart.metric]];

// A chart not drawn for these runs: one Plotly.react with all their points. Else the points that
// arrived since, in one extendTraces.
function draw(chart, labels) {
  if (!chart.drawn) {
    const spec = chart.metric === null ? labOverlay(lab.runs, labels) : labMetric(chart.metric, lab.runs, labels);
    chart.drawn = new Map(lab.runs.map((run) => [run, run.points.length]));
    Promise.resolve(plot(chart.node, spec)).then(() => {
      // once per node (Plotly.react keeps it); not on a node the runs were cleared from meanwhile
      if (chart.clicks || !chart.node.on) return;
      chart.node.on("plotly_click", openPoint);
      chart.clicks = true;
    });
    return;
  }
  const update = { x: [], y: [] };
  const indexes = [];
  lab.runs.forEach((run, i) => {
    const fresh = run.points.slice(chart.drawn.get(run));
    if (!fresh.length) return;
    chart.drawn.set(run, run.points.length);
    for (const [index, field] of traces(chart, i)) {
      indexes.push(index);
      update.x.push(fresh.map((d) => d.step));
      update.y.push(fresh.map((d) => d[field]));
    }
  });
  if (indexes.length) Plotly.extendTraces(chart.node, update, indexes);
}

// The legend names what differs between the runs on the page (their request fields).
function flatten(body) {
  const out = {};
  for (const [k, v] of Object.entries(body)) {
    if (k === "config") for (const [ck, cv] of Object.entries(v)) out[ck] = cv;
    else out[k] = v;
  }
  return out;
}

export function runLabels(runs) {
  const flat = runs.map((r) => flatten(r.body));
  const keys = [...new Set(flat.flatMap(Object.keys))].filter(
    (k) => k !== "preset" && new Set(flat.map((f) => JSON.stringify(f[k]))).size > 1,
  );
  return runs.map((r, i) => (keys.length ? keys.map((k) => `${k}=${flat[i][k]}`).join(" · ") : r.id));
}

function renderRunList() {
  const list = clear($("#lab-runs"));
  const labels = runLabels(lab.runs);
  lab.runs.forEach((run, i) => {
    const cancel = TERMINAL.has(run.status)
      ? null
      : el("button", {
          type: "button",
          text: "Cancel",
          onclick: () => cancel(run),
        });
    list.append(
      el(
        "li",
        { dataset: { run: run.id, status: run.status } },
        el("span", { class: "swatch", style: `background:${run.colour}` }),
        el("strong", { text: labels[i] }),
        " ",
        el("span", {
          class: "muted",
          text: `${run.id} · ${run.status}${run.reason ? ` (${run.reason})` : ""} · step ${run.steps}/${run.body.steps}`,
        }),
        " ",
        cancel,
      ),
    );
  });
}

// --- a point -> that step's batch in the breakdown views -------------------------------------
async function openPoint(event) {
  const point = event.points?.[0];
  if (!point) return;
  const runId = point.data.meta;
  const step = point.x;
  try {
    const data = await getJSON(`/api/v1/lab/runs/${encodeURIComponent(runId)}/steps/${step}`);
    const note = `Step ${step} of lab run ${runId} (${data.meta.task}): reward ${fmt(data.meta.metrics.reward)}, loss ${fmt(data.meta.loss)}.`;
    $("#lab-opened").textContent = `Opened in the views above. ${note}`;
    // the step's batch (an /api/v1/loss request and its config) becomes the input of every view
    load(
      { scenario: "", input: data.request, config: data.config },
      { kind: "step", name: `Lab run ${runId}, step ${step}`, note },
    );
    $("#summary").scrollIntoView();
  } catch (err) {
    $("#lab-error").textContent = err.message;
  }
}
