"""Durable consumers over the native protocol against real server processes (docs/native.md "Durable
consumers"): batches, acks, nacks and errors in JSON and msgpack over WebSocket and TCP; acknowledgements that
survive kill -9 while everything unacknowledged is delivered again; a work queue of three members; a member
that goes away mid-batch has its batch redelivered to another; the Python client and ``hubbub consume``.

Tests wait on frames with timeouts, never on time passing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hubbub.client import AsyncClient, Emitter
from hubbub.server import Server
from hubbub.server_config import load_config

from .consumer_wire import WAIT, Wire, text
from .serverproc import ServerProcess

MODES = [("ws", "json"), ("tcp", "json"), ("ws", "msgpack"), ("tcp", "msgpack")]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        yield srv
    finally:
        srv.kill()


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 120))


async def publish(w: Wire, channel: str, *payloads: str) -> None:
    for p in payloads:
        field = {"text": p} if w.encoding == "json" else {"payload": p.encode()}
        reply = await w.request({"op": "publish", "channel": channel, "ack": True, **field})
        assert reply["op"] == "reply", reply


@pytest.mark.parametrize(("transport", "encoding"), MODES)
def test_batches_acks_nacks_and_errors(server: ServerProcess, transport: str, encoding: str) -> None:
    async def body() -> None:
        w = await Wire.open(server.ports, transport, encoding)
        pub = await Wire.open(server.ports, "tcp", "json")
        r = await w.request({"op": "consume", "consumer": "jobs", "pattern": "/jobs/**", "max": 4})
        assert r["op"] == "reply" and r["created"] is True and r["pending"] == 0 and r["shared"] is False
        await publish(pub, "/other", "no")
        await publish(pub, "/jobs/a", *[str(i) for i in range(10)])
        got: list[str] = []
        positions: list[int] = []
        while len(got) < 10:
            d = await w.push()
            assert d["consumer"] == "jobs" and 1 <= len(d["items"]) <= 4
            got += [text(it) for it in d["items"]]
            positions += [it["pos"] for it in d["items"]]
            assert all(it["attempts"] == 0 and it["channel"] == "/jobs/a" for it in d["items"])
            assert isinstance(d["items"][0]["time"], str if encoding == "json" else int)
            if len(got) < 10:
                assert (await w.request({"op": "ack", "consumer": "jobs", "batch": d["batch"]}))[
                    "op"
                ] == "reply"
        assert got == [str(i) for i in range(10)] and positions == list(range(1, 11))
        # Nack: the same items again, with a new batch number and one more attempt.
        last = d
        assert (await w.request({"op": "nack", "consumer": "jobs", "batch": last["batch"]}))["op"] == "reply"
        again = await w.push()
        assert again["batch"] > last["batch"]
        assert [it["pos"] for it in again["items"]] == [it["pos"] for it in last["items"]]
        assert all(it["attempts"] == 1 for it in again["items"])
        # Errors: unknown batch, busy, not found, exists, bad request; none is fatal.
        e = await w.request({"op": "ack", "consumer": "jobs", "batch": last["batch"]})
        assert (e["op"], e["code"]) == ("error", 4207)
        assert (await w.request({"op": "consume", "consumer": "jobs", "pattern": "/jobs/**"}))["code"] == 4206
        assert (await w.request({"op": "consume", "consumer": "nope", "create": False}))["code"] == 4204
        other = await Wire.open(server.ports, transport, encoding)
        assert (await other.request({"op": "consume", "consumer": "jobs", "create": False}))["code"] == 4206
        e = await other.request({"op": "consume", "consumer": "jobs", "pattern": "/x", "reuse": False})
        assert e["code"] == 4205
        assert (await other.request({"op": "ack", "consumer": "jobs", "batch": again["batch"]}))[
            "code"
        ] == 4207
        assert (await other.request({"op": "consume", "consumer": "a/b", "pattern": "/x"}))["code"] == 4001
        assert (await w.request({"op": "ack", "consumer": "jobs", "batch": again["batch"]}))["op"] == "reply"
        # Unconsume, then another connection may open it; delete tells the holder.
        assert (await w.request({"op": "unconsume", "consumer": "jobs"}))["op"] == "reply"
        r = await other.request({"op": "consume", "consumer": "jobs", "create": False})
        assert r["op"] == "reply" and r["pattern"] == "/jobs/**" and r["pending"] == 0
        d = await w.request({"op": "consumer_delete", "consumer": "jobs"})
        assert d == {"op": "reply", "id": d["id"], "consumer": "jobs", "deleted": True}
        closed = await other.push("consumer_closed")
        assert (closed["consumer"], closed["reason"]) == ("jobs", "deleted")
        for x in (w, pub, other):
            await x.close()

    run(body)


def test_acks_survive_kill_9_and_everything_else_is_delivered_again(tmp_path: Path) -> None:
    """A consumer acknowledges half of N events, the server is killed -9 and started again on its data: the
    consumer gets every unacknowledged event again (the batch it held included) and no acknowledged one."""
    n = 40
    srv = ServerProcess(tmp_path / "data").start()
    acked: set[int] = set()
    held: set[int] = set()

    async def before() -> None:
        w = await Wire.open(srv.ports, "tcp", "msgpack")
        await w.request({"op": "consume", "consumer": "crash", "pattern": "/c/**", "max": 5})
        await publish(w, "/c/x", *[f"e{i}" for i in range(n)])
        while len(acked) < n // 2:
            d = await w.push()
            r = await w.request({"op": "ack", "consumer": "crash", "batch": d["batch"]})
            assert r["op"] == "reply"  # durable once answered
            acked.update(it["pos"] for it in d["items"])
        d = await w.push()  # held, never acknowledged
        held.update(it["pos"] for it in d["items"])
        srv.kill()  # kill -9 while the batch is out and the connection open
        await w.close()

    try:
        run(before)
        srv.kill()
        assert not srv.alive
        srv = ServerProcess(tmp_path / "data").start()
        seen: dict[int, str] = {}

        async def after() -> None:
            w = await Wire.open(srv.ports, "ws", "json")
            r = await w.request({"op": "consume", "consumer": "crash", "create": False, "max": 7})
            assert r["op"] == "reply" and r["pending"] == n - len(acked)
            while len(seen) < n - len(acked):
                d = await w.push()
                for it in d["items"]:
                    assert it["pos"] not in seen
                    seen[it["pos"]] = text(it)
                await w.request({"op": "ack", "consumer": "crash", "batch": d["batch"]})
            await w.close()

        run(after)
        assert n // 2 <= len(acked) < n and held and not held & acked
        assert set(seen) == set(range(1, n + 1)) - acked
        assert held <= set(seen)
        assert all(seen[p] == f"e{p - 1}" for p in seen)
    finally:
        srv.kill()


def test_a_work_queue_of_three_members(server: ServerProcess) -> None:
    """Three connections (each transport and encoding among them) share a consumer under load: every event
    goes to exactly one of them, and each gets some."""
    n = 600

    async def body() -> None:
        admin = await Wire.open(server.ports, "tcp", "json")
        r = await admin.request(
            {"op": "consumer_create", "consumer": "wq", "pattern": "/wq/*", "shared": True}
        )
        assert r["created"] is True
        members = [
            await Wire.open(server.ports, "ws", "json"),
            await Wire.open(server.ports, "tcp", "msgpack"),
            await Wire.open(server.ports, "ws", "msgpack"),
        ]
        for m in members:
            r = await m.request({"op": "consume", "consumer": "wq", "create": False, "max": 10})
            assert r["op"] == "reply" and r["shared"] is True
        got: list[list[int]] = [[] for _ in members]
        done = asyncio.Event()

        async def work(i: int) -> None:
            m = members[i]
            while not done.is_set():
                try:
                    async with asyncio.timeout(0.5):
                        d = await m.push()
                except TimeoutError:
                    continue
                got[i] += [it["pos"] for it in d["items"]]
                assert all(it["attempts"] == 0 for it in d["items"])
                await m.request({"op": "ack", "consumer": "wq", "batch": d["batch"]})
                if sum(map(len, got)) >= n:
                    done.set()

        async def load() -> None:
            pubs = [await Wire.open(server.ports, "tcp", "json") for _ in range(3)]
            await asyncio.gather(
                *(publish(p, f"/wq/{k}", *[str(i) for i in range(n // 3)]) for k, p in enumerate(pubs))
            )
            for p in pubs:
                await p.close()

        await asyncio.gather(load(), *(work(i) for i in range(3)))
        every = [p for g in got for p in g]
        assert sorted(every) == list(range(1, n + 1))  # exactly once each
        assert all(g for g in got), [len(g) for g in got]
        for m in [*members, admin]:
            await m.close()

    run(body)


def test_a_member_that_goes_away_mid_batch_has_its_batch_redelivered_to_another(
    server: ServerProcess,
) -> None:
    async def body() -> None:
        a = await Wire.open(server.ports, "tcp", "json")
        b = await Wire.open(server.ports, "ws", "msgpack")
        pub = await Wire.open(server.ports, "tcp", "json")
        r = await a.request({"op": "consume", "consumer": "mq", "pattern": "/mq/*", "shared": True})
        assert r["op"] == "reply"
        await publish(pub, "/mq/x", *[f"m{i}" for i in range(8)])
        taken = await a.push()  # a holds this batch and never acknowledges it
        lost = {it["pos"]: text(it) for it in taken["items"]}
        assert lost
        r = await b.request({"op": "consume", "consumer": "mq", "create": False, "shared": True})
        assert r["op"] == "reply"
        await a.close()  # goes away mid-batch
        seen: dict[int, tuple[str, int]] = {}
        while len(seen) < 8:
            d = await b.push()
            for it in d["items"]:
                assert it["pos"] not in seen
                seen[it["pos"]] = (text(it), it["attempts"])
            await b.request({"op": "ack", "consumer": "mq", "batch": d["batch"]})
        assert set(seen) == set(range(1, 9))
        for pos, payload in lost.items():
            assert seen[pos] == (payload, 1)  # the same item, delivered again, its attempt counted
        await b.close()
        await pub.close()

    run(body)


def test_python_client_and_the_consume_command(server: ServerProcess) -> None:
    url = f"tcp://127.0.0.1:{server.ports['native']}"

    async def body() -> None:
        async with AsyncClient.connect(f"ws://127.0.0.1:{server.ports['http']}") as client:
            # Defined first, and the events published before it is opened: its batches are then fixed.
            await (await client.consume("py", "/py/**")).close()
            for i in range(5):
                await client.publish("/py/a", f"p{i}")
            async with client.consume("py", "/py/**", max=3) as consumer:
                assert consumer.info["created"] is False and consumer.info["pending"] == 5
                first = await asyncio.wait_for(consumer.__anext__(), WAIT)
                assert [it.event.payload for it in first] == [b"p0", b"p1", b"p2"]
                await first.ack()
                second = await asyncio.wait_for(consumer.__anext__(), WAIT)
                await second.nack()
                again = await asyncio.wait_for(consumer.__anext__(), WAIT)
                assert [(it.pos, it.attempts) for it in again] == [(4, 1), (5, 1)]
                with pytest.raises(ValueError):
                    await second.ack()  # settled already
                await again.ack()
            # The command's consumer, defined before its events are published (then closed here).
            await (await client.consume("cli", "/cli/**")).close()
            for i in range(3):
                await client.publish("/cli/a", f"c{i}")

    run(body)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    cmd = [sys.executable, "-m", "hubbub", "consume", "cli", "/cli/**", "--url", url, "--max", "3"]
    out = subprocess.run(
        [*cmd, "--count", "3"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["/cli/a 1 c0", "/cli/a 2 c1", "/cli/a 3 c2"]

    async def after() -> None:
        # What the command printed was acknowledged: only what came later is delivered.
        async with AsyncClient.connect(url) as client, client.consume("cli", create=False) as consumer:
            await client.publish("/cli/a", "late")
            batch = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert [(it.pos, it.event.payload) for it in batch] == [(4, b"late")]
            await batch.ack()

    run(after)
    helped = subprocess.run(
        [*cmd[:4], "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert helped.returncode == 0 and "NAME" in helped.stdout and "PATTERN" in helped.stdout


TOKENS = {
    "tok-root": {"user": "root", "admin": True},
    "tok-alice": {"user": "alice", "publish": ["/pub/**"], "subscribe": ["/pub/**"]},
    "tok-bob": {"user": "bob", "publish": ["/pub/**"], "subscribe": ["/pub/**", "/bob/**"]},
}


def test_permissions(tmp_path: Path) -> None:
    """consume and consumer_create need subscribe over the whole pattern; deleting another user's consumer
    needs admin; refusals are 4102 and not fatal."""
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "auth.mode": "token",
        "auth.tokens": TOKENS,
    }

    async def body() -> None:
        async with Server(load_config(cli=cli, env={})) as srv:
            alice = await Wire.open(srv.ports, "tcp", "json", "tok-alice")
            bob = await Wire.open(srv.ports, "ws", "msgpack", "tok-bob")
            root = await Wire.open(srv.ports, "tcp", "msgpack", "tok-root")
            assert (await alice.request({"op": "consume", "consumer": "a", "pattern": "/pub/**"}))[
                "op"
            ] == "reply"
            r = await alice.request({"op": "consumer_create", "consumer": "x", "pattern": "/pub/a"})
            assert r["op"] == "reply"
            for pattern in ("/**", "/bob/x"):
                r = await alice.request({"op": "consumer_create", "consumer": "y", "pattern": pattern})
                assert (r["op"], r["code"]) == ("error", 4102), r
            r = await bob.request({"op": "consumer_create", "consumer": "b", "pattern": "/bob/**"})
            assert r["op"] == "reply"
            assert (await alice.request({"op": "consume", "consumer": "b", "create": False}))["code"] == 4102
            assert (await alice.request({"op": "consumer_delete", "consumer": "b"}))["code"] == 4102
            assert (await bob.request({"op": "consumer_delete", "consumer": "a"}))["code"] == 4102
            r = await root.request({"op": "consumer_delete", "consumer": "a"})
            assert r["op"] == "reply" and r["deleted"] is True
            assert (await alice.push("consumer_closed"))["reason"] == "deleted"
            r = await bob.request({"op": "consumer_delete", "consumer": "b"})
            assert r["op"] == "reply" and r["deleted"] is True
            for w in (alice, bob, root):
                await w.close()

    run(body)


def test_the_emitter_api(server: ServerProcess) -> None:
    async def body() -> None:
        async with AsyncClient.connect(f"tcp://127.0.0.1:{server.ports['native']}") as client:
            em = Emitter(client)
            heads: list[tuple[str, Any]] = []
            tails: list[tuple[str, Any]] = []
            ended = asyncio.Event()

            def on_head(v: Any, t: str) -> None:
                heads.append((t, v))
                if t == "orders.end":
                    ended.set()

            async def on_tail(v: Any, t: str) -> None:
                tails.append((t, v))

            await em.listen("orders.*", on_head)
            await em.listen("*.eu", on_tail)
            with pytest.raises(ValueError):
                await em.listen("*.x.*", on_tail)
            first: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            await em.once("orders.us", lambda v, t: first.set_result(v))
            for topic, value in (
                ("orders", 1),
                ("orders.us", {"id": 2}),
                ("x.eu", "three"),
                ("orders.eu", [4]),
            ):
                await em.emit(topic, value)
            assert await asyncio.wait_for(first, WAIT) == {"id": 2}
            # Another dialect's publish reaches the listeners too (text as a string).
            await client.publish("/orders/ivy", "plain text")
            await em.emit("orders.end", None)
            await asyncio.wait_for(ended.wait(), WAIT)
            assert heads == [
                ("orders.us", {"id": 2}),
                ("orders.eu", [4]),
                ("orders.ivy", "plain text"),
                ("orders.end", None),
            ]
            assert tails == [("x.eu", "three"), ("orders.eu", [4])]
            assert await em.ignore("orders.*") == 1 and await em.ignore("orders.*") == 0
            assert [x.topic for x in em.listeners()] == ["*.eu"]
            # once without a function: the next value (emitted until the listen is in place).
            nxt = asyncio.ensure_future(em.once("late.x", timeout=WAIT))
            while not nxt.done():
                await em.emit("late.x", "v")
                await asyncio.wait([nxt], timeout=0.05)
            assert nxt.result() == "v"
            await em.close()
            assert em.listeners() == []

    run(body)


def test_the_python_client_reopens_its_consumer_after_the_server_crashes(tmp_path: Path) -> None:
    """kill -9 while the client holds a batch: once the server is back (same port, same data) the client
    opens the consumer again by itself and gets the batch again; acknowledging the old one raises
    ConnectionLost, and nothing acknowledged comes back."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extra = ["--native-tcp-listen", f"127.0.0.1:{port}"]
    srv = ServerProcess(tmp_path / "data", extra).start()
    from hubbub.client import ConnectionLost

    async def body() -> None:
        nonlocal srv
        async with AsyncClient.connect(f"tcp://127.0.0.1:{port}", reconnect_max_delay=0.2) as client:
            await (await client.consume("rc", "/rc/**")).close()
            for i in range(4):
                await client.publish("/rc/a", f"r{i}")
            consumer = await client.consume("rc", max=2)
            first = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert [it.pos for it in first] == [1, 2]
            await first.ack()
            held = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert [it.pos for it in held] == [3, 4]
            srv.kill()
            await asyncio.wait_for(client.wait_disconnected(), WAIT)
            srv = ServerProcess(tmp_path / "data", extra).start()
            again = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert [(it.pos, it.event.payload) for it in again] == [(3, b"r2"), (4, b"r3")]
            with pytest.raises(ConnectionLost):
                await held.ack()
            await again.ack()
            await client.publish("/rc/a", "r4")
            last = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert [it.pos for it in last] == [5]
            await last.ack()
            await consumer.close()

    try:
        run(body)
    finally:
        srv.kill()


