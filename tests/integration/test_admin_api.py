"""The dashboard's admin API over HTTP against a real server in process (docs/operations.md "Admin API"):
the overview with its traffic history, channels paged with a cursor and filtered, connections of every
dialect listed and closed, durable consumers' backlogs as events are published and acknowledged, deleting and
resetting them, federation links, the admin permission, and the page's static files.

Tests wait on conditions with timeouts, never on time passing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub import __version__
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest, StoreStats
from hubbub.log.sqlite import SqliteLogStore
from hubbub.server import Server
from hubbub.server_config import load_config

from .consumer_wire import Wire

HOST = "127.0.0.1"
WAIT = 10.0
TOKENS = {
    "tok-root": {"user": "root", "admin": True},
    "tok-alice": {"user": "alice", "publish": ["/**"], "subscribe": ["/**"]},
}
ADMIN = {"Authorization": "Bearer tok-root"}


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **extra: Any) -> AsyncIterator[tuple[Server, aiohttp.ClientSession, str]]:
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "d"),
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
    }
    cli.update(extra)
    async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
        yield server, http, f"http://{HOST}:{server.ports['http']}"


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


async def get(http: aiohttp.ClientSession, url: str, status: int = 200, **kw: Any) -> Any:
    async with http.get(url, **kw) as r:
        assert r.status == status, (r.status, await r.text())
        return await r.json()


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Poll ``check`` (an API request: the server has no event to wait on) until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def publish_many(server: Server, items: list[tuple[str, str]]) -> None:
    node = server.node
    assert node is not None
    await asyncio.gather(
        *(node.publish(AppendRequest(ch, Publisher("native"), p.encode(), "text/plain")) for ch, p in items)
    )


def test_overview_shows_the_node_and_its_traffic_history(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path) as (server, http, base):
            empty = await get(http, base + "/api/v1/admin/overview")
            assert empty["log"]["oldest_ns"] == "0" and empty["log"]["events"] == 0
            w = await Wire.open(server.ports, "tcp", "json")
            await publish_many(server, [(f"/o/{i % 3}", str(i)) for i in range(30)])
            dash = server.dashboard
            assert dash is not None
            # Two samples around 30 publishes: the later one's rate counts them.
            dash.history.sample()
            await publish_many(server, [("/o/x", str(i)) for i in range(30)])
            s = dash.history.sample()
            assert s is not None and s.events_in > 0 and s.connections == 1
            o = await get(http, base + "/api/v1/admin/overview")
            assert o["version"] == __version__ and o["durability"] == "commit"
            assert o["store"].startswith("data_dir ") and o["health"] == {"store": "ok"}
            assert o["broker"] == {} and o["presence"] == {"state": "local"}
            assert o["log"]["events"] == 60 and o["log"]["channels"] == 4 and o["log"]["bytes"] > 0
            assert 0 < int(o["log"]["oldest_ns"]) <= int(o["log"]["newest_ns"])
            assert o["connections"] == {"total": 1, "by_dialect": {"native": 1}}
            assert o["events"]["published"] == 60
            assert o["uptime_s"] >= 0 and o["federation_id"]
            samples = o["history"]["samples"]
            assert samples and samples[-1][1] == round(s.events_in, 3) and samples[-1][3] == 1
            assert all(a[0] <= b[0] for a, b in itertools.pairwise(samples))
            # The ring fills by itself, every interval.
            n = len(dash.history.samples)

            async def sampled() -> bool:
                return len(dash.history.samples) > n

            await until(sampled, "a sample of the history's own loop")
            await w.close()

    run(body)


def test_the_logs_counts_are_read_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The overview and /metrics show the log's counts, read on a reader thread: the store sums its channels'
    rows (milliseconds with 10,000 channels, a round trip to PostgreSQL), which would hold every connection's
    loop."""
    threads: list[int] = []
    stats = SqliteLogStore.stats

    def recording(self: SqliteLogStore) -> StoreStats:
        threads.append(threading.get_ident())
        return stats(self)

    monkeypatch.setattr(SqliteLogStore, "stats", recording)

    async def body() -> None:
        loop_thread = threading.get_ident()
        async with serve(tmp_path) as (server, http, base):
            await publish_many(server, [(f"/s/{i % 2}", str(i)) for i in range(5)])
            threads.clear()  # (the metrics registry's first collect, at start, reads nothing of the store)
            o = await get(http, base + "/api/v1/admin/overview")
            assert (o["log"]["events"], o["log"]["channels"]) == (5, 2)
            async with http.get(base + "/metrics") as r:
                text = await r.text()
            assert "hubbub_log_events 5.0" in text and "hubbub_channels 2.0" in text
            assert len(threads) == 2 and loop_thread not in threads, threads

    run(body)


