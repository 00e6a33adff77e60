// The views of one /api/v1/loss response: summary, per-token charts, the rows table.

import { clipCurves } from "./charts/clipping.js";
import { heatmap, heatmapSpecs, hoverData } from "./charts/heatmaps.js";
import { contributionRows, contributionTokens, gradientTokens } from "./charts/tokens.js";
import { $, clear, el, plot } from "./dom.js";
import { fmt, pct, tagged } from "./format.js";
import { LABELS, ROWS, SUMMARY, SUMMARY_CARDS } from "./labels.js";
import * as redraw from "./redraw.js";
import { state } from "./state.js";

const ALL_TOKENS_LIMIT = 400; // tokens: per-token bar charts show every row up to this

// A sentence from the server with each of its numbers in a span that says which quantity it shows.
export function sentence(parts, tag = "li", attrs = {}) {
  return el(
    tag,
    attrs,
    ...parts.map((p) =>
      typeof p === "string" ? p : el("span", { class: "num-inline", text: p.text, ...tagged(p.quantity, p.value) }),
    ),
  );
}

// A sentence's text: its pieces and its numbers' text, joined (what the page shows).
const sentenceText = (parts) => parts.map((p) => (typeof p === "string" ? p : p.text)).join("");

export function renderSummary(data) {
  const card = (key, label) =>
    el(
      "div",
      { class: "card" },
      el("div", { class: "label", text: label }),
      el("div", { class: "value", text: fmt(data[key], 5), ...tagged(key, data[key]) }),
    );
  clear($("#summary-cards")).append(...SUMMARY_CARDS.map(([key, label]) => card(key, label)));
  clear($("#explanation")).append(...data.explanation_parts.map((parts) => sentence(parts)));
  // the warnings (the engine's and the upload's) with each number tagged with its quantity, as the explanation's
  clear($("#warnings")).append(...data.warning_sentences.map((s) => sentence(s.parts)));
  // Each metric's meaning under this config (the server's, with the config's numbers); a meaning
  // shared by several keys is written on its first row. Only the metrics the config's trainer logs
  // (metrics_logged, from the objectives' registry entries): metrics holds every objective's, 0 where not its own.
  const explained = new Set();
  clear($("#metrics-table tbody")).append(
    ...data.metrics_logged.map((name) => {
      const value = data.metrics[name];
      const parts = data.metric_meaning_parts[name] || [];
      const meaning = sentenceText(parts);
      const text = explained.has(meaning) ? "" : meaning;
      explained.add(meaning);
      return el(
        "tr",
        { title: meaning || undefined },
        el("td", { text: name }),
        el("td", { class: "num", text: fmt(value, 5), ...tagged(`metrics/${name}`, value) }),
        text ? sentence(parts, "td", { class: "muted" }) : el("td", { class: "muted" }),
      );
    }),
  );
  const touched = Object.entries(data.clamp_counts).filter(([, n]) => n > 0);
  const counts = $("#clamp-counts");
  if (!touched.length) counts.textContent = SUMMARY.noClamp;
  else {
    clear(counts).append(
      SUMMARY.clampsHead,
      ...touched.flatMap(([k, n], i) => [
        i ? ", " : "",
        `${k} `,
        el("span", { class: "num-inline", text: String(n), ...tagged(`clamp_counts/${k}`, n) }),
      ]),
      ".",
    );
  }
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
    if (small) select.append(el("option", { value: -1, text: ROWS.allRows, selected: state.row < 0 }));
    data.rows.loss.forEach((_, i) =>
      select.append(el("option", { value: i, text: ROWS.rowN(i), selected: i === state.row })),
    );
  }
}

// Hover data is built once per response and shared by the heatmaps.
function hoverOf(data) {
  const { hovers } = state.ui;
  if (!hovers.has(data)) hovers.set(data, hoverData(data, state.ui.options.token_fields));
  return hovers.get(data);
}

// A heatmap per token field with a centre (the server's table, options.token_fields).
function heatmapViews() {
  const fields = state.ui.options.token_fields;
  return heatmapSpecs(fields).map((spec) => [
    `heat-${spec.field}`,
    (data) =>
      plot(
        `heat-${spec.field}`,
        heatmap(data, spec, () => hoverOf(data), fields),
      ),
  ]);
}

