"""Mist over real sockets (protocols/mist.md): sessions as the 2015 Go client and a 1.x client drive them
(``tests/integration/mist_clients.py``), auth and the token registry, bad input and limits per transport, and
connections of both generations sharing a fan-out burst."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

from .mist_clients import WAIT, Client1x, GoClient2015, Message
from .serverproc import ServerProcess
from .test_auth_reload import client_context, make_cert

HOST = "127.0.0.1"
TOKENS = {
    "pub": {"user": "alice"},
    "ro": {"user": "bob", "publish": []},
    "root": {"user": "root", "admin": True},
}


@dataclass
class Ports:
    http: int
    mist: int

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.http}"


@contextlib.asynccontextmanager
async def serve(data_dir: Path, **overrides: Any) -> AsyncIterator[Ports]:
    cli: dict[str, Any] = {
        "data_dir": str(data_dir),
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "mist.tcp_listen": f"{HOST}:0",
    }
    cli.update(overrides)
    async with Server(load_config(cli=cli, env={})) as server:
        yield Ports(server.ports["http"], server.ports["mist"])


class Lines:
    """A raw 2015 TCP connection: lines out, lines in (without their newline)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Lines:
        return cls(*await asyncio.open_connection(HOST, port))

    async def send(self, data: bytes | str) -> None:
        self.writer.write(data.encode() if isinstance(data, str) else data)
        await self.writer.drain()

    async def line(self) -> str:
        raw = await asyncio.wait_for(self.reader.readline(), WAIT)
        assert raw.endswith(b"\n"), raw
        return raw[:-1].decode()

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), WAIT) == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def metrics(http: aiohttp.ClientSession, ports: Ports) -> str:
    async with http.get(f"{ports.base}/metrics") as r:
        return await r.text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


# -- the 2015 Go client, across a real restart --------------------------------------------------------------


def test_a_2015_go_client_session_survives_a_server_restart(tmp_path: Path) -> None:
    port = free_port()
    extra = ["--mist-tcp-listen", f"{HOST}:{port}"]
    data_dir = tmp_path / "data"

    async def main() -> None:
        server = await asyncio.to_thread(ServerProcess(data_dir, extra).start)
        client = GoClient2015(HOST, port)
        other = GoClient2015(HOST, port)
        try:
            await client.connect()
            await other.connect()
            await client.subscribe(["b", "a"])
            await client.subscribe(["c"])
            await client.subscribe(["c"])  # reference-counted: two unsubscribes to drop it
            assert await client.list() == [("b", "a"), ("c",)]
            await client.unsubscribe(["c"])
            assert await client.list() == [("b", "a"), ("c",)]
            await other.publish(["c", "a", "b"], "before restart")
            assert await client.next_message() == Message(("a", "b", "c"), "before restart")

            # A real restart on the same port: the client sees the connection drop, reconnects with its own
            # backoff and re-subscribes what it had; the log kept the event published before.
            assert await asyncio.to_thread(server.terminate) == 0
            server = await asyncio.to_thread(ServerProcess(data_dir, extra).start)
            await asyncio.wait_for(client.reconnected.wait(), WAIT)
            await asyncio.wait_for(other.reconnected.wait(), WAIT)
            await client.ping()  # the re-subscriptions are in place once pong is back
            assert await client.list() == [("b", "a"), ("c",)]
            await other.publish(["a", "b", "z"], "after restart with spaces")
            await other.publish(["a"], "not matched")
            await other.publish(["c"], "c only")
            assert await client.next_message() == Message(("a", "b", "z"), "after restart with spaces")
            assert await client.next_message() == Message(("c",), "c only")
            await client.ping()
            assert client.messages.empty()

            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://{HOST}:{server.ports['http']}/api/v1/log/mist") as r,
            ):
                body = await r.json()
            texts = [e["text"] for e in body["events"]]
            assert texts[0] == "before restart" and texts[-1] == "c only" and len(texts) == 4
            assert body["events"][0]["tags"] == ["a", "b", "c"]
        finally:
            await client.close()
            await other.close()
            await asyncio.to_thread(server.terminate)

    asyncio.run(main())