def test_channels_page_with_a_cursor_a_pattern_and_a_search(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path) as (server, http, base):
            names = [f"/c/{i:03d}" for i in range(250)] + ["/d/x", "/d/y/z"]
            await publish_many(server, [(n, "a") for n in names] + [("/c/007", "b")])
            sub = await Wire.open(server.ports, "ws", "json")
            r = await sub.request({"op": "subscribe", "sub": "s", "pattern": "/c/007"})
            assert r["op"] == "reply"
            seen: list[str] = []
            after = ""
            pages = 0
            while True:
                page = await get(http, base + f"/api/v1/admin/channels?limit=100&after={after}")
                seen += [c["channel"] for c in page["channels"]]
                pages += 1
                if page["next"] is None:
                    break
                after = page["next"]
            assert seen == sorted(names) and pages == 3
            page = await get(http, base + "/api/v1/admin/channels?pattern=/c/**&limit=10")
            first = page["channels"][7]
            assert first == {
                "channel": "/c/007",
                "epoch": first["epoch"],
                "first": 1,
                "top": 2,
                "count": 2,
                "last_ns": first["last_ns"],
                "rate": None,
                "subscribers": {"native": 1},
            }
            assert int(first["last_ns"]) > 0
            assert page["next"] == "/c/009"
            found = await get(http, base + "/api/v1/admin/channels?q=y/&limit=10")
            assert [c["channel"] for c in found["channels"]] == ["/d/y/z"] and found["next"] is None
            found = await get(http, base + "/api/v1/admin/channels?q=/c/1&limit=20")
            assert [c["channel"] for c in found["channels"]] == [f"/c/{i}" for i in range(100, 120)]
            assert found["next"] == "/c/119"
            found = await get(http, base + "/api/v1/admin/channels?q=/c/1&limit=100&after=/c/119")
            assert [c["channel"] for c in found["channels"]] == [f"/c/{i}" for i in range(120, 200)]
            assert found["next"] is None
            await get(http, base + "/api/v1/admin/channels?pattern=nope", status=400)
            await get(http, base + "/api/v1/admin/channels?limit=0", status=400)
            await sub.close()

    run(body)


def test_channel_tree_one_level_at_a_time(tmp_path: Path) -> None:
    """The tree's levels: each child once with whether it is a channel and has channels below it (a subtree
    passed over whole), paged; ``b-2`` sorts between ``b`` and ``b/…`` and is found all the same."""

    async def body() -> None:
        async with serve(tmp_path) as (server, http, base):
            names = ["/t", "/t/a", "/t/a-2", "/t/a/x/y", "/t/b/c", "/u"] + [f"/t/b/c{i}" for i in range(50)]
            await publish_many(server, [(n, "x") for n in names])
            url = base + "/api/v1/admin/channels/tree"
            root = await get(http, url)
            assert root == {
                "prefix": "",
                "children": [
                    {"name": "t", "path": "/t", "channel": True, "children": True},
                    {"name": "u", "path": "/u", "channel": True, "children": False},
                ],
                "next": None,
            }
            t = await get(http, url + "?prefix=/t/")
            assert t["children"] == [
                {"name": "a", "path": "/t/a", "channel": True, "children": True},
                {"name": "a-2", "path": "/t/a-2", "channel": True, "children": False},
                {"name": "b", "path": "/t/b", "channel": False, "children": True},
            ]
            seen: list[str] = []
            after = ""
            while True:
                page = await get(http, url + f"?prefix=/t&limit=1&after={after}")
                assert len(page["children"]) <= 1
                seen += [c["name"] for c in page["children"] if c["name"] not in seen]
                if page["next"] is None:
                    break
                after = page["next"]
            assert seen == ["a", "a-2", "b"]
            leaves = sorted(["c"] + [f"c{i}" for i in range(50)])
            assert (await get(http, url + "?prefix=/t/b"))["children"] == [
                {"name": n, "path": f"/t/b/{n}", "channel": True, "children": False} for n in leaves
            ]
            assert (await get(http, url + "?prefix=/nothing"))["children"] == []
            await get(http, url + "?prefix=/t/*", status=400)

    run(body)


