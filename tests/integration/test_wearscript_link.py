"""A hubbub node linked up to a WearScript hub (``--wearscript-upstream``), against a second ``hubbub serve``
process acting as that hub: lists go up, matching publishes go both ways, nothing loops back, and the link
comes back after the hub above is killed (kill -9) and restarted. Against an endpoint that checks ``Origin``
as the stock Go hub does: the link sends one, and a 403 is logged as what it is."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgpack
import pytest
from aiohttp import web

from hubbub.server import Server
from hubbub.server_config import load_config

from .serverproc import ServerProcess

WAIT = 15.0


def lenient(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, unicode_errors="surrogateescape", strict_map_key=False)


class Device:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def send(self, *items: Any) -> bytes:
        data: bytes = msgpack.packb(list(items), use_bin_type=True)
        await self.ws.send_bytes(data)
        return data

    async def recv_raw(self) -> bytes:
        msg = await self.ws.receive(timeout=WAIT)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        data: bytes = msg.data
        return data

    async def recv(self) -> Any:
        return lenient(await self.recv_raw())

    async def until(self, want: Any) -> list[Any]:
        """Frames until ``want`` arrives (the others are returned: lists of devices coming and going)."""
        seen: list[Any] = []
        while (got := await self.recv()) != want:
            seen.append(got)
        return seen


@contextlib.asynccontextmanager
async def device(http: aiohttp.ClientSession, port: int) -> AsyncIterator[Device]:
    async with http.ws_connect(f"ws://127.0.0.1:{port}/wearscript/ws") as ws:
        yield Device(ws)


async def log_top(http: aiohttp.ClientSession, port: int, channel: str) -> tuple[int, list[Any]]:
    async with http.get(f"http://127.0.0.1:{port}/api/v1/log{channel}") as r:
        body = await r.json()
    return int(body["top"]), body["events"]


async def publish(http: aiohttp.ClientSession, port: int, channel: str, text: bytes) -> None:
    async with http.post(f"http://127.0.0.1:{port}/api/v1/publish{channel}", data=text) as r:
        assert r.status == 200, await r.text()


async def exchange(http: aiohttp.ClientSession, up_port: int, down_port: int, tag: str) -> None:
    """Lists and data both ways through the link, and no event back over it."""
    async with device(http, up_port) as u, device(http, down_port) as d:
        await u.until(["subscriptions", "server:d", ["test:server:d"]])  # the link's greeting, forwarded
        assert await d.recv() == ["subscriptions", "server:d", ["test:server:d"]]  # its own hub first
        # Up: a device above listens to up-<tag>; the list comes down the link to the node below.
        await u.send("subscriptions", f"phone:u{tag}", [f"up{tag}"])
        await d.until(["subscriptions", f"phone:u{tag}", [f"up{tag}"]])  # the link subscribed before this
        await publish(http, down_port, f"/up{tag}/x", b"from below")
        assert await u.until([f"up{tag}:x", "from below"]) == []
        # Down: a device below listens to down-<tag>; its list goes up, and what is published above comes
        # down, published below (so the other dialects there get it too).
        await d.send("subscriptions", f"phone:d{tag}", [f"down{tag}"])
        await u.until(["subscriptions", f"phone:d{tag}", [f"down{tag}"]])
        await publish(http, up_port, f"/down{tag}/y", b"from above")
        assert await d.until([f"down{tag}:y", "from above"]) == []
        frame = await u.send(f"down{tag}:z", b"\x00\xffblob", 2.5, "s" * 40)
        assert await d.recv_raw() == frame  # a device's frame above reaches the device below as it was
        top, events = await log_top(http, down_port, f"/down{tag}/z")
        assert top == 1 and events[0]["publisher"]["dialect"] == "wearscript"
        # Nothing that came down goes back up: a later event from below arrives above, and before it
        # nothing; the hub above logged each of its events once.
        await u.send("subscriptions", f"phone:u{tag}", [f"up{tag}", f"down{tag}"])
        await d.until(["subscriptions", f"phone:u{tag}", [f"up{tag}", f"down{tag}"]])
        await publish(http, up_port, f"/down{tag}/w", b"once")
        assert await u.until([f"down{tag}:w", "once"]) == []
        assert await d.until([f"down{tag}:w", "once"]) == []
        await publish(http, down_port, f"/up{tag}/marker", b"m")
        assert await u.until([f"up{tag}:marker", "m"]) == []
        assert (await log_top(http, up_port, f"/down{tag}/w"))[0] == 1
        assert (await log_top(http, down_port, f"/down{tag}/w"))[0] == 1


def test_a_node_links_up_to_a_wearscript_hub_both_ways_and_after_a_crash(tmp_path: Path) -> None:
    above = ServerProcess(tmp_path / "above").start()
    below: ServerProcess | None = None
    try:
        up_port = above.ports["http"]
        url = f"ws://127.0.0.1:{up_port}/wearscript/ws"
        below = ServerProcess(
            tmp_path / "below",
            ["--wearscript-upstream", url, "--wearscript-group-device", "server:d"],
        ).start()
        down_port = below.ports["http"]

        async def first() -> None:
            async with aiohttp.ClientSession() as http:
                await exchange(http, up_port, down_port, "1")
                async with http.get(f"http://127.0.0.1:{down_port}/metrics") as r:
                    text = await r.text()
                link = f'link="ws-127.0.0.1-{up_port}"'
                assert f"hubbub_wearscript_link_up{{{link}}} 1.0" in text
                # Up: /up1/x and /up1/marker; down: down1:y, down1:z, down1:w.
                assert f'hubbub_wearscript_link_events_total{{direction="up",{link}}} 2.0' in text
                assert f'hubbub_wearscript_link_events_total{{direction="down",{link}}} 3.0' in text

        asyncio.run(first())

        above.kill()  # kill -9: the link drops uncleanly
        above = ServerProcess(tmp_path / "above", ["--http-listen", f"127.0.0.1:{up_port}"]).start()

        async def again() -> None:
            async with aiohttp.ClientSession() as http:
                await exchange(http, up_port, down_port, "2")

        asyncio.run(again())
        assert below.alive
    finally:
        above.kill()
        if below is not None:
            below.kill()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _until(check: Callable[[], bool], what: str) -> None:
    """Wait for a link's state, which changes on its own task (a connection opening or refused)."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {check.__doc__}")
        await asyncio.sleep(0.01)


