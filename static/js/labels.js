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
  sequence_ratio: "policy ratio π/π_old (row)",
  clip_fraction: "clipped tokens",
  group: "group",
  // the rollout correction's columns (grpo.answer.CORRECTION_ROW_FIELDS), counted as the Mismatch view counts
  rollout_is_ratio: "sampler ratio exp(Σ old − sampler)",
  rollout_weight: "IS weight (row)",
  rollout_dropped: "dropped tokens",
  rollout_rejected: "rejected (rollout_rs)",
  objective: "objective J = −loss",
  clippedCell: "clipped (flat: no policy gradient)",
  correctedCell: "dropped or rejected by the rollout correction",
  rowCounted: (i, n) => `r${i} (${n})`,
  rowCountedAxis: "row (counted tokens)",
  compareGradsTitle:
    "∂loss/∂logp per token, per preset (each panel its own scale; axes flipped: up = gradient descent raises the log-prob)",
  notCountedAxis: "position · dark grey: not counted (padding, masked out)",
  gradAxisShort: "∂loss/∂logp ↑ raises logp",
  compareWeightsTitle: "Weight of one token of each row, per preset (each panel its own scale)",
};

// The clip view's hover: what a point's height is (a per-row objective's points are their row's term).
export const CLIP_VIEW = {
  tokenTerm: "objective per unit A",
  rowTerm: "its row's term per unit Ā (GMPO: Ā · exp(mean clipped log-ratio), one per row)",
  rowPoints: "curve: a one-token row; points: each token's row term",
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

// The correction controls, each with the trainers' settings it stands for (shown under its name, not only
// in its tooltip): verl 0.9.1's algorithm.rollout_correction and TRL 1.16's GRPOConfig.
export const CORRECTION_SETTINGS = {
  rollout_correction:
    "verl: rollout_correction.rollout_is = token | sequence (a float rollout_is_threshold: *_truncate; " +
    "'lower_upper': *_mask) · TRL: vllm_importance_sampling_mode (default sequence_mask, applied only with use_vllm)",
  rollout_is_min: "verl: the lower of rollout_is_threshold 'lower_upper' · TRL: vllm_importance_sampling_clip_min",
  rollout_is_max: "verl: rollout_is_threshold (its upper) · TRL: vllm_importance_sampling_clip_max (default 3)",
  rollout_is_log_ratio_clamp: "verl: its ±20 clamp of old − sampler before exp · TRL: none",
  rollout_is_batch_normalize: "verl: rollout_correction.rollout_is_batch_normalize · TRL: none",
  rollout_rs: "verl: rollout_correction.rollout_rs, e.g. token_k1 or token_k1,seq_mean_k3 · TRL: none",
  rollout_rs_threshold:
    "verl: rollout_correction.rollout_rs_threshold, one per criterion; k1 takes 'lower_upper' (0.5_5): bounds on " +
    "−log r = sampler − old, i.e. exp(sampler − old) in [0.5, 5], not on r",
  rollout_bypass: "verl: rollout_correction.bypass_mode · TRL: none",
  off_policy_mask_threshold: "TRL: off_policy_mask_threshold (DeepSeek-V3.2's mask) · verl: none",
};

// A pooled heatmap (the server pools grids with more cells than pixels: grpo.view.answer) says so.
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
    tokenRatio === null ? `ratio ${ratio}` : `sequence ratio ${ratio} (GSPO)<br>this token's own ratio ${tokenRatio}`,
  why: (code, text) => `why: <b>${code}</b>, ${text}`,
  token: (text) => `token: <b>${text}</b> · `,
  entropy: (value) => ` · entropy ${value}`,
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
  addField: "+ per-token field…",
  addFieldNote: "adds a row of cells (entropies, sampler log-probs, masks) to every row",
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
  settingOff: "type to set", // an optional setting's empty box while it is off (the hint beside says it is off)
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
  // the scenario's notes describe it under its own settings: under others they are replaced by this
  otherSettings: (preset, now) =>
    `These are the scenario's numbers under other settings (${now}): its notes, which describe it under ${preset}, no longer apply; the summary says what the numbers show.`,
  // "Loaded:" when the loaded batch's request failed: the views still show the one before it
  notDrawn: (loaded) => `${loaded} (not drawn: its request failed; the views still show what was loaded before)`,
  // the scenario menu while something else is loaded
  none: (kind) => (kind === "step" ? "none: a run's step is loaded" : "none: your own batch is loaded"),
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

// A refused request (a 4xx), told as sentences: each problem's place (a setting; a field of the input, its
// row and token) and the server's message. `perToken`: the field is a per-token one the table can add.
const sentence = (text) => (/[.!?]$/.test(text) ? text : `${text}.`);
export const REFUSED = {
  head: (status) => `The server refused the request (HTTP ${status}):`,
  problem: ({ setting, field, row, token, msg }, perToken) => {
    const name = setting ?? field;
    const said = name && msg.startsWith(`${name}: `) ? msg.slice(name.length + 2) : msg; // the name once
    const place = [row !== null ? `row ${row}` : "", token !== null ? `token ${token}` : ""].filter(Boolean);
    if (setting) return sentence(`The setting ${setting} (under Loss settings): ${said}`);
    if (!field) return sentence(said);
    const hint = perToken
      ? ` Enter it in the Input table (menu "${INPUT.addField}") or in the JSON tab.`
      : " Edit it in the Input table or the JSON tab.";
    return sentence(`The input's ${field}${place.length ? ` (${place.join(", ")})` : ""}: ${said}`) + hint;
  },
};

// The compare table: [label, (result) -> value, the quantity a number shows (as the summary tags it)].
export const COMPARE_ROWS = [
  ["loss", (r) => r.loss, "loss"],
  [LABELS.policy_loss, (r) => r.policy_loss, "policy_loss"],
  ["KL part", (r) => r.kl_loss, "kl_loss"],
  // each clip fraction under its trainer's name, in a preset's column only where its objective logs it
  // (metrics_logged): "—" elsewhere, never a 0 it does not compute (verl-gmpo logs no clip_ratio/region_mean)
  ...["clip_ratio/region_mean", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "cispo_clip_ratio"].map((name) => [
    name,
    (r) => (r.metrics_logged.includes(name) ? r.metrics[name] : null),
    `metrics/${name}`,
  ]),
  ["kl", (r) => r.metrics.kl, "metrics/kl"],
  // what makes kl differ between presets for one batch: TRL's kl_t × ratio (use_bias_correction_kl), verl's clamp
  ["kl_estimator", (r) => r.config.kl_estimator, null],
  [
    "kl_bias_correction (TRL use_bias_correction_kl: kl_t × ratio)",
    (r) => (r.config.kl_bias_correction ? "on" : "off"),
    null,
  ],
  ["kl_clamp", (r) => r.config.kl_clamp ?? null, "config/kl_clamp"],
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

// The Runs view's losses told per rank (app/runview.py `rank_losses`, grpo.check): a step's loss over several
// ranks is the mean over the ranks of each rank's sum over its micro-batches, as the trainer logs it.
const list = (xs) => xs.join(", ");
export const RUN_RANKS = {
  trainerLegend: (ranks) =>
    ranks > 1
      ? `trainer (returned: each rank's sum over its micro-batches, mean over the ${ranks} ranks)`
      : "trainer (returned, summed over micro-batches)",
  lensLegend: (ranks) =>
    ranks > 1 ? "GRPO Lens (recomputed: the same mean over the ranks)" : "GRPO Lens (recomputed, summed the same way)",
  loggedLegend: "the trainer's logged loss (its log, as it reports the step)",
  allRanks: (ranks) => `all ${ranks} ranks (the step as the trainer logs it)`,
  rank: (r) => `rank ${r}`,
  microOption: (micro, ranks) => (ranks.length > 1 ? `${micro} (on ranks ${list(ranks)})` : String(micro)),
  // the step's label: what the views show, then the trainer's and GRPO Lens's numbers for it
  whole: (step, micros, ranks) =>
    ranks.length > 1
      ? `step ${step}, ranks ${list(ranks)}: the step's loss is the mean over the ${ranks.length} ranks of each rank's sum over its micro-batches ${list(micros)} (the views join every rank's micro-batches as one batch)`
      : micros.length === 1
        ? `step ${step} (one micro-batch, ${micros[0]})`
        : `step ${step} (micro-batches ${list(micros)} joined; its loss sums them)`,
  oneRank: (step, rank, micros) =>
    `step ${step}, rank ${rank}: its loss sums its micro-batches ${list(micros)} (the views join them as one batch)`,
  microOfRank: (step, rank, micro) => `step ${step}, rank ${rank}, micro-batch ${micro}`,
  microOfRanks: (step, micro, ranks) =>
    `step ${step}, micro-batch ${micro} on ranks ${list(ranks)}: one file and one loss each (the views join them as one batch)`,
  micro: (step, micro) => `step ${step}, micro-batch ${micro}`,
  losses: (trainer, lens) => ` · trainer's loss ${trainer} · GRPO Lens ${lens}`,
  perRank: (pairs) => pairs.map(([rank, value]) => `rank ${rank}: ${value}`).join(", "),
  logged: (trainer, lens) => ` · the trainer's logged loss ${trainer} (GRPO Lens, as the trainer logs it: ${lens})`,
  title: (run, step, micro, rank) =>
    `Run ${run}, step ${step}` + (rank === "" ? "" : `, rank ${rank}`) + (micro === "" ? "" : `, micro-batch ${micro}`),
  ownConfig: "none: the run's own config",
  replayChoose: "choose a preset",
  replayOwn: (name) => `${name} (the run's own)`,
};
