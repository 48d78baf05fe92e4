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

The subscriptions are kept with the log (``Core.routes``, ``transports/connector_routes.py``), each with its
consumer's name, stored before the request is answered: every process of the log (a node's workers, a
cluster's nodes) lists, serves and deletes them, and one at a time delivers each. A registry file of an
older hubbub (``data_dir/connectors/<name>.json``) is taken into the log at start and renamed
``<name>.json.migrated``.

Concurrency contract: event loop thread only; a request that changes subscriptions holds the routes'
``changing`` lock over its checks and writes.
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
from hubbub.core.api import Core, RouteRecord
from hubbub.dialects import guble as gc
from hubbub.errors import BadChannel, HubbubError
from hubbub.log.consumers import ConsumerSpec

from .binding import Wiring
from .connector import Connector, Provider, RetryPolicy, Route
from .connector_routes import SharedRoutes, retire_file
from .fcm import FcmLegacy, FcmV1, load_service_account
from .http import request_identity

__all__ = ["DeviceConnector", "apns_connector", "fcm_connector", "old_registry"]

log = logging.getLogger("hubbub.connectors")

FIELDS = ("device_token", "user_id", "topic")


def _key(fields: dict[str, str]) -> str:
    """What makes two device subscriptions the same one (the log keeps one per key)."""
    return hashlib.sha256("\n".join(fields[f] for f in FIELDS).encode()).hexdigest()


def _fields(record: RouteRecord) -> dict[str, str] | None:
    try:
        body = json.loads(record.body)
        return {f: str(body[f]) for f in FIELDS}
    except (ValueError, KeyError, TypeError):
        return None


