// The dashboard's shell: hash routing between views, the token dialog, the status line, the refresh timer.

import { ApiError, setToken, token } from "./api.js";
import { Channels, Cluster, Connections, Consumers, Overview, Publish, duration } from "./views.js";

const $ = (id) => document.getElementById(id);

class App {
  constructor() {
    this.views = {
      overview: new Overview(this), channels: new Channels(this), connections: new Connections(this),
      consumers: new Consumers(this), cluster: new Cluster(this), publish: new Publish(this),
    };
    this.current = null;
    this.timer = null;
    window.addEventListener("hashchange", () => this.route());
    $("token-button").addEventListener("click", () => this.askToken(""));
    $("token-form").addEventListener("submit", () => {
      setToken($("token-input").value.trim());
      $("token-input").value = "";
      this.say("");
      this.refresh();
    });
    $("token-clear").addEventListener("click", () => { setToken(""); $("token-dialog").close(); this.refresh(); });
    $("token-cancel").addEventListener("click", () => $("token-dialog").close());
    document.addEventListener("visibilitychange", () => this.schedule());
  }

  route() {
    const name = (location.hash || "#overview").slice(1);
    const view = this.views[name] ? name : "overview";
    for (const s of document.querySelectorAll("main > section[data-view]")) s.hidden = s.dataset.view !== view;
    for (const a of document.querySelectorAll("nav a[data-view]")) {
      if (a.dataset.view === view) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const changed = this.current !== view;
    this.current = view;
    document.title = `hubbub: ${view}`;
    if (changed && location.hash) $("main").focus({ preventScroll: true });
    this.refresh();
  }

  async refresh() {
    clearTimeout(this.timer);
    const view = this.views[this.current];
    try {
      await view.refresh();
      if ($("status").classList.contains("error")) this.say("");
    } catch (err) {
      this.failed(err);
    }
    this.schedule();
  }

  schedule() {
    clearTimeout(this.timer);
    const view = this.views[this.current];
    if (view && view.period && !document.hidden) this.timer = setTimeout(() => this.refresh(), view.period);
  }

  say(text, error) {
    const s = $("status");
    s.textContent = text;
    s.classList.toggle("error", Boolean(error));
  }

  failed(err) {
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
      const why = err.status === 401 ? (token() ? "This token is not valid" : "A token is needed")
        : "This token has no admin permission";
      this.say(`${why}: ${err.message}`, true);
      this.askToken(`${why}.`);
    } else this.say(err.message || String(err), true);
  }

  askToken(why) {
    const d = $("token-dialog");
    if (why) $("token-why").textContent = why + " Enter a token with the admin permission; it is kept in this tab's session storage only.";
    if (!d.open) d.showModal();
  }

  summary(o) {
    $("node-summary").textContent =
      `${o.version} · up ${duration(o.uptime_s)} · ${o.connections.total} connections · ` +
      `${o.events.in_per_s.toFixed(1)} in/s, ${o.events.out_per_s.toFixed(1)} out/s`;
  }

  dialects(names) {
    const sel = $("conn-dialect");
    const have = new Set([...sel.options].map((o) => o.value));
    for (const n of names) if (!have.has(n)) sel.append(new Option(n, n));
  }
}

const app = new App();
app.route();
