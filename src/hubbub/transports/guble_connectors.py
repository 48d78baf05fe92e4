"""guble's device connectors (docs/connectors.md "guble's FCM connector", docs/dialects/guble.md): the REST
API guble serves under a connector's prefix (``/fcm/``), over a :class:`~.connector.Connector` whose routes
are device subscriptions, each a durable consumer of the topic's subtree.

Under the prefix:

* ``POST /{device_token}/{user_id}/{topic…}`` subscribes the device to the topic (its subtree, as a guble
  subscription): ``{"subscribed":"/topic"}``; an existing one answers ``{"error":"subscription already
  exists"}`` (200, as guble).
* ``DELETE`` the same path unsubscribes: ``{"unsubscribed":"topic"}``, or 404 ``{"error":"subscription not
  found"}``.
* ``GET /`` lists the topics (without their leading ``/``) of the subscriptions whose fields equal every
  query parameter given (``device_token``, ``user_id``, ``topic``), as a JSON array.
* ``POST /substitute/`` with ``{"field":"device_token","old_value":…,"new_value":…}`` replaces a field's
  value in every subscription that has it (a device's new token): ``{"modified":N}``. The subscription keeps
  its consumer, so nothing it had not delivered is lost.

The subscriptions are kept in ``data_dir/connectors/<name>.json``: each with its consumer's name, written
atomically (a temporary file, fsync'd, renamed over the old one) before the request is answered.

Concurrency contract: event loop thread only; file writes run on a thread, one at a time per registry.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from hubbub.auth import Identity
from hubbub.core.api import Core
from hubbub.dialects import guble as gc
from hubbub.errors import BadChannel, HubbubError
from hubbub.log.consumers import ConsumerSpec

from .apns import PRODUCTION, SANDBOX, ApnsProvider, client_context
from .binding import Wiring
from .connector import Connector, Provider, Route, write_atomically
from .fcm import FcmLegacy, FcmV1, load_service_account
from .http import request_identity

__all__ = ["DeviceConnector", "DeviceRegistry", "apns_connector", "fcm_connector"]

log = logging.getLogger("hubbub.connectors")

FIELDS = ("device_token", "user_id", "topic")


class DeviceRegistry:
    """One connector's device subscriptions (``consumer`` → fields), kept in a JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, str]] = {}
        self._writing = asyncio.Lock()

    def load(self) -> None:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        self.entries = {str(c): {f: str(e[f]) for f in FIELDS} for c, e in raw["subscriptions"].items()}

    async def save(self) -> None:
        body = json.dumps({"format": 1, "subscriptions": self.entries}, sort_keys=True).encode()
        async with self._writing:
            await asyncio.to_thread(write_atomically, self.path, body)

    def find(self, fields: dict[str, str]) -> str | None:
        """The consumer of the subscription with exactly these fields."""
        return next((c for c, e in self.entries.items() if e == fields), None)


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body) + b"\n", content_type="application/json")


