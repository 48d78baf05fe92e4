"""The Python client against a server that stops answering: leaving a subscription (``unsubscribe``, the end
of ``async with client.subscribe(...)``, Ctrl-C in ``hubbub sub``) waits for the server's answer at most
``UNSUBSCRIBE_WAIT_S``, then the subscription is gone all the same."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from hubbub.client import AsyncClient
from hubbub.client import subscription as client_subscription


async def _server_that_ignores_unsubscribe(seen: list[str]) -> tuple[web.AppRunner, int]:
    """A WebSocket endpoint speaking just enough of the native protocol: it answers ``hello`` and
    ``subscribe`` and never answers ``unsubscribe`` (the connection stays open)."""

    async def handle(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=["hubbub.v1.json"])
        await ws.prepare(request)
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            frame: dict[str, Any] = json.loads(msg.data)
            seen.append(frame["op"])
            if frame["op"] in ("hello", "subscribe"):
                await ws.send_str(json.dumps({"op": "reply", "id": frame["id"], "ping_interval": 25}))
        return ws

    app = web.Application()
    app.router.add_get("/ws/hubbub", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    port = server.sockets[0].getsockname()[1]
    return runner, port


def test_leaving_a_subscription_does_not_wait_for_a_server_that_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_subscription, "UNSUBSCRIBE_WAIT_S", 0.5)

    async def main() -> None:
        seen: list[str] = []
        runner, port = await _server_that_ignores_unsubscribe(seen)
        try:
            async with AsyncClient.connect(f"ws://127.0.0.1:{port}/ws/hubbub") as client:
                sub = client.subscribe("/a")
                await sub.start()
                assert sub.active
                t0 = time.monotonic()
                await asyncio.wait_for(sub.unsubscribe(), 10)
                waited = time.monotonic() - t0
                assert sub.closed and not sub.active
                assert 0.4 < waited < 5, waited  # the bound, not the dead-connection timeout (55 s here)
                assert seen == ["hello", "subscribe", "unsubscribe"]
        finally:
            await runner.cleanup()

    asyncio.run(main())
