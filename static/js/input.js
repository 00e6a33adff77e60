// The input editor: scenario picker, table editor, JSON box, file upload, import and export.

import { $, clear, download, el, setStatus } from "./dom.js";
import { CELL_LABELS, INPUT, SCENARIO, UPLOAD } from "./labels.js";
import { postForFile } from "./api.js";
import { currentRequest, fromUpload, load, scenarios, state } from "./state.js";

const TABLE_EDIT_LIMIT = 400; // tokens: past this, edit as JSON or upload a file
// The per-token fields of a batch, as /api/v1/options lists them (shape "token"): each is a row of cells.
const tokenFields = () => state.ui.options.batch_fields.filter((f) => f.shape === "token");
const rowFields = () => [...tokenFields().map((f) => f.name), "tokens"];
// The log-prob fields the table always shows (an empty cell reads "= logp"); every other per-token field
// (the sampler's log-probs, entropies, masks...) only when the batch has it, added from the "add a field" menu.
const ALWAYS_SHOWN = new Set(["per_token_logps", "old_per_token_logps", "ref_per_token_logps"]);
const cellLabel = (name) => CELL_LABELS[name] ?? name;
// A new field's cells: a mask counts every token (1), a log-prob field starts at logp, any other at 0.
const startValue = (field, logp) => (field.dtype === "mask" ? 1 : CELL_LABELS[field.name] ? logp : 0);

export function setup() {
  buildScenarios();
  setupTabs();
  renderScenarioNotes();
  renderInputTable();
  renderJSONBox();
  $("#apply-json").addEventListener("click", () => applyJSON());
  $("#upload-file").addEventListener("change", (e) => onUpload(e.target.files[0]));
  $("#import-input").addEventListener("change", (e) => importInput(e.target.files[0]));
  $("#export-input").addEventListener("click", exportInput);
  buildFormats();
  buildUploadHelp();
}

// The formats come from /api/v1/options: the upload's label and accepted extensions, and one export
// button per format the server writes (JSON is "Export input", written here with the settings).
const formats = () => state.ui.options.formats.upload;

function buildFormats() {
  const labels = formats().map((f) => f.label);
  $("#upload-label").textContent = UPLOAD.fileLabel(`${labels.slice(0, -1).join(", ")} or ${labels.at(-1)}`);
  $("#upload-file").setAttribute("accept", state.ui.options.formats.accept);
  const exports = formats().filter((f) => f.export && f.name !== "json");
  clear($("#export-formats")).append(
    ...exports.map((f) =>
      el("button", {
        type: "button",
        id: `export-${f.name}`,
        title: UPLOAD.exportTitle(f.label),
        text: f.extensions[0],
        onclick: () => exportFile(f.name),
      }),
    ),
  );
}

// The tensors a file may hold: the batch's fields (from /api/v1/options), then display text and logits.
const uploadFields = () => [
  ...state.ui.options.batch_fields.map((f) => [f.name, UPLOAD.shape(f), UPLOAD.dtype(f), UPLOAD.doc(f)]),
  ...UPLOAD.moreFields,
];

// The upload tab lists the tensors a file may hold, links an example of each format, and says
// what lower-precision inputs mean.
function buildUploadHelp() {
  const table = el(
    "table",
    { class: "metrics upload-fields" },
    el("thead", {}, el("tr", {}, ...UPLOAD.head.map((h) => el("th", { scope: "col", text: h })))),
    el("tbody", {}, ...uploadFields().map((row) => el("tr", {}, ...row.map((text) => el("td", { text }))))),
  );
  const links = formats()
    .filter((f) => f.export)
    .map((f) =>
      el("a", { href: `/api/v1/examples/${f.name}`, download: `grpo-lens-example${f.extensions[0]}`, text: f.name }),
    );
  clear($("#upload-help")).append(
    table,
    el("p", { class: "muted", text: UPLOAD.precision }),
    el("p", {}, UPLOAD.examples, " ", ...links.flatMap((a, i) => (i ? [" · ", a] : [a]))),
  );
}

// safetensors and NPZ are written by the server (POST /api/v1/export/{fmt}), JSON here.
async function exportFile(fmt) {
  if (fromUpload()) {
    setStatus(INPUT.fileHoldsBatch, "error");
    return;
  }
  try {
    download(
      `grpo-lens-input.${fmt}`,
      await postForFile(`/api/v1/export/${fmt}`, currentRequest()),
      "application/octet-stream",
    );
  } catch (err) {
    setStatus(INPUT.exportFailed(fmt, err.message), "error");
  }
}

