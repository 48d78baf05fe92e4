"""hubbub.client.bulk.BulkPublisher against a real server process: pipelined acknowledged publishes over
native TCP and the WebSocket route, idempotent resends after a connection is cut uncleanly, refused publishes.

The server is a real ``hubbub serve`` child process on loopback ports (``ServerProcess``); a connection is
cut by a real TCP relay that resets both sides (SO_LINGER 0) after a number of bytes.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.client import ConnectionLost
from hubbub.client.bulk import BulkPublisher
from hubbub.client.framing import Framing, ws_frame
from hubbub.errors import BadFrame, FrameTooLarge, PublishRefused
from hubbub.ws_frames import FrameParser
from tests.hypothesis_budget import examples
from tests.integration.serverproc import ServerProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("bulk") / "server").start()
    try:
        yield proc
    finally:
        proc.terminate()


def tcp(proc: ServerProcess) -> str:
    return f"tcp://127.0.0.1:{proc.ports['native']}"


def http(proc: ServerProcess) -> str:
    return f"http://127.0.0.1:{proc.ports['http']}"


def log_of(proc: ServerProcess, channel: str) -> list[dict[str, Any]]:
    """The events of ``channel``'s log as the HTTP API answers them (JSON objects)."""
    out: list[dict[str, Any]] = []
    since = 0
    while True:
        q = urllib.parse.urlencode({"since": since, "limit": 1000})
        with urllib.request.urlopen(f"{http(proc)}/api/v1/log{channel}?{q}", timeout=10) as resp:
            events = json.loads(resp.read())["events"]
        out.extend(events)
        if len(events) < 1000:
            return out
        since = int(events[-1]["seq"])


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_pipelined_publishes_are_acknowledged_in_order(server: ServerProcess, transport: str) -> None:
    url = tcp(server) if transport == "tcp" else http(server)
    ch = f"/bulk/{transport}"
    n = 3000
    with BulkPublisher(url, window=64) as pub:
        for i in range(n):
            pub.publish(ch, f"p{i}".encode(), idem=f"{transport}-{i}", headers={"n": str(i)}, tags=["t"])
            assert pub.pending <= 64  # the window bounds what is unacknowledged
        pub.flush()
        assert pub.pending == 0
    assert [a.seq for a in pub.acks] == list(range(1, n + 1))
    assert not any(a.duplicate for a in pub.acks)
    events = log_of(server, ch)
    assert [e["text"] for e in events] == [f"p{i}" for i in range(n)]
    assert events[5]["headers"] == {"n": "5"} and events[5]["tags"] == ["t"]
    assert events[5]["content_type"] == "application/octet-stream"
    # The same keys again: acknowledged as duplicates, nothing appended.
    with BulkPublisher(url, window=256) as pub:
        for i in range(n):
            pub.publish(ch, f"p{i}".encode(), idem=f"{transport}-{i}")
        pub.flush()
    assert all(a.duplicate for a in pub.acks) and len(pub.acks) == n
    assert len(log_of(server, ch)) == n


class Relay:
    """A TCP relay to ``port`` that resets both sides once ``cut_after`` client bytes went through (the
    first connection only); later connections are relayed whole."""

    def __init__(self, port: int, cut_after: int) -> None:
        self.port = port
        self.cut_after = cut_after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.cuts = 0
        self.connections = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.port))
            limit = self.cut_after if self.connections == 1 else None
            threading.Thread(target=self._pump, args=(client, upstream, limit), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        done = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if limit is not None and done + len(data) >= limit:
                    dst.sendall(data[: limit - done])
                    self.cuts += 1
                    for s in (src, dst):  # an unclean end: RST, not FIN
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        s.close()
                    return
                done += len(data)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):  # wakes the other direction's pump
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        src.close()  # each socket is closed by the pump that reads it, once its recv has returned

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


def test_cut_connection_resends_unacknowledged_and_nothing_twice(server: ServerProcess) -> None:
    relay = Relay(server.ports["native"], cut_after=60_000)  # mid-stream, mid-frame
    ch = "/bulk/cut"
    n = 2000
    try:
        with BulkPublisher(relay.address, window=512) as pub:
            for i in range(n):
                pub.publish(ch, f"p{i}".encode(), idem=f"cut-{i}")
            pub.flush()
    finally:
        relay.close()
    assert relay.cuts == 1 and pub.reconnects == 1 and pub.resent > 0
    assert len(pub.acks) == n  # every publish acknowledged once: new or duplicate
    events = log_of(server, ch)
    assert [e["seq"] for e in events] == list(range(1, n + 1))
    assert sorted(e["text"] for e in events) == sorted(f"p{i}" for i in range(n))  # each exactly once


