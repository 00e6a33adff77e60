// The Runs view: captured and lab runs from /api/v1/runs. A run's steps as charts (the trainer's
// logged loss and metrics beside GRPO Lens's recomputation, mismatches flagged), a step slider
// that loads the step into every other view (through the page's own input path), and a replay of
// the same batches under another preset. Every number comes from the server.

import { getJSON, postJSON } from "./api.js";
import { lossChart, metricsChart, replayChart } from "./charts.js";
import { $, clear, el, plot } from "./dom.js";
import { fmt } from "./format.js";

let hooks = null; // { loadRequest(body) }: puts a /api/v1/loss body into the page's state and redraws
let current = null; // the open run's /api/v1/runs/{run} response

export function setup(h) {
  hooks = h;
  $("#run-select").addEventListener("change", (e) => openRun(e.target.value));
  $("#run-step").addEventListener("input", (e) => showStep(Number(e.target.value)));
  $("#run-micro").addEventListener("change", () => showStep(Number($("#run-step").value)));
  $("#run-replay").addEventListener("click", replay);
  return refresh();
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
  const bad = data.steps.filter((s) => !s.ok).map((s) => s.step);
  $("#run-info").textContent =
    `${data.name}: ${data.source}, ${data.steps.length} steps, ${data.files} micro-batches. ` +
    (data.ok
      ? `Every micro-batch matches the trainer (relative error ≤ ${data.rtol}).`
      : `Mismatch at steps ${bad.join(", ")}.`);
  $("#run-info").className = data.ok ? "run-info" : "run-info error";
  const slider = $("#run-step");
  slider.min = String(data.steps[0]?.step ?? 1);
  slider.max = String(data.steps.at(-1)?.step ?? 1);
  slider.value = slider.min;
  slider.disabled = data.steps.length === 0;
  await Promise.all([plot("run-loss", lossChart(data)), plot("run-metrics", metricsChart(data))]);
  $("#runs").dataset.open = name;
  if (data.steps.length) await showStep(Number(slider.value));
}

async function showStep(step) {
  if (!current) return;
  const micro = $("#run-micro").value;
  const query = micro === "" ? "" : `?micro=${micro}`;
  const data = await getJSON(`/api/v1/runs/${encodeURIComponent(current.name)}/steps/${step}${query}`);
  const trainer = data.trainer.map((t) => fmt(t.loss)).join(" + ");
  $("#run-step-label").textContent =
    `step ${step}` +
    (micro === "" ? ` (micro-batches ${data.micro_batches.join(", ")} joined)` : `, micro-batch ${micro}`) +
    ` · trainer's loss ${trainer} · GRPO Lens ${fmt(data.breakdown.loss)}`;
  $("#runs").dataset.step = String(step);
  hooks.loadRequest(
    data.request,
    `Run ${current.name}, step ${step}` + (micro === "" ? "" : `, micro-batch ${micro}`),
    $("#run-step-label").textContent,
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
