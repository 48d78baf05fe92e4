"""Read-side back-pressure in every dialect (ARCHITECTURE §6): a publisher that pipelines far more publishes
than its connection's queue holds, without reading a reply, is slowed (the server stops reading it), never
closed; each of its publishes is acknowledged in the dialect's way, and every event is committed and reaches a
live subscriber, every id in order. A client that sends requests and closes without reading the replies gives
back its session and its connection slot.

A real server on loopback ports, with a small send queue (``SEND_QUEUE``), so that ``N`` publishes are many
times what one connection may queue.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from hubbub.core import Node, Session
from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 20.0
SEND_QUEUE = 64
#: Publishes pipelined: many times the queue's bound, past the four times it that replies were once allowed.
N = 1200
HOST = "127.0.0.1"

WS = aiohttp.ClientWebSocketResponse


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **extra: str) -> AsyncIterator[Server]:
    cli = {
        "data_dir": str(tmp_path / "d"),
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "store": "memory",
        "limits.send_queue": str(SEND_QUEUE),
    }
    cli.update(extra)
    async with Server(load_config(cli=cli, env={})) as server:
        yield server


NATIVE_PUBLISH = '{{"op":"publish","id":{id},"channel":"/bp","text":"{text}","ack":true}}\n'


def body(i: int) -> str:
    return f"m{i:06d}"


def ids_in(payloads: list[bytes]) -> list[int]:
    out = []
    for p in payloads:
        m = re.search(rb"m(\d{6})", p)
        assert m is not None, p
        out.append(int(m.group(1)))
    return out


async def until(cond: Callable[[], bool], what: str) -> None:
    """Wait (polling the server's own state, in-process) until ``cond()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not cond():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# -- the live subscriber: native WebSocket, msgpack ---------------------------------------------------------


class Subscriber:
    def __init__(self, ws: WS) -> None:
        self.ws = ws
        self.payloads: list[bytes] = []

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, port: int, pattern: str) -> Subscriber:
        ws = await http.ws_connect(f"ws://{HOST}:{port}/ws/hubbub", protocols=["hubbub.v1.msgpack"])
        sub = cls(ws)
        await ws.send_bytes(msgpack.packb({"op": "hello", "id": 1, "v": 1, "batch": True}))
        assert (await sub._recv())[0]["op"] == "reply"
        await ws.send_bytes(msgpack.packb({"op": "subscribe", "id": 2, "sub": "s", "pattern": pattern}))
        assert (await sub._recv())[0]["op"] == "reply"
        return sub

    async def _recv(self) -> list[dict[str, Any]]:
        msg = await asyncio.wait_for(self.ws.receive(), WAIT)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        obj: dict[str, Any] = msgpack.unpackb(msg.data)
        return obj["frames"] if obj.get("op") == "batch" else [obj]

    async def read(self, n: int) -> list[int]:
        """Read events until ``n`` have come; their ids, in order of arrival."""
        while len(self.payloads) < n:
            for f in await self._recv():
                assert f["op"] == "event", f
                self.payloads.append(f["payload"])
        return ids_in(self.payloads)


# -- pipelining publishers, one per dialect and transport ---------------------------------------------------
# Each sends N publishes without reading anything, then reads the acknowledgements (where the dialect has
# them) and returns how many came, or None for a dialect that acknowledges nothing.


@dataclass(frozen=True)
class Ports:
    http: int
    native: int
    mist: int
    qrpc: int


Close = Callable[[], Awaitable[object]]
#: How many publishes were acknowledged (None: the dialect acknowledges none), and how to close the
#: connection.
Published = tuple[int | None, Close]


def closer(writer: asyncio.StreamWriter) -> Close:
    async def close() -> None:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()

    return close


async def nothing() -> None:
    pass


async def native_ws(http: aiohttp.ClientSession, ports: Ports, encoding: str) -> Published:
    ws = await http.ws_connect(f"ws://{HOST}:{ports.http}/ws/hubbub", protocols=[f"hubbub.v1.{encoding}"])
    packb: Callable[[Any], bytes] = msgpack.packb

    async def send(obj: dict[str, Any]) -> None:
        await (ws.send_bytes(packb(obj)) if encoding == "msgpack" else ws.send_str(json.dumps(obj)))

    async def recv() -> dict[str, Any]:
        msg = await asyncio.wait_for(ws.receive(), WAIT)
        assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
        out: dict[str, Any] = msgpack.unpackb(msg.data) if encoding == "msgpack" else json.loads(msg.data)
        return out

    await send({"op": "hello", "id": 0, "v": 1})
    assert (await recv())["op"] == "reply"
    field = "payload" if encoding == "msgpack" else "text"
    for i in range(N):
        data = body(i).encode() if encoding == "msgpack" else body(i)
        await send({"op": "publish", "id": i + 1, "channel": "/bp", field: data, "ack": True})
    acked: list[int] = []
    while len(acked) < N:
        r = await recv()
        assert r["op"] == "reply" and "error" not in r, r
        acked.append(r["id"])
    assert acked == list(range(1, N + 1))
    return len(acked), ws.close


