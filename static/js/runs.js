// The Runs view: captured and lab runs from /api/v1/runs. A run's steps as charts (the trainer's
// logged loss and metrics beside GRPO Lens's recomputation, mismatches flagged, one unit per axis,
// gaps where the trainer logged nothing), each step's story (its rollout and pass, zero-std groups'
// dilution), a step slider and a micro-batch picker that load the step into every other view
// (through the page's own input path, with the breakdown the step endpoint answered: one evaluation per
// step shown), and a replay of the same batches under another preset. The verdict says what was compared
// with the trainer's numbers and what was not (match, differ, unchecked, error). Every number and reason
// comes from the server (app/runview.py); a failed load says so and greys the view.
// Under them, the run's timeline (/api/v1/runs/{run}/timeline: grpo.runs.timeline): one small chart per series,
// the trainer's logged values beside the recomputed ones, a trace per rank, anomalies marked with their
// sentences and listed; a click opens that step, an anomaly's click its micro-batch with its tokens marked on
// the heatmaps; a second run overlaid, by step or by a number the answers carry (TIMELINE_AXES).

import { getJSON, getLatest, postJSON } from "./api.js";
import {
  TIMELINE_AXES,
  TIMELINE_LOSS,
  lossChart,
  replayChart,
  runSeriesChart,
  timelineChart,
  timelineDrawn,
} from "./charts/runs.js";
import { $, clear, el, plot } from "./dom.js";
import { fmt } from "./format.js";
import { RUN, RUN_RANKS } from "./labels.js";
import { follow } from "./live.js";
import { load, state } from "./state.js";
import { recordedRows } from "./views.js";

const own = state.ui.runs; // this module's state (state.js): the open run, its timeline, the run beside it

export function setup() {
  $("#run-select").addEventListener("change", (e) => openRun(e.target.value).catch(failed));
  $("#run-step").addEventListener("input", (e) => pickStep(Number(e.target.value)).catch(failed));
  $("#run-micro").addEventListener("change", () => showStep(Number($("#run-step").value)).catch(failed));
  $("#run-rank").addEventListener("change", () => showStep(Number($("#run-step").value)).catch(failed));
  $("#run-replay").addEventListener("click", () => replay().catch(failed));
  $("#timeline-other").addEventListener("change", (e) => showBeside(e.target.value).catch(timelineFailed));
  $("#timeline-x").addEventListener("change", () => own.timeline && drawTimeline(own.timeline).catch(timelineFailed));
  // the Runs tab lists the runs again while none was there (a capture, an import or a lab run since)
  $('nav a[href="#runs"]').addEventListener("click", () => {
    if ($("#runs").dataset.count === "0") refresh().catch(failed);
  });
  return refresh();
}

// A load that failed: the error where the step's label was, and the view greyed (what it shows is
// from before the failed request).
function failed(err) {
  $("#run-step-label").textContent = `failed: ${err.message}`;
  $("#run-step-label").className = "error";
  $("#runs").classList.add("stale");
  $("#runs").dataset.error = err.message;
}

function recovered() {
  $("#run-step-label").className = "";
  $("#runs").classList.remove("stale");
  delete $("#runs").dataset.error;
}

// No run listed: the view says what a run is and how to get one, and shows nothing that would act on a run
// (no control, chart, anomaly or replay); a failed listing shows the view, for its error.
export async function refresh() {
  // the newest 1,000: the listing's largest page
  const runs = await getJSON("/api/v1/runs?limit=1000").catch((err) => {
    showListed(true);
    throw err;
  });
  showListed(runs.length > 0);
  const select = clear($("#run-select"));
  select.append(el("option", { value: "", text: "choose a run" }));
  for (const r of runs) {
    const text =
      r.valid === false ? `${r.name} · unreadable: ${r.error}` : `${r.name} · ${r.source} · ${r.steps} steps`;
    select.append(el("option", { value: r.name, text, disabled: r.valid === false }));
  }
  $("#runs").dataset.count = String(runs.length);
  const other = clear($("#timeline-other"));
  other.append(el("option", { value: "", text: "none" }));
  for (const r of runs.filter((r) => r.valid !== false)) other.append(el("option", { value: r.name, text: r.name }));
}

