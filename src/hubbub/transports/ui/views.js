// The dashboard's views. Each has refresh() (one round of the admin API), and a refresh period while shown.

import { channelPath, get, query, send } from "./api.js";
import { lineChart } from "./chart.js";
import { LiveTail, preview } from "./tail.js";

export function h(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "class") e.className = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
}

const $ = (id) => document.getElementById(id);

export function nsDate(ns) {
  const n = Number(BigInt(ns || "0") / 1000000n);
  return n ? new Date(n).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "never";
}

export function duration(s) {
  s = Math.floor(s);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d) return `${d} d ${hh} h`;
  if (hh) return `${hh} h ${m} min`;
  if (m) return `${m} min ${s % 60} s`;
  return `${s} s`;
}

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

const num = (v) => h("td", { class: "num" }, String(v));

// A cursor pager: "First" and "Next" over the API's ``next`` cursors (and "Previous" from the ones seen).
class Pager {
  constructor(el, load) {
    this.el = el;
    this.load = load;
    this.stack = [];
    this.after = "";
    this.next = null;
  }
  reset() { this.stack = []; this.after = ""; }
  render(next, shown) {
    this.next = next;
    const prev = h("button", { type: "button", class: "secondary", disabled: !this.stack.length, onclick: () => {
      this.after = this.stack.pop() || ""; this.load();
    } }, "Previous page");
    const nxt = h("button", { type: "button", class: "secondary", disabled: !next, onclick: () => {
      this.stack.push(this.after); this.after = this.next; this.load();
    } }, "Next page");
    this.el.replaceChildren(prev, nxt, h("span", { class: "muted" }, `page ${this.stack.length + 1}, ${shown} shown`));
  }
}

export function confirmDialog(text) {
  const d = $("confirm-dialog");
  $("confirm-text").textContent = text;
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "yes"), { once: true });
    d.returnValue = "";
    d.showModal();
  });
}

// -- overview ------------------------------------------------------------------------------------------

export class Overview {
  constructor(app) { this.app = app; this.period = 2000; }
  async refresh() {
    const o = await get("/api/v1/admin/overview");
    this.app.summary(o);
    const store = o.health.store === "ok" ? "ok" : o.health.store || Object.values(o.health).join(", ");
    const facts = [
      ["Version", o.version], ["Uptime", duration(o.uptime_s)],
      ["Events in", `${o.events.in_per_s.toFixed(1)} /s`], ["Events out", `${o.events.out_per_s.toFixed(1)} /s`],
      ["Connections", o.connections.total], ["Subscriptions", o.subscriptions],
      ["Log", `${o.log.events} events, ${bytes(o.log.bytes)}`], ["Channels", o.log.channels],
      ["Oldest event", nsDate(o.log.oldest_ns)], ["Newest event", nsDate(o.log.newest_ns)],
      ["Durability", o.durability], ["Store", `${o.store}: ${store}`],
      ["Broker", o.broker.state || "none (one node)"], ["Presence", o.presence.state || "local"],
      ["Durable consumers", o.consumers], ["Dropped events", o.events.dropped],
    ];
    $("overview-facts").replaceChildren(...facts.map(([k, v]) => {
      const bad = (k === "Store" && store !== "ok") || (k === "Broker" && o.broker.state && o.broker.state !== "up");
      return h("div", {}, h("dt", {}, k), h("dd", { class: bad ? "state-bad" : null }, String(v)));
    }));
    const span = 15 * 60;
    const samples = o.history.samples;
    lineChart($("chart-events"), [
      { cls: "in", label: "in", points: samples.map((s) => [s[0], s[1]]) },
      { cls: "out", label: "out", points: samples.map((s) => [s[0], s[2]]) },
    ], span);
    lineChart($("chart-conns"), [{ cls: "conns", label: "open", points: samples.map((s) => [s[0], s[3]]) }], span);
    $("overview-dialects").tBodies[0].replaceChildren(...Object.entries(o.connections.by_dialect).map(
      ([d, n]) => h("tr", {}, h("td", {}, d), num(n))));
    this.app.dialects(Object.keys(o.connections.by_dialect));
  }
}

// -- channels ------------------------------------------------------------------------------------------

