"""End to end against a real server process: acknowledged events survive kill -9; bad input never kills it."""

from __future__ import annotations

import json
import socket
import struct
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from .serverproc import ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        yield srv
    finally:
        srv.kill()


class Lines:
    """A native TCP JSON-lines connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(self, obj: object) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self) -> dict[str, object]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        obj = json.loads(line)
        assert isinstance(obj, dict)
        return obj

    def close(self) -> None:
        self.sock.close()


def _hello(port: int) -> Lines:
    c = Lines(port)
    c.send({"op": "hello", "id": 1, "v": 1})
    assert c.recv()["op"] == "reply"
    return c


def _http_json(port: int, path: str) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        obj = json.loads(resp.read())
        assert isinstance(obj, dict)
        return obj


@pytest.mark.slow
def test_kill_9_loses_no_acknowledged_event(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = ServerProcess(data).start()
    acked: dict[int, str] = {}
    try:
        c = _hello(srv.ports["native"])
        # Pipeline publishes; read acks as they come; kill the server mid-stream.
        total = 3000
        payload = "x" * 100
        sent = 0
        killed = False
        c.sock.settimeout(10)
        while sent < total:
            batch = b"".join(
                json.dumps(
                    {
                        "op": "publish",
                        "id": 10 + i,
                        "channel": "/crash/c",
                        "text": f"{i}:{payload}",
                        "ack": True,
                    }
                ).encode()
                + b"\n"
                for i in range(sent, min(sent + 200, total))
            )
            c.sock.sendall(batch)
            sent = min(sent + 200, total)
            while len(acked) < sent - 100:
                r = c.recv()
                if r.get("op") == "reply":
                    seq = r["seq"]
                    assert isinstance(seq, int), r
                    acked[seq] = str(r["id"])
            if sent >= total // 2 and not killed:
                srv.kill()
                killed = True
                break
        c.close()
    finally:
        srv.kill()
    assert killed and acked, "the test must have received acknowledgements before the kill"
    srv2 = ServerProcess(data).start()
    try:
        got: dict[int, str] = {}
        since = 0
        while True:
            page = _http_json(srv2.ports["http"], f"/api/v1/log/crash/c?since={since}&limit=1000")
            events = page["events"]
            assert isinstance(events, list)
            if not events:
                break
            for e in events:
                got[e["seq"]] = e["text"]
            since = events[-1]["seq"]
        for seq, req_id in acked.items():
            assert seq in got, f"acknowledged seq {seq} lost after kill -9"
            assert got[seq].split(":", 1)[0] == str(int(req_id) - 10)
        assert sorted(got) == list(range(1, len(got) + 1)), "no gaps in the recovered log"
    finally:
        srv2.kill()


BAD_INPUTS: list[bytes] = [
    b"{not json}\n",
    b'{"op":"hello","id":1,"v":1}\n{"op":"nope","id":2}\n',
    b'{"op":"hello","id":1,"v":1}\n{"op":"publish","id":2,"channel":"nope","text":"x"}\n',
    b'{"op":"hello","id":1,"v":1}\n{"op":"publish","id":2,"channel":"/a%FF","text":"x"}\n',
    b'{"op":"hello","id":1,"v":1}\n{"op":"subscribe","id":2,"sub":"s","pattern":"/a/**/b"}\n',
    b"\xff\xfe\xfd garbage",
    b"\x00\xff\xff\xff\xff",
    b"\x00\x00\x00\x05\xc1\xc1\xc1\xc1\xc1",
    b"{" + b"x" * (2 << 20),
    b'{"op":"hello","id":1,"v":1}\n' + b'{"op":"publish","id":2,"channel":"/big","text":"' + b"y" * (2 << 20),
]


def test_bad_input_never_kills_the_server(server: ServerProcess) -> None:
    port = server.ports["native"]
    for data in BAD_INPUTS:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            s.settimeout(5)
            while s.recv(65536):
                pass
        except OSError:
            pass  # the server may reset a connection it refused mid-upload
        finally:
            s.close()
        assert server.alive, f"server died on {data[:40]!r}:\n{server.log()}"
    # Still serving: an acknowledged publish and a read back.
    c = _hello(port)
    c.send({"op": "publish", "id": 2, "channel": "/still/here", "text": "ok", "ack": True})
    r = c.recv()
    assert r["op"] == "reply" and r["seq"] == 1
    c.close()
    assert _http_json(server.ports["http"], "/healthz") == {"status": "ok"}


def test_msgpack_tcp_framing(server: ServerProcess) -> None:
    import msgpack

    s = socket.create_connection(("127.0.0.1", server.ports["native"]), timeout=10)
    try:

        def send(obj: object) -> None:
            body = msgpack.packb(obj, use_bin_type=True)
            s.sendall(struct.pack(">I", len(body)) + body)

        def recv() -> dict[str, object]:
            head = b""
            while len(head) < 4:
                head += s.recv(4 - len(head))
            (n,) = struct.unpack(">I", head)
            body = b""
            while len(body) < n:
                body += s.recv(n - len(body))
            obj = msgpack.unpackb(body, raw=False)
            assert isinstance(obj, dict)
            return obj

        send({"op": "hello", "id": 1, "v": 1})
        assert recv()["op"] == "reply"
        send({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/m/**"})
        assert recv()["sub"] == "s"
        send({"op": "publish", "id": 3, "channel": "/m/x", "payload": b"\x00\xff", "ack": True})
        reply = recv()
        assert reply["seq"] == 1 and isinstance(reply["time"], int)
        ev = recv()
        assert ev["op"] == "event" and ev["payload"] == b"\x00\xff" and ev["subs"] == ["s"]
    finally:
        s.close()


def test_sigterm_is_a_clean_shutdown(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = ServerProcess(data).start()
    try:
        c = _hello(srv.ports["native"])
        for i in range(50):
            c.send({"op": "publish", "id": 2 + i, "channel": "/t", "text": str(i), "ack": i == 49})
        assert c.recv()["seq"] == 50
        assert srv.terminate() == 0
        c.close()
    finally:
        srv.kill()
    srv2 = ServerProcess(data).start()
    try:
        page = _http_json(srv2.ports["http"], "/api/v1/log/t?limit=1000")
        events = page["events"]
        assert isinstance(events, list), page
        assert page["top"] == 50 and len(events) == 50
    finally:
        srv2.kill()
