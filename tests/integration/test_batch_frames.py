"""Batch frames (native.md §3.5) of batching connections: a fan-out run is packed once, and the same batch
frames go to every connection that gets the run; a replay reaches a batching connection as batch frames built
on the reader thread. Either way the batches unpack to exactly the single event frames, in order, within
``max_frame``."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest

from hubbub.core import Node, NodeSettings
from hubbub.core.limits import TokenBucket
from hubbub.dialects import native as nc
from hubbub.errors import HubbubError, RateLimited, ShuttingDown, StorageError
from hubbub.events import Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, AppendResult, AppendRun, RetentionPolicy
from hubbub.log.memory import MemoryLogStore
from hubbub.transports.native import NativeConnection


class Sink:
    """A connection's socket side: keeps every message written, in order; ``wrote`` is set at each write."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.wrote = asyncio.Event()

    async def send(self, data: bytes) -> None:
        self.sent.append(data)
        self.wrote.set()

    async def send_many(self, frames: list[bytes]) -> None:
        self.sent.extend(frames)
        self.wrote.set()

    async def close(self, code: int) -> None:
        pass


def connect(
    node: Node, codec: nc.NativeCodec, sink: Sink, max_frame: int, send_queue: int
) -> NativeConnection:
    conn = NativeConnection(
        node,
        codec,
        send=sink.send,
        close=sink.close,
        send_many=sink.send_many,
        max_frame=max_frame,
        max_subscriptions=16,
        send_queue=send_queue,
        send_queue_bytes=16 << 20,
        ping_interval=3600.0,
    )
    conn.start()
    return conn