def test_links_that_would_close_a_cycle_are_refused(tmp_path: Path) -> None:
    """A ← B and B ← A: whichever link comes up second learns that it is below the other already."""
    pa, pb = _free_port(), _free_port()

    def config(name: str, port: int, up: int) -> Any:
        return load_config(
            cli={
                "data_dir": str(tmp_path / name),
                "http.listen": f"127.0.0.1:{port}",
                "native.tcp_listen": "127.0.0.1:0",
                "wearscript.group_device": f"server:{name}",
                "wearscript.upstream": f"ws://127.0.0.1:{up}/wearscript/ws",
            },
            env={},
        )

    async def go() -> None:
        async with Server(config("a", pa, pb)) as a, Server(config("b", pb, pa)) as b:
            la, lb = a.wearscript_upstream, b.wearscript_upstream
            assert la is not None and lb is not None
            await _until(lambda: {la.state, lb.state} == {"up", "refused"}, "one link up, one refused")
            refused, kept = (la, lb) if la.state == "refused" else (lb, la)
            n, k = refused.reconnects, kept.reconnects
            await _until(lambda: refused.reconnects > n and refused.state == "refused", "a second refusal")
            assert kept.state == "up" and kept.reconnects == k  # the link that came up first stayed up

    asyncio.run(go())


def test_a_node_cannot_link_up_to_itself(tmp_path: Path) -> None:
    port = _free_port()

    async def go() -> None:
        cfg = load_config(
            cli={
                "data_dir": str(tmp_path / "d"),
                "http.listen": f"127.0.0.1:{port}",
                "native.tcp_listen": "127.0.0.1:0",
                "wearscript.upstream": f"ws://127.0.0.1:{port}/wearscript/ws",
            },
            env={},
        )
        async with Server(cfg) as server, aiohttp.ClientSession() as http:
            link = server.wearscript_upstream
            assert link is not None
            await _until(lambda: link.state == "refused", "the refusal")
            async with device(http, port) as d:
                assert await d.recv() == ["subscriptions", "server:0", ["test:server:0"]]
                await d.send("subscriptions", "phone:a", ["a"])
                await d.send("test:server:0", "channelsExternal", "a")
                assert await d.recv() == ["a", {"phone:a": ["a"]}]  # the refused link announced nothing

    asyncio.run(go())


