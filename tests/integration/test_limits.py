"""The abuse limits against a real server, in every landed dialect: each with its config key, its error in
the dialect's own way, and its count on ``/metrics`` (``hubbub_limit_refusals_total{limit,dialect}``).

| limit (key)                         | native                | guble                         | ivy         |
|-------------------------------------|-----------------------|-------------------------------|-------------|
| ``limits.max_subscriptions``        | error 4007            | ``!error-bad-request …``      | close 1008  |
| ``limits.publish_rate`` / ``_burst``| error 4008            | ``!error-bad-request …``      | close 1008  |
| ``limits.max_connections(_per_ip)`` | 503 (4009) / TCP 4009 | 503 (4009), at accept         | as guble    |
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from hubbub.server import Server
from hubbub.server_config import load_config


@asynccontextmanager
async def server(tmp_path: Path, **limits: Any) -> AsyncIterator[tuple[Server, aiohttp.ClientSession]]:
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
    }
    cli.update({f"limits.{k}": v for k, v in limits.items()})
    async with Server(load_config(cli=cli, env={})) as srv, aiohttp.ClientSession() as http:
        yield srv, http


async def refusals(srv: Server, http: aiohttp.ClientSession) -> dict[tuple[str, str], float]:
    async with http.get(f"http://127.0.0.1:{srv.ports['http']}/metrics") as r:
        text = await r.text()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("hubbub_limit_refusals_total{"):
            labels, _, value = line.partition("} ")
            kv = dict(p.split("=", 1) for p in labels.split("{", 1)[1].split(","))
            out[(kv["limit"].strip('"'), kv["dialect"].strip('"'))] = float(value)
    return out


async def native_ws(srv: Server, http: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(f"ws://127.0.0.1:{srv.ports['http']}/ws/hubbub", protocols=("hubbub.v1.json",))
    await ws.send_json({"op": "hello", "id": 0, "v": 1})
    await ws.receive_json()
    return ws


async def guble_ws(srv: Server, http: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(f"ws://127.0.0.1:{srv.ports['http']}/stream/user/u")
    assert (await ws.receive_bytes()).startswith(b"#connected")
    return ws


async def ivy_ws(srv: Server, http: aiohttp.ClientSession) -> aiohttp.ClientWebSocketResponse:
    ws = await http.ws_connect(f"ws://127.0.0.1:{srv.ports['http']}/ws", protocols=("ivy1",))
    assert (await ws.receive_str()).startswith("@")
    return ws


async def ivy_barrier(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.send_str("@")
    assert (await ws.receive_str()).startswith("##@")


def test_max_subscriptions(tmp_path: Path) -> None:
    async def main() -> None:
        async with server(tmp_path, max_subscriptions=2) as (srv, http):
            nat = await native_ws(srv, http)
            for i in range(3):
                await nat.send_json({"op": "subscribe", "id": i + 1, "sub": f"s{i}", "pattern": f"/n/{i}"})
                reply = await nat.receive_json()
            assert reply == {
                "op": "error", "id": 3, "code": 4007, "message": "too many subscriptions", "temporary": False
            }  # fmt: skip
            await nat.send_json({"op": "ping", "id": 9})  # not fatal
            assert await nat.receive_json() == {"op": "pong", "id": 9}

            gub = await guble_ws(srv, http)
            for i in range(3):
                await gub.send_str(f"+ /g/{i}")
                got = await gub.receive_bytes()
            assert got.startswith(b"!error-bad-request "), got

            ivy = await ivy_ws(srv, http)
            for i in range(3):
                await ivy.send_str(f"+/i/{i}")
            msg = await ivy.receive()
            assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1008)

            counts = await refusals(srv, http)
            for dialect in ("native", "guble", "ivy"):
                assert counts[("max_subscriptions", dialect)] == 1, counts
            await nat.close()
            await gub.close()

    asyncio.run(main())


def test_max_tags_on_every_native_surface(tmp_path: Path) -> None:
    """``limits.max_tags`` and ``limits.max_tag_bytes`` bound the tags of a native publish and subscription
    alike: WebSocket (and TCP, the same protocol), HTTP publish and the SSE stream, each answered 4007 with
    a message that says which limit and names it (the code's name, "too many subscriptions", was not true
    of tags); an SSE stream with too many tags is refused before it is registered."""

    async def main() -> None:
        async with server(tmp_path, max_tags=2, max_tag_bytes=8) as (srv, http):
            base = f"http://127.0.0.1:{srv.ports['http']}"
            three = [("tag", t) for t in ("a", "b", "c")]
            too_many = {"code": 4007, "message": "too many tags (at most 2)", "temporary": False}
            too_long = {"code": 4007, "message": "tag too long (at most 8 bytes)", "temporary": False}

            async with http.get(f"{base}/api/v1/stream/t/x", params=three) as r:
                assert (r.status, await r.json()) == (400, {"error": too_many})
            async with http.get(f"{base}/api/v1/stream/t/x", params={"tag": "x" * 9}) as r:
                assert (r.status, await r.json()) == (400, {"error": too_long})
            async with http.post(f"{base}/api/v1/publish/t/x", params=three, data=b"p") as r:
                assert (r.status, await r.json()) == (400, {"error": too_many})
            async with http.post(f"{base}/api/v1/publish/t/x", params={"tag": "x" * 9}, data=b"p") as r:
                assert (r.status, await r.json()) == (400, {"error": too_long})

            nat = await native_ws(srv, http)
            await nat.send_json(
                {"op": "subscribe", "id": 1, "sub": "s", "pattern": "/t/x", "tags": ["a", "b", "c"]}
            )
            assert await nat.receive_json() == {"op": "error", "id": 1, **too_many}
            await nat.send_json({"op": "publish", "id": 2, "channel": "/t/x", "text": "p", "tags": ["x" * 9]})
            assert await nat.receive_json() == {"op": "error", "id": 2, **too_long}

            # Within the limits, the stream is served and gets an event carrying its two tags.
            sse = await http.get(f"{base}/api/v1/stream/t/x", params=[("tag", "a"), ("tag", "b")])
            assert sse.status == 200
            assert await asyncio.wait_for(sse.content.readline(), 10) == b"retry: 2000\n"
            async with http.post(
                f"{base}/api/v1/publish/t/x", params=[("tag", "b"), ("tag", "a")], data=b"p"
            ) as r:
                assert r.status == 200
            line = await asyncio.wait_for(sse.content.readline(), 10)
            while not line.startswith(b"data: "):
                line = await asyncio.wait_for(sse.content.readline(), 10)
            assert json.loads(line[6:])["tags"] == ["a", "b"]
            sse.close()
            await nat.close()

    asyncio.run(main())


def test_publish_rate(tmp_path: Path) -> None:
    """A burst of 2 at 1 per second: the third publish in a row is refused (and the connection of a
    dialect with an error reply goes on)."""

    async def main() -> None:
        async with server(tmp_path, publish_rate=1, publish_burst=2) as (srv, http):
            nat = await native_ws(srv, http)
            for i in range(3):
                await nat.send_json({"op": "publish", "id": i + 1, "channel": "/n", "text": "x", "ack": True})
            # The refusal is answered at once, the acknowledgements after the commit: compare by id.
            replies = sorted([await nat.receive_json() for _ in range(3)], key=lambda r: r["id"])
            assert [r["op"] for r in replies] == ["reply", "reply", "error"]
            assert replies[2] == {
                "op": "error", "id": 3, "code": 4008, "message": "rate limited", "temporary": True
            }  # fmt: skip

            gub = await guble_ws(srv, http)
            for _ in range(3):
                await gub.send_str("> /g\n\nx")
            got = sorted([await gub.receive_bytes() for _ in range(3)])  # the refusal comes before the acks
            assert got == [b"!error-bad-request publish rate exceeded", b"#send", b"#send"], got

            ivy = await ivy_ws(srv, http)
            for _ in range(3):
                await ivy.send_str(":/i:x")
            msg = await ivy.receive()
            assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1008)

            counts = await refusals(srv, http)
            for dialect in ("native", "guble", "ivy"):
                assert counts[("publish_rate", dialect)] == 1, (
                    dialect,
                    {k: v for k, v in counts.items() if v},
                )
            await nat.close()
            await gub.close()

    asyncio.run(main())


def test_connections_per_ip_and_total(tmp_path: Path) -> None:
    """Every socket counts, on every listener: an HTTP socket over a limit is refused when it is accepted,
    before its request is read (503 with error 4009 whatever the route, counted with dialect ``http``); a
    native TCP one gets error 4009 in its framing."""

    async def main() -> None:
        async with server(tmp_path, max_connections_per_ip=2) as (srv, http):
            a = await native_ws(srv, http)
            b = await ivy_ws(srv, http)
            base = f"http://127.0.0.1:{srv.ports['http']}"
            for path in ("/api/v1/log/x", "/events/x", "/api/subscribers/x", "/metrics"):
                async with http.get(base + path) as r:
                    assert r.status == 503, path
                    assert (await r.json())["error"]["code"] == 4009, path
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.ports["native"])
            writer.write(b'{"op":"hello","id":1,"v":1}\n')
            err = json.loads(await asyncio.wait_for(reader.readline(), 10))
            assert err["code"] == 4009 and await reader.read() == b""
            writer.close()
            await b.close()
            counts = await refusals(srv, http)
            assert counts[("max_connections_per_ip", "http")] == 4, counts
            assert counts[("max_connections_per_ip", "native")] == 1, counts  # TCP
            # A connection that ended frees its place (the scrape's socket, kept alive, holds the other).
            await http.close()
            async with aiohttp.ClientSession() as fresh:
                c = await ivy_ws(srv, fresh)
                await c.close()
            await a.close()

        async with server(tmp_path, max_connections=1) as (srv, http):
            a = await native_ws(srv, http)
            async with http.get(f"http://127.0.0.1:{srv.ports['http']}/healthz") as r:
                assert r.status == 503
            await a.close()
            counts = await refusals(srv, http)
            assert counts[("max_connections", "http")] == 1, counts

    asyncio.run(main())


def test_max_frame_counted(tmp_path: Path) -> None:
    """``limits.max_frame`` refusals are counted by dialect: WebSocket messages (close 1009), native TCP
    lines (4003) and HTTP bodies (413)."""

    async def main() -> None:
        async with server(tmp_path, max_frame=1024) as (srv, http):
            big = "x" * 2000
            nat = await native_ws(srv, http)
            await nat.send_str(big)
            msg = await nat.receive()
            assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1009)
            gub = await guble_ws(srv, http)
            await gub.send_str("> /g\n\n" + big)
            msg = await gub.receive()
            assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1009)
            ivy = await ivy_ws(srv, http)
            await ivy.send_str(":/i:" + big)
            msg = await ivy.receive()
            assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1009)
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.ports["native"])
            writer.write(b'{"op":"hello","id":1,"v":1}\n' + big.encode() + b"\n")
            lines = [json.loads(line) for line in (await asyncio.wait_for(reader.read(), 10)).splitlines()]
            assert lines[-1]["code"] == 4003
            writer.close()
            base = f"http://127.0.0.1:{srv.ports['http']}"
            async with http.post(base + "/api/v1/publish/n", data=big.encode()) as r:
                assert r.status == 413
            async with http.post(base + "/events/i", data={"data": big}) as r:
                assert r.status == 413
            counts = await refusals(srv, http)
            assert counts[("max_frame", "native")] == 3, counts
            assert counts[("max_frame", "guble")] == 1, counts
            assert counts[("max_frame", "ivy")] == 2, counts

    asyncio.run(main())


def test_a_websocket_message_over_max_frame_is_bad_input_in_every_dialect(tmp_path: Path) -> None:
    """A WebSocket message over ``limits.max_frame`` (aiohttp's close 1009) is bad input of its dialect,
    native's as every other's: one WebSocket driver reads them all (native TCP counted its 4003 already)."""

    async def main() -> None:
        async with server(tmp_path, max_frame=1024) as (srv, http):
            assert srv.node is not None
            bad = srv.node.metrics.bad_input
            big = "x" * 2000
            for dialect, open_ws, message in (
                ("native", native_ws, big),
                ("guble", guble_ws, "> /g\n\n" + big),
                ("ivy", ivy_ws, ":/i:" + big),
            ):
                ws = await open_ws(srv, http)
                await ws.send_str(message)
                msg = await ws.receive()
                assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1009)
                # Counted by the server's reader once it sees the refusal, which may come after the client
                # has the close: wait for it.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10
                while bad.get(dialect, 0) < 1:
                    assert loop.time() < deadline, (dialect, dict(bad))
                    await asyncio.sleep(0.01)
                assert bad.get(dialect) == 1, (dialect, dict(bad))

    asyncio.run(main())


def server_sockets(port: int) -> list[str]:
    """The sockets of connections accepted on ``port`` that the server still holds (from /proc/net/tcp: any
    state but LISTEN, with an inode; orphans the kernel finishes alone are not counted)."""
    out = []
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            if int(f[1].split(":")[1], 16) == port and f[3] != "0A" and f[9] != "0":
                out.append(line.strip())
    return out


def test_stalled_tcp_peer_is_dropped(tmp_path: Path) -> None:
    """A native TCP subscriber that stops reading is closed as a slow consumer, and its socket goes away once
    the write timeout passes: it does not linger behind the bytes it never read, holding a socket."""

    async def main() -> None:
        # The write timeout is a setting the server hands each listener when it starts (a module constant
        # patched here would be read by nobody): one second, not the default's 30.
        async with server(tmp_path, write_timeout_s=1) as (srv, _http):
            assert srv.node is not None
            node, port = srv.node, srv.ports["native"]
            sub_reader, stalled = await asyncio.open_connection("127.0.0.1", port)
            stalled.write(
                b'{"op":"hello","id":0,"v":1}\n{"op":"subscribe","id":1,"sub":"s","pattern":"/f"}\n'
            )
            await sub_reader.readline()
            await sub_reader.readline()  # subscribed; from here on it reads nothing
            reader, pub = await asyncio.open_connection("127.0.0.1", port)
            pub.write(b'{"op":"hello","id":0,"v":1}\n')
            await reader.readline()
            burst = (b'{"op":"publish","id":1,"channel":"/f","text":"' + b"y" * 1000 + b'"}\n') * 100
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            try:
                # Publish until the server holds only the publisher's socket (the subscriber never reads) and
                # has released the stalled one's connection slot (after its socket is gone).
                while len(server_sockets(port)) > 1 or len(node.sessions) > 1 or node.limiter.connections > 1:
                    assert loop.time() < deadline, (node.metrics.slow_closes, server_sockets(port))
                    pub.write(burst)
                    await pub.drain()
                assert node.metrics.slow_closes.get("native") == 1
                assert node.limiter.connections == 1
            finally:
                pub.close()
                stalled.close()

    asyncio.run(main())
