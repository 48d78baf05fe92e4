"""The replay/live junction (``core/junction.py``) on a node, with a connection whose reads the test gates:
the held events come after the replay, paced and in commit order; a hold that spills is read back from the log
across channels in commit order, to the new subscription and to the connection's other live subscription
alike; and held events the log lost meanwhile close the connection as a slow consumer, never a silent gap."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from hubbub.channels import parse_pattern
from hubbub.core import Node, NodeSettings, ReplayPlan, ReplaySpec, Session
from hubbub.events import Event, Position, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, RetentionPolicy

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
                    sess.end(1000)  # the frames queued are still taken
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
