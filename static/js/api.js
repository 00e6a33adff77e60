// The one module that talks to the server: every request of the page goes through here. A channel
// keeps only its latest request, so a stale response never lands.

import { state } from "./state.js";

export class ApiError extends Error {
  constructor(status, detail) {
    const items = Array.isArray(detail) ? detail : [{ loc: [], msg: String(detail) }];
    super(items.map((d) => `${(d.loc || []).join(" › ")}: ${d.msg}`).join("\n"));
    this.status = status;
    this.detail = items;
    this.problems = items.map((d) => ({ ...where(d.loc), msg: String(d.msg) }));
  }
}

// Where a refused request's problem lies, from its `loc`: a setting (body › config › name), or a field of
// the batch and, for a per-token one, its row and token (body › name › row › token); nulls where not said.
export function where(loc) {
  const path = (loc || []).filter((part) => part !== "body");
  if (path[0] === "config") return { setting: path[1] ?? null, field: null, row: null, token: null };
  const [field = null, row = null, token = null] = path;
  const index = (v) => (Number.isInteger(v) ? v : null);
  return { setting: null, field: typeof field === "string" ? field : null, row: index(row), token: index(token) };
}

// An error answer in the API's one shape (or the bare status where the body is not JSON).
async function failure(response) {
  const data = await response.json().catch(() => ({ detail: `HTTP ${response.status}` }));
  return new ApiError(response.status, data.detail);
}

async function latest(channel, path, init) {
  const channels = state.ui.requests;
  const previous = channels.get(channel);
  if (previous) previous.controller.abort();
  const entry = { controller: new AbortController() };
  channels.set(channel, entry);
  let response;
  try {
    response = await fetch(path, { ...init, signal: entry.controller.signal });
  } catch (err) {
    if (err.name === "AbortError") return null;
    throw err;
  }
  const data = await response.json().catch(() => ({ detail: `HTTP ${response.status}` }));
  if (channels.get(channel) !== entry) return null; // a newer request was made meanwhile
  if (!response.ok) throw new ApiError(response.status, data.detail);
  return data;
}

const jsonInit = (method, body) => ({
  method,
  headers: { "content-type": "application/json" },
  body: JSON.stringify(body),
});

export function postJSON(channel, path, body) {
  return latest(channel, path, jsonInit("POST", body));
}

export function postForm(channel, path, form) {
  return latest(channel, path, { method: "POST", body: form });
}

export function getLatest(channel, path) {
  return latest(channel, path, {});
}

// A request outside any channel (each one is answered, none supersedes another): its JSON answer.
async function request(path, init) {
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response.json();
}

export const getJSON = (path) => request(path);

// A POST whose every answer counts (starting a lab run: two clicks are two runs).
export const sendJSON = (path, body) => request(path, jsonInit("POST", body));

export const remove = (path) => request(path, { method: "DELETE" });

// A POST whose answer is a file (an exported batch): its Blob.
export async function postForFile(path, body) {
  const response = await fetch(path, jsonInit("POST", body));
  if (!response.ok) throw await failure(response);
  return response.blob();
}

// Server-Sent Events: `handlers` maps an event name to a function of its parsed data.
export function events(path, handlers) {
  const source = new EventSource(path);
  for (const [kind, handle] of Object.entries(handlers))
    source.addEventListener(kind, (e) => handle(JSON.parse(e.data)));
  return source;
}
