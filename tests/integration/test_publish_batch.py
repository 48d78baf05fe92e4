"""``publish_batch`` against a real server process (docs/native.md "Batched publishes"): duplicates inside a
batch and of earlier batches answered with the original seq, mixed channels with per-channel seqs, a
refused batch appending nothing, subscribers getting every row in order, the bulk publisher's resend after
a dropped connection, and its fallback to ``publish`` frames on a server without the op."""

from __future__ import annotations

import json
import socket
import struct
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from hubbub.client import Client
from hubbub.client.bulk import BulkPublisher
from hubbub.errors import PublishRefused
from hubbub.events import Event
from tests.integration.serverproc import ServerProcess
from tests.integration.test_bulk_publisher import Relay, http, log_of, tcp


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # A send queue that holds the whole of a test's stream: the SSE reader is a thread of this process, which
    # on a busy machine may lag the publisher's windows by more than the default 1,024 frames, and would then
    # be closed as a slow consumer (that policy is tests/integration/test_backpressure.py's to check).
    extra = ["--limits-send-queue", "8192"]
    proc = ServerProcess(tmp_path_factory.mktemp("batch") / "server", extra=extra).start()
    try:
        yield proc
    finally:
        proc.terminate()


class Raw:
    """A native TCP msgpack connection, one frame at a time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        assert self.call({"op": "hello", "id": 0, "v": 1})["op"] == "reply"

    def send(self, obj: dict[str, Any]) -> None:
        body = msgpack.packb(obj, use_bin_type=True)
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def recv(self) -> dict[str, Any]:
        while len(self.buf) < 4 or len(self.buf) < 4 + struct.unpack_from(">I", self.buf)[0]:
            data = self.sock.recv(1 << 16)
            assert data, "closed by the server"
            self.buf += data
        (n,) = struct.unpack_from(">I", self.buf)
        body, self.buf = self.buf[4 : 4 + n], self.buf[4 + n :]
        out: dict[str, Any] = msgpack.unpackb(body, raw=False)
        return out

    def call(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.send(obj)
        return self.recv()

    def close(self) -> None:
        self.sock.close()


def batch(rid: int, channels: list[str], keys: list[str | None], **extra: Any) -> dict[str, Any]:
    return {
        "op": "publish_batch",
        "id": rid,
        "channels": channels,
        "payloads": [f"{c}|{k}".encode() for c, k in zip(channels, keys, strict=True)],
        "idems": keys,
        "ack": True,
        **extra,
    }


def test_duplicates_inside_a_batch_and_of_earlier_batches(server: ServerProcess) -> None:
    raw = Raw(server.ports["native"])
    try:
        r = raw.call(batch(1, ["/pb/d"] * 4, ["a", "b", "a", None]))
        assert r["id"] == 1 and r["count"] == 4
        # "a" repeated inside the batch: answered with the first "a"'s event, not appended.
        assert r["seqs"] == [1, 2, 1, 3] and r["duplicates"] == [2]
        assert len(set(r["epochs"])) == 1 and r["times"][2] == r["times"][0]
        # A later batch repeating "b" (and a plain publish repeating "a"): their original seqs.
        r2 = raw.call(batch(2, ["/pb/d"] * 3, ["c", "b", "d"]))
        assert r2["seqs"] == [4, 2, 5] and r2["duplicates"] == [1] and r2["times"][1] == r["times"][1]
        r3 = raw.call(
            {"op": "publish", "id": 3, "channel": "/pb/d", "payload": b"x", "idem": "a", "ack": True}
        )
        assert r3["seq"] == 1 and r3["duplicate"] is True
    finally:
        raw.close()
    assert [e["text"] for e in log_of(server, "/pb/d")] == [
        "/pb/d|a",
        "/pb/d|b",
        "/pb/d|None",
        "/pb/d|c",
        "/pb/d|d",
    ]


def test_json_lines_batch_over_tcp(server: ServerProcess) -> None:
    """The JSON form (texts / b64s; times as strings) over the TCP listener's JSON lines."""
    sock = socket.create_connection(("127.0.0.1", server.ports["native"]), timeout=10)
    lines = sock.makefile("rb")
    try:

        def call(obj: dict[str, Any]) -> dict[str, Any]:
            sock.sendall(json.dumps(obj).encode() + b"\n")
            out: dict[str, Any] = json.loads(lines.readline())
            return out

        assert call({"op": "hello", "id": 0, "v": 1})["op"] == "reply"
        r = call(
            {
                "op": "publish_batch",
                "id": 1,
                "channel": "/pb/j",
                "texts": ["a", "b"],
                "idems": ["j1", "j2"],
                "ack": True,
            }
        )
        assert (r["count"], r["seqs"]) == (2, [1, 2]) and all(type(t) is str for t in r["times"])
        r = call(
            {
                "op": "publish_batch",
                "id": 2,
                "channel": "/pb/j",
                "b64s": ["AP8=", "YQ=="],
                "idems": ["j3", "j1"],
                "ack": True,
            }
        )
        assert r["seqs"] == [3, 1] and r["duplicates"] == [1]
    finally:
        lines.close()
        sock.close()
    events = log_of(server, "/pb/j")
    assert [e["content_type"] for e in events] == ["text/plain; charset=utf-8"] * 2 + [
        "application/octet-stream"
    ]
    assert events[2]["b64"] == "AP8="


