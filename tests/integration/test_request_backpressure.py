"""Read-side back-pressure for requests other than publishes, in every dialect (ARCHITECTURE §6): a client
that pipelines thousands of requests which each get a reply (pings, subscribe and cancel, reads, a dialect's
cheapest call) or thousands of bad frames which each get an error reply, many times what its connection's
queue holds, without reading, is slowed (the server stops reading it while its own replies fill the queue),
never closed: once it reads, every reply arrives, in order, and the connection still answers.

A real server on loopback ports, with a small send queue (``SEND_QUEUE``, from the publishers' test), so that
``K`` replies are many times the four times the bound that replies were once allowed to reach. Each
connection is opened by hand (``raw_ws``, or a TCP stream), so that the test decides when it reads: the
whole flood is written before the first reply is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest

from hubbub.core import Node

from .test_backpressure import HOST, WAIT, raw_ws, serve, ws_frame

#: Requests in each flood: with a queue of 64, more than ten times the hard cap of four times the bound.
K = 3000

Frame = bytes | str


def as_json(data: bytes) -> Any:
    return json.loads(data)


def as_msgpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def as_text(data: bytes) -> Any:
    return data.rstrip(b"\n")


def native_error(obj: dict[str, Any]) -> Any:
    """A native error frame as what identifies it: its op, request id and code."""
    return obj.get("op"), obj.get("id"), obj.get("code")


def native_error_json(data: bytes) -> Any:
    return native_error(json.loads(data))


def native_error_msgpack(data: bytes) -> Any:
    return native_error(as_msgpack(data))


def mist1_error(data: bytes) -> Any:
    """A mist 1.x reply as its command and error."""
    obj = json.loads(data)
    return obj.get("command"), obj.get("error")


def ivy_time(data: bytes) -> Any:
    """An ivy time reply without its time: ``#<ack>#@``."""
    return data[: data.index(b"@") + 1]


@dataclass(frozen=True)
class Case:
    """One dialect over one transport: how to open it, the request numbered ``i`` and its expected reply.

    ``transport`` is "ws" (``where`` is the path) or "tcp" (``where`` names the listener). ``first`` are sent
    before anything (a ``hello``); replies to them are skipped up to the reply to request 0, which is sent
    with them as a barrier. ``decode`` turns a reply (a WebSocket message, or a TCP line) into what is
    compared with ``expect(i)``."""

    transport: str
    where: str
    request: Callable[[int], Frame]
    decode: Callable[[bytes], Any]
    expect: Callable[[int], Any]
    protocol: str = ""
    first: tuple[Frame, ...] = ()


NATIVE_HELLO_JSON = '{"op":"hello","id":0,"v":1}'
NATIVE_HELLO_MSGPACK: bytes = msgpack.packb({"op": "hello", "id": 0, "v": 1})
WEARSCRIPT_HELLO: bytes = msgpack.packb(["subscriptions", "bp:0", ["resp"]])


def native_ping(i: int) -> str:
    return f'{{"op":"ping","id":{i + 1}}}'


def native_pong(i: int) -> Any:
    return {"op": "pong", "id": i + 1}


def guble_request(i: int) -> Frame:
    """``+ /r/<j>`` and ``- /r/<j>`` in turn: a receiver made and cancelled, each answered."""
    return f"{'+' if i % 2 == 0 else '-'} /r/{i // 2}"


def guble_reply(i: int) -> Any:
    return f"#{'subscribed-to' if i % 2 == 0 else 'canceled'} /r/{i // 2}".encode()


def qrpc_call(name: str) -> Callable[[int], Frame]:
    def call(i: int) -> Frame:
        m = {"topic": "t"} if name == "ignore" else {}
        return json.dumps({"v": 1, "id": f"c{i}", "n": name, "m": m}) + "\n"

    return call


def qrpc_reply(data: bytes) -> Any:
    obj = json.loads(data)
    e = obj.get("e")
    return obj.get("id"), obj.get("s"), e and e.get("code"), obj.get("m")


