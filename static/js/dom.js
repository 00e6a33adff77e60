// Small DOM helpers. Text always goes in as textContent, never as HTML.

import { state } from "./state.js";

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (value === true) node.setAttribute(key, "");
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export const $ = (selector) => document.querySelector(selector);

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function download(filename, text, type = "application/json") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = el("a", { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// plotly.js (4.6 MB; fetched into the cache by the page's prefetch link) runs when a chart first
// needs it, not before: the summary needs none of it.
export function loadPlotly() {
  if (!state.ui.plotly) {
    state.ui.plotly = window.Plotly
      ? Promise.resolve()
      : new Promise((resolve, reject) => {
          const script = el("script", { src: "/vendor/plotly.min.js" });
          script.addEventListener("load", resolve);
          script.addEventListener("error", () => reject(new Error("plotly.js did not load")));
          document.head.append(script);
        });
  }
  return state.ui.plotly;
}

const nextTask = () => new Promise((resolve) => setTimeout(resolve, 0));

// The one drawing call: draw (or update in place) one Plotly figure (a charts/ module's {data, layout}) in
// `target`, an element or its id. Charts that waited for plotly.js draw one per task, so input and
// navigation are never held behind all of them.
export function plot(target, spec) {
  const draw = () => {
    const node = typeof target === "string" ? document.getElementById(target) : target;
    // no "Share chart…" (plotly.js offers to upload the figure to Chart Studio): nothing leaves this machine
    const config = {
      responsive: true,
      displaylogo: false,
      showSendToCloud: false,
      showLink: false,
      modeBarButtonsToRemove: ["sendChartToCloud"],
      toImageButtonOptions: { filename: `grpo-lens-${node.id}` },
    };
    return Plotly.react(node, spec.data, spec.layout, config);
  };
  return window.Plotly ? draw() : loadPlotly().then(nextTask).then(draw);
}

// Remove the figure in `target`, an element or its id (nothing to show rather than an old figure).
export function purge(target) {
  if (window.Plotly) Plotly.purge(target);
}

export function setStatus(text, kind = "") {
  const node = $("#status");
  node.textContent = text;
  node.className = `status ${kind}`;
}

// Scroll to `target` (an element) and keep it there while the page settles. The views above it are laid out only
// when they come near (app.css: content-visibility), their charts drawn once in view and the later views built once
// the page is quiet, so the page grows after a jump and pushed the target away (the Runs link landed in the Glossary
// table). Each time the page changes size, the target is put back in its place, for LAND_LIMIT_MS or until the
// reader scrolls, clicks or types (or another landing starts).
const LAND_LIMIT_MS = 10000;
const READER_MOVES = ["wheel", "touchstart", "keydown", "pointerdown"];
export function landOn(target) {
  state.ui.landing?.();
  const margin = () => parseFloat(getComputedStyle(target).scrollMarginTop) || 0;
  const resized = new ResizeObserver(() => {
    if (Math.abs(target.getBoundingClientRect().top - margin()) >= 1) target.scrollIntoView();
  });
  const stop = () => {
    resized.disconnect();
    clearTimeout(timer);
    for (const type of READER_MOVES) removeEventListener(type, stop, { capture: true });
    if (state.ui.landing === stop) state.ui.landing = null;
  };
  const timer = setTimeout(stop, LAND_LIMIT_MS);
  for (const type of READER_MOVES) addEventListener(type, stop, { capture: true, passive: true });
  state.ui.landing = stop;
  target.scrollIntoView();
  resized.observe(document.body);
}
