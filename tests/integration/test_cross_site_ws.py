"""Another site's browser page cannot open a WebSocket whose connection would be anonymous (docs/security.md
"Cross-site requests", transports/cross_site.py ``cross_site_upgrade``), on every dialect's WebSocket route:
native, ivy, guble, mist (both generations) and MQTT over WebSocket (WearScript's takes any ``Origin``, as its
spec promises). With auth off, an upgrade
from another site's page (its ``Origin``, its ``Sec-Fetch-Site``) gets ``403`` before the ``101``, with the
setting that allows it named in the body and logged once per origin; one from an origin ``cors_origin``
allows, from the server's own origin, or without ``Origin`` (device clients, SDKs) opens and works. With
auth on, a page that presents a token opens one from any origin.

Tests wait on conditions with timeouts, never on time passing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from hubbub.dialects import mqtt_codec
from hubbub.server import Server
from hubbub.server_config import load_config

HOST = "127.0.0.1"
EVIL = "http://evil.example"
APP = "https://app.example"
WAIT = 5.0
TOKEN = "tok-root"
TOKENS = {TOKEN: {"user": "root", "admin": True}}

Ws = aiohttp.ClientWebSocketResponse


async def _native(ws: Ws, token: str | None) -> None:
    await ws.send_json({"op": "hello", "id": 1, "v": 1})
    assert (await ws.receive_json(timeout=WAIT))["op"] == "reply"


async def _ivy(ws: Ws, token: str | None) -> None:
    intro = await ws.receive_str(timeout=WAIT)
    assert intro.startswith("@") and ":~/sid:" in intro, intro


async def _guble(ws: Ws, token: str | None) -> None:
    greeting = await ws.receive_bytes(timeout=WAIT)
    assert greeting.startswith(b"#connected You are connected to the server."), greeting


async def _wearscript(ws: Ws, token: str | None) -> None:
    greeting = msgpack.unpackb(await ws.receive_bytes(timeout=WAIT), raw=False)  # the hub's own list
    assert greeting[0] == "subscriptions", greeting


async def _mist2015(ws: Ws, token: str | None) -> None:
    await ws.send_str('{"command":"ping"}')
    assert json.loads(await ws.receive_str(timeout=WAIT)) == {"success": True, "command": "ping"}


async def _mist1(ws: Ws, token: str | None) -> None:
    await ws.send_str('{"command":"ping"}')
    assert await ws.receive_str(timeout=WAIT) == '{"command":"ping","data":"pong"}\n'


async def _mqtt(ws: Ws, token: str | None) -> None:
    await ws.send_bytes(mqtt_codec.encode_connect("a", username=token))
    assert await ws.receive_bytes(timeout=WAIT) == b"\x20\x02\x00\x00"  # CONNACK, accepted


Exchange = Callable[[Ws, "str | None"], Awaitable[None]]

#: Every dialect's WebSocket route: (path, subprotocols, one exchange that shows the connection is served).
ROUTES: dict[str, tuple[str, tuple[str, ...], Exchange]] = {
    "native": ("/ws/hubbub", ("hubbub.v1.json",), _native),
    "ivy": ("/ws", ("ivy1",), _ivy),
    "guble": ("/stream/user/u", (), _guble),
    "wearscript": ("/wearscript/ws", (), _wearscript),
    "mist2015": ("/mist/ws", (), _mist2015),
    "mist1": ("/mist/v1/ws", (), _mist1),
    "mqtt": ("/mqtt", ("mqtt",), _mqtt),
}

#: The routes whose spec accepts any ``Origin`` with auth off too: WearScript's (the shared vector
#: ``wearscript.any-origin`` connects with a foreign one).
ANY_ORIGIN = {"wearscript"}

#: What browsers send with an upgrade from another site's page.
CROSS_SITE: list[dict[str, str]] = [
    {"Origin": EVIL},
    {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://localhost:1", "Sec-Fetch-Site": "same-site"},  # another port of the same host
    {"Origin": "null"},  # a sandboxed frame, a file:// page
]


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **extra: Any) -> AsyncIterator[tuple[Server, aiohttp.ClientSession, str]]:
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "d"),
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "mqtt.tcp_listen": f"{HOST}:0",
        **extra,
    }
    async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
        yield server, http, f"http://{HOST}:{server.ports['http']}"


async def opens(
    http: aiohttp.ClientSession, base: str, dialect: str, headers: dict[str, str], token: str | None = None
) -> None:
    """The upgrade gets its ``101`` and the connection is served (the dialect's own exchange)."""
    path, protocols, exchange = ROUTES[dialect]
    url = base.replace("http", "ws", 1) + path + (f"?token={token}" if token else "")
    async with http.ws_connect(url, protocols=protocols, headers=headers) as ws:
        await exchange(ws, token)


async def refused(http: aiohttp.ClientSession, base: str, dialect: str, headers: dict[str, str]) -> str:
    """The upgrade's ``403`` and its body (a browser shows neither to the page: its socket fails)."""
    path, protocols, _ = ROUTES[dialect]
    upgrade = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        **({"Sec-WebSocket-Protocol": ", ".join(protocols)} if protocols else {}),
    }
    async with http.get(base + path, headers={**upgrade, **headers}) as r:
        assert r.status == 403, (dialect, headers, r.status)
        return await r.text()


def run(body: Any) -> None:
    asyncio.run(body())


def test_another_sites_page_cannot_open_an_anonymous_websocket_on_any_route(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Auth off: every cross-site upgrade is refused before its 101 (no session), the body and one warning
    per origin name ``cors_origin``; no Origin, and the server's own origin, open and work. WearScript's
    route takes any Origin, as its spec says."""

    async def body() -> None:
        async with serve(tmp_path) as (server, http, base):
            node = server.node
            assert node is not None
            for dialect in ROUTES:
                for headers in CROSS_SITE:
                    if dialect in ANY_ORIGIN:
                        await opens(http, base, dialect, headers)
                        continue
                    text = await refused(http, base, dialect, headers)
                    assert "cors_origin" in text and headers["Origin"] in text, text
                    assert not node.sessions
            warned = [r for r in caplog.records if r.name == "hubbub.transports.cross_site"]
            assert all(r.levelno == logging.WARNING and "cors_origin" in r.getMessage() for r in warned)
            assert sorted(r.__dict__["origin"] for r in warned) == sorted(h["Origin"] for h in CROSS_SITE[1:])

            own = {"Origin": base}
            for dialect in ROUTES:
                await opens(http, base, dialect, {})
                await opens(http, base, dialect, own)
                await opens(http, base, dialect, {**own, "Sec-Fetch-Site": "same-origin"})

    caplog.set_level(logging.WARNING, logger="hubbub.transports.cross_site")
    run(body)


@pytest.mark.parametrize("cors", [EVIL, json.dumps([APP, EVIL]), "*"])
def test_an_origin_cors_allows_may_open_one(tmp_path: Path, cors: str) -> None:
    async def body() -> None:
        async with serve(tmp_path, cors_origin=cors) as (_, http, base):
            for dialect in ROUTES:
                await opens(http, base, dialect, {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"})
            if cors != "*":  # another origin is still refused
                await refused(http, base, "native", {"Origin": "http://other.example"})

    run(body)


def test_with_auth_on_a_page_with_a_token_opens_one_from_any_origin(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path, **{"auth.mode": "token", "auth.tokens": TOKENS}) as (_, http, base):
            for dialect in ROUTES:
                await opens(http, base, dialect, {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"}, TOKEN)

    run(body)
