"""Exact-channel replays read page by page (``Node._replay_span``): exact and paced through small queues,
bounded in memory, byte-identical native frames, and never a silent gap when the log changes underneath."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack
import pytest

from hubbub.channels import parse_pattern
from hubbub.core import Node, NodeSettings, ReplayPlan, ReplaySpec, Session
from hubbub.core import replay_service as node_mod
from hubbub.dialects import native as nc
from hubbub.disconnect import Disconnect
from hubbub.errors import StorageError
from hubbub.events import Event, Position, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, EventRun, LogStore, RetentionPolicy
from hubbub.transports.native import NativeEncoder


class Enc:
    """Frames as plain tuples (no ``encode_run``: the node encodes the runs event by event)."""

    key = "test"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return repr((event.channel, event.seq, tuple(subs), replay, event.payload.decode())).encode()


Body = Callable[[Node, LogStore], Awaitable[None]]


@pytest.fixture(params=["memory", "sqlite"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., None]:
    def runner(body: Body, events: list[AppendRequest], **settings: Any) -> None:
        async def main() -> None:
            store = open_store(request.param, str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
            for i in range(0, len(events), 1000):
                store.append(events[i : i + 1000])
            async with Node(store, NodeSettings(**settings)) as node:
                await body(node, store)

        asyncio.run(main())

    return runner


def req(
    payload: str, channel: str = "/r", app: str = "a", headers: dict[str, str] | None = None
) -> AppendRequest:
    return AppendRequest(
        channel, Publisher("native", "u", app, ""), payload.encode(), "text/plain", headers or {}
    )


async def consume(sess: Session, into: list[bytes], step: int = 0) -> None:
    """Take frames until the session ends; ``step`` > 0 takes them a few at a time (a slow reader)."""
    while True:
        frames = await sess.next_frames(limit_bytes=step * 40 if step else 1 << 20)
        if not frames:
            return
        into.extend(frames)


async def subscribe(
    node: Node, sess: Session, spec: ReplaySpec, replayed: list[ReplayPlan] | None = None
) -> list[ReplayPlan]:
    plans: list[ReplayPlan] = []
    await node.subscribe(
        sess,
        "s",
        parse_pattern("/r"),
        frozenset(),
        spec,
        on_snapshot=plans.append,
        on_replayed=(replayed.append if replayed is not None else None),
    )
    return plans


def test_long_replay_through_a_small_queue_is_exact_then_live(run: Callable[..., None]) -> None:
    n = 5000

    async def body(node: Node, store: LogStore) -> None:
        sess = Session("native", Enc(), max_items=8, max_bytes=1 << 20)
        node.attach(sess)
        got: list[bytes] = []
        reader = asyncio.ensure_future(consume(sess, got, step=3))
        done: list[ReplayPlan] = []
        plans = await subscribe(node, sess, ReplaySpec(last=n - 10), done)
        assert plans[0].position is not None and plans[0].position.seq == n
        await node.publish(req("live"))
        sess.end(Disconnect.NORMAL)
        await asyncio.wait_for(reader, 10)
        assert not sess.kicked
        frames = [eval(f.decode()) for f in got]
        assert frames == [("/r", s, ("s",), True, str(s)) for s in range(11, n + 1)] + [
            ("/r", n + 1, ("s",), False, "live")
        ]
        assert done[0].sent == n - 10

    run(body, [req(str(i + 1)) for i in range(n)])


def test_replay_reads_only_as_far_as_the_connection_drains(
    run: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stalled reader holds the replay at about ``READ_AHEAD + 1`` pages (the one being queued and those
    read at once ahead of it): the log is not read into memory ahead of it."""
    n = 3000
    monkeypatch.setattr(node_mod, "REPLAY_PAGE", 100)

    async def body(node: Node, store: LogStore) -> None:
        sess = Session("native", Enc(), max_items=10, max_bytes=1 << 20)
        node.attach(sess)
        real = store.read_runs
        taken: list[bytes] = []
        ahead: list[int] = []
        read = 0

        def read_runs(
            channel: str, after: int, up_to: int, limit: int = 1000, *, max_bytes: int | None = None
        ) -> list[EventRun]:
            nonlocal read
            runs = real(channel, after, up_to, limit, max_bytes=max_bytes)
            read += sum(len(r.rows) for r in runs)
            ahead.append(read - len(taken))
            return runs

        monkeypatch.setattr(store, "read_runs", read_runs)
        reader = asyncio.ensure_future(consume(sess, taken, step=2))
        done: list[ReplayPlan] = []
        await subscribe(node, sess, ReplaySpec(since=Position(0, "")), done)
        sess.end(Disconnect.NORMAL)
        await asyncio.wait_for(reader, 10)
        assert len(taken) == n and done[0].sent == n
        # At most the page being queued, the pages read ahead and a full queue are held at any time.
        assert len(ahead) == n // 100
        assert node_mod.READ_AHEAD >= 2
        assert max(ahead) <= (node_mod.READ_AHEAD + 1) * 100 + 10

    run(body, [req(str(i + 1)) for i in range(n)])


