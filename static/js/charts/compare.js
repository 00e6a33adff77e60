// The Compare view's figures: one trace per preset.

import { plotlyText } from "../format.js";
import { LABELS } from "../labels.js";
import { base, panelTitle } from "./base.js";

export function compareRows(results, names) {
  const x = results[0].rows.loss.map((_, i) => `row ${i}`);
  return {
    data: results.map((r, n) => ({ type: "bar", name: names[n], x, y: r.rows.loss })),
    layout: base("Each row's share of the loss, per preset", {
      barmode: "group",
      height: 300,
      legend: { orientation: "h", y: -0.25 },
    }),
  };
}

// Per token of each row: its aggregation weight (the same for every counted token of a row), one
// panel per preset with its own scale: Dr. GRPO's 1/(B·L) would be invisible beside 1/|o_i|.
export function compareWeights(results, names) {
  const counted = results[0].rows.length;
  const x = counted.map((n, i) => LABELS.rowCounted(i, n));
  const firstWeight = (r) =>
    r.tokens.weight.map((row, i) => {
      const j = r.tokens.region[i].findIndex((g) => g !== "masked");
      return j >= 0 ? row[j] : 0;
    });
  const n = results.length;
  const gap = 0.06;
  const width = (1 - gap * (n - 1)) / n;
  const layout = base(LABELS.compareWeightsTitle, {
    height: 320,
    showlegend: false,
    annotations: [],
    margin: { l: 60, r: 20, t: 56, b: 70 },
  });
  const data = results.map((r, k) => {
    const axis = k === 0 ? "" : String(k + 1);
    const x0 = k * (width + gap);
    layout[`xaxis${axis}`] = {
      domain: [x0, x0 + width],
      anchor: `y${axis}`,
      type: "category",
      title: { text: LABELS.rowCountedAxis },
    };
    layout[`yaxis${axis}`] = {
      anchor: `x${axis}`,
      exponentformat: "e",
      title: k === 0 ? { text: LABELS.weight } : undefined,
    };
    layout.annotations.push(panelTitle(names[k], x0 + width / 2, 1.02, "center"));
    return { type: "bar", name: names[k], x, y: firstWeight(r), xaxis: `x${axis}`, yaxis: `y${axis}` };
  });
  return { data, layout };
}

// ∂loss/∂logp per token, one panel per preset stacked (each its own scale: a preset whose weights
// are 1000× smaller would otherwise draw no visible bar).
export function compareGrads(results, names, text) {
  const labels = [];
  const keys = [];
  results[0].tokens.region.forEach((row, i) =>
    row.forEach((g, j) => {
      if (g !== "masked") {
        labels.push(`r${i}:${j} ${plotlyText(text ? text[i][j] : "")}`);
        keys.push([i, j]);
      }
    }),
  );
  const n = results.length;
  const gap = 0.08;
  const height = (1 - gap * (n - 1)) / n;
  // each panel tall enough for its axis title, the top one below the chart's title (its ticks were cut off)
  const layout = base(LABELS.compareGradsTitle, {
    height: 150 + 170 * n,
    margin: { l: 60, r: 20, t: 60, b: 40 },
    showlegend: false,
    annotations: [],
  });
  const data = results.map((r, k) => {
    const axis = k === 0 ? "" : String(k + 1);
    const top = 1 - k * (height + gap);
    // One sign convention with the Gradients view: the axis flipped, up = descent raises the log-prob.
    layout[`yaxis${axis}`] = {
      domain: [top - height, top],
      anchor: "x",
      exponentformat: "e",
      autorange: "reversed",
      automargin: true,
      zeroline: true,
      title: { text: LABELS.gradAxisShort, font: { size: 10 } },
    };
    layout.annotations.push(panelTitle(names[k], 0, top));
    return {
      type: "bar",
      name: names[k],
      x: labels,
      y: keys.map(([i, j]) => r.tokens.grad[i][j]),
      xaxis: "x",
      yaxis: `y${axis}`,
    };
  });
  layout.xaxis = { type: "category", automargin: true, anchor: `y${n === 1 ? "" : n}` };
  return { data, layout };
}
