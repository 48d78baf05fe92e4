"""CPU cost per event of the native publish path, in process and without sockets.

Drives the real pieces (stream decoder, ``NativeConnection``, ``Node`` with its writer thread, the store,
fan-out, encoding, the subscriber's write loop) with pre-encoded msgpack frames and counts the bytes the
subscriber would have sent. The garbage collector is set up as a server process does
(:func:`hubbub.server.tune_gc`) unless ``--default-gc`` keeps the interpreter's settings. Process CPU time
per event is much steadier than a socket benchmark's rate on a shared machine, so use this for before/after
figures of hot-path changes; ``hubbub bench`` remains the end-to-end measure.

    PYTHONPATH=src python bench/core_path.py --events 200000 [--store memory|sqlite] [--ack] [--subs N]
        [--default-gc] [--auth off|jwt|jwt-narrow] [--sink [--batch ROWS]]

``--auth jwt`` runs with ``auth.mode = token``: every connection presents an HS256 JWT in ``hello`` whose
``publish`` and ``subscribe`` claims are ``["/b/**"]``, so each publish is checked against the grant (the
enforcement point in the core) and the subscription's grant check is made once, at subscribe time.
``jwt-narrow`` grants ``["/b/c", "/b/d"]`` and subscribes to ``/b/*``: the grant cannot cover the pattern,
so every delivery is checked too. ``bench/auth_cost.py`` compares them with ``off``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import tempfile
import time
from typing import Any

import msgpack

from hubbub.auth import Authenticator, KeySet, TokenAuthorizer
from hubbub.core import Node, NodeSettings
from hubbub.dialects import native as nc
from hubbub.log import RetentionPolicy, open_store
from hubbub.server import tune_gc
from hubbub.transports.native import NativeConnection
from hubbub.transports.tcp import dispatch


def frame(obj: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


class Sink:
    """A connection's socket side: counts bytes and frames written."""

    def __init__(self) -> None:
        self.bytes = 0
        self.writes = 0

    async def send(self, data: bytes) -> None:
        self.bytes += len(data)
        self.writes += 1

    async def close(self, code: int) -> None:
        pass


def connection(node: Node, codec: nc.NativeCodec, sink: Sink) -> NativeConnection:
    conn = NativeConnection(
        node,
        codec,
        send=sink.send,
        close=sink.close,
        max_frame=1 << 20,
        max_subscriptions=1024,
        send_queue=65536,
        send_queue_bytes=256 << 20,
        ping_interval=3600.0,
    )
    conn.start()
    return conn


async def feed(conn: NativeConnection, decoder: nc.NativeStreamDecoder, data: bytes) -> None:
    items = decoder.feed_runs(data)
    assert not any(isinstance(item, Exception) for item in items), items
    # Exactly what the TCP transport does with one read's items.
    await dispatch(conn, items)


BENCH_SECRET = b"bench-hs256-secret-0123456789abcdef"


def sink_publish(rid: int, position: str, payload: bytes, ack: bool) -> dict[str, Any]:
    """A publish as the Spark sink sends it (docs/pipeline.md "Sink")."""
    return {
        "op": "publish",
        "id": rid,
        "channel": "/b/c",
        "payload": payload,
        "ack": ack,
        "content_type": "text/plain",
        "headers": {"hubbub-source": position},
        "idem": position,
    }


def sink_batch(rid: int, positions: list[str], payload: bytes, ack: bool) -> dict[str, Any]:
    """Rows as the Spark sink sends them, as one ``publish_batch`` frame."""
    return {
        "op": "publish_batch",
        "id": rid,
        "channel": "/b/c",
        "payloads": [payload] * len(positions),
        "ack": ack,
        "content_type": "text/plain",
        "headers": [{"hubbub-source": p} for p in positions],
        "idems": positions,
    }


