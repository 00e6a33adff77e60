// Wires the page: options -> controls; state <-> URL; input -> /api/v1/loss -> Plotly.react.

import { ApiError, getJSON, postForm, postJSON } from "./api.js";
import * as charts from "./charts.js";
import { $, clear, download, el } from "./dom.js";
import { LABELS, fmt, pct } from "./format.js";
import { state, readURL, writeURL } from "./state.js";

const TABLE_EDIT_LIMIT = 400; // tokens: past this, edit as JSON or upload a file
const ALL_TOKENS_LIMIT = 400; // tokens: per-token bar charts show every row up to this
let options = null;
let last = null; // the latest /api/v1/loss response
let uploadFile = null; // a binary upload whose batch only the server holds
let drawCount = 0;

const scenarios = () => new Map(options.scenarios.map((s) => [s.name, s]));
const fieldsByName = () => new Map(options.fields.map((f) => [f.name, f]));
const glossary = () => new Map(options.glossary.flatMap((g) => g.keys.map((key) => [key, g])));

function currentRequest() {
  if (state.input) return state.input;
  const s = scenarios().get(state.scenario) || scenarios().get("article");
  return s.request;
}

function setStatus(text, kind = "") {
  const node = $("#status");
  node.textContent = text;
  node.className = `status ${kind}`;
}

function plot(id, spec) {
  const node = document.getElementById(id);
  Plotly.react(node, spec.data, spec.layout, { responsive: true, displaylogo: false, toImageButtonOptions: { filename: `grpo-lens-${id}` } });
}

// --- computing --------------------------------------------------------------------------------
let timer = null;
function schedule(delay = 120) {
  clearTimeout(timer);
  timer = setTimeout(compute, delay);
}

async function compute() {
  const fits = writeURL();
  const started = performance.now();
  setStatus("computing…", "busy");
  try {
    let data;
    if (uploadFile && !state.input) {
      const form = new FormData();
      form.append("file", uploadFile);
      form.append("config", JSON.stringify(state.config));
      if (state.row > 0) form.append("token_rows", JSON.stringify([state.row]));
      data = await postForm("loss", "/api/v1/upload", form);
    } else {
      const body = { ...currentRequest(), config: state.config };
      data = await postJSON("loss", "/api/v1/loss", body);
      if (data && !data.tokens_complete) {
        const row = Math.min(Math.max(state.row, 0), data.rows.loss.length - 1);
        data = await postJSON("loss", "/api/v1/loss", { ...body, token_rows: [row] });
      }
    }
    if (!data) return; // a newer request superseded this one
    last = data;
    render(data);
    const note = fits ? "" : " · input too large for the link: use Export input";
    setStatus(`loss ${fmt(data.loss)} · computed and drawn in ${Math.round(performance.now() - started)} ms${note}`);
    $("#json-error").textContent = "";
    $("#upload-error").textContent = "";
    scheduleCompare();
  } catch (err) {
    setStatus(err instanceof ApiError ? `error: ${err.message.split("\n")[0]}` : `error: ${err.message}`, "error");
    $("#json-error").textContent = err.message;
    if (uploadFile) $("#upload-error").textContent = err.message;
  }
}

// --- rendering --------------------------------------------------------------------------------
function render(data) {
  renderSummary(data);
  renderControls(data);
  renderViews(data);
  renderRowsTable(data);
  drawCount += 1;
  document.body.dataset.drawnAt = String(performance.now());
  document.body.dataset.drawn = String(drawCount);
}