async def _native_ws(http: aiohttp.ClientSession, base: str) -> Any:
    ws = await http.ws_connect(base + "/ws/hubbub", protocols=("hubbub.v1.json",))
    await ws.send_json({"op": "hello", "id": 1, "v": 1})
    assert (await ws.receive_json())["op"] == "reply"
    return ws


async def _ivy(http: aiohttp.ClientSession, base: str) -> Any:
    ws = await http.ws_connect(base + "/ws", protocols=("ivy1",))
    assert (await ws.receive_str()).startswith("@")
    return ws


async def _guble(http: aiohttp.ClientSession, base: str) -> Any:
    ws = await http.ws_connect(base + "/stream/")
    await ws.receive_bytes()
    return ws


#: An MQTT 3.1.1 CONNECT (client id "a", clean session, keepalive 60 s) and the CONNACK that accepts it.
MQTT_CONNECT = b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a"
MQTT_CONNACK = b"\x20\x02\x00\x00"


async def _wearscript(http: aiohttp.ClientSession, base: str) -> Any:
    return await http.ws_connect(base + "/wearscript/ws")


async def _mist(http: aiohttp.ClientSession, base: str) -> Any:
    return await http.ws_connect(base + "/mist/ws")


async def _mqtt_ws(http: aiohttp.ClientSession, base: str) -> Any:
    ws = await http.ws_connect(base + "/mqtt", protocols=("mqtt",))
    await ws.send_bytes(MQTT_CONNECT)
    assert await ws.receive_bytes() == MQTT_CONNACK
    return ws


async def _closed_ws(ws: Any) -> None:
    """The WebSocket's close code is 1001 (what it was sent before is the dialect's own)."""
    async with asyncio.timeout(WAIT):
        msg = await ws.receive()
        while msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            msg = await ws.receive()
    assert (msg.type, msg.data) == (aiohttp.WSMsgType.CLOSE, 1001), msg