@pytest.mark.parametrize("transport", ["tcp", "ws"])
def test_publish_many_over_a_cut_connection_tallies_each_publish_once(
    server: ServerProcess, transport: str
) -> None:
    """publish_many sends publish_batch frames (resent with new ids after a cut: the id is appended to a
    frame packed once); without kept acks the tallies count each publish once, new or duplicate."""
    relay = Relay(server.ports["native"], cut_after=50_000)
    url = relay.address if transport == "tcp" else http(server)
    chs = [f"/bulk/many/{transport}/{i % 3}" for i in range(3000)]
    keys = [f"many-{transport}-{i}" for i in range(3000)]
    headers = [{"n": str(i)} if i % 2 else {} for i in range(3000)]
    tags = [["t"] if i % 5 == 0 else [] for i in range(3000)]
    try:
        with BulkPublisher(url, window=256, keep_acks=False) as pub:
            for at in range(0, 3000, 700):  # columns of odd lengths
                part = slice(at, at + 700)
                cts = ["text/x"] * len(chs[part])
                payloads = [k.encode() for k in keys[part]]
                pub.publish_many(chs[part], payloads, keys[part], cts, headers[part], tags[part])
            pub.flush()
    finally:
        relay.close()
    assert pub.acks == [] and pub.published + pub.duplicates == 3000
    assert pub.tops == {f"/bulk/many/{transport}/{j}": 1000 for j in range(3)}
    if transport == "tcp":
        assert relay.cuts == 1 and pub.reconnects == 1 and pub.resent > 0
    events = [e for j in range(3) for e in log_of(server, f"/bulk/many/{transport}/{j}")]
    assert len(events) == 3000 and pub.published == 3000 - pub.duplicates
    by_key = {e["text"]: e for e in events}
    assert sorted(by_key) == sorted(keys)  # each exactly once
    e = by_key[keys[5]]
    assert (e["headers"], e["tags"], e["content_type"]) == ({"n": "5"}, ["t"], "text/x")
    assert by_key[keys[4]]["headers"] == {} and by_key[keys[4]]["tags"] == []
    # Again: all duplicates, tallied as such.
    with BulkPublisher(tcp(server), window=256, keep_acks=False) as again:
        again.publish_many(chs, [k.encode() for k in keys], keys, ["text/x"] * 3000, headers, tags)
        again.flush()
    assert (again.published, again.duplicates) == (0, 3000)


def test_cut_connection_without_idem_is_reported(server: ServerProcess) -> None:
    relay = Relay(server.ports["native"], cut_after=20_000)
    try:
        with pytest.raises(ConnectionLost), BulkPublisher(relay.address, window=512) as pub:
            for i in range(2000):
                pub.publish("/bulk/noidem", f"p{i}".encode())
            pub.flush()
    finally:
        relay.close()


def test_refused_publish_names_channel_and_error(server: ServerProcess) -> None:
    bad = "/bulk/" + "x" * 2000  # over limits.max_channel_bytes
    with BulkPublisher(tcp(server), window=16) as pub:
        pub.publish("/bulk/ok", b"1", idem="ok-1")
        with pytest.raises(PublishRefused) as info:
            pub.publish(bad, b"2", idem="bad-1")
            pub.flush()
    assert info.value.code == 4004 and info.value.channel == bad
    assert f"publishing to {bad}: 4004" in str(info.value)
    # Over the server's max_frame: refused before sending, with the frame-too-large code.
    with BulkPublisher(tcp(server)) as pub, pytest.raises(PublishRefused) as big:
        pub.publish("/bulk/big", b"x" * (2 << 20), idem="big")
    assert big.value.code == 4003


def test_closed_port_cannot_connect(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(ConnectionError):
        BulkPublisher(f"tcp://127.0.0.1:{port}", timeout=5)


# -- the framing parser -----------------------------------------------------------------------------------


def _messages(ws: bool, bodies: list[bytes]) -> bytes:
    if ws:  # server frames are not masked
        out = b""
        for b in bodies:
            n = len(b)
            head = bytes([0x82, n]) if n < 126 else bytes([0x82, 126]) + struct.pack(">H", n)
            out += head + b
        return out
    return b"".join(struct.pack(">I", len(b)) + b for b in bodies)


@settings(max_examples=examples(200), deadline=None)
@given(
    ws=st.booleans(),
    bodies=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=10),
)
def test_framing_does_not_depend_on_chunking(ws: bool, bodies: list[bytes], cuts: list[int]) -> None:
    data = _messages(ws, bodies)
    f = Framing("ws" if ws else "length", 1 << 20)
    got: list[bytes] = []
    at = 0
    for c in [*sorted({c for c in cuts if c < len(data)}), len(data)]:
        got += f.feed(data[at:c])
        at = c
    assert got == bodies


@settings(max_examples=examples(300), deadline=None)
@given(ws=st.booleans(), data=st.binary(max_size=600))
def test_framing_accepts_or_rejects_any_bytes(ws: bool, data: bytes) -> None:
    f = Framing("ws" if ws else "length", 256)
    try:
        for body in f.feed(data):
            assert len(body) <= 256
    except (FrameTooLarge, BadFrame):
        pass


def test_ws_frames_are_masked_and_round_trip() -> None:
    body = msgpack.packb({"op": "publish", "payload": b"\x00" * 300})
    frame = ws_frame(0x2, body)
    assert frame[1] & 0x80  # masked, as client frames must be
    server_side = FrameParser(1 << 20)
    server_side.feed(frame)
    assert server_side.next() == (0x2, body)  # the server's parser unmasks
    with pytest.raises(BadFrame):  # a client fails a masked frame from the server (RFC 6455 §5.1)
        Framing("ws", 1 << 20).feed(frame)
    f = Framing("ws", 1 << 20)
    f.feed(bytes([0x89, 0x02]) + b"hi")  # a ping: answered with a pong frame
    assert f.control[:1] == b"\x8a"
