"""The guble dialect against a real server on loopback ports (and, for catch-up, a connection whose socket
is stalled on purpose). Each test runs inside ``asyncio.run``; waits are on frames, with timeouts."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from hubbub.core import Node, NodeSettings
from hubbub.dialects.guble import GubleConfig
from hubbub.events import Event, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, RetentionPolicy
from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports.guble import GubleConnection, GubleHub, GubleSettings
from hubbub.transports.http import HttpSettings
from hubbub.transports.lifetime import Lifetime

from ..unit.test_guble_fetch import every, fetched, guble_fetch

WAIT = 5.0
CONNECTED = re.compile(
    r'#connected You are connected to the server\.\n\{"ApplicationId": "([0-9a-v]{20})", '
    r'"UserId": "(.*)", "Time": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"\}'
)


@contextlib.asynccontextmanager
async def serve(data_dir: Path, **extra: Any) -> AsyncIterator[str]:
    cli = {"data_dir": str(data_dir), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}
    cli.update(extra)
    async with Server(load_config(cli=cli, env={})) as server:
        yield f"127.0.0.1:{server.ports['http']}"


async def recv(ws: aiohttp.ClientWebSocketResponse) -> bytes:
    msg = await asyncio.wait_for(ws.receive(), WAIT)
    assert msg.type == aiohttp.WSMsgType.BINARY, msg  # guble always sends binary frames
    data: bytes = msg.data
    return data


async def connect(http: aiohttp.ClientSession, addr: str, user: str = "") -> tuple[Any, str]:
    path = f"/stream/user/{user}" if user else "/stream/"
    ws = await http.ws_connect(f"ws://{addr}{path}")
    m = CONNECTED.fullmatch((await recv(ws)).decode())
    assert m is not None and m.group(2) == user
    return ws, m.group(1)


def meta(line: bytes) -> list[str]:
    return line.split(b"\n", 1)[0].decode().split(",")


def test_guble_cli_session(tmp_path: Path) -> None:
    """The way guble-cli drives a session: each line with its newline, a header line, then a body."""

    async def main() -> None:
        async with serve(tmp_path / "d") as addr, aiohttp.ClientSession() as http:
            ws, app = await connect(http, addr, "alice")
            await ws.send_str("+ /foo\n")
            assert await recv(ws) == b"#subscribed-to /foo"
            await ws.send_str('> /foo\n{"x": 1}\n' + "hello")  # guble-cli: command line, header line, body
            assert await recv(ws) == b"#send"
            line = await recv(ws)
            assert meta(line)[:5] == ["/foo", "1", "alice", app, ""] and meta(line)[6] == "0"
            assert line.split(b"\n", 1)[1] == b'{"x": 1}\nhello'
            await ws.send_str("> /foo/sub 77\n\n")  # empty header and body: the metadata line alone
            assert await recv(ws) == b"#send"
            assert meta(await recv(ws))[:2] == ["/foo/sub", "1"]
            await ws.send_str("+ /foo 0 5\n")
            assert await recv(ws) == b"#fetch-start /foo 2"
            assert (await recv(ws)).endswith(b"\nhello")
            assert meta(await recv(ws))[0] == "/foo/sub"
            assert await recv(ws) == b"#fetch-end /foo"
            await ws.send_str("bogus\n")
            assert await recv(ws) == b"!error-bad-request unknown command bogus"
            await ws.send_str("- /foo\n")  # the fetch-only receiver replaced the live one, and has finished
            await ws.send_str("+ /bar\n")
            assert await recv(ws) == b"#subscribed-to /bar"
            await ws.send_str("- /bar\n")
            assert await recv(ws) == b"#canceled /bar"
            await ws.close()

    asyncio.run(main())


def test_rest_and_admin(tmp_path: Path) -> None:
    async def main() -> None:
        async with (
            serve(tmp_path / "d", **{"guble.node_id": "9", "limits.max_frame": "4096"}) as addr,
            aiohttp.ClientSession() as http,
        ):
            base = f"http://{addr}"
            ws, app = await connect(http, addr, "carol")
            await ws.send_str("+ /rest")
            assert await recv(ws) == b"#subscribed-to /rest"
            async with http.post(
                f"{base}/api/message/rest?userId=m&filterUserId=carol",
                data=b"body",
                headers={"X-Guble-My-Key": "v", "Content-Type": "text/plain"},
            ) as r:
                assert (r.status, await r.text(), r.headers["Content-Type"]) == (
                    200,
                    "OK",
                    "text/plain; charset=utf-8",
                )
            line = await recv(ws)
            fields = meta(line)
            assert fields[0:3] == ["/rest", "1", "m"] and re.fullmatch("[0-9a-v]{20}", fields[3])
            assert fields[4:] == ['{"user_id":"carol"}', fields[5], "9"]
            assert line.split(b"\n", 1)[1] == b'{"My-Key":"v"}\nbody'
            async with http.get(f"{base}/api/subscribers/rest") as r:
                assert await r.json() == [{"application_id": app, "user_id": "carol"}]
            async with http.get(f"{base}/admin/router") as r:
                assert await r.json() == {
                    "/rest": [
                        {
                            "RouteParams": {"application_id": app, "user_id": "carol"},
                            "Path": "/rest",
                            "ChannelSize": 1024,
                        }
                    ]
                }
            async with http.post(f"{base}/admin/router") as r:
                assert r.status == 405
                assert await r.json() == {"error": "Error method not allowed. Only HTTP GET is accepted"}
            async with http.get(f"{base}/admin/metrics") as r:
                counters = await r.json()
                assert counters["router.total_messages_incoming"] == 1
                assert counters["router.current_routes"] == 1
                assert counters["router.total_subscriptions"] == 1
                assert counters["hubbub_events_published_total.guble"] == 1
            async with http.get(f"{base}/admin/healthcheck") as r:
                assert (r.status, await r.text()) == (200, "{}")
            async with http.post(f"{base}/api/message/a%FF", data=b"x") as r:
                assert (r.status, await r.text()) == (400, "invalid path\n")
            async with http.post(f"{base}/api/message/big", data=b"x" * 5000) as r:
                assert r.status == 413
            async with http.get(f"{base}/fcm/") as r:
                assert r.status == 404
            await ws.send_str("- /rest")
            assert await recv(ws) == b"#canceled /rest"
            async with http.get(f"{base}/api/subscribers/rest") as r:
                assert await r.json() == []
            await ws.close()

    asyncio.run(main())


def test_head_under_the_rest_prefix_answers_200(tmp_path: Path) -> None:
    """Upstream's REST handler answers ``HEAD`` with 200 and no body anywhere under ``/api/`` (guble.md
    §4), and its ``restclient.Check()`` is a ``HEAD`` of the endpoint (``/api`` or ``/api/message``); other
    methods on a path without a topic are 404 (``GET``, ``POST``) or 405. Native's ``/api/v1/`` keeps its
    own routes."""

    async def main() -> None:
        async with serve(tmp_path / "d") as addr, aiohttp.ClientSession() as http:
            base = f"http://{addr}"
            for path in (
                "/api",
                "/api/",
                "/api/message",
                "/api/message/",
                "/api/message/t",
                "/api/subscribers",
                "/api/subscribers/",
                "/api/subscribers/t",
                "/api/other/x",
            ):
                async with http.head(base + path, allow_redirects=False) as r:
                    assert (path, r.status, await r.read()) == (path, 200, b"")
            for path in ("/api", "/api/", "/api/message", "/api/other/x"):
                async with http.get(base + path) as r:
                    assert (path, r.status, await r.text()) == (path, 404, "404 page not found\n")
                async with http.post(base + path, data=b"x") as r:
                    assert (path, r.status, await r.text()) == (path, 404, "404 page not found\n")
                async with http.put(base + path, data=b"x") as r:
                    assert (path, r.status, await r.text()) == (path, 405, "Method not allowed\n")
            async with http.put(f"{base}/api/message/t", data=b"x") as r:
                assert (r.status, await r.text()) == (405, "Method not allowed\n")
            # Native's routes keep their own answers.
            async with http.head(f"{base}/api/v1/log/none") as r:
                assert r.status == 200
            async with http.put(f"{base}/api/v1/log/none") as r:
                assert r.status == 405 and "GET" in r.headers["Allow"]
            async with http.get(f"{base}/api/v1/nothing") as r:
                assert r.status == 404
        async with (
            serve(tmp_path / "off", **{"guble.enabled": "false"}) as addr,
            aiohttp.ClientSession() as http,
            http.head(f"http://{addr}/api/") as r,
        ):
            assert r.status == 404

    asyncio.run(main())


def test_admin_endpoints_configurable_and_dialect_switch(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = {"guble.health_endpoint": "/h", "guble.metrics_endpoint": ""}
        async with serve(tmp_path / "a", **cfg) as addr, aiohttp.ClientSession() as http:
            async with http.get(f"http://{addr}/h") as r:
                assert r.status == 200
            for path in ("/admin/healthcheck", "/admin/metrics"):
                async with http.get(f"http://{addr}{path}") as r:
                    assert r.status == 404
        async with (
            serve(tmp_path / "b", **{"guble.enabled": "false"}) as addr,
            aiohttp.ClientSession() as http,
            http.get(f"http://{addr}/api/subscribers/x") as r,
        ):
            assert r.status == 404

    asyncio.run(main())


def test_cross_dialect_both_ways(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path / "d") as addr, aiohttp.ClientSession() as http:
            ws, _ = await connect(http, addr, "bob")
            await ws.send_str("+ /x")
            assert await recv(ws) == b"#subscribed-to /x"
            nat = await http.ws_connect(f"ws://{addr}/ws/hubbub", protocols=["hubbub.v1.json"])
            await nat.send_json({"op": "hello", "id": 1, "v": 1})
            sid = (await nat.receive_json(timeout=WAIT))["session"]
            await nat.send_json({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/x/**"})
            assert (await nat.receive_json(timeout=WAIT))["op"] == "reply"
            # guble -> native: the header line's members become headers, the pseudo-header stays hidden.
            await ws.send_str('> /x/y m1\n{"k": "v", "n": 2}\nhi')
            assert await recv(ws) == b"#send"
            assert (await recv(ws)).endswith(b"\nhi")
            ev = await nat.receive_json(timeout=WAIT)
            assert ev["channel"] == "/x/y" and ev["text"] == "hi"
            assert ev["headers"] == {"k": "v", "n": "2"}
            # native -> guble: compact sorted header JSON, the native session id as application id.
            await nat.send_json(
                {"op": "publish", "id": 3, "channel": "/x", "text": "yo", "headers": {"b": "2", "a": "1"}}
            )
            line = await recv(ws)
            assert meta(line)[:5] == ["/x", "1", "", sid, ""]
            assert line.split(b"\n", 1)[1] == b'{"a":"1","b":"2"}\nyo'
            await nat.close()
            await ws.close()

    asyncio.run(main())


def test_fetch_then_live_has_no_gap_or_duplicate(tmp_path: Path) -> None:
    """Publishes race a fetch with a subscription: every event arrives exactly once, in order."""

    async def main() -> None:
        async with serve(tmp_path / "d") as addr, aiohttp.ClientSession() as http:
            pub, _ = await connect(http, addr, "p")
            for i in range(30):
                await pub.send_str(f"> /r/{i % 3}\n\n{i}")
            for _ in range(30):
                assert await recv(pub) == b"#send"
            sub, _ = await connect(http, addr, "s")
            await sub.send_str("+ /r -10")
            for i in range(30, 60):
                await pub.send_str(f"> /r/{i % 3}\n\n{i}")
            frames: list[bytes] = []
            # Until the fetch block is over and event 59 was seen (in the fetch, when every publish committed
            # before the snapshot, or live).
            while len(frames) < 13 or not any(f.endswith(b"\n59") for f in frames):
                frames.append(await recv(sub))
            # The fetch reads a snapshot taken while the publishes race it: exactly 10 events, then the
            # live ones, together every event from the first replayed one on, once and in order.
            assert frames[0] == b"#fetch-start /r 10"
            assert frames[11:13] == [b"#fetch-end /r", b"#subscribed-to /r"]
            got = [int(f.rsplit(b"\n", 1)[1]) for f in frames[1:11] + frames[13:]]
            assert got == list(range(got[0], 60)) and got[0] >= 20
            for _ in range(30, 60):  # the publisher's acks: every publish was committed before it closes
                assert await recv(pub) == b"#send"
            await pub.close()
            await sub.close()

    asyncio.run(main())


def test_slow_consumer_catches_up_from_the_log(tmp_path: Path) -> None:
    """A connection whose socket stalls overflows its queue; it is switched to catch-up from the log and,
    once the socket drains, has every event exactly once, with a fetch block before going live again. A
    stall that outlasts what the catch-up's subscription holds (4 x send_queue events) does not close it: the
    hold spills, and the events it did not keep are read back from the log."""

    async def main() -> None:
        store = open_store("memory", str(tmp_path), "commit", RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node:
            limits = {"max_channel_bytes": 1024, "max_headers": 64, "max_header_bytes": 8192}
            http = HttpSettings(1 << 20, 1024, 1024, 4, 1 << 20, 25.0, limits)
            hub = GubleHub(node, http, GubleSettings())

            async def run(n_stalled: int) -> tuple[GubleConnection, list[bytes]]:
                gate = asyncio.Event()
                last = asyncio.Event()
                sent: list[bytes] = []
                closed: list[int] = []

                async def send(data: bytes) -> None:
                    await gate.wait()
                    sent.append(data)
                    if data.endswith(b"\nlast"):
                        last.set()

                async def close(code: int) -> None:
                    closed.append(code)
                    last.set()

                conn = GubleConnection(hub, "slow", send, close)
                held: list[int] = []  # events published before the catch-up's subscription held
                async with Lifetime() as group:
                    conn.start(group)
                    await conn.handle(hub.codec.decode("+ /q"))
                    for i in range(n_stalled):
                        req = AppendRequest(
                            "/q" if i % 2 else "/q/s", Publisher("native"), str(i).encode(), "x"
                        )
                        await node.publish(req)
                        if conn.catch_ups == 1 and not held:
                            # The rest reach the catch-up's hold, whatever the threads' pace: once its
                            # subscription holds, it holds until the socket drains (its replay and held
                            # events wait on the stalled queue), so the hold spills iff more than
                            # 4 x send_queue of them come (12 stalled: 8 at most; 60: 56).
                            await holding(conn)
                            held.append(i + 1)
                    assert conn.catch_ups == 1 and held
                    gate.set()
                    for i in range(n_stalled, n_stalled + 5):
                        await node.publish(AppendRequest("/q/s", Publisher("native"), str(i).encode(), "x"))
                    await node.publish(AppendRequest("/q", Publisher("native"), b"last", "x"))
                    await asyncio.wait_for(last.wait(), WAIT)
                    await conn.finish()
                return conn, sent if not closed else [b"closed %d" % closed[0]]

            async def holding(conn: GubleConnection) -> None:
                """Until the connection's (catch-up) subscription is registered, holding live events."""
                loop = asyncio.get_running_loop()
                deadline = loop.time() + WAIT
                while not any(s.holding is not None for s in node.subscriptions(conn.session)):
                    assert loop.time() < deadline, "timed out waiting for the catch-up to hold"
                    await asyncio.sleep(0.001)

            for stalled in (12, 60):
                conn, sent = await run(stalled)
                events = [f.rsplit(b"\n", 1)[1] for f in sent if f.startswith(b"/")]
                assert events == [str(i).encode() for i in range(stalled + 5)] + [b"last"]
                assert sent.count(b"#fetch-end /q") == conn.catch_ups
                assert sent.count(b"#subscribed-to /q") == conn.catch_ups + 1
                assert (node._replays.spills > 0) == (stalled == 60)

    asyncio.run(main())


