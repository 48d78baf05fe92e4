"""guble's SMS gateway (docs/connectors.md "guble's SMS gateway"): every message published on
``guble.sms_topic`` (``/sms``, and the channels below it) is a text message to send through Vonage (Nexmo),
pushed by a :class:`~.connector.Connector` over one durable consumer (``sms.gateway``): at least once, in
commit order, retried, dead-lettered.

A message's body is guble's: ``{"to":"<number>","from":"<sender>","text":"<text>"}``. hubbub sends
``{"api_key","api_secret","to","from","text"}`` as JSON to the SMS API and reads its answer
``{"message-count":"1","messages":[{"status":"0",…}]}``: status 0 is sent, 1 (throttled) and 5 (internal
error) are retried, 4 (bad credentials: every message waits for an operator) is retried, any other is a
permanent refusal (dead letter). A body that is not such an object is refused (dead letter) without a request.

Concurrency contract: event loop thread only.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from hubbub.core.api import ConsumerService, Core
from hubbub.dialects import guble as gc
from hubbub.events import Event

from .connector import (
    CONNECTOR_IDENTITY,
    DIALECT,
    Connector,
    Outcome,
    Refused,
    Retry,
    RetryPolicy,
    Route,
    Sent,
    Unauthorized,
    parse_retry_after,
)

__all__ = ["VONAGE_SMS", "SmsGateway", "VonageSms"]

VONAGE_SMS = "https://rest.nexmo.com/sms/json"
#: Vonage statuses tried again: throttled, internal error (invalid credentials, "4", pause the gateway).
RETRIED = frozenset({"1", "5"})

log = logging.getLogger("hubbub.connectors")


class VonageSms:
    """The Vonage (Nexmo) SMS API, with one pooled aiohttp session."""

    def __init__(self, api_key: str, api_secret: str, endpoint: str = "", timeout_s: float = 10.0) -> None:
        self._key = api_key
        self._secret = api_secret
        self.endpoint = endpoint or VONAGE_SMS
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def send(self, route: Route, event: Event, attempt: int) -> Outcome:
        try:
            sms = orjson.loads(event.payload)
        except orjson.JSONDecodeError:
            sms = None
        if not isinstance(sms, dict) or not all(
            isinstance(sms.get(k), str) and sms[k] for k in ("to", "text")
        ):
            return Refused("sms_bad_message")
        body = {"api_key": self._key, "api_secret": self._secret, "to": sms["to"], "text": sms["text"]}
        if isinstance(sms.get("from"), str):
            body["from"] = sms["from"]
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.post(
                self.endpoint, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
            ) as resp:
                raw = await resp.read()
                if resp.status == 429 or resp.status >= 500:
                    return Retry(f"http_{resp.status}", parse_retry_after(resp.headers.get("Retry-After")))
                if resp.status != 200:
                    return Refused(f"http_{resp.status}")
        except TimeoutError:
            return Retry("timeout")
        except aiohttp.ClientError:
            return Retry("connect")
        try:
            answer = orjson.loads(raw)
            statuses = [str(m["status"]) for m in answer["messages"]]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return Retry("sms_bad_answer")
        failed = next((s for s in statuses if s != "0"), None)
        if not statuses:
            return Retry("sms_none_sent")
        if failed is None:
            return Sent()
        if failed == "4":  # the API key or secret refused: every message waits, the connector paused
            return Unauthorized("sms_status_4")
        return Retry(f"sms_status_{failed}") if failed in RETRIED else Refused(f"sms_status_{failed}")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await asyncio.sleep(0)  # aiohttp closes its transports on the next loop iteration


class SmsGateway:
    """The gateway's one subscription (``sms.gateway`` over the topic's subtree), started with the
    listeners and stopped first (a guble binding's link)."""

    def __init__(
        self, node: Core, consumers: ConsumerService, cfg: gc.GubleConfig, hold_poll_s: float
    ) -> None:
        provider = VonageSms(str(cfg.sms_api_key), str(cfg.sms_api_secret), cfg.sms_endpoint)
        retry = RetryPolicy(max_retry_s=cfg.sms_max_retry_s)
        self.connector = Connector(
            "sms", node, consumers, provider, workers=1, retry=retry, hold_poll_s=hold_poll_s
        )
        self.route = Route("gateway", "sms.gateway", gc.subtree_pattern(cfg.sms_topic).text, {})

    async def prepare(self, consumers: ConsumerService) -> None:
        """Create the gateway's consumer before any listener opens, so that every message from then on is
        journaled; one left with another topic (``guble.sms_topic`` changed) is replaced, its backlog
        dropped (logged)."""
        info = await consumers.find(self.route.consumer)
        if info is not None and info.spec.pattern != self.route.pattern:
            log.warning(
                "sms: the topic changed from %s, its %d unsent messages dropped",
                info.spec.pattern,
                info.pending,
            )
            await consumers.delete(self.route.consumer, identity=CONNECTOR_IDENTITY, dialect=DIALECT)
        await self.connector.create(self.route)

    async def __aenter__(self) -> SmsGateway:
        self.connector.add(self.route)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.connector.close()
