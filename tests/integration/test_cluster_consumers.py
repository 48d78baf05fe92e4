"""Durable consumers on PostgreSQL with two nodes sharing the log (two stores, two nodes, two consumer
services in one process): a consumer created on one node journals the events committed by the other (the
journal is written in every node's commit); the node serving it must also hand them out, in journal order.

On a shared log (``LogStore.shared``) the service takes its own node's commit notifications only when they
continue ``loaded_to``, and reads the journal otherwise; other nodes' commits reach an open consumer
through the cluster relay's hint (``ConsumerService.others_committed``) and, as a safety net, a periodic
poll. Live exclusive groups get other nodes' events from the relay's releases (``released``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.cluster.broker import BrokerSettings, RedisBroker
from hubbub.cluster.presence import RedisPresence
from hubbub.cluster.view import ClusterView
from hubbub.core import ConsumerService, Node, NodeSettings, Opener
from hubbub.errors import ConsumerBusy
from hubbub.events import Event
from hubbub.log import open_store
from hubbub.log.base import RetentionPolicy
from hubbub.log.consumers import Retry
from tests.redisserver import RedisServer

from .consumer_wire import Wire, text
from .qrpcclient import QrpcClient
from .serverproc import ServerProcess
from .test_consumers import WAIT, Recv, payloads, pending, positions, publish, spec

pytestmark = pytest.mark.slow


async def _two_nodes(url: str, tmp: Path) -> tuple[Node, Node]:
    a = Node(open_store(url, str(tmp / "a"), "commit", RetentionPolicy(), 600), NodeSettings())
    b = Node(open_store(url, str(tmp / "b"), "commit", RetentionPolicy(), 600), NodeSettings())
    return a, b


def test_events_committed_by_another_node_are_journaled_for_a_consumer(tmp_path: Path, pg_url: str) -> None:
    async def main() -> None:
        a, b = await _two_nodes(pg_url, tmp_path)
        async with a, b, ConsumerService(a) as svc_a, ConsumerService(b):
            await svc_a.create(spec())
            await publish(b, "/jobs/x", "from-b-1", "from-b-2")
            await publish(a, "/jobs/x", "from-a")
            # In the shared journal, in commit order, whichever node committed them.
            assert len(await pending(a, "c")) == 3
            assert len(await pending(b, "c")) == 3
            r = Recv()
            o = await svc_a.open("c", r.on_batch, r.on_close, batch_max=100)
            got: list[str] = []
            while len(got) < 3:
                try:
                    bt = await r.next()
                except TimeoutError:
                    raise AssertionError(f"got {got}, closed {r.closed}") from None
                got += payloads(bt)
                await o.ack(bt.number)
            assert got == ["from-b-1", "from-b-2", "from-a"]
            assert await pending(b, "c") == []  # acknowledged for every node

    asyncio.run(main())


def test_an_open_consumer_gets_what_another_node_commits(tmp_path: Path, pg_url: str) -> None:
    async def main() -> None:
        a, b = await _two_nodes(pg_url, tmp_path)
        async with a, b, ConsumerService(a) as svc_a, ConsumerService(b):
            await svc_a.create(spec())
            r = Recv()
            o = await svc_a.open("c", r.on_batch, r.on_close, batch_max=100)
            await publish(a, "/jobs/x", "from-a")
            bt = await r.next()
            assert payloads(bt) == ["from-a"]
            await o.ack(bt.number)
            await publish(b, "/jobs/x", "from-b")
            bt = await asyncio.wait_for(r.q.get(), 5.0)
            assert payloads(bt) == ["from-b"]

    asyncio.run(main())


def test_consumers_created_and_deleted_on_another_node(tmp_path: Path, pg_url: str) -> None:
    """A consumer node B creates can be opened on node A at once; one B deletes closes A's openers
    (``deleted``) at A's next poll."""

    async def main() -> None:
        a, b = await _two_nodes(pg_url, tmp_path)
        async with a, b, ConsumerService(a, poll_s=0.1) as svc_a, ConsumerService(b, poll_s=0.1) as svc_b:
            await svc_b.create(spec("made-on-b"))
            await publish(b, "/jobs/x", "one")
            r = Recv()
            o = await svc_a.open("made-on-b", r.on_batch, r.on_close, create=False)
            bt = await r.next()
            assert payloads(bt) == ["one"]
            await o.ack(bt.number)
            assert await svc_b.delete("made-on-b")
            for _ in range(500):
                if r.closed:
                    break
                await asyncio.sleep(0.01)  # polling what node A decides
            assert r.closed == ["deleted"]
            assert svc_a.info("made-on-b") is None

    asyncio.run(main())