def test_mixed_channels_get_per_channel_seqs_in_row_order(server: ServerProcess) -> None:
    raw = Raw(server.ports["native"])
    chans = ["/pb/m/x", "/pb/m/y", "/pb/m/x", "/pb/m/z", "/pb/m/y", "/pb/m/x"]
    try:
        r = raw.call(batch(7, chans, [f"k{i}" for i in range(6)], headers=[{"i": str(i)} for i in range(6)]))
    finally:
        raw.close()
    assert r["seqs"] == [1, 1, 2, 1, 2, 3] and "duplicates" not in r
    x = log_of(server, "/pb/m/x")
    assert [e["text"] for e in x] == ["/pb/m/x|k0", "/pb/m/x|k2", "/pb/m/x|k5"]
    assert [e["headers"] for e in x] == [{"i": "0"}, {"i": "2"}, {"i": "5"}]
    assert x[1]["publisher"]["msg_id"] == "k2"  # the key, as a publish's


def test_a_refused_batch_appends_nothing_and_the_connection_goes_on(server: ServerProcess) -> None:
    raw = Raw(server.ports["native"])
    try:
        bad = batch(1, ["/pb/r", "/pb/r"], ["r1", "r2"], headers=[{}, {":pseudo": "v"}])
        err = raw.call(bad)
        assert (err["op"], err["id"], err["code"]) == ("error", 1, 4001)
        unknown_len = raw.call({**batch(2, ["/pb/r"], ["r3"]), "idems": ["r3", "r4"]})
        assert (unknown_len["op"], unknown_len["id"]) == ("error", 2)
        ok = raw.call(batch(3, ["/pb/r"], ["r1"]))
        assert ok["seqs"] == [1] and "duplicates" not in ok  # r1 of the refused batch was never stored
        raw.send({**batch(4, ["/pb/r"] * 2, ["r5", "r6"]), "ack": False})  # no reply when not asked
        assert raw.call({"op": "ping", "id": 5}) == {"op": "pong", "id": 5}
    finally:
        raw.close()
    assert [e["seq"] for e in log_of(server, "/pb/r")] == [1, 2, 3]


def test_bulk_publisher_names_the_refused_row(server: ServerProcess) -> None:
    bad = "/pb/" + "x" * 2000  # over limits.max_channel_bytes
    chans = ["/pb/ok"] * 5 + [bad] + ["/pb/ok"] * 4
    with BulkPublisher(tcp(server), window=64) as pub, pytest.raises(PublishRefused) as info:
        pub.publish_many(chans, [b"x"] * 10, [f"r{i}" for i in range(10)], [""] * 10, [None] * 10, [[]] * 10)
        pub.flush()
    assert info.value.code == 4004 and info.value.channel == bad and info.value.idem == "r5"
    assert log_of(server, "/pb/ok") == []  # the batch was refused whole


