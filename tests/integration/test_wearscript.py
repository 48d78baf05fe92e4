"""WearScript over real sockets: sessions driven as the wearscript-go hub and the Python ``wearscript`` client
drive them, and several WearScript connections sharing a fan-out burst (protocols/wearscript.md).

The two peers are written from what those programs put on the wire: the Go hub (``wearscript.go``,
``ConnectionManager``) encodes with ugorji's msgpack handle in the old spec (strings and byte blobs alike
are raw), sends its own ``subscriptions`` list and every device list it knows when a connection opens,
forwards frames byte for byte to the connections whose channels match, and announces an empty list for each
device behind a connection that closed. The Python client (``wearscript/socket.py``) packs with
``msgpack.dumps`` (new spec: str8 for strings of 32 to 255 bytes, bin for bytes), re-sends its whole list
on every ``subscribe``, learns the others' lists from the ``subscriptions`` frames it receives, and
publishes only on a channel some list matches.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgpack

from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 10.0
HUB = ["subscriptions", "server:0", ["test:server:0"]]


@contextlib.asynccontextmanager
async def serve(data_dir: Path, **overrides: Any) -> AsyncIterator[str]:
    cli: dict[str, Any] = {
        "data_dir": str(data_dir),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
    }
    cli.update(overrides)
    async with Server(load_config(cli=cli, env={})) as server:
        yield f"127.0.0.1:{server.ports['http']}"


def lenient(data: bytes) -> Any:
    """Decode as WearScript peers do: raw and str alike are text (bytes when not UTF-8), bin is bytes."""
    return msgpack.unpackb(data, raw=False, unicode_errors="surrogateescape", strict_map_key=False)


class Peer:
    """One WearScript connection: frames out in the peer's own packing, frames in kept raw and decoded."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, *, new_spec: bool) -> None:
        self.ws = ws
        self.new_spec = new_spec
        #: group:device -> list, as learned from the subscriptions frames received (Python client's view).
        self.device_to_channels: dict[str, list[str]] = {}

    def pack(self, *items: Any) -> bytes:
        out: bytes = msgpack.packb(list(items), use_bin_type=self.new_spec)
        return out

    async def send(self, *items: Any) -> bytes:
        data = self.pack(*items)
        await self.ws.send_bytes(data)
        return data

    async def recv_raw(self) -> bytes:
        msg = await self.ws.receive(timeout=WAIT)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        data: bytes = msg.data
        value = lenient(data)
        if value[0] == "subscriptions":
            self.device_to_channels[value[1]] = value[2]
        return data

    async def recv(self) -> Any:
        return lenient(await self.recv_raw())

    def exists(self, channel: str) -> bool:
        """The Python client's rule: a prefix at ':' boundaries of the channel is in some device's list."""
        external = {c for cs in self.device_to_channels.values() for c in cs}
        parts = channel.split(":")
        return any(":".join(parts[:i]) in external for i in range(1, len(parts) + 1))

    async def quiet(self, seconds: float = 0.2) -> None:
        """Nothing arrives for a while (used only after a barrier showed everything before it arrived)."""
        with contextlib.suppress(TimeoutError):
            msg = await self.ws.receive(timeout=seconds)
            raise AssertionError(f"unexpected frame {msg!r}")


@contextlib.asynccontextmanager
async def peer(http: aiohttp.ClientSession, addr: str, *, new_spec: bool) -> AsyncIterator[Peer]:
    async with http.ws_connect(f"ws://{addr}/wearscript/ws") as ws:
        yield Peer(ws, new_spec=new_spec)


async def sync(p: Peer, resp: str = "sync") -> None:
    """A barrier through the hub's test handler: the reply comes after everything handled before."""
    await p.send("test:server:0", "device", resp)
    while (got := await p.recv()) != [resp, "0"]:
        raise AssertionError(f"before the barrier: {got!r}")