def test_a_batch_fits_the_connections_send_queue(tmp_path: Path) -> None:
    """Whatever ``batch_bytes`` a consumer has, a connection's batches hold at most a third of its send queue
    in event bytes (one event at least), so a deliver frame never closes it as a slow consumer."""
    srv = ServerProcess(tmp_path / "data", ["--limits-send-queue-bytes", "30000"]).start()

    async def body() -> None:
        w = await Wire.open(srv.ports, "tcp", "msgpack")
        pub = await Wire.open(srv.ports, "tcp", "json")
        r = await w.request(
            {"op": "consumer_create", "consumer": "big", "pattern": "/big", "batch_bytes": 1 << 30}
        )
        assert r["op"] == "reply"
        await publish(pub, "/big", *[str(i) * 4000 for i in range(10)])
        r = await w.request({"op": "consume", "consumer": "big", "create": False})
        assert r["op"] == "reply" and r["pending"] == 10
        got: list[int] = []
        while len(got) < 10:
            d = await w.push()
            assert sum(len(it["payload"]) for it in d["items"]) <= 10000
            got += [it["pos"] for it in d["items"]]
            assert (await w.request({"op": "ack", "consumer": "big", "batch": d["batch"]}))["op"] == "reply"
        assert got == list(range(1, 11))
        await w.close()
        await pub.close()

    try:
        run(body)
    finally:
        srv.kill()