def test_connections_of_every_dialect_are_listed_paged_and_closed(tmp_path: Path) -> None:
    """Each connection shows with its dialect, peer and subscriptions; DELETE closes it as the server's
    shutdown does (1001 on a WebSocket of native, ivy, guble, WearScript, mist and MQTT; native's and MQTT's
    TCP sockets end; an SSE and a qpubs HTTP stream end), and it leaves the list."""

    async def body() -> None:
        async with serve(tmp_path) as (server, http, base):
            url = base + "/api/v1/admin/connections"

            async def ids() -> set[str]:
                return {c["id"] for c in (await get(http, url + "?limit=500"))["connections"]}

            async def opened(before: set[str]) -> dict[str, Any]:
                new: list[dict[str, Any]] = []

                async def one() -> bool:
                    new[:] = [
                        c
                        for c in (await get(http, url + "?limit=500"))["connections"]
                        if c["id"] not in before
                    ]
                    return len(new) == 1

                await until(one, "the new connection")
                return new[0]

            async def gone(sid: str) -> bool:
                return sid not in await ids()

            # WebSockets: native, ivy, guble.
            for dialect, connect in (
                ("native", _native_ws),
                ("ivy", _ivy),
                ("guble", _guble),
                ("wearscript", _wearscript),
                ("mist", _mist),
                ("mqtt", _mqtt_ws),
            ):
                before = await ids()
                ws = await connect(http, base.replace("http:", "ws:"))
                c = await opened(before)
                assert c["dialect"].startswith(dialect) and c["peer"].startswith(f"{HOST}:"), c
                async with http.delete(url + "/" + c["id"]) as r:
                    assert r.status == 200 and (await r.json()) == {
                        "closed": c["id"],
                        "dialect": c["dialect"],
                    }
                await _closed_ws(ws)
                await until(functools.partial(gone, c["id"]), "the closed connection gone")
            # MQTT over TCP: its socket ends.
            before = await ids()
            reader, writer = await asyncio.open_connection(HOST, server.ports["mqtt"])
            writer.write(MQTT_CONNECT)
            assert await asyncio.wait_for(reader.readexactly(4), WAIT) == MQTT_CONNACK
            c = await opened(before)
            assert c["dialect"] == "mqtt"
            async with http.delete(url + "/" + c["id"]) as r:
                assert r.status == 200
            assert await asyncio.wait_for(reader.read(), WAIT) == b""
            writer.close()
            # Native TCP: listed with its subscription and peer, closed.
            before = await ids()
            tcp = await Wire.open(server.ports, "tcp", "json")
            assert tcp._writer is not None
            local = tcp._writer.get_extra_info("sockname")
            assert (await tcp.request({"op": "subscribe", "sub": "a", "pattern": "/t/**"}))["op"] == "reply"
            c = await opened(before)
            assert (c["dialect"], c["peer"], c["subscriptions"], c["patterns"]) == (
                "native",
                f"{local[0]}:{local[1]}",
                1,
                ["/t/**"],
            )
            assert c["queued"] == 0 and c["dropped"] == 0 and int(c["opened_ns"]) > 0
            async with http.delete(url + "/" + c["id"]) as r:
                assert r.status == 200
            assert tcp._reader is not None
            assert await asyncio.wait_for(tcp._reader.read(), WAIT) == b""  # closed, no error frame
            await tcp.close()
            # SSE: the stream ends.
            before = await ids()
            async with http.get(base + "/api/v1/stream/s/**") as sse:
                assert sse.status == 200
                c = await opened(before)
                assert c["dialect"] == "native" and c["patterns"] == ["/s/**"]
                async with http.delete(url + "/" + c["id"]) as r:
                    assert r.status == 200
                await asyncio.wait_for(sse.content.read(), WAIT)  # to its end
            # A qpubs HTTP stream: its session is the listener of the Qpubs-Listener header.
            before = await ids()
            async with http.get(base + "/qpubs/listen?topic=q.*") as stream:
                assert stream.status == 200
                sid = stream.headers["Qpubs-Listener"]
                c = await opened(before)
                assert (c["id"], c["dialect"]) == (sid, "qpubs") and c["peer"].startswith(f"{HOST}:")
                async with http.delete(url + "/" + sid) as r:
                    assert r.status == 200
                await asyncio.wait_for(stream.content.read(), WAIT)  # to its end
            await until(lambda: gone(sid), "the qpubs stream gone")
            async with http.delete(url + "/0123456789abcdef") as r:
                assert r.status == 404

            # Paging: five connections, two at a time, in id order, none twice.
            conns = [await Wire.open(server.ports, "tcp", "json") for _ in range(5)]

            async def five() -> bool:
                return len(await ids()) == 5

            await until(five, "five connections")
            got: list[str] = []
            after = ""
            while True:
                page = await get(http, url + f"?limit=2&after={after}")
                assert page["total"] == 5 and len(page["connections"]) <= 2
                got += [c["id"] for c in page["connections"]]
                if page["next"] is None:
                    break
                after = page["next"]
            assert got == sorted(await ids())
            assert (await get(http, url + "?dialect=ivy"))["connections"] == []
            for w in conns:
                await w.close()

    run(body)


