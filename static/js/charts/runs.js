// The Runs view's figures: a run's steps and its timeline (one small chart per series, a second run beside it).

import { RUN, RUN_RANKS } from "../labels.js";
import { base, wrap } from "./base.js";

// A chart over a run's optimiser steps.
// Steps are whole numbers: a short run gets a tick per step, never 1.5 (a long one Plotly's own spacing).
const STEP_TICKS_UP_TO = 20;
const stepsLayout = (title, steps, extra = {}) =>
  base(title, {
    height: 280,
    // automargin: the tick labels push the axis title out instead of printing over it
    xaxis: {
      title: { text: "optimiser step", standoff: 8 },
      automargin: true,
      ...(steps.length <= STEP_TICKS_UP_TO ? { tickmode: "array", tickvals: steps } : {}),
    },
    yaxis: { automargin: true },
    legend: { orientation: "h", y: -0.35 },
    ...extra,
  });

export function lossChart(data) {
  const x = data.steps.map((s) => s.step);
  const ranks = Math.max(1, ...data.steps.map((s) => s.ranks ?? 1)); // the legends say how ranks are joined
  const logged = data.steps.filter((s) => s.logged_loss); // the trainer's logged loss, where it was compared
  // each step marked by its verdict (app/runview.py); a matching step carries no marker
  const marked = (verdict, name, marker) => {
    const steps = data.steps.filter((s) => s.verdict === verdict);
    const y = steps.map((s) => s.lens_loss ?? s.trainer_loss ?? 0); // an unreadable step may have no loss
    return { x: steps.map((s) => s.step), y, name, mode: "markers", marker };
  };
  return {
    data: [
      {
        x,
        y: data.steps.map((s) => s.trainer_loss),
        name: RUN_RANKS.trainerLegend(ranks),
        mode: "lines+markers",
        line: { color: "#6b7280" },
      },
      {
        x,
        y: data.steps.map((s) => s.lens_loss),
        name: RUN_RANKS.lensLegend(ranks),
        mode: "lines+markers",
        line: { color: "#2563eb", dash: "dot" },
      },
      marked("differ", `mismatch (${RUN.step.differ})`, { color: "#dc2626", size: 14, symbol: "x" }),
      marked("unchecked", RUN.step.unchecked, {
        color: "#d97706",
        size: 13,
        symbol: "circle-open",
        line: { width: 2 },
      }),
      marked("error", RUN.step.error, { color: "#111827", size: 13, symbol: "square-x-open" }),
      ...(logged.length
        ? [
            {
              x: logged.map((s) => s.step),
              y: logged.map((s) => s.logged_loss.trainer),
              name: RUN_RANKS.loggedLegend,
              mode: "markers",
              marker: { symbol: "diamond-open", size: 12, color: "#059669", line: { width: 2 } },
            },
          ]
        : []),
    ],
    layout: stepsLayout("Loss per step: trainer vs recomputed", x, {
      yaxis: { title: { text: "loss", standoff: 10 }, automargin: true },
    }),
  };
}

// One of the run's charts as the server built it (app/runview.py): one unit on the y-axis; a logged series
// is null at the steps the trainer did not log, drawn as a gap (never joined across it).
export function runSeriesChart(data, chart) {
  const x = data.steps.map((s) => s.step);
  const colours = ["#dc2626", "#f97316", "#eab308", "#db2777", "#7c3aed", "#16a34a", "#0891b2", "#64748b"];
  const traces = chart.series.map((series, i) => ({
    x,
    y: series.values,
    name: series.name,
    connectgaps: false,
    mode: series.source === "logged" ? "markers" : "lines+markers",
    marker: series.source === "logged" ? { symbol: "circle-open", size: 11 } : { size: 5 },
    line: { color: colours[Math.floor(i / 2) % colours.length] },
    meta: series.source,
  }));
  return {
    data: traces,
    layout: stepsLayout(`${chart.title} (filled: GRPO Lens; rings: logged by the trainer; gaps: not logged)`, x, {
      height: 300,
      yaxis: { title: { text: chart.unit, standoff: 10 }, automargin: true },
    }),
  };
}

export function replayChart(data, preset) {
  const x = data.steps.map((s) => s.step);
  const series = [
    ["loss", "#2563eb"],
    ["policy_loss", "#16a34a"],
    ["kl_loss", "#7c3aed"],
    ["clip_ratio/region_mean", "#dc2626"],
  ];
  const traces = [];
  for (const [key, color] of series) {
    traces.push({
      x,
      y: data.steps.map((s) => s.original[key]),
      name: `${key} (as captured)`,
      mode: "lines+markers",
      line: { color },
    });
    traces.push({
      x,
      y: data.steps.map((s) => s.replay[key]),
      name: `${key} (${preset})`,
      mode: "lines+markers",
      line: { color, dash: "dash" },
    });
  }
  return { data: traces, layout: stepsLayout(`These same batches under ${preset}`, x, { height: 320 }) };
}

