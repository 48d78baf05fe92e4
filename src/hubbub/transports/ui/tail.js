// The live tail of a channel or pattern, over the native SSE stream (GET /api/v1/stream/<pattern>), with
// pause, replay of the last N and a payload preview by content type.

import { channelPath, query, token } from "./api.js";
import { decode, hex, replacer } from "./msgpack.js";

// Events kept on the page (the oldest go first), and held while paused.
const SHOWN_MAX = 500;
const HELD_MAX = 5000;

function b64bytes(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

// What the preview shows of an event of the SSE stream: {kind, text}.
export function preview(ev) {
  const ct = (ev.content_type || "").toLowerCase();
  if ("json" in ev) return { kind: "JSON", text: JSON.stringify(ev.json, null, 2) };
  if ("text" in ev) {
    if (ct.includes("json")) {
      try { return { kind: "JSON", text: JSON.stringify(JSON.parse(ev.text), null, 2) }; } catch (_) { /* as text */ }
    }
    return { kind: "text", text: ev.text };
  }
  const bytes = b64bytes(ev.b64 || "");
  if (ct.includes("msgpack")) {
    try { return { kind: "msgpack", text: JSON.stringify(decode(bytes), replacer, 2) }; } catch (e) {
      return { kind: `binary (not msgpack: ${e.message})`, text: hex(bytes, 4096) };
    }
  }
  return { kind: `binary, ${bytes.length} bytes`, text: hex(bytes, 4096) };
}

export class LiveTail {
  constructor(list, state, buttons) {
    this.list = list;
    this.state = state;
    this.buttons = buttons;
    this.source = null;
    this.paused = false;
    this.held = [];
    this.count = 0;
  }

  start(pattern, last) {
    this.stop();
    const params = { token: token() };
    if (last > 0) params.last = last;
    const url = "/api/v1/stream" + channelPath(pattern) + query(params);
    const src = (this.source = new EventSource(url));
    this.pattern = pattern;
    this.count = 0;
    this.setState(`Connecting to ${pattern}…`);
    src.onopen = () => this.setState(`Live: ${pattern}`);
    src.onmessage = (m) => this.receive(JSON.parse(m.data));
    src.addEventListener("gap", (m) => this.note("gap: " + m.data));
    src.addEventListener("recovered", (m) => this.note("replayed: " + JSON.parse(m.data).replayed + " events"));
    src.onerror = () => {
      if (src.readyState === EventSource.CLOSED) {
        this.setState(`The stream of ${pattern} was refused or ended (is the token allowed to read it?)`);
        this.stop(true);
      } else this.setState(`Reconnecting to ${pattern}…`);
    };
    this.buttons.pause.disabled = false;
    this.buttons.stop.disabled = false;
  }

  stop(keepState) {
    if (this.source) this.source.close();
    this.source = null;
    this.paused = false;
    this.held = [];
    this.buttons.pause.disabled = true;
    this.buttons.pause.setAttribute("aria-pressed", "false");
    this.buttons.pause.textContent = "Pause";
    this.buttons.stop.disabled = true;
    if (!keepState) this.setState("Stopped.");
  }

  togglePause() {
    this.paused = !this.paused;
    this.buttons.pause.setAttribute("aria-pressed", String(this.paused));
    this.buttons.pause.textContent = this.paused ? "Resume" : "Pause";
    if (!this.paused) {
      const held = this.held;
      this.held = [];
      for (const ev of held) this.render(ev);
      this.setState(`Live: ${this.pattern}`);
    } else this.setState(`Paused: ${this.pattern} (events are held)`);
  }

  clear() {
    this.list.replaceChildren();
  }

  receive(ev) {
    this.count++;
    if (this.paused) {
      this.held.push(ev);
      if (this.held.length > HELD_MAX) this.held.shift();
      this.setState(`Paused: ${this.pattern}, ${this.held.length} events held`);
      return;
    }
    this.render(ev);
  }

  note(text) {
    const li = document.createElement("li");
    li.className = "meta";
    li.textContent = text;
    this.list.prepend(li);
  }

  render(ev) {
    const li = document.createElement("li");
    const meta = document.createElement("div");
    meta.className = "meta";
    const when = new Date(Number(BigInt(ev.time) / 1000000n)).toISOString();
    const p = preview(ev);
    meta.textContent = `${ev.channel}  seq ${ev.seq}  ${when}  ${ev.content_type || ""}  (${p.kind})` +
      (ev.replay ? "  replayed" : "");
    const pre = document.createElement("pre");
    pre.className = "payload";
    pre.textContent = p.text;
    li.append(meta, pre);
    li.dataset.channel = ev.channel;
    li.dataset.seq = ev.seq;
    this.list.prepend(li);
    while (this.list.children.length > SHOWN_MAX) this.list.lastElementChild.remove();
  }

  setState(text) {
    this.state.textContent = text;
  }
}
