"""Firebase Cloud Messaging providers for guble's FCM connector (docs/connectors.md "guble's FCM
connector"): the HTTP v1 API with a service account's OAuth2 token, and the legacy API with guble's server
key. Each answers a :class:`~.connector.Connector` with an outcome per push.

A message's body becomes the FCM message as guble made it: a JSON object with both ``notification`` and
``data`` is taken as it is; another JSON object is the ``data``; anything else is ``{"message": <text>}``
as ``data``. FCM v1 wants every ``data`` value a string: other values are sent as their JSON text.

Concurrency contract: event loop thread only; a provider's OAuth2 token is fetched by one push at a time
(the others wait for it) and cached until a minute before it expires.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import jwt
import orjson

from hubbub.events import Event

from .connector import Gone, Outcome, Refused, Retry, Route, Sent, Unauthorized, parse_retry_after

__all__ = ["FCM_SCOPE", "FcmLegacy", "FcmV1", "fcm_message", "load_service_account"]

FCM_SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
LEGACY_ENDPOINT = "https://fcm.googleapis.com/fcm/send"
V1_BASE = "https://fcm.googleapis.com"
#: A token is renewed this long before it expires.
TOKEN_MARGIN_S = 60.0


def fcm_message(payload: bytes) -> dict[str, Any]:
    """The FCM message fields of a guble message's body (module docstring)."""
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("notification"), dict) and isinstance(body.get("data"), dict):
            return {"notification": body["notification"], "data": body["data"]}
        return {"data": body}
    return {"data": {"message": payload.decode("utf-8", "replace")}}


def _status_outcome(status: int, retry_after: str | None) -> Outcome | None:
    """The outcome every FCM API shares for a status, or None for the API's own reading."""
    if status in (408, 429) or status >= 500:
        return Retry(f"http_{status}", parse_retry_after(retry_after))
    return None


class _Http:
    """One pooled aiohttp session, created at the first request."""

    def __init__(self, timeout_s: float, connections: int) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    def client(self) -> aiohttp.ClientSession:
        if self._session is None:
            conn = aiohttp.TCPConnector(limit=self._connections)
            self._session = aiohttp.ClientSession(connector=conn, timeout=self._timeout)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await asyncio.sleep(0)  # aiohttp closes its transports on the next loop iteration


class FcmLegacy(_Http):
    """The legacy HTTP API (guble's): ``Authorization: key=<server key>``, ``{"to": <token>, …}``."""

    def __init__(
        self, api_key: str, endpoint: str = "", timeout_s: float = 10.0, connections: int = 8
    ) -> None:
        super().__init__(timeout_s, connections)
        self._key = api_key
        self.endpoint = endpoint or LEGACY_ENDPOINT

    async def send(self, route: Route, event: Event, attempt: int) -> Outcome:
        body = {"to": route.target["device_token"], **fcm_message(event.payload)}
        headers = {"Authorization": f"key={self._key}", "Content-Type": "application/json"}
        try:
            async with self.client().post(self.endpoint, data=orjson.dumps(body), headers=headers) as resp:
                raw = await resp.read()
                if (shared := _status_outcome(resp.status, resp.headers.get("Retry-After"))) is not None:
                    return shared
                if resp.status != 200:
                    # 400: the message is malformed; 401: the server key is refused, which holds back every
                    # device until an operator fixes the key: the connector pauses (connector_retry.py).
                    return Unauthorized("http_401") if resp.status == 401 else Refused(f"http_{resp.status}")
        except TimeoutError:
            return Retry("timeout")
        except aiohttp.ClientError:
            return Retry("connect")
        try:
            answer = orjson.loads(raw)
            first = (answer.get("results") or [{}])[0]
            error = first.get("error") if answer.get("failure") else None
            # A canonical registration id: the device has a newer token, which guble's connector kept.
            canonical = first.get("registration_id") if answer.get("canonical_ids") else None
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            return Retry("fcm_bad_answer")
        if not error:
            if isinstance(canonical, str) and canonical and canonical != route.target["device_token"]:
                return Sent({"device_token": canonical})
            return Sent()
        if error in ("NotRegistered", "InvalidRegistration", "MissingRegistration"):
            return Gone(f"fcm_{error}")
        if error in ("Unavailable", "InternalServerError", "DeviceMessageRateExceeded"):
            return Retry(f"fcm_{error}")
        return Refused(f"fcm_{error}")


