"""Idle native connections: keepalive from one shared timer (native.md §2), codecs shared per encoding, and
a bounded per-connection footprint."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import orjson
import uvloop

from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports.native import Keepalive, NativeConnection

WAIT = 10.0


def _server(tmp_path: Path, ping_interval: float = 25.0) -> Server:
    cli = {
        "data_dir": str(tmp_path / "d"),
        "store": "memory",
        "durability": "none",
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "native.ping_interval_s": str(ping_interval),
    }
    return Server(load_config(cli=cli, env={}))


def _url(server: Server) -> str:
    return f"ws://127.0.0.1:{server.ports['http']}/ws/hubbub"


async def _recv(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await asyncio.wait_for(ws.receive(), WAIT)
    if msg.type == aiohttp.WSMsgType.TEXT:
        out: dict[str, Any] = json.loads(msg.data)
        return out
    if msg.type == aiohttp.WSMsgType.BINARY:
        out = msgpack.unpackb(msg.data)
        return out
    assert msg.type == aiohttp.WSMsgType.CLOSE, msg
    return {"closed": msg.data}


async def _hello(
    http: aiohttp.ClientSession, url: str, encoding: str = "json"
) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(url, protocols=[f"hubbub.v1.{encoding}"], autoping=True)
    await _send(ws, {"op": "hello", "id": 1, "v": 1})
    assert (await _recv(ws))["op"] == "reply"
    return ws


async def _send(ws: aiohttp.ClientWebSocketResponse, obj: dict[str, Any]) -> None:
    if ws.protocol == "hubbub.v1.msgpack":
        await ws.send_bytes(msgpack.packb(obj, use_bin_type=True))
    else:
        await ws.send_str(json.dumps(obj))


def test_a_silent_ws_client_is_pinged_then_closed_with_4304(tmp_path: Path) -> None:
    async def main() -> None:
        async with _server(tmp_path, 0.1) as server, aiohttp.ClientSession() as http:
            ws = await _hello(http, _url(server))
            frames = []
            while True:
                f = await _recv(ws)
                frames.append(f)
                if f.get("op") != "ping":
                    break
            # Pings while silent, then the timeout error and the close with its code (native.md §2, §7).
            assert len(frames) >= 2 and all(f == {"op": "ping"} for f in frames[:-1]), frames
            assert frames[-1]["op"] == "error" and frames[-1]["code"] == 4304, frames
            assert (await _recv(ws))["closed"] == 4304

    asyncio.run(main())


def test_a_ws_client_that_only_publishes_is_not_silent(tmp_path: Path) -> None:
    """Publishes count as traffic: a client that publishes (acked or not) and never answers a ping stays open
    well past three ping intervals. Paced by the server's pings: each comes at least one interval after the
    server's last frame, and the client answers it with a publish only."""

    async def main() -> None:
        async with _server(tmp_path, 0.1) as server, aiohttp.ClientSession() as http:
            for ack in (True, False):
                ws = await _hello(http, _url(server))
                pings = 0
                i = 1
                while pings < 8:  # eight ping intervals at least, with no pong
                    f = await _recv(ws)
                    if f.get("op") == "ping":
                        pings += 1
                        i += 1
                        await _send(ws, {"op": "publish", "id": i, "channel": "/p", "text": "x", "ack": ack})
                    else:
                        assert ack and f.get("op") == "reply" and f["id"] == i, f
                await _send(ws, {"op": "publish", "id": 99, "channel": "/p", "text": "x", "ack": True})
                while (f := await _recv(ws)).get("id") != 99:
                    assert f.get("op") in ("reply", "ping"), f
                assert not ws.closed
                await ws.close()

    asyncio.run(main())


def test_a_ws_client_that_never_says_hello_times_out_unpinged(tmp_path: Path) -> None:
    async def main() -> None:
        async with _server(tmp_path, 0.1) as server, aiohttp.ClientSession() as http:
            ws = await http.ws_connect(_url(server), protocols=["hubbub.v1.json"])
            first = await _recv(ws)
            assert first["op"] == "error" and first["code"] == 4304, first  # no ping before hello
            assert (await _recv(ws))["closed"] == 4304

    asyncio.run(main())


def test_pongs_keep_ws_and_tcp_connections_open_on_one_timer(tmp_path: Path) -> None:
    async def main() -> None:
        async with _server(tmp_path, 0.1) as server, aiohttp.ClientSession() as http:
            ka = Keepalive.for_interval(0.1)
            ws = await _hello(http, _url(server), "msgpack")
            reader, writer = await asyncio.open_connection("127.0.0.1", server.ports["native"])
            writer.write(b'{"op":"hello","id":1,"v":1}\n')
            assert orjson.loads(await asyncio.wait_for(reader.readline(), WAIT))["op"] == "reply"
            # Both transports' connections share the loop's keepalive (joined at hello, before its reply).
            assert len(ka) == 2

            # Six pings each, answered: well past three silent intervals, and still open.
            for _ in range(6):
                assert await _recv(ws) == {"op": "ping"}
                await _send(ws, {"op": "pong"})
                line = await asyncio.wait_for(reader.readline(), WAIT)
                assert orjson.loads(line) == {"op": "ping"}
                writer.write(b'{"op":"pong"}\n')
            await _send(ws, {"op": "publish", "id": 2, "channel": "/alive", "payload": b"y", "ack": True})
            while (reply := await _recv(ws))["op"] == "ping":
                pass
            assert reply["op"] == "reply" and reply["id"] == 2, reply

            # The timer runs only while there are connections.
            await ws.close()
            writer.close()
            await writer.wait_closed()
            await asyncio.wait_for(ka.wait_empty(), WAIT)
            assert ka._handle is None

    asyncio.run(main())