def test_catch_up_after_a_fetch_sends_its_unwritten_events_again(tmp_path: Path) -> None:
    """A ``+ /q 0`` goes live while its fetch's events are still queued (the socket is stalled); live events
    then overflow the queue, which drops them all: the catch-up starts from the last event written, which is
    none, so it sends the fetch's events again, and every id arrives once, in order."""

    async def main() -> None:
        store = open_store("memory", str(tmp_path), "commit", RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node:
            limits = {"max_channel_bytes": 1024, "max_headers": 64, "max_header_bytes": 8192}
            http = HttpSettings(1 << 20, 1024, 1024, 16, 1 << 20, 25.0, limits)
            hub = GubleHub(node, http, GubleSettings())
            for i in range(5):
                await node.publish(AppendRequest("/q", Publisher("native"), str(i).encode(), "x"))
            gate = asyncio.Event()
            last = asyncio.Event()
            sent: list[bytes] = []

            async def send(data: bytes) -> None:
                await gate.wait()
                sent.append(data)
                if data.endswith(b"\nlast"):
                    last.set()

            async def close(code: int) -> None:
                sent.append(b"closed %d" % code)
                last.set()

            conn = GubleConnection(hub, "slow", send, close)
            async with Lifetime() as group:
                conn.start(group)
                await conn.handle(hub.codec.decode("+ /q 0"))
                rec = conn.receivers["/q"]
                assert rec.task is not None
                await asyncio.wait_for(rec.task, WAIT)
                assert rec.live and conn.session.queued > 5  # live, the fetch still queued
                for i in range(5, 30):
                    await node.publish(AppendRequest("/q", Publisher("native"), str(i).encode(), "x"))
                assert conn.catch_ups >= 1
                gate.set()
                await node.publish(AppendRequest("/q", Publisher("native"), b"last", "x"))
                await asyncio.wait_for(last.wait(), WAIT)
                await conn.finish()
            events = [f.rsplit(b"\n", 1)[1] for f in sent if f.startswith(b"/")]
            assert events == [str(i).encode() for i in range(30)] + [b"last"]

    asyncio.run(main())


def test_guble_env_aliases() -> None:
    cfg = load_config(
        env={
            "GUBLE_HTTP_LISTEN": ":8099",
            "GUBLE_STORAGE_PATH": "/tmp/g",
            "GUBLE_NODE_ID": "4",
            "GUBLE_METRICS_ENDPOINT": "",
            "GUBLE_KVS": "memory",
        }
    )
    guble = cfg.section(GubleConfig)
    assert (cfg.http.listen, cfg.storage.data_dir, guble.node_id, guble.metrics_endpoint) == (
        "0.0.0.0:8099",
        "/tmp/g",
        4,
        "",
    )
    # A HUBBUB_* variable or a hubbub flag wins over the alias; a guble flag beats a guble variable.
    cfg = load_config(
        cli={"--node-id": "6", "--http": "127.0.0.1:1"},
        env={"GUBLE_NODE_ID": "5", "GUBLE_HTTP_LISTEN": ":2", "HUBBUB_HTTP_LISTEN": "127.0.0.1:3"},
    )
    assert (cfg.section(GubleConfig).node_id, cfg.http.listen) == (6, "127.0.0.1:3")
    cfg = load_config(cli={"http.listen": "127.0.0.1:4", "--http": ":5"}, env={})
    assert cfg.http.listen == "127.0.0.1:4"


def test_fetch_selection_ignores_commits_after_the_snapshot(tmp_path: Path) -> None:
    """Commits that race a fetch (after its mark) are not part of it, and do not shrink a backward one."""
    store = open_store("memory", str(tmp_path), "commit", RetentionPolicy(), 600)
    store.append([AppendRequest("/c", Publisher("native"), str(i).encode(), "x") for i in range(30)])

    def odd(e: Event) -> bool:
        return e.seq % 2 == 1

    fetches = [("/", -3, None, every), ("/c", -3, None, odd), ("/c", 25, 2, every), ("/c", 0, None, every)]
    plans = [(ch, guble_fetch(store, ch, start, most, keep), keep) for ch, start, most, keep in fetches]
    assert guble_fetch(store, "/c", 31, None, every).scan is None
    store.append([AppendRequest("/c", Publisher("native"), b"late", "x") for i in range(5)])
    got = [[e.seq for e in fetched(store, ch, p, keep)] for ch, p, keep in plans]
    assert got == [[28, 29, 30], [25, 27, 29], [25, 26], list(range(1, 31))]
    store.close()


def guble_cli_url(url: str, user: str) -> str:
    """The URL guble-cli dials: its --url without a trailing slash, then ``/user/`` and its --user (its
    main.go: ``fmt.Sprintf("%v/user/%v", removeTrailingSlash(args.URL), args.User)``)."""
    return f"{url.removesuffix('/')}/user/{user}"


def test_guble_cli_with_auth_presents_its_token_as_the_user(tmp_path: Path) -> None:
    """guble-cli cannot add a header, and a ``?token=`` in its --url ends up before ``/user/<name>`` (in the
    query, where it breaks both the token and the path); its Go WebSocket dialer (gorilla) refuses a URL with
    credentials. With guble.auth = token its --user carries the token, and the token's user is the userId."""
    tokens = {"tok-alice": {"user": "alice"}, "tok/slash": {"user": "bob"}}

    async def main() -> None:
        async with (
            serve(tmp_path / "d", **{"auth.mode": "token", "auth.tokens": tokens}) as addr,
            aiohttp.ClientSession() as http,
        ):
            url = f"ws://{addr}/stream/"  # as given to guble-cli --url
            async with http.ws_connect(guble_cli_url(url, "tok-alice")) as ws:
                m = CONNECTED.fullmatch((await recv(ws)).decode())
                assert m is not None and m.group(2) == "alice"  # the token's user, not the token
                await ws.send_str("+ /foo\n")
                assert await recv(ws) == b"#subscribed-to /foo"
                await ws.send_str("> /foo\n\nhi")
                assert await recv(ws) == b"#send"
                assert meta(await recv(ws))[:3] == ["/foo", "1", "alice"]
            async with http.ws_connect(guble_cli_url(url, "tok%2Fslash")) as ws:  # percent-encoded in a path
                m = CONNECTED.fullmatch((await recv(ws)).decode())
                assert m is not None and m.group(2) == "bob"
            for user in ("not-a-token", ""):
                try:
                    async with http.ws_connect(guble_cli_url(url, user)):
                        raise AssertionError("connected without a valid token")
                except aiohttp.WSServerHandshakeError as exc:
                    assert exc.status == 401
            # A header or query token still wins over the path (the path is then only guble's userId slot).
            async with http.ws_connect(
                guble_cli_url(url, "whatever"), headers={"Authorization": "Bearer tok-alice"}
            ) as ws:
                m = CONNECTED.fullmatch((await recv(ws)).decode())
                assert m is not None and m.group(2) == "alice"

    asyncio.run(main())


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_basic_auth_carries_the_token(tmp_path: Path) -> None:
    """Credentials in a URL's user part become ``Authorization: Basic`` in most HTTP and WebSocket clients
    (curl -u, browsers' XMLHttpRequest, Python's and Node's ws libraries): the password is the token, or the
    user name when the password is empty."""
    auth = {"auth.mode": "token", "auth.tokens": {"tok-alice": {"user": "alice"}}}

    async def main() -> None:
        async with serve(tmp_path / "d", **auth) as addr, aiohttp.ClientSession() as http:
            for headers, status in [
                (basic("tok-alice", ""), 200),
                (basic("anyone", "tok-alice"), 200),
                (basic("anyone", "wrong"), 401),
                ({"Authorization": "Basic not-base64!"}, 401),
            ]:
                async with http.post(f"http://{addr}/api/message/foo", data=b"x", headers=headers) as r:
                    assert r.status == status, (headers, r.status)
            async with http.ws_connect(f"ws://{addr}/stream/", headers=basic("x", "tok-alice")) as ws:
                m = CONNECTED.fullmatch((await recv(ws)).decode())
                assert m is not None and m.group(2) == "alice"

    asyncio.run(main())


def test_a_fetch_counts_only_the_events_the_connection_gets(tmp_path: Path) -> None:
    """An event addressed to another user (a filter header) is not part of a fetch: the announced count
    leaves it out and the block holds every other one, in order (guble.md §5)."""

    async def main() -> None:
        async with serve(tmp_path / "d") as addr, aiohttp.ClientSession() as http:
            base = f"http://{addr}"
            for i, to in enumerate(["", "carol", "", "dave", ""]):
                query = f"userId=m&filterUserId={to}" if to else "userId=m"
                async with http.post(f"{base}/api/message/f/{i % 2}?{query}", data=f"b{i}".encode()) as r:
                    assert r.status == 200
            ws, _ = await connect(http, addr, "dave")
            await ws.send_str("+ /f 0 0")
            assert await recv(ws) == b"#fetch-start /f 4"
            frames = [await recv(ws) for _ in range(4)]
            assert [(meta(f)[0], f.rsplit(b"\n", 1)[-1]) for f in frames] == [
                ("/f/0", b"b0"),
                ("/f/0", b"b2"),
                ("/f/1", b"b3"),
                ("/f/0", b"b4"),
            ]
            assert await recv(ws) == b"#fetch-end /f"
            await ws.close()

    asyncio.run(main())