def test_the_blocking_emitter_and_consumer(server: ServerProcess) -> None:
    import threading

    from hubbub.client import Client

    with Client(f"ws://127.0.0.1:{server.ports['http']}") as client:
        em = client.emitter()
        got: list[tuple[str, Any]] = []
        seen = threading.Event()

        def on(value: Any, topic: str) -> None:
            got.append((topic, value))
            seen.set()

        em.listen("*.done", on)
        em.emit("job.done", {"ok": True})
        assert seen.wait(WAIT)
        assert got == [("job.done", {"ok": True})]
        assert em.ignore("*.done") == 1
        with client.consume("sync", "/sync/**", max=10) as consumer:
            client.publish("/sync/a", "s1")
            batch = consumer.get(WAIT)
            assert batch is not None and [e.payload for e in batch.events] == [b"s1"]
            batch.ack()
        em.close()


def test_max_consumers_caps_new_consumers_of_every_dialect(tmp_path: Path) -> None:
    """Past ``limits.max_consumers``, a new consumer is refused (native 4007, qrpc ``ELIMIT``), not fatal, and
    counted on /metrics; an existing one still opens, and deleting one makes room."""
    from .qrpcclient import CallError, QrpcClient

    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "qpubs.qrpc_listen": "127.0.0.1:0",
        "limits.max_consumers": 2,
    }

    async def body() -> None:
        async with Server(load_config(cli=cli, env={})) as srv:
            w = await Wire.open(srv.ports, "tcp", "msgpack")
            q = await QrpcClient.connect(srv.ports["qrpc"])
            assert (await w.request({"op": "consumer_create", "consumer": "a", "pattern": "/a/**"}))[
                "op"
            ] == "reply"
            assert await q.call("createSubscription", {"subId": "b", "topic": "b.*"}) == {
                "ok": True,
                "subId": "b",
                "created": True,
            }
            r = await w.request({"op": "consumer_create", "consumer": "c", "pattern": "/c/**"})
            assert (r["op"], r["code"]) == ("error", 4007), r
            r = await w.request({"op": "consume", "consumer": "c", "pattern": "/c/**"})  # consume creates too
            assert (r["op"], r["code"]) == ("error", 4007), r
            with pytest.raises(CallError) as e:
                await q.call("createSubscription", {"subId": "d", "topic": "d.*"})
            assert (e.value.code, e.value.message) == ("ELIMIT", "too many durable subscriptions")
            # The existing ones are not refused; the connections are still open.
            r = await w.request({"op": "consumer_create", "consumer": "a", "pattern": "/a/**"})
            assert r["op"] == "reply" and r["created"] is False
            assert (await q.call("createSubscription", {"subId": "b", "topic": "b.*"}))["created"] is False
            assert srv.node is not None
            assert srv.node.limiter.refusals == {
                ("max_consumers", "native"): 2,
                ("max_consumers", "qpubs"): 1,
            }
            # Room again after a delete.
            assert (await w.request({"op": "consumer_delete", "consumer": "a"}))["deleted"] is True
            assert (await q.call("createSubscription", {"subId": "d", "topic": "d.*"}))["created"] is True
            await w.close()
            await q.close()

    run(body)


def test_consumer_memory_limit_reaches_the_service(tmp_path: Path) -> None:
    """``limits.consumer_memory`` is the service's ``held_bytes_max``; what a consumer holds is counted and
    released again once acknowledged."""
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "limits.consumer_memory": 123_456,
    }

    async def body() -> None:
        async with Server(load_config(cli=cli, env={})) as srv:
            assert srv.consumers is not None
            stats = srv.consumers.statistics
            assert stats()["held_bytes_max"] == 123_456
            w = await Wire.open(srv.ports, "tcp", "msgpack")
            assert (await w.request({"op": "consume", "consumer": "m", "pattern": "/m/**", "max": 5}))[
                "op"
            ] == "reply"
            await publish(w, "/m/a", *[str(i) for i in range(12)])
            got: list[str] = []
            while len(got) < 12:
                d = await w.push("deliver")
                got += [text(it) for it in d["items"]]
                assert (await w.request({"op": "ack", "consumer": "m", "batch": d["batch"]}))["op"] == "reply"
            assert got == [str(i) for i in range(12)]
            assert stats()["held_items"] == 0 and stats()["held_bytes"] == 0
            await w.close()

    run(body)
