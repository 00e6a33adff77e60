// Reference sections that do not follow the batch: the article's experiments and the glossary.

import { getJSON } from "./api.js";
import * as charts from "./charts/experiments.js";
import { $, clear, el, plot } from "./dom.js";
import { fmt } from "./format.js";
import { EXPERIMENTS, GLOSSARY_HEAD } from "./labels.js";
import * as redraw from "./redraw.js";
import { state } from "./state.js";

export async function loadExperiments() {
  const host = $("#experiments");
  const list = await getJSON("/api/v1/experiments");
  for (const item of list) {
    const exp = await getJSON(`/api/v1/experiments/${encodeURIComponent(item.name)}`);
    const chartId = `exp-${exp.name}`;
    const names = Object.keys(exp.series);
    const showTable = exp.x.length <= 12;
    const table = showTable
      ? el(
          "table",
          {},
          el(
            "thead",
            {},
            el(
              "tr",
              {},
              el("th", { text: exp.x_label }),
              exp.reported.length ? el("th", { class: "num", text: EXPERIMENTS.printed }) : null,
              ...names.map((n) => el("th", { class: "num", text: n })),
            ),
          ),
          el(
            "tbody",
            {},
            ...exp.x.map((x, i) =>
              el(
                "tr",
                {},
                el("td", { text: String(x) }),
                exp.reported.length ? el("td", { class: "num", text: exp.reported[i] ?? "" }) : null,
                ...names.map((n) => el("td", { class: "num", text: fmt(exp.series[n][i], 6) })),
              ),
            ),
          ),
        )
      : null;
    host.append(
      el(
        "article",
        { class: "experiment", id: `experiment-${exp.name}` },
        el("h3", { text: exp.title }),
        el("p", { class: "claim", text: EXPERIMENTS.article(exp.article) }),
        el("p", { text: exp.explanation }),
        el("div", { class: "chart", id: chartId }),
        table,
      ),
    );
    redraw.register(chartId, chartId, (e) => plot(chartId, charts.experimentChart(e)));
    redraw.publish(chartId, exp);
  }
  document.body.dataset.experiments = String(list.length);
}

export function buildGlossary() {
  const table = clear($("#glossary-table"));
  table.append(el("thead", {}, el("tr", {}, ...GLOSSARY_HEAD.map((h) => el("th", { scope: "col", text: h })))));
  table.append(
    el(
      "tbody",
      {},
      ...state.ui.options.glossary.map((g) =>
        el(
          "tr",
          {},
          el("td", { text: g.trl }),
          el("td", { text: g.verl }),
          el("td", { text: g.openrlhf }),
          el("td", { text: g.meaning }),
          el("td", { text: g.healthy }),
        ),
      ),
    ),
  );
}