function renderSummary(data) {
  const card = (label, value) => el("div", { class: "card" }, el("div", { class: "label", text: label }), el("div", { class: "value", text: fmt(value, 5) }));
  clear($("#summary-cards")).append(
    card("loss", data.loss),
    card(LABELS.objective, data.objective),
    card("policy part", data.policy_loss),
    card("KL part (β·KL)", data.kl_loss),
  );
  clear($("#explanation")).append(...data.explanation.map((s) => el("li", { text: s })));
  clear($("#warnings")).append(...data.warnings.map((s) => el("li", { text: s })));
  const meanings = glossary();
  const explained = new Set(); // a term covering several keys is explained on its first row
  clear($("#metrics-table tbody")).append(
    ...Object.entries(data.metrics).map(([name, value]) => {
      const term = meanings.get(name);
      const text = term && !explained.has(term) ? term.meaning : "";
      if (term) explained.add(term);
      return el("tr", { title: term?.meaning }, el("td", { text: name }), el("td", { class: "num", text: fmt(value, 5) }), el("td", { class: "muted", text }));
    }),
  );
  const touched = Object.entries(data.clamp_counts).filter(([, n]) => n > 0);
  $("#clamp-counts").textContent = touched.length
    ? `Clamps that touched tokens: ${touched.map(([k, n]) => `${k} ${n}`).join(", ")}.`
    : "No clamp touched any token.";
}

function renderViews(data) {
  const note = $("#large-note");
  note.hidden = data.tokens_complete;
  note.textContent = data.tokens_complete ? "" : `This batch has ${data.num_positions} positions, more than the per-token limit: showing the per-row overview and the tokens of row ${data.token_rows[0]} (pick another row below or in the rows table).`;
  const customdata = charts.hoverData(data);
  plot("heatmaps", charts.heatmaps(data, customdata));
  plot("contrib-rows", charts.contributionRows(data));
  fillRowPickers(data);
  const ks = tokenRowsShown(data);
  plot("contrib-tokens", charts.contributionTokens(data, ks));
  plot("grad-tokens", charts.gradientTokens(data, ks));
  plot("clip-curves", charts.clipCurves(data));
}

// Positions in data.token_rows whose tokens the per-token charts show: every row of a small
// batch (unless one was picked), else the picked row.
function tokenRowsShown(data) {
  const small = data.tokens_complete && data.num_positions <= ALL_TOKENS_LIMIT;
  if (small && state.row < 0) return data.token_rows.map((_, k) => k);
  const k = data.token_rows.indexOf(Math.max(state.row, 0));
  return [k >= 0 ? k : 0];
}

function fillRowPickers(data) {
  const small = data.tokens_complete && data.num_positions <= ALL_TOKENS_LIMIT;
  for (const id of ["#contrib-row", "#grad-row"]) {
    const select = clear($(id));
    if (small) select.append(el("option", { value: -1, text: "all rows", selected: state.row < 0 }));
    data.rows.loss.forEach((_, i) => select.append(el("option", { value: i, text: `row ${i}`, selected: i === state.row })));
  }
}

function pickRow(i) {
  state.row = i;
  if (last && (i < 0 || last.token_rows.includes(i))) {
    writeURL();
    render(last);
  } else compute();
}

// --- rows table ---------------------------------------------------------------------------------
const ROW_COLUMNS = ["group", "reward", "advantage", "length", "loss", "policy_loss", "kl_loss", "sequence_ratio", "clip_fraction"];
let rowSort = { key: null, dir: 1 };

function renderRowsTable(data) {
  const table = clear($("#rows-table"));
  const head = el("tr", {}, el("th", { scope: "col", text: "row" }));
  for (const key of ROW_COLUMNS) {
    const th = el("th", { scope: "col", class: "num", tabindex: 0, text: LABELS[key] || key, "aria-sort": rowSort.key === key ? (rowSort.dir > 0 ? "ascending" : "descending") : "none" });
    const sort = () => { rowSort = { key, dir: rowSort.key === key ? -rowSort.dir : 1 }; renderRowsTable(data); };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(); } });
    head.append(th);
  }
  table.append(el("thead", {}, head));
  const order = data.rows.loss.map((_, i) => i);
  if (rowSort.key) {
    const v = data.rows[rowSort.key] || [];
    order.sort((a, b) => ((v[a] ?? -Infinity) - (v[b] ?? -Infinity)) * rowSort.dir);
  }
  const body = el("tbody");
  for (const i of order) {
    const cells = ROW_COLUMNS.map((key) => {
      const v = data.rows[key] ? data.rows[key][i] : null;
      return el("td", { class: "num", text: key === "clip_fraction" ? pct(v) : fmt(v) });
    });
    const tr = el("tr", { class: i === state.row ? "selected" : "", tabindex: 0, onclick: () => pickRow(i), onkeydown: (e) => { if (e.key === "Enter") pickRow(i); } }, el("td", { text: String(i) }), ...cells);
    body.append(tr);
  }
  table.append(body);
}