# -- a 1.x client with auth ---------------------------------------------------------------------------------


def test_a_1x_client_session_with_auth_subscribe_publish_and_list(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, **{"auth.mode": "token", "auth.tokens": TOKENS}) as ports:
            # No token, or a wrong one: closed without a reply (mist.md §8).
            bad = await Client1x.connect(HOST, ports.mist, token="wrong")
            assert await bad.recv() is None
            await bad.close()

            sub = await Client1x.connect(HOST, ports.mist, token="pub")
            pub = await Client1x.connect(HOST, ports.mist, token="pub")
            await sub.send(command="subscribe", tags=["b", "a"])
            await sub.send(command="subscribe", tags=["c"])
            await sub.send(command="subscribe", tags=["a", "b"])  # a set: held once
            await sub.send(command="list")
            assert await sub.recv() == {"command": "list", "data": "a,b c"}
            await pub.send(command="publish", tags=["a", "b", "x"], data="hello")
            await pub.send(command="publish", tags=["b"], data="not matched")
            await pub.send(command="publish", tags=["c", "a"], data="second")
            assert await sub.recv() == {"command": "publish", "tags": ["a", "b", "x"], "data": "hello"}
            assert await sub.recv() == {"command": "publish", "tags": ["a", "c"], "data": "second"}
            await pub.ping()  # the publisher is never sent its own events (1.x)
            assert pub.inbox.empty()
            await sub.send(command="listall")
            assert await sub.recv() == {"command": "listall", "data": "a b c"}
            await sub.send(command="who", tags=["x"])
            who = await sub.recv()
            assert who == {
                "command": "who",
                "tags": ["x"],
                "data": "Lifetime  connections: 3\nSubscribers connected: 1",
            }
            await sub.send(command="unsubscribe", tags=["c"])
            await sub.send(command="list")
            assert await sub.recv() == {"command": "list", "data": "a,b"}

            # A token that may not publish on /mist: Access denied, the connection stays.
            ro = await Client1x.connect(HOST, ports.mist, token="ro")
            await ro.send(command="publish", tags=["a", "b"], data="refused")
            assert await ro.recv() == {"command": "publish", "error": "Access denied"}
            # Registry commands on an authenticated connection need an administrator's token.
            await ro.send(command="register", tags=["t"], data="tok")
            assert await ro.recv() == {"command": "register", "error": "Access denied"}
            root = await Client1x.connect(HOST, ports.mist, token="root")
            await root.send(command="register", tags=["t2", "t1"], data="tok")
            await root.send(command="register", tags=["t1"], data="tok")
            assert await root.recv() == {"command": "register", "error": "Token already exists\n"}
            await root.send(command="tags", data="tok")
            assert await root.recv() == {"command": "tags", "tags": ["t1", "t2"]}
            await sub.ping()
            assert sub.inbox.empty()  # nothing of the refused publish
            for c in (sub, pub, ro, root):
                await c.close()

            # Over WebSocket the token travels on the upgrade.
            async with aiohttp.ClientSession() as http:
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await http.ws_connect(f"{ports.base}/mist/v1/ws")
                assert refused.value.status == 401
                async with http.ws_connect(f"{ports.base}/mist/v1/ws", headers={"X-Auth-Token": "pub"}) as ws:
                    await ws.send_str('{"command":"ping"}')
                    assert (await ws.receive_str(timeout=WAIT)) == '{"command":"ping","data":"pong"}\n'
                async with http.ws_connect(f"{ports.base}/mist/v1/ws?x-auth-token=pub") as ws:
                    await ws.send_str('{"command":"ping"}')
                    assert (await ws.receive_str(timeout=WAIT)) == '{"command":"ping","data":"pong"}\n'

    asyncio.run(main())