def test_consumer_backlog_grows_and_shrinks_and_admin_deletes_and_resets(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path) as (server, http, base):
            url = base + "/api/v1/admin/consumers"
            w = await Wire.open(server.ports, "tcp", "json")
            r = await w.request({"op": "consume", "consumer": "jobs", "pattern": "/jobs/**", "max": 100})
            assert r["op"] == "reply"
            assert (await w.request({"op": "unconsume", "consumer": "jobs"}))["op"] == "reply"

            async def row() -> dict[str, Any]:
                rows = (await get(http, url))["consumers"]
                assert [c["name"] for c in rows] == ["jobs"]
                return dict(rows[0])

            c = await row()
            assert (c["pattern"], c["backlog"], c["in_flight"], c["last_ack_ns"]) == ("/jobs/**", 0, 0, "0")
            await publish_many(server, [("/jobs/a", str(i)) for i in range(7)])
            assert (await row())["backlog"] == 7
            r = await w.request({"op": "consume", "consumer": "jobs", "create": False, "max": 100})
            assert r["op"] == "reply"
            got: list[dict[str, Any]] = []
            batches: list[int] = []
            while len(got) < 7:
                d = await w.push()
                got += d["items"]
                batches.append(d["batch"])
            assert [it["text"] for it in got] == [str(i) for i in range(7)]

            async def in_flight() -> bool:
                c = await row()
                return bool(c["in_flight"] == 7 and c["backlog"] == 7 and c["openers"] == 1)

            await until(in_flight, "7 in flight")
            # Acknowledged: the backlog empties and the last acknowledgement is set.
            for b in batches:
                assert (await w.request({"op": "ack", "consumer": "jobs", "batch": b}))["op"] == "reply"

            async def drained() -> bool:
                c = await row()
                return bool(c["backlog"] == 0 and c["in_flight"] == 0 and c["acked"] == 7)

            await until(drained, "the backlog acknowledged")
            assert int((await row())["last_ack_ns"]) > 0
            # Reset: the backlog dropped, the consumer kept (pattern, owner), journaling from now.
            await publish_many(server, [("/jobs/b", str(i)) for i in range(3)])

            async def three() -> bool:
                return bool((await row())["backlog"] == 3)

            await until(three, "3 more in the backlog")
            async with http.post(url + "/jobs/reset") as resp:
                assert resp.status == 200 and (await resp.json()) == {"reset": "jobs", "backlog": 0}
            c = await row()
            assert (c["pattern"], c["backlog"], c["in_flight"]) == ("/jobs/**", 0, 0)
            await publish_many(server, [("/jobs/c", "after")])
            assert (await row())["backlog"] == 1
            async with http.delete(url + "/jobs") as resp:
                assert resp.status == 200 and (await resp.json()) == {"deleted": "jobs"}
            assert (await get(http, url))["consumers"] == []
            async with http.delete(url + "/jobs") as resp:
                assert resp.status == 404
            async with http.post(url + "/jobs/reset") as resp:
                assert resp.status == 404
            await w.close()

    run(body)


def test_admin_routes_need_an_admin_token(tmp_path: Path) -> None:
    async def body() -> None:
        extra = {"auth.mode": "token", "auth.tokens": TOKENS}
        async with serve(tmp_path, **extra) as (_, http, base):
            routes = [
                ("GET", "/api/v1/admin/overview"),
                ("GET", "/api/v1/admin/channels"),
                ("GET", "/api/v1/admin/connections"),
                ("DELETE", "/api/v1/admin/connections/0123456789abcdef"),
                ("GET", "/api/v1/admin/consumers"),
                ("DELETE", "/api/v1/admin/consumers/x"),
                ("POST", "/api/v1/admin/consumers/x/reset"),
                ("GET", "/api/v1/admin/federation"),
                ("GET", "/api/v1/cluster"),  # node ids and states are operators' information too
            ]
            for method, path in routes:
                for headers, status in (
                    ({}, 401),
                    ({"Authorization": "Bearer nope"}, 401),
                    ({"Authorization": "Bearer tok-alice"}, 403),
                ):
                    async with http.request(method, base + path, headers=headers) as r:
                        assert r.status == status, (method, path, headers, r.status)
                        assert "error" in await r.json()
            o = await get(http, base + "/api/v1/admin/overview", headers=ADMIN)
            assert o["version"] == __version__
            f = await get(http, base + "/api/v1/admin/federation", headers=ADMIN)
            assert f["node_id"] and f["upstreams"] == [] and f["downstreams"] == []
            assert await get(http, base + "/api/v1/cluster", headers=ADMIN) == {"nodes": []}
            # The page itself holds no data: served without a token.
            async with http.get(base + "/ui/") as r:
                assert r.status == 200

    run(body)


