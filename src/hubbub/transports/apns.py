"""The Apple Push Notification service provider for guble's APNs connector (docs/connectors.md "guble's
APNs connector"): HTTP/2 over TLS (httpx), authenticated by a client certificate (guble's ``.p12`` or a PEM
chain) or by a provider token (an ES256 JWT made from a ``.p8`` key, renewed every 40 minutes: Apple
refuses one older than an hour and one renewed more often than every 20 minutes).

A message's body is the APNs payload when it is a JSON object (``{"aps":{…},…}`` as guble sent it);
anything else is sent as ``{"aps":{"alert":<text>}}``.

Concurrency contract: event loop thread only.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import time
from typing import Any

import httpx
import jwt
import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from hubbub.events import Event

from .connector import Gone, Outcome, Refused, Retry, Route, Sent, Unauthorized, parse_retry_after

__all__ = ["PRODUCTION", "SANDBOX", "ApnsProvider", "apns_payload", "client_context"]

PRODUCTION = "https://api.push.apple.com"
SANDBOX = "https://api.sandbox.push.apple.com"
#: A provider token is renewed after this long (Apple: at most every 20 minutes, valid for 60).
TOKEN_RENEW_S = 40 * 60
#: Reasons after which the device is gone (its subscription is removed).
GONE_REASONS = frozenset({"BadDeviceToken", "Unregistered", "DeviceTokenNotForTopic"})


def apns_payload(payload: bytes) -> bytes:
    """The APNs request body of a guble message's body (module docstring)."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        return payload
    return orjson.dumps({"aps": {"alert": payload.decode("utf-8", "replace")}})


def client_context(cert_file: str = "", cert_password: str = "", ca_file: str = "") -> ssl.SSLContext:
    """The TLS context of the APNs client: the system's trust (or ``ca_file`` too), HTTP/2 by ALPN, and
    the client certificate when given: a PEM chain with its key, or a PKCS#12 file (``.p12``/``.pfx``,
    guble's) opened with ``cert_password``."""
    ctx = ssl.create_default_context()
    if ca_file:
        ctx.load_verify_locations(ca_file)
    ctx.set_alpn_protocols(["h2"])
    if not cert_file:
        return ctx
    if cert_file.lower().endswith((".p12", ".pfx")):
        with open(cert_file, "rb") as f:
            key, cert, extra = pkcs12.load_key_and_certificates(f.read(), cert_password.encode() or None)
        if key is None or cert is None:
            raise ValueError(f"{cert_file}: no key or certificate in it")
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ) + b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (cert, *extra))
        # ssl loads a chain from a file only: a private one, removed as soon as it is read.
        fd, path = tempfile.mkstemp(suffix=".pem")
        try:
            os.write(fd, pem)
            os.close(fd)
            ctx.load_cert_chain(path)
        finally:
            os.unlink(path)
    else:
        ctx.load_cert_chain(cert_file, password=cert_password or None)
    return ctx


class ApnsProvider:
    """Pushes to ``<endpoint>/3/device/<device token>`` with the app's topic."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        context: ssl.SSLContext,
        *,
        key_pem: str = "",
        key_id: str = "",
        team_id: str = "",
        timeout_s: float = 10.0,
        connections: int = 8,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.topic = topic
        self._context = context
        self._key = key_pem
        self._key_id = key_id
        self._team = team_id
        self._timeout = timeout_s
        self._connections = connections
        self._client: httpx.AsyncClient | None = None
        self._token = ""
        self._token_at = 0.0
        #: Provider tokens made since start.
        self.tokens_made = 0

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            limits = httpx.Limits(max_connections=self._connections)
            self._client = httpx.AsyncClient(
                http2=True, verify=self._context, timeout=self._timeout, limits=limits
            )
        return self._client

    def _bearer(self) -> str:
        if not self._token or time.monotonic() - self._token_at >= TOKEN_RENEW_S:
            claims = {"iss": self._team, "iat": int(time.time())}
            self._token = jwt.encode(claims, self._key, algorithm="ES256", headers={"kid": self._key_id})
            self._token_at = time.monotonic()
            self.tokens_made += 1
        return self._token

    async def send(self, route: Route, event: Event, attempt: int) -> Outcome:
        headers: dict[str, str] = {"apns-topic": self.topic, "apns-push-type": "alert"}
        if self._key:
            headers["authorization"] = f"bearer {self._bearer()}"
        url = f"{self.endpoint}/3/device/{route.target['device_token']}"
        try:
            resp = await self._http().post(url, content=apns_payload(event.payload), headers=headers)
        except httpx.TimeoutException:
            return Retry("timeout")
        except httpx.HTTPError:
            return Retry("connect")
        if resp.status_code == 200:
            return Sent()
        reason = _reason(resp.content)
        if resp.status_code == 410 or reason in GONE_REASONS:
            return Gone(f"apns_{reason or resp.status_code}")
        if resp.status_code == 429 or resp.status_code >= 500:
            return Retry(
                f"apns_{reason or resp.status_code}", parse_retry_after(resp.headers.get("retry-after"))
            )
        if reason == "ExpiredProviderToken":
            self._token = ""  # made anew at the next try
            return Retry("apns_ExpiredProviderToken")
        if resp.status_code == 403:
            # The certificate or the key is refused: every device waits until an operator fixes it, the
            # connector paused (connector_retry.py).
            return Unauthorized(f"apns_{reason or 403}")
        return Refused(f"apns_{reason or resp.status_code}")

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _reason(raw: bytes) -> str:
    try:
        answer: Any = orjson.loads(raw)
        return str(answer.get("reason", "")) if isinstance(answer, dict) else ""
    except orjson.JSONDecodeError:
        return ""
