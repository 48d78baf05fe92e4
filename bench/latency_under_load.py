"""Delivery latency beside a pipelining publisher: what one busy connection costs the others.

PYTHONPATH=src python bench/latency_under_load.py [--samples 1500] [--interval-ms 2] [--window 1000]
    [--payload 100] [--durability commit]

Starts ``hubbub serve`` (SQLite, ``--durability`` as given) on free loopback ports (bench/procs.py). One
native TCP msgpack connection publishes to ``/load/a`` without pause, in windows of ``--window`` publishes
sent as one write, each window's acks awaited before the next (the shape of a bulk loader). Beside it, a
probe publishes one small event to ``/probe`` every ``--interval-ms`` on its own connection, and a third
connection subscribed to ``/probe`` times each from its publish to its delivery. Printed: the probe's
delivery latency percentiles in ms and the loader's events/s over the same span, as one JSON line.
The driver is one Python process (asyncio) for all three connections, so its own scheduling is in the
figures alike before and after a change; compare runs on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import start
from suite import cpu_model


def _cpu() -> str:
    """The CPU as the suite names it (with its family and model numbers), where ``/proc/cpuinfo`` exists."""
    try:
        return cpu_model(Path("/proc/cpuinfo").read_text())
    except OSError:
        return platform.processor() or platform.machine()


def _frame(obj: dict[str, Any]) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return len(data).to_bytes(4, "big") + data


async def _read(reader: asyncio.StreamReader) -> dict[str, Any]:
    n = int.from_bytes(await reader.readexactly(4), "big")
    obj: dict[str, Any] = msgpack.unpackb(await reader.readexactly(n), raw=False)
    return obj


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 26)
    writer.write(_frame({"op": "hello", "id": 1, "v": 1}))
    assert (await _read(reader))["op"] == "reply"
    return reader, writer


async def _load(port: int, window: int, payload: bytes, stop: asyncio.Event) -> int:
    reader, writer = await _connect(port)
    sent = 0
    while not stop.is_set():
        frames = [
            _frame({"op": "publish", "id": sent + j, "channel": "/load/a", "payload": payload, "ack": True})
            for j in range(window)
        ]
        writer.write(b"".join(frames))
        for _ in range(window):
            reply = await _read(reader)
            assert reply["op"] == "reply", reply
        sent += window
    writer.close()
    return sent


async def run(a: argparse.Namespace) -> dict[str, Any]:
    srv = start(f"hubbub-{a.durability}")
    try:
        port = srv.specs["hubbub"].port
        sub_r, sub_w = await _connect(port)
        sub_w.write(_frame({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/probe"}))
        assert (await _read(sub_r))["op"] == "reply"
        _, pub_w = await _connect(port)
        stop = asyncio.Event()
        loader = asyncio.create_task(_load(port, a.window, b"x" * a.payload, stop))
        await asyncio.sleep(0.5)  # the loader at full speed before the first sample
        t0 = time.perf_counter()
        lat: list[float] = []
        for k in range(a.samples):
            t = time.perf_counter()
            pub_w.write(_frame({"op": "publish", "id": 10 + k, "channel": "/probe", "payload": b"p"}))
            while (await _read(sub_r)).get("op") not in ("event", "batch"):
                pass
            lat.append((time.perf_counter() - t) * 1e3)
            await asyncio.sleep(a.interval_ms / 1000)
        stop.set()
        loaded = await loader
        span = time.perf_counter() - t0
        lat.sort()

        def q(p: float) -> float:
            return round(lat[int(p * (len(lat) - 1))], 2)

        return {
            "durability": a.durability,
            "window": a.window,
            "payload": a.payload,
            "samples": len(lat),
            "probe_ms": {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": round(lat[-1], 2)},
            "load_events_per_s": round(loaded / span),
            "cpu": _cpu(),
        }
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=1500, help="probe events to time")
    ap.add_argument("--interval-ms", type=float, default=2.0, help="pause between probe events")
    ap.add_argument("--window", type=int, default=1000, help="the loader's publishes per write")
    ap.add_argument("--payload", type=int, default=100, help="the loader's payload bytes")
    ap.add_argument("--durability", default="commit", choices=("fsync", "commit", "none"))
    print(json.dumps(asyncio.run(run(ap.parse_args()))))


if __name__ == "__main__":
    main()
