// Wires the page: options -> controls; state <-> URL; input -> /api/v1/loss -> the views.
// The modules: state.js (the page's one state object and the one way a batch is loaded), api.js (every
// request), charts/ (every figure: base.js the one base layout, then one module per view, imported by that
// view only), dom.js (DOM helpers and the one drawing call), redraw.js (which view is drawn when),
// labels.js (every label), format.js (numbers as text), input.js (the input editor), controls.js (the
// settings), views.js (summary, heatmaps, contributions, clipping, gradients, rows), mismatch.js (sampler
// vs trainer), compare.js, reference.js (glossary, experiments), runs.js (captured runs), lab.js (live lab runs).

import { ApiError, postForm, postJSON } from "./api.js";
import * as compare from "./compare.js";
import { buildControls, renderControls } from "./controls.js";
import { $, download, el, landOn, setStatus } from "./dom.js";
import { fmt } from "./format.js";
import * as input from "./input.js";
import * as lab from "./lab.js";
import { EXPERIMENTS, REFUSED, RUN_RANKS, SCENARIO, STALE, STATUS } from "./labels.js";
import * as mismatch from "./mismatch.js";
import { currentSeq, drawOnScreen, hold, invalidate, isCurrent, whenQuiet } from "./redraw.js";
import { buildGlossary, loadExperiments } from "./reference.js";
import { currentRequest, onLoad, readURL, state, writeURL } from "./state.js";
import * as runs from "./runs.js";
import * as views from "./views.js";

// --- computing --------------------------------------------------------------------------------
function schedule(delay = 120) {
  clearTimeout(state.ui.recomputeTimer);
  state.ui.recomputeTimer = setTimeout(compute, delay);
}

// The heatmaps show every row, also of a batch past the per-token limit (the server pools them).
const HEATMAP_ROWS = "all";
const lossRequest = () => ({ ...currentRequest(), config: state.config, heatmap_rows: HEATMAP_ROWS });

async function fetchLoss() {
  const { uploadFile, runStep } = state.ui;
  if (runStep) {
    // a run's step: evaluated where its batch is, under the page's settings (one request, the batch not sent)
    const data = await runs.fetchStep(runStep, state.config, state.row);
    if (!data) return data;
    state.ui.recordedRows = views.recordedRows(data);
    return data.breakdown;
  }
  if (uploadFile && !state.input) {
    const form = new FormData();
    form.append("file", uploadFile);
    form.append("config", JSON.stringify(state.config));
    if (state.row > 0) form.append("token_rows", JSON.stringify([state.row]));
    form.append("heatmap_rows", JSON.stringify(HEATMAP_ROWS));
    return postForm("loss", "/api/v1/upload", form);
  }
  const body = lossRequest();
  const data = await postJSON("loss", "/api/v1/loss", body);
  if (data && !data.tokens_complete) {
    const row = Math.min(Math.max(state.row, 0), data.rows.loss.length - 1);
    return postJSON("loss", "/api/v1/loss", { ...body, token_rows: [row] });
  }
  return data;
}

// `pending`: a request already in flight for the current state (the first one, sent while the
// page builds its controls).
async function compute(pending = null) {
  hold(); // no idle drawing while the answer is on its way
  const fits = writeURL();
  const started = performance.now();
  setStatus(STATUS.computing, "busy");
  try {
    const data = await (pending || fetchLoss());
    if (!data) return; // a newer request superseded this one
    state.ui.last = data;
    showFailed(false);
    input.renderScenarioNotes();
    await render(data);
    const note = fits ? "" : STATUS.tooLargeForLink;
    setStatus(STATUS.done(fmt(data.loss), Math.round(performance.now() - started)) + note);
    $("#json-error").textContent = "";
    $("#upload-error").textContent = "";
  } catch (err) {
    const said = refusal(err);
    showFailed(true, said);
    setStatus(STATUS.error(said[1] ?? said[0]), "error");
    $("#json-error").textContent = said.join(" ");
    if (state.ui.uploadFile) $("#upload-error").textContent = said.join(" ");
  }
}