def test_ws_connections_share_one_codec_per_encoding(tmp_path: Path) -> None:
    async def main() -> None:
        async with _server(tmp_path) as server, aiohttp.ClientSession() as http:
            url = _url(server)
            a = await _hello(http, url, "msgpack")
            b = await _hello(http, url, "msgpack")
            c = await _hello(http, url, "json")
            ka = Keepalive.for_interval(25.0)
            assert len(ka) == 3  # joined at hello, before its reply
            conns: list[NativeConnection] = list(ka)
            mp = [x for x in conns if x.codec.encoding == "msgpack"]
            js = [x for x in conns if x.codec.encoding == "json"]
            assert len(mp) == 2 and len(js) == 1
            assert mp[0].codec is mp[1].codec and mp[0].session.encoder is mp[1].session.encoder
            assert js[0].codec is not mp[0].codec

            # Interleaved use of the shared codecs: each connection still gets its own, correct frames.
            for ws in (a, c):
                await _send(ws, {"op": "subscribe", "id": 5, "sub": "s", "pattern": "/shared/**"})
                assert (await _recv(ws))["op"] == "reply"
            await _send(b, {"op": "publish", "id": 7, "channel": "/shared/x", "payload": b"p1", "ack": True})
            await _send(c, {"op": "publish", "id": 8, "channel": "/shared/y", "text": "p2", "ack": True})
            got_b = await _recv(b)
            assert got_b["op"] == "reply" and got_b["id"] == 7 and got_b["seq"] == 1
            got_a = [await _recv(a), await _recv(a)]
            assert [(e["channel"], e["payload"]) for e in got_a] == [
                ("/shared/x", b"p1"),
                ("/shared/y", b"p2"),
            ]
            got_c = [await _recv(c) for _ in range(3)]
            events = [f for f in got_c if f["op"] == "event"]
            replies = [f for f in got_c if f["op"] == "reply"]
            assert [(e["channel"], e["text"]) for e in events] == [("/shared/x", "p1"), ("/shared/y", "p2")]
            assert replies[0]["id"] == 8 and replies[0]["channel"] == "/shared/y"
            for ws in (a, b, c):
                await ws.close()

    asyncio.run(main())


def _mp_frame(obj: dict[str, Any]) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


async def _mp_read(reader: asyncio.StreamReader) -> dict[str, Any]:
    n = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), WAIT), "big")
    out: dict[str, Any] = msgpack.unpackb(await asyncio.wait_for(reader.readexactly(n), WAIT))
    return out