def test_2015_auth_line_and_registry_tokens_on_the_websocket(tmp_path: Path) -> None:
    async def main() -> None:
        overrides = {"auth.mode": "token", "auth.tokens": TOKENS, "mist.token": "master"}
        async with serve(tmp_path, **overrides) as ports, aiohttp.ClientSession() as http:
            c = await Lines.open(ports.mist)
            await c.send("ping\n")  # the first line must be auth
            assert await c.line() == "error Unauthorized"
            assert await c.closed()
            await c.close()
            c = await Lines.open(ports.mist)
            await c.send("auth nope\n")
            assert await c.line() == "error Unauthorized"
            assert await c.closed()
            await c.close()

            admin = await Lines.open(ports.mist)
            await admin.send("auth master\nregister red,blue reg-token\nregister x empty-token\n")
            await admin.send("unset x empty-token\ntags reg-token\n")
            assert await admin.line() == "tags reg-token blue,red"
            user = await Lines.open(ports.mist)
            await user.send("auth pub\nregister a other\n")
            assert await user.line() == "error Access denied"  # registry: administrators only

            # A registry token with tags may subscribe, to sets sharing one of its tags (mist.md §8).
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(f"{ports.base}/mist/ws?x-auth-token=empty-token")
            assert refused.value.status == 401  # a registry token without tags
            async with http.ws_connect(f"{ports.base}/mist/ws", headers={"X-Auth-Token": "reg-token"}) as ws:
                await ws.send_str('{"command":"subscribe","tags":["green"]}')
                assert await ws.receive_str(timeout=WAIT) == '{"success":false,"command":"subscribe"}'
                await ws.send_str('{"command":"subscribe","tags":["green","red"]}')
                assert await ws.receive_str(timeout=WAIT) == '{"success":true,"command":"subscribe"}'
                await user.send("publish red,green,z hi\n")
                assert json.loads(await ws.receive_str(timeout=WAIT)) == {
                    "tags": ["green", "red", "z"],
                    "data": "hi",
                }
            for conn in (admin, user):
                await conn.close()
            # The registry is on disk, kept across restarts (tests/integration/test_mist_registry_crash.py).
            assert "reg-token" in (tmp_path / "mist-tokens.json").read_text()

    asyncio.run(main())


# -- bad input and limits -----------------------------------------------------------------------------------


def test_bad_input_and_limits_per_transport(tmp_path: Path) -> None:
    async def main() -> None:
        limits = {"limits.max_frame": 4096, "limits.max_subscriptions": 3}
        async with serve(tmp_path, **limits) as ports, aiohttp.ClientSession() as http:
            watcher = await Lines.open(
                ports.mist
            )  # stays subscribed throughout: other connections unaffected
            await watcher.send("subscribe w\nping\n")
            assert await watcher.line() == "pong"

            c = await Lines.open(ports.mist)
            await c.send("subscribe " + ",".join(f"t{i}" for i in range(65)) + "\n")
            assert await c.line() == "error Invalid tags"
            await c.send(b"subscribe \xff\xfe\n")
            assert await c.line() == "error Invalid tags"
            await c.send("subscribe a\nsubscribe b\nsubscribe c\nsubscribe d\n")
            assert await c.line() == "error Too many subscriptions"
            await c.send(b"\x00\x01garbage\x7f\n")
            assert await c.line() == "error Unknown command '[\x00\x01garbage\x7f]'"
            await c.send("publish " + "x" * 5000)  # no newline yet: the line is over max_frame already
            assert await c.line() == "error Line too long"
            assert await c.closed()
            await c.close()

            j = await Client1x.connect(HOST, ports.mist)
            await j.send(command=5)
            assert await j.recv() == {"command": "", "error": "Invalid message"}
            await j.send(command="subscribe", tags=[1])
            assert await j.recv() == {"command": "subscribe", "error": "Invalid message"}
            await j.send(command="subscribe", tags=["x" * 300])
            assert await j.recv() == {"command": "subscribe", "error": "Invalid tags"}
            for t in ("a", "b", "c", "d"):
                await j.send(command="subscribe", tags=[t])
            assert await j.recv() == {"command": "subscribe", "error": "Too many subscriptions"}
            await j.send(command="publish", tags=["a"], data="y" * 5000)
            assert await j.recv() == {"command": "", "error": "Message too large"}
            assert await j.recv() is None
            await j.close()

            async with http.ws_connect(f"{ports.base}/mist/v1/ws") as ws:
                await ws.send_str("{oops")
                assert await ws.receive_str(timeout=WAIT) == '{"command":"","error":"Invalid JSON"}\n'
                await ws.send_str('{"command":"ping"}')  # still open
                assert await ws.receive_str(timeout=WAIT) == '{"command":"ping","data":"pong"}\n'
                await ws.send_str('{"command":"ping","data":"' + "z" * 5000 + '"}')
                msg = await ws.receive(timeout=WAIT)
                assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009
            async with http.ws_connect(f"{ports.base}/mist/ws") as ws:
                await ws.send_str(
                    '{"command":"subscribe","tags":["' + '","'.join("abcdefghijklmnopqrstuvwxyz" * 3) + '"]}'
                )
                assert await ws.receive_str(timeout=WAIT) == '{"success":false,"error":"Invalid tags"}'
                await ws.send_str("x" * 5000)
                msg = await ws.receive(timeout=WAIT)
                assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1009

            await watcher.send("ping\n")  # the server and the other connection are fine
            assert await watcher.line() == "pong"
            text = await metrics(http, ports)
            assert 'hubbub_bad_input_total{dialect="mist2015"}' in text
            assert 'hubbub_bad_input_total{dialect="mist1"}' in text
            await watcher.close()

    asyncio.run(main())