// An error as sentences: a refused request's head, then each problem where it is (field, row, setting).
function refusal(err) {
  if (!(err instanceof ApiError)) return [err.message];
  const perToken = new Set(state.ui.options.batch_fields.filter((f) => f.shape === "token").map((f) => f.name));
  return [REFUSED.head(err.status), ...err.problems.map((p) => REFUSED.problem(p, perToken.has(p.field)))];
}

// A failed request leaves the previous results on screen: say so, grey them out, and say why.
function showFailed(failed, said = []) {
  state.ui.failed = failed;
  document.body.classList.toggle("stale", failed);
  $("#stale-note").hidden = !failed;
  $("#stale-note").textContent = failed ? STALE.note : "";
  if (failed) $("#stale-note").append(...said.map((text) => el("p", { class: "refusal", text })));
  if (failed) $("#loaded").textContent = SCENARIO.notDrawn(input.loadedText()); // redrawn by the next answer
}

// The summary, controls and rows table, then the charts on screen (the rest when they are seen).
async function render(data) {
  views.renderSummary(data);
  renderControls(data);
  views.renderRowsTable(data);
  mismatch.render(data);
  invalidate("compare");
  await views.renderViews(data);
  document.body.dataset.seq = String(currentSeq("loss")); // a newer response may have landed meanwhile
  state.ui.drawCount += 1;
  document.body.dataset.drawnAt = String(performance.now());
  document.body.dataset.drawn = String(state.ui.drawCount);
}

function pickRow(i) {
  state.row = i;
  const { last } = state.ui;
  if (last && (i < 0 || last.token_rows.includes(i))) {
    writeURL();
    render(last);
  } else compute();
}

// --- exports -------------------------------------------------------------------------------------
function exportCSV() {
  const { last } = state.ui;
  if (!last) return;
  const t = last.tokens;
  const fields = state.ui.options.token_fields.filter((f) => f.csv).map((f) => f.name); // the server's table
  const quote = (s) => `"${String(s).replace(/"/g, '""')}"`;
  const lines = [["row", "position", "token", "region", ...fields].join(",")];
  last.token_rows.forEach((row, k) =>
    t.ratio[k].forEach((_, j) => {
      lines.push(
        [
          row,
          j,
          quote(t.text ? t.text[k][j] : ""),
          views.regionName(last, k, j),
          ...fields.map((f) => t[f][k][j]),
        ].join(","),
      );
    }),
  );
  download("grpo-lens-breakdown.csv", lines.join("\n"), "text/csv");
}

async function copyLink() {
  const fits = writeURL();
  try {
    await navigator.clipboard.writeText(location.href);
    setStatus(fits ? STATUS.linkCopied : STATUS.linkCopiedSettingsOnly);
  } catch {
    setStatus(STATUS.copyAddressBar);
  }
}

// Every load (state.js `load`): the input views show the new batch, then the answer that came with it is
// drawn (a run's step), or one recompute (an edit's own recompute, a moment later, replaces this one).
function onLoaded(origin, answer) {
  input.showLoaded(origin);
  if (!answer) return schedule(0);
  clearTimeout(state.ui.recomputeTimer);
  compute(Promise.resolve(answer));
}

// The page carries its options and, for a link naming only a scenario and settings, the server's
// answer to the first request (app/boot.py): the first view needs no round trip. The answer is used
// only when it is the answer to the request this page would send.
function readBoot() {
  const boot = JSON.parse($("#boot").textContent);
  return { options: boot.options, first: boot.first };
}

