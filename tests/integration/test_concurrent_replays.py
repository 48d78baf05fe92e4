"""Several subscriptions of one connection replaying at once (``core/hold.py``, ``core/junction.py``): live
fan-out keeps an event that matches two of them for each, and each one's junction delivers it unless its
own replay covered it; the connection's live subscriptions get it once, from one of them. On a node, with
the snapshots gated so that events are committed before, between and after them, and the holds released in
either order; then over real sockets, for a native client and a guble client subscribing concurrently."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hubbub.channels import parse_pattern
from hubbub.core import Node, NodeSettings, ReplayPlan, ReplaySpec, Session, replay_service
from hubbub.core.replay_plans import plan_selection
from hubbub.disconnect import Disconnect
from hubbub.events import Event, Position, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, RetentionPolicy

WAIT = 10.0
BEFORE = 3
CHANNELS = ("/j/a", "/j/b")

Frame = tuple[str, int, tuple[str, ...], bool]


class Enc:
    """Frames that name the subscriptions, as native's do (and show them to the test)."""

    key = "test"
    names_subscriptions = True

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return repr((event.channel, event.seq, tuple(subs), replay)).encode()


class Unnamed(Enc):
    """Frames that do not name them, as guble's, mist's or wearscript's (the test still sees them)."""

    names_subscriptions = False


def req(channel: str) -> AppendRequest:
    return AppendRequest(channel, Publisher("native", "u", "a", ""), b"x", "text/plain")


