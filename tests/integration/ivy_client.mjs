// An Ivy client that speaks the protocol the way chromakode/ivy-client.js does (same framing, same ack-key
// numbering, same message parsing with decodeURIComponent, load() over HTTP from /log<path>?n=<count>),
// written for Node 20 (built-in WebSocket and fetch) instead of a browser window.
//
//   node --experimental-websocket tests/integration/ivy_client.mjs 127.0.0.1:8080 [--cookie NAME=VALUE]
//
// With --cookie, it does what a browser does for a page on the server's origin that holds that cookie (such
// as hubbub_token, docs/dialects/ivy.md "Auth"): the cookie goes with the WebSocket upgrade and with every
// HTTP request, an Origin header (the page's origin) with the upgrade and with POSTs. ivy-client.js itself
// is unchanged: it knows nothing of tokens.
//
// Runs one scenario against a hubbub server and prints one JSON object with what it observed. It exits
// non-zero (with the reason on stderr) when the server does not behave as Ivy clients expect.

import { EventEmitter } from "node:events";

const TIMEOUT_MS = 5000;
const COOKIE = (process.argv.find((a) => a.startsWith("--cookie=")) || "").slice("--cookie=".length);

// The headers a browser adds to a request from a page on the server's own origin ("http:" + url).
function browserHeaders(url, withOrigin) {
  if (!COOKIE) {
    return {};
  }
  return withOrigin ? { Cookie: COOKIE, Origin: "http:" + url } : { Cookie: COOKIE };
}

class Ivy extends EventEmitter {
  constructor(url) {
    super();
    this.url = url;
    this._nextAckKey = 0;
    this._pendingAcks = {};
    this.s = new WebSocket("ws:" + url + "/ws", { protocols: ["ivy1"], headers: browserHeaders(url, true) });
    this.s.onopen = (ev) => this.emit("ready", ev);
    this.s.onclose = (ev) => this.emit("close", ev);
    this.s.onmessage = (ev) => this._handleMessage(ev.data);
  }

  _ackCallback(ackKey, data) {
    if (!ackKey) {
      return;
    }
    if (Object.prototype.hasOwnProperty.call(this._pendingAcks, ackKey)) {
      this._pendingAcks[ackKey](data);
      delete this._pendingAcks[ackKey];
    }
  }

  _handleMessage(data) {
    let ackKey;
    if (data[0] === "#") {
      const ackEnd = data.indexOf("#", 1);
      if (ackEnd === -1) {
        throw new Error("invalid ack message: " + data);
      }
      ackKey = data.substr(1, ackEnd - 1);
      data = data.substr(ackEnd + 1);
    }
    let ts;
    if (data[0] === "@") {
      let tsEnd = data.indexOf(":", 1);
      if (tsEnd === -1) {
        tsEnd = data.length;
      }
      ts = data.substring(1, tsEnd);
      data = data.substr(tsEnd);
    } else {
      throw new Error("invalid message: " + data);
    }
    switch (data[0]) {
      case undefined:
        this._ackCallback(ackKey, ts);
        this.emit("timestamp", ts);
        break;
      case ":": {
        const parts = data.split(":");
        const path = parts[1];
        const body = decodeURIComponent(parts.slice(2).join(":"));
        this._ackCallback(ackKey, body);
        this.emit("msg", path, body, ts);
        break;
      }
      default:
        throw new Error("invalid message: " + data);
    }
  }

  subscribe(path) {
    this.s.send("+" + path);
  }

  unsubscribe(path) {
    this.s.send("-" + path);
  }

  _send(msg, callback) {
    if (callback) {
      this._pendingAcks[this._nextAckKey] = callback;
      msg = "#" + this._nextAckKey + "#" + msg;
      this._nextAckKey++;
    }
    this.s.send(msg);
  }

  send(path, data, callback) {
    this._send(":" + path + ":" + data, callback);
  }

  getTimestamp(callback) {
    this._send("@", callback);
  }

  // ivy-client.js: GET http://<url>/log<path>?n=<count>, then every non-empty line is handled as a message.
  async load(path, count) {
    const params = count ? "?n=" + count : "";
    const res = await fetch("http:" + this.url + "/log" + path + params, { headers: browserHeaders(this.url, false) });
    if (res.status !== 200) {
      throw new Error("load " + path + ": HTTP " + res.status);
    }
    const lines = (await res.text()).split("\n");
    const got = [];
    const onMsg = (p, body, ts) => got.push({ path: p, data: body, ts });
    this.on("msg", onMsg);
    try {
      for (const line of lines) {
        if (line) {
          this._handleMessage(line);
        }
      }
    } finally {
      this.off("msg", onMsg);
    }
    return got;
  }