function showListed(any) {
  $("#runs-empty").hidden = any;
  $("#run-body").hidden = !any;
}

// `at`: a step to show first ({ step, micro, rank, config }: a link's), else the first step.
export async function openRun(name, at = null) {
  if (!name) return;
  $("#run-select").value = name;
  $("#run-info").textContent = RUN.checking;
  const data = await getJSON(`/api/v1/runs/${encodeURIComponent(name)}`);
  own.current = data;
  recovered();
  showVerdict(data);
  showUnsupported(data);
  const notes = clear($("#run-notes"));
  for (const pair of data.named_apart) notes.append(el("li", { text: `${pair.trainer} ≠ ${pair.lens}: ${pair.text}` }));
  const slider = $("#run-step");
  slider.min = String(data.steps[0]?.step ?? 1);
  slider.max = String(data.steps.at(-1)?.step ?? 1);
  slider.value = at && data.steps.some((s) => s.step === at.step) ? String(at.step) : slider.min;
  slider.disabled = data.steps.length === 0;
  fillReplay(data);
  const box = clear($("#run-charts"));
  const draws = [plot("run-loss", lossChart(data))];
  for (const chart of data.charts) {
    const node = el("div", { class: "run-chart", id: chart.id });
    box.append(node);
    draws.push(plot(node, runSeriesChart(data, chart)));
  }
  await Promise.all(draws);
  $("#runs").dataset.open = name;
  showTimeline(name).catch(timelineFailed);
  if (data.steps.length) await pickStep(Number(slider.value), at);
}

// The loss chart, its legend told for the run's ranks (one rank's sum; over several, the mean of each rank's sum),
// with the trainer's logged loss beside it where it logged one.
// The replay menu: no preset chosen on opening a run (the run's own named as such), never a stale choice.
function fillReplay(data) {
  const select = $("#run-replay-preset");
  const own = data.info?.config?.preset ?? null;
  for (const option of select.options) {
    option.textContent =
      option.value === own ? RUN_RANKS.replayOwn(option.value) : option.value || RUN_RANKS.replayChoose;
  }
  select.value = "";
}

// What was compared with the trainer's numbers and what was not: the run's verdict in a sentence (only
// "match" says the run matches), the steps past tolerance or unreadable, and each reason something was not
// compared with how many micro-batches it concerns.
function showVerdict(data) {
  const at = (verdict) => data.steps.filter((s) => s.verdict === verdict).map((s) => s.step);
  const sentences = [];
  if (data.verdict === "match") sentences.push(RUN.match(data.rtol));
  if (at("error").length) sentences.push(RUN.error(at("error")));
  if (at("differ").length) sentences.push(RUN.differ(at("differ")));
  if (data.verdict === "unchecked") sentences.push(RUN.unchecked(data.counts.match, data.files, data.rtol));
  $("#run-info").textContent = RUN.head(data) + sentences.join(" ");
  const tone = { match: "", unchecked: " unchecked" }[data.verdict] ?? " error";
  $("#run-info").className = `run-info${tone}`;
  $("#runs").dataset.verdict = data.verdict;
  const list = clear($("#run-verdict"));
  for (const s of data.steps)
    for (const e of s.errors) list.append(el("li", { text: RUN.unreadable(e.file, e.error) }));
  for (const { reason, count, of } of data.unchecked ?? [])
    list.append(el("li", { text: RUN.notChecked(reason, count, of) }));
}

