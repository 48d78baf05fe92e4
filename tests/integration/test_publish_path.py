"""The publish hot path: inline commits of the memory engine, batched submission of one read's publishes,
the one-subscriber run fan-out, and what the TCP transport does with a read's items."""

from __future__ import annotations

import asyncio
import sqlite3
import struct
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from hubbub.auth import Authorizer, Identity
from hubbub.channels import parse_pattern
from hubbub.core import Node, NodeSettings, Session
from hubbub.dialects import native as nc
from hubbub.errors import HubbubError
from hubbub.events import Event, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, AppendResult, LogStore, RetentionPolicy
from hubbub.log.sqlite import _rows
from hubbub.transports.native import NativeConnection
from hubbub.transports.tcp import dispatch


class Enc:
    key = "test"

    def encode_event(self, event: Event, subs: Any, replay: bool, cache: dict[Any, Any]) -> bytes:
        return repr((event.channel, event.seq, tuple(subs), event.payload.decode())).encode()


async def drain(sess: Session) -> list[Any]:
    out: list[Any] = []
    while sess.queued:
        for f in await sess.next_frames():
            out.append(eval(f.decode()))
    return out


def req(channel: str, payload: str) -> AppendRequest:
    return AppendRequest(channel, Publisher("native"), payload.encode(), "text/plain")