def test_a_session_as_the_go_hub_and_the_python_client_drive_it(tmp_path: Path) -> None:
    jpeg = bytes(range(256)) * 8 + b"\xff\xd9"  # a blob that is not UTF-8

    async def go() -> None:
        async with (
            serve(tmp_path / "d") as addr,
            aiohttp.ClientSession() as http,
            peer(http, addr, new_spec=False) as gohub,
        ):
            assert await gohub.recv() == HUB
            # The Go hub's greeting on a new connection: its own list, then its devices'.
            hello = [await gohub.send("subscriptions", "hub:go", ["glass:cmd"])]
            hello.append(await gohub.send("subscriptions", "glass:1", ["phone", "sensors"]))
            await sync(gohub, "glass:cmd:sync")  # answered once its list is known: it listens there
            async with peer(http, addr, new_spec=True) as client:
                # The client is told the hub list, then every device known, oldest first, as they came.
                assert await client.recv() == HUB
                assert [await client.recv_raw(), await client.recv_raw()] == hello
                assert client.exists("phone:img") and client.exists("sensors") and not client.exists("x")
                sub = await client.send("subscriptions", "server:py", ["blob", "chat"])
                assert await gohub.recv_raw() == sub  # forwarded byte for byte
                sub = await client.send("subscriptions", "server:py", ["blob", "chat", "sync"])
                assert await gohub.recv_raw() == sub
                await sync(client)

                # The client publishes only where someone listens: a blob (bin) and a long (str8) string.
                assert client.exists("phone:img")
                up = await client.send("phone:img", jpeg, "k" * 40, {"w": 640})
                assert await gohub.recv_raw() == up  # same bytes, bin and str8 included
                assert not client.exists("nobody")

                # The Go hub forwards a device's frame raw: old-spec raw strings, the blob raw too.
                down = await gohub.send("blob:cam", jpeg, 1.5, [1, "two"])
                assert await client.recv_raw() == down

                # Other dialects: a native publish reaches the Go hub's sensors list as [name, text].
                async with http.post(f"http://{addr}/api/v1/publish/sensors/acc", data=b"0.1,0.2") as r:
                    assert r.status == 200
                assert await gohub.recv() == ["sensors:acc", "0.1,0.2"]

                # Both data messages are in the log, payload = the arguments as they came.
                async with http.get(f"http://{addr}/api/v1/log/phone/img") as r:
                    body = await r.json()
                (ev,) = body["events"]
                assert ev["content_type"] == "application/msgpack"
                assert ev["publisher"]["dialect"] == "wearscript"
                assert base64.b64decode(ev["b64"]) == b"\x93" + up[1 + 10 :]  # fixarray, fixstr name
            # The client is gone: the Go hub is told its device left.
            assert await gohub.recv() == ["subscriptions", "server:py", []]

    asyncio.run(go())


def test_connections_share_a_fan_out_burst_and_the_sender_gets_none(tmp_path: Path) -> None:
    n = 500

    async def go() -> None:
        async with (
            serve(tmp_path / "d") as addr,
            aiohttp.ClientSession() as http,
            contextlib.AsyncExitStack() as stack,
        ):
            peers = [await stack.enter_async_context(peer(http, addr, new_spec=True)) for _ in range(4)]
            for i, p in enumerate(peers):
                assert await p.recv() == HUB
                for _ in range(i):  # the lists announced before this one connected
                    assert (await p.recv())[0] == "subscriptions"
                await p.send("subscriptions", f"phone:{i}", ["burst", f"sync:{i}"])
                await sync(p, f"sync:{i}")
            for i, p in enumerate(peers):
                for _ in range(len(peers) - 1 - i):  # the lists announced after
                    assert (await p.recv())[0] == "subscriptions"
            sender, receivers = peers[0], peers[1:]
            sent = [sender.pack(f"burst:{k % 7}", k, "x" * (k % 50)) for k in range(n)]
            for frame in sent:
                await sender.ws.send_bytes(frame)
            got = [[await r.recv_raw() for _ in range(n)] for r in receivers]
            for frames in got:
                assert frames == sent  # each once, in order, byte for byte
            # Fan-out is in commit order: a later event reaches the sender first if it got no echo.
            async with http.post(f"http://{addr}/api/v1/publish/burst/end", data=b"x") as r:
                assert r.status == 200
            assert await sender.recv() == ["burst:end", "x"]
            for receiver in receivers:
                assert await receiver.recv() == ["burst:end", "x"]
            async with http.get(f"http://{addr}/api/v1/channels/burst/**") as r:
                body = await r.json()
            tops = {c["channel"]: c["top"] for c in body["channels"]}
            assert sum(tops.values()) == n + 1

    asyncio.run(go())