// The first edit loads the batch on screen as an edited one (the table already shows it).
function editableInput() {
  if (!state.input || state.ui.origin.kind !== "edited") {
    load({ input: state.input ?? structuredClone(currentRequest()), row: state.row }, { kind: "edited", name: "" });
  }
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
  state.ui.actions.recompute(250);
}

function numberCell(value, onValue, attrs = {}) {
  const input = el("input", { type: "number", step: "any", value: value ?? "", ...attrs });
  input.addEventListener("change", () => onValue(input.value === "" ? null : Number(input.value)));
  return input;
}

export function renderInputTable() {
  const host = clear($("#input-table"));
  if (fromUpload()) {
    host.append(el("p", { class: "muted", text: INPUT.fromFile(state.ui.uploadFile.name) }));
    return;
  }
  const req = currentRequest();
  const rows = req.per_token_logps;
  const total = rows.reduce((n, r) => n + r.length, 0);
  if (total > TABLE_EDIT_LIMIT) {
    host.append(el("p", { class: "muted", text: INPUT.tooLarge(rows.length, total) }));
    return;
  }
  const target = req.rewards ? "rewards" : "advantages";
  const prompt = Array.isArray(req.prompt_lengths) ? req.prompt_lengths : rows.map(() => req.prompt_lengths || 0);
  const meta = el(
    "div",
    { class: "batch-meta" },
    el("label", { for: "in-target", text: INPUT.perRow }),
    el(
      "select",
      { id: "in-target", onchange: (e) => switchTarget(e.target.value, rows) },
      el("option", { value: "rewards", text: INPUT.targetRewards, selected: target === "rewards" }),
      el("option", { value: "advantages", text: INPUT.targetAdvantages, selected: target === "advantages" }),
    ),
    el("label", { for: "in-group", text: INPUT.groupSize }),
    numberCell(
      req.group_size ?? "",
      (v) => {
        const inp = editableInput();
        if (v) inp.group_size = v;
        else delete inp.group_size;
        inputChanged();
      },
      { id: "in-group", min: 1, step: 1, placeholder: INPUT.groupSizeAll },
    ),
  );
  host.append(meta, addFieldMenu(req));
  rows.forEach((row, i) => host.append(inputRow(req, row, i, target, prompt[i])));
  host.append(
    el(
      "div",
      { class: "row-buttons" },
      el("button", {
        type: "button",
        onclick: () => {
          const inp = editableInput();
          addRow(inp);
          inputChanged();
        },
        text: INPUT.addRow,
      }),
    ),
  );
}

// Rewards -> advantages carries the advantages the server computed for this batch (not the raw
// rewards); advantages -> rewards carries the rewards it was given, if any. The loss stays the same.
function switchTarget(target, rows) {
  const inp = editableInput();
  const other = target === "rewards" ? "advantages" : "rewards";
  const last = state.ui.last;
  const computed =
    last && last.rows.advantage.length === rows.length
      ? last.rows[target === "advantages" ? "advantage" : "reward"]
      : null;
  inp[target] =
    (computed && computed.every((v) => v !== null) ? computed.slice() : null) || inp[other] || rows.map(() => 0);
  delete inp[other];
  inputChanged();
}

function inputRow(req, row, i, target, promptLength) {
  const n = row.length;
  const gridNode = el("div", { class: "tok-grid", style: `--n:${n}` });
  gridNode.append(el("span", { class: "lab", text: INPUT.token }));
  for (let j = 0; j < n; j += 1) {
    const text = el("input", {
      type: "text",
      class: `tok-text ${j < promptLength ? "prompt" : ""}`,
      value: req.tokens ? req.tokens[i][j] : "",
      "aria-label": `row ${i} token ${j} text`,
      title: j < promptLength ? INPUT.tokenPrompt : "",
    });
    text.addEventListener("change", () => {
      const inp = editableInput();
      if (!inp.tokens) inp.tokens = inp.per_token_logps.map((r) => r.map(() => ""));
      inp.tokens[i][j] = text.value;
      valueChanged();
    });
    gridNode.append(text);
  }
  for (const field of tokenFields()) {
    const { name } = field;
    if (!ALWAYS_SHOWN.has(name) && !req[name]) continue;
    gridNode.append(el("span", { class: "lab", text: cellLabel(name), title: field.doc }));
    const bounds = field.dtype === "mask" ? { min: 0, max: 1, step: 1 } : CELL_LABELS[name] ? { max: 0 } : {};
    for (let j = 0; j < n; j += 1) {
      const values = req[name];
      gridNode.append(
        numberCell(values ? values[i][j] : "", (v) => setCell(field, i, j, v), {
          ...bounds,
          "aria-label": `row ${i} ${cellLabel(name)} ${j}`,
          placeholder: values ? "" : INPUT.sameAsLogp,
          class: j < promptLength ? "prompt" : "",
        }),
      );
    }
  }
  const header = el(
    "header",
    {},
    el("strong", { text: `row ${i}` }),
    el(
      "label",
      { text: target === "rewards" ? INPUT.reward : INPUT.advantage },
      // a list (advantages per token, rewards per reward function) is edited in the JSON tab, not here
      Array.isArray(req[target][i])
        ? el("span", { class: "muted", text: INPUT.listValue(target, req[target][i].length) })
        : numberCell(
            req[target][i],
            (v) => {
              const inp = editableInput();
              inp[target][i] = v ?? 0;
              valueChanged();
            },
            { "aria-label": `row ${i} ${target}` },
          ),
    ),
    el("button", {
      type: "button",
      class: "small",
      title: INPUT.addTokenTitle,
      onclick: () => {
        resizeRow(i, 1);
      },
      text: INPUT.addToken,
    }),
    el("button", {
      type: "button",
      class: "small",
      title: INPUT.removeTokenTitle,
      disabled: n <= 1,
      onclick: () => {
        resizeRow(i, -1);
      },
      text: INPUT.removeToken,
    }),
    el("button", {
      type: "button",
      class: "small",
      title: INPUT.removeRowTitle,
      disabled: req.per_token_logps.length <= 1,
      onclick: () => removeRow(i),
      text: INPUT.removeRow,
    }),
  );
  return el("div", { class: "input-row" }, header, gridNode);
}

