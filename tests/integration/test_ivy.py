"""The ivy dialect against a real server on loopback ports: a Node client written the way ivy-client.js
speaks, cross-dialect delivery, HTTP log views and caching, CORS, keepalive and slow consumers.

Each test starts a :class:`hubbub.server.Server` inside ``asyncio.run`` (no pytest-asyncio). Waits are on
conditions or received frames, with timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.dialects.ivy import ts
from hubbub.events import Publisher
from hubbub.log import DB_FILENAME, SqliteLogStore
from hubbub.log.base import AppendRequest
from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports import ivy as ivy_transport
from hubbub.transports import ws_write

WAIT = 10.0
SCRIPT = Path(__file__).with_name("ivy_client.mjs")
LINE = r"@\d{10}\.\d{9}:"


@contextlib.asynccontextmanager
async def serve(data_dir: Path, **overrides: Any) -> AsyncIterator[tuple[Server, str]]:
    cli: dict[str, Any] = {
        "data_dir": str(data_dir),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
    }
    cli.update(overrides)
    async with Server(load_config(cli=cli, env={})) as server:
        yield server, f"127.0.0.1:{server.ports['http']}"


@contextlib.asynccontextmanager
async def ivy_ws(
    http: aiohttp.ClientSession, addr: str, **kw: Any
) -> AsyncIterator[tuple[aiohttp.ClientWebSocketResponse, str]]:
    async with http.ws_connect(f"ws://{addr}/ws", protocols=("ivy1",), **kw) as ws:
        intro = await ws.receive_str(timeout=WAIT)
        assert intro.startswith("@") and ":~/sid:" in intro
        yield ws, intro.rsplit(":", 1)[1]


async def barrier(ws: aiohttp.ClientWebSocketResponse) -> None:
    await ws.send_str("@")
    reply = await ws.receive_str(timeout=WAIT)
    assert reply.startswith("##@"), reply


# -- the Node client --------------------------------------------------------------------------------------


def _node_command() -> list[str] | None:
    node = shutil.which("node")
    if node is None:
        return None
    # Node 20 has WebSocket behind a flag; later versions have it on by default (and accept the flag).
    probe = subprocess.run(
        [node, "--experimental-websocket", "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"],
        capture_output=True,
        check=False,
    )
    return [node, "--experimental-websocket"] if probe.returncode == 0 else [node]


def _run_node_client(tmp_path: Path, *args: str, **config: Any) -> dict[str, Any]:
    cmd = _node_command()
    if cmd is None:
        pytest.skip("node is not installed")

    async def main() -> dict[str, Any]:
        async with serve(tmp_path / "d", **config) as (_, addr):
            proc = await asyncio.create_subprocess_exec(
                *cmd, str(SCRIPT), addr, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode()
            result: dict[str, Any] = json.loads(out)
            return result

    return asyncio.run(main())


def _check_node_client_report(r: dict[str, Any]) -> None:
    assert r["first"] == "hello: world % 50%\nnext"  # escaped by the server, decoded by the client
    assert r["second"] == "second"
    assert r["b_first"] == "from a"  # B never got its own publishes
    assert r["b_form"] == "via form"
    assert r["a_paths"] == ["~/sid", "/chat/room", "/chat/room"]  # nor A its own, nor its sid's POST
    assert r["loaded_one"] == ["from a"]  # ?n=1 is exactly one line (upstream could give two)
    assert r["loaded_two"] == ["second", "from a"]
    assert r["loaded_all"] == ["hello: world % 50%\nnext", "second", "from a"]
    assert r["load_ts_matches_live"]


def test_node_ivy_client(tmp_path: Path) -> None:
    _check_node_client_report(_run_node_client(tmp_path))


def test_node_ivy_client_with_auth_presents_its_token_as_a_cookie(tmp_path: Path) -> None:
    """ivy-client.js builds its WebSocket and HTTP URLs itself, so no ``?token=`` fits both, and a 401 on
    its log read makes it throw. A page on the server's origin holding the ``hubbub_token`` cookie: the
    browser sends it with both, and the whole session works with auth on."""
    auth = {"auth.mode": "token", "auth.tokens": {"tok-page": {"user": "page"}}}
    _check_node_client_report(_run_node_client(tmp_path, "--cookie=hubbub_token=tok-page", **auth))


def test_token_cookie_only_from_the_servers_own_origin(tmp_path: Path) -> None:
    """A page of another site must not use a visitor's cookie: with an Origin that is neither the server's
    nor one of cors_origin's, the cookie is not a token (401), on the upgrade and on a request alike."""

    async def main() -> None:
        auth = {
            "auth.mode": "token",
            "auth.tokens": {"tok-page": {"user": "page"}},
            "cors_origin": "https://app.example",
        }
        async with serve(tmp_path / "d", **auth) as (_, addr), aiohttp.ClientSession() as http:
            cookie = {"Cookie": "hubbub_token=tok-page"}
            for origin, status in [
                (None, 200),
                (f"http://{addr}", 200),
                ("https://app.example", 200),
                ("https://evil.example", 401),
            ]:
                headers = {**cookie, **({"Origin": origin} if origin else {})}
                async with http.get(f"http://{addr}/events/chat", headers=headers) as r:
                    assert r.status == status, (origin, r.status)
                ws_status = 101 if status == 200 else 401
                try:
                    async with http.ws_connect(f"ws://{addr}/ws", headers=headers) as ws:
                        await ws.close()
                        got = 101
                except aiohttp.WSServerHandshakeError as exc:
                    got = exc.status
                assert got == ws_status, (origin, got)

    asyncio.run(main())