# -- a shared fan-out burst ---------------------------------------------------------------------------------


def test_connections_of_both_generations_share_a_fan_out_burst(tmp_path: Path) -> None:
    """Three 2015 TCP, two 2015 WS, three 1.x TCP and two 1.x WS subscribers get a burst of tagged events
    from a 2015 publisher and a native HTTP publisher: each event once per connection (even when two of its
    subscriptions match), in commit order, only the matching ones."""
    n = 200

    async def main() -> None:
        async with serve(tmp_path) as ports, aiohttp.ClientSession() as http:
            tcp15 = [await Lines.open(ports.mist) for _ in range(3)]
            tcp1 = [await Client1x.connect(HOST, ports.mist) for _ in range(3)]
            ws15 = [await http.ws_connect(f"{ports.base}/mist/ws") for _ in range(2)]
            ws1 = [await http.ws_connect(f"{ports.base}/mist/v1/ws") for _ in range(2)]
            for c in tcp15:
                await c.send("subscribe burst\nsubscribe burst,even\nping\n")
                assert await c.line() == "pong"
            for j in tcp1:
                await j.send(command="subscribe", tags=["burst"])
                await j.send(command="subscribe", tags=["even", "burst"])
                await j.ping()
            for w in ws15:
                await w.send_str('{"command":"subscribe","tags":["burst"]}')
                assert await w.receive_str(timeout=WAIT) == '{"success":true,"command":"subscribe"}'
            for w in ws1:
                await w.send_str('{"command":"subscribe","tags":["burst","even"]}')
                await w.send_str('{"command":"ping"}')
                assert await w.receive_str(timeout=WAIT) == '{"command":"ping","data":"pong"}\n'

            publisher = await Lines.open(ports.mist)
            lines = "".join(f"publish burst,{'even' if i % 2 == 0 else 'odd'},x {i}\n" for i in range(n))
            await publisher.send(lines + "publish other nobody\n")
            # A native publish with tags on another channel reaches them too (mist.md §5 "Scope").
            async with http.post(
                f"{ports.base}/api/v1/publish/elsewhere?tag=burst&tag=even", data=b"native"
            ) as r:
                assert r.status == 200, await r.text()

            def tags_of(i: int) -> list[str]:
                return ["burst", "even" if i % 2 == 0 else "odd", "x"]

            everything = [(tags_of(i), str(i)) for i in range(n)] + [(["burst", "even"], "native")]
            evens = [e for e in everything if "even" in e[0]]
            for c in tcp15:
                got = [await c.line() for _ in everything]
                assert got == [f"publish {','.join(sorted(t))} {d}" for t, d in everything]
            for j in tcp1:
                got1 = [await j.recv() for _ in everything]
                assert got1 == [{"command": "publish", "tags": sorted(t), "data": d} for t, d in everything]
            for w in ws15:
                got2 = [json.loads(await w.receive_str(timeout=WAIT)) for _ in everything]
                assert got2 == [{"tags": sorted(t), "data": d} for t, d in everything]
            for w in ws1:
                got3 = [json.loads(await w.receive_str(timeout=WAIT)) for _ in evens]
                assert got3 == [{"command": "publish", "tags": sorted(t), "data": d} for t, d in evens]
            # Nothing more: no duplicates, and the unmatched event went nowhere.
            for c in tcp15:
                await c.send("ping\n")
                assert await c.line() == "pong"
            for j in tcp1:
                await j.ping()
            for w in ws15:
                await w.send_str('{"command":"ping"}')
                assert await w.receive_str(timeout=WAIT) == '{"success":true,"command":"ping"}'
            for w in ws1:
                await w.send_str('{"command":"ping"}')
                assert await w.receive_str(timeout=WAIT) == '{"command":"ping","data":"pong"}\n'
            for c in [*tcp15, publisher]:
                await c.close()
            for j in tcp1:
                await j.close()
            for w in [*ws15, *ws1]:
                await w.close()

    asyncio.run(main())


