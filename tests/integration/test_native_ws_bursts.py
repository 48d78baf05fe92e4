"""A native WebSocket client's burst (many messages in one write: a pipelining publisher) is decoded as one
and taken as native TCP takes a read: the common publishes in runs of at most ``RUN_MAX``, the loop's other
work (the run's commit and replies first) between two runs, and every other message in its place. Every
reply comes in order, every event reaches a subscriber once and in order, and bad messages inside a burst
get their own errors."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest

from hubbub.auth import Identity
from hubbub.config import load_config
from hubbub.core import Session
from hubbub.core.batcher import Done, DoneMany
from hubbub.dialects.native import RUN_MAX
from hubbub.log.base import AppendRequest, AppendRun
from hubbub.server import Server

WAIT = 30.0


def _masked(body: bytes, text: bool) -> bytes:
    """A client frame (RFC 6455 §5.2), FIN set, masked with a random key."""
    key = os.urandom(4)
    n = len(body)
    head = bytes([0x81 if text else 0x82])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = (key * (n // 4 + 1))[:n]
    return head + key + (int.from_bytes(body, "big") ^ int.from_bytes(mask, "big")).to_bytes(n, "big")


class WsClient:
    """A blocking WebSocket client on a raw socket: bursts go out in one ``sendall``."""

    def __init__(self, port: int, encoding: str) -> None:
        self.encoding = encoding
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                "GET /ws/hubbub HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: hubbub.v1.{encoding}\r\n\r\n"
            ).encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self._recv()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        self.send([{"op": "hello", "id": 1, "v": 1}])
        assert self.read()["op"] == "reply"

    def _recv(self) -> bytes:
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        return data

    def frame(self, obj: dict[str, Any] | bytes) -> bytes:
        if isinstance(obj, bytes):  # raw (bad) message bytes
            return _masked(obj, self.encoding == "json")
        if self.encoding == "json":
            return _masked(orjson.dumps(obj), True)
        return _masked(msgpack.packb(obj, use_bin_type=True), False)

    def send(self, objs: list[dict[str, Any] | bytes]) -> None:
        self.sock.sendall(b"".join(self.frame(o) for o in objs))  # one write: a burst

    def read(self) -> dict[str, Any]:
        """The next data message (pings are not expected in these tests' seconds)."""
        while True:
            while len(self.buf) < 2:
                self.buf += self._recv()
            op, n = self.buf[0] & 0x0F, self.buf[1] & 0x7F
            at = 2
            if n == 126:
                while len(self.buf) < 4:
                    self.buf += self._recv()
                n, at = struct.unpack(">H", self.buf[2:4])[0], 4
            elif n == 127:
                while len(self.buf) < 10:
                    self.buf += self._recv()
                n, at = struct.unpack(">Q", self.buf[2:10])[0], 10
            while len(self.buf) < at + n:
                self.buf += self._recv()
            body, self.buf = self.buf[at : at + n], self.buf[at + n :]
            if op == 0x8:
                return {"op": "close", "code": struct.unpack(">H", body[:2])[0] if body else None}
            if op in (0x1, 0x2):
                out: dict[str, Any] = orjson.loads(body) if op == 0x1 else msgpack.unpackb(body)
                return out

    def close(self) -> None:
        self.sock.close()


def _publish(rid: int, channel: str, text: str, encoding: str) -> dict[str, Any]:
    obj: dict[str, Any] = {"op": "publish", "id": rid, "channel": channel, "ack": True}
    if encoding == "json":
        obj["text"] = text
    else:
        obj["payload"] = text.encode()
    return obj


def _run(tmp_path: Path, test: Any) -> None:
    async def main() -> None:
        cli = {
            "data_dir": str(tmp_path / "d"),
            "store": "memory",
            "durability": "none",
            "http.listen": "127.0.0.1:0",
            "native.tcp_listen": "127.0.0.1:0",
        }
        async with Server(load_config(cli=cli, env={})) as server:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, test, server, loop)

    asyncio.run(main())


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_a_burst_with_bad_messages_is_answered_whole_and_in_order(tmp_path: Path, encoding: str) -> None:
    n = 3000
    bad = {
        700: {"op": "publish", "id": 700, "channel": "no slash", "text": "x"},
        1500: {"op": "nope", "id": 1500},
    }

    def test(server: Server, loop: asyncio.AbstractEventLoop) -> None:
        port = server.ports["http"]
        sub = WsClient(port, encoding)
        sub.send([{"op": "subscribe", "id": 2, "sub": "s", "pattern": "/bursts/**"}])
        assert sub.read()["op"] == "reply"
        pub = WsClient(port, encoding)
        burst: list[dict[str, Any] | bytes] = []
        for i in range(n):
            burst.append(bad.get(i) or _publish(10 + i, "/bursts/a", f"e{i}", encoding))
            if i == 2000:
                burst.append({"op": "ping", "id": 3})
        pub.send(burst)
        # Publish replies come in order; an error or a pong answers at once (native.md §3: by id).
        msgs = [pub.read() for _ in range(n + 1)]
        replies = [m for m in msgs if m["op"] == "reply"]
        assert [r["id"] for r in replies] == [10 + i for i in range(n) if i not in bad]
        errors = {m["id"]: m["code"] for m in msgs if m["op"] == "error"}
        assert errors == {700: 4004, 1500: 4002}
        assert [m for m in msgs if m["op"] == "pong"] == [{"op": "pong", "id": 3}]
        seqs = [r["seq"] for r in replies]
        assert seqs == list(range(1, n - len(bad) + 1))
        events = [sub.read() for _ in seqs]
        assert [e["seq"] for e in events] == seqs
        texts = [e["text"] if encoding == "json" else e["payload"].decode() for e in events]
        assert texts == [f"e{i}" for i in range(n) if i not in bad]
        pub.close()
        sub.close()

    _run(tmp_path, test)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_a_fatal_message_in_a_burst_ends_the_connection(tmp_path: Path, encoding: str) -> None:
    """The error 4000 and the close, as for the message alone; nothing after it in the burst is taken."""

    def test(server: Server, loop: asyncio.AbstractEventLoop) -> None:
        assert server.node is not None
        pub = WsClient(server.ports["http"], encoding)
        not_a_frame = b"{not json" if encoding == "json" else b"\xc1"
        before = [_publish(10 + i, "/fatal/a", "x", encoding) for i in range(50)]
        pub.send([*before, not_a_frame, _publish(99, "/fatal/a", "never", encoding)])
        err = pub.read()
        assert err["op"] == "error" and err["code"] == 4000, err
        assert pub.read() == {"op": "close", "code": 4000}
        pub.close()
        page = asyncio.run_coroutine_threadsafe(
            server.node.read_channel("/fatal/a", since=0, limit=100), loop
        ).result(WAIT)
        assert len(page.events) <= 50 and all(e.payload == b"x" for e in page.events)

    _run(tmp_path, test)


