// The Lab view's figures: live runs (lab.js draws each chart with every run's points so far, then extends it).

import { base } from "./base.js";

const LAB_CHART = {
  height: 220,
  margin: { l: 50, r: 50, t: 30, b: 25 },
  xaxis: { rangemode: "tozero" },
  showlegend: false,
  hovermode: "closest", // the run list above the charts is the key
};

// One metric's chart: a trace per run ({id, colour, points: [step data]}), named by `labels`.
export function labMetric(metric, runs, labels) {
  return { data: runs.map((run, i) => labTrace(run, labels[i], metric)), layout: base(metric, LAB_CHART) };
}

// Reward and loss of every run on one figure: the loss is not progress.
export function labOverlay(runs, labels) {
  return {
    data: runs.flatMap((run, i) => [
      labTrace(run, `${labels[i]}: reward`, "reward"),
      labTrace(run, `${labels[i]}: loss`, "loss", "loss"),
    ]),
    layout: base("reward (solid, left axis) and loss (dotted, right axis): the loss is not progress", {
      ...LAB_CHART,
      height: 300,
      showlegend: true,
      legend: { orientation: "h", y: -0.12 },
      margin: { l: 50, r: 60, t: 30, b: 40 },
      yaxis: { title: { text: "reward" } },
      yaxis2: { title: { text: "loss" }, overlaying: "y", side: "right" },
    }),
  };
}

// One run's trace of `field` over its steps: `kind` is "metric", or "loss" (the overlay's, dotted on its
// right axis). The arrays are the trace's own: lab.js extends them as new steps arrive.
export function labTrace(run, name, field, kind = "metric") {
  const line = { color: run.colour, width: 2, ...(kind === "loss" ? { dash: "dot" } : {}) };
  return {
    x: run.points.map((d) => d.step),
    y: run.points.map((d) => d[field]),
    name,
    mode: "lines+markers",
    marker: { size: 4 },
    line,
    meta: run.id,
    ...(kind === "loss" ? { yaxis: "y2" } : {}),
  };
}
