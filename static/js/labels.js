// Every label the page writes itself (the server's sentences and docs come with the data): one
// place, so a name is spelled once and a display text changes in one line.

// Display labels for the API's field names.
export const LABELS = {
  ratio: "ratio π/π_old",
  clipped_ratio: "clipped ratio",
  surrogate: "surrogate (objective term)",
  kl: "KL estimate",
  weight: "aggregation weight",
  loss: "loss share",
  grad: "∂loss/∂logp",
  grad_policy: "∂loss/∂logp, policy part",
  grad_kl: "∂loss/∂logp, KL part",
  policy_loss: "policy part",
  kl_loss: "KL part (β·KL)",
  advantage: "advantage",
  reward: "reward",
  length: "tokens",
  sequence_ratio: "sequence ratio",
  clip_fraction: "clipped tokens",
  group: "group",
  objective: "objective J = −loss",
  clippedCell: "clipped (flat: no policy gradient)",
  correctedCell: "dropped or rejected by the rollout correction",
  rowCounted: (i, n) => `r${i} (${n})`,
  rowCountedAxis: "row (counted tokens)",
  compareGradsTitle:
    "∂loss/∂logp per token, per preset (each panel its own scale; axes flipped: up = gradient descent raises the log-prob)",
  gradAxis: "∂loss/∂logp, flipped: up = descent raises the log-prob",
  gradAxisShort: "∂loss/∂logp ↑ raises logp",
  compareWeightsTitle: "Weight of one token of each row, per preset (each panel its own scale)",
};

export const COMPARE = {
  lengthsHead: "What each weighting does to long vs short answers:",
  normaliser: "max_completion_length (L): Dr. GRPO's constant, for every compared preset",
  normaliserOwn: "each preset's own",
};

// The Mismatch view (mismatch.js): its own words; the numbers and sentences are the server's.
export const MISMATCH = {
  empty:
    "No sampler log-probs in this batch, and no rollout correction acted: nothing to compare. Give " +
    "sampling_per_token_logps (verl: rollout_log_probs), or open a mismatch scenario.",
  noPairs:
    "No sampler log-probs in this batch: no token pairs to draw (the off-policy mask measured old against current).",
  thresholdsHead: "Thresholds in force: ",
  noThresholds: "No threshold in force: no rollout correction is chosen.",
};

export const HEATMAP_TITLES = {
  ratio: "Importance ratio π/π_old (white at 1; the colour saturates outside 0 to 2)",
  surrogate: "Surrogate: each token's objective term (white at 0)",
  kl: "KL estimate to the reference (white at 0; blue = negative, which only k1 can be)",
  loss: "Weighted loss share (sums to the loss; white at 0)",
  grad: "Gradient ∂loss/∂logp (white at 0; blue, negative: descent raises the log-prob)",
};

// A pooled heatmap (app/responses.py pools grids with more cells than pixels) says so.
export const POOLED = {
  title: (title, rows, positions, mid) =>
    `${title.replace(/ \(.*\)$/, "")} · pooled by ${rows === 1 ? "" : `${rows} rows × `}${positions} positions: each cell its token farthest from ${mid}`,
  rows: (first, last) => (first === last ? `row ${first}` : `rows ${first}–${last}`),
  positions: (first, last) => (first === last ? `position ${first}` : `positions ${first}–${last}`),
  hover: (field) =>
    `%{y}, %{customdata[0]}<br>${field} %{customdata[2]}: the farthest from the centre of %{customdata[1]} counted tokens<extra></extra>`,
};

// The heatmaps' hover: the token's why (the server's sentence for its code, with the config's numbers)
// and its numbers, each formatted by format.js. Under GSPO the token's own ratio is shown beside its row's.
export const HOVER = {
  ratio: (ratio, tokenRatio) =>
    tokenRatio === null ? `ratio ${ratio}` : `sequence ratio ${ratio} (GSPO; this token's own ratio ${tokenRatio})`,
  why: (code, text) => `why: <b>${code}</b>, ${text}`,
  grad: "∂loss/∂logp (negative: descent raises the log-prob)",
};

// Summary cards: [API field, label].
export const SUMMARY_CARDS = [
  ["loss", "loss"],
  ["objective", LABELS.objective],
  ["policy_loss", LABELS.policy_loss],
  ["kl_loss", LABELS.kl_loss],
];