// What an imported run does not reproduce of the trainer's settings (run.json's imported.unsupported: setting ->
// why), listed under the verdict as the import wrote it; hidden when there is none.
function showUnsupported(data) {
  let list = $("#run-unsupported");
  if (!list) {
    list = el("ul", { id: "run-unsupported", class: "run-unsupported" });
    $("#run-verdict").after(list);
  }
  clear(list);
  const unsupported = data.info?.imported?.unsupported;
  const given = unsupported && typeof unsupported === "object" && !Array.isArray(unsupported);
  const entries = given ? Object.entries(unsupported) : [];
  for (const [setting, why] of entries) list.append(el("li", { text: `Not reproduced: ${setting} — ${why}` }));
  list.hidden = entries.length === 0;
}

// The micro-batch picker offers what the step holds: all joined, or one micro-batch (with its ranks); the rank
// picker, over several ranks, all of them (the step as the trainer logs it) or one. `at`: a link's choice.
function fillMicro(step, at = null) {
  const select = $("#run-micro");
  const chosen = at ? at.micro : select.value;
  const ranks = new Map();
  for (const m of step.micro) {
    if (!ranks.has(m.micro)) ranks.set(m.micro, []);
    if (m.rank !== null) ranks.get(m.micro).push(m.rank);
  }
  const micros = [...ranks.keys()];
  clear(select).append(el("option", { value: "", text: `all ${micros.length}, joined` }));
  for (const [micro, rs] of ranks)
    select.append(el("option", { value: String(micro), text: RUN_RANKS.microOption(micro, rs) }));
  select.value = ranks.has(Number(chosen)) && chosen !== "" ? chosen : "";
  const stepRanks = stepRanksOf(step);
  const picker = $("#run-rank");
  const pickedRank = at ? at.rank : picker.value;
  clear(picker).append(el("option", { value: "", text: RUN_RANKS.allRanks(stepRanks.length) }));
  for (const r of stepRanks) picker.append(el("option", { value: String(r), text: RUN_RANKS.rank(r) }));
  picker.value = stepRanks.includes(Number(pickedRank)) && pickedRank !== "" ? String(pickedRank) : "";
  $("#run-rank-label").hidden = stepRanks.length < 2;
}

// The ranks a step's files name (none: a one-process run).
const stepRanksOf = (step) =>
  [...new Set(step.micro.map((m) => m.rank).filter((r) => r !== null))].sort((a, b) => a - b);

async function pickStep(number, at = null) {
  let step = own.current?.steps.find((s) => s.step === number);
  if (!step && own.current && own.timeline?.steps.some((s) => s.step === number)) {
    // a step of a running run that came after its page was read: the page read again, once
    own.current = await getJSON(`/api/v1/runs/${encodeURIComponent(own.current.name)}`);
    step = own.current.steps.find((s) => s.step === number);
  }
  if (!step) return;
  own.marked = null; // a step picked by hand: no anomaly's tokens
  fillMicro(step, at);
  await showStep(number, at?.config ?? null);
}

// A run's step (`runStep`: { run, step, micro, rank }, micro "" for the whole step, rank "" for every rank's)
// evaluated by the server, once:
// under `config` (a replay; none: the step's own), with the heatmaps of every row and, past the per-token
// limit, the tokens of `row` (the page's other requests ask the same). Its `breakdown` is what the views
// draw; `request`, its batch and config. On the page's one evaluating channel: a newer request supersedes it.
export function fetchStep(runStep, config = null, row = -1) {
  const params = new URLSearchParams({ token_rows: String(Math.max(row, 0)), heatmap_rows: "all" });
  if (runStep.micro !== "") params.set("micro", runStep.micro);
  if (runStep.rank !== undefined && runStep.rank !== "") params.set("rank", runStep.rank);
  if (config) params.set("config", JSON.stringify(config));
  const url = `/api/v1/runs/${encodeURIComponent(runStep.run)}/steps/${runStep.step}?${params}`;
  return getLatest("loss", url).then((data) => withMarks(data, runStep));
}