def test_the_hub_above_learns_when_the_node_below_dies(tmp_path: Path) -> None:
    """kill -9 of the linked node: its connection drops uncleanly, and the devices above are told that every
    device it spoke for is gone."""
    above = ServerProcess(tmp_path / "above").start()
    below: ServerProcess | None = None
    try:
        up_port = above.ports["http"]
        url = f"ws://127.0.0.1:{up_port}/wearscript/ws"

        async def go() -> None:
            nonlocal below
            async with aiohttp.ClientSession() as http, device(http, up_port) as u:
                below = ServerProcess(
                    tmp_path / "below",
                    ["--wearscript-upstream", url, "--wearscript-group-device", "server:d"],
                ).start()
                await u.until(["subscriptions", "server:d", ["test:server:d"]])
                async with device(http, below.ports["http"]) as d:
                    await d.send("subscriptions", "phone:x", ["x"])
                    await u.until(["subscriptions", "phone:x", ["x"]])
                    below.kill()
                    gone = [await u.recv(), await u.recv()]
                assert gone == [["subscriptions", "server:d", []], ["subscriptions", "phone:x", []]]

        asyncio.run(go())
    finally:
        above.kill()
        if below is not None:
            below.kill()


class GoHub:
    """A WebSocket endpoint that refuses upgrades as a stock WearScript Go hub does: x/net/websocket's
    ``Handler`` answers 403 when ``Origin`` is missing or does not parse as an absolute URI (or path),
    and, with ``allow``, when it is not one of those. It keeps the Origin of each upgrade it took and the
    frames received."""

    def __init__(self, allow: set[str] | None = None) -> None:
        self.allow = allow
        self.origins: list[str] = []
        self.refused: list[str | None] = []
        self.frames: asyncio.Queue[Any] = asyncio.Queue()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def handler(self, request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        parts = urlsplit(origin or "")
        parsed = bool(parts.scheme and parts.netloc) or (origin or "").startswith("/")
        if not parsed or (self.allow is not None and origin not in self.allow):
            self.refused.append(origin)
            return web.Response(status=403, text="Forbidden\n")
        assert origin is not None
        self.origins.append(origin)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await self.frames.put(lenient(msg.data))
        return ws

    async def __aenter__(self) -> GoHub:
        app = web.Application()
        app.router.add_get("/ws", self.handler)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"ws://127.0.0.1:{port}/ws"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def _linked_config(tmp_path: Path, url: str) -> Any:
    return load_config(
        cli={
            "data_dir": str(tmp_path / "d"),
            "http.listen": "127.0.0.1:0",
            "native.tcp_listen": "127.0.0.1:0",
            "wearscript.upstream": url,
        },
        env={},
    )


def test_the_link_sends_the_hubs_own_origin_so_a_go_hub_takes_it(tmp_path: Path) -> None:
    async def go() -> None:
        async with GoHub() as hub, Server(_linked_config(tmp_path, hub.url)) as server:
            link = server.wearscript_upstream
            assert link is not None
            await _until(lambda: link.state == "up", "the link up")
            # The greeting: this hub's own list, as a WearScript hub sends it up.
            assert await asyncio.wait_for(hub.frames.get(), WAIT) == [
                "subscriptions",
                "server:0",
                ["test:server:0"],
            ]
            assert hub.origins == [hub.url.replace("ws://", "http://").removesuffix("/ws")]
            assert hub.refused == []

    asyncio.run(go())


def test_a_403_is_logged_as_a_refused_origin_not_as_a_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "hubbub.wearscript.link")

    async def go() -> None:
        async with GoHub(allow={"https://devices.example"}) as hub:
            async with Server(_linked_config(tmp_path, hub.url)) as server:
                link = server.wearscript_upstream
                assert link is not None
                await _until(lambda: bool(hub.refused) and link.state == "down", "a refusal")
            origin = hub.url.replace("ws://", "http://").removesuffix("/ws")
            assert hub.refused[0] == origin
            [msg] = {r.getMessage() for r in caplog.records if "refused the upgrade" in r.getMessage()}
            assert msg == (
                "wearscript upstream refused the upgrade: 403 (forbidden: the hub refused this link's "
                f"Origin ({origin}) or what its token may do (a stock WearScript hub refuses an Origin it "
                "cannot parse or does not allow))"
            )

    asyncio.run(go())


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("ws://hub.example:8080/ws", "http://hub.example:8080"),
        ("wss://hub.example/wearscript/ws/s3cret?token=t", "https://hub.example"),
        ("ws://user:pw@[::1]:81/ws", "http://[::1]:81"),
    ],
)
def test_link_origin(url: str, origin: str) -> None:
    from hubbub.transports.wearscript_link import link_origin

    assert link_origin(url) == origin