def test_one_node_at_a_time_serves_a_consumer(tmp_path: Path, pg_url: str) -> None:
    """An opener on node B is refused (ConsumerBusy) while node A holds the consumer, even a work queue's;
    once A's last opener closes, B serves it, and A is refused in turn."""

    async def main() -> None:
        a, b = await _two_nodes(pg_url, tmp_path)
        async with a, b, ConsumerService(a) as svc_a, ConsumerService(b) as svc_b:
            await svc_a.create(spec("q", shared=True))
            ra, rb = Recv(), Recv()
            oa = await svc_a.open("q", ra.on_batch, ra.on_close)
            oa2 = await svc_a.open("q", ra.on_batch, ra.on_close)  # a second member on the same node
            with pytest.raises(ConsumerBusy):
                await svc_b.open("q", rb.on_batch, rb.on_close)
            oa.close()
            with pytest.raises(ConsumerBusy):  # A still has a member
                await svc_b.open("q", rb.on_batch, rb.on_close)
            oa2.close()
            ob = None
            for _ in range(500):  # A gives the hold back in the background
                try:
                    ob = await svc_b.open("q", rb.on_batch, rb.on_close)
                    break
                except ConsumerBusy:
                    await asyncio.sleep(0.01)
            assert ob is not None
            await publish(a, "/jobs/x", "to-b")
            assert payloads(await rb.next()) == ["to-b"]
            with pytest.raises(ConsumerBusy):
                await svc_a.open("q", ra.on_batch, ra.on_close)
            ob.close()

    asyncio.run(main())


async def _open_when_free(svc: ConsumerService, name: str, r: Recv, **kw: Any) -> Opener:
    """Open the existing consumer ``name``, retrying while the node that served it lets go (in the
    background, after its last opener closed)."""
    for _ in range(500):
        try:
            return await svc.open(name, r.on_batch, r.on_close, create=False, **kw)
        except ConsumerBusy:
            await asyncio.sleep(0.01)  # polling what the other node decides
    raise AssertionError(f"{name}: still served by another node after 5 s")


async def _hold_give_backs() -> None:
    """Until every hold a consumer service is giving back is given back (its ``consumer-let-go`` tasks)."""
    for t in asyncio.all_tasks():
        if t.get_name().startswith("consumer-let-go-"):
            await t


def test_a_node_taking_a_consumer_back_hands_out_nothing_the_other_node_acknowledged(
    tmp_path: Path, pg_url: str
) -> None:
    """Node B serves the consumer first (its items in B's memory, one batch out), then node A does and
    acknowledges positions 1-6 in the store, then B again: B reads the journal afresh when it takes the
    consumer's hold, so it hands out 7-10 only, each once, in order, and nothing it held before (1-6
    among them)."""

    async def main() -> None:
        a, b = await _two_nodes(pg_url, tmp_path)
        async with a, b, ConsumerService(a) as svc_a, ConsumerService(b) as svc_b:
            await svc_b.create(spec())
            rb = Recv()
            ob = await svc_b.open("c", rb.on_batch, rb.on_close)
            await publish(b, "/jobs/x", *(str(i) for i in range(1, 11)))
            first = await rb.next()
            assert positions(first)[0] == 1
            ob.close()  # its batch pending again; B lets go
            ra = Recv()
            oa = await _open_when_free(svc_a, "c", ra, batch_max=3)
            acked: list[int] = []
            while len(acked) < 6:
                bt = await ra.next()
                assert positions(bt) == [len(acked) + 1, len(acked) + 2, len(acked) + 3]
                await oa.ack(bt.number)
                acked += positions(bt)
            oa.close()
            ob = await _open_when_free(svc_b, "c", rb)
            got: list[int] = []
            while len(got) < 4:
                bt = await rb.next()
                got += positions(bt)
                await ob.ack(bt.number)
            assert got == [7, 8, 9, 10]
            assert await pending(b, "c") == []

    asyncio.run(main())


