"""The admin API's connections (docs/operations.md "Admin API"): ``GET /api/v1/admin/connections`` and
``DELETE /api/v1/admin/connections/<id>``, each for an admin identity (the check is
:class:`~hubbub.transports.admin_api.AdminApi`'s, handed over as ``admin``).

On a node of several worker processes (``serve --workers N``) both are the node's, whichever worker the
kernel gave the admin's HTTP connection: a listing asks every other worker for its page of connections
(a question through the node's notices, ``Core.notices``: :data:`LIST_TOPIC`, one round trip through the
parent) and merges the pages in id order; a disconnect of an id this worker does not hold asks the others
to close it (:data:`CLOSE_TOPIC`). Session ids are random 64-bit values, unique across the workers. A worker
that does not answer within the question's wait (a second) is left out of that answer. Nothing is asked on
a single process, nor on a cluster's node (its notices know no peers: each member lists its own).

Concurrency contract: event loop thread only; the other workers' answers are computed on their loops.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Final

import msgpack
from aiohttp import web

from hubbub.auth import Identity
from hubbub.core.api import Core, Disconnect, Session

from .admin_consumers import json_response, page_limit

__all__ = ["CLOSE_TOPIC", "LIST_TOPIC", "ConnectionAdmin"]

#: The question for a worker's page of connections: ``[after, dialect, text, limit]``; its answer
#: ``[rows, total]`` (the first ``limit + 1`` rows after ``after`` that match, and its open connections).
LIST_TOPIC: Final = "admin.connections"
#: The question to close connection ``id`` (the data: the id); the answer ``[id, dialect]`` from the worker
#: that held it, nil from the others.
CLOSE_TOPIC: Final = "admin.disconnect"


class ConnectionAdmin:
    """The routes of the module docstring, and this worker's answers to the other workers' questions."""

    def __init__(self, node: Core, admin: Callable[[web.Request], Identity]) -> None:
        self.node = node
        self._admin = admin
        node.notices.answer(LIST_TOPIC, self._answer_page)
        node.notices.answer(CLOSE_TOPIC, self._answer_close)

    def install(self, app: web.Application) -> None:
        app.router.add_get("/api/v1/admin/connections", self.connections)
        app.router.add_delete("/api/v1/admin/connections/{id}", self.disconnect)

    # -- listing ----------------------------------------------------------------------------------------

    def _page(self, after: str, dialect: str, text: str, limit: int) -> list[dict[str, Any]]:
        """This worker's first ``limit + 1`` connections after ``after`` (in id order) that match."""
        picked = heapq.nsmallest(
            limit + 1,
            (
                s
                for s in self.node.sessions
                if s.id > after
                and (not dialect or s.dialect == dialect)
                and (not text or text in s.id or text in s.user or text in s.peer)
            ),
            key=lambda s: s.id,
        )
        return [self._connection(s) for s in picked]

    def _answer_page(self, data: bytes) -> bytes:
        after, dialect, text, limit = msgpack.unpackb(data)
        rows = self._page(str(after), str(dialect), str(text), int(limit))
        return bytes(msgpack.packb([rows, len(self.node.sessions)]))

    async def connections(self, request: web.Request) -> web.Response:
        self._admin(request)
        q = request.query
        after, dialect, text = q.get("after", ""), q.get("dialect", ""), q.get("q", "")
        limit = page_limit(request)
        rows = self._page(after, dialect, text, limit)
        total = len(self.node.sessions)
        question = msgpack.packb([after, dialect, text, limit])
        for answer in await self.node.notices.ask(LIST_TOPIC, question):
            try:
                theirs, their_total = msgpack.unpackb(answer)
                rows += [dict(r) for r in theirs]
                total += int(their_total)
            except (ValueError, TypeError, msgpack.UnpackException):
                continue  # not an answer of ours
        rows.sort(key=lambda r: str(r["id"]))
        page = rows[:limit]
        return json_response(
            {
                "connections": page,
                "next": page[-1]["id"] if len(rows) > limit else None,
                "total": total,
            }
        )

    def _connection(self, s: Session) -> dict[str, Any]:
        subs = self.node.subscriptions(s)
        return {
            "id": s.id,
            "dialect": s.dialect,
            "peer": s.peer,
            "user": s.user,
            "opened_ns": str(s.opened_ns),
            "subscriptions": len(subs),
            "patterns": sorted({sub.pattern.text for sub in subs})[:20],
            "queued": s.queued,
            "delivered": s.stats.delivered,
            "dropped": s.stats.dropped,
            "worker": self.node.notices.me or None,
        }

    # -- disconnect -------------------------------------------------------------------------------------

    def _close(self, sid: str) -> str | None:
        """Close connection ``sid`` if this worker holds it (its dialect then; None otherwise)."""
        sess = self.node.session_by_id(sid)
        if sess is None:
            return None
        sess.kick(Disconnect.GOING_AWAY)
        return sess.dialect

    def _answer_close(self, data: bytes) -> bytes:
        sid = str(msgpack.unpackb(data))
        dialect = self._close(sid)
        return bytes(msgpack.packb(None if dialect is None else [sid, dialect]))

    async def disconnect(self, request: web.Request) -> web.Response:
        """Close one connection as the server closes every connection when it stops (1001 going away: each
        dialect's own close), its session kicked, on whichever worker holds it; the connection's handler
        then ends it."""
        self._admin(request)
        sid = request.match_info["id"]
        dialect = self._close(sid)
        if dialect is None:
            for answer in await self.node.notices.ask(CLOSE_TOPIC, msgpack.packb(sid)):
                try:
                    closed = msgpack.unpackb(answer)
                    if closed is not None:
                        dialect = str(closed[1])
                except (ValueError, TypeError, IndexError, msgpack.UnpackException):
                    continue
        if dialect is None:
            return json_response({"error": f"{sid}: no such connection"}, 404)
        return json_response({"closed": sid, "dialect": dialect})