def test_tcp_connections_share_one_codec_per_encoding(tmp_path: Path) -> None:
    async def main() -> None:
        async with _server(tmp_path) as server:
            port = server.ports["native"]
            a = await asyncio.open_connection("127.0.0.1", port)
            b = await asyncio.open_connection("127.0.0.1", port)
            c = await asyncio.open_connection("127.0.0.1", port)
            for _, w in (a, b):
                w.write(_mp_frame({"op": "hello", "id": 1, "v": 1}))
            c[1].write(b'{"op":"hello","id":1,"v":1}\n')
            for r, _ in (a, b):
                assert (await _mp_read(r))["op"] == "reply"
            assert orjson.loads(await asyncio.wait_for(c[0].readline(), WAIT))["op"] == "reply"
            ka = Keepalive.for_interval(25.0)
            assert len(ka) == 3  # joined at hello, before its reply
            conns: list[NativeConnection] = list(ka)
            mp = [x for x in conns if x.codec.encoding == "msgpack"]
            js = [x for x in conns if x.codec.encoding == "json"]
            assert len(mp) == 2 and len(js) == 1
            assert mp[0].codec is mp[1].codec and mp[0].session.encoder is mp[1].session.encoder
            assert js[0].codec is not mp[0].codec

            # a subscribes; b publishes one read of 50 (acked every tenth), c a few JSON lines: a gets every
            # event, in order, and each publisher its own acks.
            a[1].write(_mp_frame({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/t/**"}))
            assert (await _mp_read(a[0]))["op"] == "reply"
            b[1].write(
                b"".join(
                    _mp_frame(
                        {
                            "op": "publish",
                            "id": i,
                            "channel": "/t/b",
                            "payload": b"%d" % i,
                            "ack": i % 10 == 0,
                        }
                    )
                    for i in range(1, 51)
                )
            )
            acks = [await _mp_read(b[0]) for _ in range(5)]
            assert [(f["op"], f["id"]) for f in acks] == [("reply", i) for i in (10, 20, 30, 40, 50)]
            c[1].write(
                b"".join(
                    orjson.dumps({"op": "publish", "id": i, "channel": "/t/c", "text": str(i), "ack": True})
                    + b"\n"
                    for i in range(1, 4)
                )
            )
            replies = [orjson.loads(await asyncio.wait_for(c[0].readline(), WAIT)) for _ in range(3)]
            assert [(f["op"], f["id"], f["seq"]) for f in replies] == [("reply", i, i) for i in range(1, 4)]
            events: list[dict[str, Any]] = []
            while len(events) < 53:
                events.append(await _mp_read(a[0]))
            got = [(e["channel"], e["payload"]) for e in events]
            assert got == [("/t/b", b"%d" % i) for i in range(1, 51)] + [
                ("/t/c", b"%d" % i) for i in range(1, 4)
            ]
            for _, w in (a, b, c):
                w.close()

    asyncio.run(main())


#: Idle clients in another process, so that only the server's allocations are traced here. Raw sockets:
#: the WebSocket upgrade and a masked msgpack hello, then idle until stdin closes.
_HOLD = textwrap.dedent(
    """
    import base64, os, socket, sys
    import msgpack
    port, n = int(sys.argv[1]), int(sys.argv[2])
    hello = msgpack.packb({"op": "hello", "id": 1, "v": 1})
    frame = bytes([0x82, 0x80 | len(hello)]) + b"\\0\\0\\0\\0" + hello
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        key = base64.b64encode(os.urandom(16)).decode()
        head = ["GET /ws/hubbub HTTP/1.1", "Host: x", "Upgrade: websocket", "Connection: Upgrade",
                "Sec-WebSocket-Key: " + key, "Sec-WebSocket-Version: 13",
                "Sec-WebSocket-Protocol: hubbub.v1.msgpack"]
        s.sendall(("\\r\\n".join(head) + "\\r\\n\\r\\n").encode())
        buf = b""
        while b"\\r\\n\\r\\n" not in buf:
            buf += s.recv(4096)
        s.sendall(frame)
        while b"reply" not in buf:
            buf += s.recv(4096)
        socks.append(s)
    # A ping round trip on each: its handler has gone back to reading after its hello, and is idle.
    ping = msgpack.packb({"op": "ping", "id": 2})
    for s in socks:
        s.sendall(bytes([0x82, 0x80 | len(ping)]) + b"\\0\\0\\0\\0" + ping)
    for s in socks:
        buf = b""
        while b"pong" not in buf:
            buf += s.recv(4096)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


async def _no_write_loops() -> None:
    """Return once no task runs a connection's write loop (``SessionPump.run``)."""

    def loops() -> int:
        return sum(
            1 for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "SessionPump.run"
        )

    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while loops():
        assert loop.time() < deadline, f"{loops()} write loops left"
        await asyncio.sleep(0.01)


def test_idle_ws_connection_footprint_stays_bounded(tmp_path: Path) -> None:
    """Python memory the server allocates per idle native WebSocket (after ``hello``), under uvloop as in
    ``hubbub serve``. About 6 KB since the connection leaves aiohttp after the 101 (it was 17 KB while
    aiohttp's upgrade request, handler tasks and WebSocket reader and writer lived as long as the
    connection); the bound leaves room for drift and catches what used to be here: aiohttp's request and
    handler kept, a msgpack packer per connection (256 KiB), and, together some 7 KB, a keepalive task per
    connection, closures, and events and deques created up front."""
    n = 100

    def hold(port: int) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(port), str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc

    def release(proc: subprocess.Popen[str]) -> None:
        proc.communicate(timeout=WAIT)  # closes stdin (the clients let go) and reads to the end

    async def main() -> None:
        async with _server(tmp_path) as server:
            loop = asyncio.get_running_loop()
            ka = Keepalive.for_interval(25.0)
            warm = await loop.run_in_executor(None, hold, server.ports["http"])
            assert len(ka) == n
            release(warm)
            await asyncio.wait_for(ka.wait_empty(), WAIT)
            tracemalloc.start()
            try:
                before = tracemalloc.take_snapshot()
                proc = await loop.run_in_executor(None, hold, server.ports["http"])
                # Every connection said hello and had a ping answered (the client is ready only then).
                assert len(ka) == n and all(c.hello_done for c in ka)
                # An idle connection holds no task for its write loop: it parked once the pong was written.
                await _no_write_loops()
                after = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            grown = sum(d.size_diff for d in after.compare_to(before, "filename"))
            assert grown / n < 9 * 1024, f"{grown / n:.0f} bytes per idle connection"
            conns = list(ka)
            assert all(c.proto._pending is None for c in conns)  # created by the first publish only
            assert len({id(c.codec) for c in conns}) == 1
            release(proc)

    uvloop.run(main())