def test_a_burst_is_taken_a_run_at_a_time(tmp_path: Path) -> None:
    """A burst that arrives in few reads is taken a run of ``RUN_MAX`` publishes at a time, one node call
    each, and the loop runs other work between them (this run's commit, its replies, other connections), as
    over TCP; it was one node call and one commit per read's messages, some thousands.

    The node calls and the loop's turns are checked, not the writer's commit count: a read's last run is
    usually shorter, and when the next read's frames are parsed already (a burst comes in more reads on a
    loaded machine) it shares a commit with the next run, so the count depended on the load."""
    n = 20 * RUN_MAX

    def test(server: Server, loop: asyncio.AbstractEventLoop) -> None:
        node = server.node
        assert node is not None
        pub = WsClient(server.ports["http"], "json")
        pub.send([_publish(0, "/runs/a", "first", "json")])
        assert pub.read()["seq"] == 1
        # Each node call of the burst (a run, or a publish taken alone once the connection's in-flight
        # window is full: how many depends on how far the writer thread is behind), and a loop turn
        # scheduled from each run's call: a turn the loop ran before the next run was taken shows between
        # the two calls.
        steps: list[tuple[str, int]] = []
        submit_many, submit_run, submit = node.submit_many, node.submit_run, node.submit

        def taken(size: int) -> None:
            i = sum(1 for kind, _ in steps if kind == "run")
            steps.append(("run", size))
            loop.call_soon(steps.append, ("turn", i))

        def many(
            requests: list[AppendRequest], origin: Session, done: Done, done_many: DoneMany | None = None
        ) -> None:
            taken(len(requests))
            submit_many(requests, origin, done, done_many)

        def whole(run: AppendRun, origin: Session, done: Done, done_many: DoneMany) -> None:
            taken(len(run.payloads))
            submit_run(run, origin, done, done_many)

        def alone(
            request: AppendRequest,
            origin: Session | None = None,
            done: Done | None = None,
            identity: Identity | None = None,
        ) -> None:
            steps.append(("alone", 1))
            submit(request, origin, done, identity)

        # Attributes (the parts' bound methods), looked up at each call.
        node.submit_many = many
        node.submit_run = whole
        node.submit = alone
        try:
            pub.send([_publish(10 + i, "/runs/a", f"e{i}", "json") for i in range(n)])
            replies = [pub.read() for _ in range(n)]
        finally:
            node.submit_many, node.submit_run, node.submit = submit_many, submit_run, submit
        assert [r["id"] for r in replies] == [10 + i for i in range(n)]
        assert [r["seq"] for r in replies] == list(range(2, n + 2))
        assert sum(size for kind, size in steps if kind != "turn") == n, steps
        runs = [(i, size) for i, (kind, size) in enumerate(steps) if kind == "run"]
        assert runs and all(size <= RUN_MAX for _, size in runs), steps
        # A full run is followed by a loop turn before the next run is taken (a shorter one ends what one
        # read brought: the next read's frames may already be parsed, and are taken in that turn).
        for k, (at, size) in enumerate(runs[:-1]):
            if size == RUN_MAX:
                assert ("turn", k) in steps[at + 1 : runs[k + 1][0]], (k, steps)
        pub.close()

    _run(tmp_path, test)
