// fetch wrappers. Each channel keeps only its latest request: a stale response never lands.

export class ApiError extends Error {
  constructor(status, detail) {
    const items = Array.isArray(detail) ? detail : [{ loc: [], msg: String(detail) }];
    super(items.map((d) => `${(d.loc || []).join(" › ")}: ${d.msg}`).join("\n"));
    this.status = status;
    this.detail = items;
  }
}

const channels = new Map();

async function latest(channel, path, init) {
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

export function postJSON(channel, path, body) {
  return latest(channel, path, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
}

export function postForm(channel, path, form) {
  return latest(channel, path, { method: "POST", body: form });
}

export async function getJSON(path) {
  const response = await fetch(path);
  const data = await response.json();
  if (!response.ok) throw new ApiError(response.status, data.detail);
  return data;
}