def run_node(store: str, tmp_path: Path, body: Callable[[Node], Awaitable[None]], **kw: Any) -> None:
    async def main() -> None:
        st = open_store(store, str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        async with Node(st, NodeSettings(), **kw) as node:
            await body(node)

    asyncio.run(main())


# -- inline commits (memory engine) ---------------------------------------------------------------------


def test_memory_engine_commits_on_the_loop_when_the_writer_is_idle(tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        writer = node._batcher.writer
        assert writer is not None and writer.idle
        r = await node.publish(req("/a", "x"))
        assert r.event.seq == 1
        stats = node.statistics()["writer"]
        assert stats["inline_batches"] == 1 and stats["events"] == 1

    run_node("memory", tmp_path, body)


async def submit_tick(node: Node, s: Session, reqs: list[AppendRequest]) -> list[AppendResult | HubbubError]:
    """Submit ``reqs`` in one tick (one batch for the writer) and wait for every one's completion."""
    results: list[AppendResult | HubbubError] = []
    done = asyncio.Event()

    def cb(res: AppendResult | HubbubError) -> None:
        results.append(res)
        if len(results) == len(reqs):
            done.set()

    for r in reqs:
        node.submit(r, s, cb)
    await asyncio.wait_for(done.wait(), 10)
    return results


def test_sqlite_commits_small_batches_on_the_loop_and_larger_ones_on_the_thread(
    tmp_path: Path,
) -> None:
    """SQLite without fsync (``inline_append_max``): a tick's batch of at most that many publishes commits on
    the loop while the writer is idle; a larger one goes to the writer thread; both in order, seqs gapless."""

    async def body(node: Node) -> None:
        most = node._store.inline_append_max
        assert most > 0
        r = await node.publish(req("/a", "x"))
        assert r.event.seq == 1
        assert node.statistics()["writer"]["inline_batches"] == 1
        s = Session("native", Enc(), max_items=4 * most, max_bytes=1 << 22)
        node.attach(s)
        for size, inline in ((most, 1), (most + 1, 0)):
            before = node.statistics()["writer"]["inline_batches"]
            results = await submit_tick(node, s, [req("/a", f"{size}-{i}") for i in range(size)])
            assert node.statistics()["writer"]["inline_batches"] == before + inline
            assert all(isinstance(x, AppendResult) for x in results)
            seqs = [x.event.seq for x in results if isinstance(x, AppendResult)]
            assert seqs == list(range(seqs[0], seqs[0] + size))
        assert (await node.publish(req("/a", "last"))).event.seq == 1 + most + most + 1 + 1

    run_node("sqlite", tmp_path, body)


def test_sqlite_commits_a_few_large_publishes_on_the_thread(tmp_path: Path) -> None:
    """A tick's batch within ``inline_append_max`` requests but over ``inline_append_max_bytes`` of payload
    (a few large events: 64 of 1 MiB would hold the loop for their whole commit) goes to the writer thread;
    the same count of small ones still commits on the loop."""

    async def body(node: Node) -> None:
        count = 4
        assert count <= node._store.inline_append_max
        big = "x" * (1 << 20)
        s = Session("native", Enc(), max_items=64, max_bytes=1 << 24)
        node.attach(s)
        for payload, inline in ((big, 0), ("small", 1)):
            before = node.statistics()["writer"]["inline_batches"]
            results = await submit_tick(node, s, [req("/big", payload) for _ in range(count)])
            assert node.statistics()["writer"]["inline_batches"] == before + inline
            seqs = [x.event.seq for x in results if isinstance(x, AppendResult)]
            assert seqs == list(range(seqs[0], seqs[0] + count))
        assert 0 < node._store.inline_append_max_bytes < count * len(big)

    run_node("sqlite", tmp_path, body)


def test_sqlite_close_commits_a_tick_queued_for_the_loop(tmp_path: Path) -> None:
    """Publishes queued in the tick the node closes in (a batch the loop would commit inline) are committed
    and acknowledged by the close, and are in the store when it is opened again; later ones are refused."""

    async def main() -> None:
        st = open_store("sqlite", str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        results: list[AppendResult | HubbubError] = []
        node = await Node(st, NodeSettings()).__aenter__()
        await node.publish(req("/a", "first"))  # the writer is idle: the next tick would commit inline
        for i in range(3):
            node.submit(req("/a", str(i)), None, results.append)
        await node.close()
        assert [r.event.seq for r in results if isinstance(r, AppendResult)] == [2, 3, 4]
        with pytest.raises(HubbubError):
            node.submit(req("/a", "late"), None, results.append)
        again = open_store("sqlite", str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        try:
            assert [e.payload for e in again.read("/a")] == [b"first", b"0", b"1", b"2"]
        finally:
            again.close()

    asyncio.run(main())


def test_sqlite_engine_with_fsync_never_commits_on_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        st = open_store("sqlite", str(tmp_path / "data"), "fsync", RetentionPolicy(), 600)
        assert st.inline_append_max == 0 and not st.inline_append
        async with Node(st, NodeSettings()) as node:
            await node.publish(req("/a", "x"))
            assert node.statistics()["writer"]["inline_batches"] == 0

    asyncio.run(main())


@pytest.mark.parametrize("engine", ["memory", "sqlite"])
def test_inline_commit_waits_behind_writer_thread_work(tmp_path: Path, engine: str) -> None:
    """A publish made while a control operation is still on the writer thread is not appended on the loop
    ahead of it: it lands after the reset, in the new epoch, and its ack comes after the control's result."""

    async def body(node: Node) -> None:
        await node.publish(req("/a", "before"))
        writer = node._batcher.writer
        assert writer is not None
        gate = threading.Event()
        order: list[str] = []

        def slow_reset(st: LogStore) -> Any:
            gate.wait(10)
            return st.reset_channel("/a")

        ctl = writer.submit_control(slow_reset)
        assert not writer.idle
        results: list[AppendResult | HubbubError] = []
        acked = asyncio.Event()

        def done(r: AppendResult | HubbubError) -> None:
            order.append("ack after the reset" if ctl.done() else "ack before the reset")
            results.append(r)
            acked.set()

        s = Session("native", Enc(), max_items=16, max_bytes=1 << 20)
        node.attach(s)
        inline_before = node.statistics()["writer"]["inline_batches"]
        node.submit(req("/a", "after"), s, done)
        # Not appended inline (that would have completed it within submit); queued behind the reset, which
        # holds the writer thread until the gate opens.
        assert results == []
        assert node.statistics()["writer"]["inline_batches"] == inline_before
        gate.set()
        info = await ctl
        await asyncio.wait_for(acked.wait(), 10)  # the completion is scheduled from the writer thread
        r = results[0]
        assert isinstance(r, AppendResult)
        assert (r.event.epoch, r.event.seq) == (info.epoch, 1)
        assert order == ["ack after the reset"]
        assert writer.idle
        # Once the writer is idle again, publishes go back to the inline path.
        before = node.statistics()["writer"]["inline_batches"]
        await node.publish(req("/a", "later"))
        assert node.statistics()["writer"]["inline_batches"] == before + 1

    run_node(engine, tmp_path, body)


def test_inline_commit_of_a_closed_store_fails_the_publish(tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        node._store.close()
        with pytest.raises(HubbubError) as err:
            await node.publish(req("/a", "x"))
        assert err.value.code == 4301

    run_node("memory", tmp_path, body)


# -- one-subscriber runs --------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_single_subscriber_run_keeps_order_ids_and_echo(store: str, tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        sub = Session("native", Enc(), max_items=1024, max_bytes=1 << 24)
        pub = Session("native", Enc(), max_items=1024, max_bytes=1 << 24, echo=False)
        node.attach(sub)
        node.attach(pub)
        await node.subscribe(sub, "s", parse_pattern("/a/*"), on_snapshot=lambda _p: None)
        await node.subscribe(pub, "own", parse_pattern("/a/x"), on_snapshot=lambda _p: None)
        futs = [
            asyncio.ensure_future(node.publish(req(ch, str(i)), pub))
            for i, ch in enumerate(["/a/x", "/a/y", "/a/y", "/a/x", "/b", "/a/x"])
        ]
        await asyncio.gather(*futs)
        got = await drain(sub)
        assert got == [
            ("/a/x", 1, ("s",), "0"),
            ("/a/y", 1, ("s",), "1"),
            ("/a/y", 2, ("s",), "2"),
            ("/a/x", 2, ("s",), "3"),
            ("/a/x", 3, ("s",), "5"),
        ]
        assert await drain(pub) == []  # echo off: its own events never come back
        assert node.metrics.deliveries["native"] == 5

    run_node(store, tmp_path, body)


def test_single_subscriber_run_applies_the_overflow_policy(tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        sub = Session("native", Enc(), max_items=3, max_bytes=1 << 24)
        node.attach(sub)
        await node.subscribe(sub, "s", parse_pattern("/a"), on_snapshot=lambda _p: None)
        await asyncio.gather(*(node.publish(req("/a", str(i))) for i in range(5)))
        assert sub.kicked == sub.slow_close_code

    run_node("memory", tmp_path, body)


# -- one read's publishes through the TCP dispatch ------------------------------------------------------


def frame(obj: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


class Sink:
    """The connection's outbound frames, decoded; ``sent`` is set at each one (cleared by who waits)."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.sent = asyncio.Event()

    async def send(self, data: bytes) -> None:
        self.frames.append(msgpack.unpackb(data, raw=False))
        self.sent.set()

    async def close(self, code: int) -> None:
        pass


class DenyChannel(Authorizer):
    def __init__(self, channel: str) -> None:
        self.channel = channel

    def may_publish(self, identity: Identity | None, channel: str) -> bool:
        return channel != self.channel

    def may_subscribe(self, identity: Identity | None, channel: str) -> bool:
        return True

    def may_admin(self, identity: Identity | None) -> bool:
        return True


async def open_conn(
    node: Node, send_queue: int = 1024
) -> tuple[NativeConnection, nc.NativeStreamDecoder, Sink]:
    dec = nc.NativeStreamDecoder()
    items = dec.feed(frame({"op": "hello", "id": 1, "v": 1}))
    sink = Sink()
    conn = NativeConnection(
        node,
        dec.codec,
        send=sink.send,
        close=sink.close,
        max_frame=1 << 20,
        max_subscriptions=16,
        send_queue=send_queue,
        send_queue_bytes=1 << 24,
        ping_interval=3600.0,
    )
    conn.start()
    await dispatch(conn, items)
    return conn, dec, sink


async def replies(sink: Sink, n: int) -> list[Any]:
    """The first ``n`` (at least) reply and error frames, once the connection has sent them."""
    while True:
        got = [f for f in sink.frames if f.get("op") in ("reply", "error")]
        if len(got) >= n:
            return got
        sink.sent.clear()
        try:
            await asyncio.wait_for(sink.sent.wait(), 10)
        except TimeoutError:
            raise AssertionError(f"only {sink.frames!r}") from None


def pub(i: int, channel: str = "/a", ack: bool = True) -> dict[str, Any]:
    return {"op": "publish", "id": i, "channel": channel, "payload": str(i).encode(), "ack": ack}


def decode(dec: nc.NativeStreamDecoder, how: str, data: bytes) -> list[nc.RunItem]:
    """One read's items: commands only (``feed``: publishes go to ``publish_many``) or with runs of common
    publishes (``feed_runs``, what the TCP transport uses: ``publish_run``)."""
    if how == "feed":
        return list(dec.feed(data))
    return dec.feed_runs(data)


FEEDS = pytest.mark.parametrize("how", ["feed", "feed_runs"])


@FEEDS
@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_read_of_publishes_is_acked_in_order(store: str, how: str, tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        conn, dec, sink = await open_conn(node)
        data = b"".join(frame(pub(i)) for i in range(10, 60))
        items = decode(dec, how, data)
        assert (how == "feed_runs") == any(isinstance(x, nc.PublishRun) for x in items)
        assert not await dispatch(conn, items)
        got = await replies(sink, 51)  # hello + 50 acks
        assert [f["id"] for f in got[1:]] == list(range(10, 60))
        assert [f["seq"] for f in got[1:]] == list(range(1, 51))
        assert conn.inflight == 0
        await conn.finish()

    run_node(store, tmp_path, body)


@FEEDS
def test_a_denied_publish_in_a_read_gets_its_own_error(how: str, tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        conn, dec, sink = await open_conn(node)
        data = b"".join(frame(pub(i, "/no" if i == 3 else "/a")) for i in range(1, 6))
        assert not await dispatch(conn, decode(dec, how, data))
        got = await replies(sink, 6)
        errors = [(f["id"], f["code"]) for f in got if f["op"] == "error"]
        assert errors == [(3, 4102)]
        acks = [f for f in got[1:] if f["op"] == "reply"]
        assert [(f["id"], f["seq"]) for f in acks] == [(1, 1), (2, 2), (4, 3), (5, 4)]
        # Both channels are known now: the next read is one run, which the node refuses as a whole; each
        # publish is then answered on its own.
        data = b"".join(frame(pub(i, "/no" if i == 8 else "/a")) for i in range(6, 11))
        items = decode(dec, how, data)
        assert how == "feed" or [len(x) for x in items if isinstance(x, nc.PublishRun)] == [5]
        assert not await dispatch(conn, items)
        got = await replies(sink, 11)
        errors = [(f["id"], f["code"]) for f in got if f["op"] == "error"]
        assert errors == [(3, 4102), (8, 4102)]
        acks = [f for f in got[6:] if f["op"] == "reply"]
        assert [(f["id"], f["seq"]) for f in acks] == [(6, 5), (7, 6), (9, 7), (10, 8)]
        await conn.finish()

    run_node("memory", tmp_path, body, authorizer=DenyChannel("/no"))


@FEEDS
def test_a_read_larger_than_the_inflight_bound_waits_for_room(how: str, tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        conn, dec, sink = await open_conn(node, send_queue=8)
        data = b"".join(frame(pub(i, ack=i % 3 == 0)) for i in range(1, 41))
        before = conn.last_recv
        assert not await dispatch(conn, decode(dec, how, data))
        assert conn.last_recv >= before
        assert conn.inflight <= conn.max_inflight
        got = await replies(sink, 1 + 13)
        assert [f["id"] for f in got[1:]] == [i for i in range(1, 41) if i % 3 == 0]
        assert [f["seq"] for f in got[1:]] == [i for i in range(1, 41) if i % 3 == 0]
        # Publishes complete in order: once an acked one after them is answered, all of them are done.
        assert not await dispatch(conn, decode(dec, how, frame(pub(41))))
        assert [f["id"] for f in await replies(sink, 1 + 14)][-1] == 41
        assert conn.inflight == 0
        await conn.finish()

    run_node("memory", tmp_path, body)


@FEEDS
def test_mixed_items_keep_their_order_and_bad_frames_are_answered(how: str, tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        conn, dec, sink = await open_conn(node)
        data = b"".join(
            [
                frame(pub(1)),
                frame({"op": "publish", "id": 2, "channel": "/a"}),  # no payload: 4001, not fatal
                frame(pub(3)),
                frame({"op": "ping", "id": 4}),
                frame(pub(5)),
            ]
        )
        assert not await dispatch(conn, decode(dec, how, data))
        got = await replies(sink, 5)
        # Errors answer at once; acks follow the commit, in publish order.
        assert [(f["op"], f.get("id")) for f in got[1:]] == [
            ("error", 2),
            ("reply", 1),
            ("reply", 3),
            ("reply", 5),
        ]
        assert got[1]["code"] == 4001
        assert [f["seq"] for f in got[2:]] == [1, 2, 3]
        assert ("pong", 4) in [(f["op"], f.get("id")) for f in sink.frames]
        await conn.finish()

    run_node("memory", tmp_path, body)


@FEEDS
def test_a_fatal_frame_stops_the_read(how: str, tmp_path: Path) -> None:
    async def body(node: Node) -> None:
        conn, dec, _sink = await open_conn(node)
        data = frame(pub(1)) + frame(pub(2)) + frame({"op": "hello", "id": 9, "v": 1}) + frame(pub(3))
        assert await dispatch(conn, decode(dec, how, data))
        assert conn.session.ending == 4005
        # Commits complete in order: once a later one is done, so are those the connection made.
        await node.publish(req("/b", "later"))
        assert node._store.head("/a").top == 2  # the publish after the fatal frame was not taken
        await conn.finish()

    run_node("memory", tmp_path, body)


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_a_subscription_made_between_unmatched_bursts_gets_the_next_burst(store: str, tmp_path: Path) -> None:
    """The fan-out's skip of an unmatched burst lasts one commit: wildcard and tag subscriptions made after a
    burst that matched nothing get the next burst to the same channel and tags."""

    def tagged(payload: str) -> AppendRequest:
        return AppendRequest("/w/a", Publisher("native"), payload.encode(), "text/plain", {}, ("t",))

    async def burst(node: Node, payloads: list[str]) -> None:
        await asyncio.gather(*(node.publish(tagged(p)) for p in payloads))

    async def body(node: Node) -> None:
        await burst(node, ["u1", "u2", "u3"])  # nobody subscribed: matched nothing
        wild = Session("native", Enc(), max_items=64, max_bytes=1 << 20)
        tag = Session("native", Enc(), max_items=64, max_bytes=1 << 20)
        node.attach(wild)
        node.attach(tag)
        await node.subscribe(wild, "w", parse_pattern("/w/*"), on_snapshot=lambda _p: None)
        await node.subscribe(tag, "t", parse_pattern("/w/a"), frozenset({"t"}), on_snapshot=lambda _p: None)
        await burst(node, ["m1", "m2", "m3"])
        assert [x[3] for x in await drain(wild)] == ["m1", "m2", "m3"]
        assert [x[3] for x in await drain(tag)] == ["m1", "m2", "m3"]

    run_node(store, tmp_path, body)


def test_a_failed_inline_sqlite_commit_fails_its_publishes_and_reuses_no_seq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit on the loop that fails (the disk, say) fails every publish of its batch with a storage error
    and leaves nothing behind: the writer is still idle, the next commit is on the loop again, and its seqs
    follow the last committed one."""

    async def body(node: Node) -> None:
        assert (await node.publish(req("/a", "ok"))).event.seq == 1
        # Every row of an append goes through one of the two inserts (a run's rows or a burst's stretch).
        real = {name: getattr(_rows, name) for name in ("_insert_events", "insert_stretch")}

        def failing(*args: Any) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        for name in real:
            monkeypatch.setattr(_rows, name, failing)
        results: list[AppendResult | HubbubError] = []
        for i in range(3):
            node.submit(req("/a", f"lost{i}"), None, results.append)
        node.submit(req("/b", "lost"), None, results.append)
        writer = node._batcher.writer
        assert writer is not None
        inline = node.statistics()["writer"]["inline_batches"]
        done = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(done.set_result, None)  # after the tick's flush
        await done
        assert len(results) == 4 and all(isinstance(r, HubbubError) and r.code == 4301 for r in results)
        assert writer.idle and node._batcher.pending == 0
        for name, fn in real.items():
            monkeypatch.setattr(_rows, name, fn)
        r = await node.publish(req("/a", "next"))
        assert node.statistics()["writer"]["inline_batches"] == inline + 1
        assert (r.event.seq, (await node.publish(req("/b", "first"))).event.seq) == (2, 1)
        assert [e.payload for e in node._store.read("/a")] == [b"ok", b"next"]

    run_node("sqlite", tmp_path, body)