// --- controls ------------------------------------------------------------------------------------
const controlInputs = new Map();

function buildControls() {
  const container = clear($("#control-groups"));
  const groups = new Map();
  for (const field of options.fields) {
    if (field.group === "preset") continue;
    if (!groups.has(field.group)) groups.set(field.group, []);
    groups.get(field.group).push(field);
  }
  const titles = { policy: "policy objective", kl: "KL penalty", aggregation: "aggregation", advantage: "advantages", runtime: "runtime" };
  for (const [group, fields] of groups) {
    const fieldset = el("fieldset", { class: "control-group" }, el("legend", { text: titles[group] || group }));
    for (const field of fields) fieldset.append(buildControl(field));
    container.append(fieldset);
  }
  const preset = clear($("#preset"));
  for (const p of options.presets) preset.append(el("option", { value: p.name, text: p.name, title: p.doc }));
}

function buildControl(field) {
  const id = `cfg-${field.name}`;
  const desc = el("span", { id: `${id}-doc`, class: "visually-hidden", text: field.doc });
  const label = el("label", { for: id, title: field.doc, text: field.name });
  const touched = el("div", { class: "touched", hidden: true });
  let input;
  let widget;
  const changed = (value) => {
    state.config[field.name] = value;
    schedule(field.type === "number" || field.type === "integer" ? 180 : 0);
  };
  if (field.type === "choice") {
    input = el("select", { id, "aria-describedby": desc.id, onchange: () => changed(input.value) }, ...field.choices.map((c) => el("option", { value: c, text: c })));
    widget = input;
  } else if (field.type === "boolean") {
    input = el("input", { id, type: "checkbox", "aria-describedby": desc.id, onchange: () => changed(input.checked) });
    widget = input;
  } else {
    input = el("input", { id, type: "number", step: "any", "aria-describedby": desc.id });
    const read = () => (input.value === "" ? null : Number(input.value));
    input.addEventListener("input", () => { if (input.value !== "" && Number.isFinite(Number(input.value))) changed(read()); });
    widget = input;
    if (field.nullable) {
      const on = el("input", { type: "checkbox", "aria-label": `${field.name} on`, title: "on / off" });
      on.addEventListener("change", () => {
        input.disabled = !on.checked;
        if (on.checked && input.value === "") input.value = String(field.gt !== undefined ? Math.max(field.gt * 2, 1) : 1);
        changed(on.checked ? read() : null);
      });
      widget = el("span", { class: "nullable" }, on, input);
      controlInputs.set(`${field.name}:on`, on);
    }
  }
  controlInputs.set(field.name, input);
  controlInputs.set(`${field.name}:touched`, touched);
  controlInputs.set(`${field.name}:label`, label);
  return el("div", { class: "control" }, label, widget, desc, touched);
}

function renderControls(data) {
  const config = data.config;
  const preset = options.presets.find((p) => p.name === config.preset)?.config || {};
  $("#preset").value = config.preset;
  for (const field of options.fields) {
    const input = controlInputs.get(field.name);
    if (!input) continue;
    const value = config[field.name];
    const active = document.activeElement === input;
    if (field.type === "boolean") input.checked = Boolean(value);
    else if (!active) input.value = value === null || value === undefined ? "" : String(value);
    const on = controlInputs.get(`${field.name}:on`);
    if (on) { on.checked = value !== null; input.disabled = value === null; }
    const edited = JSON.stringify(value) !== JSON.stringify(preset[field.name]);
    controlInputs.get(`${field.name}:label`).classList.toggle("edited", edited);
    const touched = controlInputs.get(`${field.name}:touched`);
    const n = data.clamp_counts[field.name];
    touched.hidden = !n;
    touched.textContent = n ? `touched ${n} token${n === 1 ? "" : "s"}` : "";
  }
}

// --- input: table, JSON, upload ----------------------------------------------------------------
function editableInput() {
  if (!state.input) state.input = structuredClone(currentRequest());
  uploadFile = null;
  return state.input;
}

