"""Webhooks added and removed at run time (docs/connectors.md "Webhooks over REST"), with the admin
permission (``/api/v1/trim``'s):

* ``GET /api/v1/webhooks``: every hook, from the file and from this API, without its secret:
  ``{"webhooks":[{"name","url","pattern","tags","signed","source":"config"|"api"}]}``.
* ``PUT /api/v1/webhooks/<name>`` with ``{"url","pattern","secret","tags"}``: creates the hook (201) or
  replaces it (200; a changed pattern or tags starts its backlog anew, as in the file); 409 for a hook of
  the configuration file, 400 for a bad definition.
* ``DELETE /api/v1/webhooks/<name>``: removes the hook with its backlog (200 ``{"deleted":name}``), 404
  unknown, 409 for a hook of the file.

The API's hooks are kept in ``data_dir/connectors/webhooks.json``, written atomically before the answer,
and started again with the server. A hook of the file always wins over one of the API with its name.

Concurrency contract: event loop thread only; the file is written on a thread, one write at a time.
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
from hubbub.core.api import Core
from hubbub.errors import HubbubError

from .connector import Connector, write_atomically
from .http import request_identity
from .webhook import route_of

__all__ = ["WebhookAdmin"]

log = logging.getLogger("hubbub.connectors")


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body) + b"\n", content_type="application/json")


class WebhookAdmin:
    """The API's hooks (name → definition) and the routes that change them."""

    def __init__(self, node: Core, path: Path, configured: Mapping[str, Mapping[str, Any]]) -> None:
        self._node = node
        self.path = path
        self._configured = configured
        self.hooks: dict[str, dict[str, Any]] = {}
        self._writing = asyncio.Lock()
        self.connector: Connector | None = None

    def load(self) -> None:
        """Read the stored hooks (blocking: at start). One the file defines too, or no longer valid, is
        left out (logged)."""
        try:
            stored = json.loads(self.path.read_text(encoding="utf-8"))["webhooks"]
        except FileNotFoundError:
            return
        for name, hook in stored.items():
            if name in self._configured:
                log.warning("webhook %s: defined in the configuration too, which wins", name)
                continue
            try:
                check_webhook(f"{self.path}: {name}", name, hook)
            except ConfigError as exc:
                log.warning("webhook %s left out: %s", name, exc)
                continue
            self.hooks[name] = hook

    async def _save(self) -> None:
        body = json.dumps({"format": 1, "webhooks": self.hooks}, sort_keys=True).encode()
        async with self._writing:
            await asyncio.to_thread(write_atomically, self.path, body)

    def install(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/webhooks", self.list)
        app.router.add_put("/api/v1/webhooks/{name}", self.put)
        app.router.add_delete("/api/v1/webhooks/{name}", self.delete)

    def _check_admin(self, request: web.Request) -> None:
        self._node.access.check_admin(request_identity(self._node, request, "native"), "native")

    async def list(self, request: web.Request) -> web.Response:
        self._check_admin(request)
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
        assert self.connector is not None
        route = route_of(name, hook)
        old = self.hooks.get(name)
        if old is not None:
            was = route_of(name, old)
            # A new pattern or new tags: a new consumer (its backlog was journaled for the old ones).
            await self.connector.remove(name, delete=(was.pattern, was.tags) != (route.pattern, route.tags))
        try:
            await self.connector.create(route)
        except HubbubError as exc:
            if old is not None:  # (the old one runs on: nothing was changed)
                self.connector.add(route_of(name, old))
            return _json(400, {"error": f"{name}: {exc}"})
        self.hooks[name] = hook
        await self._save()  # before the answer: a hook answered survives a crash
        self.connector.add(route)
        return _json(200 if old is not None else 201, {"name": name, "created": old is None})

    async def delete(self, request: web.Request) -> web.Response:
        self._check_admin(request)
        name = request.match_info["name"]
        if name in self._configured:
            return _json(409, {"error": f"{name} is defined in the configuration file"})
        if name not in self.hooks:
            return _json(404, {"error": f"{name}: no such webhook"})
        del self.hooks[name]
        await self._save()
        assert self.connector is not None
        await self.connector.remove(name, delete=True)
        return _json(200, {"deleted": name})
