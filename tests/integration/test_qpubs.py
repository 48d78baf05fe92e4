"""qpubs over real sockets (protocols/qpubs.md): what the conformance vectors leave out. Auth on both
surfaces (§8), the HTTP listener controls (ignore by listener id, once with a timeout, heartbeats, 405,
413), durable subscriptions beyond the backlog batch (nack and backoff, close, delete from another
connection, refusals), work queues and ``listenExclusive`` groups, other dialects feeding qpubs listens and
subscriptions, the configurable separator, and bad qrpc input.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from hubbub.config import ConfigError
from hubbub.dialects.qpubs import QpubsConfig
from hubbub.server import Server
from hubbub.server_config import load_config
from tests.conftest import DEFAULT_QRPC_LISTEN

from .qrpcclient import CallError, QrpcClient
from .test_auth_reload import make_cert

WAIT = 10.0
TOKENS = {
    "tok-root": {"user": "root", "admin": True},
    "tok-alice": {"user": "alice", "publish": ["/pub/**"], "subscribe": ["/pub/**"]},
}


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **overrides: Any) -> AsyncIterator[tuple[Server, str]]:
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "qpubs.qrpc_listen": "127.0.0.1:0",
    }
    cli.update(overrides)
    async with Server(load_config(cli=cli, env={})) as srv:
        yield srv, f"http://127.0.0.1:{srv.ports['http']}"


async def barrier(q: QrpcClient) -> None:
    """Every call sent before this one has been handled (calls are handled in arrival order)."""
    assert await q.call("ignore", {"topic": "__barrier__"}) == {"ok": True, "removed": 0}


async def emit(http: aiohttp.ClientSession, base: str, topic: str, value: Any, **kw: Any) -> Any:
    async with http.post(f"{base}/qpubs/emit", params={"topic": topic}, json=value, **kw) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def test_auth_on_qrpc_and_http(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = {"auth.mode": "token", "auth.tokens": TOKENS}
        async with serve(tmp_path, **cfg) as (srv, base), aiohttp.ClientSession() as http:
            q = await QrpcClient.connect(srv.ports["qrpc"])
            with pytest.raises(CallError) as e:
                await q.call("emit", {"topic": "pub.x", "value": 1})
            assert (e.value.code, e.value.message) == ("EAUTH", "unauthorized")
            with pytest.raises(CallError) as e:
                await q.call("auth", {"token": "nope"})
            assert e.value.code == "EAUTH"
            assert await q.call("auth", {"token": "tok-alice"}) == {"ok": True, "user": "alice"}
            with pytest.raises(CallError) as e:
                await q.call("emit", {"topic": "secret.x", "value": 1})
            assert (e.value.code, e.value.message) == ("EPERM", "forbidden")
            lid = q.send("listen", {"topic": "pub.*"})
            await barrier(q)
            # HTTP: no token 401, a token in the query or the header, a forbidden emit 403.
            async with http.post(f"{base}/qpubs/emit?topic=pub.x", data=b"1") as r:
                assert (r.status, await r.json()) == (401, {"ok": False, "error": "unauthorized"})
            async with http.post(f"{base}/qpubs/emit?topic=secret.x&token=tok-alice", data=b"1") as r:
                assert (r.status, await r.json()) == (403, {"ok": False, "error": "forbidden"})
            hdr = {"Authorization": "Bearer tok-alice"}
            assert await emit(http, base, "pub.x", 5, headers=hdr) == {"ok": True, "delivered": 1}
            assert (await q.next(lid))["m"] == {"topic": "pub.x", "value": 5}
            # The aliases take the header only: the whole query string is the topic.
            async with http.get(f"{base}/emit?pub.y,6") as r:
                assert r.status == 401
            async with http.get(f"{base}/emit?pub.y,6", headers=hdr) as r:
                assert await r.json() == {"ok": True, "delivered": 1}
            assert (await q.next(lid))["m"] == {"topic": "pub.y", "value": 6}
            # A durable subscription hands out all it journals: alice may have one over what she reads, not
            # one that journals channels she may not read too (docs/consumers.md "Permissions").
            for call in ("createSubscription", "openSubscription"):
                with pytest.raises(CallError) as e:
                    await q.call(call, {"subId": "all-x", "topic": "*.x"})
                assert (e.value.code, e.value.message) == ("EPERM", "forbidden")
            oid = q.send("openSubscription", {"subId": "pub-x", "topic": "pub.*"})
            await barrier(q)
            root = await QrpcClient.connect(srv.ports["qrpc"])
            assert (await root.call("auth", {"token": "tok-root"}))["user"] == "root"
            await root.call("emit", {"topic": "secret.x", "value": "no"})
            await root.call("emit", {"topic": "pub.x", "value": "yes"})
            m = (await q.next(oid))["m"]
            assert [(it["pos"], it["value"]) for it in m["items"]] == [(1, "yes")]
            assert await q.call("ack", {"subId": "pub-x", "batch": m["batch"]}) == {"ok": True}
            await root.close()
            await q.close()

    asyncio.run(main())


def test_http_ignore_once_timeout_heartbeat_and_refusals(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = {"qpubs.heartbeat_s": 0.2, "limits.max_frame": 4096}
        async with serve(tmp_path, **cfg) as (_srv, base), aiohttp.ClientSession() as http:
            r = await http.get(f"{base}/qpubs/listen?topic=h.*")
            assert r.headers["Content-Type"].startswith("application/x-ndjson")
            lid = r.headers["Qpubs-Listener"]
            # Silence gives heartbeats: empty lines.
            assert await asyncio.wait_for(r.content.readline(), WAIT) == b"\n"
            # ignore with another topic removes nothing; with the stream's own, ends the stream.
            async with http.post(f"{base}/qpubs/ignore", params={"topic": "x", "listener": lid}) as a:
                assert await a.json() == {"ok": True, "removed": 0}
            async with http.post(f"{base}/qpubs/ignore", params={"topic": "h.*", "listener": lid}) as a:
                assert await a.json() == {"ok": True, "removed": 1}
            rest = await asyncio.wait_for(r.content.read(), WAIT)
            assert rest.strip(b"\n") == b""
            r.release()
            # once with a timeout and no event: an empty body.
            t0 = time.monotonic()
            async with http.get(f"{base}/qpubs/once", params={"topic": "none", "timeout_ms": "100"}) as o:
                assert o.status == 200 and await o.read() == b""
            assert time.monotonic() - t0 >= 0.09
            async with http.get(f"{base}/qpubs/emit?topic=x") as a:
                assert (a.status, await a.json()) == (405, {"ok": False, "error": "method not allowed"})
            async with http.post(f"{base}/qpubs/emit?topic=x", data=b"1" * 8000) as a:
                assert (a.status, await a.json()) == (413, {"ok": False, "error": "too large"})
            async with http.get(f"{base}/once?a*") as a:  # never matches, but accepted: closed by us
                assert a.status == 200
            async with http.get(f"{base}/ignore?a.b") as a:
                assert await a.json() == {"ok": True, "removed": 0}
            # A once whose client goes away is noticed within a heartbeat interval, though it writes nothing.
            node = _srv.node
            assert node is not None
            before = len(node.sessions)
            o = await http.get(f"{base}/qpubs/once", params={"topic": "never"})
            assert len(node.sessions) == before + 1
            o.close()
            deadline = time.monotonic() + WAIT
            while len(node.sessions) > before:  # a condition, polled: the server has no event to wait on
                assert time.monotonic() < deadline, "the abandoned once was not noticed"
                await asyncio.sleep(0.05)

    asyncio.run(main())


def test_once_timeout_ms_is_checked_and_tag_parameters_are_not_qpubs(tmp_path: Path) -> None:
    """``timeout_ms`` is an integer from 0 to 2^31-1 (a negative one made a once that never timed out, a
    huge one one that never would); qpubs has no tags (mapping.md §5.2), so ``tag`` parameters, however many,
    are ignored like any other unknown parameter and never meet the native tag limit."""
    bad = {"ok": False, "error": "bad timeout_ms, expected an integer from 0 to 2147483647"}
    limit = aiohttp.ClientTimeout(total=WAIT)

    async def main() -> None:
        async with serve(tmp_path) as (_srv, base), aiohttp.ClientSession() as http:
            for t in ("-5", "1e20", "100000000000000000000", "2147483648", "1.5", "+5", " 5"):
                # Bounded: such a once used to be registered (200, headers) and then wait for ever.
                params = {"topic": "t", "timeout_ms": t}
                async with http.get(f"{base}/qpubs/once", params=params, timeout=limit) as r:
                    assert (r.status, await r.json()) == (400, bad), t
            # The largest is taken: the once is registered (headers sent) and waits.
            get = http.get(f"{base}/qpubs/once", params={"topic": "t", "timeout_ms": "2147483647"})
            async with await asyncio.wait_for(get, WAIT) as r:
                assert r.status == 200
            tags = [("topic", "tagged")] + [("tag", f"t{i}") for i in range(100)]
            listen = await http.get(f"{base}/qpubs/listen", params=tags)
            assert listen.status == 200
            async with http.post(f"{base}/qpubs/emit", params=tags, json={"n": 1}) as r:
                assert (r.status, await r.json()) == (200, {"ok": True, "delivered": 1})
            line = await asyncio.wait_for(listen.content.readline(), WAIT)
            assert line == b'{"topic":"tagged","value":{"n":1}}\n'
            listen.close()

    asyncio.run(main())


def test_durable_nack_close_delete_and_refusals(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (srv, base), aiohttp.ClientSession() as http:
            q = await QrpcClient.connect(srv.ports["qrpc"])
            q2 = await QrpcClient.connect(srv.ports["qrpc"])
            with pytest.raises(CallError) as e:
                await q.call("openSubscription", {"subId": "s", "topic": "j.*", "create": False})
            assert (e.value.code, e.value.message) == ("ENOENT", "s: not found, may not create")
            with pytest.raises(CallError) as e:
                await q.call("ack", {"subId": "s", "batch": 1})
            assert (e.value.code, e.value.message) == ("ENOENT", "s: not found")
            with pytest.raises(CallError) as e:
                await q.call("createSubscription", {"subId": "bad id!", "topic": "j.*"})
            assert (e.value.code, e.value.message) == ("EBADREQ", "bad subId")
            oid = q.send("openSubscription", {"subId": "s", "topic": "j.*"})
            await barrier(q)
            with pytest.raises(CallError) as e:
                await q2.call("openSubscription", {"subId": "s"})
            assert (e.value.code, e.value.message) == ("EBUSY", "s: already listening")
            assert await emit(http, base, "j.1", "one") == {"ok": True, "delivered": 1}
            b1 = (await q.next(oid))["m"]
            assert b1 == {"subId": "s", "batch": 1, "items": [{"pos": 1, "topic": "j.1", "value": "one"}]}
            with pytest.raises(CallError) as e:
                await q.call("ack", {"subId": "s", "batch": 9})
            assert (e.value.code, e.value.message) == ("EBATCH", "s: unknown batch 9")
            # A nack: the same item again, a new batch number, after the backoff (100 ms).
            t0 = time.monotonic()
            assert await q.call("ack", {"subId": "s", "batch": 1, "error": "retry"}) == {"ok": True}
            b2 = (await q.next(oid))["m"]
            assert time.monotonic() - t0 >= 0.09
            assert (b2["batch"], b2["items"]) == (2, b1["items"])
            # closeSubscription ends the call and gives the batch back; the other connection gets it.
            assert await q.call("closeSubscription", {"subId": "s"}) == {"ok": True, "subId": "s"}
            assert await q.next(oid) == {"v": 1, "id": oid, "s": "end"}
            oid2 = q2.send("openSubscription", {"subId": "s"})
            b3 = (await q2.next(oid2))["m"]
            assert (b3["batch"], b3["items"]) == (3, b1["items"])
            assert await q2.call("ack", {"subId": "s", "batch": 3}) == {"ok": True}
            # deleteSubscription from the first connection ends the open call on the second.
            assert await q.call("deleteSubscription", {"subId": "s"}) == {
                "ok": True,
                "subId": "s",
                "deleted": True,
            }
            assert await q2.next(oid2) == {"v": 1, "id": oid2, "s": "end"}
            assert await q.call("deleteSubscription", {"subId": "s"}) == {
                "ok": True,
                "subId": "s",
                "deleted": False,
            }
            assert await emit(http, base, "j.2", 2) == {"ok": True, "delivered": 0}
            await q.close()
            await q2.close()

    asyncio.run(main())


def test_listen_exclusive_groups_and_work_queues(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (srv, base), aiohttp.ClientSession() as http:
            a = await QrpcClient.connect(srv.ports["qrpc"])
            b = await QrpcClient.connect(srv.ports["qrpc"])
            ga = a.send("listenExclusive", {"topic": "g.*", "group": "G"})
            gb = b.send("listenExclusive", {"topic": "g.*", "group": "G"})
            await barrier(a)
            await barrier(b)
            for i in range(4):  # a group counts once in delivered
                assert await emit(http, base, f"g.{i}", i) == {"ok": True, "delivered": 1}
            got_a = [(await a.next(ga))["m"]["value"] for _ in range(2)]
            got_b = [(await b.next(gb))["m"]["value"] for _ in range(2)]
            assert sorted(got_a + got_b) == [0, 1, 2, 3] and got_a == [0, 2]
            # A shared work queue: each batch to exactly one opener.
            wa = a.send("openSubscription", {"subId": "w", "topic": "w.*", "shared": True})
            await barrier(a)
            wb = b.send("openSubscription", {"subId": "w", "shared": True})
            await barrier(b)
            seen: list[int] = []
            for i in range(6):
                await emit(http, base, f"w.{i}", i)
            while len(seen) < 6:
                for q, cid in ((a, wa), (b, wb)):
                    with contextlib.suppress(TimeoutError):
                        m = (await q.next(cid, 0.05))["m"]
                        seen += [it["value"] for it in m["items"]]
                        assert await q.call("ack", {"subId": "w", "batch": m["batch"]}) == {"ok": True}
            assert sorted(seen) == list(range(6))
            await a.close()
            await b.close()

    asyncio.run(main())


def test_a_group_event_goes_to_a_member_that_may_read_it(tmp_path: Path) -> None:
    """Members of one ``listenExclusive`` group whose tokens read different channels: each event goes to a
    member that may read it, in round-robin among those (a member that may not is passed over, the event
    never dropped for its sake), and an event no member may read goes to none and is not counted in
    ``delivered``. Every value is checked: none lost, none twice, each member's in publish order."""
    tokens = {
        **TOKENS,
        "tok-gx": {"user": "gx", "publish": [], "subscribe": ["/g/x/**", "/g/s/**"]},
        "tok-gy": {"user": "gy", "publish": [], "subscribe": ["/g/y/**", "/g/s/**"]},
    }

    async def main() -> None:
        cfg = {"auth.mode": "token", "auth.tokens": tokens}
        async with serve(tmp_path, **cfg) as (srv, base), aiohttp.ClientSession() as http:
            hdr = {"Authorization": "Bearer tok-root"}
            members: dict[str, tuple[QrpcClient, str]] = {}
            for who in ("gx", "gy"):  # join order: gx first
                q = await QrpcClient.connect(srv.ports["qrpc"])
                assert (await q.call("auth", {"token": f"tok-{who}"}))["user"] == who
                members[who] = (q, q.send("listenExclusive", {"topic": "g.*", "group": "G"}))
                await barrier(q)
            topics = ["g.x.a", "g.x.b", "g.y.a", "g.y.b", "g.z.a", "g.x.c", "g.y.c", "g.x.d", "g.z.b"]
            for i, topic in enumerate(topics):
                nobody = topic.startswith("g.z.")
                assert await emit(http, base, topic, i, headers=hdr) == {
                    "ok": True,
                    "delivered": 0 if nobody else 1,
                }
            # Both may read /g/s: two more events, one to each, end what each member gets.
            for i in (100, 101):
                assert await emit(http, base, "g.s.end", i, headers=hdr) == {"ok": True, "delivered": 1}
            got: dict[str, list[tuple[str, int]]] = {}
            for who, (q, cid) in members.items():
                got[who] = []
                while True:
                    m = (await q.next(cid))["m"]
                    if m["topic"] == "g.s.end":
                        break
                    got[who].append((m["topic"], m["value"]))
            assert got["gx"] == [(t, i) for i, t in enumerate(topics) if t.startswith("g.x.")]
            assert got["gy"] == [(t, i) for i, t in enumerate(topics) if t.startswith("g.y.")]
            for q, _ in members.values():
                await q.close()

    asyncio.run(main())