// A structural change (rows, tokens, which fields exist): redraw the table after the event that
// caused it has finished (removing a focused input inside its own change event breaks blur).
function inputChanged() {
  setTimeout(renderInputTable, 0);
  valueChanged();
}

// A value changed: the table already shows it.
function valueChanged() {
  renderJSONBox();
  renderScenarioNotes();
  schedule(250);
}

function numberCell(value, onValue, attrs = {}) {
  const input = el("input", { type: "number", step: "any", value: value ?? "", ...attrs });
  input.addEventListener("change", () => onValue(input.value === "" ? null : Number(input.value)));
  return input;
}

function renderInputTable() {
  const host = clear($("#input-table"));
  if (uploadFile && !state.input) {
    host.append(el("p", { class: "muted", text: `The batch comes from the file ${uploadFile.name}; the server holds it. Edit a JSON copy via the JSON tab, or pick a scenario.` }));
    return;
  }
  const req = currentRequest();
  const rows = req.per_token_logps;
  const total = rows.reduce((n, r) => n + r.length, 0);
  if (total > TABLE_EDIT_LIMIT) {
    host.append(el("p", { class: "muted", text: `${rows.length} rows, ${total} tokens: too many to edit as a table. Use the JSON tab or upload a file.` }));
    return;
  }
  const target = req.rewards ? "rewards" : "advantages";
  const prompt = Array.isArray(req.prompt_lengths) ? req.prompt_lengths : rows.map(() => req.prompt_lengths || 0);
  const meta = el("div", { class: "batch-meta" },
    el("label", { for: "in-target", text: "per row" }),
    el("select", { id: "in-target", onchange: (e) => { const inp = editableInput(); const other = e.target.value === "rewards" ? "advantages" : "rewards"; inp[e.target.value] = inp[other] || rows.map(() => 0); delete inp[other]; inputChanged(); } },
      el("option", { value: "rewards", text: "rewards (advantages computed)", selected: target === "rewards" }),
      el("option", { value: "advantages", text: "advantages (given)", selected: target === "advantages" })),
    el("label", { for: "in-group", text: "group size" }),
    numberCell(req.group_size ?? "", (v) => { const inp = editableInput(); if (v) inp.group_size = v; else delete inp.group_size; inputChanged(); }, { id: "in-group", min: 1, step: 1, placeholder: "all rows" }),
  );
  host.append(meta);
  rows.forEach((row, i) => host.append(inputRow(req, row, i, target, prompt[i])));
  host.append(el("div", { class: "row-buttons" },
    el("button", { type: "button", onclick: () => { const inp = editableInput(); addRow(inp); inputChanged(); }, text: "+ row" })));
}

const PER_TOKEN = ["per_token_logps", "old_per_token_logps", "ref_per_token_logps"];
const CELL_LABEL = { per_token_logps: "logp", old_per_token_logps: "old", ref_per_token_logps: "ref" };

function inputRow(req, row, i, target, promptLength) {
  const n = row.length;
  const gridNode = el("div", { class: "tok-grid", style: `--n:${n}` });
  gridNode.append(el("span", { class: "lab", text: "token" }));
  for (let j = 0; j < n; j += 1) {
    const text = el("input", { type: "text", class: `tok-text ${j < promptLength ? "prompt" : ""}`, value: req.tokens ? req.tokens[i][j] : "", "aria-label": `row ${i} token ${j} text`, title: j < promptLength ? "prompt position (excluded)" : "" });
    text.addEventListener("change", () => {
      const inp = editableInput();
      if (!inp.tokens) inp.tokens = inp.per_token_logps.map((r) => r.map(() => ""));
      inp.tokens[i][j] = text.value;
      valueChanged();
    });
    gridNode.append(text);
  }
  for (const name of PER_TOKEN) {
    gridNode.append(el("span", { class: "lab", text: CELL_LABEL[name] }));
    for (let j = 0; j < n; j += 1) {
      const values = req[name];
      gridNode.append(numberCell(values ? values[i][j] : "", (v) => setCell(name, i, j, v), {
        max: 0, "aria-label": `row ${i} ${CELL_LABEL[name]} ${j}`, placeholder: values ? "" : "= logp", class: j < promptLength ? "prompt" : "",
      }));
    }
  }
  const header = el("header", {},
    el("strong", { text: `row ${i}` }),
    el("label", { text: target === "rewards" ? "reward " : "advantage " }, numberCell(req[target][i], (v) => { const inp = editableInput(); inp[target][i] = v ?? 0; valueChanged(); }, { "aria-label": `row ${i} ${target}` })),
    el("button", { type: "button", class: "small", title: "add a token at the end", onclick: () => { resizeRow(i, 1); }, text: "+ token" }),
    el("button", { type: "button", class: "small", title: "remove the last token", disabled: n <= 1, onclick: () => { resizeRow(i, -1); }, text: "− token" }),
    el("button", { type: "button", class: "small", title: "remove this row", disabled: req.per_token_logps.length <= 1, onclick: () => removeRow(i), text: "remove row" }),
  );
  return el("div", { class: "input-row" }, header, gridNode);
}