// The answer of the step an anomaly opened carries its tokens (`marked`), for charts/heatmaps.js to outline on the
// heatmaps; the same step under other settings keeps them, another step or micro-batch has none.
const STEP_KEYS = ["run", "step", "micro", "rank"];
const sameStep = (a, b) => STEP_KEYS.every((k) => String(a[k] ?? "") === String(b[k] ?? ""));
function withMarks(data, runStep) {
  if (data && own.marked && sameStep(own.marked.runStep, runStep))
    data.breakdown.marked = { tokens: own.marked.tokens, sentence: own.marked.sentence };
  return data;
}

// The step the pickers name: { run, step, micro ("": joined), rank ("": every rank's) }.
function chosenStep(number) {
  const micro = $("#run-micro").value;
  const rank = $("#run-rank-label").hidden ? "" : $("#run-rank").value;
  return { run: own.current.name, step: number, micro, rank };
}

// `config`: the settings to show it under (a link's; none: the step's own).
async function showStep(number, config = null) {
  const step = own.current?.steps.find((s) => s.step === number);
  if (!step) return;
  const runStep = chosenStep(number);
  const { micro, rank } = runStep;
  const data = await fetchStep(runStep, config);
  if (!data) return; // a newer step (or setting) superseded this one
  recovered();
  const { text, lensLoss } = stepLosses(step, micro, rank);
  const label = text + (step.verdict ? ` · ${RUN.step[step.verdict]}` : "");
  $("#run-step-label").textContent = label;
  $("#run-step-label").title = step.unchecked?.join("\n") ?? ""; // the reasons, listed under the verdict too
  $("#run-step-label").dataset.lensLoss = String(lensLoss);
  $("#run-step-story").textContent =
    step.rollout.text + (step.zero_std ? `. Zero-std groups: ${step.zero_std.text}.` : ".");
  $("#runs").dataset.step = String(number);
  $("#runs").dataset.micro = micro;
  $("#runs").dataset.rank = rank;
  $("#runs").dataset.stepVerdict = step.verdict ?? "";
  loadStep(data, runStep, RUN_RANKS.title(own.current.name, number, micro, rank), label);
}

// A step into every view, with the breakdown the step endpoint answered (drawn as it is); the page's settings
// then replay it there (`runStep`). No scenario is loaded then (its menu says so).
function loadStep(data, runStep, title, note) {
  const { config, ...fields } = data.request;
  load(
    { scenario: "", input: fields, config, runStep, answer: data.breakdown, recordedRows: recordedRows(data) },
    { kind: "step", name: title, note },
  );
}

// What the step's label says of its losses (the run's page: what its chart draws), told per rank: the whole
// step (over several ranks the mean of each rank's sum, with the trainer's logged loss beside it), one rank's
// sum, one micro-batch of one rank, or one micro-batch index on every rank (one loss per rank, never added).
function stepLosses(step, micro, rank) {
  const ranks = stepRanksOf(step);
  const micros = [...new Set(step.micro.map((m) => m.micro))];
  const files = step.micro.filter(
    (m) => (micro === "" || String(m.micro) === micro) && (rank === "" || String(m.rank) === rank),
  );
  const loggedLoss = step.logged_loss
    ? RUN_RANKS.logged(fmt(step.logged_loss.trainer), fmt(step.logged_loss.lens))
    : "";
  if (micro === "" && rank === "") {
    const perRank = (key) =>
      ranks.length > 1 ? ` (${RUN_RANKS.perRank(step.rank_losses.map((r) => [r.rank, fmt(r[key])]))})` : "";
    const losses = RUN_RANKS.losses(
      fmt(step.trainer_loss) + perRank("trainer_loss"),
      fmt(step.lens_loss) + perRank("lens_loss"),
    );
    return { text: RUN_RANKS.whole(step.step, micros, ranks) + losses + loggedLoss, lensLoss: step.lens_loss };
  }
  if (micro === "") {
    const one = step.rank_losses.find((r) => String(r.rank) === rank);
    const text =
      RUN_RANKS.oneRank(step.step, rank, one.micro) + RUN_RANKS.losses(fmt(one.trainer_loss), fmt(one.lens_loss));
    return { text, lensLoss: one.lens_loss };
  }
  if (files.length === 1) {
    const [m] = files;
    const where = m.rank === null ? RUN_RANKS.micro(step.step, micro) : RUN_RANKS.microOfRank(step.step, m.rank, micro);
    return { text: where + RUN_RANKS.losses(fmt(m.trainer_loss), fmt(m.lens_loss)), lensLoss: m.lens_loss };
  }
  const each = (key) => RUN_RANKS.perRank(files.map((m) => [m.rank, fmt(m[key])]));
  const text =
    RUN_RANKS.microOfRanks(
      step.step,
      micro,
      files.map((m) => m.rank),
    ) + RUN_RANKS.losses(each("trainer_loss"), each("lens_loss"));
  return { text, lensLoss: files.map((m) => m.lens_loss) };
}