// Legends of the control groups (a field's group comes from /api/v1/options).
export const GROUP_TITLES = {
  policy: "policy objective",
  kl: "KL penalty",
  aggregation: "aggregation",
  advantage: "advantages",
  runtime: "runtime",
};

// Per-token inputs of the table editor: API field -> row label.
export const CELL_LABELS = {
  per_token_logps: "logp",
  old_per_token_logps: "old",
  ref_per_token_logps: "ref",
  sampling_per_token_logps: "sampler",
};

export const INPUT = {
  perRow: "per row",
  listValue: (target, n) =>
    target === "rewards"
      ? `${n} (one per reward function: the JSON tab edits them)`
      : "per token (the JSON tab edits them)",
  targetRewards: "rewards (advantages computed)",
  targetAdvantages: "advantages (given)",
  groupSize: "group size",
  groupSizeAll: "all rows",
  token: "token",
  tokenPrompt: "prompt position (excluded)",
  sameAsLogp: "= logp",
  reward: "reward ",
  advantage: "advantage ",
  addRow: "+ row",
  addToken: "+ token",
  addTokenTitle: "add a token at the end",
  removeToken: "− token",
  removeTokenTitle: "remove the last token",
  removeRow: "remove row",
  removeRowTitle: "remove this row",
  tooLarge: (rows, total) =>
    `${rows} rows, ${total} tokens: too many to edit as a table. Use the JSON tab or upload a file.`,
  fromFile: (name) =>
    `The batch comes from the file ${name}; the server holds it. Edit a JSON copy via the JSON tab, or pick a scenario.`,
  uploaded: (name, size) => `${name}, ${size} bytes: evaluated by the server on every change.`,
  notJSON: (msg) => `Not valid JSON: ${msg}`,
  notObject: "Expected a JSON object with the /api/v1/loss fields.",
  fileHoldsBatch: "This batch lives in the uploaded file; keep that file.",
  exportFailed: (fmt, message) => `Export as ${fmt} failed: ${message}`,
};

export const STATUS = {
  computing: "computing…",
  done: (loss, ms) => `loss ${loss} · computed and drawn in ${ms} ms`,
  tooLargeForLink: " · input too large for the link: use Export input",
  error: (msg) => `error: ${msg}`,
  linkCopied: "link copied",
  linkCopiedSettingsOnly: "link copied (settings only: the input is too large; export it)",
  copyAddressBar: "copy the address bar: it holds the whole view",
};

export const SUMMARY = {
  noClamp: "No clamp touched any token.",
  clamps: (list) => `Clamps that touched tokens: ${list}.`,
  clampsHead: "Clamps that touched tokens: ",
  touched: (n) => `touched ${n} token${n === 1 ? "" : "s"}`,
  largeBatch: (positions, row) =>
    `This batch has ${positions} positions, more than the per-token limit: the heatmaps show every row, the other per-token charts the tokens of row ${row} (pick another row below or in the rows table).`,
};

export const ROWS = {
  row: "row",
  allRows: "all rows",
  rowN: (i) => `row ${i}`,
  // a row whose tokens carry different advantages (given per token): its mean, its range, and the words
  perTokenAdvantage: (mean, low, high) => `${mean} (${low} … ${high}, per token)`,
};

export const SCENARIO = {
  yourBatch: "Your batch",
  edited: " (edited)",
  editedNote: "Edited by hand: the scenario's notes no longer describe it; the summary does.",
  json: "A batch given as JSON",
  jsonNote: "Applied from the JSON tab; the summary says what the numbers show.",
  file: (name) => `From the file ${name}`,
  importNote: "Imported from an exported input file.",
  uploadNote: "Uploaded; the server evaluates the file on every change.",
  loaded: (kind, title, name) =>
    ({
      scenario: `Loaded: ${title}`,
      edited: `Loaded: ${title}, edited`,
      json: "Loaded: JSON input",
      import: `Loaded: imported ${name}`,
      upload: `Loaded: uploaded ${name}`,
      step: `Loaded: ${name}`,
    })[kind],
};

export const STALE = {
  note: "The last request failed: everything below still shows the batch and settings from before it.",
};

