"""The durable-consumer service (core/consumers.py) through a real Node and the SQLite store: batches, acks,
nacks with backoff, redelivery, work queues, live exclusive groups, restarts and a kill -9 crash.

Tests wait for batches and callbacks (queues with timeouts), never for time to pass; the one backoff test
measures that a redelivery did not come early.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hubbub.core import Batch, ConsumerService, Node, NodeSettings
from hubbub.core.consumer_delivery import ITEM_OVERHEAD
from hubbub.errors import (
    BadChannel,
    ConsumerBusy,
    ConsumerExists,
    ConsumerNotFound,
    StorageError,
    UnknownBatch,
)
from hubbub.events import Event, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, RetentionPolicy
from hubbub.log.consumers import ConsumerSpec

WAIT = 10.0

Body = Callable[[Node, ConsumerService], Awaitable[None]]


def run(
    tmp_path: Path, body: Body, *, retention: RetentionPolicy | None = None, url: str = "sqlite", **kw: Any
) -> None:
    async def main() -> None:
        store = open_store(url, str(tmp_path / "data"), "commit", retention or RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node, ConsumerService(node, **kw) as svc:
            await body(node, svc)

    asyncio.run(main())


def req(channel: str, payload: str, dialect: str = "native") -> AppendRequest:
    return AppendRequest(channel, Publisher(dialect), payload.encode(), "text/plain")


async def publish(node: Node, channel: str, *payloads: str, dialect: str = "native") -> None:
    for p in payloads:
        await node.publish(req(channel, p, dialect))


def spec(name: str = "c", pattern: str = "/jobs/**", **kw: Any) -> ConsumerSpec:
    kw.setdefault("batch_wait_ms", 0)
    return ConsumerSpec(name, pattern, **kw)


class Recv:
    """An opener's callbacks: batches on a queue, close reasons in a list."""

    def __init__(self) -> None:
        self.q: asyncio.Queue[Batch] = asyncio.Queue()
        self.closed: list[str] = []
        self.log: list[Any] = []

    def on_batch(self, b: Batch) -> None:
        self.log.append(("batch", b.number))
        self.q.put_nowait(b)

    def on_close(self, reason: str) -> None:
        self.closed.append(reason)

    async def next(self) -> Batch:
        return await asyncio.wait_for(self.q.get(), WAIT)


def payloads(b: Batch) -> list[str]:
    return [it.event.payload.decode() for it in b.items]


def positions(b: Batch) -> list[int]:
    return [it.pos for it in b.items]


async def pending(node: Node, name: str) -> list[int]:
    infos = await node._reads.call_journal(lambda st: st.consumers())
    cid = next(i.id for i in infos if i.spec.name == name)
    return [it.pos for it in await node._reads.call_journal(lambda st: st.consumer_items(cid, 0, 10_000))]