def test_tags_with_a_comma_or_a_space_never_reach_a_2015_line_and_reach_the_others(tmp_path: Path) -> None:
    """A 1.x or native publish tagged ``x`` and ``y z`` (or ``a,b``) cannot be written as a 2015 line: its
    client would read the tags ``x,y`` and the data ``z space tag``. The 2015 TCP subscriber of ``x`` gets
    only the events it can parse, byte for byte; 2015 WebSocket and 1.x subscribers get every one."""

    async def main() -> None:
        async with serve(tmp_path) as ports, aiohttp.ClientSession() as http:
            line15 = await Lines.open(ports.mist)
            await line15.send("subscribe x\nping\n")
            assert await line15.line() == "pong"
            ws15 = await http.ws_connect(f"{ports.base}/mist/ws")
            await ws15.send_str('{"command":"subscribe","tags":["x"]}')
            assert await ws15.receive_str(timeout=WAIT) == '{"success":true,"command":"subscribe"}'
            sub1 = await Client1x.connect(HOST, ports.mist)
            await sub1.send(command="subscribe", tags=["x"])
            await sub1.ping()
            pub1 = await Client1x.connect(HOST, ports.mist)

            sent: list[tuple[list[str], str]] = []

            async def publish_1x(tags: list[str], data: str) -> None:
                await pub1.send(command="publish", tags=tags, data=data)
                sent.append((sorted(set(tags)), data))

            async def publish_native(tags: list[str], data: str) -> None:
                params = [("tag", t) for t in tags]
                async with http.post(f"{ports.base}/api/v1/publish/elsewhere", params=params, data=data) as r:
                    assert r.status == 200, await r.text()
                sent.append((sorted(set(tags)), data))

            await publish_1x(["x", "y z"], "space tag")
            await publish_1x(["x", "a,b"], "comma tag")
            await publish_1x(["x", "ok"], "from 1.x")
            await publish_native(["x", "y z"], "native space")
            await publish_native(["a,b", "x"], "native comma")
            await publish_native(["x", "tab\there"], "native ok")
            # The 2015 line subscriber: the parseable events only, exactly, in order, then nothing more.
            raw = [await asyncio.wait_for(line15.reader.readline(), WAIT) for _ in range(2)]
            assert raw == [b"publish ok,x from 1.x\n", b"publish tab\there,x native ok\n"]
            await line15.send("ping\n")
            assert await line15.line() == "pong"
            # The others: every event as it was published, in order.
            got_ws = [json.loads(await ws15.receive_str(timeout=WAIT)) for _ in sent]
            assert got_ws == [{"tags": t, "data": d} for t, d in sent]
            got_1x = [await sub1.recv() for _ in sent]
            assert got_1x == [{"command": "publish", "tags": t, "data": d} for t, d in sent]
            await line15.close()
            await ws15.close()
            await sub1.close()
            await pub1.close()

    asyncio.run(main())