export class Channels {
  constructor(app) {
    this.app = app;
    this.period = 5000;
    this.pattern = "/**";
    this.q = "";
    this.selected = null;
    this.pager = new Pager($("channel-pager"), () => this.refresh());
    this.tail = new LiveTail($("tail-events"), $("tail-state"), { pause: $("tail-pause"), stop: $("tail-stop") });
    $("channel-search").addEventListener("submit", (e) => {
      e.preventDefault();
      const v = $("channel-q").value.trim();
      if (v.startsWith("/")) { this.pattern = v.endsWith("/") ? v + "**" : v; this.q = ""; }
      else { this.pattern = "/**"; this.q = v; }
      this.pager.reset();
      this.refresh().catch((err) => app.failed(err));
    });
    $("tail-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.tail.start($("tail-pattern").value.trim(), Number($("tail-last").value) || 0);
    });
    $("tail-pause").addEventListener("click", () => this.tail.togglePause());
    $("tail-stop").addEventListener("click", () => this.tail.stop());
    $("tail-clear").addEventListener("click", () => this.tail.clear());
  }

  browse(pattern) {
    this.pattern = pattern;
    this.q = "";
    $("channel-q").value = pattern === "/**" ? "" : pattern;
    this.pager.reset();
    this.refresh().catch((err) => this.app.failed(err));
  }

  crumbs() {
    const parts = this.pattern.split("/").slice(1);
    const out = [h("button", { type: "button", class: "link", onclick: () => this.browse("/**") }, "all channels")];
    let path = "";
    for (const p of parts) {
      if (p.includes("*")) break;
      path += "/" + p;
      const target = path + "/**";
      out.push(" / ", h("button", { type: "button", class: "link", onclick: () => this.browse(target) }, p));
    }
    if (this.q) out.push(` — names containing “${this.q}”`);
    $("channel-crumbs").replaceChildren(...out);
    // The sub-trees of the pattern's path (a pattern ending in /** browses a sub-tree): one level down.
    const m = /^((?:\/[^*/]+)*)\/\*\*$/.exec(this.pattern);
    if (!m || this.q) { $("channel-folders").replaceChildren(); return Promise.resolve(); }
    return get("/api/v1/admin/channels/tree" + query({ prefix: m[1], limit: 100 })).then((r) => {
      const dirs = r.children.filter((c) => c.children);
      $("channel-folders").replaceChildren(...dirs.map((c) => h("li", {},
        h("button", { type: "button", class: "secondary", onclick: () => this.browse(c.path + "/**"),
          "aria-label": `Channels under ${c.path}` }, c.name + "/"))),
        ...(r.next ? [h("li", { class: "muted" }, "and more: search to narrow")] : []));
    });
  }

  async refresh() {
    const folders = this.crumbs();
    const r = await get("/api/v1/admin/channels" + query({ pattern: this.pattern, q: this.q, after: this.pager.after, limit: 100 }));
    const rows = r.channels.map((c) => {
      const subs = Object.entries(c.subscribers).map(([d, n]) => h("span", { class: "tag" }, `${d} ${n}`));
      const tr = h("tr", { class: this.selected === c.channel ? "selected" : null },
        h("td", {}, h("button", { type: "button", class: "link", onclick: () => this.select(c) }, c.channel)),
        num(c.top), num(c.first), num(c.count), num(c.rate === null ? "–" : c.rate.toFixed(1)),
        h("td", {}, nsDate(c.last_ns)),
        h("td", {}, subs.length ? subs : h("span", { class: "muted" }, "none")));
      return tr;
    });
    $("channel-table").tBodies[0].replaceChildren(...(rows.length ? rows :
      [h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No channels here."))]));
    this.pager.render(r.next, rows.length);
    await folders;
    if (this.selected) {
      const c = r.channels.find((x) => x.channel === this.selected);
      if (c) this.detail(c, false);
    }
  }

  select(c) {
    this.selected = c.channel;
    for (const tr of $("channel-table").tBodies[0].rows) {
      tr.classList.toggle("selected", tr.cells[0].textContent === c.channel);
    }
    this.detail(c, true);
  }

  detail(c, events) {
    const box = $("channel-detail");
    const subs = Object.entries(c.subscribers).map(([d, n]) => `${d}: ${n}`).join(", ") || "none";
    const dl = h("dl", { class: "facts" },
      ...[["Head (top seq)", c.top], ["First seq", c.first], ["Events", c.count], ["Epoch", c.epoch],
        ["Rate", c.rate === null ? "–" : c.rate.toFixed(2) + " /s"], ["Last event", nsDate(c.last_ns)],
        ["Subscribers", subs]]
        .map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, String(v)))));
    const actions = h("div", { class: "row" },
      h("button", { type: "button", onclick: () => {
        $("tail-pattern").value = c.channel;
        this.tail.start(c.channel, Number($("tail-last").value) || 10);
        $("h-tail").scrollIntoView();
      } }, "Tail this channel"),
      h("button", { type: "button", class: "secondary", onclick: () => this.browse(c.channel + "/**") }, "Channels under it"));
    const last = box.querySelector("#channel-last") || h("div", { id: "channel-last" });
    box.replaceChildren(h("h3", { id: "h-channel-detail" }, c.channel), dl, actions, last);
    if (events) this.lastEvents(c, last).catch((err) => this.app.failed(err));
  }

  async lastEvents(c, box) {
    const since = Math.max(c.first - 1, c.top - 10);
    const r = await get("/api/v1/log" + channelPath(c.channel) + query({ since, limit: 10 }));
    box.replaceChildren(h("h4", {}, "Last events"), h("ol", { class: "events" }, ...r.events.reverse().map((ev) => {
      const p = preview(ev);
      return h("li", {}, h("div", { class: "meta" }, `seq ${ev.seq}  ${nsDate(ev.time)}  ${ev.content_type} (${p.kind})`),
        h("pre", { class: "payload" }, p.text));
    })));
  }
}