def auth_setup(mode: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(Node keyword arguments, hello fields, subscription pattern) for ``--auth``."""
    if mode == "off":
        return {}, {}, "/b/c"
    import jwt

    grant = ["/b/**"] if mode == "jwt" else ["/b/c", "/b/d"]
    token = jwt.encode(
        {"sub": "bench", "publish": grant, "subscribe": grant, "exp": int(time.time()) + 3600},
        BENCH_SECRET,
        algorithm="HS256",
    )
    node_kw = {
        "authorizer": TokenAuthorizer(),
        "authenticator": Authenticator(keys=KeySet(hs256=((None, BENCH_SECRET),))),
    }
    return node_kw, {"token": token}, "/b/c" if mode == "jwt" else "/b/*"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = tempfile.TemporaryDirectory()
    store = open_store(args.store, tmp.name, args.durability, RetentionPolicy(), 120)
    payload = b"x" * args.size
    node_kw, hello_kw, pattern = auth_setup(args.auth)
    async with Node(store, NodeSettings(), **node_kw) as node:
        subs: list[tuple[NativeConnection, Sink]] = []
        for _ in range(args.subs):
            dec = nc.NativeStreamDecoder(max_frame=1 << 20)
            sink = Sink()
            dec.feed(b"")
            items = dec.feed(frame({"op": "hello", "id": 1, "v": 1, "batch": True, **hello_kw}))
            conn = connection(node, dec.codec, sink)
            for it in items:
                await conn.handle(it)  # type: ignore[arg-type]
            await feed(conn, dec, frame({"op": "subscribe", "id": 2, "sub": "s", "pattern": pattern}))
            subs.append((conn, sink))
        pdec = nc.NativeStreamDecoder(max_frame=1 << 20)
        psink = Sink()
        items = pdec.feed(frame({"op": "hello", "id": 1, "v": 1, "batch": True, **hello_kw}))
        pub = connection(node, pdec.codec, psink)
        for it in items:
            await pub.handle(it)  # type: ignore[arg-type]
        chunk = 2000
        data = b"".join(
            frame({"op": "publish", "id": 3 + i, "channel": "/b/c", "payload": payload, "ack": args.ack})
            for i in range(chunk)
        )
        # --sink: every publish unique, as the Spark sink sends them (its source position as idempotency key
        # and header, a content type), so the chunks are all encoded before the clock starts.
        chunks = [data]
        if args.sink and args.batch:
            # The sink's rows as publish_batch frames of --batch rows (docs/native.md "Batched publishes").
            chunks = [
                b"".join(
                    frame(
                        sink_batch(
                            3 + i,
                            # The chunk's last frame ends with the chunk: no key of the next chunk.
                            [f"/b/c#aaaaaaaa:{base + i + r + 1}" for r in range(min(args.batch, chunk - i))],
                            payload,
                            args.ack,
                        )
                    )
                    for i in range(0, chunk, args.batch)
                )
                for base in range(0, args.events, chunk)
            ]
        elif args.sink:
            chunks = [
                b"".join(
                    frame(sink_publish(3 + i, f"/b/c#aaaaaaaa:{base + i + 1}", payload, args.ack))
                    for i in range(chunk)
                )
                for base in range(0, args.events, chunk)
            ]
        await asyncio.sleep(0.05)
        c0, t0 = time.process_time(), time.perf_counter()
        sent = 0
        while sent < args.events:
            await feed(pub, pdec, chunks[(sent // chunk) % len(chunks)])
            sent += chunk
            await asyncio.sleep(0)
        while node.statistics()["pending"] or any(c.session.queued for c, _ in subs):  # noqa: ASYNC110
            await asyncio.sleep(0.001)  # polls the end of the run, outside the measured work's hot path
        await asyncio.sleep(0.01)
        c1, t1 = time.process_time(), time.perf_counter()
        delivered = sum(c.session.stats.delivered for c, _ in subs)
        assert delivered == sent * args.subs, (delivered, sent)  # nothing refused or filtered away
        for c, _ in [*subs, (pub, psink)]:
            await c.finish()
    tmp.cleanup()
    return {
        "store": args.store,
        "durability": args.durability,
        "ack": args.ack,
        "subs": args.subs,
        "auth": args.auth,
        "sink": args.sink,
        "batch": args.batch,
        "events": sent,
        "deliveries": delivered,
        "gc": "default" if args.default_gc else "server",
        "cpu_us_per_event": round(1e6 * (c1 - c0) / sent, 2),
        "events_per_s": round(sent / (t1 - t0)),
        "deliveries_per_s": round(delivered / (t1 - t0)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=16, help="payload bytes")
    ap.add_argument("--store", default="memory", choices=["memory", "sqlite"])
    ap.add_argument("--durability", default="none", choices=["fsync", "commit", "none"])
    ap.add_argument("--ack", action="store_true", help="publish with ack: true")
    ap.add_argument("--subs", type=int, default=1, help="subscriber connections")
    ap.add_argument(
        "--sink",
        action="store_true",
        help="publishes as the Spark sink sends them: an idempotency key and header each, a content type",
    )
    ap.add_argument(
        "--batch",
        type=int,
        default=0,
        help="with --sink: send the rows as publish_batch frames of this many rows (a divisor of 2000)",
    )
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop, as the server does")
    ap.add_argument("--repeat", type=int, default=5, help="runs; the figures are the best run's")
    ap.add_argument("--auth", default="off", choices=["off", "jwt", "jwt-narrow"], help="see above")
    ap.add_argument(
        "--default-gc",
        action="store_true",
        help="keep the interpreter's garbage collector settings (by default they are a server process's: "
        "hubbub.server.tune_gc)",
    )
    args = ap.parse_args()
    if not args.default_gc:
        tune_gc()
    runs = []
    for _ in range(args.repeat):
        if args.uvloop:
            import uvloop

            runs.append(uvloop.run(run(args)))
        else:
            runs.append(asyncio.run(run(args)))
    # On a shared machine noise only ever adds CPU time: the best run is the steadiest estimate.
    best = min(runs, key=lambda r: float(r["cpu_us_per_event"]))
    best["cpu_us_per_event_all"] = sorted(float(r["cpu_us_per_event"]) for r in runs)
    print(json.dumps(best))


if __name__ == "__main__":
    main()
