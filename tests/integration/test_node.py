"""The core node against real stores: fan-out, replay/live junction, recovery rules (native.md §6)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import pytest

from hubbub.channels import parse_pattern
from hubbub.core import Node, NodeSettings, ReplayPlan, ReplaySpec, Session
from hubbub.core.session import Overflow
from hubbub.errors import HubbubError, LimitExceeded, SubscriptionError
from hubbub.events import Event, Position, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, EventLog, RetentionPolicy
from hubbub.log.memory import MemoryLogStore


class Enc:
    """Records what a session would put on the wire as plain tuples."""

    key = "test"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return repr((event.channel, event.seq, tuple(subs), replay, event.payload.decode())).encode()


async def drain(sess: Session) -> list[Any]:
    out: list[Any] = []
    while sess.queued:
        for f in await sess.next_frames():
            out.append(eval(f.decode()))
    return out


def req(channel: str, payload: str, tags: tuple[str, ...] = ()) -> AppendRequest:
    return AppendRequest(channel, Publisher("native"), payload.encode(), "text/plain", tags=tags)


P = ParamSpec("P")
T = TypeVar("T")


class Run(Protocol):
    """The ``run`` fixture: ``body(node)`` on a node over the parametrized store, with
    ``NodeSettings(**settings)``."""

    def __call__(self, body: Callable[[Node], Awaitable[None]], **settings: Any) -> None: ...


@pytest.fixture(params=["memory", "sqlite"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Run:
    def runner(body: Callable[[Node], Awaitable[None]], **settings: Any) -> None:
        async def main() -> None:
            store = open_store(request.param, str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
            async with Node(store, NodeSettings(**settings)) as node:
                await body(node)

        asyncio.run(main())

    return runner


def session(node: Node, max_items: int = 1024, echo: bool = True) -> Session:
    s = Session("native", Enc(), max_items=max_items, max_bytes=1 << 24, echo=echo)
    node.attach(s)
    return s


async def sub(
    node: Node,
    s: Session,
    sid: str,
    pattern: str,
    spec: ReplaySpec | None = None,
    tags: frozenset[str] = frozenset(),
) -> list[ReplayPlan]:
    plans: list[ReplayPlan] = []
    await node.subscribe(s, sid, parse_pattern(pattern), tags, spec or ReplaySpec(), on_snapshot=plans.append)
    return plans


def test_subtree_receives_once_with_every_matching_sub(run: Run) -> None:
    async def body(node: Node) -> None:
        s = session(node)
        await sub(node, s, "a", "/a/**")
        await sub(node, s, "b", "/a/b/c")
        await sub(node, s, "c", "/a/*/c")
        await node.publish(req("/a/b/c", "hi"))
        await node.publish(req("/ab", "no"))
        assert await drain(s) == [("/a/b/c", 1, ("a", "b", "c"), False, "hi")]

    run(body)


def test_tags_and_echo(run: Run) -> None:
    async def body(node: Node) -> None:
        quiet = session(node, echo=False)
        other = session(node)
        await sub(node, quiet, "q", "/t", tags=frozenset({"x"}))
        await sub(node, other, "o", "/t", tags=frozenset({"x"}))
        r = req("/t", "own", ("x", "y"))
        await node.publish(r, quiet)
        await node.publish(req("/t", "untagged"))
        assert await drain(quiet) == []
        assert await drain(other) == [("/t", 1, ("o",), False, "own")]

    run(body)


def test_since_replays_exactly_then_live(run: Run) -> None:
    async def body(node: Node) -> None:
        for i in range(5):
            r = await node.publish(req("/r", str(i + 1)))
        epoch = r.event.epoch
        s = session(node)
        plans = await sub(node, s, "s", "/r", ReplaySpec(since=Position(2, epoch)))
        assert plans[0].position == Position(5, epoch)
        await node.publish(req("/r", "6"))
        got = await drain(s)
        assert got == [("/r", n, ("s",), True, str(n)) for n in (3, 4, 5)] + [("/r", 6, ("s",), False, "6")]

    run(body)


def test_replay_live_junction_under_concurrent_publishing(run: Run) -> None:
    """A publisher commits one event after another while a subscription with a replay is made. A probe on the
    node's reader hand-off (``Node.read``, which every snapshot goes through) waits, right after the snapshot
    is read, until the publisher has committed more: those commits raced the snapshot and are held on the new
    subscription (checked), then released after the replay. The session gets every event once, in order,
    across the junction."""

    async def body(node: Node) -> None:
        first = await node.publish(req("/j", "1"))
        committed = [first.event.seq]
        progress = asyncio.Event()  # set, and cleared by whoever waits, at each commit
        stop = asyncio.Event()

        async def publisher() -> None:
            i = 1
            while not stop.is_set():
                i += 1
                r = await node.publish(req("/j", str(i)))
                committed.append(r.event.seq)
                progress.set()

        async def until_committed(n: int) -> None:
            while len(committed) < n:
                progress.clear()
                await asyncio.wait_for(progress.wait(), 10)

        task = asyncio.ensure_future(publisher())
        await until_committed(5)  # the publisher is going
        s = session(node, max_items=100000)
        real_read = node._reads.call
        raced: list[tuple[int, list[int]]] = []  # (commits during the probe, held seqs then)

        async def probe(fn: Callable[Concatenate[EventLog, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
            result = await real_read(fn, *args, **kwargs)
            before = len(committed)
            # One publish is in flight at a time, and it may be in the snapshot already while its completion
            # is still on its way here: of the next four commits, at least three come after the snapshot.
            await until_committed(before + 4)
            held = [sb for sb in node.subscriptions(s) if sb.sub_id == "s" and sb.holding is not None]
            holds = [sb.holding.events for sb in held if sb.holding is not None]
            raced.append((len(committed) - before, [e.seq for h in holds for e in h]))
            return result

        node._reads.call = probe  # type: ignore[method-assign]  # a test double
        plans = await sub(node, s, "s", "/j", ReplaySpec(since=Position(1, first.event.epoch)))
        node._reads.call = real_read  # type: ignore[method-assign]  # a test double
        n = len(committed)
        await until_committed(n + 3)  # live events after the junction
        stop.set()
        await task
        await node.publish(req("/j", "last"))
        top = plans[0].position
        assert top is not None
        # The race happened: commits landed between the snapshot and going live, and were held (events held
        # from before the snapshot, at or below its top, are the replay's and released to nobody).
        ((count, held),) = raced
        after_snapshot = [seq for seq in held if seq > top.seq]
        assert count >= 3 and len(after_snapshot) >= 3, (top, held)
        got = await drain(s)
        seqs = [f[1] for f in got]
        assert seqs == list(range(2, seqs[-1] + 1)), "gapless and duplicate-free across the junction"
        assert seqs[-1] == committed[-1] + 1
        # Replayed up to the snapshot's top, live (the held ones first) after it.
        assert [f[3] for f in got] == [seq <= top.seq for seq in seqs]
        assert set(after_snapshot) <= set(seqs)

    run(body)


def test_gaps_epoch_trimmed_and_ahead(run: Run) -> None:
    async def body(node: Node) -> None:
        r = await node.publish(req("/g", "1"))
        e = r.event.epoch
        s = session(node)
        plans = await sub(node, s, "a", "/g", ReplaySpec(since=Position(1, "otherepo")))
        assert [g.reason for g in plans[0].gaps] == ["epoch"]
        assert not plans[0].events and not plans[0].replayed
        plans = await sub(node, s, "b", "/g", ReplaySpec(since=Position(9, e)))
        assert [g.reason for g in plans[0].gaps] == ["ahead"]
        # This log was opened fresh: no commit can have been lost, so the claim is the client's error. The
        # channel keeps its epoch and its events (a new epoch after lost commits: test_ahead_after_...).
        assert plans[0].gaps[0].position == Position(1, e)
        r2 = await node.publish(req("/g", "again"))
        assert (r2.event.seq, r2.event.epoch) == (2, e)
        assert [ev.payload for ev in node._store.read("/g")] == [b"1", b"again"]

    run(body)


def test_trimmed_gap(tmp_path: Path) -> None:
    async def main() -> None:
        store = open_store("memory", str(tmp_path), "commit", RetentionPolicy(max_events=3), 600)
        async with Node(store) as node:
            for i in range(10):
                r = await node.publish(req("/tr", str(i)))
            s = session(node)
            plans = await sub(node, s, "s", "/tr", ReplaySpec(since=Position(2, r.event.epoch)))
            assert [g.reason for g in plans[0].gaps] == ["trimmed"]
            plans = await sub(node, s, "t", "/tr", ReplaySpec(since=Position(7, r.event.epoch)))
            assert not plans[0].gaps
            assert [f[1] for f in await drain(s)] == [8, 9, 10]

    asyncio.run(main())


def test_recovery_has_no_ceiling_and_limits(run: Run) -> None:
    async def body(node: Node) -> None:
        for _ in range(5):
            r = await node.publish(req("/big", "x"))
        s = session(node)
        await sub(node, s, "r", "/big", ReplaySpec(since=Position(0, r.event.epoch)))
        assert [f[1] for f in await drain(s)] == [1, 2, 3, 4, 5]
        node.unsubscribe(s, "r")
        assert node.subscriptions(s) == []
        await sub(node, s, "s", "/big")
        with pytest.raises(SubscriptionError) as info:
            await sub(node, s, "s", "/big")
        assert info.value.code == 4200
        await sub(node, s, "t", "/x")
        with pytest.raises(LimitExceeded):
            await sub(node, s, "u", "/y")

    run(body, max_subscriptions=2)


def test_pattern_replay_in_merged_order(run: Run) -> None:
    async def body(node: Node) -> None:
        t0 = (await node.publish(req("/p/a", "a1"))).event.time_ns
        await node.publish(req("/p/b", "b1"))
        await node.publish(req("/p/a", "a2"))
        await node.publish(req("/q", "no"))
        s = session(node)
        await sub(node, s, "s", "/p/**", ReplaySpec(from_time=t0))
        assert [f[4] for f in await drain(s)] == ["a1", "b1", "a2"]
        await sub(node, s, "l", "/p/*", ReplaySpec(last=2))
        assert [f[4] for f in await drain(s)] == ["b1", "a2"]

    run(body)


def test_slow_consumer_is_kicked(run: Run) -> None:
    async def body(node: Node) -> None:
        s = session(node, max_items=4)
        await sub(node, s, "s", "/slow")
        for i in range(10):
            await node.publish(req("/slow", str(i)))
        assert s.kicked == 4302
        assert node.metrics.slow_closes.get("native") == 1

    run(body)


def test_storage_failure_reaches_publisher(tmp_path: Path) -> None:
    async def main() -> None:
        store = open_store("memory", str(tmp_path), "commit", RetentionPolicy(), 600)
        async with Node(store) as node:

            def broken(batch: Any) -> Any:
                raise OSError("disk gone")

            # Both ways in: the writer asks the memory store through append_runs (log/appended.py).
            assert isinstance(store, MemoryLogStore)
            store.append = broken  # type: ignore[method-assign]  # a test double
            store.append_runs = broken  # type: ignore[method-assign]  # a test double
            with pytest.raises(HubbubError) as info:
                await node.publish(req("/x", "1"))
            assert info.value.code == 4301

    asyncio.run(main())


def test_delivery_filters_and_session_lookup(run: Run) -> None:
    async def body(node: Node) -> None:
        alice = session(node)
        alice.user = "alice"
        bob = session(node)
        bob.user = "bob"
        for s in (alice, bob):
            await sub(node, s, "s", "/f")
        r = AppendRequest(
            "/f", Publisher("guble"), b"to alice", "text/plain", headers={":filter.user_id": "alice"}
        )
        await node.publish(r)
        to_bob_app = AppendRequest(
            "/f", Publisher("guble"), b"to bob", "text/plain", headers={":filter.application_id": bob.id}
        )
        await node.publish(to_bob_app)
        nobody = AppendRequest(
            "/f", Publisher("guble"), b"x", "text/plain", headers={":filter.colour": "red"}
        )
        await node.publish(nobody)
        assert [f[4] for f in await drain(alice)] == ["to alice"]
        assert [f[4] for f in await drain(bob)] == ["to bob"]
        assert node.session_by_id(bob.id) is bob
        node.detach(bob)
        assert node.session_by_id(bob.id) is None

    run(body)


def test_held_event_inside_the_snapshot_still_reaches_other_live_subs(run: Run) -> None:
    async def body(node: Node) -> None:
        s = session(node)
        await sub(node, s, "live", "/h/**")
        # Hold the new exact subscription open while a publish commits, as a slow snapshot read would.
        plans: list[ReplayPlan] = []
        gate = asyncio.Event()
        real_read = node._reads.call

        published = asyncio.Event()

        async def slow_read(
            fn: Callable[Concatenate[EventLog, P], T], *args: P.args, **kwargs: P.kwargs
        ) -> T:
            await node.publish(req("/h/x", "during"))
            published.set()
            await gate.wait()
            return await real_read(fn, *args, **kwargs)

        node._reads.call = slow_read  # type: ignore[method-assign]  # a test double
        task = asyncio.ensure_future(
            node.subscribe(s, "new", parse_pattern("/h/x"), on_snapshot=plans.append)
        )
        await asyncio.wait_for(published.wait(), 10)
        node._reads.call = real_read  # type: ignore[method-assign]  # a test double
        gate.set()
        await task
        await node.publish(req("/h/x", "after"))
        got = await drain(s)
        assert got == [("/h/x", 1, ("live",), False, "during"), ("/h/x", 2, ("live", "new"), False, "after")]
        assert plans[0].position is not None and plans[0].position.seq == 1

    run(body)


def test_ahead_under_fsync_is_a_gap_without_a_new_epoch(tmp_path: Path) -> None:
    async def main() -> None:
        store = open_store("sqlite", str(tmp_path), "fsync", RetentionPolicy(), 600)
        async with Node(store) as node:
            r = await node.publish(req("/f", "1"))
            s = session(node)
            plans = await sub(node, s, "s", "/f", ReplaySpec(since=Position(5, r.event.epoch)))
            assert [g.reason for g in plans[0].gaps] == ["ahead"]
            # fsync loses no commit: the claim is the client's error, and the log keeps its epoch and events.
            again = await node.publish(req("/f", "2"))
            assert (again.event.seq, again.event.epoch) == (2, r.event.epoch)

    asyncio.run(main())


def _killed_publisher(db: Path, channel: str, n: int) -> str:
    """Append ``n`` events to ``channel`` of the log ``db`` (durability commit) in another process, which is
    then killed without closing anything (as in a crash); returns the channel's epoch."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from hubbub.events import Publisher
        from hubbub.log import AppendRequest, SqliteLogStore
        st = SqliteLogStore({str(db)!r}, durability="commit")
        pub = Publisher("native")
        st.append([AppendRequest({channel!r}, pub, b"%d" % i, "text/plain") for i in range({n})])
        print(st.head({channel!r}).epoch, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == -9, proc.stderr
    return proc.stdout.strip()


def test_ahead_after_an_unclean_stop_starts_a_new_epoch_and_keeps_the_events(tmp_path: Path) -> None:
    """After a stop that may have lost commits, a client that saw more than the log holds gets a new epoch
    (native.md §6), and the old epoch's events stay in the store. Only once: the new epoch is the server's
    own, so a claim beyond its top is the client's error."""
    data = tmp_path / "data"
    data.mkdir()
    old = _killed_publisher(data / "hubbub.db", "/l", 3)

    async def main() -> None:
        store = open_store("sqlite", str(data), "commit", RetentionPolicy(), 600)
        async with Node(store) as node:
            s = session(node)
            plans = await sub(node, s, "a", "/l", ReplaySpec(since=Position(5, old)))
            gap = plans[0].gaps[0]
            assert gap.reason == "ahead" and gap.position.seq == 0 and gap.position.epoch not in ("", old)
            new = gap.position.epoch
            assert plans[0].position == Position(0, new) and not plans[0].events
            assert store.head("/l").epoch == new
            # Nothing was deleted: the old epoch is still in the store, under its own epoch.
            assert [e.payload for e in store.read("/l", epoch=old)] == [b"0", b"1", b"2"]
            assert [ci.epoch for ci in store.retired_epochs("/l")] == [old]
            assert store.stats().events == 3
            r = await node.publish(req("/l", "after"))
            assert (r.event.seq, r.event.epoch) == (1, new)
            # The same claim again: the epoch differs now, so it is an ``epoch`` gap; no further new epoch.
            plans = await sub(node, s, "b", "/l", ReplaySpec(since=Position(5, old)))
            assert [(g.reason, g.position) for g in plans[0].gaps] == [("epoch", Position(1, new))]
            # A claim beyond the new epoch's top: nothing of it can have been lost.
            plans = await sub(node, s, "c", "/l", ReplaySpec(since=Position(9, new)))
            assert [(g.reason, g.position) for g in plans[0].gaps] == [("ahead", Position(1, new))]
            again = await node.publish(req("/l", "again"))
            assert (again.event.seq, again.event.epoch) == (2, new)
            assert store.stats().events == 5

    asyncio.run(main())


def test_durability_none_restart_keeps_the_old_events(tmp_path: Path) -> None:
    """A ``durability=none`` start gives every channel a new epoch; the events of the old ones stay in the
    store under their old epochs."""

    async def start() -> Node:
        store = open_store("sqlite", str(tmp_path), "none", RetentionPolicy(), 600)
        node = Node(store, new_epochs=True)
        await node.__aenter__()
        return node

    async def main() -> None:
        node = await start()
        first = [(await node.publish(req("/n", str(i)))).event for i in range(2)]
        await node.close()
        node = await start()
        try:
            store = node._store
            head = store.head("/n")
            assert head.epoch not in ("", first[0].epoch) and head.top == 0
            assert store.read("/n", epoch=first[0].epoch) == first
            assert store.stats().events == 2
            s = session(node)
            plans = await sub(node, s, "a", "/n", ReplaySpec(since=Position(2, first[0].epoch)))
            assert [g.reason for g in plans[0].gaps] == ["epoch"]
            assert (await node.publish(req("/n", "x"))).event.position == Position(1, head.epoch)
        finally:
            await node.close()

    asyncio.run(main())


def test_burst_fan_out_keeps_order_ids_echo_filters_and_overflow(run: Run) -> None:
    """Publishes of one tick commit together and fan out in runs (FanOut.fan_out_run): every session must
    still get exactly its events, in commit order, with its own subscription ids."""

    async def body(node: Node) -> None:
        origin = session(node, echo=False)
        plain = session(node)
        both = session(node)
        slow = session(node, max_items=3)
        for s in (origin, plain, both, slow):
            await sub(node, s, "x", "/r/**")
        await sub(node, both, "y", "/r/a")
        burst: list[tuple[str, Session | None, dict[str, str]]] = [
            ("/r/a", origin, {}),
            ("/r/a", origin, {}),
            ("/r/b", origin, {}),
            ("/r/a", None, {}),
            ("/r/a", None, {":filter.user_id": "nobody"}),
            ("/r/b", None, {}),
            ("/r/a", origin, {}),
        ]
        done: list[Any] = []
        all_done = asyncio.Event()

        def on_done(r: Any) -> None:
            done.append(r)
            if len(done) == len(burst):
                all_done.set()

        for i, (ch, who, headers) in enumerate(burst):
            r = AppendRequest(ch, Publisher("native"), str(i).encode(), "text/plain", headers=headers)
            node.submit(r, who, on_done)
        await asyncio.wait_for(all_done.wait(), 10)
        seqs = {"/r/a": 0, "/r/b": 0}
        expected: list[tuple[str, int, str, Session | None, bool]] = []
        for i, (ch, who, headers) in enumerate(burst):
            seqs[ch] += 1
            expected.append((ch, seqs[ch], str(i), who, bool(headers)))

        def want(s: Session, ids: Callable[[str], tuple[str, ...]]) -> list[Any]:
            return [
                (ch, seq, ids(ch), False, p)
                for ch, seq, p, who, filtered in expected
                if not filtered and not (who is s and not s.echo)
            ]

        assert await drain(origin) == want(origin, lambda ch: ("x",))
        assert await drain(plain) == want(plain, lambda ch: ("x",))
        assert await drain(both) == want(both, lambda ch: ("x", "y") if ch == "/r/a" else ("x",))
        assert slow.kicked == 4302 and await drain(slow) == []
        assert node.metrics.deliveries["native"] == 2 + 6 + 6 + 3  # the slow one took 3 before its kick

    run(body)


def test_a_catch_up_in_one_run_keeps_the_next_runs_of_the_batch_away(run: Run) -> None:
    """A commit batch fans out run after run. When a run overflows a CATCH_UP session and its catch-up
    unsubscribes it (as guble's does, to replay from the log everything it dropped and all that follows), the
    later runs of the same batch, matched before that, must not reach it: it would get them twice."""

    async def body(node: Node) -> None:
        catching = Session("guble", Enc(), max_items=3, max_bytes=1 << 24, overflow=Overflow.CATCH_UP)
        node.attach(catching)
        switched: list[int] = []

        def on_catch_up() -> None:
            switched.append(catching.stats.dropped)
            node.unsubscribe(catching, "c")

        catching.on_catch_up = on_catch_up
        other = session(node)
        await sub(node, catching, "c", "/r")
        await sub(node, other, "o", "/r")
        a, b = session(node), session(node)
        done: list[Any] = []
        all_done = asyncio.Event()

        def on_done(r: Any) -> None:
            done.append(r)
            if len(done) == 10:
                all_done.set()

        # One tick: two runs (one per origin) commit together.
        for i in range(10):
            node.submit(req("/r", str(i)), a if i < 5 else b, on_done)
        await asyncio.wait_for(all_done.wait(), 10)
        assert switched == [3]
        assert await drain(catching) == []  # everything from the overflow on is the catch-up's to replay
        assert [p for *_, p in await drain(other)] == [str(i) for i in range(10)]

    run(body)


def test_total_size_retention_runs_on_its_interval(tmp_path: Path) -> None:
    """``log.retention.max_total_bytes`` is applied by the node's retention task (core/retention.py) every
    ``retention_interval_s``, oldest events first, and the task ends with the node."""

    async def main() -> None:
        policy = RetentionPolicy(max_total_bytes=250)
        store = open_store("sqlite", str(tmp_path / "data"), "commit", policy, 600)
        async with Node(store, NodeSettings(retention=policy, retention_interval_s=0.02)) as node:
            for i in range(5):
                await node.publish(req("/r", f"{i:0>100}"))
            deadline = asyncio.get_running_loop().time() + 10
            while (info := await node._reads.head("/r")).first == 1:
                assert asyncio.get_running_loop().time() < deadline, "retention never ran"
                await asyncio.sleep(0.02)  # the task's interval
            page = await node.read_channel("/r")
            assert [e.seq for e in page.events] == list(range(info.first, 6)) and info.first > 1
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "retention"]

    asyncio.run(main())