class DeviceConnector:
    """guble's REST API of one device connector (module docstring) and its subscriptions' delivery."""

    def __init__(
        self,
        name: str,
        prefix: str,
        node: Core,
        connector: Connector,
        registry: DeviceRegistry,
        *,
        auth: bool,
    ) -> None:
        self.name = name
        self.prefix = "/" + prefix.strip("/") + "/"
        self._node = node
        self.connector = connector
        self.registry = registry
        self._auth = auth

    def route(self, consumer: str, fields: dict[str, str]) -> Route:
        pattern = gc.subtree_pattern(fields["topic"]).text
        return Route(consumer.removeprefix(self.name + "."), consumer, pattern, dict(fields))

    async def __aenter__(self) -> DeviceConnector:
        """Start delivering every stored subscription (the registry is loaded by the binding)."""
        running = {r.consumer for r in self.connector.routes()}  # (subscribed since the routes opened)
        for consumer, fields in list(self.registry.entries.items()):
            if consumer not in running:
                self.connector.add(self.route(consumer, fields))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.connector.close()

    async def retargeted(self, route: Route) -> None:
        """The provider named the device's new token (FCM's canonical id): store it."""
        if route.consumer in self.registry.entries:
            self.registry.entries[route.consumer] = {f: route.target[f] for f in FIELDS}
            await self.registry.save()

    async def removed(self, route: Route) -> None:
        """The connector removed ``route`` (the device is unregistered): forget it."""
        if self.registry.entries.pop(route.consumer, None) is not None:
            await self.registry.save()

    def install(self, app: web.Application) -> None:
        app.router.add_get(self.prefix, self.list)
        app.router.add_post(self.prefix + "substitute/", self.substitute)
        app.router.add_route("*", self.prefix + "{token}/{user}/{topic:.*}", self.device)

    # -- requests ------------------------------------------------------------------------------------------

    def _identity(self, request: web.Request) -> Identity | None:
        return request_identity(self._node, request, "guble", self._auth) if self._auth else None

    def _check_admin(self, request: web.Request) -> None:
        if self._auth:
            self._node.access.check_admin(self._identity(request), "guble")

    async def list(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        wanted = {k: v for k, v in request.query.items() if v}
        if "topic" in wanted and not wanted["topic"].startswith("/"):
            wanted["topic"] = "/" + wanted["topic"]
        topics = sorted(
            e["topic"].lstrip("/")
            for e in self.registry.entries.values()
            if all(e.get(k) == v for k, v in wanted.items())
        )
        return _json(200, topics)

    async def substitute(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        try:
            body = orjson.loads(await request.read())
            field, old, new = str(body["field"]), str(body["old_value"]), str(body["new_value"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _json(400, {"error": 'expected {"field","old_value","new_value"}'})
        if field not in FIELDS or field == "topic" or not old or not new:
            return _json(400, {"error": "invalid substitution"})
        changed = [c for c, e in self.registry.entries.items() if e[field] == old]
        for consumer in changed:
            fields = {**self.registry.entries[consumer], field: new}
            self.registry.entries[consumer] = fields
            route = self.route(consumer, fields)
            await self.connector.remove(route.name, delete=False)  # its consumer and backlog stay
            self.connector.add(route)
        if changed:
            await self.registry.save()
        return _json(200, {"modified": len(changed)})

    async def device(self, request: web.Request) -> web.Response:
        if request.method not in ("POST", "DELETE"):
            return _json(405, {"error": "method not allowed"})
        m = request.match_info
        topic_text = m["topic"].strip("/")
        if not m["token"] or not m["user"] or not topic_text:
            return _json(400, {"error": "invalid parameters in request"})
        try:
            topic = gc.subtree_pattern("/" + topic_text)  # checks the path
        except BadChannel:
            return _json(400, {"error": "invalid topic"})
        fields = {"device_token": m["token"], "user_id": m["user"], "topic": "/" + topic_text}
        if self._auth:
            spec = ConsumerSpec(name=f"{self.name}.check", pattern=topic.text)
            self._node.access.check_consumer(self._identity(request), spec, "guble")
        if request.method == "POST":
            return await self._subscribe(fields)
        return await self._unsubscribe(fields, topic_text)

    async def _subscribe(self, fields: dict[str, str]) -> web.Response:
        if self.registry.find(fields) is not None:
            return _json(200, {"error": "subscription already exists"})
        key = hashlib.sha256("\n".join(fields[f] for f in FIELDS).encode()).hexdigest()[:32]
        consumer = f"{self.name}.{key}-{secrets.token_hex(4)}"
        route = self.route(consumer, fields)
        # Claimed before any wait, so that the same request twice at once makes one subscription.
        self.registry.entries[consumer] = fields
        try:
            # The consumer first: every message published once the subscription is answered is journaled.
            await self.connector.create(route)
            await self.registry.save()  # before the answer: a subscription answered survives a crash
        except HubbubError as exc:  # too many consumers, a bad topic
            del self.registry.entries[consumer]
            return _json(400, {"error": f"subscription refused: {exc}"})
        except BaseException:
            self.registry.entries.pop(consumer, None)
            raise
        self.connector.add(route)
        return _json(200, {"subscribed": fields["topic"]})

    async def _unsubscribe(self, fields: dict[str, str], topic_text: str) -> web.Response:
        consumer = self.registry.find(fields)
        if consumer is None:
            return _json(404, {"error": "subscription not found"})
        del self.registry.entries[consumer]
        await self.registry.save()
        await self.connector.remove(consumer.removeprefix(self.name + "."), delete=True)
        return _json(200, {"unsubscribed": topic_text})


async def fcm_connector(w: Wiring, cfg: gc.GubleConfig, auth: bool) -> DeviceConnector:
    """guble's FCM connector: FCM v1 with ``fcm_credentials_file``, else the legacy API with the key."""
    provider: Provider
    if cfg.fcm_credentials_file:
        account = await asyncio.to_thread(load_service_account, cfg.fcm_credentials_file)
        provider = FcmV1(account, cfg.fcm_endpoint, connections=cfg.fcm_workers)
    else:
        provider = FcmLegacy(str(cfg.fcm_api_key), cfg.fcm_endpoint, connections=cfg.fcm_workers)
    return await _device_connector(w, "fcm", cfg.fcm_prefix, provider, cfg.fcm_workers, auth)


async def apns_connector(w: Wiring, cfg: gc.GubleConfig, auth: bool) -> DeviceConnector:
    """guble's APNs connector: HTTP/2 with the client certificate, or provider tokens from the .p8 key."""
    context = await asyncio.to_thread(
        client_context, cfg.apns_cert_file, str(cfg.apns_cert_password), cfg.apns_ca_file
    )
    key = await asyncio.to_thread(Path(cfg.apns_key_file).read_text) if cfg.apns_key_file else ""
    endpoint = cfg.apns_endpoint or (PRODUCTION if cfg.apns_production else SANDBOX)
    provider = ApnsProvider(
        endpoint,
        cfg.apns_app_topic,
        context,
        key_pem=key,
        key_id=cfg.apns_key_id,
        team_id=cfg.apns_team_id,
        connections=cfg.apns_workers,
    )
    return await _device_connector(w, "apns", cfg.apns_prefix, provider, cfg.apns_workers, auth)


async def _device_connector(
    w: Wiring, name: str, prefix: str, provider: Provider, workers: int, auth: bool
) -> DeviceConnector:
    registry = DeviceRegistry(Path(w.config.storage.data_dir) / "connectors" / f"{name}.json")
    await asyncio.to_thread(registry.load)
    holder: list[DeviceConnector] = []

    async def removed(route: Route) -> None:
        await holder[0].removed(route)

    async def retargeted(route: Route) -> None:
        await holder[0].retargeted(route)

    conn = Connector(
        name,
        w.node,
        w.consumers,
        provider,
        workers=workers,
        hold_poll_s=w.config.cluster.poll_interval_s,
        on_removed=removed,
        on_retargeted=retargeted,
    )
    device = DeviceConnector(name, prefix, w.node, conn, registry, auth=auth)
    holder.append(device)
    return device
