"""A replay that overlaps a publish burst, over real sockets: the subscriber gets every id exactly once and in
order, and is not closed for the replay's own traffic, in guble (``+ /path 0``) and native (``since``, exact
channel and pattern).

The overlap is made certain rather than lucky: the subscriber (a raw WebSocket over a socket with a small
receive buffer, which buffers nothing more) asks for a replay of more bytes than the socket buffers between it
and the server hold, then reads nothing until a window-paced publisher has had its next
events acknowledged, so the replay is still being sent (checked on the server) while those events are held
for it. Then it reads everything while the publisher goes on. The unpaced variant publishes back to back, so
more events arrive during the replay than a subscription may hold: the hold spills to the log (checked), and
the subscriber still gets every id and stays open.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 30.0
#: Events in the log before the subscriber asks for them, and their payload: together (12 MB) more than the
#: loopback socket buffers take, so a subscriber that does not read stalls its replay. The burst's are small.
BEFORE = 1000
BIG = b"x" * 12_000
SMALL = b"y" * 100
SEND_QUEUE = 256
#: Publishes in flight at most (the paced publisher), and how many are acknowledged while the replay is
#: stalled: fewer than a subscription holds (4 x SEND_QUEUE), more than its queue takes.
WINDOW = 100
HELD = 600
#: The unpaced publisher's window: as many as its connection's replies may queue, more than a hold keeps.
UNPACED = 1000
AFTER = 2000
TOTAL = BEFORE + HELD + AFTER

WS = aiohttp.ClientWebSocketResponse


@dataclass(frozen=True)
class Msg:
    type: aiohttp.WSMsgType
    data: Any


class RawWS:
    """A WebSocket client on a plain socket whose receive buffer is small: what it does not read stays in the
    server's buffers (aiohttp's client reads ahead into memory). Server frames come whole, unmasked."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, addr: str, path: str, protocol: str = "") -> RawWS:
        host, port = addr.rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 14)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
        key = base64.b64encode(os.urandom(16)).decode()
        extra = f"Sec-WebSocket-Protocol: {protocol}\r\n" if protocol else ""
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer)

    async def _send(self, opcode: int, data: bytes) -> None:
        n = len(data)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        self.writer.write(head + b"\0\0\0\0" + data)  # a zero mask leaves the payload as it is
        await self.writer.drain()

    async def send_str(self, text: str) -> None:
        await self._send(0x1, text.encode())

    async def send_bytes(self, data: bytes) -> None:
        await self._send(0x2, data)

    async def receive(self) -> Msg:
        while True:
            b0, b1 = await self.reader.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
            data = await self.reader.readexactly(n)
            opcode = b0 & 0x0F
            if opcode == 0x8:
                return Msg(aiohttp.WSMsgType.CLOSE, struct.unpack("!H", data[:2])[0] if data else 0)
            if opcode in (0x1, 0x2):
                return Msg(aiohttp.WSMsgType(opcode), data)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def serve(data_dir: Path, send_queue: int) -> AsyncIterator[tuple[Server, str]]:
    cli = {
        "data_dir": str(data_dir),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "limits.send_queue": str(send_queue),
    }
    async with Server(load_config(cli=cli, env={})) as server:
        yield server, f"127.0.0.1:{server.ports['http']}"


async def receive(ws: WS | RawWS) -> Any:
    return await asyncio.wait_for(ws.receive(), WAIT)


class GublePublisher:
    """A guble connection publishing to ``/bN`` with at most ``window`` sends unacknowledged."""

    def __init__(self, ws: WS, window: int) -> None:
        self.ws = ws
        self.window = asyncio.Semaphore(window)

    async def publish(self, n: int, payload: bytes = SMALL) -> None:
        async def acks() -> None:
            for _ in range(n):
                msg = await receive(self.ws)
                assert msg.data == b"#send", msg
                self.window.release()

        reader = asyncio.ensure_future(acks())
        for _ in range(n):
            await self.window.acquire()
            await self.ws.send_bytes(b"> /bN\n\n" + payload)
        await reader