// The chart views of a /api/v1/loss response: element id -> how it is drawn.
// [element id, draw(answer), the section to make the element in when templates/index.html has none]
const CHART_VIEWS = [
  ["contrib-rows", (data) => plot("contrib-rows", contributionRows(data))],
  ["contrib-tokens", (data) => plot("contrib-tokens", contributionTokens(data, tokenRowsShown(data)))],
  ["grad-tokens", (data) => plot("grad-tokens", gradientTokens(data, tokenRowsShown(data)))],
  ["clip-curves", (data) => plot("clip-curves", clipCurves(data, state.ui.options))],
];

export function setup() {
  setupRowsTable();
  const host = $("#heatmaps");
  const heatmaps = heatmapViews();
  for (const [id] of heatmaps) host.append(el("div", { class: "chart heatmap", id }));
  for (const [id, draw, within] of [...heatmaps, ...CHART_VIEWS]) {
    // a chart the page's template does not hold gets its element here, at the end of its section
    if (within && !document.getElementById(id)) $(within).append(el("div", { class: "chart", id }));
    redraw.register(id, "loss", draw);
  }
}

// A new response: the DOM views at once, the charts on screen now and the others when seen.
export function renderViews(data) {
  const note = $("#large-note");
  note.hidden = data.tokens_complete;
  note.textContent = data.tokens_complete ? "" : SUMMARY.largeBatch(data.num_positions, data.token_rows[0]);
  fillRowPickers(data);
  return redraw.publish("loss", data);
}

// --- rows table ---------------------------------------------------------------------------------
// One row per completion. Past VIRTUAL_ROWS, the table scrolls in a box of its own and holds only
// the rows in and near its window, between two spacer rows that keep the scroll height (a run's
// step can have thousands of completions). Its columns are the answer's per-row fields, in the
// answer's order (grpo/answer.py ROW_FIELDS): a field the server adds is a column without an edit here.
const VIRTUAL_ROWS = 200;
const OVERSCAN = 15; // rows drawn beyond each edge of the window

const rowsView = state.ui.rowsTable; // this module's state (state.js): the rows table's window

// A run step's rows as the run recorded them (its groups and rewards, display data of the step file), for the
// rows table: the breakdown is drawn as /api/v1/loss answers it, which knows neither. `step`: the step endpoint's
// answer; a list that does not cover every row is left out.
export function recordedRows(step) {
  const n = step.breakdown.rows.loss.length;
  const out = {};
  if (step.row_groups?.length === n) out.group = step.row_groups;
  if (step.row_rewards?.length === n) out.reward = step.row_rewards;
  return out;
}

// A token's region as the page names it: which bound of the objective acted on it, by the server's why codes
// ("unbounded" for a ratio past the trust region that no clip holds, where the region code says "trust"):
// tokens.bound where A = 0, a mask or a correction is the token's why, else tokens.why. `k`: the position in
// data.token_rows.
export function regionName(data, k, j) {
  const t = data.tokens;
  return data.why.names[(t.bound ?? t.why)[k][j]];
}

export function renderRowsTable(answer) {
  const data = { ...answer, rows: { ...answer.rows, ...state.ui.recordedRows } };
  const sort = state.ui.rowSort;
  const wrap = $("#rows-wrap");
  // Kept across a redraw. Only a virtual table scrolls in its own box: reading a small one's geometry
  // would lay out the whole page in the middle of the first view.
  const scrolls = wrap.classList.contains("virtual");
  const [top, height] = scrolls ? [wrap.scrollTop, wrap.clientHeight] : [0, 0];
  const table = clear($("#rows-table"));
  const head = el("tr", { "aria-rowindex": 1 }, el("th", { scope: "col", text: ROWS.row }));
  const columns = Object.keys(data.rows);
  for (const key of columns) {
    const th = el("th", {
      scope: "col",
      class: "num",
      tabindex: 0,
      text: LABELS[key] || key,
      "aria-sort": sort.key === key ? (sort.dir > 0 ? "ascending" : "descending") : "none",
    });
    const resort = () => {
      state.ui.rowSort = { key, dir: sort.key === key ? -sort.dir : 1 };
      renderRowsTable(answer);
    };
    th.addEventListener("click", resort);
    th.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        resort();
      }
    });
    head.append(th);
  }
  table.append(el("thead", {}, head), el("tbody"));
  const order = data.rows.loss.map((_, i) => i);
  if (sort.key) {
    const v = data.rows[sort.key] || [];
    order.sort((a, b) => ((v[a] ?? -Infinity) - (v[b] ?? -Infinity)) * sort.dir);
  }
  table.setAttribute("aria-rowcount", String(order.length + 1));
  Object.assign(rowsView, { data, columns, order, first: -1 });
  wrap.classList.toggle("virtual", order.length > VIRTUAL_ROWS);
  fillRows(top, scrolls || order.length <= VIRTUAL_ROWS ? height : wrap.clientHeight); // a box of its own from now
  if (scrolls) wrap.scrollTop = top;
}

