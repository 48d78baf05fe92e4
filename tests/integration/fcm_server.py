"""A local server playing Firebase Cloud Messaging for the connector tests (127.0.0.1, port 0): the OAuth2
token endpoint (checks the service account's RS256 assertion), the HTTP v1 send API (checks the bearer
token) and the legacy send API (checks the server key). ``answer(token) -> (status, body, headers)`` decides
each send's reply (default: delivered)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import orjson
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

__all__ = ["UNREGISTERED", "FcmServer"]

PROJECT = "hubbub-test"
LEGACY_KEY = "legacy-server-key"
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
#: The v1 answer for a token FCM no longer knows.
UNREGISTERED: tuple[int, dict[str, Any], dict[str, str]] = (
    404,
    {"error": {"code": 404, "status": "NOT_FOUND", "details": [{"errorCode": "UNREGISTERED"}]}},
    {},
)

Answer = tuple[int, dict[str, Any], dict[str, str]]


@dataclass
class FcmServer:
    answer: Callable[[str], Answer] = lambda token: (200, {}, {})
    port: int = 0
    #: (device token, message) of every send answered 200, in order.
    delivered: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sends: int = 0
    tokens_issued: int = 0
    _key: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))
    _access: set[str] = field(default_factory=set)
    _runner: web.AppRunner | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def service_account(self, path: Path) -> Path:
        """Write a service-account key file whose token_uri is this server."""
        pem = self._key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        info = {
            "type": "service_account",
            "project_id": PROJECT,
            "private_key": pem,
            "client_email": "hubbub@hubbub-test.iam.gserviceaccount.com",
            "token_uri": f"{self.base}/token",
        }
        path.write_text(json.dumps(info))
        return path

    async def start(self) -> FcmServer:
        app = web.Application()
        app.router.add_post("/token", self._token)
        app.router.add_post(f"/v1/projects/{PROJECT}/messages:send", self._v1)
        app.router.add_post("/fcm/send", self._legacy)
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

    async def wait(self, done: Callable[[], bool], wait_s: float = 10.0) -> None:
        async with asyncio.timeout(wait_s):
            while not done():
                self._changed.clear()
                await self._changed.wait()

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        assert form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
        claims = jwt.decode(
            str(form["assertion"]),
            self._key.public_key(),
            algorithms=["RS256"],
            audience=f"{self.base}/token",
        )
        assert claims["scope"] == SCOPE and claims["exp"] > time.time()
        self.tokens_issued += 1
        token = f"access-{self.tokens_issued}"
        self._access.add(token)
        return web.json_response({"access_token": token, "expires_in": 3600, "token_type": "Bearer"})

    def _reply(self, device: str, message: dict[str, Any], ok_body: dict[str, Any]) -> web.Response:
        self.sends += 1
        status, body, headers = self.answer(device)
        if status == 200:
            self.delivered.append((device, message))
            body = body or ok_body
        self._changed.set()
        return web.Response(
            status=status, body=orjson.dumps(body), headers=headers, content_type="application/json"
        )

    async def _v1(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if auth.removeprefix("Bearer ") not in self._access:
            return web.json_response({"error": {"code": 401, "status": "UNAUTHENTICATED"}}, status=401)
        message = (await request.json())["message"]
        return self._reply(message["token"], message, {"name": f"projects/{PROJECT}/messages/{self.sends}"})

    async def _legacy(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"key={LEGACY_KEY}":
            return web.Response(status=401)
        message = await request.json()
        return self._reply(
            message["to"], message, {"success": 1, "failure": 0, "results": [{"message_id": "1"}]}
        )