def old_registry(path: Path) -> dict[str, dict[str, str]]:
    """The subscriptions (consumer -> fields) of an older hubbub's registry file; empty when it has none.
    Blocking: call it on a thread."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {str(c): {f: str(e[f]) for f in FIELDS} for c, e in raw["subscriptions"].items()}


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
        *,
        auth: bool,
        poll_s: float,
        old_file: Path | None = None,
    ) -> None:
        self.name = name
        self.prefix = "/" + prefix.strip("/") + "/"
        self._node = node
        self.connector = connector
        self.routes = SharedRoutes(node, connector, self._route_of, poll_s=poll_s)
        self._auth = auth
        #: An older hubbub's registry file, taken into the log at start.
        self._old_file = old_file

    def route(self, consumer: str, fields: dict[str, str]) -> Route:
        pattern = gc.subtree_pattern(fields["topic"]).text
        return Route(consumer.removeprefix(self.name + "."), consumer, pattern, dict(fields))

    def _route_of(self, record: RouteRecord) -> Route | None:
        fields = _fields(record)
        if fields is None:
            log.warning("connector %s: subscription %s is not readable: left out", self.name, record.name)
            return None
        return self.route(f"{self.name}.{record.name}", fields)

    def _record(self, route: Route, key: str | None = None) -> RouteRecord:
        fields = {f: route.target[f] for f in FIELDS}
        return RouteRecord(self.name, route.name, key or _key(fields), json.dumps(fields, sort_keys=True))

    async def __aenter__(self) -> DeviceConnector:
        """Take an older registry file into the log, make sure every subscription's consumer exists, and
        start delivering them all (and following what other processes of the log change)."""
        async with self.routes.changing:  # (no subscription is made meanwhile)
            await self._migrate()
            await self._ensure_consumers()
        await self.routes.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.routes.__aexit__(*exc)
        await self.connector.close()

    async def _migrate(self) -> None:
        path = self._old_file
        if path is None or not await asyncio.to_thread(path.exists):
            return
        entries = await asyncio.to_thread(old_registry, path)
        for consumer, fields in entries.items():
            route = self.route(consumer, fields)
            await self._node.routes.put(self._record(route))  # (False: taken in before, or made since)
        await retire_file(path)
        log.warning(
            "connector %s: %d subscriptions taken from %s into the log", self.name, len(entries), path
        )

    async def _ensure_consumers(self) -> None:
        """Create the consumer of every recorded subscription that has none (a log the records were copied
        to); on a log no other process writes, delete the consumers of this connector that no record names
        (left by a crash between a consumer's create and its record, or a record's delete and its
        consumer's). On a shared log another process may be between the two: they are left."""
        consumers = self._node.consumers
        assert consumers is not None
        records = await self._node.routes.records(self.name)
        have = {i.spec.name for i in await consumers.consumers()}
        named = set()
        for record in records:
            route = self._route_of(record)
            if route is None:
                continue
            named.add(route.consumer)
            if route.consumer not in have:
                try:
                    await self.connector.create(route)
                except HubbubError as exc:
                    log.warning("connector %s: subscription %s not started: %s", self.name, route.name, exc)
        if not self._node.routes.shared:
            for name in have - named:
                if name.startswith(self.name + "."):
                    log.warning("connector %s: consumer %s has no subscription: deleted", self.name, name)
                    await self.connector.delete_consumer(name)

    async def retargeted(self, route: Route) -> None:
        """The provider named the device's new token (FCM's canonical id): store it (under the new
        subscription's key, or its old one when another subscription has that)."""
        async with self.routes.changing:
            old = self.routes.records.get(route.name)
            if old is None:
                return
            if not await self.routes.put(self._record(route), replace=True):
                await self.routes.put(self._record(route, old.key), replace=True)

    async def removed(self, route: Route) -> None:
        """The connector removed ``route`` (the device is unregistered): forget it."""
        async with self.routes.changing:
            await self.routes.delete(route.name)

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

    def _find(self, fields: dict[str, str]) -> str | None:
        """The record name of the subscription with exactly these fields."""
        return next((n for n, r in self.routes.records.items() if _fields(r) == fields), None)

    async def list(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        wanted = {k: v for k, v in request.query.items() if v}
        if "topic" in wanted and not wanted["topic"].startswith("/"):
            wanted["topic"] = "/" + wanted["topic"]
        await self.routes.refresh()  # as the log has them now, whichever process made them
        topics = sorted(
            e["topic"].lstrip("/")
            for e in map(_fields, self.routes.records.values())
            if e is not None and all(e.get(k) == v for k, v in wanted.items())
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
        async with self.routes.changing:
            await self.routes.read()
            changed = 0
            for name, record in list(self.routes.records.items()):
                fields = _fields(record)
                if fields is None or fields[field] != old:
                    continue
                route = self.route(f"{self.name}.{name}", {**fields, field: new})
                # Its consumer and backlog stay; the key stays when another subscription has the new one.
                if not await self.routes.put(self._record(route), replace=True):
                    await self.routes.put(self._record(route, record.key), replace=True)
                await self.connector.remove(route.name, delete=False)
                self.connector.add(route)
                changed += 1
        return _json(200, {"modified": changed})

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
        async with self.routes.changing:
            if request.method == "POST":
                return await self._subscribe(fields)
            return await self._unsubscribe(fields, topic_text)

    async def _subscribe(self, fields: dict[str, str]) -> web.Response:
        key = _key(fields)
        if self.routes.find_key(key) is not None or self._find(fields) is not None:
            return _json(200, {"error": "subscription already exists"})
        route = self.route(f"{self.name}.{key[:32]}-{secrets.token_hex(4)}", fields)
        try:
            # The consumer first: every message published once the subscription is answered is journaled.
            await self.connector.create(route)
        except HubbubError as exc:  # too many consumers, a bad topic
            return _json(400, {"error": f"subscription refused: {exc}"})
        # The record before the answer: a subscription answered survives a crash, and is every process's.
        if not await self.routes.put(self._record(route)):  # made meanwhile by another process
            await self.connector.delete_consumer(route.consumer)
            return _json(200, {"error": "subscription already exists"})
        self.connector.add(route)
        return _json(200, {"subscribed": fields["topic"]})

    async def _unsubscribe(self, fields: dict[str, str], topic_text: str) -> web.Response:
        name = self._find(fields)
        if name is None:
            await self.routes.read()  # made by another process since this one last read them
            name = self._find(fields)
        if name is None or not await self.routes.delete(name):
            return _json(404, {"error": "subscription not found"})
        await self.connector.remove(name, delete=False)
        await self.connector.delete_consumer(f"{self.name}.{name}")
        return _json(200, {"unsubscribed": topic_text})


async def fcm_connector(w: Wiring, cfg: gc.GubleConfig, auth: bool) -> DeviceConnector:
    """guble's FCM connector: FCM v1 with ``fcm_credentials_file``, else the legacy API with the key."""
    provider: Provider
    if cfg.fcm_credentials_file:
        account = await asyncio.to_thread(load_service_account, cfg.fcm_credentials_file)
        provider = FcmV1(account, cfg.fcm_endpoint, connections=cfg.fcm_workers)
    else:
        provider = FcmLegacy(str(cfg.fcm_api_key), cfg.fcm_endpoint, connections=cfg.fcm_workers)
    retry = RetryPolicy(max_retry_s=cfg.fcm_max_retry_s)
    return await _device_connector(w, "fcm", cfg.fcm_prefix, provider, cfg.fcm_workers, retry, auth)


async def apns_connector(w: Wiring, cfg: gc.GubleConfig, auth: bool) -> DeviceConnector:
    """guble's APNs connector: HTTP/2 with the client certificate, or provider tokens from the .p8 key."""
    # Imported here: the APNs client (httpx, h2) costs every ``hubbub serve`` start about 0.1 s of CPU, and
    # only a server with guble.apns on uses it.
    from .apns import PRODUCTION, SANDBOX, ApnsProvider, client_context

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
    retry = RetryPolicy(max_retry_s=cfg.apns_max_retry_s)
    return await _device_connector(w, "apns", cfg.apns_prefix, provider, cfg.apns_workers, retry, auth)


async def _device_connector(
    w: Wiring, name: str, prefix: str, provider: Provider, workers: int, retry: RetryPolicy, auth: bool
) -> DeviceConnector:
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
        retry=retry,
        hold_poll_s=w.config.cluster.poll_interval_s,
        on_removed=removed,
        on_retargeted=retargeted,
    )
    old = Path(w.config.storage.data_dir) / "connectors" / f"{name}.json"
    device = DeviceConnector(
        name, prefix, w.node, conn, auth=auth, poll_s=w.config.cluster.poll_interval_s, old_file=old
    )
    holder.append(device)
    return device
