"""Webhooks added and removed at run time (docs/connectors.md "Webhooks over REST"), with the admin
permission (``/api/v1/trim``'s):

* ``GET /api/v1/webhooks``: every hook, from the file and from this API, without its secret:
  ``{"webhooks":[{"name","url","pattern","tags","signed","source":"config"|"api"}]}``.
* ``PUT /api/v1/webhooks/<name>`` with ``{"url","pattern","secret","tags"}``: creates the hook (201) or
  replaces it (200; a changed pattern or tags starts its backlog anew, as in the file); 409 for a hook of
  the configuration file, 400 for a bad definition.
* ``DELETE /api/v1/webhooks/<name>``: removes the hook with its backlog (200 ``{"deleted":name}``), 404
  unknown, 409 for a hook of the file.

The API's hooks are kept with the log (``Core.routes``, ``transports/connector_routes.py``), stored before
the answer: every process of the log (a node's workers, a cluster's nodes) lists and runs them, and one at a
time delivers each. A hook of the file always wins over one of the API with its name. A
``data_dir/connectors/webhooks.json`` of an older hubbub is taken into the log at start and renamed
``webhooks.json.migrated``.

Concurrency contract: event loop thread only; a request that changes hooks holds the routes' ``changing``
lock over its checks and writes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from hubbub.config import ConfigError, check_webhook
from hubbub.core.api import Core, RouteRecord
from hubbub.errors import HubbubError

from .connector import Connector, Route
from .connector_routes import SharedRoutes, retire_file
from .http import request_identity
from .webhook import route_of

__all__ = ["WebhookAdmin"]

log = logging.getLogger("hubbub.connectors")


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body) + b"\n", content_type="application/json")


def _record(name: str, hook: Mapping[str, Any]) -> RouteRecord:
    return RouteRecord("webhook", name, name, json.dumps(hook, sort_keys=True))


def _hook(record: RouteRecord) -> dict[str, Any] | None:
    """A record's hook, checked (None: not one, logged)."""
    try:
        hook = json.loads(record.body)
        check_webhook(f"webhook {record.name}", record.name, hook)
    except (ValueError, ConfigError) as exc:
        log.warning("webhook %s left out: %s", record.name, exc)
        return None
    return dict(hook)


class WebhookAdmin:
    """The API's hooks and the routes that change them, over the webhook connector's :class:`SharedRoutes`."""

    def __init__(
        self,
        node: Core,
        connector: Connector,
        configured: Mapping[str, Mapping[str, Any]],
        *,
        poll_s: float,
        old_file: Path | None = None,
    ) -> None:
        self._node = node
        self.connector = connector
        self._configured = configured
        fixed = {name: route_of(name, hook) for name, hook in configured.items()}
        self.routes = SharedRoutes(node, connector, self._route_of, poll_s=poll_s, fixed=fixed)
        self._old_file = old_file

    def _route_of(self, record: RouteRecord) -> Route | None:
        hook = _hook(record)
        return None if hook is None else route_of(record.name, hook)

    @property
    def hooks(self) -> dict[str, dict[str, Any]]:
        """The API's hooks as last read, by name (a file's hook of the same name left out)."""
        out = {}
        for name, record in self.routes.records.items():
            if name not in self._configured and (hook := _hook(record)) is not None:
                out[name] = hook
        return out

    async def migrate(self) -> None:
        """Take an older hubbub's ``webhooks.json`` into the log (its hooks not already there)."""
        path = self._old_file
        if path is None or not await asyncio.to_thread(path.exists):
            return
        stored = json.loads(await asyncio.to_thread(path.read_text, encoding="utf-8"))["webhooks"]
        for name, hook in stored.items():
            await self._node.routes.put(_record(name, hook))
        await retire_file(path)
        log.warning("webhooks: %d hooks taken from %s into the log", len(stored), path)

    def install(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/webhooks", self.list)
        app.router.add_put("/api/v1/webhooks/{name}", self.put)
        app.router.add_delete("/api/v1/webhooks/{name}", self.delete)

    def _check_admin(self, request: web.Request) -> None:
        self._node.access.check_admin(request_identity(self._node, request, "native"), "native")

    async def list(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        await self.routes.refresh()  # as the log has them now, whichever process made them
        out = [
            {
                "name": name,
                "url": hook["url"],
                "pattern": hook["pattern"],
                "tags": sorted(set(hook.get("tags", ()))),
                "signed": bool(hook.get("secret")),
                "source": source,
            }
            for source, hooks in (("config", self._configured), ("api", self.hooks))
            for name, hook in sorted(hooks.items())
        ]
        return _json(200, {"webhooks": out})

    async def put(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        name = request.match_info["name"]
        if name in self._configured:
            return _json(409, {"error": f"{name} is defined in the configuration file"})
        try:
            hook = orjson.loads(await request.read())
            check_webhook(name, name, hook)
        except orjson.JSONDecodeError:
            return _json(400, {"error": "expected a JSON object with url and pattern"})
        except ConfigError as exc:
            return _json(400, {"error": str(exc)})
        route = route_of(name, hook)
        async with self.routes.changing:
            await self.routes.read()
            old = self.hooks.get(name)
            if old is not None:
                was = route_of(name, old)
                # A new pattern or new tags: a new consumer (its backlog was journaled for the old ones).
                await self.connector.remove(name, delete=False)
                if (was.pattern, was.tags) != (route.pattern, route.tags):
                    await self.connector.delete_consumer(was.consumer)
            try:
                await self.connector.create(route)
            except HubbubError as exc:
                if old is not None:  # (the old one runs on: nothing was changed)
                    self.connector.add(route_of(name, old))
                return _json(400, {"error": f"{name}: {exc}"})
            # Before the answer: a hook answered survives a crash, and is every process's.
            await self.routes.put(_record(name, hook), replace=True)
            self.connector.add(route)
        return _json(200 if old is not None else 201, {"name": name, "created": old is None})

    async def delete(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        name = request.match_info["name"]
        if name in self._configured:
            return _json(409, {"error": f"{name} is defined in the configuration file"})
        async with self.routes.changing:
            await self.routes.read()
            hook = self.hooks.get(name)
            if hook is None or not await self.routes.delete(name):
                return _json(404, {"error": f"{name}: no such webhook"})
            await self.connector.remove(name, delete=False)
            await self.connector.delete_consumer(route_of(name, hook).consumer)
        return _json(200, {"deleted": name})