function setCell(field, i, j, value) {
  const inp = editableInput();
  const { name } = field;
  const created = !inp[name];
  if (created) inp[name] = inp.per_token_logps.map((r) => r.map((logp) => startValue(field, logp)));
  inp[name][i][j] = value ?? startValue(field, inp.per_token_logps[i][j]);
  if (created)
    inputChanged(); // the other cells of the new field now show values
  else valueChanged();
}

// The per-token fields the batch does not have yet (entropies, the sampler's log-probs, masks...): picking
// one adds its row of cells to every row, filled with its start value, for editing here rather than as JSON.
function addFieldMenu(req) {
  const absent = tokenFields().filter((f) => !ALWAYS_SHOWN.has(f.name) && !req[f.name]);
  if (!absent.length) return el("span");
  const select = el(
    "select",
    { id: "in-add-field", "aria-label": INPUT.addField },
    el("option", { value: "", text: INPUT.addField }),
    ...absent.map((f) => el("option", { value: f.name, text: cellLabel(f.name), title: f.doc })),
  );
  select.addEventListener("change", () => {
    const field = absent.find((f) => f.name === select.value);
    if (!field) return;
    const inp = editableInput();
    inp[field.name] = inp.per_token_logps.map((r) => r.map((logp) => startValue(field, logp)));
    inputChanged();
  });
  return el("div", { class: "add-field" }, select, el("span", { class: "muted", text: INPUT.addFieldNote }));
}

function resizeRow(i, delta) {
  const inp = editableInput();
  const masks = new Set(
    tokenFields()
      .filter((f) => f.dtype === "mask")
      .map((f) => f.name),
  );
  for (const name of rowFields()) {
    if (!inp[name]) continue;
    if (delta > 0) inp[name][i].push(name === "tokens" ? "" : masks.has(name) ? 1 : (inp[name][i].at(-1) ?? -1));
    else inp[name][i].pop();
  }
  const perToken = inp.advantages && Array.isArray(inp.advantages[i]) ? inp.advantages[i] : null;
  if (perToken && delta > 0)
    perToken.push(perToken.at(-1) ?? 0); // a token's own advantage: its row's last
  else if (perToken) perToken.pop();
  inputChanged();
}

function addRow(inp) {
  const last = inp.per_token_logps.length - 1;
  for (const name of rowFields()) if (inp[name]) inp[name].push(inp[name][last].slice());
  for (const name of ["rewards", "advantages"]) {
    if (inp[name]) inp[name].push(Array.isArray(inp[name][last]) ? inp[name][last].map(() => 0) : 0);
  }
  if (Array.isArray(inp.prompt_lengths)) inp.prompt_lengths.push(inp.prompt_lengths[last]);
  delete inp.group_size;
}

function removeRow(i) {
  const inp = editableInput();
  for (const name of [...rowFields(), "rewards", "advantages"]) if (inp[name]) inp[name].splice(i, 1);
  if (Array.isArray(inp.prompt_lengths)) inp.prompt_lengths.splice(i, 1);
  delete inp.group_size;
  state.row = -1;
  inputChanged();
}

export function renderJSONBox() {
  if (fromUpload()) return;
  $("#json-box").value = JSON.stringify({ ...currentRequest(), config: state.config }, null, 1);
}

