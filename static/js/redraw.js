// Draws what is on screen first. Each chart is a view fed by one source (the loss response, the
// compare response, an experiment). When a source gets new data, the views on screen are drawn at
// once; the others when they scroll into view, or one by one once the page has been quiet for a
// while (idle time). A view records the number of the data it shows (data-seq), so a test can see
// that every chart shows the current state.

import { state } from "./state.js";

const QUIET_MS = 800; // idle drawing starts this long after the last new data
const MARGIN = "150px 0px"; // a view this close to the viewport counts as on screen
const own = state.ui.redraw; // this module's state (state.js): its views, sources and idle drawing

const observer = new IntersectionObserver(
  (entries) => {
    for (const entry of entries) {
      const view = own.views.get(entry.target.id);
      if (!view) continue;
      view.visible = entry.isIntersecting;
      if (view.visible) bringUpToDate(view);
    }
  },
  { rootMargin: MARGIN },
);

function source(name) {
  // stale: to fetch again; pending: fetched, the answer not yet published
  if (!own.sources.has(name))
    own.sources.set(name, { seq: 0, data: null, stale: false, pending: false, refresh: null });
  return own.sources.get(name);
}

// A view: `draw(data)` draws the element `id` from its source's data (returns Plotly's promise).
export function register(id, sourceName, draw) {
  const node = document.getElementById(id);
  const view = { id, node, source: sourceName, draw, seq: 0, shown: 0, visible: false };
  own.views.set(id, view);
  observer.observe(node);
  return view;
}

// A source whose data is fetched only when one of its views is needed (e.g. compare): `refresh()`
// fetches and then calls publish(name, data).
export function setRefresh(name, refresh) {
  source(name).refresh = refresh;
}

// The source's data no longer matches the state: fetch again now if a view of it is on screen,
// else when one comes into view (or in idle time).
export function invalidate(name) {
  const s = source(name);
  s.stale = true;
  s.pending = true;
  markAll(name);
  if ([...own.views.values()].some((v) => v.source === name && v.visible)) refreshSource(s);
}

// A fetch that ends without new data (nothing to compare, an error): the views keep what they show,
// and no longer wait for an answer.
export function settle(name) {
  source(name).pending = false;
  markAll(name);
}

function refreshSource(s) {
  if (!s.refresh || !s.stale) return;
  s.stale = false;
  s.refresh();
}

// A view that shows older data than its source's latest (or whose source awaits a new answer) is
// greyed and says so (data-stale), so a chart never passes for the answer a table beside it shows.
function mark(view) {
  const s = source(view.source);
  const stale = s.data !== null && (s.pending || view.shown !== s.seq);
  view.node.classList.toggle("stale-view", stale);
  view.node.dataset.stale = String(stale);
}

function markAll(name) {
  for (const v of own.views.values()) if (v.source === name) mark(v);
}

function bringUpToDate(view) {
  const s = source(view.source);
  if (s.stale) refreshSource(s);
  if (s.data === null || view.seq === s.seq) return null;
  const seq = s.seq;
  view.seq = seq;
  return Promise.resolve(view.draw(s.data)).then(() => {
    if (view.seq === seq) view.shown = seq;
    mark(view);
  });
}

// Inside the viewport itself (not only within the observer's margin).
function onScreen(view) {
  const r = view.node.getBoundingClientRect();
  return r.bottom > 0 && r.top < innerHeight && r.height > 0;
}

// New data for a source: draw its views on screen now (resolves when they are drawn), those just
// outside it right after, the rest when seen or in idle time. Returns the data's number.
export async function publish(name, data) {
  const s = source(name);
  s.seq += 1;
  s.data = data;
  s.pending = false;
  const every = own.drawAllOf.delete(name); // drawAll asked for this source's answer in every view
  const near = [...own.views.values()].filter((v) => v.source === name && (v.visible || every));
  const shown = near.filter(onScreen);
  // drawn right now (not greyed for the moment it takes); the others greyed until drawn
  for (const v of own.views.values()) if (v.source === name && !shown.includes(v)) mark(v);
  setTimeout(() => near.forEach(bringUpToDate), 0);
  await Promise.all(shown.map(bringUpToDate));
  scheduleIdle();
  return s.seq;
}

// Every view, on screen or not, brought up to date: before printing (and for a full-page screenshot: dispatch
// "beforeprint", or call it), since views off screen are drawn only when they scroll into view. A source
// fetched on demand (compare) is fetched now, and all its views are drawn when its answer comes.
export function drawAll() {
  document.body.classList.add("every-view"); // app.css: the views off screen are painted too (content-visibility)
  for (const [name, s] of own.sources) if (s.stale || s.pending) own.drawAllOf.add(name);
  return Promise.all([...own.views.values()].map(bringUpToDate));
}
addEventListener("beforeprint", () => drawAll());
addEventListener("afterprint", () => document.body.classList.remove("every-view"));

// The number of a source's latest data.
export const currentSeq = (name) => source(name).seq;

// True when the view shows its source's latest data (tests wait on this after scrolling to it).
export function isCurrent(id) {
  const view = own.views.get(id);
  const s = view && own.sources.get(view.source);
  return Boolean(s && !s.stale && !s.pending && s.data !== null && view.shown === s.seq);
}

// A new request is on its way: stop idle drawing until its data is published.
export function hold() {
  own.generation += 1;
  clearTimeout(own.quietTimer);
  if (own.idleHandle !== null) cancelIdleCallback(own.idleHandle);
  own.idleHandle = null;
}

// Idle time: once nothing new arrived for QUIET_MS, draw the stale views one per idle callback,
// so a visible redraw never waits behind an off-screen one for long.
function scheduleIdle() {
  own.generation += 1;
  const mine = own.generation;
  clearTimeout(own.quietTimer);
  if (own.idleHandle !== null) cancelIdleCallback(own.idleHandle);
  own.idleHandle = null;
  own.quietTimer = setTimeout(() => {
    own.idleHandle = requestIdleCallback(() => drawOneStale(mine));
  }, QUIET_MS);
}

function drawOneStale(mine) {
  own.idleHandle = null;
  if (mine !== own.generation) return;
  // Only drawing here: a source fetched on demand (compare) waits until one of its views is seen,
  // so idle time never puts a request on the server beside the user's next one.
  const view = [...own.views.values()].find((v) => {
    const s = own.sources.get(v.source);
    return s && s.data !== null && !s.stale && v.seq !== s.seq;
  });
  if (!view) return;
  Promise.resolve(bringUpToDate(view)).then(() => {
    if (mine === own.generation) own.idleHandle = requestIdleCallback(() => drawOneStale(mine));
  });
}

// Run `fn` once the page has been quiet for QUIET_MS, in idle time (work below the first view).
export function whenQuiet(fn) {
  setTimeout(() => requestIdleCallback(fn), QUIET_MS);
}

// The views of a source on screen now (the benchmark's floor redraws exactly these).
export function visibleViews(name) {
  return [...own.views.values()].filter((v) => v.source === name && v.visible && onScreen(v));
}

// Draw the views of a source that are on screen with `data`, nothing else (the benchmark's floor).
export function drawOnScreen(name, data) {
  return Promise.all(visibleViews(name).map((v) => v.draw(data)));
}