function setCell(name, i, j, value) {
  const inp = editableInput();
  const created = !inp[name];
  if (created) inp[name] = inp.per_token_logps.map((r) => r.slice());
  inp[name][i][j] = value ?? inp.per_token_logps[i][j];
  if (created) inputChanged(); // the other cells of the new field now show values
  else valueChanged();
}

const ROW_FIELDS = [...PER_TOKEN, "completion_mask", "tokens", "entropies"];

function resizeRow(i, delta) {
  const inp = editableInput();
  for (const name of ROW_FIELDS) {
    if (!inp[name]) continue;
    if (delta > 0) inp[name][i].push(name === "tokens" ? "" : name === "completion_mask" ? 1 : (inp[name][i].at(-1) ?? -1));
    else inp[name][i].pop();
  }
  inputChanged();
}

function addRow(inp) {
  const last = inp.per_token_logps.length - 1;
  for (const name of ROW_FIELDS) if (inp[name]) inp[name].push(inp[name][last].slice());
  for (const name of ["rewards", "advantages"]) if (inp[name]) inp[name].push(0);
  if (Array.isArray(inp.prompt_lengths)) inp.prompt_lengths.push(inp.prompt_lengths[last]);
  delete inp.group_size;
}

function removeRow(i) {
  const inp = editableInput();
  for (const name of [...ROW_FIELDS, "rewards", "advantages"]) if (inp[name]) inp[name].splice(i, 1);
  if (Array.isArray(inp.prompt_lengths)) inp.prompt_lengths.splice(i, 1);
  delete inp.group_size;
  state.row = -1;
  inputChanged();
}

function renderJSONBox() {
  if (uploadFile && !state.input) return;
  $("#json-box").value = JSON.stringify({ ...currentRequest(), config: state.config }, null, 1);
}

function applyJSON() {
  let body;
  try {
    body = JSON.parse($("#json-box").value);
  } catch (err) {
    $("#json-error").textContent = `Not valid JSON: ${err.message}`;
    return;
  }
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    $("#json-error").textContent = "Expected a JSON object with the /api/v1/loss fields.";
    return;
  }
  const { config, ...input } = body;
  if (config) state.config = { preset: "article", ...config };
  state.input = input;
  uploadFile = null;
  state.row = -1;
  renderInputTable();
  compute();
}

async function onUpload(file) {
  if (!file) return;
  $("#upload-error").textContent = "";
  if (file.name.toLowerCase().endsWith(".json")) {
    $("#json-box").value = await file.text();
    applyJSON();
    return;
  }
  uploadFile = file;
  state.input = null;
  state.row = -1;
  $("#upload-info").textContent = `${file.name}, ${file.size} bytes: evaluated by the server on every change.`;
  renderInputTable();
  compute();
}

function exportInput() {
  if (uploadFile && !state.input) {
    setStatus("This batch lives in the uploaded file; keep that file.", "error");
    return;
  }
  download("grpo-lens-input.json", JSON.stringify({ ...currentRequest(), config: state.config }, null, 1));
}

async function importInput(file) {
  if (!file) return;
  $("#json-box").value = await file.text();
  applyJSON();
}

