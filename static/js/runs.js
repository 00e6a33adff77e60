// The Runs view: captured and lab runs from /api/v1/runs. A run's steps as charts (the trainer's
// logged loss and metrics beside GRPO Lens's recomputation, mismatches flagged, one unit per axis,
// gaps where the trainer logged nothing), each step's story (its rollout and pass, zero-std groups'
// dilution), a step slider and a micro-batch picker that load the step into every other view
// (through the page's own input path), and a replay of the same batches under another preset. Every
// number and sentence comes from the server (app/runview.py); a failed load says so and greys the view.

import { getJSON, postJSON } from "./api.js";
import { lossChart, replayChart, runSeriesChart } from "./charts.js";
import { $, clear, el, plot } from "./dom.js";
import { fmt } from "./format.js";

let hooks = null; // { loadRequest(body) }: puts a /api/v1/loss body into the page's state and redraws
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
  $("#run-info").textContent = "checking every micro-batch…";
  const data = await getJSON(`/api/v1/runs/${encodeURIComponent(name)}`);
  current = data;
  recovered();
  const bad = data.steps.filter((s) => !s.ok).map((s) => s.step);
  $("#run-info").textContent =
    `${data.name}: ${data.source}, ${data.steps.length} steps, ${data.files} micro-batches. ` +
    (data.ok
      ? `Every micro-batch matches the trainer (relative error ≤ ${data.rtol}).`
      : `Mismatch at steps ${bad.join(", ")}.`);
  $("#run-info").className = data.ok ? "run-info" : "run-info error";
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

async function showStep(number) {
  const step = current?.steps.find((s) => s.step === number);
  if (!step) return;
  const micro = $("#run-micro").value;
  const query = micro === "" ? "" : `?micro=${micro}`;
  const data = await getJSON(`/api/v1/runs/${encodeURIComponent(current.name)}/steps/${number}${query}`);
  recovered();
  // The losses from the run's page (what its chart draws), per micro-batch or summed over the step.
  const parts = micro === "" ? null : step.micro.filter((m) => String(m.micro) === micro);
  const trainer = parts ? parts.map((m) => fmt(m.trainer_loss)).join(" + ") : fmt(step.trainer_loss);
  const lens = parts ? parts.map((m) => fmt(m.lens_loss)).join(" + ") : fmt(step.lens_loss);
  const label =
    `step ${number}` +
    (micro === "" ? ` (micro-batches ${data.micro_batches.join(", ")} joined)` : `, micro-batch ${micro}`) +
    ` · trainer's loss ${trainer} · GRPO Lens ${lens}`;
  $("#run-step-label").textContent = label;
  $("#run-step-label").dataset.lensLoss = String(parts ? parts.map((m) => m.lens_loss) : step.lens_loss);
  $("#run-step-story").textContent =
    step.rollout.text + (step.zero_std ? `. Zero-std groups: ${step.zero_std.text}.` : ".");
  $("#runs").dataset.step = String(number);
  $("#runs").dataset.micro = micro;
  hooks.loadRequest(
    data.request,
    `Run ${current.name}, step ${number}` + (micro === "" ? "" : `, micro-batch ${micro}`),
    label,
  );
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