async def native_tcp(http: aiohttp.ClientSession, ports: Ports) -> Published:
    reader, writer = await asyncio.open_connection(HOST, ports.native)
    writer.write(b'{"op":"hello","id":0,"v":1}\n')
    assert json.loads(await asyncio.wait_for(reader.readline(), WAIT))["op"] == "reply"
    for i in range(N):
        writer.write(NATIVE_PUBLISH.format(id=i + 1, text=body(i)).encode())
    await writer.drain()
    acked: list[int] = []
    while len(acked) < N:
        line = await asyncio.wait_for(reader.readline(), WAIT)
        r = json.loads(line)
        assert r["op"] == "reply" and "error" not in r, r
        acked.append(r["id"])
    assert acked == list(range(1, N + 1))
    return len(acked), closer(writer)


async def native_http(http: aiohttp.ClientSession, ports: Ports) -> Published:
    # HTTP has no pipelining of its own: the publishes are requests in flight together, as many as a quarter
    # of a queue's bound (more publishers at once than that outgrow a live subscriber's queue in one commit:
    # the slow-consumer policy, not back-pressure), each answered after its commit, in no particular order.
    window = asyncio.Semaphore(SEND_QUEUE // 4)

    async def one(i: int) -> int:
        url = f"http://{HOST}:{ports.http}/api/v1/publish/bp"
        async with window, http.post(url, data=body(i).encode()) as r:
            assert r.status == 200, await r.text()
            seq: int = (await r.json())["seq"]
            return seq

    seqs = await asyncio.gather(*(one(i) for i in range(N)))
    assert sorted(seqs) == list(range(1, N + 1))
    return len(seqs), nothing


async def ivy(http: aiohttp.ClientSession, ports: Ports) -> Published:
    ws = await http.ws_connect(f"ws://{HOST}:{ports.http}/ws", protocols=("ivy1",))
    for i in range(N):
        await ws.send_str(f":/bp:{body(i)}")
    return None, ws.close


async def guble(http: aiohttp.ClientSession, ports: Ports) -> Published:
    ws = await http.ws_connect(f"ws://{HOST}:{ports.http}/stream/user/pub")
    assert (await asyncio.wait_for(ws.receive(), WAIT)).data.startswith(b"#connected")
    for i in range(N):
        await ws.send_bytes(b"> /bp\n\n" + body(i).encode())
    acks = 0
    while acks < N:
        msg = await asyncio.wait_for(ws.receive(), WAIT)
        assert msg.type == aiohttp.WSMsgType.BINARY and msg.data == b"#send", msg
        acks += 1
    return acks, ws.close


async def mist2015_tcp(http: aiohttp.ClientSession, ports: Ports) -> Published:
    _, writer = await asyncio.open_connection(HOST, ports.mist)
    writer.write(b"".join(f"publish bp {body(i)}\n".encode() for i in range(N)))
    await writer.drain()
    return None, closer(writer)


async def mist1_tcp(http: aiohttp.ClientSession, ports: Ports) -> Published:
    _, writer = await asyncio.open_connection(HOST, ports.mist)
    lines = (json.dumps({"command": "publish", "tags": ["bp"], "data": body(i)}) + "\n" for i in range(N))
    writer.write("".join(lines).encode())
    await writer.drain()
    return None, closer(writer)


async def mist1_ws(http: aiohttp.ClientSession, ports: Ports) -> Published:
    ws = await http.ws_connect(f"ws://{HOST}:{ports.http}/mist/v1/ws")
    for i in range(N):
        await ws.send_str(json.dumps({"command": "publish", "tags": ["bp"], "data": body(i)}))
    return None, ws.close


async def wearscript(http: aiohttp.ClientSession, ports: Ports) -> Published:
    ws = await http.ws_connect(f"ws://{HOST}:{ports.http}/wearscript/ws")
    for i in range(N):
        await ws.send_bytes(msgpack.packb(["bp", body(i)]))
    return None, ws.close


async def qrpc(http: aiohttp.ClientSession, ports: Ports) -> Published:
    reader, writer = await asyncio.open_connection(HOST, ports.qrpc, limit=1 << 22)
    for i in range(N):
        m = {"topic": "bp", "value": body(i)}
        writer.write(json.dumps({"v": 1, "id": f"c{i}", "n": "emit", "m": m}).encode() + b"\n")
    await writer.drain()
    acked: list[str] = []
    while len(acked) < N:
        r = json.loads(await asyncio.wait_for(reader.readline(), WAIT))
        assert r["s"] == "end" and r["m"]["ok"], r
        acked.append(r["id"])
    assert acked == [f"c{i}" for i in range(N)]
    return len(acked), closer(writer)


Publisher = Callable[[aiohttp.ClientSession, Ports], Awaitable[Published]]

#: (dialect of the publisher's session, the channel its events land on, the publisher).
PUBLISHERS: dict[str, tuple[str, str, Publisher]] = {
    "native-ws-json": ("native", "/bp", lambda h, p: native_ws(h, p, "json")),
    "native-ws-msgpack": ("native", "/bp", lambda h, p: native_ws(h, p, "msgpack")),
    "native-tcp": ("native", "/bp", native_tcp),
    "native-http": ("", "/bp", native_http),
    "ivy": ("ivy", "/bp", ivy),
    "guble": ("guble", "/bp", guble),
    "mist2015-tcp": ("mist2015", "/mist", mist2015_tcp),
    "mist1-tcp": ("mist1", "/mist", mist1_tcp),
    "mist1-ws": ("mist1", "/mist", mist1_ws),
    "wearscript": ("wearscript", "/bp", wearscript),
    "qrpc": ("qpubs", "/bp", qrpc),
}


def publisher_sessions(node: Node, dialect: str) -> list[Session]:
    return [s for s in node.sessions if s.dialect == dialect]


@pytest.mark.parametrize("name", list(PUBLISHERS))
def test_a_pipelining_publisher_is_slowed_never_closed(tmp_path: Path, name: str) -> None:
    dialect, channel, publish = PUBLISHERS[name]

    async def main() -> None:
        async with serve(tmp_path) as server, aiohttp.ClientSession() as http:
            node = server.node
            assert node is not None
            p = server.ports
            ports = Ports(p["http"], p["native"], p["mist"], p["qrpc"])
            sub = await Subscriber.open(http, ports.http, channel)
            before = set(publisher_sessions(node, dialect)) if dialect else set()
            got, (acks, close) = await asyncio.gather(sub.read(N), publish(http, ports))
            if name == "native-http":  # concurrent requests: every id once, in the order they committed
                assert sorted(got) == list(range(N)), (len(got), len(set(got)))
            else:
                assert got == list(range(N)), (len(got), got[:5], got[-5:])
            if acks is not None:
                assert acks == N
            assert node.metrics.slow_closes == {}
            if dialect:
                # The publisher's connection is still open, and was never asked to close.
                (pub,) = [s for s in publisher_sessions(node, dialect) if s not in before]
                assert not (pub.kicked or pub.ending or pub.closed), (pub.kicked, pub.ending)
                await until(lambda: node._batcher.pending == 0, "every publish completed")
            await close()
            await sub.ws.close()

    asyncio.run(main())


# -- a client that sends requests and closes without reading the replies -----------------------------------


Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def raw_ws(port: int, path: str, protocol: str = "") -> Stream:
    """A WebSocket opened by hand, so that the test decides what is read: nothing, after the upgrade."""
    reader, writer = await asyncio.open_connection(HOST, port)
    proto = f"Sec-WebSocket-Protocol: {protocol}\r\n" if protocol else ""
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n"
        f"{proto}\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    assert head.startswith(b"HTTP/1.1 101 "), head
    return reader, writer


def ws_frame(data: bytes | str) -> bytes:
    """One client frame (text for str, binary for bytes), masked with a zero key (the payload unchanged)."""
    raw, op = (data.encode(), 0x1) if isinstance(data, str) else (data, 0x2)
    n = len(raw)
    if n < 126:
        head = bytes([0x80 | op, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([0x80 | op, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x80 | op, 0x80 | 127]) + n.to_bytes(8, "big")
    return head + b"\0\0\0\0" + raw


#: Requests that each get a reply (or, for mist 2015, an event to its own subscription; for ivy's publishes
#: none), sent K times: (transport, path or port name, WebSocket subprotocol, the first frames, the request).
K = 4000
MSGPACK_PUBLISH = {"op": "publish", "channel": "/bp", "payload": b"x", "ack": True}
BIG = "y" * 100_000
FLOODS: dict[str, tuple[str, str, str, list[bytes | str], Callable[[int], bytes | str]]] = {
    "native-ws-json": (
        "ws",
        "/ws/hubbub",
        "hubbub.v1.json",
        ['{"op":"hello","id":0,"v":1}'],
        lambda i: NATIVE_PUBLISH.format(id=i + 1, text=body(i)).rstrip("\n"),
    ),
    "native-ws-msgpack": (
        "ws",
        "/ws/hubbub",
        "hubbub.v1.msgpack",
        [msgpack.packb({"op": "hello", "id": 0, "v": 1})],
        lambda i: msgpack.packb(dict(MSGPACK_PUBLISH, id=i + 1)),
    ),
    "native-tcp": (
        "tcp",
        "native",
        "",
        [b'{"op":"hello","id":0,"v":1}\n'],
        lambda i: NATIVE_PUBLISH.format(id=i + 1, text=body(i)).encode(),
    ),
    "ivy": ("ws", "/ws", "ivy1", [], lambda i: "@"),
    "guble": ("ws", "/stream/user/u", "", [], lambda i: b"> /bp\n\n" + body(i).encode()),
    "mist2015-tcp": ("tcp", "mist", "", [b"subscribe bp\n"], lambda i: f"publish bp {BIG}\n".encode()),
    "mist2015-ws": ("ws", "/mist/ws", "", [], lambda i: '{"command":"ping"}'),
    "mist1-tcp": ("tcp", "mist", "", [], lambda i: b'{"command":"ping"}\n'),
    "mist1-ws": ("ws", "/mist/v1/ws", "", [], lambda i: '{"command":"ping"}'),
    "wearscript": ("ws", "/wearscript/ws", "", [], lambda i: msgpack.packb(["bp", body(i)])),
    "qrpc": (
        "tcp",
        "qrpc",
        "",
        [],
        lambda i: f'{{"v":1,"id":"c{i}","n":"emit","m":{{"topic":"bp","value":"{body(i)}"}}}}\n'.encode(),
    ),
}


@pytest.mark.parametrize("name", list(FLOODS))
def test_a_client_that_closes_without_reading_gives_its_session_back(tmp_path: Path, name: str) -> None:
    """Three connections from one address, each sending requests and closing without reading a reply: each
    one's session goes, and so does its connection slot (three of them would lock the address out of every
    listener, at ``limits.max_connections_per_ip`` 3)."""
    transport, where, protocol, first, request = FLOODS[name]
    # mist 2015's events to its own subscription fill the socket: the server stops reading, the client's
    # writes wait, and the write timeout aborts the connection (a second here).
    count = 200 if name == "mist2015-tcp" else K

    async def main() -> None:
        limits = {"limits.max_connections_per_ip": "3", "limits.write_timeout_s": "1"}
        async with serve(tmp_path, **limits) as server:
            node = server.node
            assert node is not None
            for _ in range(3):
                if transport == "ws":
                    _, writer = await raw_ws(server.ports["http"], where, protocol)
                    frames = [ws_frame(f) for f in first] + [ws_frame(request(i)) for i in range(count)]
                else:
                    _, writer = await asyncio.open_connection(HOST, server.ports[where])
                    frames = [f if isinstance(f, bytes) else f.encode() for f in first]
                    frames += [r if isinstance(r, bytes) else r.encode() for r in map(request, range(count))]
                with contextlib.suppress(ConnectionError):  # the server may close a flood (slow consumer)
                    for f in frames:
                        writer.write(f)
                        await writer.drain()
                writer.close()  # without reading: the replies the server writes meet a closed socket
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
            await until(
                lambda: not node.sessions and node.limiter.connections == 0,
                f"every session and slot back ({len(node.sessions)} sessions, "
                f"{node.limiter.connections} slots)",
            )
            # The address may connect again.
            reader, writer = await asyncio.open_connection(HOST, server.ports["http"])
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), WAIT)).startswith(b"HTTP/1.1 200 ")
            writer.close()

    asyncio.run(main())
