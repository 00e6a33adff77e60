// The page's one state object. The top-level fields are read from and written to the URL (names
// match the API's); `state.ui` holds what the page keeps for this visit only, each module's own slice
// included: no other module keeps state at module level.

export const state = {
  scenario: "article", // a scenario's name; its request is the input unless `input` is set
  input: null, // request fields (TRL names) once edited, imported or uploaded
  config: { preset: "article" }, // the preset and the LossConfig fields overridden
  row: -1, // the row shown in per-token views (-1: every row, for small batches)
  compare: ["article", "trl-dapo", "trl-dr_grpo"],
  compare_edits: false,
  compare_constants: {}, // normaliser constants (max_completion_length) set for every compared preset
  ui: {
    options: null, // /api/v1/options: fields, presets, scenarios, glossary
    last: null, // the latest /api/v1/loss response
    uploadFile: null, // a binary upload whose batch only the server holds
    runStep: null, // a run's step the server holds ({ run, step, micro, rank }): evaluated by its step endpoint
    linkedStep: null, // a run's step named by the URL (run, step, micro, rank): opened once the Runs view is set up
    drawCount: 0, // how many times the views were drawn (tests and the benchmark wait on it)
    rowSort: { key: null, dir: 1 }, // the rows table's sort column and direction
    recordedRows: {}, // a run step's rows as its file recorded them (group, reward): shown in the rows table
    origin: { kind: "scenario", name: "" }, // what is loaded: scenario, edited, json, import (name: file), upload (name: file), step (name: the run's step, note)
    failed: false, // the latest request failed: what is on screen is from before it
    // What main.js does when another module asks (set once by main.js as the page starts):
    // `recompute(delay)` schedules a recompute of the loss; `pickRow(i)` shows row i (-1: every row).
    actions: { recompute: () => {}, pickRow: () => {} },
    recomputeTimer: null, // main.js: the recompute scheduled, not yet started
    // Each module's own slice below: read and written by that module only.
    requests: new Map(), // api.js: channel name -> { controller } of its latest request (a newer one aborts it)
    plotly: null, // dom.js: the promise of plotly.js loading (null until a chart first needs it)
    landing: null, // dom.js: the stop of the view landing under way (landOn), null when none
    controls: new Map(), // controls.js: field name (and "name:on", "name:touched", "name:label") -> element
    hovers: new WeakMap(), // views.js: a /api/v1/loss response -> its heatmaps' hover data (built once)
    // views.js: the rows table's window (its data, column order, first row drawn, row height)
    rowsTable: { data: null, columns: [], order: [], first: -1, rowHeight: 0, scheduled: false },
    redraw: {
      views: new Map(), // element id -> { id, node, source, draw, seq (asked), shown (drawn), visible }
      sources: new Map(), // name -> { seq, data, stale, pending, refresh }
      quietTimer: null,
      idleHandle: null,
      generation: 0, // bumped by new data: an idle round from before it stops
      drawAllOf: new Set(), // sources whose next data is drawn in every view
    },
    runs: {
      current: null, // the open run's /api/v1/runs/{run} response
      timeline: null, // the open run's /api/v1/runs/{run}/timeline answer
      beside: null, // { name, answer }: the run overlaid on its charts, or null
      marked: null, // { runStep, tokens, sentence }: an anomaly's tokens, marked on that step's heatmaps
    },
    live: {
      source: null, // live.js: the open EventSource, or null
      drawing: null, // the draw in flight, or null
      pending: null, // { answer, draw }: the newest answer, drawn next
      timer: null, // the next draw, scheduled
      cost: 0, // how long the last draw took, in ms
    },
    lab: {
      info: null, // lab.js: /api/v1/lab/tasks
      runs: [], // {id, body, colour, status, steps (the last step's number), points: [step data], source}
      // chart id -> {node, metric (null: the overlay), drawn}: `drawn` maps each run to the number of its
      // points the chart shows; null while the chart is not drawn for the runs on the page
      charts: new Map(),
      visible: new Set(), // the chart nodes on screen (or within MARGIN of it)
      frame: 0,
      focus: [], // the current comparison's metrics (drawn first)
      comparison: null, // the canned comparison whose runs are on the page (null: runs from the form)
    },
  },
};

export const URL_INPUT_LIMIT = 6000; // characters of encoded input that still fit a link