# -- cross-dialect ----------------------------------------------------------------------------------------


def test_native_binary_payload_reaches_ivy_escaped(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path / "d") as (_, addr),
            aiohttp.ClientSession() as http,
            ivy_ws(http, addr) as (ws, _),
        ):
            await ws.send_str("+/bin")
            await barrier(ws)
            payload = b"\x93\xa1a\xff%\nz\xc3\xa9"
            async with http.post(
                f"http://{addr}/api/v1/publish/bin/x",
                data=payload,
                headers={"Content-Type": "application/octet-stream"},
            ) as r:
                assert r.status == 200
                time_ns = int((await r.json())["time"])
            line = await ws.receive_str(timeout=WAIT)
            assert line == f"@{ts(time_ns)}:/bin/x:%93%A1a%FF%25%0Az\u00e9"
            async with http.get(f"http://{addr}/events/bin/x") as r:
                assert await r.text() == line

    asyncio.run(main())


def test_ivy_http_publish_reaches_native_with_sid(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path / "d") as (_, addr),
            aiohttp.ClientSession() as http,
            ivy_ws(http, addr) as (ws, sid),
            ivy_ws(http, addr) as (other, _),
        ):
            for w in (ws, other):
                await w.send_str("+/x")
                await barrier(w)
            async with http.post(f"http://{addr}/log/x/y", data={"data": "d:1", "sid": sid}) as r:
                assert r.status == 200 and await r.read() == b""
            assert (await other.receive_str(timeout=WAIT)).endswith(":/x/y:d:1")
            await barrier(ws)  # the sid's own connection got nothing before this reply
            async with http.get(f"http://{addr}/api/v1/log/x/y") as r:
                ev = (await r.json())["events"][0]
            assert ev["publisher"] == {"dialect": "ivy", "user": "", "app": sid, "msg_id": ""}
            assert ev["content_type"] == "text/plain; charset=utf-8" and ev["text"] == "d:1"

    asyncio.run(main())


# -- log views --------------------------------------------------------------------------------------------


async def _post(http: aiohttp.ClientSession, addr: str, path: str, data: str) -> None:
    async with http.post(f"http://{addr}/events/{path}", data={"data": data}) as r:
        assert r.status == 200, await r.text()