def test_other_dialects_subscriptions_are_advertised_as_they_come_and_go(tmp_path: Path) -> None:
    async def go() -> None:
        async with (
            serve(tmp_path / "d") as addr,
            aiohttp.ClientSession() as http,
            peer(http, addr, new_spec=True) as w,
        ):
            assert await w.recv() == HUB
            async with http.ws_connect(f"ws://{addr}/ws", protocols=("ivy1",)) as ivy:
                await ivy.receive_str(timeout=WAIT)
                await ivy.send_str("+/news/local")
                assert await w.recv() == ["subscriptions", "server:0", ["news:local", "test:server:0"]]
                assert w.exists("news:local")
                await w.send("news:local", "hello")
                line = await ivy.receive_str(timeout=WAIT)
                assert line.endswith(":/news/local:%91%A5hello"), line  # the msgpack payload, escaped
            # The ivy connection closed: its subscription went, and so does the name (after 100 ms).
            assert await w.recv() == HUB

    asyncio.run(go())


BAD_FRAMES = [
    (b"\xc1", 1007),  # not msgpack
    (b"\x90", 1007),  # an empty array
    (b"\x81\xa1a\x01", 1007),  # not an array
    (b"\x92\x01\x02", 1007),  # element 0 not a string
    (b"\x91\xa1a\x01", 1007),  # trailing bytes: not exactly one value
    (b"\x92\xa1a" + b"\x91" * 64 + b"\xc0", 1007),  # nested deeper than 64
    (msgpack.packb(["subscriptions", "phone:A", [1]]), 1007),  # a list of non-strings
    (msgpack.packb(["subscriptions", 7, []]), 1007),  # no group:device
    (msgpack.packb(["subscriptions", "phone:A", ["a", "b", "c", "d"]]), 1008),  # over max_subscriptions
    (msgpack.packb(["big", "x" * 2000]), 1009),  # over max_frame
]


def test_bad_input_and_limits_close_cleanly(tmp_path: Path) -> None:
    async def go() -> None:
        overrides = {"limits.max_frame": 1024, "limits.max_subscriptions": 3}
        async with (
            serve(tmp_path / "d", **overrides) as addr,
            aiohttp.ClientSession() as http,
            peer(http, addr, new_spec=True) as witness,
        ):
            assert await witness.recv() == HUB
            for data, code in BAD_FRAMES:
                async with peer(http, addr, new_spec=True) as p:
                    assert await p.recv() == HUB
                    await p.ws.send_bytes(data)
                    msg = await p.ws.receive(timeout=WAIT)
                    assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == code, (data, msg)
            # The hub is unharmed: the witness still gets what it listens to.
            await witness.send("subscriptions", "phone:w", ["ok"])
            await sync(witness, "ok:sync")
            async with http.post(f"http://{addr}/api/v1/publish/ok", data=b"fine") as r:
                assert r.status == 200
            assert await witness.recv() == ["ok", "fine"]
            async with http.get(f"http://{addr}/metrics") as r:
                text = await r.text()
            assert 'hubbub_bad_input_total{dialect="wearscript"} 9.0' in text  # 1008 is a refusal

    asyncio.run(go())


def test_hub_settings_test_handler_off_and_fixed_channels(tmp_path: Path) -> None:
    async def go() -> None:
        overrides = {
            "wearscript.test_handler": "false",
            "wearscript.hub_channels": '["gist", "weariverse"]',
            "wearscript.advertise_foreign": "false",
            "wearscript.group_device": "hub:7",
        }
        async with (
            serve(tmp_path / "d", **overrides) as addr,
            aiohttp.ClientSession() as http,
            peer(http, addr, new_spec=True) as a,
            peer(http, addr, new_spec=True) as b,
        ):
            assert await a.recv() == ["subscriptions", "hub:7", ["gist", "weariverse"]]
            assert await b.recv() == ["subscriptions", "hub:7", ["gist", "weariverse"]]
            async with http.ws_connect(f"ws://{addr}/ws", protocols=("ivy1",)) as ivy:
                await ivy.receive_str(timeout=WAIT)
                await ivy.send_str("+/news")  # not advertised with advertise_foreign off
                await a.send("subscriptions", "phone:a", ["test"])
                assert await b.recv() == ["subscriptions", "phone:a", ["test"]]
                # With the test handler off, test:hub:7 is a channel like any other.
                await b.send("test:hub:7", "device", "resp")
                assert await a.recv() == ["test:hub:7", "device", "resp"]
                async with http.get(f"http://{addr}/api/v1/log/test/hub/7") as r:
                    assert (await r.json())["top"] == 1
            await a.quiet()

    asyncio.run(go())


