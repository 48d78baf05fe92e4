"""Durable consumer throughput over the wire: events published, stored, delivered in batches and acknowledged,
end to end, hubbub side by side with a JetStream durable pull consumer and Redis streams consumer groups.

PYTHONPATH=src python bench/consumer_wire.py [--events 20000] [--events-single 4000] [--batches 1,100]
    [--payload 100] [--peers hubbub,js,redis] [--drain] [--frame-writes] [--frame-reads] [--json OUT]

Each run starts a fresh server on a free loopback port (bench/procs.py): hubbub with the SQLite store and
``--durability commit``, ``nats-server -js`` with file storage, ``redis-server`` with ``appendfsync
everysec``.
One publisher connection pipelines publishes in windows of 1000 (each acknowledged by the server once stored:
hubbub ``publish`` with ``ack``, JetStream ``PubAck``, Redis ``XADD`` in a pipeline) while one consumer
connection takes batches of at most B events and acknowledges each batch before it takes the next. A window
goes out as one write, as a Redis pipeline does (hubbub: its 1000 frames joined; with ``--frame-writes``, one
write per publish frame, as this bench did before 2026-11-27 04:00 UTC; nats-py buffers its publishes itself).
hubbub's connections decode every whole frame of each read, as hubbub's client library does and as redis-py
does with hiredis (with ``--frame-reads``, two reads per frame, its length then its body, as this bench did
before 2026-11-27 07:15 UTC):

* hubbub: ``consume`` with ``max`` B over native TCP msgpack; ``ack`` answered once the items are durably
  gone from the journal; the next batch comes after it.
* JetStream: a durable pull consumer with ``AckPolicy.ALL``; ``fetch(B)``, then ``ack_sync`` of the batch's
  last message (acknowledges the batch, confirmed by the server).
* Redis: ``XREADGROUP COUNT B`` on a consumer group, then ``XACK`` of the batch's ids.

The figure is events acknowledged per second from the first publish to the last acknowledgement (with
``--drain``: every event is published first, and the figure is the consumer's alone, draining the backlog),
and the server process's CPU time (user + system, all its threads) per event over the same span, which
other load on the machine disturbs less.
A peer whose server binary or client library is missing is skipped, saying so. The driver is one Python
process (asyncio) for every target, so client overhead is in every figure alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import Server, available, start

from hubbub.client.framing import Framing

WINDOW = 1000
#: ``--drain``: publish everything first, then time the consumer alone (the backlog drained).
DRAIN = False
#: One write per publish frame instead of one per window (``--frame-writes``).
FRAME_WRITES = False
#: Two reads per frame received (its length, then its body) instead of decoding every whole frame of each
#: read (``--frame-reads``).
FRAME_READS = False
#: The server's CPU time (user + system, all threads) per event over the timed phase of the last run, in µs:
#: less sensitive than events/s to the other processes of a loaded machine.
CPU_US = [0.0]


# -- hubbub ------------------------------------------------------------------------------------------------


class _Msgpack:
    """One native TCP msgpack connection (length-prefixed frames)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.r, self.w = reader, writer
        self.ids = 0
        self.framing = Framing("length", 1 << 26)
        self.frames: deque[dict[str, Any]] = deque()

    @classmethod
    async def open(cls, port: int) -> _Msgpack:
        r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 26)
        c = cls(r, w)
        c.send({"op": "hello", "id": 1, "v": 1})
        assert (await c.recv())["op"] == "reply"
        return c

    def send(self, obj: dict[str, Any]) -> None:
        self.w.write(self.frame(obj))

    @staticmethod
    def frame(obj: dict[str, Any]) -> bytes:
        data: bytes = msgpack.packb(obj, use_bin_type=True)
        return len(data).to_bytes(4, "big") + data

    async def recv(self) -> dict[str, Any]:
        while True:
            if FRAME_READS:
                n = int.from_bytes(await self.r.readexactly(4), "big")
                obj: dict[str, Any] = msgpack.unpackb(await self.r.readexactly(n), raw=False)
            else:
                while not self.frames:
                    await self._read()
                obj = self.frames.popleft()
            if obj.get("op") != "ping":
                return obj
            self.send({"op": "pong"})

    async def _read(self) -> None:
        """Read what has arrived and decode every whole frame in it (hubbub's client library's framing)."""
        data = await self.r.read(1 << 16)
        if not data:
            raise ConnectionError("closed by the server")
        self.frames.extend(msgpack.unpackb(body, raw=False) for body in self.framing.feed(data))

    def close(self) -> None:
        self.w.close()


