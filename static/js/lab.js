// The Lab view: start GRPO runs on the server's synthetic tasks and watch every logged metric grow
// live. Steps arrive as Server-Sent Events (no polling); each animation frame appends the new points
// with Plotly.extendTraces to the charts on screen, and a chart off screen keeps its points until it
// is scrolled to (every chart extended on every frame held a loaded machine's main thread for seconds
// per frame: the page froze while a comparison trained). Runs overlay in distinct colours, the legend
// names what differs between them, and a click on a point opens that step's batch in the breakdown
// views. The runs on the page are in the link (#lab=ids&comparison=name): reopening it draws them again,
// from the live stream while this server process knows the run, else from the run's saved steps (a lab
// run is a run: /api/v1/runs/{id}). The form shows what the last started run ran. The numbers all come
// from the server; this module only draws them.

import { events, getJSON, remove, sendJSON } from "./api.js";
import { labMetric, labOverlay, labTrace } from "./charts.js";
import { $, clear, el, loadPlotly, plot, purge } from "./dom.js";
import { fmt } from "./format.js";

const COLOURS = ["#2f5bd3", "#e45756", "#1a7f4b", "#f58518", "#8e44ad", "#17becf", "#8c564b", "#bcbd22"];
const TERMINAL = new Set(["done", "error", "cancelled", "interrupted"]);
const OVERLAY = "lab-overlay"; // the "loss is not progress" chart: reward and loss on one figure

const lab = {
  info: null, // /api/v1/lab/tasks
  runs: [], // {id, body, colour, status, steps, source, traces: {metric: index}}
  pending: [], // [run, event data] not drawn yet
  queued: new Map(), // chart id -> Map(trace index -> {x, y}): points of a chart off screen, not drawn yet
  visible: new Set(), // the chart nodes on screen (or within MARGIN of it)
  frame: 0,
  focus: [], // the current comparison's metrics (drawn first)
  charts: null, // a promise of the charts, built with the first run (null while there is none)
  comparison: null, // the canned comparison whose runs are on the page (null: runs from the form)
  hooks: null,
};