// The compare table: [label, (result) -> value, the quantity a number shows (as the summary tags it)].
export const COMPARE_ROWS = [
  ["loss", (r) => r.loss, "loss"],
  [LABELS.policy_loss, (r) => r.policy_loss, "policy_loss"],
  ["KL part", (r) => r.kl_loss, "kl_loss"],
  ["clip_ratio/region_mean", (r) => r.metrics["clip_ratio/region_mean"], "metrics/clip_ratio/region_mean"],
  ["kl", (r) => r.metrics.kl, "metrics/kl"],
  ["lens/grad_norm_logps", (r) => r.metrics["lens/grad_norm_logps"], "metrics/lens/grad_norm_logps"],
  ["aggregation", (r) => r.config.aggregation, null],
  ["objective", (r) => r.config.objective, null],
];

export const GLOSSARY_HEAD = ["TRL", "verl", "OpenRLHF", "what it means", "healthy"];

export const EXPERIMENTS = {
  article: (text) => `Article: ${text}`,
  printed: "article printed",
  failed: (msg) => `Could not load the experiments: ${msg}`,
};

// The upload tab: what a batch file may hold (the server reads these names; verl's and the
// article's names are accepted too).
export const UPLOAD = {
  head: ["name", "shape", "dtype", ""],
  // The batch's fields come from /api/v1/options (grpo's batch-field table): a row each, then these.
  shape: (f) => ({ token: "(B, T)", row: f.scalar_ok ? "() or (B,)" : "(B,)", batch: "() scalar" })[f.shape],
  dtype: (f) => (f.dtype === "mask" ? "0/1" : f.dtype),
  doc: (f) =>
    `${f.required ? "required" : "optional"}: ${f.doc}${f.aliases.length ? ` (also ${f.aliases.join(", ")})` : ""}`,
  moreFields: [
    ["tokens", "(B, T)", "strings", "optional, JSON/NPZ only: display text"],
    [
      "logits + token_ids",
      "(B, T, V) + (B, T)",
      "float + int",
      "instead of log-probs (.pt, safetensors, NPZ): shifted and gathered; ref_logits, old_logits, prompt_length, temperature optional",
    ],
  ],
  precision:
    "Inputs stored as bfloat16 or float16 are widened exactly to float32 before the computation: the rounding they carry (bfloat16 keeps about 3 significant digits, so a log-prob of -1.2345 arrives as -1.234375) is already in every number shown.",
  examples: "Example files (the article's batch):",
  // the file input's label, from /api/v1/options's formats (labels: "JSON, JSONL or .pt")
  fileLabel: (labels) => `A batch file: ${labels} (tensors only; logits with token_ids go through the causal shift)`,
  exportTitle: (label) => `Download the input batch as ${label} (the upload reads it back)`,
};

// The Runs view's verdict (app/runview.py; grpo.check: match, differ, unchecked, error): what was compared
// with a number the trainer wrote, and what was not. Only a run whose verdict is "match" is said to match.
export const RUN = {
  head: (d) => `${d.name}: ${d.source}, ${d.steps.length} steps, ${d.files} micro-batches. `,
  checking: "checking every micro-batch…",
  match: (rtol) => `Every micro-batch matches the trainer (relative error ≤ ${rtol}).`,
  differ: (steps) => `Mismatch at steps ${steps.join(", ")}.`,
  error: (steps) => `Step files that could not be read, at steps ${steps.join(", ")}.`,
  unchecked: (full, total, rtol) =>
    full === 0
      ? "Not checked against the trainer: nothing the trainer wrote could be compared (why, below); nothing compared is past tolerance."
      : `Checked in part: ${full} of ${total} micro-batches compared in full, within tolerance (relative error ≤ ${rtol}); the others hold something that could not be compared (why, below).`,
  // what a count counts: micro-batches, steps (a step's own reason), or the run itself (no count)
  notChecked: (reason, count, of) => {
    if (of === "run") return `Not checked: ${reason}`;
    const [one, many] = of === "steps" ? ["step", "steps"] : ["micro-batch", "micro-batches"];
    return `Not checked: ${reason} (${count} ${count === 1 ? one : many})`;
  },
  unreadable: (file, message) => `Could not read ${file}: ${message}`,
  // a step's verdict, in its label and the loss chart's legend
  step: {
    match: "matches the trainer",
    differ: "past tolerance",
    unchecked: "not checked",
    error: "could not be read",
  },
};