#: Requests each answered with a reply, by dialect and transport.
REQUESTS: dict[str, Case] = {
    "native-ws-json": Case(
        "ws", "/ws/hubbub", native_ping, as_json, native_pong, "hubbub.v1.json", (NATIVE_HELLO_JSON,)
    ),
    "native-ws-msgpack": Case(
        "ws",
        "/ws/hubbub",
        lambda i: msgpack.packb({"op": "ping", "id": i + 1}),
        as_msgpack,
        native_pong,
        "hubbub.v1.msgpack",
        (NATIVE_HELLO_MSGPACK,),
    ),
    "native-tcp": Case(
        "tcp",
        "native",
        lambda i: native_ping(i) + "\n",
        as_json,
        native_pong,
        first=(NATIVE_HELLO_JSON + "\n",),
    ),
    "ivy": Case("ws", "/ws", lambda i: f"#k{i}#@", ivy_time, lambda i: f"#k{i}#@".encode(), "ivy1"),
    "guble": Case("ws", "/stream/user/u", guble_request, as_text, guble_reply),
    "mist2015-tcp": Case("tcp", "mist", lambda i: "ping\n", as_text, lambda i: b"pong"),
    "mist2015-ws": Case(
        "ws",
        "/mist/ws",
        lambda i: '{"command":"ping"}',
        as_json,
        lambda i: {"success": True, "command": "ping"},
    ),
    "mist1-tcp": Case(
        "tcp",
        "mist",
        lambda i: '{"command":"ping"}\n',
        as_json,
        lambda i: {"command": "ping", "data": "pong"},
    ),
    "mist1-ws": Case(
        "ws",
        "/mist/v1/ws",
        lambda i: '{"command":"ping"}',
        as_json,
        lambda i: {"command": "ping", "data": "pong"},
    ),
    "wearscript": Case(
        "ws",
        "/wearscript/ws",
        lambda i: msgpack.packb(["test:server:0", "device", f"resp:{i}"]),
        as_msgpack,
        lambda i: [f"resp:{i}", "0"],
        first=(WEARSCRIPT_HELLO,),
    ),
    "qrpc": Case(
        "tcp",
        "qrpc",
        qrpc_call("ignore"),
        qrpc_reply,
        lambda i: (f"c{i}", "end", None, {"ok": True, "removed": 0}),
    ),
}

#: Bad frames each answered with an error, the connection left open (ivy and WearScript have no error reply:
#: bad input closes the connection, their rule).
ERRORS: dict[str, Case] = {
    "native-ws-json": Case(
        "ws",
        "/ws/hubbub",
        lambda i: f'{{"op":"nope","id":{i + 1}}}',
        native_error_json,
        lambda i: ("error", i + 1, 4002),
        "hubbub.v1.json",
        (NATIVE_HELLO_JSON,),
    ),
    "native-ws-msgpack": Case(
        "ws",
        "/ws/hubbub",
        # Refused by the core, not the codec: 4201, not subscribed.
        lambda i: msgpack.packb({"op": "unsubscribe", "id": i + 1, "sub": "nope"}),
        native_error_msgpack,
        lambda i: ("error", i + 1, 4201),
        "hubbub.v1.msgpack",
        (NATIVE_HELLO_MSGPACK,),
    ),
    "native-tcp": Case(
        "tcp",
        "native",
        lambda i: f'{{"op":"nope","id":{i + 1}}}\n',
        native_error_json,
        lambda i: ("error", i + 1, 4002),
        first=(NATIVE_HELLO_JSON + "\n",),
    ),
    "guble": Case(
        "ws",
        "/stream/user/u",
        lambda i: f"x{i}",
        as_text,
        lambda i: f"!error-bad-request unknown command x{i}".encode(),
    ),
    "mist2015-tcp": Case(
        "tcp", "mist", lambda i: f"bad{i}\n", as_text, lambda i: f"error Unknown command '[bad{i}]'".encode()
    ),
    "mist2015-ws": Case(
        "ws", "/mist/ws", lambda i: "not json", as_json, lambda i: {"success": False, "error": "Invalid json"}
    ),
    "mist1-tcp": Case(
        "tcp",
        "mist",
        lambda i: f'{{"command":"nope{i}"}}\n',
        mist1_error,
        lambda i: (f"nope{i}", "Unknown Command"),
    ),
    "mist1-ws": Case(
        "ws",
        "/mist/v1/ws",
        lambda i: f'{{"command":"nope{i}"}}',
        mist1_error,
        lambda i: (f"nope{i}", "Unknown Command"),
    ),
    "qrpc": Case(
        "tcp", "qrpc", qrpc_call("nope"), qrpc_reply, lambda i: (f"c{i}", "end", "ENOHANDLER", None)
    ),
}


def mist1_read(data: bytes) -> Any:
    """A mist 1.x reply as its command, echoed tags and data."""
    obj = json.loads(data)
    return obj.get("command"), obj.get("tags"), obj.get("data")


#: Reads answered from the node's state after an await (mist's presence), each request tagged for order.
READS: dict[str, Case] = {
    "mist1-tcp-who": Case(
        "tcp",
        "mist",
        lambda i: f'{{"command":"who","tags":["w{i}"]}}\n',
        mist1_read,
        lambda i: ("who", [f"w{i}"], "Lifetime  connections: 1\nSubscribers connected: 0"),
    ),
    "mist1-ws-listall": Case(
        "ws",
        "/mist/v1/ws",
        lambda i: f'{{"command":"listall","tags":["w{i}"]}}',
        mist1_read,
        lambda i: ("listall", [f"w{i}"], None),  # no subscription anywhere: no data
    ),
}