def test_other_dialects_feed_qpubs_and_the_separator_is_configurable(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = {"qpubs.separator": "::"}
        async with serve(tmp_path, **cfg) as (srv, base), aiohttp.ClientSession() as http:
            q = await QrpcClient.connect(srv.ports["qrpc"])
            tail = q.send("listen", {"topic": "*::done"})
            head = q.send("listen", {"topic": "a::*"})
            assert await q.call("createSubscription", {"subId": "d", "topic": "*::done"}) == {
                "ok": True,
                "subId": "d",
                "created": True,
            }
            # A native publish (text) and one with msgpack reach the listens and the subscription.
            async with http.post(f"{base}/api/v1/publish/a/b/done", data=b"hi") as r:
                assert r.status == 200
            lines = [await q.next(tail), await q.next(head)]
            assert all(m["m"] == {"topic": "a::b::done", "value": "hi"} for m in lines)
            async with http.post(
                f"{base}/api/v1/publish/x/done",
                data=b"\x81\xa1k\x01",
                headers={"Content-Type": "application/msgpack"},
            ) as r:
                assert r.status == 200
            assert (await q.next(tail))["m"] == {"topic": "x::done", "value": {"k": 1}}
            oid = q.send("openSubscription", {"subId": "d"})
            items = (await q.next(oid))["m"]["items"]
            assert [it["topic"] for it in items] == ["a::b::done", "x::done"]
            # A WearScript data message: its arguments, a msgpack array, come as a JSON array.
            chat = q.send("listen", {"topic": "chat::*"})
            await barrier(q)
            ws = await http.ws_connect(base.replace("http", "ws") + "/wearscript/ws")
            await ws.receive(timeout=WAIT)  # the hub's list
            await ws.send_bytes(msgpack.packb(["chat:x", "hello", 1]))
            assert (await q.next(chat))["m"] == {"topic": "chat::x", "value": ["hello", 1]}
            await ws.close()
            assert (await emit(http, base, "a::z", {"n": 1}))["delivered"] == 1  # the head listen
            await q.close()

    asyncio.run(main())


def test_a_msgpack_map_keyed_by_an_array_reaches_qpubs_listens_as_json(tmp_path: Path) -> None:
    """msgpack may key a map with an array or a map; such a payload (here from a native publish) reaches a
    qrpc and an HTTP listen with the key JSON-encoded (mapping.md §5.1 ``jsonval``), and the next event
    after it too."""

    async def main() -> None:
        async with serve(tmp_path) as (srv, base), aiohttp.ClientSession() as http:
            q = await QrpcClient.connect(srv.ports["qrpc"])
            listen = q.send("listen", {"topic": "m.*"})
            await barrier(q)
            stream = await http.get(f"{base}/qpubs/listen", params={"topic": "m.*"})
            assert stream.status == 200
            payloads = [b"\x81\x91\x01\x02", b"\x82\x80\x01\xa1k\x92\x81\x91\xc0\xc3\x02", b"\x81\xa1k\x01"]
            for p in payloads:
                headers = {"Content-Type": "application/msgpack"}
                async with http.post(f"{base}/api/v1/publish/m/x", data=p, headers=headers) as r:
                    assert r.status == 200, await r.text()
            want = [{"[1]": 2}, {"{}": 1, "k": [{"[null]": True}, 2]}, {"k": 1}]
            assert [(await q.next(listen))["m"] for _ in want] == [{"topic": "m.x", "value": v} for v in want]
            lines = [await asyncio.wait_for(stream.content.readline(), WAIT) for _ in want]
            assert [json.loads(line) for line in lines] == [{"topic": "m.x", "value": v} for v in want]
            stream.close()
            await q.close()

    asyncio.run(main())


def test_bad_qrpc_input(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, **{"limits.max_frame": 1024}) as (srv, _base):
            q = await QrpcClient.connect(srv.ports["qrpc"])
            q.writer.write(b'not json\n[1]\n{"n":"emit"}\n')  # skipped: no error, no close
            with pytest.raises(CallError) as e:
                await q.call("emit", {"topic": 5, "value": 1})
            assert e.value.code == "EBADTOPIC"
            msg = await q.next(q.send("emit", {"topic": "t"}))
            assert msg["e"]["code"] == "EBADREQ"
            q.writer.write(json.dumps({"v": 2, "id": "v", "n": "emit", "m": {}}).encode() + b"\n")
            assert (await q.next("v"))["e"]["code"] == "EVERSION"
            q.writer.write(b"x" * 2000 + b"\n")  # over limits.max_frame: the connection closes
            await asyncio.wait_for(q.eof.wait(), WAIT)
            await q.close()

    asyncio.run(main())


def test_tls_on_the_qrpc_listener_and_qpubs_disabled(tmp_path: Path) -> None:
    """With ``tls.cert`` the qrpc listener speaks TLS, as native TCP does; ``qpubs.enabled = false`` serves
    neither the routes nor the listener."""
    cert, key = make_cert(tmp_path, "qrpc")

    async def main() -> None:
        tls = {"tls.cert": str(cert), "tls.key": str(key)}
        async with serve(tmp_path, **tls) as (srv, _base):
            ctx = ssl.create_default_context(cafile=str(cert))
            q = await QrpcClient.connect(srv.ports["qrpc"], ssl_context=ctx)
            assert await q.call("emit", {"topic": "t", "value": 1}) == {"ok": True, "delivered": 0}
            await q.close()
        off = {"qpubs.enabled": False}
        async with serve(tmp_path, **off) as (srv, base), aiohttp.ClientSession() as http:
            assert "qrpc" not in srv.ports
            async with http.get(f"{base}/qpubs/listen?topic=a") as r:
                assert r.status == 404

    asyncio.run(main())


def test_configuration_keys() -> None:
    cfg = load_config(
        cli={"qpubs.separator": "::", "qpubs.batch_wait_ms": 0},
        env={"HUBBUB_QPUBS_QRPC_LISTEN": "127.0.0.1:7000", "HUBBUB_QPUBS_AUTH": "off"},
    )
    qpubs = cfg.section(QpubsConfig)
    assert (qpubs.separator, qpubs.batch_wait_ms) == ("::", 0)
    assert (qpubs.qrpc_listen, qpubs.auth) == ("127.0.0.1:7000", "off")
    assert DEFAULT_QRPC_LISTEN == "127.0.0.1:1337"  # qpubs.md §1 (tests move it: tests/conftest.py)
    for bad in (
        {"qpubs.separator": "*"},
        {"qpubs.separator": ""},
        {"qpubs.qrpc_listen": "nope"},
        {"qpubs.heartbeat_s": 0},
        {"qpubs.batch_wait_ms": -1},
        {"qpubs.auth": "token"},  # needs auth.mode = token
    ):
        with pytest.raises(ConfigError):
            load_config(cli=bad, env={}).validate()


def test_shutdown_with_open_calls(tmp_path: Path) -> None:
    """A server stopping with qrpc listens, a group member, an open subscription holding a batch and an HTTP
    stream open closes them all promptly; the held batch is pending again after the restart."""

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            async with serve(tmp_path) as (srv, base):
                q = await QrpcClient.connect(srv.ports["qrpc"])
                q.send("listen", {"topic": "z.*"})
                q.send("listenExclusive", {"topic": "z.*", "group": "g"})
                oid = q.send("openSubscription", {"subId": "keep", "topic": "z.*"})
                await barrier(q)
                stream = await http.get(f"{base}/qpubs/listen?topic=z.*")
                await emit(http, base, "z.1", 1)
                held = (await q.next(oid))["m"]
                t0 = time.monotonic()
            assert time.monotonic() - t0 < 5
            await asyncio.wait_for(q.eof.wait(), WAIT)
            assert await asyncio.wait_for(stream.content.read(), WAIT) == b'{"topic":"z.1","value":1}\n'
            stream.release()
            await q.close()
        async with serve(tmp_path) as (srv, _base):
            q = await QrpcClient.connect(srv.ports["qrpc"])
            oid = q.send("openSubscription", {"subId": "keep", "create": False})
            again = (await q.next(oid))["m"]
            assert again["items"] == held["items"]
            await q.close()

    asyncio.run(main())


def test_publish_rate_on_qrpc(tmp_path: Path) -> None:
    """Emits over ``limits.publish_rate`` (burst 2) get ``ERATE``; the connection stays usable."""

    async def main() -> None:
        cfg = {"limits.publish_rate": 1, "limits.publish_burst": 2}
        async with serve(tmp_path, **cfg) as (srv, _base):
            q = await QrpcClient.connect(srv.ports["qrpc"])
            ids = [q.send("emit", {"topic": "r", "value": i}) for i in range(4)]
            answers = [await q.next(cid) for cid in ids]
            codes = [a["e"]["code"] if a.get("e") else "ok" for a in answers]
            assert codes[:2] == ["ok", "ok"] and "ERATE" in codes[2:], codes
            assert next(a for a in answers if a.get("e"))["e"]["message"] == "rate limited"
            await barrier(q)
            await q.close()

    asyncio.run(main())


def test_a_listen_after_an_emit_does_not_get_that_emit(tmp_path: Path) -> None:
    """Calls are handled in arrival order (§4): a listen sent right after a pipelined emit on the same
    connection is registered after that emit's event went out, so it gets only later events."""

    async def main() -> None:
        async with serve(tmp_path) as (srv, _base):
            q = await QrpcClient.connect(srv.ports["qrpc"])
            for rnd in range(5):
                topic = f"o{rnd}.x"
                e1 = q.send("emit", {"topic": topic, "value": "before"})
                lid = q.send("listen", {"topic": f"o{rnd}.*"})
                await barrier(q)
                assert (await q.next(e1))["m"] == {"ok": True, "delivered": 0}
                after = await q.call("emit", {"topic": topic, "value": "after"})
                assert after == {"ok": True, "delivered": 1}
                assert (await q.next(lid))["m"] == {"topic": topic, "value": "after"}
            await q.close()

    asyncio.run(main())


def test_a_once_counts_in_delivered_once_when_one_commit_has_several_matches(tmp_path: Path) -> None:
    """Two emits pipelined into one commit, both matching a qrpc ``once`` and a ``listen``: the ``once``
    gets the first event only, so it counts in the first emit's ``delivered`` only (2, then 1)."""

    async def main() -> None:
        async with serve(tmp_path) as (srv, _):
            listener = await QrpcClient.connect(srv.ports["qrpc"])
            emitter = await QrpcClient.connect(srv.ports["qrpc"])
            once = listener.send("once", {"topic": "j.*"})
            live = listener.send("listen", {"topic": "j.*"})
            await barrier(listener)
            first = emitter.send("emit", {"topic": "j.1", "value": 1})
            second = emitter.send("emit", {"topic": "j.2", "value": 2})  # same write: the same commit
            assert (await emitter.next(first))["m"] == {"ok": True, "delivered": 2}
            assert (await emitter.next(second))["m"] == {"ok": True, "delivered": 1}
            assert (await listener.next(once))["m"] == {"topic": "j.1", "value": 1}
            assert [(await listener.next(live))["m"]["value"] for _ in range(2)] == [1, 2]
            await listener.close()
            await emitter.close()

    asyncio.run(main())