// -- connections ---------------------------------------------------------------------------------------

export class Connections {
  constructor(app) {
    this.app = app;
    this.period = 3000;
    this.pager = new Pager($("conn-pager"), () => this.refresh());
    $("conn-filter").addEventListener("submit", (e) => {
      e.preventDefault();
      this.pager.reset();
      this.refresh().catch((err) => app.failed(err));
    });
    $("conn-auto").addEventListener("change", (e) => { this.period = e.target.checked ? 3000 : 0; app.schedule(); });
  }

  async refresh() {
    const r = await get("/api/v1/admin/connections" + query({
      after: this.pager.after, dialect: $("conn-dialect").value, q: $("conn-q").value.trim(), limit: 100 }));
    const rows = r.connections.map((c) => h("tr", { "data-id": c.id },
      h("td", {}, h("code", {}, c.id)), h("td", {}, c.dialect), h("td", {}, c.peer || "–"), h("td", {}, c.user || "–"),
      h("td", {}, `${c.subscriptions}`, c.patterns.length ? h("div", { class: "muted" }, c.patterns.join(" ")) : null),
      num(c.queued), num(c.delivered), num(c.dropped), h("td", {}, nsDate(c.opened_ns)),
      h("td", {}, h("button", { type: "button", class: "danger", "aria-label": `Disconnect ${c.id}`,
        onclick: () => this.disconnect(c) }, "Disconnect"))));
    $("conn-table").tBodies[0].replaceChildren(...(rows.length ? rows :
      [h("tr", {}, h("td", { colspan: 10, class: "muted" }, "No connections."))]));
    this.pager.render(r.next, rows.length);
  }

  async disconnect(c) {
    if (!(await confirmDialog(`Disconnect ${c.dialect} connection ${c.id}${c.user ? " of " + c.user : ""}${c.peer ? " from " + c.peer : ""}?`))) return;
    try {
      await send("DELETE", "/api/v1/admin/connections/" + encodeURIComponent(c.id));
      this.app.say(`Connection ${c.id} closed.`);
      await this.refresh();
    } catch (err) { this.app.failed(err); }
  }
}

// -- consumers -----------------------------------------------------------------------------------------

export class Consumers {
  constructor(app) {
    this.app = app;
    this.period = 3000;
    this.pager = new Pager($("cons-pager"), () => this.refresh());
    $("cons-auto").addEventListener("change", (e) => { this.period = e.target.checked ? 3000 : 0; app.schedule(); });
  }