def test_subscribers_get_every_row_in_order(server: ServerProcess) -> None:
    """Live fan-out of batches: a native subscriber and an SSE stream see each row once, in order."""
    n = 3000
    got: list[tuple[int, bytes]] = []
    sse: list[int] = []
    with Client(tcp(server)) as client, client.subscribe("/pb/live") as sub:
        ready = threading.Event()

        def read_sse() -> None:
            url = f"{http(server)}/api/v1/stream/pb/live"
            with urllib.request.urlopen(url, timeout=20) as resp:
                ready.set()
                for line in resp:
                    if line.startswith(b"data:"):
                        sse.append(int(json.loads(line[5:])["seq"]))
                        if len(sse) == n:
                            return

        t = threading.Thread(target=read_sse, daemon=True)
        t.start()
        assert ready.wait(10)
        with BulkPublisher(tcp(server), window=512, keep_acks=False) as pub:
            for at in range(0, n, 1000):
                rows = range(at, at + 1000)
                pub.publish_many(
                    ["/pb/live"] * 1000,
                    [str(i).encode() for i in rows],
                    [f"live-{i}" for i in rows],
                    [""] * 1000,
                    [None] * 1000,
                    [[]] * 1000,
                )
            pub.flush()
        assert pub.batches and pub.published == n
        for item in sub:
            assert isinstance(item, Event), item
            got.append((item.seq, item.payload))
            if len(got) == n:
                break
        t.join(20)
    assert got == [(i + 1, str(i).encode()) for i in range(n)]
    assert sse == list(range(1, n + 1))


def test_bulk_batches_over_a_dropped_connection_append_each_row_once(server: ServerProcess) -> None:
    relay = Relay(server.ports["native"], cut_after=120_000)  # mid-batch
    n = 6000
    keys = [f"drop-{i}" for i in range(n)]
    chans = [f"/pb/drop/{i % 2}" for i in range(n)]
    try:
        with BulkPublisher(relay.address, window=2048, keep_acks=False) as pub:
            pub.publish_many(
                chans, [k.encode() for k in keys], keys, [""] * n, [{"s": k} for k in keys], [[]] * n
            )
            pub.flush()
    finally:
        relay.close()
    assert relay.cuts == 1 and pub.reconnects == 1 and pub.resent > 0 and pub.batches
    assert pub.published + pub.duplicates == n
    assert pub.tops == {"/pb/drop/0": n // 2, "/pb/drop/1": n // 2}
    events = log_of(server, "/pb/drop/0") + log_of(server, "/pb/drop/1")
    # Each exactly once: rows whose batch was committed before the cut came back as duplicates.
    assert sorted(e["text"] for e in events) == sorted(keys)


class OldServer:
    """A native TCP server from before ``publish_batch``: answers it with 4002 unknown op, and each
    ``publish`` with its reply (seqs counted per channel)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.ops: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self.listener:
            conn, _ = self.listener.accept()
        buf = b""
        seqs: dict[str, int] = {}
        with conn:
            while True:
                data = conn.recv(1 << 16)
                if not data:
                    return
                buf += data
                out = b""
                while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">I", buf)[0]:
                    (n,) = struct.unpack_from(">I", buf)
                    f = msgpack.unpackb(buf[4 : 4 + n], raw=False)
                    buf = buf[4 + n :]
                    self.ops.append(f["op"])
                    if f["op"] == "hello":
                        r: dict[str, Any] = {
                            "op": "reply",
                            "id": f["id"],
                            "v": 1,
                            "limits": {"max_frame": 1 << 20},
                        }
                    elif f["op"] == "publish":
                        seqs[f["channel"]] = seqs.get(f["channel"], 0) + 1
                        r = {"op": "reply", "id": f["id"], "channel": f["channel"], "seq": seqs[f["channel"]]}
                        r.update(epoch="e", time=1)
                    else:
                        r = {"op": "error", "id": f["id"], "code": 4002, "message": "unknown op"}
                        r["temporary"] = False
                    body = msgpack.packb(r, use_bin_type=True)
                    out += struct.pack(">I", len(body)) + body
                conn.sendall(out)


def test_bulk_publisher_falls_back_to_publish_frames_on_an_older_server() -> None:
    old = OldServer()
    n = 700
    with BulkPublisher(old.url, window=128, keep_acks=True) as pub:
        pub.publish_many(["/o"] * n, [b"x"] * n, [f"k{i}" for i in range(n)], [""] * n, [None] * n, [[]] * n)
        pub.publish_many(["/o"] * 5, [b"y"] * 5, [f"j{i}" for i in range(5)], [""] * 5, [None] * 5, [[]] * 5)
        pub.flush()
    assert not pub.batches
    assert [a.seq for a in pub.acks] == list(range(1, n + 6)) and pub.published == n + 5
    assert pub.pending == 0
    assert old.ops.count("publish") == n + 5 and 1 <= old.ops.count("publish_batch") <= 128 // 32
