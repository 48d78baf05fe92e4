// The admin API (docs/operations.md "Admin API") and the token, kept in this tab's session storage.

const TOKEN_KEY = "hubbub.token";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra) {
  const h = { Accept: "application/json", ...(extra || {}) };
  const t = token();
  if (t) h.Authorization = "Bearer " + t;
  return h;
}

async function errorOf(resp) {
  let message = resp.status + " " + resp.statusText;
  try {
    const body = await resp.json();
    message = body.message || body.error || message;
  } catch (_) { /* not JSON: the status says it */ }
  return new ApiError(resp.status, message);
}

export async function get(path) {
  const resp = await fetch(path, { headers: headers() });
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

export async function send(method, path, body, contentType) {
  const init = { method, headers: headers(contentType ? { "Content-Type": contentType } : {}) };
  if (body !== undefined) init.body = body;
  const resp = await fetch(path, init);
  if (!resp.ok) throw await errorOf(resp);
  return resp.json();
}

// A channel or pattern as a path after a route's prefix: each segment percent-encoded, the slashes kept.
export function channelPath(channel) {
  return channel.split("/").map((s) => (s === "*" || s === "**" ? s : encodeURIComponent(s))).join("/");
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) q.set(k, v);
  const s = q.toString();
  return s ? "?" + s : "";
}