# -- replication peers, keepalive, TLS ----------------------------------------------------------------------


def test_replication_peers_never_get_each_others_events(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as ports:
            peer_a, peer_b, plain = [await Lines.open(ports.mist) for _ in range(3)]
            for c in (peer_a, peer_b):
                await c.send("enable-replication\nsubscribe r\nping\n")
                assert await c.line() == "pong"
            await plain.send("subscribe r\nping\n")
            assert await plain.line() == "pong"
            await peer_a.send("publish r from-peer\n")
            await plain.send("publish r from-plain\n")
            assert await plain.line() == "publish r from-peer"
            assert await plain.line() == "publish r from-plain"
            for c in (peer_a, peer_b):  # a peer gets the plain client's event only (not even its own)
                assert await c.line() == "publish r from-plain"
                await c.send("ping\n")
                assert await c.line() == "pong"
            for c in (peer_a, peer_b, plain):
                await c.close()

    asyncio.run(main())


def test_websocket_keepalive_closes_a_silent_client_with_1001(tmp_path: Path) -> None:
    async def main() -> None:
        cli: dict[str, Any] = {
            "data_dir": str(tmp_path),
            "http.listen": f"{HOST}:0",
            "mist.tcp_listen": f"{HOST}:0",
        }
        async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
            assert server.mist is not None
            server.mist.settings = dataclasses.replace(
                server.mist.settings, ping_interval_s=0.05, read_timeout_s=0.3
            )
            url = f"http://{HOST}:{server.ports['http']}/mist/v1/ws"
            async with http.ws_connect(url, autoping=False) as ws:  # never answers the pings
                pings = 0
                while True:
                    msg = await ws.receive(timeout=WAIT)
                    if msg.type != aiohttp.WSMsgType.PING:
                        break
                    pings += 1
                assert pings >= 1
                assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1001

    asyncio.run(main())


def test_the_mist_tcp_listener_speaks_tls(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path, "hubbub-mist")

    async def main() -> None:
        async with serve(tmp_path / "data", **{"tls.cert": str(cert), "tls.key": str(key)}) as ports:
            reader, writer = await asyncio.open_connection(HOST, ports.mist, ssl=client_context(cert))
            c = Lines(reader, writer)
            await c.send("ping\n{x\n")
            assert await c.line() == "pong"
            assert await c.line() == "error Unknown command '[{x]'"
            await c.close()
            j = Client1x(*await asyncio.open_connection(HOST, ports.mist, ssl=client_context(cert)))
            await j.ping()
            await j.close()

    asyncio.run(main())


def test_a_burst_with_varying_tags_fans_out_as_runs_in_order(tmp_path: Path) -> None:
    """Events of one burst that match the same subscriptions through different tags are delivered as runs:
    every subscriber gets each once, in order, and the publisher (2015: subscribed too) its own."""
    n = 300

    async def main() -> None:
        async with serve(tmp_path) as ports:
            lines = [await Lines.open(ports.mist) for _ in range(3)]
            jsons = [await Client1x.connect(HOST, ports.mist) for _ in range(2)]
            for c in lines:
                await c.send("subscribe r\nping\n")
                assert await c.line() == "pong"
            for j in jsons:
                await j.send(command="subscribe", tags=["r"])
                await j.ping()
            publisher = lines[0]
            await publisher.send("".join(f"publish r,k{i} {i}\n" for i in range(n)))
            for c in lines:
                assert [await c.line() for _ in range(n)] == [f"publish k{i},r {i}" for i in range(n)]
            for j in jsons:
                got = [await j.recv() for _ in range(n)]
                assert got == [
                    {"command": "publish", "tags": [f"k{i}", "r"], "data": str(i)} for i in range(n)
                ]
            for c in lines:
                await c.send("ping\n")
                assert await c.line() == "pong"
                await c.close()
            for j in jsons:
                await j.ping()
                await j.close()

    asyncio.run(main())


def test_publish_rate_and_connection_limits(tmp_path: Path) -> None:
    """Over ``limits.publish_rate`` a mist publish is dropped (mist has no reply for it) and counted; over
    ``limits.max_connections_per_ip`` a TCP connection is closed at once."""

    async def main() -> None:
        cli: dict[str, Any] = {
            "data_dir": str(tmp_path),
            "http.listen": f"{HOST}:0",
            "mist.tcp_listen": f"{HOST}:0",
            "limits.publish_rate": 1,
            "limits.publish_burst": 1,
            "limits.max_connections_per_ip": 3,
        }
        async with Server(load_config(cli=cli, env={})) as server:
            assert server.node is not None
            port = server.ports["mist"]
            sub = await Lines.open(port)
            await sub.send("subscribe r\nping\n")
            assert await sub.line() == "pong"
            pub = await Lines.open(port)
            await pub.send("".join(f"publish r {i}\n" for i in range(5)) + "ping\n")
            assert await pub.line() == "pong"
            assert await sub.line() == "publish r 0"
            await sub.send("ping\n")
            assert await sub.line() == "pong"  # the other four were dropped
            third = await Lines.open(port)
            await third.send("ping\n")
            assert await third.line() == "pong"
            refused = await Lines.open(port)
            with contextlib.suppress(ConnectionError):
                await refused.send("ping\n")
                assert await refused.closed()
            await refused.close()
            refusals = server.node.limiter.refusals
            assert refusals[("publish_rate", "mist2015")] == 4
            assert refusals[("max_connections_per_ip", "mist")] == 1
            for c in (sub, pub, third):
                await c.close()

    asyncio.run(main())


def test_a_subscriber_that_stops_reading_loses_the_oldest_events_in_order(tmp_path: Path) -> None:
    """Outbound overflow drops the oldest queued events (counted in hubbub_dropped_total): the slow
    subscriber keeps its connection and order and gets the newest; others are unaffected."""
    n = 8000
    payload = "x" * 1000

    async def main() -> None:
        limits = {"limits.send_queue": 32, "limits.send_queue_bytes": 1 << 20}
        async with serve(tmp_path, **limits) as ports, aiohttp.ClientSession() as http:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for it
            sock.connect((HOST, ports.mist))
            slow = Lines(*await asyncio.open_connection(sock=sock))
            fast = await Client1x.connect(HOST, ports.mist)
            await slow.send("subscribe s\nping\n")
            assert await slow.line() == "pong"
            await fast.send(command="subscribe", tags=["s"])
            await fast.ping()
            pub = await Lines.open(ports.mist)
            pub.writer.write("".join(f"publish s {i} {payload}\n" for i in range(n)).encode())
            got_fast: list[int] = []
            while len(got_fast) < n:  # the reading subscriber gets everything, in order
                msg = await fast.recv()
                assert msg is not None
                got_fast.append(int(msg["data"].split(" ")[0]))
            assert got_fast == list(range(n))
            seen: list[int] = []
            while not seen or seen[-1] != n - 1:
                line = await slow.line()
                seen.append(int(line.split(" ")[2]))
            assert seen == sorted(set(seen)) and len(seen) < n  # in order, no duplicates, some dropped
            await slow.send("ping\n")
            assert await slow.line() == "pong"
            assert 'hubbub_dropped_total{dialect="mist2015"}' in await metrics(http, ports)
            for c in (slow, pub):
                await c.close()
            await fast.close()

    asyncio.run(main())
