"""The node's commit chain and deliveries isolated from a connection's code that raises (core/faults.py).

Against the node and a real (memory) store: the release of held events after a replay, the cluster relay's
path (``Node.fan_out``) and the publishers' completions. In each, one connection's encoder or callback
raises: that connection is closed with its internal-error close and counted, and every other connection,
publisher, durable-consumer hook and relay gets everything. The same over real sockets, for every dialect's
live delivery and for replays: tests/integration/test_fanout_faults.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from hubbub.channels import Pattern, parse_pattern
from hubbub.core import Node, NodeSettings, ReplayPlan, Session, replay_plans, replay_service
from hubbub.disconnect import Disconnect
from hubbub.errors import HubbubError
from hubbub.events import Event, Publisher
from hubbub.log import open_store
from hubbub.log.appended import Committed, expand_runs
from hubbub.log.base import AppendRequest, AppendResult, LogStore, RetentionPolicy
from hubbub.selection import LIVE, Selection

POISON = b"POISON"
WAIT = 10.0


class Enc:
    """Renders an event as its payload."""

    key = "test"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return event.payload


class PoisonEnc(Enc):
    """Raises for the poison, as an encoder bug would for one event."""

    key = "poisoned"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        if POISON in event.payload:
            raise TypeError("unencodable")
        return event.payload


def run(body: Callable[[Node], Awaitable[None]]) -> None:
    async def main() -> None:
        store = open_store("memory", "", "none", RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node:
            await body(node)

    asyncio.run(main())


def session(node: Node, enc: Enc) -> Session:
    s = Session("native", enc, max_items=1024, max_bytes=1 << 24)
    node.attach(s)
    return s


async def live(node: Node, s: Session, pattern: str) -> None:
    await node.subscribe(s, "s", parse_pattern(pattern), on_snapshot=lambda plan: None)


async def drain(sess: Session) -> list[bytes]:
    out: list[bytes] = []
    while sess.queued:
        out += await sess.next_frames()
    return out


def req(payload: bytes, channel: str = "/f/x") -> AppendRequest:
    return AppendRequest(channel, Publisher("native"), payload, "text/plain")


PAYLOADS = [b"a", b"b", POISON, b"d", b"e"]


def test_a_held_event_whose_encoding_raises_closes_the_session_at_its_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Events published while a subscription's replay is read are held on it, then released: the poison
    closes that session (4300), which is not left without its subscription's release; a live session gets
    every event."""
    entered, go = threading.Event(), threading.Event()
    plan_selection = replay_plans.plan_selection  # the function replay_service imported

    def held_plan(
        store: LogStore, pattern: Pattern, selection: Selection, keep: Any = None, keep_all: bool = False
    ) -> ReplayPlan:
        if selection is LIVE:  # the poisoned session's: registered, holding what is published now
            entered.set()
            assert go.wait(WAIT)
        return plan_selection(store, pattern, selection, keep, keep_all)

    monkeypatch.setattr(replay_service, "plan_selection", held_plan)

    async def body(node: Node) -> None:
        good = session(node, Enc())
        await live(node, good, "/f/x")
        bad = session(node, PoisonEnc())
        # Live only: no tops, so every held event is released.
        sub = asyncio.ensure_future(
            node.subscribe(bad, "s", parse_pattern("/f/x"), selection=LIVE, on_snapshot=lambda p: None)
        )
        assert await asyncio.to_thread(entered.wait, WAIT)
        for p in PAYLOADS:
            await node.publish(req(p))
        go.set()
        await asyncio.wait_for(sub, WAIT)
        assert bad.kicked == Disconnect.INTERNAL
        assert await drain(good) == PAYLOADS
        assert node.metrics.internal_closes == {"native": 1}

    run(body)


class LoopbackRelay:
    """A cluster relay that hands every committed event straight back to the node, as the broker's
    sequencer does with its own node's events (``Relay``)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.seen: list[int] = []
        self.called = asyncio.Event()

    def committed(self, events: Sequence[tuple[Session | None, Event]]) -> None:
        self.called.set()
        for origin, ev in events:
            self.seen.append(ev.seq)
            self.node.fan_out(ev, origin)

    def health(self) -> dict[str, Any]:
        return {"state": "up"}

    def statistics(self) -> dict[str, int | float]:
        return {}


def test_the_relay_path_goes_on_past_an_encoder_that_raises() -> None:
    """A commit of several events, fanned out by a relay (``Node.fan_out``): the relay gets every event and
    every other session every event, though one session's encoder raises for the third."""

    async def body(node: Node) -> None:
        relay = LoopbackRelay(node)
        node.relay = relay
        bad = session(node, PoisonEnc())
        good = [session(node, Enc()) for _ in range(2)]
        for s in [bad, *good]:
            await live(node, s, "/f/*")
        done: list[AppendResult | HubbubError] = []
        for p in PAYLOADS:  # one loop tick: one commit
            node.submit(req(p), done=done.append)
        await asyncio.wait_for(relay.called.wait(), WAIT)
        assert relay.seen == [1, 2, 3, 4, 5]
        assert [type(r) for r in done] == [AppendResult] * 5
        for s in good:
            assert await drain(s) == PAYLOADS
        assert bad.kicked == Disconnect.INTERNAL
        assert await drain(bad) == []
        assert node.metrics.internal_closes == {"native": 1}

    run(body)


def test_a_publishers_completion_that_raises_costs_no_one_else_an_ack_a_journal_item_or_an_event() -> None:
    """One commit of three publishers' events; the second publisher's ``done`` raises: it is closed, the
    others are answered, the durable consumers' hook sees the whole commit and the subscriber every event."""

    async def body(node: Node) -> None:
        sub = session(node, Enc())
        await live(node, sub, "/f/x")
        pubs = [session(node, Enc()) for _ in range(3)]
        answered: list[int] = []
        journaled: list[int] = []
        hooked = asyncio.Event()

        def hook(results: list[Committed]) -> None:
            journaled.extend(r.event.seq for r in expand_runs(results))
            hooked.set()

        node._batcher.commit_hook = hook

        def done(i: int) -> Callable[[AppendResult | HubbubError], None]:
            def cb(r: AppendResult | HubbubError) -> None:
                if i == 1:
                    raise RuntimeError("a transport bug")
                assert isinstance(r, AppendResult)
                answered.append(r.event.seq)

            return cb

        for i, p in enumerate(pubs):  # one loop tick: one commit
            node.submit(req(b"p%d" % i), p, done(i))
        await asyncio.wait_for(hooked.wait(), WAIT)
        assert answered == [1, 3]
        assert journaled == [1, 2, 3]
        assert await drain(sub) == [b"p0", b"p1", b"p2"]
        assert [p.kicked for p in pubs] == [None, Disconnect.INTERNAL, None]
        assert node.metrics.internal_closes == {"native": 1}

    run(body)