  async refresh() {
    const r = await get("/api/v1/admin/consumers" + query({ after: this.pager.after, limit: 100 }));
    const rows = r.consumers.map((c) => h("tr", { "data-name": c.name },
      h("td", {}, c.name), h("td", {}, h("code", {}, c.pattern)), num(c.backlog), num(c.in_flight),
      num(c.redelivered), num(c.acked), h("td", {}, nsDate(c.last_ack_ns)), h("td", {}, c.owner || "–"),
      h("td", {}, h("div", { class: "row" },
        h("button", { type: "button", class: "secondary", "aria-label": `Reset ${c.name}`, onclick: () => this.reset(c) }, "Reset"),
        h("button", { type: "button", class: "danger", "aria-label": `Delete ${c.name}`, onclick: () => this.remove(c) }, "Delete")))));
    $("cons-table").tBodies[0].replaceChildren(...(rows.length ? rows :
      [h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No durable consumers."))]));
    this.pager.render(r.next, rows.length);
  }

  async remove(c) {
    if (!(await confirmDialog(`Delete consumer ${c.name} and its backlog of ${c.backlog} events?`))) return;
    try {
      await send("DELETE", "/api/v1/admin/consumers/" + encodeURIComponent(c.name));
      this.app.say(`Consumer ${c.name} deleted.`);
      await this.refresh();
    } catch (err) { this.app.failed(err); }
  }

  async reset(c) {
    if (!(await confirmDialog(`Reset consumer ${c.name}: drop its backlog of ${c.backlog} events and start from now?`))) return;
    try {
      await send("POST", "/api/v1/admin/consumers/" + encodeURIComponent(c.name) + "/reset");
      this.app.say(`Consumer ${c.name} starts from now.`);
      await this.refresh();
    } catch (err) { this.app.failed(err); }
  }
}

// -- cluster and federation ----------------------------------------------------------------------------

function table(caption, heads, rows) {
  return h("table", { class: "grid" }, h("caption", {}, caption),
    h("thead", {}, h("tr", {}, ...heads.map((x) => h("th", { scope: "col" }, x)))),
    h("tbody", {}, ...(rows.length ? rows.map((r) => h("tr", {}, ...r.map((v) => h("td", {}, String(v))))) :
      [h("tr", {}, h("td", { colspan: heads.length, class: "muted" }, "None."))])));
}

export class Cluster {
  constructor(app) { this.app = app; this.period = 5000; }
  async refresh() {
    const [c, f] = await Promise.all([get("/api/v1/cluster"), get("/api/v1/admin/federation")]);
    const parts = [];
    if (!c.nodes.length && !c.broker) parts.push(h("p", {}, "One node: no cluster broker."));
    else {
      // A node of several workers is one member per worker (docs/cluster.md "Nodes of several workers").
      const members = c.members || c.nodes;
      const of = (n) => members.filter((m) => m === n || m.startsWith(`${n}/w`));
      const here = c.member && c.member !== c.node_id ? ` (worker ${c.member})` : "";
      parts.push(h("p", {}, `This node: ${c.node_id}${here}. Broker: ${c.broker.state}. Presence: ${c.presence.state}.`));
      parts.push(table("Nodes", ["Node", "State", "Workers"], c.nodes.map((n) =>
        [n, "live", of(n).filter((m) => m !== n).join(", ") || "one process"])));
      parts.push(table("Broker", ["Field", "Value"], Object.entries(c.broker)));
    }
    parts.push(h("h3", {}, "Federation"), h("p", {}, f.node_id ? `Federation id: ${f.node_id}` : "Federation is off."));
    parts.push(table("Links up", ["Link", "State", "Upstream node", "Reconnects", "Sent up", "Received", "Gaps", "Lag (s)"],
      f.upstreams.map((u) => [u.name, u.state, u.upstream || "–", u.reconnects, u.sent_up, u.received_down, u.gaps, u.lag_s])));
    parts.push(table("Links from nodes below", ["Node", "Connected", "Connections", "Received", "Refused", "Sent"],
      f.downstreams.map((d) => [d.node, d.connected, d.connections, d.received, d.refused, d.sent])));
    $("cluster-body").replaceChildren(...parts);
  }
}

// -- publish -------------------------------------------------------------------------------------------

export class Publish {
  constructor(app) {
    this.app = app;
    this.period = 0;
    $("publish-form").addEventListener("submit", async (e) => {
      e.preventDefault();
      const channel = $("pub-channel").value.trim();
      try {
        const r = await send("POST", "/api/v1/publish" + channelPath(channel), $("pub-payload").value, $("pub-type").value);
        $("publish-result").textContent = `Published to ${r.channel}: seq ${r.seq}, epoch ${r.epoch}.`;
      } catch (err) {
        $("publish-result").textContent = "Not published: " + err.message;
        app.failed(err);
      }
    });
  }
  async refresh() {}
}