async def hubbub_run(srv: Server, n: int, batch: int, payload: bytes) -> float:
    port = srv.specs["hubbub"].port
    pub, con = await _Msgpack.open(port), await _Msgpack.open(port)
    con.send({"op": "consume", "id": 2, "consumer": "bench", "pattern": "/bench/**", "max": batch})
    reply = await con.recv()
    assert reply["op"] == "reply", reply
    done = 0

    async def publish() -> None:
        i = 0
        while i < n:
            k = min(WINDOW, n - i)
            frames = [
                pub.frame(
                    {"op": "publish", "id": i + j, "channel": "/bench/a", "payload": payload, "ack": True}
                )
                for j in range(k)
            ]
            if FRAME_WRITES:
                for f in frames:
                    pub.w.write(f)
            else:
                pub.w.write(b"".join(frames))
            for _ in range(k):
                r = await pub.recv()
                assert r["op"] == "reply", r
            i += k

    async def consume() -> None:
        nonlocal done
        rid = 10
        while done < n:
            d = await con.recv()
            assert d["op"] == "deliver", d
            rid += 1
            con.send({"op": "ack", "id": rid, "consumer": "bench", "batch": d["batch"]})
            done += len(d["items"])
            r = await con.recv()
            assert r["op"] == "reply" and r["id"] == rid, r

    t0, c0 = time.perf_counter(), srv.cpu_s()
    if DRAIN:
        await publish()
        t0, c0 = time.perf_counter(), srv.cpu_s()
        await consume()
    else:
        await asyncio.gather(publish(), consume())
    rate = n / (time.perf_counter() - t0)
    CPU_US[0] = (srv.cpu_s() - c0) / n * 1e6
    pub.close()
    con.close()
    return rate


# -- JetStream ---------------------------------------------------------------------------------------------


async def js_run(srv: Server, n: int, batch: int, payload: bytes) -> float:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    url = f"nats://127.0.0.1:{srv.specs['js'].port}"
    pnc, cnc = await nats.connect(url), await nats.connect(url)
    pjs, cjs = pnc.jetstream(), cnc.jetstream()
    cfg = ConsumerConfig(ack_policy=AckPolicy.ALL, max_ack_pending=-1, max_waiting=512)
    psub = await cjs.pull_subscribe("js.bench", durable="bench", config=cfg)
    done = 0

    async def publish() -> None:
        i = 0
        while i < n:
            k = min(WINDOW, n - i)
            await asyncio.gather(*(pjs.publish("js.bench", payload) for _ in range(k)))
            i += k

    async def consume() -> None:
        nonlocal done
        while done < n:
            try:
                msgs = await psub.fetch(batch, timeout=5)
            except nats.errors.TimeoutError:
                continue
            await msgs[-1].ack_sync()
            done += len(msgs)

    t0, c0 = time.perf_counter(), srv.cpu_s()
    if DRAIN:
        await publish()
        t0, c0 = time.perf_counter(), srv.cpu_s()
        await consume()
    else:
        await asyncio.gather(publish(), consume())
    rate = n / (time.perf_counter() - t0)
    CPU_US[0] = (srv.cpu_s() - c0) / n * 1e6
    await pnc.close()
    await cnc.close()
    return rate


# -- Redis streams -----------------------------------------------------------------------------------------


