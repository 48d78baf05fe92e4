"""Federation: events/s across one native link and the latency a hop adds, beside a NATS leaf-node link.

    PYTHONPATH=src python bench/federation_path.py [--events 20000] [--samples 2000] [--store memory]

Four setups, each on fresh processes on loopback, one publisher and one subscriber (both in this process,
so one clock):

* ``hubbub 1 node``: publisher and subscriber on one ``hubbub serve`` (native WebSocket, msgpack).
* ``hubbub link``: publisher on A, subscriber on B started with ``--upstream A`` (one hop down; the link
  subscribes upstream to B's interest and commits each event on B before delivering it there).
* ``hubbub 2 hops``: publisher on A, subscriber on C, with C ``--upstream B`` and B ``--upstream A``.
* ``nats 1 server``: publisher and subscriber on one ``nats-server`` (core NATS, no persistence).
* ``nats leaf link``: publisher on a hub ``nats-server``, subscriber on a leaf node connected to it
  (``leafnodes`` remotes).

Events/s: ``--events`` messages of 16 bytes published as fast as the socket takes them (hubbub: no ack;
NATS: plain PUB), counted when the last one arrives. Latency: one message at a time, publish → receipt,
p50/p99 over ``--samples``. ``--store memory`` runs hubbub with ``--durability none`` (what NATS core does:
nothing on disk); ``sqlite`` with the default commit durability (every event committed on each node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import Server, _hubbub, _popen, _wait_port, available, free_port
from proto import Spec

PAYLOAD = b"0123456789abcdef"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# -- hubbub (native WebSocket, msgpack) ---------------------------------------------------------------------


class Native:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.rid = 1

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, port: int) -> Native:
        ws = await http.ws_connect(f"ws://127.0.0.1:{port}/ws/hubbub", protocols=("hubbub.v1.msgpack",),
                                   max_msg_size=0)  # fmt: skip
        await ws.send_bytes(msgpack.packb({"op": "hello", "id": 0, "v": 1, "batch": True}))
        await ws.receive()
        return cls(ws)

    async def subscribe(self, pattern: str) -> None:
        await self.ws.send_bytes(msgpack.packb({"op": "subscribe", "id": 1, "sub": "s", "pattern": pattern}))
        while True:
            v = msgpack.unpackb((await self.ws.receive()).data, raw=False)
            if v.get("op") == "reply":
                return

    async def publish(self, channel: str, payload: bytes) -> None:
        self.rid += 1
        await self.ws.send_bytes(msgpack.packb({"op": "publish", "id": self.rid, "channel": channel,
                                                "payload": payload}, use_bin_type=True))  # fmt: skip

    async def events(self) -> list[dict[str, Any]]:
        """The events of the next message (a batch or one frame)."""
        msg = await self.ws.receive(timeout=60)
        v = msgpack.unpackb(msg.data, raw=False)
        frames = v["frames"] if v.get("op") == "batch" else [v]
        return [f for f in frames if f.get("op") == "event"]


async def hubbub_pair(pub_port: int, sub_port: int, events: int, samples: int,
                      ready: Callable[[], Awaitable[None]] | None = None) -> dict[str, float]:  # fmt: skip
    async with aiohttp.ClientSession() as http:
        sub = await Native.open(http, sub_port)
        pub = await Native.open(http, pub_port)
        await sub.subscribe("/bench/**")
        # Interest may take a moment to cross a link: probe until one arrives.
        while True:
            await pub.publish("/bench/probe", b"p")
            try:
                if await asyncio.wait_for(sub.events(), 0.2):
                    break
            except TimeoutError:
                continue
        await asyncio.sleep(0.3)
        while True:  # drain the probes
            try:
                await asyncio.wait_for(sub.events(), 0.3)
            except TimeoutError:
                break

        async def drain() -> None:
            got = 0
            while got < events:
                got += sum(1 for e in await sub.events() if e["channel"] == "/bench/x")

        t0 = time.perf_counter()
        task = asyncio.ensure_future(drain())
        for _ in range(events):
            await pub.publish("/bench/x", PAYLOAD)
        await task
        rate = events / (time.perf_counter() - t0)
        lat: list[float] = []
        for i in range(samples):
            t0 = time.perf_counter()
            await pub.publish("/bench/lat", str(i).encode())
            done = False
            while not done:
                done = any(e["channel"] == "/bench/lat" and e["payload"] == str(i).encode()
                           for e in await sub.events())  # fmt: skip
            lat.append((time.perf_counter() - t0) * 1e6)
        await pub.ws.close()
        await sub.ws.close()
    return {"events/s": round(rate), "p50 µs": round(statistics.median(lat)), "p99 µs": round(pct(lat, 0.99))}


# -- NATS (core protocol, by hand) --------------------------------------------------------------------------


class Nats:
    def __init__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.r, self.w = r, w

    @classmethod
    async def open(cls, port: int) -> Nats:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        await r.readline()  # INFO
        w.write(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
        await w.drain()
        while (await r.readline()).strip() != b"PONG":
            pass
        return cls(r, w)

    async def sub(self, subject: str) -> None:
        self.w.write(f"SUB {subject} 1\r\nPING\r\n".encode())
        await self.w.drain()
        while (await self.r.readline()).strip() != b"PONG":
            pass

    def pub(self, subject: str, payload: bytes) -> None:
        self.w.write(b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))

    async def msg(self) -> tuple[str, bytes]:
        while True:
            line = await self.r.readline()
            if line.startswith(b"MSG "):
                parts = line.split()
                payload = await self.r.readexactly(int(parts[-1]) + 2)
                return parts[1].decode(), payload[:-2]
            if line.startswith(b"PING"):
                self.w.write(b"PONG\r\n")


async def nats_pair(pub_port: int, sub_port: int, events: int, samples: int) -> dict[str, float]:
    sub = await Nats.open(sub_port)
    pub = await Nats.open(pub_port)
    await sub.sub("bench.>")
    while True:  # interest crosses a leaf link asynchronously: probe until one arrives
        pub.pub("bench.probe", b"p")
        await pub.w.drain()
        try:
            await asyncio.wait_for(sub.msg(), 0.2)
            break
        except TimeoutError:
            continue
    await asyncio.sleep(0.3)
    while True:
        try:
            await asyncio.wait_for(sub.msg(), 0.3)
        except TimeoutError:
            break

    async def drain() -> None:
        got = 0
        while got < events:
            subject, _ = await sub.msg()
            got += subject == "bench.x"

    t0 = time.perf_counter()
    task = asyncio.ensure_future(drain())
    for i in range(events):
        pub.pub("bench.x", PAYLOAD)
        if i % 64 == 0:
            await pub.w.drain()
    await pub.w.drain()
    await task
    rate = events / (time.perf_counter() - t0)
    lat: list[float] = []
    for i in range(samples):
        want = str(i).encode()
        t0 = time.perf_counter()
        pub.pub("bench.lat", want)
        await pub.w.drain()
        while await sub.msg() != ("bench.lat", want):
            pass
        lat.append((time.perf_counter() - t0) * 1e6)
    pub.w.close()
    sub.w.close()
    return {"events/s": round(rate), "p50 µs": round(statistics.median(lat)), "p99 µs": round(pct(lat, 0.99))}


def nats_server(conf: str) -> tuple[Server, int]:
    exe = available("nats")
    if exe is None:
        raise SystemExit("nats-server not found (apt-get install -y nats-server)")
    tmp = tempfile.mkdtemp(prefix="nats-bench-")
    port = free_port()
    path = Path(tmp) / "nats.conf"
    path.write_text(f"listen: 127.0.0.1:{port}\n{conf}")
    srv = Server(
        "nats", _popen([exe, "-c", str(path)], Path(tmp) / "nats.log"), tmp, {"nats": Spec("nats", port)}
    )
    _wait_port(port, srv.proc)
    return srv, port


# -- main ---------------------------------------------------------------------------------------------------


def hubbub(store: str, extra: list[str]) -> Server:
    base = ["--store", "memory", "--durability", "none"] if store == "memory" else []
    return _hubbub(base + extra)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    a = ap.parse_args()
    out: dict[str, dict[str, float]] = {}
    with hubbub(a.store, ["--federation-node-id", "A"]) as one:
        p = one.specs["hubbub"].http_port
        out["hubbub 1 node"] = asyncio.run(hubbub_pair(p, p, a.events, a.samples))
    with hubbub(a.store, ["--federation-node-id", "A"]) as up:
        pa = up.specs["hubbub"].http_port
        with hubbub(a.store, ["--federation-node-id", "B", "--upstream", f"ws://127.0.0.1:{pa}"]) as down:
            pb = down.specs["hubbub"].http_port
            out["hubbub link (A→B)"] = asyncio.run(hubbub_pair(pa, pb, a.events, a.samples))
            out["hubbub link up (B→A)"] = asyncio.run(hubbub_pair(pb, pa, a.events, a.samples))
            with hubbub(a.store, ["--federation-node-id", "C", "--upstream", f"ws://127.0.0.1:{pb}"]) as low:
                pc = low.specs["hubbub"].http_port
                out["hubbub 2 hops (A→B→C)"] = asyncio.run(hubbub_pair(pa, pc, a.events, a.samples))
    srv, port = nats_server("")
    with srv:
        out["nats 1 server"] = asyncio.run(nats_pair(port, port, a.events, a.samples))
    leaf_port = free_port()
    hub, hub_port = nats_server(f"leafnodes {{ listen: 127.0.0.1:{leaf_port} }}\n")
    with hub:
        leaf, lport = nats_server(
            f'leafnodes {{ remotes = [ {{ url: "nats-leaf://127.0.0.1:{leaf_port}" }} ] }}\n'
        )
        with leaf:
            out["nats leaf link (hub→leaf)"] = asyncio.run(nats_pair(hub_port, lport, a.events, a.samples))
    print(json.dumps({"store": a.store, "events": a.events, "samples": a.samples, "results": out}, indent=1,
                     ensure_ascii=False))  # fmt: skip


if __name__ == "__main__":
    main()