function exportCSV() {
  if (!last) return;
  const t = last.tokens;
  const fields = ["ratio", "clipped_ratio", "surrogate", "kl", "weight", "loss", "grad", "grad_policy", "grad_kl"];
  const quote = (s) => `"${String(s).replace(/"/g, '""')}"`;
  const lines = [["row", "position", "token", "region", ...fields].join(",")];
  last.token_rows.forEach((row, k) => t.ratio[k].forEach((_, j) => {
    lines.push([row, j, quote(t.text ? t.text[k][j] : ""), t.region[k][j], ...fields.map((f) => t[f][k][j])].join(","));
  }));
  download("grpo-lens-breakdown.csv", lines.join("\n"), "text/csv");
}

// --- compare ---------------------------------------------------------------------------------------
let compareTimer = null;
function scheduleCompare() {
  clearTimeout(compareTimer);
  compareTimer = setTimeout(runCompare, 60);
}

function buildCompareChoices() {
  const box = $("#compare-presets");
  for (const p of options.presets) {
    const input = el("input", { type: "checkbox", value: p.name, checked: state.compare.includes(p.name) });
    input.addEventListener("change", () => {
      state.compare = options.presets.map((q) => q.name).filter((name) => box.querySelector(`input[value="${name}"]`).checked);
      writeURL();
      runCompare();
    });
    box.append(el("label", { class: "inline", title: p.doc }, input, p.name));
  }
  const edits = $("#compare-edits");
  edits.checked = state.compare_edits;
  edits.addEventListener("change", () => { state.compare_edits = edits.checked; writeURL(); runCompare(); });
}

async function runCompare() {
  if (!state.compare.length || (uploadFile && !state.input)) return;
  const { preset, ...edits } = state.config;
  const configs = state.compare.map((name) => ({ ...(state.compare_edits ? edits : {}), preset: name }));
  try {
    const data = await postJSON("compare", "/api/v1/compare", { ...currentRequest(), configs });
    if (!data) return;
    renderCompare(data);
  } catch (err) {
    clear($("#compare-table")).append(el("tr", {}, el("td", { class: "error", text: err.message })));
  }
}

function renderCompare(data) {
  const names = data.results.map((r) => r.config.preset);
  const rows = [
    ["loss", (r) => r.loss], ["policy part", (r) => r.policy_loss], ["KL part", (r) => r.kl_loss],
    ["clip_ratio/region_mean", (r) => r.metrics["clip_ratio/region_mean"]], ["kl", (r) => r.metrics.kl],
    ["lens/grad_norm_logps", (r) => r.metrics["lens/grad_norm_logps"]], ["aggregation", (r) => r.config.aggregation], ["objective", (r) => r.config.objective],
  ];
  const table = clear($("#compare-table"));
  table.append(el("thead", {}, el("tr", {}, el("th", { text: "" }), ...names.map((n) => el("th", { scope: "col", text: n })))));
  table.append(el("tbody", {}, ...rows.map(([label, get]) => el("tr", {}, el("td", { text: label }), ...data.results.map((r) => el("td", { class: "num", text: fmt(get(r), 5) }))))));
  plot("compare-rows", charts.compareRows(data.results, names));
  plot("compare-weights", charts.compareWeights(data.results, names, data.lengths));
  const tokens = data.lengths.reduce((a, b) => a + b, 0);
  if (tokens <= ALL_TOKENS_LIMIT && data.results[0].tokens_complete) plot("compare-grads", charts.compareGrads(data.results, names, data.text));
  document.body.dataset.compared = String((Number(document.body.dataset.compared) || 0) + 1);
}