async def redis_run(srv: Server, n: int, batch: int, payload: bytes) -> float:
    import redis.asyncio as aioredis

    port = srv.specs["xredis"].port
    p, c = aioredis.Redis(port=port), aioredis.Redis(port=port)
    await c.xgroup_create("bench", "g", id="0", mkstream=True)
    done = 0

    async def publish() -> None:
        i = 0
        while i < n:
            k = min(WINDOW, n - i)
            pipe = p.pipeline(transaction=False)
            for _ in range(k):
                pipe.xadd("bench", {"p": payload})
            await pipe.execute()
            i += k

    async def consume() -> None:
        nonlocal done
        while done < n:
            # RESP2 (the client's default): [[stream, [(id, fields), ...]]], or empty on the block's timeout.
            got = cast(
                "list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]]",
                await c.xreadgroup("g", "c1", {"bench": ">"}, count=batch, block=1000),
            )
            if not got:
                continue
            ids = [mid for mid, _ in got[0][1]]
            await c.xack("bench", "g", *ids)
            done += len(ids)

    t0, c0 = time.perf_counter(), srv.cpu_s()
    if DRAIN:
        await publish()
        t0, c0 = time.perf_counter(), srv.cpu_s()
        await consume()
    else:
        await asyncio.gather(publish(), consume())
    rate = n / (time.perf_counter() - t0)
    CPU_US[0] = (srv.cpu_s() - c0) / n * 1e6
    await p.aclose()
    await c.aclose()
    return rate


# -- driver ------------------------------------------------------------------------------------------------

PEERS: dict[str, tuple[str, Callable[[Server, int, int, bytes], Coroutine[Any, Any, float]], str]] = {
    "hubbub": ("hubbub-commit", hubbub_run, "SQLite, durability commit"),
    "js": ("js", js_run, "JetStream file storage, AckPolicy.ALL"),
    "redis": ("redis-aof-commit", redis_run, "AOF appendfsync everysec"),
}


def _missing(peer: str) -> str | None:
    if peer == "js":
        if available("nats") is None:
            return "nats-server not found (apt-get install -y nats-server)"
        try:
            import nats  # noqa: F401
        except ImportError:
            return "nats-py not installed (the dev extras)"
    if peer == "redis" and available("redis") is None:
        return "redis-server not found"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20_000, help="events per run with batches above 1")
    ap.add_argument("--events-single", type=int, default=4_000, help="events per run with batch 1")
    ap.add_argument("--batches", default="1,100")
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--peers", default="hubbub,js,redis")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    ap.add_argument("--drain", action="store_true", help="publish first, then time draining the backlog")
    ap.add_argument(
        "--frame-writes", action="store_true", help="hubbub's publisher: one write per frame, not per window"
    )
    ap.add_argument(
        "--frame-reads", action="store_true", help="hubbub's connections: two reads per frame received"
    )
    a = ap.parse_args()
    global DRAIN, FRAME_WRITES, FRAME_READS
    DRAIN = a.drain
    FRAME_WRITES = a.frame_writes
    FRAME_READS = a.frame_reads
    payload = b"x" * a.payload
    rows: list[dict[str, Any]] = []
    print(f"# {platform.node()} nproc={os.cpu_count()} load={os.getloadavg()[0]:.2f} payload={a.payload}B")
    for batch in (int(b) for b in a.batches.split(",")):
        n = a.events_single if batch == 1 else a.events
        for peer in a.peers.split(","):
            why = _missing(peer)
            if why is not None:
                print(f"batch={batch:<4} {peer:<7} skipped: {why}")
                continue
            target, fn, what = PEERS[peer]
            srv = start(target)
            try:
                rate = asyncio.run(fn(srv, n, batch, payload))
            finally:
                srv.stop()
            mode = "drained" if DRAIN else "end to end"
            cpu = CPU_US[0]
            rows.append(
                {
                    "batch": batch,
                    "peer": peer,
                    "events": n,
                    "rate": rate,
                    "server_cpu_us_per_event": cpu,
                    "setup": what,
                    "mode": mode,
                }
            )
            print(
                f"batch={batch:<4} {peer:<7} {rate:>10,.0f} events/s acked {mode},"
                f" server CPU {cpu:6.1f} µs/event ({n} events; {what})"
            )
    print(f"# load after: {os.getloadavg()[0]:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