def check_ids(ids: list[int], n: int, last: str) -> None:
    out_of_order = sum(a >= b for a, b in itertools.pairwise(ids))
    missing = sorted(set(range(1, n + 1)) - set(ids))
    assert ids == list(range(1, n + 1)), (
        f"{len(set(ids))} of {n} ids, {len(ids) - len(set(ids))} duplicates, {out_of_order} out of order, "
        f"missing {missing[:1]}..{missing[-1:]}, last frame {last:.80}"
    )


def check_notices(notices: list[bytes]) -> None:
    """The fetch block ends and the receiver goes live; a live overflow afterwards (a reader slower than the
    burst) adds a catch-up's block, framed the same way."""
    assert notices[:2] == [b"#fetch-end /bN", b"#subscribed-to /bN"], notices
    fetches = [n for n in notices[2:] if n.startswith(b"#fetch-start /bN ")]
    assert notices[2:] == [x for n in fetches for x in (n, b"#fetch-end /bN", b"#subscribed-to /bN")]


def holding(server: Server) -> int | None:
    """How many events the one subscription whose replay is running holds (``None``: no replay is running)."""
    assert server.node is not None
    for sess in server.node.sessions:
        for sub in server.node.subscriptions(sess):
            if sub.holding is not None:
                return len(sub.holding)
    return None


async def held(server: Server, n: int) -> None:
    """Wait until the replaying subscription holds ``n`` events; its replay must still be running."""
    async with asyncio.timeout(WAIT):
        while True:
            count = holding(server)
            assert count is not None, "the replay ended before the burst: the test proves nothing"
            if count >= n:
                return
            await asyncio.sleep(0.01)  # polling a server-side condition, with the timeout above


async def guble_ids(ws: RawWS, n: int) -> tuple[list[int], list[bytes], str]:
    """The ids of ``/bN`` read up to ``n`` (or the close), the notices, and the last frame."""
    ids: list[int] = []
    notices: list[bytes] = []
    last = ""
    while not ids or ids[-1] < n:
        msg = await receive(ws)
        if msg.type != aiohttp.WSMsgType.BINARY:
            last = repr(msg)
            break
        f: bytes = msg.data
        if f.startswith(b"/bN,"):
            ids.append(int(f.split(b",", 2)[1]))
        else:
            notices.append(f)
        last = repr(f[:80])
    return ids, notices, last


async def guble_setup(http: aiohttp.ClientSession, addr: str) -> tuple[RawWS, GublePublisher]:
    pub_ws = await http.ws_connect(f"ws://{addr}/stream/user/pub")
    assert (await receive(pub_ws)).data.startswith(b"#connected")
    await GublePublisher(pub_ws, 500).publish(BEFORE, BIG)
    sub = await RawWS.open(addr, "/stream/user/sub")
    assert (await receive(sub)).data.startswith(b"#connected")
    return sub, GublePublisher(pub_ws, WINDOW)


def test_guble_catch_up_overlapping_a_paced_burst_gets_every_id(tmp_path: Path) -> None:
    """``+ /bN 0`` with 1,000 events in the log; 600 more are committed and held while the replay is stalled,
    2,000 more while it is read: ids 1..3,600 once each, in order, the fetch block exactly as announced."""

    async def main() -> None:
        async with serve(tmp_path / "d", SEND_QUEUE) as (server, addr), aiohttp.ClientSession() as http:
            sub, pub = await guble_setup(http, addr)
            await sub.send_str("+ /bN 0")
            assert (await receive(sub)).data == b"#fetch-start /bN %d" % BEFORE
            await pub.publish(HELD)
            await held(server, HELD)
            (ids, notices, last), _ = await asyncio.gather(guble_ids(sub, TOTAL), pub.publish(AFTER))
            check_ids(ids, TOTAL, last)
            check_notices(notices)
            await sub.close()
            await pub.ws.close()

    asyncio.run(main())


