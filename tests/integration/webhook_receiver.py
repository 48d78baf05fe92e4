"""A local webhook receiver for the connector tests: a real aiohttp server on 127.0.0.1, port 0, that checks
every request's signature and answers what the test tells it to (``answer``)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

__all__ = ["Receiver", "Request"]


@dataclass(frozen=True, slots=True)
class Request:
    """One request as received: its body, its attempt header and when it came (monotonic seconds)."""

    body: dict[str, Any]
    attempt: int
    at: float
    signed: bool


@dataclass
class Receiver:
    """``answer(body) -> (status, headers)`` decides each reply (default 200). ``accepted``: the bodies of
    requests answered 2xx, in order; ``requests``: every request."""

    secret: str = "s3cret"
    answer: Callable[[dict[str, Any]], tuple[int, dict[str, str]]] = lambda body: (200, {})
    port: int = 0
    #: Seconds each answer waits after the request is recorded (a slow receiver).
    delay: float = 0.0
    requests: list[Request] = field(default_factory=list)
    accepted: list[dict[str, Any]] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        if not self.port:
            server = site._server
            assert isinstance(server, asyncio.Server)
            self.port = server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _hook(self, request: web.Request) -> web.Response:
        raw = await request.read()
        ts = request.headers.get("X-Hubbub-Timestamp", "")
        mac = hmac.new(self.secret.encode(), ts.encode() + b"." + raw, hashlib.sha256).hexdigest()
        signed = hmac.compare_digest(request.headers.get("X-Hubbub-Signature", ""), "sha256=" + mac)
        body = orjson.loads(raw)
        attempt = int(request.headers.get("X-Hubbub-Attempt", "-1"))
        self.requests.append(Request(body, attempt, time.monotonic(), signed))
        status, headers = (401, {}) if not signed else self.answer(body)
        if 200 <= status < 300:
            self.accepted.append(body)
        self._changed.set()
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(status=status, headers=headers)

    async def wait(self, done: Callable[[], bool], wait_s: float = 10.0) -> None:
        """Until ``done()`` holds after a request (or now), else ``TimeoutError``."""
        async with asyncio.timeout(wait_s):
            while not done():
                self._changed.clear()
                await self._changed.wait()
