"""hubbub.client and the client CLI commands against a real server on loopback ports.

Each test starts a :class:`hubbub.server.Server` on a fresh data directory inside ``asyncio.run`` (no
pytest-asyncio). Nothing sleeps blindly: waits are on conditions or items, with timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from hubbub.client import (
    AsyncClient,
    Client,
    ClientConnectionError,
    ConnectionLost,
    Gap,
    Subscription,
    SyncSubscription,
)
from hubbub.errors import BadChannel
from hubbub.events import Event, Position
from hubbub.server import Server
from hubbub.server_config import load_config

SRC = str(Path(__file__).resolve().parents[2] / "src")
WAIT = 10.0


@contextlib.asynccontextmanager
async def serve(data_dir: Path, http_port: int = 0, native_port: int = 0) -> AsyncIterator[Server]:
    cfg = load_config(
        cli={
            "data_dir": str(data_dir),
            "http.listen": f"127.0.0.1:{http_port}",
            "native.tcp_listen": f"127.0.0.1:{native_port}",
        },
        env={},
    )
    async with Server(cfg) as server:
        yield server


def ws_url(server: Server) -> str:
    return f"ws://127.0.0.1:{server.ports['http']}"


def tcp_url(server: Server) -> str:
    return f"tcp://127.0.0.1:{server.ports['native']}"


def url_for(server: Server, transport: str) -> str:
    return ws_url(server) if transport == "ws" else tcp_url(server)


async def take(sub: Subscription, n: int) -> list[Event | Gap]:
    return [await _get(sub) for _ in range(n)]


async def _get(sub: Subscription) -> Event | Gap:
    item = await sub.get(WAIT)
    assert item is not None, "subscription ended"
    return item


async def events(sub: Subscription, n: int) -> list[Event]:
    items = await take(sub, n)
    gaps = [i for i in items if isinstance(i, Gap)]
    assert not gaps, gaps
    return [i for i in items if isinstance(i, Event)]


def run(tmp_path: Path, body: Callable[[Server], Awaitable[None]]) -> None:
    async def main() -> None:
        async with serve(tmp_path / "data") as server:
            await body(server)

    asyncio.run(main())


@pytest.fixture(params=["ws", "tcp"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- publish and subscribe ------------------------------------------------------------------------------


def test_publish_ack_returns_position(tmp_path: Path, transport: str) -> None:
    async def body(server: Server) -> None:
        async with AsyncClient.connect(url_for(server, transport)) as client:
            a1 = await client.publish("/acks/x", "one")
            a2 = await client.publish("/acks/x", b"two")
            assert a1 is not None and a2 is not None
            assert (a1.channel, a1.seq, a2.seq) == ("/acks/x", 1, 2)
            assert a1.epoch and a1.epoch == a2.epoch
            assert 0 < a1.time < a2.time
            assert not a1.duplicate
            assert await client.publish("/acks/x", "fire and forget", ack=False) is None
            # The same idempotency key is not appended again: the original position comes back.
            d1 = await client.publish("/acks/y", {"n": 1}, idem="key-1")
            d2 = await client.publish("/acks/y", {"n": 1}, idem="key-1")
            assert d1 is not None and d2 is not None
            assert d2.duplicate and d2.position == d1.position
            stats = client.statistics()
            assert stats.connected and stats.connects == 1 and stats.pending_requests == 0

    run(tmp_path, body)


def test_subscribe_receives_events(tmp_path: Path, transport: str) -> None:
    async def body(server: Server) -> None:
        url = url_for(server, transport)
        async with AsyncClient.connect(url) as sub_client, AsyncClient.connect(url) as pub:
            async with sub_client.subscribe("/room") as sub:
                assert sub.active and sub.position == Position(0, "")
                await pub.publish("/room", "hi", tags=["b", "a"], headers={"k": "v"})
                await pub.publish("/room", {"x": [1, 2]})
                await pub.publish("/room", b"\x00\xff", content_type="application/x-raw")
                await pub.publish("/elsewhere", "not for us")
                e1, e2, e3 = await events(sub, 3)
                assert (e1.channel, e1.seq, e1.payload) == ("/room", 1, b"hi")
                assert e1.tags == ("a", "b") and e1.headers == {"k": "v"}
                assert e1.content_type.startswith("text/plain")
                assert e1.publisher.dialect == "native"
                assert orjson.loads(e2.payload) == {"x": [1, 2]} and e2.content_type == "application/json"
                assert e3.payload == b"\x00\xff" and e3.content_type == "application/x-raw"
                assert e1.time_ns < e2.time_ns < e3.time_ns
                assert sub.position == Position(3, e3.epoch)
            assert sub.closed
            assert sub_client.subscriptions() == []

    run(tmp_path, body)


def test_pattern_subscribe_and_tags(tmp_path: Path) -> None:
    async def body(server: Server) -> None:
        async with AsyncClient.connect(ws_url(server)) as client:
            star = await client.subscribe("/chat/*")
            tagged = await client.subscribe("/chat/**", tags=["red"])
            await client.publish("/chat/a", "1")
            await client.publish("/chat/a/deep", "2", tags=["red"])
            await client.publish("/chat/b", "3", tags=["red", "blue"])
            await client.publish("/chatroom", "4", tags=["red"])
            got = await events(star, 2)
            assert [(e.channel, e.payload) for e in got] == [("/chat/a", b"1"), ("/chat/b", b"3")]
            got = await events(tagged, 2)
            assert [(e.channel, e.payload) for e in got] == [("/chat/a/deep", b"2"), ("/chat/b", b"3")]
            assert set(star.positions) == {"/chat/a", "/chat/b"}
            # Nothing else is queued: a marker is the next item.
            await client.publish("/chat/z", "marker", tags=["red"])
            assert [e.payload for e in await events(star, 1)] == [b"marker"]
            assert [e.payload for e in await events(tagged, 1)] == [b"marker"]

    run(tmp_path, body)


def test_last_n_then_live(tmp_path: Path, transport: str) -> None:
    async def body(server: Server) -> None:
        async with AsyncClient.connect(url_for(server, transport)) as client:
            for i in range(1, 6):
                await client.publish("/hist", f"m{i}")
            async with client.subscribe("/hist", last=3) as sub:
                await client.publish("/hist", "m6")
                got = await events(sub, 4)
                assert [(e.seq, e.payload) for e in got] == [(3, b"m3"), (4, b"m4"), (5, b"m5"), (6, b"m6")]
                assert sub.statistics().replayed == 3
            # A pattern with last=N replays in merged (time) order across channels.
            await client.publish("/hist2/a", "x")
            await client.publish("/hist2/b", "y")
            await client.publish("/hist2/a", "z")
            async with client.subscribe("/hist2/*", last=2) as sub:
                got = await events(sub, 2)
                assert [(e.channel, e.payload) for e in got] == [("/hist2/b", b"y"), ("/hist2/a", b"z")]

    run(tmp_path, body)


def test_since_with_unknown_epoch_yields_gap(tmp_path: Path) -> None:
    async def body(server: Server) -> None:
        async with AsyncClient.connect(ws_url(server)) as client:
            ack = await client.publish("/g", "before")
            assert ack is not None
            async with client.subscribe("/g", since=Position(7, "not-an-epoch")) as sub:
                gap = await _get(sub)
                assert isinstance(gap, Gap)
                assert (gap.channel, gap.reason) == ("/g", "epoch")
                assert gap.since == Position(7, "not-an-epoch") and gap.position == ack.position
                await client.publish("/g", "after")
                (e,) = await events(sub, 1)
                assert (e.seq, e.payload) == (2, b"after")
            # since a known position replays exactly what came after it.
            async with client.subscribe("/g", since=ack.position) as sub:
                (e,) = await events(sub, 1)
                assert (e.seq, e.payload) == (2, b"after")

    run(tmp_path, body)


def test_server_errors_map_to_error_classes(tmp_path: Path) -> None:
    async def body(server: Server) -> None:
        async with AsyncClient.connect(ws_url(server)) as client:
            with pytest.raises(BadChannel) as info:
                await client.publish("no-leading-slash", "x")
            assert info.value.code == 4004
            with pytest.raises(BadChannel):
                await client.subscribe("/a/**/b")
            # The connection is still usable after non-fatal errors.
            assert await client.publish("/ok", "x") is not None
            await client.ping()

    run(tmp_path, body)


def test_backpressure_keeps_every_event(tmp_path: Path) -> None:
    async def body(server: Server) -> None:
        url = ws_url(server)
        async with AsyncClient.connect(url) as client, AsyncClient.connect(url) as pub:
            sub = await client.subscribe("/bp", max_queue=2)
            for i in range(50):
                await pub.publish("/bp", str(i))
            got = await events(sub, 50)
            assert [int(e.payload) for e in got] == list(range(50))
            assert sub.statistics().queued == 0

    run(tmp_path, body)


def test_sync_client(tmp_path: Path) -> None:
    def sync_part(url: str) -> None:
        with Client.connect(url) as client, Client(url) as other:
            ack = client.publish("/sync", "hello", timeout=WAIT)
            assert ack is not None and ack.seq == 1
            with client.subscribe("/sync", last=1, timeout=WAIT) as sub:
                assert isinstance(sub, SyncSubscription)
                other.publish("/sync", {"n": 2}, timeout=WAIT)
                first = sub.get(WAIT)
                second = next(iter(sub))
                assert isinstance(first, Event) and isinstance(second, Event)
                assert (first.payload, second.seq) == (b"hello", 2)
                with pytest.raises(TimeoutError):
                    sub.get(0.05)
                assert sub.position == Position(2, ack.epoch)
            assert sub.closed and sub.get(WAIT) is None
            client.ping(timeout=WAIT)
            assert client.statistics().subscriptions == 0
        with pytest.raises(ClientConnectionError):
            client.publish("/sync", "closed")

    async def body(server: Server) -> None:
        await asyncio.to_thread(sync_part, ws_url(server))

    run(tmp_path, body)


def test_cannot_connect(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path / "data") as server:
            url = ws_url(server)
        with pytest.raises(ClientConnectionError):
            await AsyncClient.connect(url, connect_timeout=5)

    asyncio.run(body())


# -- reconnect and recovery -----------------------------------------------------------------------------


def test_reconnect_recovers_without_gap_or_duplicate(tmp_path: Path, transport: str) -> None:
    data = tmp_path / "data"

    async def body() -> None:
        async with serve(data) as s1:
            ports = dict(s1.ports)
            url = url_for(s1, transport)
            client = await AsyncClient.connect(url, reconnect_min_delay=0.2, reconnect_max_delay=0.5)
            exact = await client.subscribe("/r/a")
            pattern = await client.subscribe("/r/**")
            async with AsyncClient.connect(url) as pub:
                for i in range(1, 4):
                    await pub.publish("/r/a", f"a{i}")
            assert [e.payload for e in await events(exact, 3)] == [b"a1", b"a2", b"a3"]
            assert [e.payload for e in await events(pattern, 3)] == [b"a1", b"a2", b"a3"]
        try:
            # The server is gone; a publish now waits for the reconnect.
            await asyncio.wait_for(client.wait_disconnected(), WAIT)
            assert not client.connected
            waiting = asyncio.create_task(client.publish("/r/b", "sent while away", idem="away-1"))
            async with serve(data, ports["http"], ports["native"]) as s2:
                async with AsyncClient.connect(url_for(s2, transport)) as pub:
                    for i in range(4, 7):
                        await pub.publish("/r/a", f"a{i}")
                    await pub.publish("/r/new", "first on a new channel")
                ack = await asyncio.wait_for(waiting, WAIT)
                assert ack is not None and (ack.channel, ack.seq) == ("/r/b", 1)

                got = await events(exact, 3)
                assert [(e.seq, e.payload) for e in got] == [(4, b"a4"), (5, b"a5"), (6, b"a6")]
                got = await events(pattern, 5)
                by_channel: dict[str, list[bytes]] = {}
                for e in got:
                    by_channel.setdefault(e.channel, []).append(e.payload)
                assert by_channel == {
                    "/r/a": [b"a4", b"a5", b"a6"],
                    "/r/new": [b"first on a new channel"],
                    "/r/b": [b"sent while away"],
                }
                assert [e.time_ns for e in got] == sorted(e.time_ns for e in got)

                # No duplicate is queued behind them: the next item is a fresh marker.
                async with AsyncClient.connect(url_for(s2, transport)) as pub:
                    await pub.publish("/r/a", "a7")
                assert [e.payload for e in await events(exact, 1)] == [b"a7"]
                assert [e.payload for e in await events(pattern, 1)] == [b"a7"]
                stats = client.statistics()
                assert stats.connects == 2 and stats.disconnects == 1
                assert exact.statistics().duplicates_dropped == 0
                assert exact.statistics().subscribes == 2
        finally:
            await client.close()

    asyncio.run(body())


def test_without_reconnect_the_drop_is_an_error(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path / "data") as server:
            client = await AsyncClient.connect(ws_url(server), reconnect=False)
            sub = await client.subscribe("/x")
            await client.publish("/x", "one")
            await events(sub, 1)
        try:
            with pytest.raises(ConnectionLost):
                await sub.get(WAIT)
            with pytest.raises(ClientConnectionError):
                await client.publish("/x", "two")
        finally:
            await client.close()

    asyncio.run(body())


def test_inflight_publishes_at_disconnect(tmp_path: Path) -> None:
    """A publish in flight when the connection drops: with ``idem`` it is sent again after the reconnect,
    without it the caller gets ConnectionLost (its outcome is unknown). A scripted peer makes it exact."""
    received: list[list[dict[str, Any]]] = []

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames: list[dict[str, Any]] = []
        received.append(frames)
        first_connection = len(received) == 1
        try:
            hello = orjson.loads(await reader.readline())
            reply = {"op": "reply", "id": hello["id"], "v": 1, "session": "0" * 16, "ping_interval": 25}
            writer.write(orjson.dumps({**reply, "limits": {"max_frame": 1 << 20}}) + b"\n")
            while line := await reader.readline():
                frame = orjson.loads(line)
                frames.append(frame)
                if frame["op"] != "publish":
                    continue
                if first_connection and len(frames) == 2:
                    break  # both publishes arrived: drop the connection without answering either
                if not first_connection:
                    ack = {"op": "reply", "id": frame["id"], "channel": frame["channel"], "seq": 1}
                    writer.write(orjson.dumps({**ack, "epoch": "e1", "time": "7", "duplicate": True}) + b"\n")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def body() -> None:
        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with AsyncClient.connect(f"tcp://127.0.0.1:{port}", reconnect_min_delay=0.01) as client:
                keyed = asyncio.create_task(client.publish("/p", "keyed", idem="k-1"))
                plain = asyncio.create_task(client.publish("/p", "plain"))
                with pytest.raises(ConnectionLost):
                    await asyncio.wait_for(plain, WAIT)
                ack = await asyncio.wait_for(keyed, WAIT)
                assert ack is not None and ack.duplicate and (ack.seq, ack.epoch, ack.time) == (1, "e1", 7)
                assert [f.get("idem") for f in received[1] if f["op"] == "publish"] == ["k-1"]
                assert client.statistics().retry_queue == 0
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(body())


def test_resume_survives_a_drop_during_resubscribe() -> None:
    """Connection 1 delivers seq 1 and drops; connection 2 drops on the resubscribe; connection 3 replays
    seq 1 again (a duplicate the client must drop) and seq 2, then seq 3 live. The resubscribes carry
    ``since`` = the last delivered position."""
    subscribes: list[dict[str, Any]] = []

    def event(seq: int, **extra: Any) -> dict[str, Any]:
        return {"op": "event", "subs": ["s1"], "channel": "/d", "seq": seq, "epoch": "e", "time": str(seq),
                "publisher": {"dialect": "native"}, "text": f"m{seq}", **extra}  # fmt: skip

    async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        def send(*frames: dict[str, Any]) -> None:
            writer.write(b"".join(orjson.dumps(f) + b"\n" for f in frames))

        try:
            hello = orjson.loads(await reader.readline())
            send({"op": "reply", "id": hello["id"], "v": 1, "session": "1" * 16, "ping_interval": 25})
            sub = orjson.loads(await reader.readline())
            subscribes.append(sub)
            n = len(subscribes)
            if n == 1:
                reply = {"op": "reply", "id": sub["id"], "sub": "s1", "position": {"seq": 0, "epoch": ""}}
                send(reply, event(1))
            elif n == 3:
                batch = [
                    {"op": "reply", "id": sub["id"], "sub": "s1", "position": {"seq": 2, "epoch": "e"}},
                    event(1, replay=True),
                    event(2, replay=True),
                    {"op": "recovered", "sub": "s1", "replayed": 2, "position": {"seq": 2, "epoch": "e"}},
                    {"op": "future_push", "sub": "s1"},
                ]
                send({"op": "batch", "frames": batch}, event(3))
                await reader.readline()  # hold the connection until the client leaves
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def body() -> None:
        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            async with AsyncClient.connect(f"tcp://127.0.0.1:{port}", reconnect_min_delay=0.01) as client:
                sub = await client.subscribe("/d")
                got = await events(sub, 3)
                assert [(e.seq, e.payload) for e in got] == [(1, b"m1"), (2, b"m2"), (3, b"m3")]
                assert sub.statistics().duplicates_dropped == 1
                after_1 = {"seq": 1, "epoch": "e"}
                assert [f.get("since") for f in subscribes] == [None, after_1, after_1]
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(body())


async def pings_answered(server: Server, n: int) -> None:
    """Open a native WebSocket, answer ``n`` pings with pongs, close."""
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(ws_url(server) + "/ws/hubbub", protocols=["hubbub.v1.json"])
        await ws.send_str(json.dumps({"op": "hello", "id": 1, "v": 1}))
        pings = 0
        while pings < n:
            f = json.loads(await ws.receive_str(timeout=WAIT))
            assert f["op"] in ("reply", "ping"), f
            if f["op"] == "ping":
                pings += 1
                await ws.send_str('{"op":"pong"}')
        await ws.close()


def test_client_answers_server_pings(tmp_path: Path) -> None:
    async def body() -> None:
        cfg = load_config(
            cli={
                "data_dir": str(tmp_path / "data"),
                "http.listen": "127.0.0.1:0",
                "native.tcp_listen": "127.0.0.1:0",
                "native.ping_interval_s": "0.1",
            },
            env={},
        )
        async with Server(cfg) as server:
            for url in (ws_url(server), tcp_url(server)):
                async with AsyncClient.connect(url, batch=False) as client:
                    # The clock: a second connection on the same keepalive timer, answering its pings by
                    # hand. Six of them take more than the three silent intervals after which the server
                    # closes a connection that does not answer (4304).
                    await pings_answered(server, 6)
                    stats = client.statistics()
                    assert stats.frames_received >= 4  # the hello reply, and pings
                    assert (stats.connects, stats.disconnects, stats.last_error) == (1, 0, "")
                    assert await client.publish("/alive", "yes") is not None

    asyncio.run(body())


def test_sync_client_cannot_connect() -> None:
    with pytest.raises(ClientConnectionError):
        Client("ws://127.0.0.1:9", timeout=WAIT)


# -- CLI ------------------------------------------------------------------------------------------------


async def cli(*args: str, stdin: bytes | None = None, within: float = 30) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hubbub",
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(),
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), within)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUBBUB_")}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_cli_pub_sub_log(tmp_path: Path) -> None:
    async def body(server: Server) -> None:
        url = ws_url(server)
        rc, out, err = await cli("pub", "--url", url, "/cli/a", "hello", "--tag", "t", "--header", "k=v")
        assert (rc, err) == (0, "")
        seq, epoch = out.split()
        assert seq == "1" and epoch
        rc, out, err = await cli("pub", "--url", url, "/cli/a", "--lines", "--json", stdin=b'{"n":2}\n[3]\n')
        assert (rc, err) == (0, "")
        assert [line.split()[0] for line in out.splitlines()] == ["2", "3"]
        rc, out, err = await cli("pub", "--url", url, "/cli/b", "x", "--idem", "k1", "--output", "json")
        rc2, out2, _ = await cli("pub", "--url", url, "/cli/b", "x", "--idem", "k1", "--output", "json")
        assert rc == rc2 == 0
        assert orjson.loads(out2) == {**orjson.loads(out), "duplicate": True}
        rc, out, err = await cli("pub", "--url", url, "/cli/b", "quiet", "--no-ack")
        assert (rc, out, err) == (0, "", "")

        # sub: replay the last 2 events of /cli/* (both on /cli/b), then one live event, then exit.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hubbub", "sub", "/cli/*", "--url", tcp_url(server), "--last", "2",
            "--count", "3", "--output", "json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(),
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            lines = [await asyncio.wait_for(proc.stdout.readline(), WAIT) for _ in range(2)]
            async with AsyncClient.connect(url) as client:
                await client.publish("/cli/a", "live")
            lines.append(await asyncio.wait_for(proc.stdout.readline(), WAIT))
            rest, err_b = await asyncio.wait_for(proc.communicate(), WAIT)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0 and rest == b"" and err_b == b""
        objs = [orjson.loads(line) for line in lines]
        assert [(o["channel"], o["seq"]) for o in objs] == [("/cli/b", 1), ("/cli/b", 2), ("/cli/a", 4)]
        assert objs[2]["text"] == "live" and objs[2]["time"].isdigit()

        rc, out, err = await cli("log", "/cli/a", "--url", url)
        assert (rc, err) == (0, "")
        assert out.splitlines() == ["/cli/a 1 hello", '/cli/a 2 {"n":2}', "/cli/a 3 [3]", "/cli/a 4 live"]
        rc, out, err = await cli(
            "log", "/cli/a", "--url", url, "--since", "1", "--limit", "2", "--output", "json"
        )
        assert (rc, err) == (0, "")
        objs = [orjson.loads(line) for line in out.splitlines()]
        assert [o["seq"] for o in objs] == [2, 3] and objs[0]["json"] == {"n": 2}

    run(tmp_path, body)


def test_cli_log_pages_through_long_history(tmp_path: Path) -> None:
    async def body(server: Server) -> None:
        url = ws_url(server)
        async with AsyncClient.connect(url) as client:
            for start in range(0, 2100, 300):
                await asyncio.gather(*(client.publish("/long", str(i)) for i in range(start, start + 300)))
        rc, out, err = await cli("log", "/long", "--url", url.replace("ws://", "http://"))
        assert (rc, err) == (0, "")
        lines = out.splitlines()
        assert len(lines) == 2100
        assert [int(line.split()[1]) for line in lines] == list(range(1, 2101))
        rc, out, _ = await cli("log", "/long", "--url", url, "--since", "2095")
        assert [line.split()[1] for line in out.splitlines()] == ["2096", "2097", "2098", "2099", "2100"]
        rc, out, _ = await cli("log", "/never-used", "--url", url)
        assert (rc, out) == (0, "")

    run(tmp_path, body)


def test_cli_errors(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path / "data") as server:
            url = ws_url(server)
            rc, _, err = await cli("pub", "--url", url, "nochannel", "x")
            assert rc == 1 and err.startswith("hubbub pub: bad channel (4004)")
            rc, _, err = await cli("sub", "--url", url, "/x", "--since", "oops")
            assert rc == 2 and "--since expects SEQ:EPOCH" in err
            rc, _, err = await cli("log", "/x", "--url", tcp_url(server))
            assert rc == 2 and "http://" in err
        for cmd in (["pub", "/x", "y"], ["sub", "/x"], ["log", "/x"]):
            rc, out, err = await cli(*cmd, "--url", url)
            assert rc == 1 and out == ""
            assert err == f"hubbub {cmd[0]}: cannot connect to {url}: is `hubbub serve` running?\n"

    asyncio.run(body())


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """Children started inside get SIGINT at its default, as a command started from a terminal does: a test
    run started in the background of a shell without job control (``pytest &`` in a script) ignores SIGINT,
    children inherit an ignored signal, and a ``hubbub`` command that inherits it rightly ignores Ctrl-C."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery to a child process")
def test_cli_sub_ctrl_c_exits_130(tmp_path: Path) -> None:
    async def body(server: Server) -> None:
        url = ws_url(server)
        async with AsyncClient.connect(url) as client:
            await client.publish("/int", "x")
        with _sigint_not_ignored():
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "hubbub", "sub", "/int", "--url", url, "--last", "1",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env(),
            )  # fmt: skip
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), WAIT)
            assert line == b"/int 1 x\n"
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), WAIT)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert (proc.returncode, out, err) == (130, b"", b"")

    run(tmp_path, body)