def load_service_account(path: str) -> dict[str, str]:
    """A Google service-account key file's fields the v1 API needs (``client_email``, ``private_key``,
    ``token_uri``, ``project_id``); ``ValueError`` naming what is missing."""
    with open(path, encoding="utf-8") as f:
        info = json.load(f)
    missing = [k for k in ("client_email", "private_key", "token_uri", "project_id") if not info.get(k)]
    if missing:
        raise ValueError(f"{path}: not a service-account key file (no {', '.join(missing)})")
    return {k: str(info[k]) for k in ("client_email", "private_key", "token_uri", "project_id")}


class FcmV1(_Http):
    """The HTTP v1 API: an OAuth2 access token from the service account's signed JWT (RFC 7523), cached
    until shortly before it expires; ``{"message": {"token": …}}`` to ``projects/<id>/messages:send``."""

    def __init__(
        self, account: Mapping[str, str], base: str = "", timeout_s: float = 10.0, connections: int = 8
    ) -> None:
        super().__init__(timeout_s, connections)
        self._account = dict(account)
        self.url = f"{(base or V1_BASE).rstrip('/')}/v1/projects/{account['project_id']}/messages:send"
        self._token = ""
        self._expires = 0.0
        self._renewing: asyncio.Lock = asyncio.Lock()
        #: Tokens fetched since start (the tests check that one is reused until it expires).
        self.tokens_fetched = 0

    def _assertion(self) -> str:
        now = int(time.time())
        a = self._account
        claims = {
            "iss": a["client_email"],
            "scope": FCM_SCOPE,
            "aud": a["token_uri"],
            "iat": now,
            "exp": now + 3600,
        }
        return jwt.encode(claims, a["private_key"], algorithm="RS256")

    async def _access_token(self) -> str | Retry | Unauthorized:
        async with self._renewing:
            if self._token and time.monotonic() < self._expires - TOKEN_MARGIN_S:
                return self._token
            form = {
                "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                "assertion": self._assertion(),
            }
            try:
                async with self.client().post(self._account["token_uri"], data=form) as resp:
                    raw = await resp.read()
                    if resp.status in (400, 401, 403):  # the account's key refused (invalid_grant …)
                        return Unauthorized(f"oauth_{resp.status}")
                    if resp.status != 200:
                        return Retry(
                            f"oauth_{resp.status}", parse_retry_after(resp.headers.get("Retry-After"))
                        )
                answer = orjson.loads(raw)
                token, ttl = str(answer["access_token"]), float(answer.get("expires_in", 3600))
            except TimeoutError:
                return Retry("oauth_timeout")
            except aiohttp.ClientError:
                return Retry("oauth_connect")
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                return Retry("oauth_bad_answer")
            self._token, self._expires = token, time.monotonic() + ttl
            self.tokens_fetched += 1
            return token

    async def send(self, route: Route, event: Event, attempt: int) -> Outcome:
        fetched = self.tokens_fetched
        token = await self._access_token()
        if isinstance(token, Retry | Unauthorized):
            return token
        fields = fcm_message(event.payload)
        fields["data"] = {
            str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in fields["data"].items()
        }
        body = {"message": {"token": route.target["device_token"], **fields}}
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        try:
            async with self.client().post(self.url, data=orjson.dumps(body), headers=headers) as resp:
                raw = await resp.read()
                status, retry_after = resp.status, resp.headers.get("Retry-After")
        except TimeoutError:
            return Retry("timeout")
        except aiohttp.ClientError:
            return Retry("connect")
        if status == 200:
            return Sent()
        if (shared := _status_outcome(status, retry_after)) is not None:
            return shared
        code = _v1_error_code(raw)
        if status == 404 or code == "UNREGISTERED":
            return Gone("fcm_unregistered")
        if status == 401:
            if self.tokens_fetched == fetched:  # a token held from before: expired or revoked early
                self._token = ""  # the next try fetches another
                return Retry("http_401")
            return Unauthorized("http_401")  # refused though just fetched: the account has no right
        if status == 403:
            if code == "SENDER_ID_MISMATCH":  # the token belongs to another project: this device's
                return Gone("fcm_sender_id_mismatch")
            return Unauthorized(f"fcm_{code.lower()}" if code else "http_403")
        return Refused(f"fcm_{code.lower()}" if code else f"http_{status}")


def _v1_error_code(raw: bytes) -> str:
    """The FCM error code of a v1 error answer (``details[].errorCode``, else ``error.status``)."""
    try:
        err = orjson.loads(raw)["error"]
        for d in err.get("details", ()):
            if isinstance(d, dict) and d.get("errorCode"):
                return str(d["errorCode"])
        return str(err.get("status", ""))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return ""
