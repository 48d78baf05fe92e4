"""A subscription made on one worker of a multi-worker node after another worker's publish was acknowledged
never gets that event live, whichever dialect subscribes (``WorkerRelay.barrier``, docs/architecture.md
"Workers"): one process fans out at commit, before the ack, so an event acknowledged before a subscribe is
never delivered to it live; a worker must not either, however late the owner's broadcast of it arrives.

The two workers run in this process (a real :class:`LogOwner` on a SQLite file, a :class:`RemoteLogStore`
and a whole :class:`Server` per worker, every listener on port 0), and worker 0's events socket runs
through a gate the test closes: the owner's broadcast of worker 1's commit is held back while worker 0's
client subscribes. The gate opens once worker 0 asked the owner for its sync marker (the barrier's call:
the marker is queued behind the held broadcast), or, without a barrier, once the subscribe was answered.
Then every id is checked: the held event never arrives live, and every event published after the
subscribe's reply arrives once, in order, up to a sentinel after which nothing else is queued."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from hubbub.dialects import mqtt_codec
from hubbub.log.sqlite import SqliteLogStore
from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.workers.owner import LogOwner
from hubbub.workers.remote import RemoteLogStore

from .mqttclient import MqttClient

WAIT = 10.0


class Gate:
    """Bytes from ``inner`` to ``outer`` (a thread of its own), held while the gate is closed."""

    def __init__(self, inner: socket.socket, outer: socket.socket) -> None:
        self.inner, self.outer = inner, outer
        self.open = threading.Event()
        self.open.set()
        self._thread = threading.Thread(target=self._pump, name="test-gate", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while data := self.inner.recv(1 << 16):
                self.open.wait()
                self.outer.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self.outer.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.open.set()
        for s in (self.inner, self.outer):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        for s in (self.inner, self.outer):
            s.close()


@dataclass
class Workers:
    """Two workers' servers; ``gate`` holds back worker 0's events socket; ``synced`` is set when worker 0
    asked the owner for a sync marker."""

    servers: list[Server]
    gate: Gate
    synced: asyncio.Event = field(default_factory=asyncio.Event)

    def hold(self) -> None:
        self.synced.clear()
        self.gate.open.clear()

    async def release_after(self, answered: asyncio.Future[Any]) -> Any:
        """Open the gate once worker 0 synced with the owner or ``answered`` (the subscribe's reply) came,
        whichever is first; return the reply."""
        synced = asyncio.ensure_future(self.synced.wait())
        await asyncio.wait([answered, synced], timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
        synced.cancel()
        self.gate.open.set()
        return await asyncio.wait_for(answered, WAIT)


@contextlib.asynccontextmanager
async def two_workers(tmp_path: Path) -> AsyncIterator[Workers]:
    path = tmp_path / "log.db"
    store = SqliteLogStore(path)
    owner = LogOwner(store, str(path))
    owner.start()
    socks: list[socket.socket] = []
    gate: Gate | None = None
    remotes: list[RemoteLogStore] = []
    synced = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        for i in range(2):
            calls, calls_w = socket.socketpair()
            events, events_w = socket.socketpair()
            socks += [calls, calls_w, events, events_w]
            if i == 0:
                held, held_w = socket.socketpair()
                socks += [held, held_w]
                gate = Gate(held_w, events_w)
                owner.connect(i, calls, held)
            else:
                owner.connect(i, calls, events_w)
            remote = RemoteLogStore(calls_w, events, i)
            remotes.append(remote)
        sync: Callable[[int], bool] | None = getattr(remotes[0], "sync", None)
        if sync is not None:  # a spy: tells when the barrier's marker is queued behind the held broadcast

            def spy(token: int) -> bool:
                queued = sync(token)
                loop.call_soon_threadsafe(synced.set)
                return queued

            remotes[0].sync = spy  # type: ignore[method-assign]  # a test double
        assert gate is not None
        async with contextlib.AsyncExitStack() as stack:
            servers = []
            for i, remote in enumerate(remotes):
                cli = {
                    "data_dir": str(tmp_path / f"w{i}"),
                    "http.listen": "127.0.0.1:0",
                    "native.tcp_listen": "127.0.0.1:0",
                    "mqtt.tcp_listen": "127.0.0.1:0",
                }
                servers.append(
                    await stack.enter_async_context(Server(load_config(cli=cli, env={}), worker=remote))
                )
            yield Workers(servers, gate, synced)
    finally:
        if gate is not None:
            gate.close()
        owner.close()
        for s in socks:
            s.close()
        store.close()


# -- native ----------------------------------------------------------------------------------------------


class Native:
    """A native TCP JSON-lines connection (native.md §3)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ids = 0
        self.pushed: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, port: int) -> Native:
        c = cls(*await asyncio.open_connection("127.0.0.1", port))
        assert (await c.request({"op": "hello", "v": 1}))["op"] == "reply"
        return c

    async def _read(self) -> None:
        while line := await self.reader.readline():
            msg = json.loads(line)
            fut = self.replies.pop(msg.get("id", -1), None)
            if fut is not None and msg.get("op") in ("reply", "error"):
                fut.set_result(msg)
            elif msg.get("op") == "event":
                self.pushed.append(msg)
                self.arrived.set()

    def send(self, obj: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        self.ids += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.replies[self.ids] = fut
        self.writer.write(json.dumps({**obj, "id": self.ids}).encode() + b"\n")
        return fut

    async def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.wait_for(self.send(obj), WAIT)

    async def publish(self, channel: str, text: str) -> int:
        reply = await self.request({"op": "publish", "channel": channel, "text": text, "ack": True})
        assert reply["op"] == "reply", reply
        return int(reply["seq"])

    async def events(self, n: int) -> list[tuple[str, int, str]]:
        async with asyncio.timeout(WAIT):
            while len(self.pushed) < n:
                self.arrived.clear()
                await self.arrived.wait()
        return [(e["channel"], e["seq"], e["text"]) for e in self.pushed]

    async def close(self) -> None:
        self.writer.close()
        self.task.cancel()
        with contextlib.suppress(BaseException):
            await self.task


def test_native_subscribe_gets_no_event_acknowledged_before_it_on_another_worker(tmp_path: Path) -> None:
    async def main() -> None:
        async with two_workers(tmp_path) as w:
            a = await Native.connect(w.servers[0].ports["native"])
            b = await Native.connect(w.servers[1].ports["native"])
            assert await b.publish("/n/x", "m1") == 1
            w.hold()
            assert await b.publish("/n/x", "m2") == 2  # acknowledged; its broadcast to worker 0 held back
            assert await b.publish("/n/y", "m3") == 1
            reply = await w.release_after(a.send({"op": "subscribe", "sub": "s", "pattern": "/n/**"}))
            assert reply["op"] == "reply", reply
            for i, ch in enumerate(["/n/y", "/n/x", "/n/y", "/n/x"]):
                await b.publish(ch, f"l{i}")
            await b.publish("/n/end", "sentinel")
            got = await a.events(5)
            assert got == [
                ("/n/y", 2, "l0"),
                ("/n/x", 3, "l1"),
                ("/n/y", 3, "l2"),
                ("/n/x", 4, "l3"),
                ("/n/end", 1, "sentinel"),
            ]
            await a.close()
            await b.close()

    asyncio.run(main())


# -- guble -----------------------------------------------------------------------------------------------


async def guble_recv(ws: aiohttp.ClientWebSocketResponse) -> str:
    msg = await asyncio.wait_for(ws.receive(), WAIT)
    assert msg.type == aiohttp.WSMsgType.BINARY, msg
    return bytes(msg.data).decode()


async def guble(http: aiohttp.ClientSession, server: Server, user: str) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(f"ws://127.0.0.1:{server.ports['http']}/stream/user/{user}")
    assert (await guble_recv(ws)).startswith("#connected")
    return ws


async def guble_send(ws: aiohttp.ClientWebSocketResponse, path: str, body: str) -> None:
    await ws.send_str(f"> {path}\n\n{body}")
    assert await guble_recv(ws) == "#send"


def test_guble_subscribe_gets_no_event_acknowledged_before_it_on_another_worker(tmp_path: Path) -> None:
    async def main() -> None:
        async with two_workers(tmp_path) as w, aiohttp.ClientSession() as http:
            a = await guble(http, w.servers[0], "alice")
            b = await guble(http, w.servers[1], "bob")
            await guble_send(b, "/foo", "m1")
            w.hold()
            await guble_send(b, "/foo/bar", "m2")  # acknowledged; its broadcast to worker 0 held back
            await guble_send(b, "/foo", "m3")
            await a.send_str("+ /foo")
            answered = asyncio.ensure_future(guble_recv(a))
            assert await w.release_after(answered) == "#subscribed-to /foo"
            for path, body in [("/foo/bar", "l0"), ("/foo", "l1"), ("/foo/bar", "l2"), ("/foo/end", "end")]:
                await guble_send(b, path, body)
            got = []
            for _ in range(4):
                head, _, body = (await guble_recv(a)).partition("\n")
                fields = head.split(",")
                got.append((fields[0], int(fields[1]), body.rpartition("\n")[2]))
            assert got == [
                ("/foo/bar", 2, "l0"),
                ("/foo", 3, "l1"),
                ("/foo/bar", 3, "l2"),
                ("/foo/end", 1, "end"),
            ]
            for ws in (a, b):
                await ws.close()

    asyncio.run(main())


# -- MQTT ------------------------------------------------------------------------------------------------


def test_mqtt_subscribe_gets_no_event_acknowledged_before_it_on_another_worker(tmp_path: Path) -> None:
    async def main() -> None:
        async with two_workers(tmp_path) as w:
            a = await MqttClient.connect(w.servers[0].ports["mqtt"], "alice")
            b = await MqttClient.connect(w.servers[1].ports["mqtt"], "bob")
            await b.publish("m/x", b"m1", qos=1)
            w.hold()
            await b.publish("m/x", b"m2", qos=1)  # acknowledged; its broadcast to worker 0 held back
            await b.publish("m/y", b"m3", qos=1)
            a.send(mqtt_codec.encode_subscribe(a.pid(), [("m/#", 0)]))
            suback = await w.release_after(asyncio.ensure_future(a.next()))
            assert isinstance(suback, mqtt_codec.Suback) and suback.codes == (0,), suback
            sent = [("m/y", b"l0"), ("m/x", b"l1"), ("m/y", b"l2"), ("m/x", b"l3"), ("m/end", b"end")]
            for topic, payload in sent:
                await b.publish(topic, payload, qos=1)
            got = [(p.topic, p.payload) for p in [await a.message() for _ in sent]]
            assert got == sent
            await a.ping()  # nothing else was queued before the ping's answer
            for cl in (a, b):
                await cl.disconnect()

    asyncio.run(main())
