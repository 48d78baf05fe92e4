"""Mist fan-out through hubbub: tag subscriptions beside a path fan-out, deliveries per second.

    PYTHONPATH=src python bench/mist_path.py [--events 20000] [--store memory|sqlite]

Scenarios, each against a fresh ``hubbub serve`` process on loopback (``--store memory`` runs it with
``--durability none``, ``sqlite`` with the default commit durability); one publisher pipelines ``--events``
publishes as fast as the socket takes them, 100 subscribers read:

* ``mist tags``: 100 mist 2015 TCP subscribers with 1-3 tags each (uniform over a vocabulary of 20 tags),
  events with 3-5 tags from the same vocabulary, published by a mist 2015 connection. Each event reaches the
  subscribers one of whose sets it contains (a true subset test, computed here to know what to wait for).
* ``mist one tag``: the same clients, every subscriber on the tag ``all`` and every event carrying it (plus
  2-4 others): every event reaches all 100, as in a path fan-out, through the tag index.
* ``native path``: 100 native TCP subscribers (JSON, batch frames) on ``/bench`` and a native publisher: every
  event reaches all 100 (``bench/proto.py``, the suite's fan-out client).

Deliveries/s = deliveries / (first publish sent → last delivery read by every subscriber). Every event is
committed to the log before it is delivered. The driver runs in this process on the same machine; figures
are end to end, the server's CPU time is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procs import Server, _hubbub
from proto import Spec, count_stream, deliver_marker, open_pub, open_sub, pub_frames

SUBSCRIBERS = 100
VOCAB = [f"t{i}" for i in range(20)]


def start(store: str) -> tuple[Server, int]:
    base = ["--store", "memory", "--durability", "none"] if store == "memory" else []
    srv = _hubbub([*base, "--mist-tcp-listen", "127.0.0.1:0"])
    # procs._hubbub learns the http and native ports; the mist one is in the same log.
    for line in (Path(srv.tmp) / "server.log").read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("message") == "listening" and rec.get("listener") == "mist":
            return srv, int(rec["address"].rsplit(":", 1)[1])
    srv.stop()
    raise RuntimeError("no mist listener")


async def mist_fanout(port: int, n: int, one_tag: bool, seed: int = 5) -> tuple[float, int]:
    rng = random.Random(seed)
    if one_tag:
        subs = [[frozenset({"all"})] for _ in range(SUBSCRIBERS)]
    else:
        subs = [[frozenset(rng.sample(VOCAB, rng.randint(1, 3)))] for _ in range(SUBSCRIBERS)]
    events = []
    for _ in range(n):
        tags = set(rng.sample(VOCAB, rng.randint(3, 5) - (1 if one_tag else 0)))
        if one_tag:
            tags.add("all")
        events.append(tags)
    expect = [sum(1 for ev in events if any(s <= ev for s in mine)) for mine in subs]
    conns = []
    for mine in subs:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(b"subscribe " + ",".join(sorted(s)).encode() + b"\n" for s in mine) + b"ping\n")
        conns.append((reader, writer))
    for reader, _ in conns:
        assert await reader.readline() == b"pong\n"
    pr, pw = await asyncio.open_connection("127.0.0.1", port)
    payload = b"0123456789abcdef"
    burst = b"".join(b"publish " + ",".join(sorted(ev)).encode() + b" " + payload + b"\n" for ev in events)

    async def drain(reader: asyncio.StreamReader, want: int) -> None:
        got = 0
        while got < want:
            chunk = await reader.read(1 << 16)
            if not chunk:
                raise ConnectionError("closed")
            got += chunk.count(b"\n")

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(drain(r, w)) for (r, _), w in zip(conns, expect, strict=True)]
    pw.write(burst)
    await pw.drain()
    await asyncio.wait_for(asyncio.gather(*tasks), 600)
    elapsed = time.perf_counter() - t0
    for _, w in [*conns, (pr, pw)]:
        w.close()
    return sum(expect) / elapsed, sum(expect)


async def path_fanout(spec: Spec, n: int) -> tuple[float, int]:
    marker = deliver_marker(spec, "/bench")
    subs = [open_sub(spec, "/bench") for _ in range(SUBSCRIBERS)]
    pub = open_pub(spec)
    burst = pub_frames(spec, "/bench", b"0123456789abcdef", n, ack=False)
    loop = asyncio.get_running_loop()

    async def drain(sock: socket.socket, rest: bytes) -> None:
        sock.setblocking(False)
        got, tail = count_stream(rest, b"", marker)
        while got < n:
            chunk = await loop.sock_recv(sock, 1 << 16)
            if not chunk:
                raise ConnectionError("closed")
            k, tail = count_stream(chunk, tail, marker)
            got += k

    t0 = time.perf_counter()
    tasks = [asyncio.ensure_future(drain(c.sock, c.rest)) for c in subs]
    pub.sock.setblocking(False)
    await loop.sock_sendall(pub.sock, burst)
    await asyncio.wait_for(asyncio.gather(*tasks), 600)
    elapsed = time.perf_counter() - t0
    for c in [*subs, pub]:
        c.close()
    return n * SUBSCRIBERS / elapsed, n * SUBSCRIBERS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    args = parser.parse_args(argv)
    py = sys.version.split()[0]
    print(f"python {py}, store {args.store}, {SUBSCRIBERS} subscribers, {args.events} events")
    for name in ("mist tags", "mist one tag", "native path"):
        srv, mist_port = start(args.store)
        try:
            cpu0 = srv.cpu_s()
            if name == "native path":
                http = srv.specs["hubbub"].http_port
                rate, total = asyncio.run(
                    path_fanout(Spec("hubbub-json", srv.specs["hubbub"].port, http), args.events)
                )
            else:
                rate, total = asyncio.run(mist_fanout(mist_port, args.events, one_tag=name == "mist one tag"))
            cpu = srv.cpu_s() - cpu0
        finally:
            srv.stop()
        per = total / args.events
        print(f"{name:13s} {rate:12,.0f} deliveries/s  ({total:,} deliveries, {per:5.1f} per event,", end="")
        print(f" server CPU {cpu:5.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