const FROM_JSON_BOX = new Set(["json", "import", "upload"]); // read from the box's text (or a binary file: no text)

function applyJSON(origin = { kind: "json", name: "" }) {
  let body;
  try {
    body = JSON.parse($("#json-box").value);
  } catch (err) {
    $("#json-error").textContent = INPUT.notJSON(err.message);
    return;
  }
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    $("#json-error").textContent = INPUT.notObject;
    return;
  }
  const { config, ...input } = body;
  load({ input, config }, origin);
}

async function onUpload(file) {
  if (!file) return;
  $("#upload-error").textContent = "";
  const json = formats().find((f) => f.name === "json").extensions; // the request's own text: into the JSON box
  if (json.some((ext) => file.name.toLowerCase().endsWith(ext))) {
    $("#json-box").value = await file.text();
    applyJSON({ kind: "upload", name: file.name });
    return;
  }
  $("#upload-info").textContent = INPUT.uploaded(file.name, file.size);
  load({ file }, { kind: "upload", name: file.name });
}

function exportInput() {
  if (fromUpload()) {
    setStatus(INPUT.fileHoldsBatch, "error");
    return;
  }
  download("grpo-lens-input.json", JSON.stringify({ ...currentRequest(), config: state.config }, null, 1));
}

async function importInput(file) {
  if (!file) return;
  $("#json-box").value = await file.text();
  applyJSON({ kind: "import", name: file.name });
}

// --- scenarios and tabs -------------------------------------------------------------------------
function buildScenarios() {
  const select = clear($("#scenario"));
  for (const s of state.ui.options.scenarios) select.append(el("option", { value: s.name, text: s.title }));
  select.value = state.scenario;
  select.addEventListener("change", () => {
    const s = scenarios().get(select.value);
    load({ scenario: s.name, config: { preset: s.preset, ...s.overrides } }, { kind: "scenario", name: "" });
  });
}

// After a load: the views of the input show the new batch, except the one it came from (a table
// redrawn under the cell being edited would lose the focus; a pasted JSON text keeps its layout).
export function showLoaded(origin) {
  renderScenarioNotes();
  if (origin.kind !== "edited") renderInputTable();
  if (!FROM_JSON_BOX.has(origin.kind)) renderJSONBox();
}

// The notes and the header name what is loaded: a scenario, an edited one, a JSON batch, a file.
export function renderScenarioNotes() {
  const s = scenarios().get(state.scenario);
  const { kind, name } = state.ui.origin;
  const title = s ? s.title : SCENARIO.yourBatch;
  const text = {
    scenario: [title, s && !ownSettings(s) ? SCENARIO.otherSettings(s.preset, settingsText()) : s ? s.notes : ""],
    edited: [title + SCENARIO.edited, SCENARIO.editedNote],
    json: [SCENARIO.json, SCENARIO.jsonNote],
    import: [SCENARIO.file(name), SCENARIO.importNote],
    upload: [SCENARIO.file(name), SCENARIO.uploadNote],
    step: [name, state.ui.origin.note || ""], // a run's step (captured or lab)
  }[kind];
  $("#scenario-title").textContent = text[0];
  $("#scenario-text").textContent = text[1];
  $("#loaded").textContent = loadedText();
  showScenarioMenu(kind);
}

// "Loaded: ..." for what state.ui.origin names.
export function loadedText() {
  const s = scenarios().get(state.scenario);
  const { kind, name } = state.ui.origin;
  return SCENARIO.loaded(kind, s ? s.title : SCENARIO.yourBatch, name);
}

// The scenario menu names the scenario only while one is loaded (edited or not); else an entry saying what is.
function showScenarioMenu(kind) {
  const select = $("#scenario");
  const shown = ["scenario", "edited"].includes(kind) && scenarios().has(state.scenario);
  let none = select.querySelector("option[value='']");
  if (!shown && !none) {
    none = el("option", { value: "", disabled: true });
    select.prepend(none);
  }
  if (none) {
    none.hidden = shown;
    none.textContent = SCENARIO.none(kind);
  }
  select.value = shown ? state.scenario : "";
}

// Whether the page's settings are the scenario's own (its preset and overrides): its notes describe only those.
function ownSettings(s) {
  const own = { preset: s.preset, ...s.overrides };
  const keys = new Set([...Object.keys(own), ...Object.keys(state.config)]);
  return [...keys].every((k) => JSON.stringify(own[k] ?? null) === JSON.stringify(state.config[k] ?? null));
}

const settingsText = () =>
  Object.entries(state.config)
    .map(([k, v]) => (k === "preset" ? `preset ${v}` : `${k} = ${v}`))
    .join(", ");

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
