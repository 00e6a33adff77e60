// The Experiments view's figures: the article's experiments, float32 beside float64.

import { base } from "./base.js";

const SERIES_STYLE = {
  float32: { color: "#e45756" },
  float64: { color: "#4c78a8" },
  "float32, left to right": { color: "#f2a7a6" },
};

// float32/float64 (and other computed series) as bars, or lines when x is long; reference values
// (a closed form such as 8·beta·KL) as a horizontal tick or a dashed line.
export function experimentChart(exp) {
  const many = exp.x.length > 12;
  const data = Object.entries(exp.series).map(([name, y]) => {
    const style = SERIES_STYLE[name];
    const x = exp.x.map(String);
    if (!style) {
      return many
        ? { type: "scatter", mode: "lines", name, x, y, line: { color: "#333", dash: "dash", width: 1.5 } }
        : {
            type: "scatter",
            mode: "markers",
            name,
            x,
            y,
            marker: { symbol: "line-ew-open", size: 46, color: "#333", line: { width: 2 } },
          };
    }
    return many
      ? {
          type: "scatter",
          mode: "lines+markers",
          name,
          x,
          y,
          marker: { color: style.color, size: 4 },
          line: { color: style.color, width: 1 },
        }
      : { type: "bar", name, x, y, marker: { color: style.color } };
  });
  return {
    data,
    layout: base("", {
      height: 300,
      barmode: "group",
      legend: { orientation: "h", y: -0.3 },
      margin: { l: 70, r: 20, t: 12, b: 40 },
      xaxis: { title: { text: exp.x_label }, type: many ? "linear" : "category" },
      yaxis: { title: { text: exp.y_label }, exponentformat: "e" },
    }),
  };
}