function encode(obj) {
  const bytes = new TextEncoder().encode(JSON.stringify(obj));
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function decode(text) {
  const binary = atob(text.replace(/-/g, "+").replace(/_/g, "/"));
  return JSON.parse(new TextDecoder().decode(Uint8Array.from(binary, (c) => c.charCodeAt(0))));
}

function parseValue(field, raw) {
  if (raw === "null") return null;
  if (field.type === "number" || field.type === "integer") return Number(raw);
  if (field.type === "boolean") return raw === "true";
  return raw;
}

// Fill `state` from the URL; `fields` are the config fields from /api/v1/options (read after the
// options are in state.ui.options: an unknown scenario falls back to the article's).
export function readURL(fields) {
  const params = new URLSearchParams(location.search);
  const byName = new Map(fields.map((f) => [f.name, f]));
  if (params.has("scenario")) state.scenario = params.get("scenario");
  // a run's step: its batch stays on the server; the link names it (and the settings it is shown under)
  const step = Number(params.get("step"));
  if (params.get("run") && Number.isInteger(step) && step >= 0) {
    const [micro, rank] = [params.get("micro") ?? "", params.get("rank") ?? ""];
    state.ui.linkedStep = { run: params.get("run"), step, micro, rank };
  }
  // a run's own config has no preset: its link names none
  state.config = { preset: params.get("preset") || (state.ui.linkedStep ? null : state.config.preset) };
  for (const [key, raw] of params) {
    const field = byName.get(key);
    if (field && key !== "preset") state.config[key] = parseValue(field, raw);
  }
  if (!scenarios().has(state.scenario)) state.scenario = "article";
  if (params.has("input")) {
    try {
      state.input = decode(params.get("input"));
      state.ui.origin = { kind: "edited", name: "" };
    } catch {
      state.input = null;
    }
  }
  if (params.has("row")) state.row = Math.max(-1, parseInt(params.get("row"), 10) || 0);
  if (params.has("compare")) state.compare = params.get("compare").split(",").filter(Boolean);
  state.compare_edits = params.get("compare_edits") === "1";
  const L = Number(params.get("compare_max_completion_length"));
  if (L > 0) state.compare_constants = { max_completion_length: L };
}

// Each token's log-prob takes at least two characters of JSON ("-1,"), and base64 makes 4 of
// every 3: an input whose tokens alone pass the limit is not encoded at all (that would cost
// seconds on a 64 x 1024 batch, on every control move).
function tooLongForLink(input) {
  const tokens = (input.per_token_logps || []).reduce((n, row) => n + (row?.length || 0), 0);
  return (tokens * 2 * 4) / 3 > URL_INPUT_LIMIT;
}

// Write `state` to the URL (replacing the history entry). Returns false when the input is too
// large for a link (the link then carries the settings only).
export function writeURL() {
  const params = new URLSearchParams();
  const { runStep } = state.ui;
  if (runStep) {
    // a run's step: named, never its batch (the server holds it)
    params.set("run", runStep.run);
    params.set("step", String(runStep.step));
    if (runStep.micro !== "") params.set("micro", runStep.micro);
    if (runStep.rank !== undefined && runStep.rank !== "") params.set("rank", runStep.rank);
  } else params.set("scenario", state.scenario);
  for (const [key, value] of Object.entries(state.config)) {
    if (key === "preset" && value === null) continue; // a run's own config: no preset
    params.set(key, value === null ? "null" : String(value));
  }
  let fits = Boolean(runStep) || !state.input || !tooLongForLink(state.input);
  if (fits && state.input && !runStep) {
    const text = encode(state.input);
    fits = text.length <= URL_INPUT_LIMIT;
    if (fits) params.set("input", text);
  }
  if (state.row !== -1) params.set("row", String(state.row));
  params.set("compare", state.compare.join(","));
  if (state.compare_edits) params.set("compare_edits", "1");
  if (state.compare_constants.max_completion_length)
    params.set("compare_max_completion_length", String(state.compare_constants.max_completion_length));
  history.replaceState(null, "", `${location.pathname}?${params}${location.hash}`);
  return fits;
}

// Lookups into the options.
export const scenarios = () => new Map(state.ui.options.scenarios.map((s) => [s.name, s]));
export const glossary = () => new Map(state.ui.options.glossary.flatMap((g) => g.keys.map((key) => [key, g])));

// The request the page evaluates: the edited input, else the scenario's.
export function currentRequest() {
  if (state.input) return state.input;
  const s = scenarios().get(state.scenario) || scenarios().get("article");
  return s.request;
}

// True while the batch is a binary upload that only the server holds.
export const fromUpload = () => Boolean(state.ui.uploadFile && !state.input);

// --- loading a batch ------------------------------------------------------------------------------
const loadListeners = [];

// `fn(origin, answer)` runs after every load (the page redraws its input views, and draws `answer` where the
// batch came with one, else recomputes).
export function onLoad(fn) {
  loadListeners.push(fn);
}

// The one way a batch becomes the page's input: a scenario, a table edit, a JSON paste or import, an
// upload, a run's or a lab run's step. `batch`: `scenario` (its name: its request is the input),
// `input` (request fields), `file` (a binary upload only the server reads), `runStep` (a run's step the
// server holds: `input` is its batch, evaluated there), `answer` (the server's answer for this batch and
// config, when it came with it: drawn without a request), `config` (the settings; kept when absent),
// `row` (the row shown; -1 when absent). `origin`: what is loaded, as state.ui.origin describes it.
export function load(batch, origin) {
  if (batch.scenario !== undefined) state.scenario = batch.scenario;
  state.input = batch.input ?? null;
  state.ui.uploadFile = batch.file ?? null;
  state.ui.runStep = batch.runStep ?? null;
  state.ui.recordedRows = batch.recordedRows ?? {};
  // a run's own config (an import's, a verl capture's) has no preset, and keeps none
  if (batch.config)
    state.config = { ...batch.config, preset: batch.config.preset || (batch.runStep ? null : "article") };
  state.row = batch.row ?? -1;
  state.ui.origin = origin;
  for (const fn of loadListeners) fn(origin, batch.answer ?? null);
}