def test_another_sites_page_may_not_change_the_node(tmp_path: Path) -> None:
    """With auth off, a change (DELETE, POST) sent by another site's page (its Origin) is refused; the page's
    own origin, and a script without Origin, go through to the route (404 here: nothing of that name)."""

    async def body() -> None:
        async with serve(tmp_path) as (_, http, base):
            for method, path in (
                ("DELETE", "/api/v1/admin/connections/0123456789abcdef"),
                ("DELETE", "/api/v1/admin/consumers/x"),
                ("POST", "/api/v1/admin/consumers/x/reset"),
            ):
                for headers, status in (
                    ({"Origin": "http://evil.example"}, 403),
                    ({"Origin": base}, 404),
                    ({}, 404),
                ):
                    async with http.request(method, base + path, headers=headers) as r:
                        assert r.status == status, (method, path, headers)
            # Reads stay open to any page's fetch (the browser keeps their answers from other origins).
            await get(http, base + "/api/v1/admin/overview", headers={"Origin": "http://evil.example"})

    run(body)


def test_federation_links_show_with_their_states(tmp_path: Path) -> None:
    """Node B linked up to A: B shows its link up with A's id, A shows B's link from below."""

    async def body() -> None:
        async with serve(tmp_path / "a", **{"federation.node_id": "A"}) as (a, http, base_a):
            up = f"ws://{HOST}:{a.ports['http']}"
            async with serve(tmp_path / "b", **{"federation.node_id": "B", "upstream": [up]}) as (
                _,
                _h,
                base_b,
            ):

                async def linked() -> bool:
                    f = await get(http, base_b + "/api/v1/admin/federation")
                    return bool(f["upstreams"]) and f["upstreams"][0]["state"] == "up"

                await until(linked, "B's link up")
                f = await get(http, base_b + "/api/v1/admin/federation")
                link = f["upstreams"][0]
                assert (f["node_id"], link["upstream"], link["reconnects"]) == ("B", "A", 0)
                assert f["downstreams"] == []
                f = await get(http, base_a + "/api/v1/admin/federation")
                assert f["node_id"] == "A" and f["upstreams"] == []
                assert [(d["node"], d["connected"]) for d in f["downstreams"]] == [("B", 1)]

    run(body)


def test_the_page_is_served_with_its_files_and_can_be_turned_off(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path / "on") as (server, http, base):
            async with http.get(base + "/ui", allow_redirects=False) as r:
                assert r.status == 308 and r.headers["Location"] == "/ui/"
            async with http.get(base + "/ui/") as r:
                page = await r.text()
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
                assert "default-src 'self'" in r.headers["Content-Security-Policy"]
                assert '<script type="module" src="app.js">' in page and "<main" in page
                etag = r.headers["ETag"]
            async with http.get(base + "/ui/", headers={"If-None-Match": etag}) as r:
                assert r.status == 304
            for name in ("app.js", "api.js", "views.js", "tail.js", "msgpack.js", "chart.js"):
                async with http.get(base + "/ui/" + name) as r:
                    assert r.status == 200 and r.headers["Content-Type"].startswith("text/javascript")
            async with http.get(base + "/ui/style.css") as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/css")
            async with http.get(base + "/ui/../server.py") as r:
                assert r.status == 404
            async with http.get(base + "/ui/nope.js") as r:
                assert r.status == 404
        async with serve(tmp_path / "off", **{"dashboard.enabled": "false"}) as (server, http, base):
            assert server.dashboard is None
            for path in ("/ui/", "/api/v1/admin/overview"):
                async with http.get(base + path) as r:
                    assert r.status == 404

    run(body)


@pytest.mark.parametrize(
    ("listen", "mode", "enabled", "serves"),
    [
        ("127.0.0.1:8080", "off", "auto", True),
        ("[::1]:8080", "off", "auto", True),
        ("localhost:8080", "off", "auto", True),
        ("0.0.0.0:8080", "off", "auto", False),
        ("0.0.0.0:8080", "token", "auto", True),
        ("0.0.0.0:8080", "off", "true", True),
        ("127.0.0.1:8080", "token", "false", False),
    ],
)
def test_dashboard_enabled_auto_is_on_for_loopback_or_auth(
    listen: str, mode: str, enabled: str, serves: bool
) -> None:
    cfg = load_config(cli={"http.listen": listen, "auth.mode": mode, "dashboard.enabled": enabled}, env={})
    assert cfg.dashboard.serves(cfg) is serves