def test_guble_catch_up_overlapping_an_unpaced_burst_is_not_closed(tmp_path: Path) -> None:
    """The publisher sends 5,000 with 1,000 unacknowledged while the subscriber reads its replay of 1,000:
    more arrive than the subscription holds, and it still gets ids 1..6,000 once each, in order, and stays
    open."""

    async def main() -> None:
        async with serve(tmp_path / "d", SEND_QUEUE) as (server, addr), aiohttp.ClientSession() as http:
            assert server.node is not None
            sub, pub = await guble_setup(http, addr)
            await sub.send_str("+ /bN 0")
            assert (await receive(sub)).data == b"#fetch-start /bN %d" % BEFORE
            unpaced = GublePublisher(pub.ws, UNPACED)
            reading = guble_ids(sub, BEFORE + 5000)
            (ids, notices, last), _ = await asyncio.gather(reading, unpaced.publish(5000))
            check_ids(ids, BEFORE + 5000, last)
            check_notices(notices)
            assert server.node._replays.spills > 0, "the hold never spilled: the test proves nothing"
            await sub.close()
            await pub.ws.close()

    asyncio.run(main())


# -- native ------------------------------------------------------------------------------------------------


class Native:
    """A native JSON WebSocket connection."""

    def __init__(self, ws: WS | RawWS) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, addr: str, raw: bool = False) -> Native:
        ws: WS | RawWS
        if raw:  # the subscriber, whose reads must stall the replay
            ws = await RawWS.open(addr, "/ws/hubbub", "hubbub.v1.json")
        else:
            ws = await http.ws_connect(f"ws://{addr}/ws/hubbub", protocols=["hubbub.v1.json"])
        conn = cls(ws)
        await conn.send({"op": "hello", "id": 0, "v": 1})
        assert (await conn.recv())["op"] == "reply"
        return conn

    async def send(self, obj: dict[str, Any]) -> None:
        await self.ws.send_bytes(orjson.dumps(obj))

    async def recv(self) -> dict[str, Any]:
        msg = await receive(self.ws)
        assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
        out: dict[str, Any] = orjson.loads(msg.data)
        return out

    async def publish(self, n: int, window: int, payload: bytes = SMALL) -> None:
        sem = asyncio.Semaphore(window)
        text = payload.decode()

        async def acks() -> None:
            for _ in range(n):
                reply = await self.recv()
                assert reply["op"] == "reply" and reply.get("ok", True), reply
                sem.release()

        reader = asyncio.ensure_future(acks())
        for i in range(n):
            await sem.acquire()
            await self.send({"op": "publish", "id": i + 1, "channel": "/bN", "text": text, "ack": True})
        await reader


@pytest.mark.parametrize("pattern", ["/bN", "/bN/**"], ids=["exact", "pattern"])
def test_native_since_replay_overlapping_a_burst_gets_every_id(tmp_path: Path, pattern: str) -> None:
    """A native subscription with ``since`` (an exact channel's paged span, or a pattern's events) that
    overlaps a paced burst: every id once, in order, ``recovered`` between replay and live, no error."""

    async def main() -> None:
        async with serve(tmp_path / "d", SEND_QUEUE) as (server, addr), aiohttp.ClientSession() as http:
            pub = await Native.open(http, addr)
            await pub.publish(BEFORE, 500, BIG)
            sub = await Native.open(http, addr, raw=True)
            since: Any = {"seq": 0, "epoch": ""}
            if pattern != "/bN":
                since = {"/bN": since}
            await sub.send({"op": "subscribe", "id": 1, "sub": "s", "pattern": pattern, "since": since})
            reply = await sub.recv()
            assert reply["op"] == "reply", reply
            await pub.publish(HELD, WINDOW)
            await held(server, HELD)

            async def read() -> tuple[list[int], list[str], str]:
                ids: list[int] = []
                other: list[str] = []
                last = ""
                while not ids or ids[-1] < TOTAL:
                    msg = await receive(sub.ws)
                    if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                        return ids, other, repr(msg)
                    obj = orjson.loads(msg.data)
                    if obj["op"] == "event":
                        ids.append(obj["seq"])
                    else:
                        other.append(obj["op"])
                    last = str(obj)[:80]
                return ids, other, last

            (ids, other, last), _ = await asyncio.gather(read(), pub.publish(AFTER, WINDOW))
            check_ids(ids, TOTAL, last)
            assert other == ["recovered"]
            await sub.ws.close()
            await pub.ws.close()

    asyncio.run(main())