async function replay() {
  const preset = $("#run-replay-preset").value;
  if (!own.current || !preset) return;
  const url = `/api/v1/runs/${encodeURIComponent(own.current.name)}/replay`;
  // A replay answers whole steps up to the server's micro-batch budget, and the next page's `after`.
  let data = await postJSON("replay", url, { config: { preset } });
  while (data) {
    await plot("run-replay-chart", replayChart(data, preset));
    if (data.next === null || data.next === undefined) return;
    const more = await postJSON("replay", `${url}?after=${data.next}`, { config: { preset } });
    data = more && { ...more, steps: [...data.steps, ...more.steps] };
  }
}

// --- the run's timeline ---------------------------------------------------------------------------------------
// Computed by the server once per state of the run's files (kept beside it): the first open of a long run waits.
async function showTimeline(name) {
  $("#timeline-info").textContent = "computing the run's timeline…";
  $("#timeline-info").className = "";
  const answer = await getJSON(`/api/v1/runs/${encodeURIComponent(name)}/timeline`);
  if (own.current?.name !== name) return; // another run was opened meanwhile
  await drawTimeline(answer);
  $("#run-timeline").dataset.open = name;
  follow(name, own.current?.info?.status ?? null, answer, drawTimeline); // a running run's new steps, drawn as they come
}

function timelineFailed(err) {
  $("#timeline-info").textContent = `The timeline could not be drawn: ${err.message}`;
  $("#timeline-info").className = "error";
}

// A second run's timeline on the same charts (none: the open run's alone).
async function showBeside(name) {
  own.beside = name ? { name, answer: await getJSON(`/api/v1/runs/${encodeURIComponent(name)}/timeline`) } : null;
  $("#run-timeline").dataset.beside = own.beside ? name : "";
  if (own.timeline) await drawTimeline(own.timeline);
}

// The timeline charts (one per series that either run has), the anomaly list and what the answer says of
// itself, from a timeline answer: drawn again as it is whenever the answer, the run beside it or the x-axis change.
export async function drawTimeline(answer) {
  own.timeline = answer;
  const runs = [
    { answer, name: answer.run },
    ...(own.beside ? [{ answer: own.beside.answer, name: own.beside.name }] : []),
  ];
  const axis = fillAxes(runs);
  const every = [TIMELINE_LOSS, ...answer.series];
  const shown = every.filter((series) => timelineDrawn(runs, series));
  const box = $("#timeline-charts");
  const ids = new Set(shown.map((series) => `timeline-${series.name}`));
  for (const node of [...box.children]) if (!ids.has(node.id)) node.remove();
  const draws = shown.map((series) => {
    const cell = timelineCell(box, series);
    return Promise.resolve(plot(cell.firstChild, timelineChart(runs, series, axis))).then(() => {
      if (cell.firstChild.on && !cell.dataset.clicks) {
        cell.firstChild.on("plotly_click", (event) => timelineClick(event).catch(failed));
        cell.dataset.clicks = "1";
      }
    });
  });
  const last = answer.steps.at(-1)?.step;
  if (last !== undefined && last > Number($("#run-step").max)) $("#run-step").max = String(last); // a live run's new step
  const absent = every.filter((series) => !shown.includes(series)).map((series) => series.label);
  describeTimeline(answer, absent);
  listAnomalies(answer);
  await Promise.all(draws);
  $("#run-timeline").dataset.axis = axis;
}

