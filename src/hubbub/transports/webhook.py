"""Webhooks (docs/connectors.md "Webhooks"): every event matching a hook's pattern is POSTed to its URL as
JSON, signed with HMAC-SHA256 over the timestamp and the body, through a :class:`~.connector.Connector`
(durable, at least once, in order per hook, retried, dead-lettered).

The request::

    POST <url>
    Content-Type: application/json
    X-Hubbub-Timestamp: 1795313749
    X-Hubbub-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>
    X-Hubbub-Delivery: <epoch>:<seq>
    X-Hubbub-Attempt: 0

    {"hook":"orders","channel":"/orders/1","seq":7,"epoch":"k3j2a9x1","time":"1795313749574424198",
     "headers":{"k":"v"},"content_type":"text/plain; charset=utf-8","payload":"…","encoding":"utf-8"}

``encoding`` is ``utf-8`` when the payload is valid UTF-8 (``payload`` is then the text), else ``base64``.
The answer decides: 2xx delivered; 408, 429 and 5xx retried (``Retry-After`` honoured); 410 removes the hook's
subscription until the next start; any other status is a permanent refusal (dead letter); no answer within
``webhooks.timeout_s`` or a failed connection is retried.

Concurrency contract: the provider is used on the event loop thread only, by its connector.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import time
from collections.abc import Mapping
from typing import Any

import orjson

from hubbub.config import WebhooksConfig
from hubbub.events import Event

from .connector import Gone, Outcome, Refused, Retry, RetryPolicy, Route, Sent, parse_retry_after
from .webhook_http import BadResponse, HttpClient

#: The requests' ``User-Agent``.
USER_AGENT = "hubbub-webhooks"

__all__ = ["WebhookProvider", "render_event", "retry_policy", "route_of", "routes", "sign"]

#: The consumer name of hook ``NAME`` is ``webhook.NAME``.
CONSUMER_PREFIX = "webhook."


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Hubbub-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of ``<timestamp>.<body>``."""
    return "sha256=" + hmac.digest(secret.encode(), timestamp.encode() + b"." + body, "sha256").hex()


def render_event(hook: str, event: Event) -> bytes:
    """The JSON body of one event's request (module docstring)."""
    try:
        payload, encoding = event.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(event.payload).decode("ascii"), "base64"
    return orjson.dumps(
        {
            "hook": hook,
            "channel": event.channel,
            "seq": event.seq,
            "epoch": event.epoch,
            "time": str(event.time_ns),
            "headers": event.user_headers,
            "tags": list(event.tags),
            "content_type": event.content_type,
            "payload": payload,
            "encoding": encoding,
        }
    )


def classify(status: int, retry_after: str | None) -> Outcome:
    """A receiver's answer as an outcome (module docstring)."""
    if 200 <= status < 300:
        return Sent()
    if status in (408, 429) or status >= 500:
        return Retry(f"http_{status}", parse_retry_after(retry_after))
    if status == 410:
        return Gone("http_410")
    return Refused(f"http_{status}")


def route_of(name: str, hook: Mapping[str, Any]) -> Route:
    """A hook's definition (checked: ``hubbub.config.check_webhook``) as a connector route."""
    target = {"url": str(hook["url"]), "secret": str(hook.get("secret", ""))}
    tags = tuple(sorted(set(hook.get("tags", ()))))
    return Route(name, CONSUMER_PREFIX + name, str(hook["pattern"]), target, tags)


def routes(cfg: WebhooksConfig) -> list[Route]:
    """The configured hooks as connector routes."""
    return [route_of(name, hook) for name, hook in cfg.hooks.items()]


def retry_policy(cfg: WebhooksConfig) -> RetryPolicy:
    return RetryPolicy(
        cfg.retry_base_s,
        cfg.retry_max_s,
        cfg.retry_after_max_s,
        cfg.max_attempts,
        max_retry_s=cfg.max_retry_s,
        retry_after_min_s=cfg.retry_after_min_s,
    )


class WebhookProvider:
    """POSTs events through one :class:`~.webhook_http.HttpClient` (keep-alive connections, at most
    ``connections`` idle per receiver: the connector's ``workers`` bound the requests in flight)."""

    def __init__(self, timeout_s: float = 10.0, connections: int = 8) -> None:
        self._timeout_s = timeout_s
        self._http = HttpClient(connections)

    async def send(self, route: Route, event: Event, attempt: int) -> Outcome:
        body = render_event(route.name, event)
        ts = str(int(time.time()))
        headers = {
            "User-Agent": USER_AGENT,
            "Content-Type": "application/json",
            "X-Hubbub-Timestamp": ts,
            "X-Hubbub-Delivery": f"{event.epoch}:{event.seq}",
            "X-Hubbub-Attempt": str(attempt),
        }
        if secret := route.target.get("secret", ""):
            headers["X-Hubbub-Signature"] = sign(secret, ts, body)
        try:
            async with asyncio.timeout(self._timeout_s):
                resp = await self._http.post(route.target["url"], headers, body)
        except TimeoutError:
            return Retry("timeout")
        except OSError:  # refused, reset, closed before an answer, TLS
            return Retry("connect")
        except (BadResponse, ValueError):
            return Retry("http_error")
        return classify(resp.status, resp.retry_after)

    async def aclose(self) -> None:
        self._http.close()
        await asyncio.sleep(0)  # the transports close on the next loop iteration