  close() {
    this.s.close();
  }
}

function within(promise, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error("timed out waiting for " + what)), TIMEOUT_MS);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// Resolves with the sid from the session-id pseudo-event, which clients treat as "ready".
function connect(url) {
  const ivy = new Ivy(url);
  const msgs = [];
  ivy.on("msg", (path, data, ts) => msgs.push({ path, data, ts }));
  const sid = new Promise((resolve) => {
    const onMsg = (path, data) => {
      if (path === "~/sid") {
        ivy.off("msg", onMsg);
        resolve(data);
      }
    };
    ivy.on("msg", onMsg);
  });
  return within(sid, "the ~/sid pseudo-event").then((s) => ({ ivy, sid: s, msgs }));
}

function timestamp(ivy) {
  return within(new Promise((resolve) => ivy.getTimestamp(resolve)), "an ack-keyed timestamp");
}

function nextMsg(ivy, path) {
  return within(
    new Promise((resolve) => {
      const onMsg = (p, data, ts) => {
        if (p === path) {
          ivy.off("msg", onMsg);
          resolve({ path: p, data, ts });
        }
      };
      ivy.on("msg", onMsg);
    }),
    "an event on " + path,
  );
}

function check(cond, why) {
  if (!cond) {
    throw new Error(why);
  }
}

async function main() {
  const url = "//" + process.argv[2];
  const a = await connect(url);
  const b = await connect(url);
  check(/^[0-9a-f]{16}$/.test(a.sid), "bad sid " + a.sid);

  a.ivy.subscribe("/chat");
  b.ivy.subscribe("/chat");
  // The ack-keyed timestamp is the barrier: commands on one connection are handled in order.
  const tsA = await timestamp(a.ivy);
  const tsB = await timestamp(b.ivy);
  check(/^\d{10}\.\d{9}$/.test(tsA) && /^\d{10}\.\d{9}$/.test(tsB), "bad timestamps");
  check(a.ivy._nextAckKey === 1, "ack keys are numbered from 0");

  // Publish from B; A receives the text back intact through ivyesc + decodeURIComponent.
  const text = "hello: world % 50%\nnext";
  let got = nextMsg(a.ivy, "/chat/room");
  b.ivy.send("/chat/room", text);
  const first = await got;
  got = nextMsg(a.ivy, "/chat/room");
  b.ivy.send("/chat/room", "second");
  const second = await got;

  // B never sees its own events: the first thing it receives is A's later publish.
  const bNext = nextMsg(b.ivy, "/chat/room");
  a.ivy.send("/chat/room", "from a");
  const fromA = await bNext;

  // An HTTP publish with A's sid (multipart FormData, as a browser sends it) excludes A but reaches B.
  const formEvent = nextMsg(b.ivy, "/chat/form");
  const fd = new FormData();
  fd.append("data", "via form");
  fd.append("sid", a.sid);
  const res = await fetch("http:" + url + "/events/chat/form", {
    method: "POST",
    body: fd,
    headers: browserHeaders(url, true),
  });
  check(res.status === 200 && (await res.text()) === "", "POST /events/chat/form: HTTP " + res.status);
  const viaForm = await formEvent;
  await timestamp(a.ivy); // A has handled everything sent to it before this reply
  const aPaths = a.msgs.map((m) => m.path); // load() below emits "msg" too: take these first

  const loadedOne = await a.ivy.load("/chat/room", 1);
  const loadedTwo = await a.ivy.load("/chat/room", 2);
  const loadedAll = await a.ivy.load("/chat/room");

  const closed = new Promise((resolve) => a.ivy.on("close", resolve));
  a.ivy.close();
  b.ivy.close();
  await within(closed, "the close");

  const report = {
    sid: a.sid,
    timestamp: tsA,
    first: first.data,
    second: second.data,
    b_first: fromA.data,
    b_form: viaForm.data,
    a_paths: aPaths,
    loaded_one: loadedOne.map((m) => m.data),
    loaded_two: loadedTwo.map((m) => m.data),
    loaded_all: loadedAll.map((m) => m.data),
    load_ts_matches_live: loadedAll.length > 0 && loadedAll[0].ts === first.ts,
  };
  process.stdout.write(JSON.stringify(report) + "\n");
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
    process.exit(1);
  },
);