async function init() {
  const boot = readBoot();
  state.ui.options = boot.options;
  readURL(state.ui.options.fields);
  // (With every row's tokens in the answer, the heatmap_rows the page asks for changes nothing.)
  const carried =
    boot.first &&
    boot.first.answer.tokens_complete &&
    !state.ui.uploadFile &&
    sameJSON(boot.first.request, { ...currentRequest(), config: state.config });
  const first = carried ? Promise.resolve(boot.first.answer) : fetchLoss(); // in flight while the controls are built
  first.catch(() => {}); // its error is reported by compute() below
  state.ui.actions = { recompute: schedule, pickRow };
  views.setup();
  mismatch.setup();
  input.setup();
  onLoad(onLoaded);
  buildControls(schedule);
  for (const id of ["#contrib-row", "#grad-row"])
    $(id).addEventListener("change", (e) => pickRow(Number(e.target.value)));
  $("#export-json").addEventListener(
    "click",
    () => state.ui.last && download("grpo-lens-breakdown.json", JSON.stringify(state.ui.last)),
  );
  $("#export-csv").addEventListener("click", exportCSV);
  $("#copy-link").addEventListener("click", copyLink);
  // the header's height, for the views' landing line and the sidebar's place under it (app.css)
  const topbar = $(".topbar");
  new ResizeObserver(() =>
    document.documentElement.style.setProperty("--topbar-height", `${topbar.offsetHeight}px`),
  ).observe(topbar);
  // a view's link scrolls to it and keeps it there while the views above it are laid out; the address keeps its
  // hash (the lab's link)
  $("nav.viewnav").addEventListener("click", (e) => {
    const link = e.target.closest("a[href^='#']");
    const view = link && document.getElementById(link.getAttribute("href").slice(1));
    if (!view) return;
    e.preventDefault();
    landOn(view);
  });
  compare.setup();
  await compute(first);
  const named = location.hash && document.getElementById(location.hash.slice(1));
  if (named) landOn(named); // an address naming a view (the browser's own jump is undone as the page grows)
  // Below the first view: built once the page has been quiet a moment. plotly.js runs when a chart
  // first needs it (a view scrolled to, or idle drawing): no long task follows the first view, so a
  // control moved or a reload right after it is not kept waiting.
  buildGlossary();
  let runsSetUp = null; // set up once
  const runsReady = () =>
    (runsSetUp ??= setupRuns().catch((err) => {
      $("#run-info").textContent = err.message;
    }));
  if (state.ui.linkedStep) runsReady(); // a link to a run's step: opened now, not once the page is quiet
  whenQuiet(() => {
    runsReady();
    lab.setup().catch((err) => {
      $("#lab-error").textContent = err.message;
    });
    loadExperiments().catch((err) => {
      $("#experiments").textContent = EXPERIMENTS.failed(err.message);
    });
  });
}

// Deep equality of two JSON values (the carried request against the page's own).
function sameJSON(a, b) {
  if (a === b) return true;
  if (
    typeof a !== "object" ||
    typeof b !== "object" ||
    a === null ||
    b === null ||
    Array.isArray(a) !== Array.isArray(b)
  )
    return false;
  const keys = Object.keys(a);
  return keys.length === Object.keys(b).length && keys.every((k) => Object.hasOwn(b, k) && sameJSON(a[k], b[k]));
}

// The replay menu starts on no preset (runs.js names the run's own when it opens one); a link naming a run's
// step (state.js `linkedStep`) opens it, under the link's settings.
async function setupRuns() {
  const presets = $("#run-replay-preset");
  presets.append(el("option", { value: "", text: RUN_RANKS.replayChoose }));
  for (const p of state.ui.options.presets) presets.append(el("option", { value: p.name, text: p.name, title: p.doc }));
  presets.value = "";
  await runs.setup();
  const linked = state.ui.linkedStep;
  if (!linked) return;
  state.ui.linkedStep = null;
  landOn($("#runs"));
  await runs.openRun(linked.run, { ...linked, config: state.config });
}

// The page's one debug handle, and the only global it sets: for tests and bench/page.py, the state (the
// lab's runs under state.ui.lab), the latest response, whether a chart is current, and the pieces of a
// redraw (the request body; the summary and the charts on screen for given data).
window.grpoLens = {
  state,
  isCurrent,
  get last() {
    return state.ui.last;
  },
  request: lossRequest,
  drawSummary: (data) => views.renderSummary(data),
  drawCharts: (data) => drawOnScreen("loss", data),
};
init().catch((err) => setStatus(STATUS.error(err.message), "error"));
