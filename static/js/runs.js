// The Runs view: captured and lab runs from /api/v1/runs. A run's steps as charts (the trainer's
// logged loss and metrics beside GRPO Lens's recomputation, mismatches flagged, one unit per axis,
// gaps where the trainer logged nothing), each step's story (its rollout and pass, zero-std groups'
// dilution), a step slider and a micro-batch picker that load the step into every other view
// (through the page's own input path, with the breakdown the step endpoint answered: one evaluation per
// step shown), and a replay of the same batches under another preset. The verdict says what was compared
// with the trainer's numbers and what was not (match, differ, unchecked, error). Every number and reason
// comes from the server (app/runview.py); a failed load says so and greys the view.

import { getJSON, getLatest, postJSON } from "./api.js";
import { lossChart, replayChart, runSeriesChart } from "./charts.js";
import { $, clear, el, plot } from "./dom.js";
import { fmt } from "./format.js";
import { RUN } from "./labels.js";

let hooks = null; // { loadStep(data, runStep, title, note) }: puts a step's batch and breakdown into the page
let current = null; // the open run's /api/v1/runs/{run} response

export function setup(h) {
  hooks = h;
  $("#run-select").addEventListener("change", (e) => openRun(e.target.value).catch(failed));
  $("#run-step").addEventListener("input", (e) => pickStep(Number(e.target.value)).catch(failed));
  $("#run-micro").addEventListener("change", () => showStep(Number($("#run-step").value)).catch(failed));
  $("#run-replay").addEventListener("click", () => replay().catch(failed));
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

export async function refresh() {
  const runs = await getJSON("/api/v1/runs?limit=1000"); // the newest 1,000: the listing's largest page
  const select = clear($("#run-select"));
  select.append(
    el("option", { value: "", text: runs.length ? "choose a run" : "no runs yet (grpo.capture or the lab)" }),
  );
  for (const r of runs) {
    const text =
      r.valid === false ? `${r.name} · unreadable: ${r.error}` : `${r.name} · ${r.source} · ${r.steps} steps`;
    select.append(el("option", { value: r.name, text, disabled: r.valid === false }));
  }
  $("#runs").dataset.count = String(runs.length);
}

export async function openRun(name) {
  if (!name) return;
  $("#run-select").value = name;
  $("#run-info").textContent = RUN.checking;
  const data = await getJSON(`/api/v1/runs/${encodeURIComponent(name)}`);
  current = data;
  recovered();
  showVerdict(data);
  showUnsupported(data);
  const notes = clear($("#run-notes"));
  for (const pair of data.named_apart) notes.append(el("li", { text: `${pair.trainer} ≠ ${pair.lens}: ${pair.text}` }));
  const slider = $("#run-step");
  slider.min = String(data.steps[0]?.step ?? 1);
  slider.max = String(data.steps.at(-1)?.step ?? 1);
  slider.value = slider.min;
  slider.disabled = data.steps.length === 0;
  const box = clear($("#run-charts"));
  const draws = [plot("run-loss", lossChart(data))];
  for (const chart of data.charts) {
    const node = el("div", { class: "run-chart", id: chart.id });
    box.append(node);
    draws.push(plot(node, runSeriesChart(data, chart)));
  }
  await Promise.all(draws);
  $("#runs").dataset.open = name;
  if (data.steps.length) await pickStep(Number(slider.value));
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

// The micro-batch picker offers what the step holds: all joined, or one micro-batch (with its ranks).
function fillMicro(step) {
  const select = $("#run-micro");
  const chosen = select.value;
  const ranks = new Map();
  for (const m of step.micro) {
    if (!ranks.has(m.micro)) ranks.set(m.micro, []);
    if (m.rank !== null) ranks.get(m.micro).push(m.rank);
  }
  clear(select).append(el("option", { value: "", text: `all ${step.micro.length}, joined` }));
  for (const [micro, rs] of ranks)
    select.append(
      el("option", { value: String(micro), text: rs.length ? `${micro} (ranks ${rs.join(", ")})` : String(micro) }),
    );
  select.value = ranks.has(Number(chosen)) && chosen !== "" ? chosen : "";
}

async function pickStep(number) {
  const step = current?.steps.find((s) => s.step === number);
  if (!step) return;
  fillMicro(step);
  await showStep(number);
}

// A run's step (`runStep`: { run, step, micro }, micro "" for the whole step) evaluated by the server, once:
// under `config` (a replay; none: the step's own), with the heatmaps of every row and, past the per-token
// limit, the tokens of `row` (the page's other requests ask the same). Its `breakdown` is what the views
// draw; `request`, its batch and config. On the page's one evaluating channel: a newer request supersedes it.
export function fetchStep(runStep, config = null, row = -1) {
  const params = new URLSearchParams({ token_rows: String(Math.max(row, 0)), heatmap_rows: "all" });
  if (runStep.micro !== "") params.set("micro", runStep.micro);
  if (config) params.set("config", JSON.stringify(config));
  return getLatest("loss", `/api/v1/runs/${encodeURIComponent(runStep.run)}/steps/${runStep.step}?${params}`);
}

async function showStep(number) {
  const step = current?.steps.find((s) => s.step === number);
  if (!step) return;
  const micro = $("#run-micro").value;
  const runStep = { run: current.name, step: number, micro };
  const data = await fetchStep(runStep);
  if (!data) return; // a newer step (or setting) superseded this one
  recovered();
  // The losses from the run's page (what its chart draws), per micro-batch or summed over the step.
  const parts = micro === "" ? null : step.micro.filter((m) => String(m.micro) === micro);
  const trainer = parts ? parts.map((m) => fmt(m.trainer_loss)).join(" + ") : fmt(step.trainer_loss);
  const lens = parts ? parts.map((m) => fmt(m.lens_loss)).join(" + ") : fmt(step.lens_loss);
  const label =
    `step ${number}` +
    (micro === "" ? ` (micro-batches ${data.micro_batches.join(", ")} joined)` : `, micro-batch ${micro}`) +
    ` · trainer's loss ${trainer} · GRPO Lens ${lens}` +
    (step.verdict ? ` · ${RUN.step[step.verdict]}` : "");
  $("#run-step-label").textContent = label;
  $("#run-step-label").title = step.unchecked?.join("\n") ?? ""; // the reasons, listed under the verdict too
  $("#run-step-label").dataset.lensLoss = String(parts ? parts.map((m) => m.lens_loss) : step.lens_loss);
  $("#run-step-story").textContent =
    step.rollout.text + (step.zero_std ? `. Zero-std groups: ${step.zero_std.text}.` : ".");
  $("#runs").dataset.step = String(number);
  $("#runs").dataset.micro = micro;
  $("#runs").dataset.stepVerdict = step.verdict ?? "";
  const title = `Run ${current.name}, step ${number}` + (micro === "" ? "" : `, micro-batch ${micro}`);
  hooks.loadStep(data, runStep, title, label);
}

async function replay() {
  if (!current) return;
  const preset = $("#run-replay-preset").value;
  const url = `/api/v1/runs/${encodeURIComponent(current.name)}/replay`;
  // A replay answers whole steps up to the server's micro-batch budget, and the next page's `after`.
  let data = await postJSON("replay", url, { config: { preset } });
  while (data) {
    await plot("run-replay-chart", replayChart(data, preset));
    if (data.next === null || data.next === undefined) return;
    const more = await postJSON("replay", `${url}?after=${data.next}`, { config: { preset } });
    data = more && { ...more, steps: [...data.steps, ...more.steps] };
  }
}