def test_native_frames_of_a_mixed_replay_equal_single_event_frames(run: Callable[..., None]) -> None:
    events = [
        req("a1"),
        req("a2"),
        req("b1", app="b"),
        req("h1", headers={"k": "v", ":filter.user_id": "u"}),
        req("a3"),
        req("a4"),
    ] * 700

    async def body(node: Node, store: LogStore) -> None:
        for encoding in ("msgpack", "json"):
            codec = nc.NativeCodec(encoding)
            # User "u" passes the filtered events' filter, so the replay holds every event.
            sess = Session("native", NativeEncoder(codec), max_items=64, max_bytes=1 << 20, user="u")
            node.attach(sess)
            got: list[bytes] = []
            reader = asyncio.ensure_future(consume(sess, got))
            await subscribe(node, sess, ReplaySpec(from_time=0))
            sess.end(Disconnect.NORMAL)
            await asyncio.wait_for(reader, 10)
            stored = store.read("/r", 0, len(events))
            assert got == [codec.encode_event(e, ["s"], True) for e in stored]
            node.detach(sess)
        first = msgpack.unpackb(
            nc.NativeCodec("msgpack").encode_event(store.read("/r", 3, 1)[0], ["s"], True)
        )
        assert first["headers"] == {"k": "v"}  # pseudo-headers stay hidden

    run(body, events)


def test_a_trim_under_a_slow_replay_closes_as_slow_consumer_without_a_gap(
    run: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 2000
    monkeypatch.setattr(node_mod, "REPLAY_PAGE", 100)

    async def body(node: Node, store: LogStore) -> None:
        sess = Session("native", Enc(), max_items=10, max_bytes=1 << 20)
        node.attach(sess)
        epoch = store.head("/r").epoch
        sub = asyncio.ensure_future(subscribe(node, sess, ReplaySpec(last=n)))
        got: list[bytes] = []
        while len(got) < 50:
            got.extend(await sess.next_frames(limit_bytes=40))
        # The replay is past its first page now; the events it has not read yet are trimmed away.
        await node.trim("/r", epoch, 1500)
        await consume(sess, got)
        await asyncio.wait_for(sub, 10)
        assert sess.kicked == sess.slow_close_code
        seqs = [eval(f.decode())[1] for f in got]
        assert seqs == list(range(1, len(seqs) + 1))  # a prefix: no gap went out
        assert len(seqs) < 1500

    run(body, [req(str(i + 1)) for i in range(n)])


def test_a_failed_page_read_closes_with_the_storage_error_code(
    run: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 500
    monkeypatch.setattr(node_mod, "REPLAY_PAGE", 100)

    async def body(node: Node, store: LogStore) -> None:
        real = store.read_runs
        calls = 0

        def read_runs(
            channel: str, after: int, up_to: int, limit: int = 1000, *, max_bytes: int | None = None
        ) -> list[EventRun]:
            nonlocal calls
            calls += 1
            if calls == 3:
                raise StorageError("log read failed (SQLITE_IOERR)")
            return real(channel, after, up_to, limit, max_bytes=max_bytes)

        monkeypatch.setattr(store, "read_runs", read_runs)
        sess = Session("native", Enc(), max_items=1000, max_bytes=1 << 20)
        node.attach(sess)
        done: list[ReplayPlan] = []
        await subscribe(node, sess, ReplaySpec(last=n), done)
        assert sess.kicked == StorageError.code
        assert done[0].sent == 200
        # The subscription stands (its reply went out); the transport closes the connection.
        assert [s.sub_id for s in node.subscriptions(sess)] == ["s"]

    run(body, [req(str(i + 1)) for i in range(n)])
