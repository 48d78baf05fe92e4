"""The replay/live junction (``core/junction.py``) on a node, with a connection whose reads the test gates:
the held events come after the replay, paced and in commit order; a hold that spills is read back from the log
across channels in commit order, to the new subscription and to the connection's other live subscription
alike; events held before the snapshot, which the replay sends for the new subscription alone, still reach the
connection's other live subscription (on a node, and for a native client over a socket); and held events the
log lost meanwhile close the connection as a slow consumer, never a silent gap."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from hubbub.channels import parse_pattern
from hubbub.client import AsyncClient
from hubbub.core import Node, NodeSettings, ReplayPlan, ReplaySpec, Session, replay_service
from hubbub.core.replay_plans import plan_selection
from hubbub.disconnect import Disconnect
from hubbub.events import Event, Position, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, RetentionPolicy
from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 10.0
#: The connection's queue bound: its subscriptions hold 4 x 4 events, then spill.
QUEUE = 4
BEFORE = 5


class Enc:
    key = "test"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return repr((event.channel, event.seq, tuple(subs), replay)).encode()


def req(channel: str) -> AppendRequest:
    return AppendRequest(channel, Publisher("native", "u", "a", ""), b"x", "text/plain")


Frame = tuple[str, int, tuple[str, ...], bool]
#: (node, session, gate, frames taken, finish: end the session and wait until its frames are taken)
Body = Callable[[Node, Session, asyncio.Event, list[Frame], Callable[[], Awaitable[None]]], Awaitable[None]]


@pytest.fixture(params=["memory", "sqlite"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Body], None]:
    """Run ``body`` with a node whose log has ``/j/a`` and ``/j/b`` 1..5, and an attached session with a live
    subscription ``o`` to ``/j/a`` whose frames are taken only once the gate is set."""

    def runner(body: Body) -> None:
        async def main() -> None:
            store = open_store(request.param, str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
            store.append([req(ch) for _ in range(BEFORE) for ch in ("/j/a", "/j/b")])
            async with Node(store, NodeSettings()) as node:
                sess = Session("native", Enc(), max_items=QUEUE, max_bytes=1 << 20)
                node.attach(sess)
                await node.subscribe(sess, "o", parse_pattern("/j/a"), on_snapshot=lambda p: None)
                gate = asyncio.Event()
                got: list[Frame] = []

                async def consume() -> None:
                    await gate.wait()
                    while frames := await sess.next_frames():
                        got.extend(eval(f.decode()) for f in frames)

                reader = asyncio.ensure_future(consume())

                async def finish() -> None:
                    sess.end(Disconnect.NORMAL)  # the frames queued are still taken
                    await asyncio.wait_for(reader, WAIT)

                await body(node, sess, gate, got, finish)
                await finish()

        asyncio.run(main())

    return runner


async def subscribe_since(node: Node, sess: Session) -> tuple[asyncio.Future[Any], list[ReplayPlan]]:
    """Subscribe ``s`` to ``/j/**`` from the start of both channels; returns once the snapshot is read (the
    replay is then stuck on the gated queue)."""
    plans: list[ReplayPlan] = []
    read = asyncio.Event()

    def on_snapshot(plan: ReplayPlan) -> None:
        plans.append(plan)
        read.set()

    since = {"/j/a": Position(0, ""), "/j/b": Position(0, "")}
    task = asyncio.ensure_future(
        node.subscribe(
            sess, "s", parse_pattern("/j/**"), selection=ReplaySpec(since=since), on_snapshot=on_snapshot
        )
    )
    await asyncio.wait_for(read.wait(), WAIT)
    return task, plans


@pytest.mark.parametrize("burst", [10, 40], ids=["held", "spilled"])
def test_held_and_spilled_events_follow_the_replay_once_in_commit_order(
    run: Callable[[Body], None], burst: int
) -> None:
    async def body(
        node: Node,
        sess: Session,
        gate: asyncio.Event,
        got: list[Frame],
        finish: Callable[[], Awaitable[None]],
    ) -> None:
        task, _ = await subscribe_since(node, sess)
        burst_events = []
        for i in range(burst):
            ch = "/j/a" if i % 3 else "/j/b"
            r = await node.publish(req(ch))
            burst_events.append((ch, r.event.seq))
        gate.set()
        await asyncio.wait_for(task, WAIT)
        last = await node.publish(req("/j/b"))
        assert not sess.kicked
        replay = [(ch, s, ("s",), True) for s in range(1, BEFORE + 1) for ch in ("/j/a", "/j/b")]
        live = [(ch, s, ("o", "s") if ch == "/j/a" else ("s",), False) for ch, s in burst_events]
        await finish()
        assert got == replay + live + [("/j/b", last.event.seq, ("s",), False)]
        assert (node._replays.spills > 0) == (burst > 4 * QUEUE)

    run(body)


def test_spilled_events_the_log_lost_close_as_slow_consumer_without_a_gap(
    run: Callable[[Body], None],
) -> None:
    async def body(
        node: Node,
        sess: Session,
        gate: asyncio.Event,
        got: list[Frame],
        finish: Callable[[], Awaitable[None]],
    ) -> None:
        task, _ = await subscribe_since(node, sess)
        epoch = node._store.head("/j/b").epoch
        for _ in range(40):
            await node.publish(req("/j/b"))
        # The spilled events of /j/b are trimmed before they could be read back.
        await node.trim("/j/b", epoch, BEFORE + 30)
        gate.set()
        await asyncio.wait_for(task, WAIT)
        assert sess.kicked == sess.slow_close_code
        seqs = [s for ch, s, _, _ in got if ch == "/j/b"]
        assert seqs == list(range(1, len(seqs) + 1))  # a prefix: no gap went out
        assert len(seqs) < BEFORE + 30

    run(body)


@pytest.mark.parametrize("resume", ["since", "from_time"])
def test_events_held_before_the_snapshot_still_reach_the_connections_live_subscription(
    run: Callable[[Body], None], monkeypatch: pytest.MonkeyPatch, resume: str
) -> None:
    """Events committed while a new subscription holds and before its snapshot is read: live fan-out held
    them on it for the whole connection, its replay sends them for it alone, and the connection's other
    live subscription (``o`` on ``/j/a``) must still get them, once, in order."""
    entered, release = threading.Event(), threading.Event()
    plan = plan_selection

    def gated(store: Any, pattern: Any, *args: Any) -> ReplayPlan:
        if pattern.text == "/j/**":  # the new subscription's snapshot waits for the events published
            entered.set()
            assert release.wait(WAIT)
        return plan(store, pattern, *args)

    monkeypatch.setattr(replay_service, "plan_selection", gated)

    async def body(
        node: Node,
        sess: Session,
        gate: asyncio.Event,
        got: list[Frame],
        finish: Callable[[], Awaitable[None]],
    ) -> None:
        if resume == "since":  # /j/a after what "o" had, /j/b from its start
            since = {"/j/a": Position(BEFORE, node._store.head("/j/a").epoch), "/j/b": Position(0, "")}
            spec = ReplaySpec(since=since)
        else:
            spec = ReplaySpec(from_time=0)
        task = asyncio.ensure_future(
            node.subscribe(sess, "s", parse_pattern("/j/**"), selection=spec, on_snapshot=lambda p: None)
        )
        assert await asyncio.to_thread(entered.wait, WAIT)
        held = [(await node.publish(req("/j/a"))).event.seq for _ in range(3)]
        release.set()
        gate.set()
        await asyncio.wait_for(task, WAIT)
        last = await node.publish(req("/j/a"))
        await finish()
        assert not sess.kicked
        # What "o" got: every event of /j/a after those before it subscribed, once, in order.
        assert [seq for ch, seq, subs, _ in got if "o" in subs] == [*held, last.event.seq]
        # And "s" got its replay and the live event, once each.
        s_a = [seq for ch, seq, subs, _ in got if "s" in subs and ch == "/j/a"]
        assert s_a == (held if resume == "since" else [*range(1, BEFORE + 1), *held]) + [last.event.seq]

    run(body)


def test_a_native_clients_live_subscription_gets_what_its_new_one_held_before_its_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same over a real socket: a native client subscribed live to ``/t/**`` subscribes again to
    ``/t/a/**`` with a replay, as a client resuming both does after a reconnect; events published to
    ``/t/a/x`` before that replay's snapshot is read reach ``/t/**`` too, once, in order."""
    entered, release = threading.Event(), threading.Event()
    plan = plan_selection

    def gated(store: Any, pattern: Any, *args: Any) -> ReplayPlan:
        if pattern.text == "/t/a/**":
            entered.set()
            assert release.wait(WAIT)
        return plan(store, pattern, *args)

    monkeypatch.setattr(replay_service, "plan_selection", gated)

    async def main() -> None:
        keys = {"data_dir": str(tmp_path), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}
        cfg = load_config(keys, env={})
        async with Server(cfg) as server:
            url = f"ws://127.0.0.1:{server.ports['http']}"
            pub, sub = await AsyncClient.connect(url), await AsyncClient.connect(url)
            try:
                async with sub.subscribe("/t/**") as every:
                    await pub.publish("/t/b", "first")
                    assert [e.payload for e in await take(every, 1)] == [b"first"]
                    resumed = asyncio.ensure_future(sub.subscribe("/t/a/**", from_time=0).__aenter__())
                    assert await asyncio.to_thread(entered.wait, WAIT)
                    for i in range(3):
                        await pub.publish("/t/a/x", str(i))
                    release.set()
                    only_a = await asyncio.wait_for(resumed, WAIT)
                    await pub.publish("/t/a/x", "last")
                    want = [b"0", b"1", b"2", b"last"]
                    assert [e.payload for e in await take(every, 4)] == want
                    assert [e.payload for e in await take(only_a, 4)] == want
                    await only_a.__aexit__(None, None, None)
            finally:
                await pub.close()
                await sub.close()

    asyncio.run(main())


async def take(sub: Any, n: int) -> list[Event]:
    out = []
    for _ in range(n):
        item = await sub.get(WAIT)
        assert isinstance(item, Event), item
        out.append(item)
    return out
