"""The admin API's durable consumers (docs/operations.md "Admin API"): ``GET /api/v1/admin/consumers``,
``DELETE /api/v1/admin/consumers/<name>`` and ``POST /api/v1/admin/consumers/<name>/reset``, each for an
admin identity (the check is :class:`~hubbub.transports.admin_api.AdminApi`'s, handed over as ``admin``);
and the helpers every admin route shares (JSON answers, page sizes).

Concurrency contract: event loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import orjson
from aiohttp import web

from hubbub.auth import Identity
from hubbub.core.api import Core
from hubbub.errors import BadRequest

__all__ = ["PAGE_MAX", "ConsumerAdmin", "json_response", "page_limit"]

#: The most rows one page of a listing returns.
PAGE_MAX: Final = 500


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body) + b"\n", content_type="application/json")


def page_limit(request: web.Request, default: int = 100) -> int:
    """The request's ``limit`` (default ``default``, at most :data:`PAGE_MAX`); ``BadRequest`` below 1."""
    v = request.query.get("limit", "")
    try:
        n = int(v) if v else default
    except ValueError:
        raise BadRequest("limit must be an integer") from None
    if n < 1:
        raise BadRequest("limit must be at least 1")
    return min(n, PAGE_MAX)


class ConsumerAdmin:
    """The consumers' routes; ``admin(request)`` is the request's identity, checked to be an admin's."""

    def __init__(self, node: Core, admin: Callable[[web.Request], Identity]) -> None:
        self._node = node
        self._admin = admin

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/api/v1/admin/consumers", self.consumers)
        r.add_delete("/api/v1/admin/consumers/{name}", self.delete_consumer)
        r.add_post("/api/v1/admin/consumers/{name}/reset", self.reset_consumer)

    # -- consumers --------------------------------------------------------------------------------------

    async def consumers(self, request: web.Request) -> web.Response:
        self._admin(request)
        svc = self._node.consumers
        if svc is None:
            return json_response({"consumers": [], "next": None})
        after = request.query.get("after", "")
        limit = page_limit(request)
        # The store's backlogs (one read of every consumer's count: at most limits.max_consumers).
        stored = {i.spec.name: i for i in await svc.consumers()}
        names = sorted(n for n in stored if n > after)
        page = names[:limit]
        out = []
        for name in page:
            info = stored[name]
            f = svc.metrics.figures(name)
            spec = info.spec
            out.append(
                {
                    "name": name,
                    "pattern": spec.pattern,
                    "syntax": spec.syntax,
                    "tags": list(spec.tags),
                    "shared": spec.shared,
                    "owner": spec.owner,
                    "created_ns": str(info.created_ns),
                    "backlog": info.pending,
                    "in_flight": f.outstanding if f else 0,
                    "openers": f.openers if f else 0,
                    "acked": f.acked if f else 0,
                    "redelivered": f.redelivered if f else 0,
                    "last_ack_ns": str(f.last_ack_ns) if f else "0",
                    "oldest_unacked_s": f.oldest_unacked_s if f else 0.0,
                }
            )
        return json_response({"consumers": out, "next": page[-1] if len(names) > limit else None})

    async def delete_consumer(self, request: web.Request) -> web.Response:
        ident = self._admin(request)
        name = request.match_info["name"]
        svc = self._node.consumers
        if svc is None or not await svc.delete(name, identity=ident, dialect="native"):
            return json_response({"error": f"{name}: no such consumer"}, 404)
        return json_response({"deleted": name})

    async def reset_consumer(self, request: web.Request) -> web.Response:
        """Start the consumer anew from now: deleted (its backlog and batches in flight with it, its openers
        told ``deleted``) and created again with its definition, for its owner, who keeps it (the admin's
        authority creates it: the owner's own grants are not asked again)."""
        ident = self._admin(request)
        name = request.match_info["name"]
        svc = self._node.consumers
        info = None if svc is None else await svc.find(name)
        if svc is None or info is None or not await svc.delete(name, identity=ident, dialect="native"):
            return json_response({"error": f"{name}: no such consumer"}, 404)
        owner = Identity(info.spec.owner, admin=True, via="static")
        again, _ = await svc.create(info.spec, identity=owner, dialect="native")
        return json_response({"reset": name, "backlog": again.pending})