// A series' cell: its chart and, under it, its description (made once; kept in the series' order).
function timelineCell(box, series) {
  let cell = document.getElementById(`timeline-${series.name}`);
  if (!cell) {
    cell = el("figure", { id: `timeline-${series.name}`, class: "timeline-cell", dataset: { series: series.name } });
    cell.append(el("div", { class: "timeline-chart" }), el("figcaption", { text: series.description }));
  }
  box.append(cell); // appended again: the cells follow the answer's order
  return cell;
}

// The x-axes every drawn run's answer carries a number for; the chosen one kept when it still can be drawn.
function fillAxes(runs) {
  const select = $("#timeline-x");
  const chosen = select.value || "step";
  const usable = Object.keys(TIMELINE_AXES).filter((key) =>
    runs.every(({ answer }) => answer.steps.every((s) => TIMELINE_AXES[key].of(s) !== null)),
  );
  clear(select);
  for (const key of usable) select.append(el("option", { value: key, text: TIMELINE_AXES[key].title }));
  select.value = usable.includes(chosen) ? chosen : "step";
  return select.value;
}

function describeTimeline(answer, absent) {
  const thresholds = Object.entries(answer.thresholds).map(([k, v]) => `${k} ${fmt(v)}`);
  const count = answer.anomalies.length;
  const parts = [
    `${answer.steps.length} steps, ${count} ${count === 1 ? "anomaly" : "anomalies"} found (thresholds: ${thresholds.join(", ")}).`,
  ];
  if (absent.length) parts.push(`Not in this run: ${absent.join(", ")}.`);
  $("#timeline-info").textContent = parts.join(" ");
  $("#timeline-info").className = "";
}

function listAnomalies(answer) {
  const list = clear($("#timeline-anomalies"));
  answer.anomalies.forEach((a) => {
    const open = () => openAnomaly(a).catch(failed);
    const where = a.rank === null ? `step ${a.step}` : `step ${a.step}, rank ${a.rank}`;
    const button = el("button", { type: "button", class: "link", text: `${where} · ${a.kind}`, onclick: open });
    list.append(el("li", { dataset: { step: String(a.step), kind: a.kind } }, button, ` ${a.sentence}`));
  });
  $("#timeline-none").hidden = answer.anomalies.length > 0;
}

// A click on a timeline chart: an anomaly's marker opens it; any other point of the open run, its step.
async function timelineClick(event) {
  const point = event.points?.[0];
  if (!point || !own.timeline || point.data.meta?.run !== own.timeline.run) return;
  if (point.data.meta.kind === "anomaly") return openAnomaly(own.timeline.anomalies[point.customdata]);
  $("#run-step").value = String(point.customdata);
  return pickStep(point.customdata);
}

// An anomaly's step, micro-batch and rank (the file its tokens are in; a null one: all of them), opened in the
// step view with its tokens marked on the heatmaps.
async function openAnomaly(anomaly) {
  const step = own.current?.steps.find((s) => s.step === anomaly.step);
  if (!step) return;
  $("#run-step").value = String(anomaly.step);
  const at = { micro: anomaly.micro === null ? "" : String(anomaly.micro), rank: anomaly.rank ?? "" };
  fillMicro(step, at);
  own.marked = { runStep: chosenStep(anomaly.step), tokens: anomaly.tokens, sentence: anomaly.sentence };
  $("#runs").dataset.anomaly = `${anomaly.step}:${anomaly.kind}`;
  await showStep(anomaly.step);
}