def test_a_device_that_stops_reading_loses_the_oldest_events_not_its_connection(tmp_path: Path) -> None:
    """Outbound overflow drops the oldest queued events (protocols README §4), counted; what the device
    reads afterwards is still in order, and the connection stays open."""
    n, size = 300, 64 << 10

    async def go() -> None:
        overrides = {"limits.send_queue": 8, "store": "memory", "durability": "none"}
        async with (
            serve(tmp_path / "d", **overrides) as addr,
            aiohttp.ClientSession() as http,
            peer(http, addr, new_spec=True) as slow,
        ):
            assert await slow.recv() == HUB
            await slow.send("subscriptions", "phone:slow", ["flood", "sync"])
            await sync(slow)
            body = b"x" * size
            for i in range(n):  # each answered after its commit, so after its fan-out
                async with http.post(f"http://{addr}/api/v1/publish/flood/{i}", data=body) as r:
                    assert r.status == 200
            async with http.get(f"http://{addr}/metrics") as r:
                text = await r.text()
            dropped = next(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith('hubbub_dropped_total{dialect="wearscript"}')
            )
            assert 0 < dropped < n
            seen: list[int] = []
            while len(seen) < n - dropped:
                name, payload = await slow.recv()
                assert payload == body.decode()
                seen.append(int(name.split(":")[1]))
            assert seen == sorted(seen) and seen[-1] == n - 1  # in order, the newest kept
            await sync(slow)  # still open

    asyncio.run(go())


def test_a_listener_that_stops_reading_loses_the_oldest_forwarded_replies_not_its_connection(
    tmp_path: Path,
) -> None:
    """Test-handler replies forwarded to another connection (one listening on the reply channel) are that
    connection's traffic, not answers to its own requests: one that stops reading while another floods
    requests loses the oldest of them, counted, as it would events, and is not closed 1013; what it reads
    afterwards is every kept reply once, in order, the newest included."""
    n, size = 300, 64 << 10

    async def go() -> None:
        overrides = {"limits.send_queue": 8, "store": "memory", "durability": "none"}
        async with (
            serve(tmp_path / "d", **overrides) as addr,
            aiohttp.ClientSession() as http,
            peer(http, addr, new_spec=True) as flooder,
        ):
            assert await flooder.recv() == HUB
            await flooder.send("subscriptions", "phone:flooder", ["fsync"])
            await sync(flooder, "fsync")
            async with peer(http, addr, new_spec=True) as slow:
                assert await slow.recv() == HUB
                assert await slow.recv() == ["subscriptions", "phone:flooder", ["fsync"]]
                await slow.send("subscriptions", "phone:slow", ["reply", "sync"])
                await sync(slow)
                assert await flooder.recv() == ["subscriptions", "phone:slow", ["reply", "sync"]]
                pad = "x" * size
                for i in range(n):  # answered to the listener only: the flooder's reads are not slowed
                    await flooder.send("test:server:0", "channel", "reply", str(i), pad)
                await sync(flooder, "fsync")  # every request handled, every reply queued (or dropped)
                async with http.get(f"http://{addr}/metrics") as r:
                    text = await r.text()
                dropped = next(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith('hubbub_dropped_total{dialect="wearscript"}')
                )
                assert 0 < dropped < n
                seen: list[int] = []
                while len(seen) < n - dropped:
                    resp, value = await slow.recv()
                    i, got = value.split(":", 1)
                    assert (resp, got) == ("reply", pad)
                    seen.append(int(i))
                assert seen == sorted(set(seen)) and seen[-1] == n - 1  # once each, in order, the newest kept
                await sync(slow)  # still open

    asyncio.run(go())
