"""WearScript through hubbub: events/s and latency on one node, and across one ``--wearscript-upstream`` link.

    PYTHONPATH=src python bench/wearscript_path.py [--events 20000] [--samples 2000] [--store memory]

Scenarios (each against fresh ``hubbub serve`` processes on loopback; ``--store memory`` runs them with
``--durability none``, ``sqlite`` with the default commit durability):

* ``fanout``: one WearScript device publishes ``--events`` frames of 16 bytes as fast as the socket takes
  them; three devices listen. Events/s = events x receivers / (first send → last frame at every receiver).
* ``latency``: one device sends, another receives, one frame at a time: p50/p99 of the one-way time (both
  ends in this process, so one clock).
* ``link``: the same two, the sender on a hub and the receiver on a node linked up to it (one hop): events/s
  of a one-to-one stream and p50/p99 latency. The difference with ``latency`` is the cost of the hop.

Every event is committed to the log on each node it reaches before it is delivered there.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import Server, _hubbub


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start(store: str, extra: list[str] | None = None) -> Server:
    base = ["--store", "memory", "--durability", "none"] if store == "memory" else []
    return _hubbub(base + (extra or []))


async def device(http: aiohttp.ClientSession, port: int, gd: str, listen: list[str]) -> Any:
    ws = await http.ws_connect(f"ws://127.0.0.1:{port}/wearscript/ws", max_msg_size=0)
    await ws.receive()  # the hub's list
    if listen:
        await ws.send_bytes(msgpack.packb(["subscriptions", gd, listen]))
    return ws


async def until_listed(ws: Any, gd: str) -> None:
    """Frames until the list of ``gd`` arrives (the hub forwards lists after it subscribed)."""
    while True:
        msg = await ws.receive(timeout=30)
        v = msgpack.unpackb(msg.data, raw=False)
        if v[0] == "subscriptions" and v[1] == gd and v[2]:
            return


async def stream(sender: Any, receivers: list[Any], n: int) -> float:
    """Events/s of ``n`` frames from ``sender`` to every receiver."""
    frame = msgpack.packb(["bench:x", "0123456789abcdef"])

    async def drain(ws: Any) -> None:
        got = 0
        while got < n:
            msg = await ws.receive(timeout=60)
            if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] != b"\x93":
                got += 1

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(drain(r)) for r in receivers]
    for _ in range(n):
        await sender.send_bytes(frame)
    await asyncio.gather(*tasks)
    return n * len(receivers) / (time.perf_counter() - t0)


async def latency(sender: Any, receiver: Any, samples: int) -> tuple[float, float]:
    out: list[float] = []
    for i in range(samples):
        t0 = time.perf_counter()
        await sender.send_bytes(msgpack.packb(["bench:lat", i]))
        while True:
            msg = await receiver.receive(timeout=30)
            v = msgpack.unpackb(msg.data, raw=False)
            if v == ["bench:lat", i]:
                break
        out.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(out), pct(out, 0.99)


async def one_node(port: int, events: int, samples: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        rx = [await device(http, port, f"rx:{i}", ["bench"]) for i in range(3)]
        tx = await device(http, port, "tx:0", [])
        for i in range(3):
            await until_listed(tx, f"rx:{i}")
        rate = await stream(tx, rx, events)
        p50, p99 = await latency(tx, rx[0], samples)
        for ws in (*rx, tx):
            await ws.close()
    return {"fanout 1→3 events/s": round(rate), "latency p50 µs": round(p50), "latency p99 µs": round(p99)}


async def linked(above: int, below: int, events: int, samples: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        tx = await device(http, above, "tx:0", [])
        rx = await device(http, below, "rx:0", ["bench"])
        await until_listed(tx, "rx:0")  # the list went up the link
        rate = await stream(tx, [rx], events)
        p50, p99 = await latency(tx, rx, samples)
        await tx.close()
        await rx.close()
    return {"link 1→1 events/s": round(rate), "link p50 µs": round(p50), "link p99 µs": round(p99)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    a = ap.parse_args()
    with start(a.store) as node:
        print(asyncio.run(one_node(node.specs["hubbub"].http_port, a.events, a.samples)))
    with start(a.store, ["--wearscript-group-device", "server:a"]) as up:
        url = f"ws://127.0.0.1:{up.specs['hubbub'].http_port}/wearscript/ws"
        with start(a.store, ["--wearscript-upstream", url, "--wearscript-group-device", "server:b"]) as down:
            print(asyncio.run(linked(up.specs["hubbub"].http_port, down.specs["hubbub"].http_port, a.events,
                                     a.samples)))  # fmt: skip


if __name__ == "__main__":
    main()