def test_log_views(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path / "d") as (_, addr), aiohttp.ClientSession() as http:
            for ch, data in (("g/b/x", "b1"), ("g/a/x", "a1"), ("g/b/x", "b2"), ("g/a/x", "a2")):
                await _post(http, addr, ch, data)
            await _post(http, addr, "g/a/x/deeper", "no")
            await _post(http, addr, "later", "newest")

            async def get(path: str, **headers: str) -> tuple[int, str, Any]:
                async with http.get(f"http://{addr}{path}", headers=headers) as r:
                    return r.status, await r.text(), r.headers

            # Globs: grouped by channel in byte order, each oldest first; n applies per channel.
            st, body, h = await get("/events/g/*/x")
            assert st == 200 and [ln.rsplit(":", 1)[1] for ln in body.split("\n")] == ["a1", "a2", "b1", "b2"]
            st, body, _ = await get("/events/g/*/x?n=1")
            assert [ln.rsplit(":", 1)[1] for ln in body.split("\n")] == ["a2", "b2"]
            for bad in ("/events/g/**", "/events/g/*x", "/events/g/", "/log/"):
                st, body, h = await get(bad)
                assert (st, body) == (400, "invalid glob path\n"), bad
                assert h["Content-Type"] == "text/plain; charset=utf-8"
            for bad_n in ("0", "-1", "x", ""):
                assert (await get(f"/events/g/a/x?n={bad_n}"))[:2] == (400, "invalid line count\n")

            # ?at=: a full timestamp gives exactly one event; a range that is over is immutable.
            _, body, _ = await get("/events/g/a/x")
            t1 = body.split("\n")[0][1:21]
            st, body, h = await get(f"/events/g/a/x?at={t1}")
            assert body.endswith(":a1") and "\n" not in body
            assert h["Cache-Control"] == "public, max-age=31536000, immutable"
            st, body, h = await get(f"/events/g/a/x?at={t1[:10]}")
            assert body.split("\n")[0].endswith(":a1")
            _, body, _ = await get("/events/later")
            newest = body[1:21]
            _, _, h = await get(f"/events/later?at={newest}")
            # The newest commit's own instant is not below the newest commit: not provably complete yet.
            assert h["Cache-Control"] == "no-cache"
            _, _, h = await get("/events/g/a/x")
            assert h["Cache-Control"] == "no-cache" and h["Accept-Ranges"] == "bytes"
            st, body, h = await get("/events/g/a/x?at=nope")
            assert (st, body) == (200, "") and "Last-Modified" not in h

            # Last-Modified, If-Modified-Since and Range.
            st, full, h = await get("/events/g/a/x")
            lm = h["Last-Modified"]
            assert (await get("/events/g/a/x", **{"If-Modified-Since": lm}))[0] == 304
            old = "Mon, 01 Jan 2001 00:00:00 GMT"
            assert (await get("/events/g/a/x", **{"If-Modified-Since": old}))[0] == 200
            assert (await get("/events/g/a/x", **{"If-Modified-Since": "garbage"}))[0] == 200
            st, part, h = await get("/events/g/a/x", Range="bytes=-5")
            assert (st, part) == (206, full[-5:])
            assert h["Content-Range"] == f"bytes {len(full) - 5}-{len(full) - 1}/{len(full)}"
            st, _, h = await get("/events/g/a/x", Range=f"bytes={len(full)}-")
            assert st == 416 and h["Content-Range"] == f"bytes */{len(full)}"
            assert (await get("/events/g/a/x", Range="bytes=0-1,3-4"))[:2] == (200, full)

            # Other dialects' channels are readable (no ivy regex on reads).
            async with http.post(f"http://{addr}/api/v1/publish/Up%2Fper", data=b"n") as r:
                assert r.status == 200
            assert (await get("/events/Up%2fper"))[1].endswith(":/Up%2Fper:n")

            # Methods other than GET and POST, HEAD included.
            for method in ("HEAD", "PUT", "DELETE", "OPTIONS"):
                async with http.request(method, f"http://{addr}/log/g/a/x") as r:
                    assert r.status == 404
                    if method != "HEAD":
                        assert await r.text() == "Not Found\n"

    asyncio.run(main())


def test_http_publish_errors_and_limits(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path / "d", **{"limits.max_frame": 2048, "ivy.max_log_bytes": 4000}) as (_, addr),
            aiohttp.ClientSession() as http,
        ):
            for bad in ("Upper", "a%20b", "%FF", ""):
                async with http.post(f"http://{addr}/events/{bad}", data={"data": "x"}) as r:
                    assert (r.status, await r.text()) == (400, "invalid path\n"), bad
            async with http.post(f"http://{addr}/events/big", data={"data": "x" * 4000}) as r:
                assert r.status == 413
            for _ in range(3):
                await _post(http, addr, "many", "y" * 1500)
            async with http.get(f"http://{addr}/events/many") as r:
                assert r.status == 413  # over ivy.max_log_bytes: refused, not truncated
            async with http.get(f"http://{addr}/events/many?n=2") as r:
                assert r.status == 200 and len((await r.text()).split("\n")) == 2
            async with http.get(f"http://{addr}/ws") as r:
                assert (r.status, await r.text()) == (400, "websocket upgrade required\n")

    asyncio.run(main())


# -- CORS -------------------------------------------------------------------------------------------------