def unpack(encoding: str, data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(data) if encoding == "json" else msgpack.unpackb(data)
    return obj


def frames_in(encoding: str, data: bytes) -> list[dict[str, Any]]:
    """The frames a message carries: a batch's frames, or the message itself."""
    obj = unpack(encoding, data)
    frames: list[dict[str, Any]] = obj["frames"] if obj["op"] == "batch" else [obj]
    return frames


async def until(changed: asyncio.Event, cond: Callable[[], bool]) -> None:
    """Wait until ``cond()`` holds, looking again at each change: ``changed`` is set whenever what ``cond``
    reads changes (and cleared here)."""

    async def wait() -> None:
        while not cond():
            changed.clear()
            await changed.wait()

    await asyncio.wait_for(wait(), 10)


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_a_fan_out_run_is_packed_once_for_every_batching_connection(encoding: nc.Encoding) -> None:
    n, max_frame = 300, 4096

    async def main() -> None:
        store = open_store("memory", "", "none", RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node:
            codec = nc.NativeCodec(encoding)
            sinks = [Sink() for _ in range(3)]
            conns = [connect(node, codec, s, max_frame, 4096) for s in sinks]
            for c in conns:
                await c.handle(nc.Hello(1, 1, None, "", True, True))
                await c.handle(codec.decode_object({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/b"}))
            pub = connect(node, codec, Sink(), max_frame, 4096)
            await pub.handle(nc.Hello(1, 1, None, "", True, True))
            results: list[AppendResult | HubbubError] = []
            reqs = [
                AppendRequest("/b", pub._publisher, f"payload {i}".encode() * 8, "text/plain")
                for i in range(n)
            ]
            node.submit_many(reqs, pub.session, results.append)

            def events_in(sink: Sink) -> int:
                return sum(f["op"] == "event" for m in sink.sent for f in frames_in(encoding, m))

            def has_all(sink: Sink) -> bool:
                return events_in(sink) >= n

            for s in sinks:
                await until(s.wrote, functools.partial(has_all, s))
            assert len(results) == n and all(not c.session.queued for c in conns)
            events = [r.event for r in results if isinstance(r, AppendResult)]
            assert len(events) == n
            want = [codec.encode_event(e, ["s"]) for e in events]
            batches = [[m for m in s.sent if unpack(encoding, m)["op"] in ("batch", "event")] for s in sinks]
            for got in batches:
                assert len(got) > 1 and all(len(m) <= max_frame for m in got)
                frames = [f for m in got for f in frames_in(encoding, m)]
                assert frames == [unpack(encoding, w) for w in want]  # each event once, in order
            # The very same bytes objects went to every connection: packed once.
            assert all(a is b for a, b in zip(batches[0], batches[1], strict=True))
            assert all(a is b for a, b in zip(batches[0], batches[2], strict=True))
            for c in [*conns, pub]:
                await c.finish()

    asyncio.run(main())


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
@pytest.mark.parametrize("store_engine", ["sqlite", "memory"])
def test_a_replay_reaches_a_batching_connection_as_exact_batches(
    encoding: nc.Encoding, store_engine: str, tmp_path: Path
) -> None:
    n, max_frame = 3000, 2048

    async def main() -> None:
        store = open_store(store_engine, str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        pub = Publisher("native", "u", "a", "")
        for i in range(0, n, 1000):
            store.append(
                [AppendRequest("/r", pub, f"p{i + j}".encode() * 5, "text/plain") for j in range(1000)]
            )
        async with Node(store, NodeSettings()) as node:
            codec = nc.NativeCodec(encoding)
            sink = Sink()
            conn = connect(node, codec, sink, max_frame, 64)  # a small queue: the replay comes in chunks
            await conn.handle(nc.Hello(1, 1, None, "", True, True))
            await conn.handle(
                codec.decode_object({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/r", "last": n})
            )

            def ops() -> list[dict[str, Any]]:
                return [f for m in sink.sent for f in frames_in(encoding, m)]

            await until(sink.wrote, lambda: any(o.get("op") == "recovered" for o in ops()))
            assert all(len(m) <= max_frame for m in sink.sent)
            assert sum(unpack(encoding, m)["op"] == "batch" for m in sink.sent) > 10
            got = [o for o in ops() if o["op"] == "event"]
            stored = store.read("/r", 0, n)
            assert got == [unpack(encoding, codec.encode_event(e, ["s"], True)) for e in stored]
            kinds = [o["op"] for o in ops()]
            assert kinds[1] == "reply" and kinds[-1] == "recovered"  # order: reply, events, recovered
            await conn.finish()

    asyncio.run(main())


@pytest.mark.parametrize("fail", [False, True])
def test_submit_many_with_done_many_completes_a_run_in_one_call(fail: bool) -> None:
    """``done_many`` gets a commit's results of one ``submit_many`` at once, in order and between the
    completions of the submissions around it; a failed commit calls ``done`` per request instead."""

    class FailingStore(MemoryLogStore):
        def append(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult]:
            raise StorageError("disk on fire")

    async def main() -> None:
        store = FailingStore() if fail else open_store("memory", "", "none", RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node:
            codec = nc.NativeCodec("msgpack")
            pub = connect(node, codec, Sink(), 4096, 4096)
            await pub.handle(nc.Hello(1, 1, None, "", True, True))
            calls: list[tuple[str, object]] = []
            called = asyncio.Event()

            def call(kind: str) -> Callable[[object], None]:
                def record(r: object) -> None:
                    calls.append((kind, r))
                    called.set()

                return record

            reqs = [AppendRequest("/d", pub._publisher, b"p%d" % i, "text/plain") for i in range(5)]
            node.submit(reqs[0], pub.session, call("one"))
            node.submit_many(reqs[1:4], pub.session, call("each"), call("many"))
            node.submit(reqs[4], pub.session, call("one"))
            await until(called, lambda: len(calls) >= (5 if fail else 3))
            if fail:
                assert [k for k, _ in calls] == ["one", "each", "each", "each", "one"]
                assert all(isinstance(r, StorageError) for _, r in calls)
            else:
                assert [k for k, _ in calls] == ["one", "many", "one"]
                many = calls[1][1]
                assert isinstance(many, list)
                assert [r.event.payload for r in many] == [b"p1", b"p2", b"p3"]
                assert [r.event.seq for r in many] == [2, 3, 4]
            await pub.finish()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["runs", "requests", "fail"])
def test_submit_run_completes_as_submit_many_and_reaches_a_store_as_it_takes_it(kind: str) -> None:
    """``submit_run`` completes a run with one ``done_many`` call of one result per event, in order and
    between the submissions around it, or ``done`` per event for a failed commit. A store that takes runs
    (``takes_runs``) gets the run whole; any other one (PostgreSQL, a worker's remote store) gets one request
    per event."""
    appended: list[list[object]] = []

    class Recording(MemoryLogStore):
        takes_runs = kind == "runs"

        def append(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult]:
            appended.append(list(batch))
            if kind == "fail":
                raise StorageError("disk on fire")
            return super().append(batch)

    async def main() -> None:
        async with Node(Recording(), NodeSettings()) as node:
            codec = nc.NativeCodec("msgpack")
            pub = connect(node, codec, Sink(), 4096, 4096)
            await pub.handle(nc.Hello(1, 1, None, "", True, True))
            calls: list[tuple[str, object]] = []
            called = asyncio.Event()

            def call(kind: str) -> Callable[[object], None]:
                def record(r: object) -> None:
                    calls.append((kind, r))
                    called.set()

                return record

            p = pub._publisher
            node.submit(AppendRequest("/d", p, b"a", "text/plain"), pub.session, call("one"))
            node.submit_run(
                AppendRun("/d", p, "text/plain", [b"r0", b"r1", b"r2"]),
                pub.session,
                call("each"),
                call("many"),
            )
            node.submit(AppendRequest("/d", p, b"z", "text/plain"), pub.session, call("one"))
            await until(called, lambda: len(calls) >= (5 if kind == "fail" else 3))
            assert pub.session.owed == 0
            if kind == "fail":
                assert [k for k, _ in calls] == ["one", "each", "each", "each", "one"]
                assert all(isinstance(r, StorageError) for _, r in calls)
            else:
                assert [k for k, _ in calls] == ["one", "many", "one"]
                many = calls[1][1]
                assert isinstance(many, list)
                assert [(r.event.seq, r.event.payload) for r in many] == [(2, b"r0"), (3, b"r1"), (4, b"r2")]
                last = calls[2][1]
                assert isinstance(last, AppendResult) and last.event.seq == 5
            entries = [e for batch in appended for e in batch]
            runs = [e for e in entries if isinstance(e, AppendRun)]
            assert len(runs) == (1 if kind == "runs" else 0)
            assert len(entries) == (3 if kind == "runs" else 5)
            assert node.statistics()["writer"]["events"] == (0 if kind == "fail" else 5)
            await pub.finish()

    asyncio.run(main())


def test_a_refused_submit_run_queues_nothing() -> None:
    """``submit_run`` refuses a run whole before queueing any of it (the connection then publishes them one
    by one, each refused or accepted on its own): over the connection's publish rate (``RateLimited``, counted
    once), or once the node closes (``ShuttingDown``); nothing is owed or pending, no token is taken."""

    async def main() -> None:
        async with Node(MemoryLogStore(), NodeSettings()) as node:
            pub = connect(node, nc.NativeCodec("msgpack"), Sink(), 4096, 4096)
            await pub.handle(nc.Hello(1, 1, None, "", True, True))
            sess = pub.session
            sess.bucket = TokenBucket(0.001, 2)
            run = AppendRun("/d", pub._publisher, "text/plain", [b"a", b"b", b"c"])
            failed: list[object] = []
            with pytest.raises(RateLimited):
                node.submit_run(run, sess, failed.append, failed.append)
            assert (sess.owed, node.statistics()["pending"], sess.bucket.tokens, failed) == (0, 0, 2, [])
            assert node.limiter.refusals == {("publish_rate", "native"): 1}
            await pub.finish()
            node._batcher.closing = True
            with pytest.raises(ShuttingDown):
                node.submit_run(run, sess, failed.append, failed.append)
            assert (sess.owed, node.statistics()["pending"], failed) == (0, 0, [])

    asyncio.run(main())