function rowNode(data, i, position) {
  const cells = rowsView.columns.map((key) => {
    const v = data.rows[key] ? data.rows[key][i] : null;
    const text = key === "clip_fraction" ? pct(v) : key === "advantage" ? advantageText(data, i, v) : fmt(v);
    return el("td", { class: "num", text, ...tagged(`rows/${key}/${i}`, v) });
  });
  const pick = () => state.ui.actions.pickRow(i);
  return el(
    "tr",
    {
      class: i === state.row ? "selected" : "",
      tabindex: 0,
      "aria-rowindex": position + 2,
      onclick: pick,
      onkeydown: (e) => {
        if (e.key === "Enter") pick();
      },
    },
    el("td", { text: String(i), ...tagged(`rows/index/${i}`, i) }),
    ...cells,
  );
}

// A row's advantage: its value, or where the batch gave it per token and its tokens differ, the row's mean
// and range (the server's numbers: answer.advantage_per_token).
function advantageText(data, i, v) {
  const spread = data.advantage_per_token;
  if (!spread || !spread.varies[i]) return fmt(v);
  return ROWS.perTokenAdvantage(fmt(v), fmt(spread.min[i]), fmt(spread.max[i]));
}

function spacer(rows) {
  const tr = el("tr", { class: "spacer", "aria-hidden": "true" }, el("td", { colspan: rowsView.columns.length + 1 }));
  tr.style.height = `${rows * (rowsView.rowHeight || 30)}px`;
  return tr;
}

// The tbody: every row of a small table; else the window's rows (from the box's scroll position).
// `top` and `height`: the box's scroll position and height, read before its rows go (it would clamp).
function fillRows(top, height) {
  const { data, order } = rowsView;
  const body = $("#rows-table tbody");
  if (order.length <= VIRTUAL_ROWS) {
    clear(body).append(...order.map((i, k) => rowNode(data, i, k)));
    return;
  }
  if (!rowsView.rowHeight) {
    // measured once, from a real row (not while the table is not laid out)
    const probe = rowNode(data, order[0], 0);
    body.append(probe);
    rowsView.rowHeight = probe.getBoundingClientRect().height;
    probe.remove();
  }
  const h = rowsView.rowHeight || 30;
  const first = Math.max(0, Math.min(order.length - 1, Math.floor(top / h) - OVERSCAN));
  const last = Math.min(order.length, first + Math.ceil(height / h) + 2 * OVERSCAN);
  clear(body);
  rowsView.first = first;
  body.append(
    spacer(first),
    ...order.slice(first, last).map((i, k) => rowNode(data, i, first + k)),
    spacer(order.length - last),
  );
}

// Scrolling the box redraws the window once per frame, when it has moved by a few rows.
export function setupRowsTable() {
  const wrap = $("#rows-wrap");
  wrap.addEventListener(
    "scroll",
    () => {
      if (rowsView.scheduled || rowsView.order.length <= VIRTUAL_ROWS) return;
      rowsView.scheduled = true;
      requestAnimationFrame(() => {
        rowsView.scheduled = false;
        const first = Math.max(0, Math.floor(wrap.scrollTop / (rowsView.rowHeight || 30)) - OVERSCAN);
        if (Math.abs(first - rowsView.first) >= OVERSCAN / 3) fillRows(wrap.scrollTop, wrap.clientHeight);
      });
    },
    { passive: true },
  );
}