def test_a_node_keeps_serving_a_consumer_until_its_acks_are_stored(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An opener of node A acknowledges a batch and goes while the ack is being stored: A keeps the
    consumer's hold until the ack is stored (node B is refused meanwhile), so B, which reads the journal
    when it takes the hold, never hands out an item whose ack A answers."""
    gate, storing = threading.Event(), threading.Event()

    async def main() -> None:
        a, b = await _two_nodes(pg_url, tmp_path)
        settle = a._store.consumer_settle

        def held_settle(acked: Sequence[tuple[int, Sequence[int]]], retried: Sequence[Retry] = ()) -> None:
            if acked:  # on node A's writer thread: the ack's write waits for the test
                storing.set()
                gate.wait(WAIT)
            settle(acked, retried)

        monkeypatch.setattr(a._store, "consumer_settle", held_settle)
        async with a, b, ConsumerService(a) as svc_a, ConsumerService(b) as svc_b:
            await svc_a.create(spec())
            await publish(a, "/jobs/x", "1", "2", "3")
            ra, rb = Recv(), Recv()
            oa = await svc_a.open("c", ra.on_batch, ra.on_close)
            bt = await ra.next()
            assert positions(bt) == [1, 2, 3]
            ack = asyncio.ensure_future(oa.ack(bt.number))
            try:
                await asyncio.get_running_loop().run_in_executor(None, storing.wait, WAIT)
                oa.close()  # the opener goes while its ack is being stored
                await _hold_give_backs()
                with pytest.raises(ConsumerBusy):
                    await svc_b.open("c", rb.on_batch, rb.on_close, create=False)
            finally:
                gate.set()
            await ack  # answered: stored
            ob = await _open_when_free(svc_b, "c", rb)
            await publish(b, "/jobs/x", "4")
            bt = await rb.next()
            assert positions(bt) == [4]
            await ob.ack(bt.number)
            assert await pending(b, "c") == []

    try:
        asyncio.run(main())
    finally:
        gate.set()


async def _cluster(url: str, tmp: Path, redis: RedisServer) -> tuple[list[Node], list[Any]]:
    """Two nodes with Redis brokers and presences on one PostgreSQL log, as ``hubbub serve`` builds them."""
    nodes: list[Node] = []
    parts: list[Any] = []
    for name in ("a", "b"):
        store = open_store(url, str(tmp / name), "commit", RetentionPolicy(), 600)
        br = RedisBroker(BrokerSettings(redis.url, name, poll_interval_s=60.0), store)
        node = Node(store, NodeSettings(), view=ClusterView(store, br))
        await node.__aenter__()
        await br.start(node)
        presence = RedisPresence(redis.url, name, "hubbub.events", 15.0)
        await presence.start()
        node.presence = presence
        nodes.append(node)
        parts += [br, presence]
    return nodes, parts


async def _close(nodes: list[Node], parts: list[Any]) -> None:
    for p in parts:
        await p.close()
    for node in nodes:
        await node.close()


async def _rosters_read(*services: ConsumerService) -> None:
    """Until every service has read the presence rosters of its live groups (a group's share of a node)."""
    for _ in range(1000):
        if not any(svc.statistics()["group_rosters_unread"] for svc in services):
            return
        await asyncio.sleep(0.01)  # polling what the nodes decide
    raise AssertionError("the group rosters were not read within 10 s")


def test_the_relay_tells_an_open_consumer_of_another_nodes_commits(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    """With the poll an hour away, only the relay's hint can bring node B's commits to A's consumer."""

    async def main() -> None:
        (a, b), brokers = await _cluster(pg_url, tmp_path, redis_server)
        try:
            async with ConsumerService(a, poll_s=3600) as svc_a, ConsumerService(b, poll_s=3600):
                await svc_a.create(spec())
                r = Recv()
                o = await svc_a.open("c", r.on_batch, r.on_close, batch_max=100)
                got: list[str] = []
                for i in range(5):  # node A commits nothing: its own notifications cannot bring these
                    await publish(b, "/jobs/x", f"b{i}")
                while len(got) < 5:
                    bt = await r.next()
                    got += payloads(bt)
                    await o.ack(bt.number)
                assert got == [f"b{i}" for i in range(5)]
                await publish(a, "/jobs/y", "a0")  # and A's own next item follows them
                await publish(b, "/jobs/x", "b5")
                while len(got) < 7:
                    bt = await r.next()
                    got += payloads(bt)
                    await o.ack(bt.number)
                assert got[5:] == ["a0", "b5"]
                assert await pending(b, "c") == []
        finally:
            await _close([a, b], brokers)

    asyncio.run(main())


def test_a_live_group_gets_every_nodes_events_in_order(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    async def main() -> None:
        (a, b), brokers = await _cluster(pg_url, tmp_path, redis_server)
        try:
            async with ConsumerService(a) as svc_a, ConsumerService(b):
                got: list[str] = []
                done = asyncio.Event()

                def deliver(ev: Event) -> None:
                    got.append(ev.payload.decode())
                    if len(got) == 6:
                        done.set()

                await svc_a.join("g", "/jobs/**", deliver).ready()  # this node's share decided
                assert svc_a.statistics()["group_rosters_unread"] == 0
                for i in range(3):
                    await publish(b, "/jobs/x", f"b{i}")
                    await publish(a, "/jobs/x", f"a{i}")
                await asyncio.wait_for(done.wait(), 10.0)
                assert got == ["b0", "a0", "b1", "a1", "b2", "a2"]  # once each, in the channel's seq order
        finally:
            await _close([a, b], brokers)

    asyncio.run(main())


def _server(tmp: Path, name: str, pg_url: str, redis: RedisServer, *extra: str) -> ServerProcess:
    return ServerProcess(
        tmp / name, ["--store", pg_url, "--broker", redis.url, "--cluster-node-id", name, *extra]
    ).start()


def test_a_node_killed_mid_load_loses_no_acknowledged_event_for_a_consumer_on_another(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    """Real processes: a consumer held on node A over native TCP while publishers on A and B load it, and B is
    killed -9 mid-load (events it committed may never reach Redis): A's consumer gets every acknowledged event
    of both, each once, per channel in publish order."""
    a = _server(tmp_path, "a", pg_url, redis_server)
    b = _server(tmp_path, "b", pg_url, redis_server)
    acked: dict[str, list[str]] = {"/k/a": [], "/k/b": []}

    async def publisher(node: ServerProcess, channel: str, n: int, stop_after: int | None) -> None:
        w = await Wire.open(node.ports, "tcp", "json")
        try:
            for i in range(n):
                if stop_after is not None and len(acked[channel]) == stop_after:
                    node.kill()  # -9, with the next publishes of this connection under way
                r = await w.request({"op": "publish", "channel": channel, "ack": True, "text": f"{i}"})
                assert r["op"] == "reply", r
                acked[channel].append(f"{i}")
        except (ConnectionError, OSError, asyncio.IncompleteReadError, TimeoutError):
            assert stop_after is not None  # only node B goes away
        finally:
            with contextlib.suppress(Exception):
                await w.close()

    async def main() -> None:
        c = await Wire.open(a.ports, "tcp", "json")
        r = await c.request({"op": "consume", "consumer": "k", "pattern": "/k/*", "max": 50})
        assert r["op"] == "reply", r
        got: dict[str, list[str]] = {"/k/a": [], "/k/b": []}
        seen: set[int] = set()
        progress = asyncio.Event()
        loads = asyncio.gather(publisher(a, "/k/a", 300, None), publisher(b, "/k/b", 1000, 150))

        async def consume() -> None:
            while True:
                d = await c.push()
                for it in d["items"]:
                    assert it["pos"] not in seen  # each once (acknowledged as it comes)
                    seen.add(it["pos"])
                    got[it["channel"]].append(text(it))
                assert (await c.request({"op": "ack", "consumer": "k", "batch": d["batch"]}))["op"] == "reply"
                progress.set()

        eater = asyncio.ensure_future(consume())
        await loads
        assert len(acked["/k/a"]) == 300 and len(acked["/k/b"]) >= 150
        async with asyncio.timeout(30):
            while len(got["/k/a"]) < 300 or len(got["/k/b"]) < len(acked["/k/b"]):
                progress.clear()
                await progress.wait()
        eater.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await eater
        assert got["/k/a"] == acked["/k/a"]
        # Node B's: every acknowledged one, in order; a few more that it committed before the kill may follow.
        assert got["/k/b"][: len(acked["/k/b"])] == acked["/k/b"]
        assert got["/k/b"] == [f"{i}" for i in range(len(got["/k/b"]))]
        await c.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        a.kill()
        b.kill()


def test_a_live_group_with_members_on_two_nodes_gives_each_event_to_one_of_them(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    """Node A's member alone first takes everything; once node B's member has settled in (its roster entry
    older than ``settle_s`` at an event's commit), the nodes share the events; never one event to both."""

    async def main() -> None:
        (a, b), parts = await _cluster(pg_url, tmp_path, redis_server)
        try:
            async with ConsumerService(a, poll_s=0.2) as svc_a, ConsumerService(b, poll_s=0.2) as svc_b:
                got: dict[str, list[str]] = {"a": [], "b": []}
                total = 0
                all_in = asyncio.Event()

                def member(name: str) -> Callable[[Event], None]:
                    def deliver(ev: Event) -> None:
                        got[name].append(ev.payload.decode())
                        if sum(map(len, got.values())) >= total:
                            all_in.set()

                    return deliver

                svc_a.join("g", "/jobs/**", member("a"))
                await _rosters_read(svc_a)
                svc_b.join("g", "/jobs/**", member("b"))
                await _rosters_read(svc_b)
                # Publish on both nodes until node B's member has a share (B settles after 1.2 s).
                async with asyncio.timeout(30):
                    while not got["b"] or total < 40:
                        for node in (a, b):
                            total += 1
                            all_in.clear()
                            await publish(node, f"/jobs/{total % 3}", f"e{total}")
                    while sum(map(len, got.values())) < total:
                        all_in.clear()
                        await all_in.wait()
                every = got["a"] + got["b"]
                assert sorted(every) == sorted(f"e{i}" for i in range(1, total + 1))  # each once
                assert not set(got["a"]) & set(got["b"])
                assert got["a"] and got["b"]
        finally:
            await _close([a, b], parts)

    asyncio.run(main())


def test_qpubs_listen_exclusive_across_two_real_nodes(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    """``hubbub serve`` twice: a ``listenExclusive`` group with a member on each node, emits on both nodes;
    every emit reaches exactly one member, and once node B's member settled in, both get a share."""
    extra = ["--cluster-poll-interval-s", "0.2"]
    a, b = (
        ServerProcess(
            tmp_path / n, ["--store", pg_url, "--broker", redis_server.url, "--cluster-node-id", n, *extra]
        ).start()
        for n in "ab"
    )

    async def main() -> None:
        got: dict[str, list[int]] = {"a": [], "b": []}
        arrived = asyncio.Event()

        async def member(node: ServerProcess, name: str) -> QrpcClient:
            q = await QrpcClient.connect(node.ports["qrpc"])
            cid = q.send("listenExclusive", {"topic": "g.*", "group": "G"})
            assert await q.call("ignore", {"topic": "__barrier__"}) == {"ok": True, "removed": 0}

            async def drain() -> None:
                while True:
                    msg = await q.next(cid, 3600)
                    got[name].append(msg["m"]["value"])
                    arrived.set()

            tasks.append(asyncio.ensure_future(drain()))
            return q

        tasks: list[asyncio.Task[None]] = []
        qa = await member(a, "a")
        qb = await member(b, "b")
        sent = 0
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(60):
                while not got["b"] or sent < 40:
                    for node in (a, b):
                        url = f"http://127.0.0.1:{node.ports['http']}/qpubs/emit"
                        async with http.post(url, params={"topic": f"g.{sent % 3}"}, json=sent) as r:
                            assert r.status == 200, await r.text()
                        sent += 1
                while len(got["a"]) + len(got["b"]) < sent:
                    arrived.clear()
                    await arrived.wait()
        for t in tasks:
            t.cancel()
        assert sorted(got["a"] + got["b"]) == list(range(sent))  # each emit to exactly one member
        assert got["a"] and got["b"]
        await qa.close()
        await qb.close()

    try:
        asyncio.run(main())
    finally:
        a.kill()
        b.kill()


class _Client:
    """One client of the consumer ``f`` (``/f/*``): native over TCP (batches of at most 5) or qrpc
    (``openSubscription``; batches of one item, the servers' ``qpubs.batch_bytes`` being 1)."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self._wire: Wire | None = None
        self._q: QrpcClient | None = None
        self._call = ""
        self._lines: list[dict[str, Any]] = []

    async def open(self, node: ServerProcess, *, create: bool = True) -> bool:
        """Open the consumer on ``node``: False when it refuses as busy (another node serves it)."""
        if self.dialect == "native":
            self._wire = w = await Wire.open(node.ports, "tcp", "json")
            r = await w.request(
                {"op": "consume", "consumer": "f", "pattern": "/f/*", "max": 5, "create": create}
            )
            if r["op"] == "error" and r["code"] == 4206:
                return False
            assert r["op"] == "reply", r
            return True
        self._q = q = await QrpcClient.connect(node.ports["qrpc"])
        self._call = q.send("openSubscription", {"subId": "f", "topic": "f.*", "create": create})
        # Calls are handled in order: once the barrier is answered, a refused open has its answer too.
        assert await q.call("ignore", {"topic": "__barrier__"}) == {"ok": True, "removed": 0}
        lines = q.lines[self._call]
        while not lines.empty():
            self._lines.append(lines.get_nowait())
        if self._lines and self._lines[0].get("e"):
            assert self._lines[0]["e"]["code"] == "EBUSY", self._lines[0]
            return False
        return True

    async def batch(self) -> tuple[int, list[tuple[int, str]]]:
        """The next batch: its number, and its items' positions and payloads."""
        if self._wire is not None:
            d = await self._wire.push()
            return d["batch"], [(it["pos"], text(it)) for it in d["items"]]
        assert self._q is not None
        msg = self._lines.pop(0) if self._lines else await self._q.next(self._call)
        assert not msg.get("e"), msg
        m = msg["m"]
        return m["batch"], [(it["pos"], str(it["value"])) for it in m["items"]]

    async def ack(self, batch: int) -> None:
        """Acknowledge ``batch``; returns once the server confirmed it."""
        if self._wire is not None:
            r = await self._wire.request({"op": "ack", "consumer": "f", "batch": batch})
            assert r["op"] == "reply", r
        else:
            assert self._q is not None
            assert await self._q.call("ack", {"subId": "f", "batch": batch}) == {"ok": True}

    async def close(self) -> None:
        if self._wire is not None:
            await self._wire.close()
        if self._q is not None:
            await self._q.close()


@pytest.mark.parametrize("dialect", ["native", "qrpc"])
def test_the_node_serving_a_consumer_killed_its_client_resumes_on_another_with_nothing_lost(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, dialect: str
) -> None:
    """Node A serves a consumer and is killed -9 while its client holds a batch: the client opens the
    consumer on node B and gets every unacknowledged item (the held batch included) and no acknowledged one,
    while events go on being published on B (native publishes over WebSocket, or qpubs HTTP emits).

    Node B knows the consumer all along (an open there was refused while A served it) and journals B's
    commits for it: what it was told of then, A acknowledged since, and B must read the journal afresh
    when it takes the consumer over."""
    a = _server(tmp_path, "a", pg_url, redis_server, "--qpubs-batch-bytes", "1")
    b = _server(tmp_path, "b", pg_url, redis_server, "--qpubs-batch-bytes", "1")
    n = 60
    acked: set[int] = set()
    held: set[int] = set()

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            pub = await Wire.open(b.ports, "ws", "json")

            async def publish_on_b(i: int) -> None:
                if dialect == "native":
                    r = await pub.request({"op": "publish", "channel": "/f/x", "ack": True, "text": f"{i}"})
                    assert r["op"] == "reply", r
                    return
                url = f"http://127.0.0.1:{b.ports['http']}/qpubs/emit"
                async with http.post(url, params={"topic": "f.x"}, json=i) as resp:
                    assert resp.status == 200, await resp.text()

            c = _Client(dialect)
            assert await c.open(a)
            elsewhere = _Client(dialect)
            assert not await elsewhere.open(b, create=False)  # A serves it; B knows it from now on
            await elsewhere.close()
            for i in range(n):  # published on B, served by A
                await publish_on_b(i)
            while len(acked) < n // 2:
                number, items = await c.batch()
                await c.ack(number)
                acked.update(pos for pos, _ in items)
            _, items = await c.batch()
            held.update(pos for pos, _ in items)
            a.kill()
            await c.close()
            for i in range(n, n + 10):  # more while the client moves
                await publish_on_b(i)
            c = _Client(dialect)
            async with asyncio.timeout(20):  # A's hold ends with its PostgreSQL session, within moments
                while not await c.open(b, create=False):
                    await c.close()
                    c = _Client(dialect)
                    await asyncio.sleep(0.05)  # polling what PostgreSQL decides
            seen: dict[int, str] = {}
            while len(seen) < n + 10 - len(acked):
                number, items = await c.batch()
                for pos, value in items:
                    assert pos not in seen and pos not in acked, (pos, sorted(acked))
                    seen[pos] = value
                await c.ack(number)
            assert set(seen) == set(range(1, n + 11)) - acked
            assert held <= set(seen)
            assert list(seen) == sorted(seen)  # journal order
            assert list(seen.values()) == [str(i - 1) for i in seen]  # position p holds the event p - 1
            await c.close()
            await pub.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        a.kill()
        b.kill()


def test_a_consumer_created_on_one_node_opens_at_once_on_another_in_every_dialect(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    """Node B never reads the consumers on its own here (its poll an hour away): opening with
    ``create: false`` there what node A just created finds it in the store, over qrpc (it was refused
    ``ENOENT``) and native (its reply said ``created: true``), and the opener gets what B commits."""
    a = _server(tmp_path, "a", pg_url, redis_server, "--cluster-poll-interval-s", "3600")
    b = _server(tmp_path, "b", pg_url, redis_server, "--cluster-poll-interval-s", "3600")

    async def main() -> None:
        qa = await QrpcClient.connect(a.ports["qrpc"])
        assert (await qa.call("createSubscription", {"subId": "s", "topic": "s.*"}))["created"] is True
        qb = await QrpcClient.connect(b.ports["qrpc"])
        call = qb.send("openSubscription", {"subId": "s", "create": False})
        assert await qb.call("ignore", {"topic": "__barrier__"}) == {"ok": True, "removed": 0}
        assert qb.lines[call].empty()  # open: no refusal

        # Created after B's read of the consumers above, so B does not know it either.
        wa = await Wire.open(a.ports, "tcp", "json")
        r = await wa.request({"op": "consumer_create", "consumer": "n", "pattern": "/n/*"})
        assert r["op"] == "reply" and r["created"] is True, r
        wb = await Wire.open(b.ports, "tcp", "json")
        r = await wb.request({"op": "consume", "consumer": "n", "create": False})
        assert r["op"] == "reply", r
        assert (r["created"], r["pattern"]) == (False, "/n/*")

        assert (await qb.call("emit", {"topic": "s.x", "value": 1}))["ok"] is True
        m = (await qb.next(call))["m"]
        assert [(it["pos"], it["value"]) for it in m["items"]] == [(1, 1)]
        assert await qb.call("ack", {"subId": "s", "batch": m["batch"]}) == {"ok": True}
        r = await wb.request({"op": "publish", "channel": "/n/x", "ack": True, "text": "one"})
        assert r["op"] == "reply", r
        d = await wb.push()
        assert [(it["pos"], text(it)) for it in d["items"]] == [(1, "one")]
        for c in (qa, qb):
            await c.close()
        for w in (wa, wb):
            await w.close()

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        a.kill()
        b.kill()