class Conn:
    """A raw connection: frames written as given, server frames read one by one (a WebSocket message, or
    a line)."""

    def __init__(self, case: Case, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.case = case
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, case: Case, ports: dict[str, int]) -> Conn:
        if case.transport == "ws":
            reader, writer = await raw_ws(ports["http"], case.where, case.protocol)
        else:
            reader, writer = await asyncio.open_connection(HOST, ports[case.where], limit=1 << 22)
        return cls(case, reader, writer)

    def encode(self, frame: Frame) -> bytes:
        if self.case.transport == "ws":
            return ws_frame(frame)
        return frame if isinstance(frame, bytes) else frame.encode()

    def write(self, frames: list[Frame]) -> None:
        self.writer.write(b"".join(map(self.encode, frames)))

    async def recv(self) -> bytes:
        """The next message or line (a WebSocket ping skipped; a close fails the test, with its code)."""
        try:
            return await self._recv()
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise AssertionError(f"the server closed the connection: {exc!r}") from None

    async def _recv(self) -> bytes:
        r = self.reader
        if self.case.transport == "tcp":
            line = await asyncio.wait_for(r.readline(), WAIT)
            assert line, "the server closed the connection"
            return line
        while True:
            b0, b1 = await asyncio.wait_for(r.readexactly(2), WAIT)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(await r.readexactly(2), "big")
            elif n == 127:
                n = int.from_bytes(await r.readexactly(8), "big")
            data = await r.readexactly(n)
            op = b0 & 0x0F
            assert op != 0x8, f"the server closed the connection: {data[:2].hex()} {data[2:]!r}"
            if op in (0x1, 0x2):
                return data

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def session_of(node: Node, before: set[Any]) -> Any:
    (sess,) = [s for s in node.sessions if s not in before]
    return sess


def run_flood(tmp_path: Path, case: Case) -> None:
    async def main() -> None:
        async with serve(tmp_path) as server:
            node = server.node
            assert node is not None
            before = set(node.sessions)
            conn = await Conn.open(case, server.ports)
            try:
                await flood(node, conn, case, before)
            finally:
                conn.writer.transport.abort()  # a failed run leaves no socket to the next test

    asyncio.run(main())


async def flood(node: Node, conn: Conn, case: Case, before: set[Any]) -> None:
    """Open with ``case.first`` and request 0, then send requests 1 to K-1 without reading, then read:
    every reply, in order; then request K, still answered; no connection closed as a slow consumer."""
    # Request 0 is a barrier: whatever the server says before its reply (a greeting, the hello reply) is not
    # part of the flood.
    conn.write([*case.first, case.request(0)])
    while case.decode(await conn.recv()) != case.expect(0):
        pass
    sess = session_of(node, before)
    # The flood, written whole before a reply is read (the socket's buffers and the stream's take it; its
    # drain completes while the replies are read).
    conn.write([case.request(i) for i in range(1, K)])

    async def replies() -> list[Any]:
        return [case.decode(await conn.recv()) for _ in range(1, K)]

    _, got = await asyncio.gather(conn.writer.drain(), replies())
    want = [case.expect(i) for i in range(1, K)]
    wrong = next((i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g != w), None)
    assert wrong is None, (wrong, got[wrong], want[wrong])
    # Still open and answering, never asked to close, and no connection closed as a slow consumer.
    conn.write([case.request(K)])
    assert case.decode(await conn.recv()) == case.expect(K)
    assert not (sess.kicked or sess.ending or sess.closed), (sess.kicked, sess.ending)
    assert node.metrics.slow_closes == {}
    await conn.close()


@pytest.mark.parametrize("name", list(REQUESTS))
def test_pipelined_requests_are_slowed_never_closed(tmp_path: Path, name: str) -> None:
    run_flood(tmp_path, REQUESTS[name])


@pytest.mark.parametrize("name", list(ERRORS))
def test_pipelined_bad_frames_get_every_error_and_are_slowed_never_closed(tmp_path: Path, name: str) -> None:
    run_flood(tmp_path, ERRORS[name])


@pytest.mark.parametrize("name", list(READS))
def test_pipelined_reads_are_slowed_never_closed(tmp_path: Path, name: str) -> None:
    run_flood(tmp_path, READS[name])


def test_the_cases_cover_every_dialect_and_transport() -> None:
    """Every connection the publishers' test floods is flooded with requests here too."""
    from .test_backpressure import FLOODS

    assert set(REQUESTS) == set(FLOODS)
    assert set(ERRORS) == set(FLOODS) - {"ivy", "wearscript"}


def test_pipelined_http_requests_are_answered_in_order(tmp_path: Path) -> None:
    """HTTP/1.1 needs no rule of its own (transports/backpressure.py): one connection's requests are served
    one at a time, and a client pipelining publishes without reading is slowed by TCP flow control, never
    closed; every response comes, in order."""
    n = 1000

    async def main() -> None:
        async with serve(tmp_path) as server:
            node = server.node
            assert node is not None
            reader, writer = await asyncio.open_connection(HOST, server.ports["http"])
            try:
                head = b"POST /api/v1/publish/hp HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n"
                writer.write(b"".join(head + f"m{i:06d}".encode() for i in range(n)))

                async def responses() -> list[int]:
                    seqs = []
                    for _ in range(n):
                        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
                        assert head.startswith(b"HTTP/1.1 200 "), head
                        m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                        assert m is not None, head
                        seqs.append(json.loads(await reader.readexactly(int(m.group(1))))["seq"])
                    return seqs

                _, seqs = await asyncio.gather(writer.drain(), responses())
                assert seqs == list(range(1, n + 1))
                assert node.metrics.slow_closes == {}
            finally:
                writer.transport.abort()

    asyncio.run(main())