// --- experiments and glossary ------------------------------------------------------------------------
async function loadExperiments() {
  const host = $("#experiments");
  const list = await getJSON("/api/v1/experiments");
  for (const item of list) {
    const exp = await getJSON(`/api/v1/experiments/${encodeURIComponent(item.name)}`);
    const chartId = `exp-${exp.name}`;
    const names = Object.keys(exp.series);
    const showTable = exp.x.length <= 12;
    const table = showTable
      ? el("table", {},
        el("thead", {}, el("tr", {}, el("th", { text: exp.x_label }), exp.reported.length ? el("th", { class: "num", text: "article printed" }) : null, ...names.map((n) => el("th", { class: "num", text: n })))),
        el("tbody", {}, ...exp.x.map((x, i) => el("tr", {}, el("td", { text: String(x) }), exp.reported.length ? el("td", { class: "num", text: exp.reported[i] ?? "" }) : null, ...names.map((n) => el("td", { class: "num", text: fmt(exp.series[n][i], 6) }))))))
      : null;
    host.append(el("article", { class: "experiment", id: `experiment-${exp.name}` },
      el("h3", { text: exp.title }),
      el("p", { class: "claim", text: `Article: ${exp.article}` }),
      el("p", { text: exp.explanation }),
      el("div", { class: "chart", id: chartId }),
      table));
    plot(chartId, charts.experimentChart(exp));
  }
  document.body.dataset.experiments = String(list.length);
}

function buildGlossary() {
  const table = clear($("#glossary-table"));
  table.append(el("thead", {}, el("tr", {}, ...["TRL", "verl", "OpenRLHF", "what it means", "healthy"].map((h) => el("th", { scope: "col", text: h })))));
  table.append(el("tbody", {}, ...options.glossary.map((g) => el("tr", {}, el("td", { text: g.trl }), el("td", { text: g.verl }), el("td", { text: g.openrlhf }), el("td", { text: g.meaning }), el("td", { text: g.healthy })))));
}

// --- scenarios ---------------------------------------------------------------------------------------
function buildScenarios() {
  const select = clear($("#scenario"));
  for (const s of options.scenarios) select.append(el("option", { value: s.name, text: s.title }));
  select.value = state.scenario;
  select.addEventListener("change", () => {
    const s = scenarios().get(select.value);
    state.scenario = s.name;
    state.input = null;
    uploadFile = null;
    state.row = -1;
    state.config = { preset: s.preset, ...s.overrides };
    renderScenarioNotes();
    renderInputTable();
    renderJSONBox();
    compute();
  });
}

function renderScenarioNotes() {
  const s = scenarios().get(state.scenario);
  $("#scenario-title").textContent = s ? s.title + (state.input ? " (edited)" : "") : "Your batch";
  $("#scenario-text").textContent = s ? s.notes : "";
}

function setupTabs() {
  const tabs = ["table", "json", "upload"];
  for (const name of tabs) {
    $(`#tab-${name}`).addEventListener("click", () => {
      for (const other of tabs) {
        $(`#tab-${other}`).setAttribute("aria-selected", String(other === name));
        $(`#input-${other}`).hidden = other !== name;
      }
    });
  }
}

async function init() {
  options = await getJSON("/api/v1/options");
  readURL(options.fields);
  if (!scenarios().has(state.scenario)) state.scenario = "article";
  buildScenarios();
  buildControls();
  buildCompareChoices();
  buildGlossary();
  setupTabs();
  renderScenarioNotes();
  renderInputTable();
  renderJSONBox();
  $("#preset").addEventListener("change", (e) => { state.config = { preset: e.target.value }; compute(); });
  for (const id of ["#contrib-row", "#grad-row"]) $(id).addEventListener("change", (e) => pickRow(Number(e.target.value)));
  $("#apply-json").addEventListener("click", applyJSON);
  $("#upload-file").addEventListener("change", (e) => onUpload(e.target.files[0]));
  $("#import-input").addEventListener("change", (e) => importInput(e.target.files[0]));
  $("#export-input").addEventListener("click", exportInput);
  $("#export-json").addEventListener("click", () => last && download("grpo-lens-breakdown.json", JSON.stringify(last)));
  $("#export-csv").addEventListener("click", exportCSV);
  $("#copy-link").addEventListener("click", async () => {
    const fits = writeURL();
    try { await navigator.clipboard.writeText(location.href); setStatus(fits ? "link copied" : "link copied (settings only: the input is too large; export it)"); } catch { setStatus("copy the address bar: it holds the whole view"); }
  });
  await compute();
  loadExperiments().catch((err) => { $("#experiments").textContent = `Could not load the experiments: ${err.message}`; });
}

window.grpoLens = { state, get last() { return last; } };
function start() {
  init().catch((err) => setStatus(`error: ${err.message}`, "error"));
}
if (window.Plotly) start();
else window.addEventListener("load", start);
