"""Changes sent by another site's browser page are refused on every HTTP surface (docs/security.md
"Cross-site requests", transports/cross_site.py), with auth off on a loopback node: native publish and trim,
the webhooks API, guble's REST publish and its FCM/APNs device routes, ivy's publish, qpubs' emit (its
``GET /emit`` alias too) and the admin API. Nothing changes (no event, no hook, no device); the same
requests without ``Origin`` (scripts), from the server's own page, and from an origin ``cors_origin`` allows
go through.

Tests wait on conditions with timeouts, never on time passing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

from .fcm_server import FcmServer

HOST = "127.0.0.1"
EVIL = "http://evil.example"
APP = "https://app.example"

#: (method, path, body): every state-changing HTTP surface; ``{n}`` makes each round's names its own.
SURFACES: list[tuple[str, str, bytes]] = [
    ("POST", "/api/v1/publish/native{n}", b"1"),
    ("POST", "/api/v1/trim/native{n}?seq=1&epoch=1", b""),
    ("PUT", "/api/v1/webhooks/hook{n}", b'{"url":"http://127.0.0.1:9/","pattern":"/x/**"}'),
    ("DELETE", "/api/v1/webhooks/hook{n}", b""),
    ("POST", "/api/message/guble{n}", b"1"),
    ("POST", "/fcm/dev{n}/user/fcm{n}", b""),
    ("DELETE", "/fcm/dev{n}/user/fcm{n}", b""),
    ("POST", "/fcm/substitute/", b'{"replace":"dev{n}","with":"other{n}"}'),
    ("POST", "/apns/dev{n}/user/apns{n}", b""),
    ("POST", "/events/ivy{n}", b"data=1"),
    ("POST", "/qpubs/emit?topic=qpubs{n}", b"1"),
    ("POST", "/qpubs/ignore?topic=x&listener=none", b""),
    ("GET", "/emit?alias{n},1", b""),  # qpubs' alias publishes with a GET: an <img> could send it
    ("POST", "/api/v1/admin/consumers/c{n}/reset", b""),
    ("DELETE", "/api/v1/admin/consumers/c{n}", b""),
    ("DELETE", "/api/v1/admin/connections/0123456789abcdef", b""),
]

#: What browsers send with another site's page's requests (a form's POST, a no-cors fetch, an <img>).
CROSS_SITE: list[dict[str, str]] = [
    {"Origin": EVIL},
    {"Origin": "null"},  # a sandboxed frame, a file:// page
    {"Origin": EVIL, "Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://localhost:1", "Sec-Fetch-Site": "same-site"},  # another port of the same host
    {"Sec-Fetch-Site": "cross-site"},  # an <img>'s GET carries no Origin
]


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **extra: Any) -> AsyncIterator[tuple[Server, aiohttp.ClientSession, str]]:
    fcm = await FcmServer().start()
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "d"),
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "qpubs.qrpc_listen": f"{HOST}:0",
        "guble.fcm": "true",
        "guble.fcm_credentials_file": str(fcm.service_account(tmp_path / "sa.json")),
        "guble.fcm_endpoint": fcm.base,
        **extra,
    }
    try:
        async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
            yield server, http, f"http://{HOST}:{server.ports['http']}"
    finally:
        await fcm.stop()


async def send(http: aiohttp.ClientSession, base: str, n: str, headers: dict[str, str]) -> list[int]:
    """Every surface's status for ``headers`` (names of round ``n``)."""
    out = []
    for method, path, body in SURFACES:
        url = base + path.replace("{n}", n)
        async with http.request(method, url, data=body.replace(b"{n}", n.encode()), headers=headers) as r:
            await r.read()
            out.append(r.status)
    return out


async def state(http: aiohttp.ClientSession, base: str) -> tuple[list[str], list[str], list[str]]:
    """The channels with events, the webhooks and the FCM devices' topics."""
    async with http.get(base + "/api/v1/admin/channels") as r:
        channels = [c["channel"] for c in (await r.json())["channels"]]
    async with http.get(base + "/api/v1/webhooks") as r:
        hooks = [h["name"] for h in (await r.json())["webhooks"]]
    async with http.get(base + "/fcm/") as r:
        devices = await r.json()
    return channels, hooks, devices


def run(body: Any) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


def test_another_sites_page_changes_nothing_on_any_surface(tmp_path: Path) -> None:
    """Each cross-site form of every surface is refused with 403 and changes nothing; a script (no Origin)
    and the server's own page (by Origin, or by Sec-Fetch-Site) get the route's own answers and publish."""

    async def body() -> None:
        async with serve(tmp_path) as (_, http, base):
            for i, headers in enumerate(CROSS_SITE):
                assert await send(http, base, f"x{i}", headers) == [403] * len(SURFACES), headers
            assert await state(http, base) == ([], [], [])
            # The native refusal has the native error body; the dialects' a line of text.
            async with http.post(base + "/api/v1/publish/a", data=b"1", headers={"Origin": EVIL}) as r:
                assert (await r.json())["error"]["code"] == 4102
            own = [{}, {"Origin": base}, {"Origin": EVIL, "Sec-Fetch-Site": "same-origin"}]
            for i, headers in enumerate(own):
                statuses = await send(http, base, f"o{i}", headers)
                assert 403 not in statuses, (headers, statuses)
            channels, hooks, devices = await state(http, base)
            for i in range(len(own)):
                for name in ("native", "guble", "ivy", "qpubs", "alias"):
                    assert f"/{name}o{i}" in channels, (name, i, channels)
            assert hooks == [] and devices == []  # each round's hook and device deleted again

    run(body)


@pytest.mark.parametrize("cors", [json.dumps([APP]), "*"])
def test_an_origin_cors_allows_may_change_the_node(tmp_path: Path, cors: str) -> None:
    """A browser client served from an origin ``cors_origin`` allows publishes on every surface; another
    origin is still refused unless ``cors_origin`` is ``*``, which does not open the admin API."""

    async def body() -> None:
        async with serve(tmp_path, cors_origin=cors) as (_, http, base):
            headers = {"Origin": APP, "Sec-Fetch-Site": "cross-site"}
            statuses = await send(http, base, "a", headers)
            admin = [i for i, (_, path, _) in enumerate(SURFACES) if path.startswith("/api/v1/admin/")]
            for i, status in enumerate(statuses):
                assert (status == 403) == (cors == "*" and i in admin), (SURFACES[i], status)
            evil = await send(http, base, "e", {"Origin": EVIL})
            assert (403 not in [s for i, s in enumerate(evil) if i not in admin]) == (cors == "*")
            channels, _, _ = await state(http, base)
            for name in ("native", "guble", "ivy", "qpubs", "alias"):
                assert f"/{name}a" in channels, (name, channels)

    run(body)