def test_cors(tmp_path: Path) -> None:
    async def main() -> None:
        origins = '["https://a.example", "http://localhost:3000"]'
        async with serve(tmp_path / "d", cors_origin=origins) as (_, addr), aiohttp.ClientSession() as http:
            o = {"Origin": "https://a.example"}
            for path in ("/events/nothing", "/healthz", "/no/such/route"):
                async with http.get(f"http://{addr}{path}", headers=o) as r:
                    assert r.headers["Access-Control-Allow-Origin"] == "https://a.example", path
                    assert r.headers["Access-Control-Expose-Headers"] == "*"
                    assert "Origin" in r.headers["Vary"]
            async with http.get(f"http://{addr}/healthz", headers={"Origin": "https://evil.example"}) as r:
                assert "Access-Control-Allow-Origin" not in r.headers
            pre = {**o, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "x-a"}
            for path in ("/events/x", "/api/v1/publish/x", "/anything"):
                async with http.options(f"http://{addr}{path}", headers=pre) as r:
                    assert r.status == 204, path
                    assert r.headers["Access-Control-Allow-Methods"] == "GET, POST, PUT, DELETE"
                    assert r.headers["Access-Control-Allow-Headers"] == "x-a"
                    assert r.headers["Access-Control-Max-Age"] == "600"
                    assert r.headers["Access-Control-Allow-Origin"] == "https://a.example"
            # The webhook API's PUT and DELETE from an allowed origin: the preflight lets the browser send
            # them, and they reach their routes (not refused as another site's changes).
            for method in ("PUT", "DELETE"):
                pre = {**o, "Access-Control-Request-Method": method}
                async with http.options(f"http://{addr}/api/v1/webhooks/h", headers=pre) as r:
                    assert r.status == 204 and method in r.headers["Access-Control-Allow-Methods"].split(", ")
            hook = {"pattern": "/x/**", "url": "http://127.0.0.1:9/hook"}
            async with http.put(f"http://{addr}/api/v1/webhooks/h", json=hook, headers=o) as r:
                assert r.status in (200, 201), (r.status, await r.text())
                assert r.headers["Access-Control-Allow-Origin"] == "https://a.example"
            async with http.delete(f"http://{addr}/api/v1/webhooks/h", headers=o) as r:
                assert r.status in (200, 204), (r.status, await r.text())
                assert r.headers["Access-Control-Allow-Origin"] == "https://a.example"
            async with http.ws_connect(f"ws://{addr}/ws", headers=o) as ws:
                assert ws._response.headers["Access-Control-Allow-Origin"] == "https://a.example"

        async with (
            serve(tmp_path / "e", cors_origin="*") as (_, addr),
            aiohttp.ClientSession() as http,
            http.post(f"http://{addr}/events/x", data={"data": "1"}, headers={"Origin": "null"}) as r,
        ):
            assert r.headers["Access-Control-Allow-Origin"] == "*" and "Vary" not in r.headers

        async with serve(tmp_path / "f") as (_, addr), aiohttp.ClientSession() as http:  # off by default
            pre = {"Origin": "https://a.example", "Access-Control-Request-Method": "GET"}
            async with http.options(f"http://{addr}/events/x", headers=pre) as r:
                assert (r.status, await r.text()) == (404, "Not Found\n")
                assert not any(k.startswith("Access-Control") for k in r.headers)

    asyncio.run(main())


def test_cors_origin_validation() -> None:
    from hubbub.config import ConfigError, parse_cors_origin

    assert parse_cors_origin("") == ()
    assert parse_cors_origin("*") == ("*",)
    assert parse_cors_origin("https://a.example:8443") == ("https://a.example:8443",)
    assert parse_cors_origin('["https://a", "http://b:1"]') == ("https://a", "http://b:1")
    for bad in ("a.example", "https://a/path", "[1]", "[", '{"a": 1}', "https://a, https://b"):
        with pytest.raises(ConfigError):
            load_config(cli={"cors_origin": bad}, env={})


# -- WebSocket behaviour ----------------------------------------------------------------------------------


def test_keepalive_pings_and_read_timeout(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = {"ivy.ping_interval_s": 0.2, "ivy.read_timeout_s": 0.7}
        async with (
            serve(tmp_path / "d", **cfg) as (_, addr),
            aiohttp.ClientSession() as http,
            ivy_ws(http, addr) as (alive, _),
        ):
            # A client that answers pings (aiohttp's autoping, while it receives) stays connected past the
            # read timeout.
            reply = asyncio.ensure_future(alive.receive_str(timeout=WAIT))
            # A silent client that ignores pings is closed with 1001 after the timeout.
            async with ivy_ws(http, addr, autoping=False) as (silent, _):
                msg = await silent.receive(timeout=WAIT)
                assert msg.type == aiohttp.WSMsgType.PING
                msg = await silent.receive(timeout=WAIT)
                while msg.type != aiohttp.WSMsgType.CLOSE:
                    msg = await silent.receive(timeout=WAIT)
                assert msg.data == 1001
            await alive.send_str("@")
            assert (await reply).startswith("##@")

    asyncio.run(main())


def test_bad_input_is_counted_and_closes(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path / "d", **{"limits.max_frame": 64}) as (server, addr),
            aiohttp.ClientSession() as http,
        ):
            assert server.node is not None
            for send, code in (("+/Upper", 1002), ("x", 1002), (b"+/a", 1003), ("+/" + "a" * 100, 1009)):
                async with ivy_ws(http, addr) as (ws, _):
                    await (ws.send_bytes(send) if isinstance(send, bytes) else ws.send_str(send))
                    msg = await ws.receive(timeout=WAIT)
                    assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, code), send
            assert server.node.metrics.bad_input["ivy"] == 4

    asyncio.run(main())