const MARGIN = "150px 0px"; // a chart this close to the viewport counts as on screen
const observer = new IntersectionObserver(
  (entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) lab.visible.delete(entry.target);
      else {
        lab.visible.add(entry.target);
        drawQueued(entry.target.id);
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

export async function setup(hooks) {
  lab.hooks = hooks;
  lab.info = await getJSON("/api/v1/lab/tasks");
  const task = $("#lab-task");
  for (const t of lab.info.tasks) task.append(el("option", { value: t.name, text: `${t.name}: ${t.doc}` }));
  task.value = lab.info.default;
  const preset = $("#lab-preset");
  for (const p of hooks.presets()) preset.append(el("option", { value: p.name, text: p.name, title: p.doc }));
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
// from its saved run. One that is gone is said under the form.
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
    await attach(item);
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
  const base = lab.hooks.presets().find((p) => p.name === preset)?.config || {};
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
// drawn instead. `charts()` builds them once for the runs on the page (the current comparison's
// metrics first) and resolves when they can take traces.
function charts() {
  if (!lab.charts) lab.charts = buildCharts();
  return lab.charts;
}

async function buildCharts() {
  $("#lab-empty").hidden = true;
  const box = clear($("#lab-charts"));
  const nodes = new Map([[OVERLAY, el("div", { class: "lab-chart", id: OVERLAY })]]);
  for (const metric of orderedMetrics())
    nodes.set(chartId(metric), el("div", { class: "lab-chart", id: chartId(metric) }));
  box.append(...nodes.values());
  await loadPlotly();
  await plot(nodes.get(OVERLAY), labOverlay());
  for (const metric of orderedMetrics()) await plot(nodes.get(chartId(metric)), labMetric(metric));
  for (const node of nodes.values()) {
    node.on("plotly_click", openPoint);
    if (node.isConnected) observer.observe(node); // not one the runs were cleared from meanwhile
  }
}

// No run on the page: no charts, the line that says what a run draws.
function removeCharts() {
  lab.charts = null;
  lab.queued.clear();
  lab.visible.clear();
  for (const node of $("#lab-charts").children) {
    observer.unobserve(node);
    purge(node);
  }
  clear($("#lab-charts"));
  $("#lab-empty").hidden = false;
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
  await attach({ id: data.id, body: data.lab, status: data.status, live: true });
}

// A run on the page: its traces, then its steps: from the live stream, or (`steps`) all at once.
async function attach({ id, body, status, live, steps }) {
  const run = { id, body, colour: COLOURS[lab.runs.length % COLOURS.length], status, steps: 0 };
  lab.runs.push(run);
  writeLink();
  renderRunList();
  try {
    await charts();
  } catch (err) {
    // plotly.js did not load: say so; the next run tries again
    lab.charts = null;
    $("#lab-error").textContent = err.message;
    return;
  }
  if (!lab.runs.includes(run)) return; // cleared while the charts were built (its DELETE is sent)
  addTraces(run);
  renameTraces();
  if (!live) {
    for (const step of steps) lab.pending.push([run, step]);
    flush();
    return;
  }
  // The stream opens once the run has its traces: no step arrives before there is a line to extend.
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
  lab.pending = [];
  writeLink();
  renderRunList();
  removeCharts();
}

// --- events -> charts ---------------------------------------------------------------------------
function onEvent(run, kind, data) {
  if (kind === "step") {
    lab.pending.push([run, data]);
    if (!lab.frame) lab.frame = requestAnimationFrame(flush);
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

// Every point that arrived since the last frame joins its chart's queue; the charts on screen draw
// theirs, one extendTraces each.
function flush() {
  lab.frame = 0;
  if (!window.Plotly || !lab.pending.length) return;
  const batch = lab.pending;
  lab.pending = [];
  const byRun = new Map();
  for (const [run, data] of batch) {
    if (!lab.runs.includes(run) || !run.traces) continue;
    if (!byRun.has(run)) byRun.set(run, []);
    byRun.get(run).push(data);
    run.steps = data.step;
  }
  const add = (id, index, xs, ys) => {
    if (!lab.queued.has(id)) lab.queued.set(id, new Map());
    const traces = lab.queued.get(id);
    if (!traces.has(index)) traces.set(index, { x: [], y: [] });
    const t = traces.get(index);
    t.x.push(...xs);
    t.y.push(...ys);
  };
  for (const [run, steps] of byRun) {
    const xs = steps.map((d) => d.step);
    for (const metric of lab.info.metrics)
      add(
        chartId(metric),
        run.traces[metric],
        xs,
        steps.map((d) => d[metric]),
      );
    add(
      OVERLAY,
      run.traces.overlayReward,
      xs,
      steps.map((d) => d.reward),
    );
    add(
      OVERLAY,
      run.traces.overlayLoss,
      xs,
      steps.map((d) => d.loss),
    );
  }
  // The observer's set, and a chart's own place: a page reopened mid-way (a reload keeps the scroll
  // position) lays out its sections after the charts are observed, and may report none intersecting.
  for (const id of [...lab.queued.keys()]) {
    const node = document.getElementById(id);
    if (node && (lab.visible.has(node) || nearScreen(node))) drawQueued(id);
  }
  renderRunList();
  document.body.dataset.labPoints = String(Number(document.body.dataset.labPoints || 0) + batch.length);
}

// A chart's queued points, drawn in one extendTraces.
function drawQueued(id) {
  const traces = lab.queued.get(id);
  if (!traces || !window.Plotly) return;
  lab.queued.delete(id);
  const idx = [...traces.keys()];
  Plotly.extendTraces(id, { x: idx.map((i) => traces.get(i).x), y: idx.map((i) => traces.get(i).y) }, idx);
}

function addTraces(run) {
  run.traces = {};
  for (const metric of lab.info.metrics) {
    const node = document.getElementById(chartId(metric));
    run.traces[metric] = node.data.length;
    Plotly.addTraces(node, labTrace(run, run.id));
  }
  const overlay = document.getElementById(OVERLAY);
  run.traces.overlayReward = overlay.data.length;
  Plotly.addTraces(overlay, labTrace(run, `${run.id}: reward`, "reward"));
  run.traces.overlayLoss = overlay.data.length;
  Plotly.addTraces(overlay, labTrace(run, `${run.id}: loss`, "loss"));
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

function renameTraces() {
  const labels = runLabels(lab.runs);
  for (const metric of lab.info.metrics) {
    const node = document.getElementById(chartId(metric));
    Plotly.restyle(
      node,
      { name: labels },
      lab.runs.map((r) => r.traces[metric]),
    );
  }
  const overlay = document.getElementById(OVERLAY);
  Plotly.restyle(
    overlay,
    { name: lab.runs.flatMap((_, i) => [`${labels[i]}: reward`, `${labels[i]}: loss`]) },
    lab.runs.flatMap((r) => [r.traces.overlayReward, r.traces.overlayLoss]),
  );
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
    lab.hooks.openBatch(data.request, data.config, `Lab run ${runId}, step ${step}`, note);
  } catch (err) {
    $("#lab-error").textContent = err.message;
  }
}

window.grpoLab = lab;