class Gates:
    """Each gated pattern's snapshot read waits until its gate is opened (on a reader thread)."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.entered = {p: threading.Event() for p in patterns}
        self.release = {p: threading.Event() for p in patterns}
        self.armed = False

    def plan(self, store: Any, pattern: Any, *args: Any) -> ReplayPlan:
        if self.armed and pattern.text in self.entered:
            self.entered[pattern.text].set()
            assert self.release[pattern.text].wait(WAIT)
        return plan_selection(store, pattern, *args)

    async def reading(self, pattern: str) -> None:
        assert await asyncio.to_thread(self.entered[pattern].wait, WAIT)


def received(got: list[Frame], sub_id: str) -> list[tuple[str, int]]:
    return [(ch, seq) for ch, seq, subs, _ in got if sub_id in subs]


def per_channel(events: list[tuple[str, int]]) -> dict[str, list[int]]:
    return {ch: [seq for c, seq in events if c == ch] for ch in CHANNELS}


def matching(log: list[tuple[str, int]], pattern: str) -> list[tuple[str, int]]:
    p = parse_pattern(pattern)
    return [(ch, seq) for ch, seq in log if p.matches(ch)]


#: The replaying subscriptions and their patterns: overlapping, alike, disjoint, three of them.
PATTERNS = {
    "overlap": {"x": "/j/**", "y": "/j/a"},
    "alike": {"x": "/j/**", "y": "/j/*"},
    "disjoint": {"x": "/j/a", "y": "/j/b"},
    "three": {"x": "/j/**", "y": "/j/a", "z": "/j/*"},
}


@pytest.mark.parametrize("patterns", sorted(PATTERNS))
@pytest.mark.parametrize("names", [True, False], ids=["named", "unnamed"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
@pytest.mark.parametrize("live", [False, True], ids=["replaying", "and-live"])
@pytest.mark.parametrize(
    ("flow", "replay"),
    [("gated", "all"), ("free", "all"), ("free", "none")],
    ids=["gated-since-start", "free-since-start", "free-heads-only"],
)
def test_subscriptions_replaying_at_once_each_get_every_event_once_in_order(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    patterns: str,
    names: bool,
    order: str,
    replay: str,
    live: bool,
    flow: str,
) -> None:
    """The subscriptions subscribe with a replay at once; events go to both channels before every snapshot
    is read, and after each one's. ``gated``: the connection reads nothing until every snapshot is read (each
    replay, longer than its queue of 4, waits on it, its subscription holding); ``free``: each subscription
    is live before the next snapshot is read; ``heads-only``: no replay, the snapshot's heads only. Each
    subscription gets its replay and then every later event of its channels, and a live ``o`` on ``/j/**``
    every event after it subscribed: each id once, in order per channel. ``unnamed``: the connection's frames
    do not name subscriptions, so it gets every one of those events, and each live one once."""
    pats = PATTERNS[patterns]
    ids = sorted(pats) if order == "forward" else sorted(pats, reverse=True)
    gates = Gates(list(pats.values()))
    monkeypatch.setattr(replay_service, "plan_selection", gates.plan)

    async def main() -> None:
        store = open_store("memory", str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        initial = store.append([req(ch) for _ in range(BEFORE) for ch in CHANNELS])
        log = [(r.event.channel, r.event.seq) for r in initial]
        async with Node(store, NodeSettings()) as node:
            sess = Session("native", Enc() if names else Unnamed(), max_items=4, max_bytes=1 << 20)
            node.attach(sess)
            if live:
                await node.subscribe(sess, "o", parse_pattern("/j/**"), on_snapshot=lambda p: None)
            start = len(log)
            #: Per subscription, the snapshot's channel tops; a channel without one starts at the subscribe.
            tops: dict[str, dict[str, int]] = {}
            snapped = {s: asyncio.Event() for s in pats}
            reading = asyncio.Event()
            got: list[Frame] = []

            async def consume() -> None:
                await reading.wait()
                while frames := await sess.next_frames():
                    got.extend(eval(f.decode()) for f in frames)

            reader = asyncio.ensure_future(consume())
            if flow == "free":
                reading.set()

            async def publish(n: int) -> None:
                for i in range(n):
                    r = await node.publish(req(CHANNELS[i % 2]))
                    log.append((r.event.channel, r.event.seq))

            def subscribe(sub_id: str) -> asyncio.Future[Any]:
                def snap(plan: ReplayPlan) -> None:
                    tops[sub_id] = dict(plan.tops)
                    snapped[sub_id].set()

                pattern = parse_pattern(pats[sub_id])
                since: Position | dict[str, Position] = Position(0, "")
                if not pattern.is_exact:
                    since = {ch: Position(0, "") for ch in CHANNELS}
                spec = ReplaySpec(since=since) if replay == "all" else ReplaySpec()
                return asyncio.ensure_future(
                    node.subscribe(sess, sub_id, pattern, selection=spec, on_snapshot=snap)
                )

            gates.armed = True
            tasks = {s: subscribe(s) for s in ids}
            for s in ids:
                await gates.reading(pats[s])
            await publish(4)  # every one holding, before every snapshot
            for s in ids:
                gates.release[pats[s]].set()
                await asyncio.wait_for(snapped[s].wait(), WAIT)
                if flow == "free":
                    await asyncio.wait_for(tasks[s], WAIT)
                await publish(4)  # after this one's snapshot, before the next one's
            reading.set()
            for s in ids:
                await asyncio.wait_for(tasks[s], WAIT)
            await publish(4)  # every one live
            sess.end(Disconnect.NORMAL)
            await asyncio.wait_for(reader, WAIT)
        assert not sess.kicked
        wants = {"o": log[start:]} if live else {}
        for s in ids:
            wants[s] = matching(log, pats[s])
            if replay == "none":
                top = tops[s]
                wants[s] = [(ch, seq) for ch, seq in matching(log[start:], pats[s]) if seq > top.get(ch, 0)]
        if names:
            # Per channel, every id once and in order (across channels, a live subscription's events held on
            # another one's hold come at that one's junction: README §3).
            for s, want in wants.items():
                assert per_channel(received(got, s)) == per_channel(want), s
        else:
            live_frames = [(ch, seq) for ch, seq, _, replayed in got if not replayed]
            assert len(live_frames) == len(set(live_frames))
            every = {(ch, seq) for ch, seq, _, _ in got}
            assert [e for want in wants.values() for e in want if e not in every] == []

    asyncio.run(main())


async def blocked(node: Node, sess: Session, sub_id: str, pattern: str) -> asyncio.Future[Any]:
    """Subscribe ``sub_id`` from the start of both channels; returns once its snapshot is read (its replay,
    longer than the queue, then waits on the connection, which reads nothing yet)."""
    read = asyncio.Event()
    p = parse_pattern(pattern)
    since: Position | dict[str, Position] = Position(0, "")
    if not p.is_exact:
        since = {ch: Position(0, "") for ch in CHANNELS}
    task = asyncio.ensure_future(
        node.subscribe(sess, sub_id, p, selection=ReplaySpec(since=since), on_snapshot=lambda _: read.set())
    )
    await asyncio.wait_for(read.wait(), WAIT)
    return task


def spill_run(tmp_path: Path, body: Any) -> tuple[list[Frame], list[tuple[str, int]], Session]:
    """Run ``body(node, sess, publish, log)`` with a node whose log has both channels 1..BEFORE and a
    session with a queue of 4 (holds of 16) that reads only once ``body`` returns; then end the session and
    return what it got, with the log."""

    async def main() -> tuple[list[Frame], list[tuple[str, int]], Session]:
        store = open_store("memory", str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        log = [
            (r.event.channel, r.event.seq)
            for r in store.append([req(ch) for _ in range(BEFORE) for ch in CHANNELS])
        ]
        async with Node(store, NodeSettings()) as node:
            sess = Session("native", Enc(), max_items=4, max_bytes=1 << 20)
            node.attach(sess)

            async def publish(ch: str, n: int) -> None:
                for _ in range(n):
                    r = await node.publish(req(ch))
                    log.append((r.event.channel, r.event.seq))

            got: list[Frame] = []
            tasks = await body(node, sess, publish, log)
            reader_done = asyncio.Event()

            async def consume() -> None:
                while frames := await sess.next_frames():
                    got.extend(eval(f.decode()) for f in frames)
                reader_done.set()

            reader = asyncio.ensure_future(consume())
            for t in tasks:
                await asyncio.wait_for(t, WAIT)
            if not sess.kicked:
                await publish("/j/a", 1)  # every one live
            sess.end(Disconnect.NORMAL)
            await asyncio.wait_for(reader, WAIT)
        return got, log, sess

    return asyncio.run(main())


def test_a_spilled_hold_owes_a_subscription_that_went_live_meanwhile_only_what_it_lost_after(
    tmp_path: Path,
) -> None:
    """``x`` replays, its hold spills; ``y`` subscribes to ``/j/a`` (no replay) and goes live while ``x`` is
    spilled: of the ``/j/a`` events ``x`` lost and reads back, ``y`` gets those after it went live, not the
    ones before (they are not in its stream)."""
    marks: dict[str, int] = {}

    async def body(node: Node, sess: Session, publish: Any, log: list[tuple[str, int]]) -> list[Any]:
        x = await blocked(node, sess, "x", "/j/**")
        await publish("/j/b", 20)  # x's hold keeps 16, then spills
        await publish("/j/a", 2)  # lost, before y
        marks["y"] = len(log)
        await node.subscribe(
            sess, "y", parse_pattern("/j/a"), selection=ReplaySpec(), on_snapshot=lambda p: None
        )
        await publish("/j/a", 3)  # lost on x, owed to y (live)
        await publish("/j/b", 1)
        return [x]

    got, log, sess = spill_run(tmp_path, body)
    assert not sess.kicked
    assert per_channel(received(got, "x")) == per_channel(log)
    assert per_channel(received(got, "y")) == per_channel(matching(log[marks["y"] :], "/j/a"))


@pytest.mark.parametrize("names", [True, False], ids=["named", "unnamed"])
def test_spilled_holds_of_two_replaying_subscriptions_close_the_session_rather_than_lose_an_event(
    tmp_path: Path, names: bool
) -> None:
    """``x`` and ``y`` replay at once and both holds spill on events both match: which of them owed the lost
    events to the live ``o`` (or, without subscription names in the frames, sent them) is not known, so the
    session is closed as a slow consumer; what it got has no gap and no duplicate per subscription (without
    names: per replay, and in the connection's live frames, whichever junction sent each one)."""

    async def body(node: Node, sess: Session, publish: Any, log: list[tuple[str, int]]) -> list[Any]:
        if not names:
            sess.encoder = Unnamed()
        await node.subscribe(sess, "o", parse_pattern("/j/**"), on_snapshot=lambda p: None)
        x = await blocked(node, sess, "x", "/j/**")
        y = await blocked(node, sess, "y", "/j/a")
        await publish("/j/a", 20)
        return [x, y]

    got, _, sess = spill_run(tmp_path, body)
    assert sess.kicked == sess.slow_close_code
    # Each replay's frames name their own subscription, in either case.
    streams = {f"{s} replay": [(c, q) for c, q, subs, replay in got if replay and s in subs] for s in "xy"}
    if names:
        streams |= {s: [(c, q) for c, q, subs, replay in got if not replay and s in subs] for s in "xyo"}
    else:
        # Frames that do not name subscriptions carry a live event once for the whole connection, from
        # whichever junction sends it first: the subscriptions a frame lists are not the client's to see, so
        # the connection's live frames are the stream (one of them listing y alone is no gap of o's).
        streams["live"] = [(ch, seq) for ch, seq, _subs, replay in got if not replay]
    assert streams["live" if not names else "o"], got
    for s, events in streams.items():
        for ch, seqs in per_channel(events).items():
            if seqs:  # a run of consecutive ids: no gap, no duplicate
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (s, ch, got)


class Caching(Enc):
    """Caches an event's frame under one fixed key of the event's rendering cache, as the WearScript, mist
    and qpubs encoders do."""

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        hit: bytes | None = cache.get("frame")
        if hit is None:
            hit = cache["frame"] = super().encode_event(event, subs, replay, cache)
        return hit


def test_each_held_event_is_rendered_for_itself(tmp_path: Path) -> None:
    """The junction renders each held event through a cache of its own: one shared by all of them made an
    encoder that caches under a fixed key send the first held event's frame for every one."""

    async def body(node: Node, sess: Session, publish: Any, log: list[tuple[str, int]]) -> list[Any]:
        sess.encoder = Caching()
        x = await blocked(node, sess, "x", "/j/**")
        await publish("/j/a", 3)
        await publish("/j/b", 3)
        return [x]

    got, log, sess = spill_run(tmp_path, body)
    assert not sess.kicked
    # The held events (and the last one, live): what follows the replay of the 2 x BEFORE events before.
    assert [(ch, seq) for ch, seq, _, replayed in got if not replayed] == log[2 * BEFORE :]


def test_each_replayed_event_is_rendered_for_itself(tmp_path: Path) -> None:
    """A replay renders each event through a cache of its own, as fan-out and the junction do: one cache for
    the whole replay made an encoder that caches under a fixed key send the first event's frame for each."""

    async def body(node: Node, sess: Session, publish: Any, log: list[tuple[str, int]]) -> list[Any]:
        sess.encoder = Caching()
        return [await blocked(node, sess, "x", "/j/**")]

    got, log, sess = spill_run(tmp_path, body)
    assert not sess.kicked
    assert [(ch, seq) for ch, seq, _, replayed in got if replayed] == log[: 2 * BEFORE]


def test_each_replayed_event_of_one_channel_is_rendered_for_itself(tmp_path: Path) -> None:
    """The same through an exact channel's replay."""

    async def body(node: Node, sess: Session, publish: Any, log: list[tuple[str, int]]) -> list[Any]:
        sess.encoder = Caching()
        return [await blocked(node, sess, "x", "/j/a")]

    got, log, sess = spill_run(tmp_path, body)
    assert not sess.kicked
    assert [(ch, seq) for ch, seq, _, replayed in got if replayed] == [
        e for e in log[: 2 * BEFORE] if e[0] == "/j/a"
    ]


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_a_held_event_two_junctions_wait_to_send_goes_once_to_a_connection_without_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """``x`` and ``y`` (no replay) read their snapshots at once on a connection whose frames do not name
    subscriptions and whose queue is full; events both match are published after both snapshots are read,
    so each one's junction holds them outside its snapshot, and both wait for room at the first of them. The
    one that gets room second must not send again what the other one sent meanwhile: each event once."""
    read = {p: threading.Event() for p in ("/j/**", "/j/*")}
    go = threading.Event()

    def plan(store: Any, pattern: Any, *args: Any) -> ReplayPlan:
        p = plan_selection(store, pattern, *args)
        if pattern.text in read:  # the snapshot is read: hold what follows until both are
            read[pattern.text].set()
            assert go.wait(WAIT)
        return p

    monkeypatch.setattr(replay_service, "plan_selection", plan)

    async def main() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        store = open_store("memory", str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        store.append([req(ch) for _ in range(BEFORE) for ch in CHANNELS])
        log: list[tuple[str, int]] = []
        async with Node(store, NodeSettings()) as node:
            sess = Session("native", Unnamed(), max_items=4, max_bytes=1 << 20)
            node.attach(sess)
            await node.subscribe(sess, "o", parse_pattern("/**"), on_snapshot=lambda p: None)

            async def publish(ch: str, n: int) -> None:
                for _ in range(n):
                    r = await node.publish(req(ch))
                    log.append((r.event.channel, r.event.seq))

            await publish("/k", 3)  # o's alone: the queue is full
            snapped = {s: asyncio.Event() for s in ("x", "y")}
            subs = [("x", "/j/**"), ("y", "/j/*")]

            def subscribe(sub_id: str, pattern: str) -> asyncio.Future[Any]:
                return asyncio.ensure_future(
                    node.subscribe(
                        sess,
                        sub_id,
                        parse_pattern(pattern),
                        selection=ReplaySpec(),
                        on_snapshot=lambda _: snapped[sub_id].set(),
                    )
                )

            tasks = [subscribe(s, p) for s, p in (subs if order == "forward" else subs[::-1])]
            for r in read.values():
                assert await asyncio.to_thread(r.wait, WAIT)
            for ch in CHANNELS:
                await publish(ch, 3)  # held on both, after both snapshots
            go.set()
            for e in snapped.values():  # each junction waits for room at the first held event
                await asyncio.wait_for(e.wait(), WAIT)
            assert sess.needs_room()
            got: list[tuple[str, int]] = []

            async def consume() -> None:
                while frames := await sess.next_frames():
                    got.extend((ch, seq) for ch, seq, _, _ in (eval(f.decode()) for f in frames))

            reader = asyncio.ensure_future(consume())
            for t in tasks:
                await asyncio.wait_for(t, WAIT)
            await publish("/j/a", 1)  # every one live
            sess.end(Disconnect.NORMAL)
            await asyncio.wait_for(reader, WAIT)
        assert not sess.kicked
        return got, log

    got, log = asyncio.run(main())
    assert got == log