def test_slow_consumer_is_closed_1013(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = {"limits.send_queue": 8}
        async with serve(tmp_path / "d", **cfg) as (server, addr), aiohttp.ClientSession() as http:
            node = server.node
            assert node is not None
            async with ivy_ws(http, addr) as (ws, _):
                await ws.send_str("+/slow")
                await barrier(ws)
                # The client stops reading; the socket buffers fill, then the session's queue overflows.
                payload = b"p" * 60000
                for _ in range(400):
                    # Committed and fanned out when this returns: the overflow, if any, has happened.
                    await node.publish(AppendRequest("/slow", Publisher("native"), payload, "text/plain"))
                    if node.metrics.slow_closes.get("ivy"):
                        break
                codes = []
                while True:
                    msg = await ws.receive(timeout=WAIT)
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        codes.append(msg.data)
                        break
                assert codes == [1013]
                assert node.metrics.slow_closes["ivy"] == 1

    asyncio.run(main())


def test_log_read_of_a_glob_over_more_channels_than_one_listing_reads_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A glob read lists its channels a page at a time: past the channels one listing returns (10,000; 100
    here, to keep the test fast), none is left out: every channel's line, in byte order of the path."""
    monkeypatch.setattr(ivy_transport, "LIST_LIMIT", 100)
    data = tmp_path / "d"
    data.mkdir()
    store = SqliteLogStore(data / DB_FILENAME)
    n = 250
    try:
        store.append(
            [
                AppendRequest(f"/wide/c{i:05d}", Publisher("ivy"), f"p{i}".encode(), "text/plain")
                for i in range(n)
            ]
        )
    finally:
        store.close()

    async def main() -> None:
        async with serve(data) as (_, addr), aiohttp.ClientSession() as http:
            async with http.get(f"http://{addr}/events/wide/*") as r:
                assert r.status == 200
                body = (await r.read()).decode()
            got = [line.split(":", 2)[1:] for line in body.split("\n")]
            assert got == [[f"/wide/c{i:05d}", f"p{i}"] for i in range(n)]

    asyncio.run(main())


def test_a_fan_out_run_reaches_every_ivy_socket_in_order_framed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ivy's sockets write through the WebSocket driver's framing (``ws_write``): a native publisher's burst,
    committed as one run, is framed once for the three ivy subscribers, and each gets every event, in order,
    as its own text message."""
    framed: list[int] = []
    burst = ws_write.ws_text_burst

    def counting(frames: list[bytes]) -> bytes:
        framed.append(len(frames))
        return burst(frames)

    monkeypatch.setattr(ws_write, "ws_text_burst", counting)
    n = 50

    async def main() -> None:
        async with (
            serve(tmp_path / "d", store="memory", durability="none") as (server, addr),
            aiohttp.ClientSession() as http,
            ivy_ws(http, addr) as (a, _),
            ivy_ws(http, addr) as (b, _),
            ivy_ws(http, addr) as (c, _),
        ):
            for ws in (a, b, c):
                await ws.send_str("+/fan")
                await barrier(ws)
            framed.clear()
            reader, writer = await asyncio.open_connection("127.0.0.1", server.ports["native"])
            writer.write(b'{"op":"hello","id":1,"v":1}\n')
            await reader.readline()
            line = b'{"op":"publish","id":%d,"channel":"/fan/x","text":"e%d"}\n'
            writer.write(b"".join(line % (i + 2, i) for i in range(n)))  # one read: one run, one commit
            for ws in (a, b, c):
                got = [(await ws.receive_str(timeout=WAIT)).rsplit(":", 1)[1] for _ in range(n)]
                assert got == [f"e{i}" for i in range(n)]
            writer.close()
        # Each run (one per commit that took the burst) framed once for the three sockets together.
        assert framed and sum(framed) == n, framed

    asyncio.run(main())
