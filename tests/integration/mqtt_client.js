// MQTT.js (the npm "mqtt" package) over hubbub's /mqtt WebSocket: a subscriber and a publisher at QoS 0, 1
// and 2, a retained message, and a persistent session; prints one JSON object with what it saw.
// Usage: node mqtt_client.js <http port>
"use strict";
const mqtt = require("mqtt");

const url = `ws://127.0.0.1:${process.argv[2]}/mqtt`;
const opts = (id, extra) => Object.assign({ clientId: id, protocolVersion: 4, reconnectPeriod: 0 }, extra);

// onMessage is attached before the CONNACK: a persistent session's messages may come in the same read.
function connect(id, extra, onMessage) {
  return new Promise((resolve, reject) => {
    const c = mqtt.connect(url, opts(id, extra));
    if (onMessage) c.on("message", onMessage);
    c.once("connect", (ack) => resolve([c, ack]));
    c.once("error", reject);
    c.once("close", () => reject(new Error(`${id}: closed before CONNACK`)));
  });
}

const stage = (name) => process.stderr.write(`${name}\n`);

async function main() {
  const out = {};
  stage("started");
  const [pub] = await connect("js-pub");
  stage("pub connected");
  await pub.publishAsync("js/retained", "kept", { qos: 1, retain: true });
  const [sub, ack] = await connect("js-sub", { clean: false });
  out.sessionPresent = ack.sessionPresent;
  const got = [];
  const all = new Promise((resolve) => {
    sub.on("message", (topic, payload, packet) => {
      got.push([topic, payload.toString(), packet.qos, packet.retain]);
      stage(`message ${topic}`);
      if (got.length === 4) resolve();
    });
  });
  out.granted = (await sub.subscribeAsync({ "js/#": { qos: 2 } })).map((g) => g.qos);
  stage("subscribed");
  for (const qos of [0, 1, 2]) {
    await pub.publishAsync(`js/q${qos}`, `m${qos}`, { qos });
  }
  stage("published");
  await all;
  stage("received");
  out.messages = got;
  await sub.endAsync();
  await pub.publishAsync("js/away", "while away", { qos: 1 });
  let away;
  const gotAway = new Promise((resolve) => {
    away = (t, p) => resolve([t, p.toString()]);
  });
  const [back, ack2] = await connect("js-sub", { clean: false }, away);
  out.sessionPresentAgain = ack2.sessionPresent;
  stage("back");
  out.away = await gotAway;
  await back.endAsync();
  await pub.endAsync();
  process.stdout.write(JSON.stringify(out));
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err));
  process.exit(1);
});