// The x-axes a timeline can be drawn against: each reads a number the answer carries (never computed here).
export const TIMELINE_AXES = {
  step: { title: "optimiser step", of: (s) => s.step },
  cumulative: { title: "counted tokens so far (cumulative)", of: (s) => s.tokens?.cumulative ?? null },
};
// The loss is the first chart: the step's recomputed loss beside the trainer's logged one.
export const TIMELINE_LOSS = {
  name: "loss",
  label: "loss",
  trainer_name: null,
  description:
    "The step's loss as the trainer logs it (ranks and micro-batches joined), recomputed; the trainer's logged loss beside it.",
};
// The legend of the step's own trace: over several ranks, every rank's files joined as the trainer joins them.
const joined = (ranks) => (ranks > 1 ? `recomputed (${ranks} ranks joined)` : "recomputed");
const TIMELINE_COLOURS = [
  { own: "#2563eb", logged: "#059669", ranks: ["#60a5fa", "#1e3a8a", "#93c5fd", "#3b82f6"] },
  { own: "#ea580c", logged: "#a16207", ranks: ["#fdba74", "#9a3412", "#fed7aa", "#f97316"] },
];

// A step entry's value of `name`: recomputed, the trainer's logged one, or one rank's (null where absent).
const timelineValue = {
  recomputed: (name) => (s) => (name === "loss" ? s.loss.recomputed : (s.series[name] ?? null)),
  logged: (name) => (s) => (name === "loss" ? s.loss.logged : (s.logged?.[name] ?? null)),
  rank: (name, rank) => (s) => {
    const own = s.ranks?.[String(rank)];
    if (!own) return null;
    return name === "loss" ? (own.loss ?? null) : (own.series?.[name] ?? null);
  },
};

// The traces of one run on one series' chart: recomputed, the trainer's logged values (rings, where it logs
// them), one dotted trace per rank (over several ranks), and the open run's anomalies (amber markers whose hover
// is the anomaly's sentence). `customdata` is the step (a click opens it) or, on a marker, the anomaly's index.
function timelineTraces(run, index, series, axis) {
  const { answer, name } = run;
  const colours = TIMELINE_COLOURS[index % TIMELINE_COLOURS.length];
  const x = answer.steps.map(TIMELINE_AXES[axis].of);
  const steps = answer.steps.map((s) => s.step);
  const who = (what) => (run.both ? `${name}: ${what}` : what);
  const meta = (kind) => ({ run: name, kind });
  const line = (what, y, style) => ({
    x,
    y,
    name: who(what),
    customdata: steps,
    connectgaps: false,
    legendgroup: name,
    meta: meta(what),
    ...style,
  });
  const traces = [
    line(joined(answer.ranks.length), answer.steps.map(timelineValue.recomputed(series.name)), {
      mode: "lines+markers",
      marker: { size: 5, color: colours.own },
      line: { color: colours.own, width: 2 },
    }),
  ];
  const logged = answer.steps.map(timelineValue.logged(series.name));
  if (logged.some((v) => v !== null))
    traces.push(
      line("logged by the trainer", logged, {
        mode: "markers",
        marker: { symbol: "diamond-open", size: 9, color: colours.logged, line: { width: 2 } },
      }),
    );
  if (answer.ranks.length > 1)
    answer.ranks.forEach((rank, i) =>
      traces.push(
        line(`rank ${rank}`, answer.steps.map(timelineValue.rank(series.name, rank)), {
          mode: "lines",
          line: { color: colours.ranks[i % colours.ranks.length], width: 1, dash: "dot" },
        }),
      ),
    );
  if (index === 0) traces.push(anomalyTrace(run, series, axis, x));
  return traces;
}

function anomalyTrace(run, series, axis, x) {
  const at = new Map(run.answer.steps.map((s, i) => [s.step, i]));
  const marked = run.answer.anomalies.map((a, i) => [a, i]).filter(([a]) => a.series === series.name && at.has(a.step));
  const entry = (a) => run.answer.steps[at.get(a.step)];
  return {
    x: marked.map(([a]) => x[at.get(a.step)]),
    y: marked.map(([a]) => timelineValue.recomputed(series.name)(entry(a))),
    customdata: marked.map(([, i]) => i),
    hovertext: marked.map(([a]) => wrap(a.sentence)),
    hoverinfo: "text",
    name: run.both ? `${run.name}: anomalies` : "anomalies",
    mode: "markers",
    meta: { run: run.name, kind: "anomaly" },
    marker: { symbol: "star-diamond", size: 15, color: "#f59e0b", line: { width: 1.5, color: "#78350f" } },
  };
}

// One series' chart over the runs ({answer, name}: the open run first, then the one beside it), against `axis`
// (a key of TIMELINE_AXES). The label is the title, with the trainer's own name for the series.
export function timelineChart(runs, series, axis) {
  const both = runs.length > 1;
  const data = runs.flatMap((run, i) => timelineTraces({ ...run, both }, i, series, axis));
  const title = series.trainer_name ? `${series.label} (the trainer's ${series.trainer_name})` : series.label;
  const steps = runs[0].answer.steps.map((s) => s.step);
  const ticks = axis === "step" && !both && steps.length <= STEP_TICKS_UP_TO;
  return {
    data,
    layout: base(title, {
      height: 250,
      margin: { l: 56, r: 12, t: 32, b: 36 },
      hovermode: "closest",
      showlegend: true,
      legend: { orientation: "h", y: -0.32, font: { size: 10 } },
      xaxis: {
        title: { text: TIMELINE_AXES[axis].title, standoff: 4 },
        automargin: true,
        ...(ticks ? { tickmode: "array", tickvals: steps } : {}),
      },
      yaxis: { automargin: true, exponentformat: "e" },
    }),
  };
}

// Whether a series has a value to draw in any of the runs (a run without a sampler has no mismatch).
export const timelineDrawn = (runs, series) =>
  runs.some(({ answer }) =>
    answer.steps.some(
      (s) => timelineValue.recomputed(series.name)(s) !== null || timelineValue.logged(series.name)(s) !== null,
    ),
  );