@pytest.mark.parametrize("engine", ["sqlite", "memory", "postgres"])
def test_batches_in_order_and_acks_stored_before_the_next_batch(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("pg_url") if engine == "postgres" else engine

    async def body(node: Node, svc: ConsumerService) -> None:
        _, created = await svc.create(spec())
        assert created
        await publish(node, "/other", "no")
        await publish(node, "/jobs/a", *[str(i) for i in range(10)])
        r = Recv()
        o = await svc.open("c", r.on_batch, r.on_close, batch_max=4)
        got: list[str] = []
        numbers: list[int] = []
        for _ in range(3):
            b = await r.next()
            got += payloads(b)
            numbers.append(b.number)
            await o.ack(b.number)
            r.log.append(("acked", b.number))
            # Durable before ack returned: the store no longer has them.
            assert not set(positions(b)) & set(await pending(node, "c"))
        assert got == [str(i) for i in range(10)]
        assert numbers == [1, 2, 3]
        assert r.log == [("batch", 1), ("acked", 1), ("batch", 2), ("acked", 2), ("batch", 3), ("acked", 3)]
        # Nothing else was waiting: the next batch is the next event.
        await publish(node, "/jobs/b", "late")
        b = await r.next()
        assert (payloads(b), positions(b)) == (["late"], [11])
        with pytest.raises(UnknownBatch):
            await o.ack(b.number + 1)
        with pytest.raises(UnknownBatch):
            await o.ack(1)  # acknowledged already
        await o.ack(b.number)
        assert await pending(node, "c") == []
        assert svc.statistics()["acked"] == 11

    run(tmp_path, body, url=url)


def test_batch_bytes_and_batch_wait(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        # A full batch_bytes goes out at once, even with a long wait.
        await svc.create(spec("big", batch_wait_ms=60_000, batch_bytes=3))
        r = Recv()
        o = await svc.open("big", r.on_batch)
        await publish(node, "/jobs/x", "a", "b", "c", "d")
        b = await r.next()
        assert payloads(b) == ["a", "b", "c"]  # at most batch_bytes (1 byte each)
        await o.ack(b.number)
        # A lone item larger than batch_bytes still goes (at least one item per batch).
        await svc.create(spec("small", batch_wait_ms=1, batch_bytes=2))
        r2 = Recv()
        await svc.open("small", r2.on_batch)
        await publish(node, "/jobs/y", "large-item")
        b2 = await r2.next()
        assert payloads(b2) == ["large-item"]

    run(tmp_path, body)


def test_nack_redelivers_after_the_backoff_in_order(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec())
        await publish(node, "/jobs/a", "1", "2")
        r = Recv()
        o = await svc.open("c", r.on_batch, batch_max=2)
        b = await r.next()
        assert positions(b) == [1, 2] and b.items[0].attempts == 0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await o.nack(b.number)
        await publish(node, "/jobs/a", "3")
        again = await r.next()
        assert loop.time() - t0 >= 0.09  # 100 ms for the first retry
        # Ordered: the redelivery comes first, with a new batch number and the same positions.
        assert positions(again) == [1, 2] and again.number == b.number + 1
        assert [it.attempts for it in again.items] == [1, 1]
        await o.nack(again.number)
        third = await r.next()
        assert positions(third) == [1, 2] and [it.attempts for it in third.items] == [2, 2]
        await o.ack(third.number)
        last = await r.next()
        assert payloads(last) == ["3"]
        await o.ack(last.number)
        assert svc.statistics()["redelivered"] == 4

    run(tmp_path, body)


def test_an_opener_that_goes_away_gives_its_batch_back(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec())
        await publish(node, "/jobs/a", "1", "2", "3")
        r1 = Recv()
        o1 = await svc.open("c", r1.on_batch)
        b = await r1.next()
        assert payloads(b) == ["1", "2", "3"]  # all were in memory: one batch
        r2 = Recv()
        with pytest.raises(ConsumerBusy):
            await svc.open("c", r2.on_batch)
        o1.close()
        o1.close()
        with pytest.raises(UnknownBatch):
            await o1.ack(b.number)
        o2 = await svc.open("c", r2.on_batch)
        b2 = await r2.next()
        assert positions(b2) == positions(b) and [it.attempts for it in b2.items] == [1, 1, 1]
        await o2.ack(b2.number)
        assert await pending(node, "c") == []

    run(tmp_path, body)


def test_open_rules_and_delete(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        r = Recv()
        with pytest.raises(ConsumerNotFound):
            await svc.open("nope", r.on_batch)
        with pytest.raises(ConsumerNotFound):
            await svc.open("c", r.on_batch, spec=spec(), create=False)
        with pytest.raises(BadChannel):
            await svc.open("bad", r.on_batch, spec=spec("bad", "*.x.*", syntax="separated"))
        o = await svc.open("c", r.on_batch, r.on_close, spec=spec())
        with pytest.raises(ConsumerExists):
            await svc.open("c", Recv().on_batch, spec=spec(), reuse=False)
        # A later open's pattern is ignored: the consumer keeps the one it was created with.
        info = svc.info("c")
        assert info is not None and info.spec.pattern == "/jobs/**"
        await publish(node, "/jobs/a", "1")
        await r.next()
        assert await svc.delete("c") is True
        assert r.closed == ["deleted"] and o.closed
        assert await svc.delete("c") is False
        assert await svc.consumers() == []
        # Created again: a new journal from now on.
        await publish(node, "/jobs/a", "2")
        r2 = Recv()
        await svc.open("c", r2.on_batch, spec=spec())
        await publish(node, "/jobs/a", "3")
        b = await r2.next()
        assert (payloads(b), positions(b)) == (["3"], [1])

    run(tmp_path, body)


def test_a_work_queue_gives_each_batch_to_exactly_one_member(tmp_path: Path) -> None:
    n = 300

    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec(shared=True))
        seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
        done = asyncio.Event()
        openers: list[Any] = []
        first_batch: dict[int, asyncio.Future[Batch]] = {}

        def member(k: int) -> Callable[[Batch], None]:
            def on_batch(b: Batch) -> None:
                if k == 2 and 2 not in first_batch:
                    # Member 2 takes its first batch and disconnects without acking it.
                    fut: asyncio.Future[Batch] = asyncio.get_running_loop().create_future()
                    fut.set_result(b)
                    first_batch[2] = fut
                    asyncio.get_running_loop().call_soon(openers[2].close)
                    return
                seen[k].extend(positions(b))
                task = asyncio.ensure_future(openers[k].ack(b.number))
                tasks.append(task)
                if sum(len(v) for v in seen.values()) >= n:
                    done.set()

            return on_batch

        tasks: list[asyncio.Task[None]] = []
        for k in range(3):
            openers.append(await svc.open("c", member(k), batch_max=7))
        writers = [publish(node, f"/jobs/{w}", *[f"{w}-{i}" for i in range(n // 3)]) for w in range(3)]
        await asyncio.gather(*writers)
        await asyncio.wait_for(done.wait(), WAIT)
        await asyncio.gather(*tasks)
        everything = seen[0] + seen[1] + seen[2]
        assert sorted(everything) == list(range(1, n + 1))  # every item exactly once
        assert seen[0] and seen[1]
        # The batch member 2 walked away with went to another member.
        lost = positions(first_batch[2].result())
        assert set(lost) <= set(seen[0]) | set(seen[1])
        assert await pending(node, "c") == []

    run(tmp_path, body)


def test_a_batch_callback_may_close_openers_at_once(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec(shared=True))
        got: list[tuple[str, list[int]]] = []
        openers: dict[str, Any] = {}
        second = asyncio.Event()

        def quitter(b: Batch) -> None:
            got.append(("quitter", positions(b)))
            openers["quitter"].close()  # inside the callback: the batch goes back at once

        def worker(b: Batch) -> None:
            got.append(("worker", positions(b)))
            second.set()

        openers["quitter"] = await svc.open("c", quitter, batch_max=2)
        openers["worker"] = await svc.open("c", worker, batch_max=2)
        await publish(node, "/jobs/a", "1")
        await asyncio.wait_for(second.wait(), WAIT)
        assert got == [("quitter", [1]), ("worker", [1])]

    run(tmp_path, body)


def test_a_backlog_larger_than_memory_is_paged_in(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec())
        await publish(node, "/jobs/a", *[str(i) for i in range(50)])
        r = Recv()
        o = await svc.open("c", r.on_batch, batch_max=3)
        got: list[int] = []
        live = False
        while len(got) < 60:
            b = await r.next()
            got += positions(b)
            await o.ack(b.number)
            if len(got) >= 30 and not live:
                # Live events arrive while the backlog is still being read.
                live = True
                await publish(node, "/jobs/b", *[str(i) for i in range(10)])
        assert got == list(range(1, 61))
        assert svc.statistics()["held_items"] == 0

    run(tmp_path, body, max_items=8)


@pytest.mark.parametrize("budget_items", [0, 5, 1000])
def test_held_bytes_past_max_items_in_order_nothing_lost_or_duplicated(
    tmp_path: Path, budget_items: int
) -> None:
    """Past ``max_items`` a consumer keeps taking notifications while the service's held bytes allow (1000:
    all of them, nothing read back); what does not fit (0, 5) is read from the store. Either way every
    item comes once, in journal order, and the held bytes go back to 0 once acknowledged or deleted."""

    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec())
        await svc.create(spec("other"))
        await publish(node, "/jobs/a", *[f"{i:03}" for i in range(300)])
        held = svc.statistics()["held_items"]
        if budget_items == 1000:
            assert held == 600  # both consumers, all in memory
        else:
            assert held <= 2 * 8 + budget_items + 2
        r = Recv()
        o = await svc.open("c", r.on_batch, batch_max=7)
        got: list[int] = []
        seen: list[str] = []
        live = False
        while len(got) < 350:
            b = await r.next()
            got += positions(b)
            seen += payloads(b)
            await o.ack(b.number)
            if len(got) >= 150 and not live:
                live = True
                await publish(node, "/jobs/b", *[f"b{i}" for i in range(50)])
        assert got == list(range(1, 351))
        assert seen == [f"{i:03}" for i in range(300)] + [f"b{i}" for i in range(50)]
        await svc.delete("other")
        assert svc.statistics()["held_items"] == 0
        assert svc.statistics()["held_bytes"] == 0

    run(tmp_path, body, max_items=8, held_bytes_max=budget_items * (3 + ITEM_OVERHEAD))


def test_events_of_every_dialect_and_qpubs_filters(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec("q", "chat.*", syntax="separated"))
        r = Recv()
        o = await svc.open("q", r.on_batch)
        await publish(node, "/chat", "not below", dialect="native")
        await publish(node, "/chat/room", "from ivy", dialect="ivy")
        await publish(node, "/chat/room/x", "from wearscript", dialect="wearscript")
        got: list[tuple[str, str]] = []
        while len(got) < 2:
            b = await r.next()
            got += [(it.event.channel, it.event.publisher.dialect) for it in b.items]
            await o.ack(b.number)
        assert got == [("/chat/room", "ivy"), ("/chat/room/x", "wearscript")]

    run(tmp_path, body)


def test_retention_never_drops_unacknowledged_items(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec())
        await publish(node, "/jobs/a", *[str(i) for i in range(6)])
        assert [e.seq for e in await node._reads.call(lambda st: st.read("/jobs/a"))] == [5, 6]
        r = Recv()
        o = await svc.open("c", r.on_batch)
        b = await r.next()
        assert payloads(b) == [str(i) for i in range(6)]
        await o.ack(b.number)

    run(tmp_path, body, retention=RetentionPolicy(max_events=2))


def test_a_notification_coming_after_a_backlog_read_saw_its_commit_adds_nothing(tmp_path: Path) -> None:
    """A backlog read on a reader thread can see a commit before the commit's notification reaches the loop:
    the notification must not add its items a second time (each once in a batch, and counted once)."""

    async def body(node: Node, svc: ConsumerService) -> None:
        seen: list[Any] = []
        hook = node._batcher.commit_hook
        assert hook is not None

        def spy(results: Any) -> None:
            seen.extend(results)
            hook(results)

        node._batcher.commit_hook = spy
        await svc.create(spec())
        await publish(node, "/jobs/x", "one", "two")
        hook(list(seen))  # the same notification again, as if it came after a read had loaded the items
        r = Recv()
        o = await svc.open("c", r.on_batch, r.on_close, batch_max=100)
        bt = await r.next()
        assert payloads(bt) == ["one", "two"]
        await o.ack(bt.number)
        assert svc.statistics()["held_items"] == 0

    run(tmp_path, body)


def test_live_exclusive_groups(tmp_path: Path) -> None:
    async def body(node: Node, svc: ConsumerService) -> None:
        got: dict[str, list[str]] = {"a": [], "b": [], "other": []}
        arrived = asyncio.Queue[str]()

        def member(k: str) -> Callable[[Event], None]:
            def deliver(ev: Event) -> None:
                got[k].append(ev.payload.decode())
                arrived.put_nowait(k)

            return deliver

        ma = svc.join("g", "/chat/*", member("a"))
        svc.join("g", "/chat/*", member("b"))
        svc.join("g2", "room.*", member("other"), syntax="separated")
        assert svc.groups_matching("/chat/x") == 1
        assert svc.groups_matching("/room/x") == 1
        await publish(node, "/chat/x", "1", "2", "3", "4")
        for _ in range(4):
            await asyncio.wait_for(arrived.get(), WAIT)
        assert got == {"a": ["1", "3"], "b": ["2", "4"], "other": []}
        ma.leave()
        ma.leave()
        await publish(node, "/chat/y", "5", "6")
        await publish(node, "/room/z", "7")
        for _ in range(3):
            await asyncio.wait_for(arrived.get(), WAIT)
        assert got == {"a": ["1", "3"], "b": ["2", "4", "5", "6"], "other": ["7"]}

    run(tmp_path, body)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_restart_delivers_every_unacknowledged_item_again(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    url = "sqlite" if engine == "sqlite" else request.getfixturevalue("pg_url")

    async def first(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec())
        await publish(node, "/jobs/a", *[str(i) for i in range(6)])
        r = Recv()
        o = await svc.open("c", r.on_batch, batch_max=2)
        b = await r.next()
        await o.ack(b.number)
        b2 = await r.next()
        await o.nack(b2.number)  # given back with a backoff, stored

    run(tmp_path, first, url=url)

    async def second(node: Node, svc: ConsumerService) -> None:
        r = Recv()
        o = await svc.open("c", r.on_batch)
        b = await r.next()
        assert payloads(b) == ["2", "3", "4", "5"]
        assert [it.attempts for it in b.items] == [1, 1, 0, 0]
        await o.ack(b.number)
        assert await pending(node, "c") == []

    run(tmp_path, second, url=url)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_what_was_pending_when_the_consumer_was_taken_up_may_have_been_sent(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    """The journal records acknowledgements and give-backs, not hand-outs: an item pending when this
    process took the consumer up (at start; on a shared log, with its hold) may have gone out from the
    previous holder (``Batch.maybe_sent``), one journaled later was not; neither counts as this process's
    redelivery (``attempts``, ``redelivered``)."""
    url = "sqlite" if engine == "sqlite" else request.getfixturevalue("pg_url")

    async def first(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec())
        await publish(node, "/jobs/a", *[str(i) for i in range(4)])

    run(tmp_path, first, url=url)

    async def second(node: Node, svc: ConsumerService) -> None:
        r = Recv()
        o = await svc.open("c", r.on_batch)
        b = await r.next()
        assert payloads(b) == ["0", "1", "2", "3"]
        assert [(it.attempts, b.maybe_sent(it)) for it in b.items] == [(0, True)] * 4
        await o.ack(b.number)
        await publish(node, "/jobs/a", "4", "5")
        later: list[tuple[str, int, bool]] = []
        while len(later) < 2:
            b = await r.next()
            later += [(it.event.payload.decode(), it.attempts, b.maybe_sent(it)) for it in b.items]
            await o.ack(b.number)
        assert later == [("4", 0, False), ("5", 0, False)]
        assert svc.statistics()["redelivered"] == 0
        o.close()
        # Given back by this process: maybe sent, and counted.
        await publish(node, "/jobs/a", "6")
        o = await svc.open("c", r.on_batch)
        b = await r.next()
        o.close()
        o = await svc.open("c", r.on_batch)
        b = await r.next()
        assert payloads(b) == ["6"] and [(it.attempts, b.maybe_sent(it)) for it in b.items] == [(1, True)]
        await o.ack(b.number)
        assert svc.statistics()["redelivered"] == 1

    run(tmp_path, second, url=url)


def test_an_ack_that_could_not_be_stored_delivers_its_items_again_as_redeliveries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opener had the items, so their next delivery is a redelivery: attempts + 1 and ``maybe_sent``
    (MQTT sends them with DUP), counted in ``redelivered``."""

    async def body(node: Node, svc: ConsumerService) -> None:
        await svc.create(spec())
        r = Recv()
        o = await svc.open("c", r.on_batch)
        await publish(node, "/jobs/a", "0")
        b = await r.next()
        assert [(it.attempts, b.maybe_sent(it)) for it in b.items] == [(0, False)]
        store = node._store
        real = store.consumer_settle
        failed: list[int] = []

        def once(*args: Any, **kw: Any) -> None:
            if not failed:
                failed.append(1)
                raise StorageError("the disk is full")
            real(*args, **kw)

        monkeypatch.setattr(store, "consumer_settle", once)
        with pytest.raises(StorageError):
            await o.ack(b.number)
        b = await r.next()
        assert payloads(b) == ["0"]
        assert [(it.attempts, b.maybe_sent(it)) for it in b.items] == [(1, True)]
        await o.ack(b.number)
        assert await pending(node, "c") == []
        assert svc.statistics()["redelivered"] == 1

    run(tmp_path, body)


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from hubbub.core import ConsumerService, Node
    from hubbub.events import Publisher
    from hubbub.log import open_store
    from hubbub.log.base import AppendRequest, RetentionPolicy
    from hubbub.log.consumers import ConsumerSpec

    async def main() -> None:
        store = open_store("sqlite", sys.argv[1], "commit", RetentionPolicy(), 600)
        node = Node(store)
        await node.__aenter__()
        svc = ConsumerService(node)
        await svc.start()
        await svc.create(ConsumerSpec("c", "/jobs/**", batch_wait_ms=0))
        for i in range(20):
            await node.publish(AppendRequest("/jobs/a", Publisher("native"), str(i).encode(), "text/plain"))
        q = asyncio.Queue()
        o = await svc.open("c", q.put_nowait, batch_max=5)
        for _ in range(2):
            b = await q.get()
            await o.ack(b.number)
        b = await q.get()  # held, never acknowledged
        print("ready", ",".join(str(it.pos) for it in b.items), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(main())
    """
)


def test_after_kill_9_acked_stays_acked_and_the_rest_is_delivered_again(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line.startswith("ready"), line
        held = [int(p) for p in line.split()[1].split(",")]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        for f in (child.stdin, child.stdout):
            if f is not None:
                f.close()
    assert child.returncode == -signal.SIGKILL
    assert held == [11, 12, 13, 14, 15]

    async def after(node: Node, svc: ConsumerService) -> None:
        r = Recv()
        o = await svc.open("c", r.on_batch)
        b = await r.next()
        # Acknowledged (1-10) never again; held and never sent (11-20) all again, in order.
        assert positions(b) == list(range(11, 21))
        assert payloads(b) == [str(i) for i in range(10, 20)]
        await o.ack(b.number)
        assert await pending(node, "c") == []

    run(tmp_path, after)


@pytest.mark.parametrize("durability", ["commit", "fsync"])
def test_acks_are_stored_on_the_loop_or_by_the_writer(tmp_path: Path, durability: str) -> None:
    """An idle writer and a store that allows it (SQLite without fsync, memory): the settle runs on the loop;
    with fsync it goes through the writer thread. Either way the ack is stored before it returns."""

    async def main() -> None:
        store = open_store("sqlite", str(tmp_path / "data"), durability, RetentionPolicy(), 600)
        assert store.inline_settle is (durability != "fsync")
        async with Node(store, NodeSettings()) as node, ConsumerService(node) as svc:
            await svc.create(spec())
            await publish(node, "/jobs/a", "1", "2", "3")
            r = Recv()
            o = await svc.open("c", r.on_batch, batch_max=2)
            assert node._batcher.writer is not None
            b = await r.next()
            await o.ack(b.number)
            assert await pending(node, "c") == [3]
            b = await r.next()
            await o.ack(b.number)
            assert await pending(node, "c") == []
            inline = node._batcher.writer.statistics()["inline_controls"]
            assert inline == (2 if durability == "commit" else 0)

    asyncio.run(main())


def test_the_first_ack_of_a_tick_is_stored_at_once_and_later_ones_share_one_write(tmp_path: Path) -> None:
    """SQLite without fsync, idle writer: the first ack of a loop tick is stored on the loop before ``ack``
    first yields (answered in the tick it came in), and the acks that come after it in the same tick are
    stored together by one write at the tick's end."""

    async def main() -> None:
        store = open_store("sqlite", str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node, ConsumerService(node) as svc:
            names = ["c1", "c2", "c3", "c4"]
            for name in names:
                await svc.create(spec(name))
            await publish(node, "/jobs/a", "1", "2")
            rs = [Recv() for _ in names]
            openers = [await svc.open(n, r.on_batch, batch_max=1) for n, r in zip(names, rs, strict=True)]
            first = [await r.next() for r in rs]
            writer = node._batcher.writer
            assert writer is not None
            before = writer.statistics()["inline_controls"]

            ack = openers[0].ack(first[0].number)
            with pytest.raises(StopIteration):  # done without ever suspending
                ack.send(None)
            assert writer.statistics()["inline_controls"] == before + 1
            assert len(await pending(node, "c1")) == 1

            # Three acks in one later tick: the first written at once, the other two by one write.
            await asyncio.gather(*(o.ack(b.number) for o, b in zip(openers[1:], first[1:], strict=True)))
            assert writer.statistics()["inline_controls"] == before + 3
            for name in names:
                assert len(await pending(node, name)) == 1, name
            assert [payloads(await r.next()) for r in rs] == [["2"]] * 4

    asyncio.run(main())
