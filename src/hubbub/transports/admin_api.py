"""The admin API the dashboard uses (docs/operations.md "Admin API", docs/dashboard.md), JSON for scripts
too. Every route needs an admin identity when auth is on (``Access.check_admin``, as ``/api/v1/trim`` and
``/api/v1/connectors``): 401 without a valid token, 403 for a token without ``admin``.

* ``GET /api/v1/admin/overview``: version, uptime, durability and store, the store's, broker's and
  presence's states, the log's size and its oldest and newest events, connections by dialect, events per
  second in and out and their last 15 minutes (``transports/admin_history.py``).
* ``GET /api/v1/admin/channels?pattern=&q=&after=&limit=``: channels in byte order, a page at a time from
  the cursor ``after`` (``next`` in the answer), under a native ``pattern`` (default ``/**``) and whose path
  holds the text ``q``; each with its position, count, rate and subscribers by dialect.
* ``GET /api/v1/admin/channels/tree?prefix=&after=&limit=``: one level of the channel tree, the children of
  a path, each with whether it is a channel and whether channels lie below it.
* ``GET /api/v1/admin/connections?after=&limit=&dialect=&q=``; ``DELETE /api/v1/admin/connections/<id>``
  (``transports/admin_connections.py``): the attached sessions (every dialect's, on every worker of the
  node), and closing one as at shutdown (1001, each dialect its own way), on whichever worker holds it.
* ``GET /api/v1/admin/consumers?after=&limit=``; ``DELETE /api/v1/admin/consumers/<name>``;
  ``POST /api/v1/admin/consumers/<name>/reset`` (``transports/admin_consumers.py``): durable consumers,
  their backlog, in flight, redeliveries and last acknowledgement; deleting one; starting one anew from now.
* ``GET /api/v1/admin/federation``: this node's federation id, its links up with their states and the links
  of nodes below. (Cluster nodes, broker and presence: ``GET /api/v1/cluster``.)

Nothing here keeps a list of every channel or reads one: a channel page is one bounded read of the log
(``Core.list_channels`` from the cursor), a connection page a sort of the attached sessions.

Concurrency contract: event loop thread only (the log's reads run on the node's reader threads).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, final

from aiohttp import web

from hubbub import __version__
from hubbub.auth import Identity
from hubbub.channels import Pattern, parse_pattern
from hubbub.core.api import Core
from hubbub.errors import BadRequest
from hubbub.log.base import ChannelInfo

from .admin_connections import ConnectionAdmin
from .admin_consumers import ConsumerAdmin, json_response, page_limit
from .admin_history import TrafficHistory
from .http import request_identity

if TYPE_CHECKING:
    from .federation_link import FederationUpstream
    from .federation_peer import FederationHub

__all__ = ["CHANNEL_SCAN_MAX", "AdminApi", "ChannelRates", "NodeInfo"]

#: The most channels one ``q`` search reads from the log before it answers (with ``next`` to go on).
CHANNEL_SCAN_MAX: Final = 10_000
#: A channel's rate is the change of its head between two listings at least this many seconds apart ...
RATE_MIN_S: Final = 1.0
#: ... and at most this many (an older observation tells nothing of the channel's rate now).
RATE_MAX_S: Final = 600.0


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the composition root knows of the node, shown by the overview."""

    durability: str
    store: str
    workers: int = 1


@final
class ChannelRates:
    """Each channel's rate (events a second), from its head seen by two listings: a bounded map of the last
    head seen per channel (the least recently listed forgotten first)."""

    def __init__(self, most: int = 50_000) -> None:
        self._most = most
        #: channel -> (epoch, top, monotonic time seen, rate then)
        self._seen: OrderedDict[str, tuple[str, int, float, float | None]] = OrderedDict()

    def rate(self, ci: ChannelInfo, now: float) -> float | None:
        """The channel's rate since it was last listed (None: not listed within :data:`RATE_MAX_S`, or
        another epoch), and ``ci`` remembered for the next listing."""
        seen = self._seen
        was = seen.get(ci.channel)
        rate: float | None = None
        if was is not None:
            epoch, top, at, last = was
            dt = now - at
            if epoch == ci.epoch and dt <= RATE_MAX_S:
                if dt < RATE_MIN_S:
                    seen.move_to_end(ci.channel)
                    return last  # too close to the last listing to tell: the rate told then
                rate = max(ci.top - top, 0) / dt
        seen[ci.channel] = (ci.epoch, ci.top, now, rate)
        seen.move_to_end(ci.channel)
        while len(seen) > self._most:
            seen.popitem(last=False)
        return rate


#: The highest code point: a path ending with ``/`` and this sorts after every channel below it.
_LAST: Final = "\U0010ffff"


async def channel_children(
    node: Core, ident: Identity, prefix: str, after: str, limit: int, max_channel_bytes: int
) -> tuple[list[dict[str, Any]], str, bool]:
    """The children of ``prefix`` (``[{"name","path","channel","children"}]``, in byte order), the cursor
    after them and whether there may be more. Each step reads one channel from the log, from the cursor:
    a child whose channels lie below it is passed over whole (the cursor moves past its subtree), so a level
    of ten children costs some ten reads whatever the number of channels under them. (A child may show on
    two pages when a sibling's name extends its own with a character that sorts before ``/``, such as
    ``b`` and ``b-2``: its own channel, the sibling's, then its subtree.)"""
    pattern = parse_pattern((prefix or "") + "/**", max_channel_bytes)
    base = prefix + "/"
    found: dict[str, dict[str, Any]] = {}
    cursor = after
    while True:
        page = await node.list_channels(pattern, readable_by=ident, after=cursor, limit=1)
        if not page:
            return list(found.values()), cursor, False
        channel = page[0].channel
        if channel == prefix:  # the prefix is a channel itself: not its own child
            cursor = channel
            continue
        name, sep, _ = channel[len(base) :].partition("/")
        path = base + name
        if path not in found:
            if len(found) == limit:
                return list(found.values()), cursor, True
            found[path] = {"name": name, "path": path, "channel": False, "children": False}
        child = found[path]
        if sep:
            child["children"] = True
            cursor = path + "/" + _LAST  # past its subtree ("/a/b-2" sorts before "/a/b/c": read already)
        else:
            child["channel"] = True
            cursor = channel


class AdminApi:
    """The routes of the module docstring. ``history``: the traffic ring the overview shows;
    ``federation`` and ``upstreams``: this node's federation hub and links up, when it has them."""

    def __init__(
        self,
        node: Core,
        info: NodeInfo,
        history: TrafficHistory,
        *,
        max_channel_bytes: int = 1024,
        federation: FederationHub | None = None,
        upstreams: Sequence[FederationUpstream] = (),
    ) -> None:
        self.node = node
        self.info = info
        self.history = history
        self.federation = federation
        self.upstreams = upstreams
        self.rates = ChannelRates()
        self.connection_admin = ConnectionAdmin(node, self._admin)
        self.consumer_admin = ConsumerAdmin(node, self._admin)
        self._max_channel_bytes = max_channel_bytes
        self._started = time.time()
        self._started_mono = time.monotonic()

    def install(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/api/v1/admin/overview", self.overview)
        r.add_get("/api/v1/admin/channels", self.channels)
        r.add_get("/api/v1/admin/channels/tree", self.tree)
        self.connection_admin.install(app)
        self.consumer_admin.install(app)
        r.add_get("/api/v1/admin/federation", self.federation_links)

    def _admin(self, request: web.Request) -> Identity:
        """The request's identity, which must be an admin's (``AuthError`` 4100-4103 otherwise: 401/403).
        A change from another site's page never gets here: transports/cross_site.py refuses it (403)."""
        ident = request_identity(self.node, request, "native")
        self.node.access.check_admin(ident, "native")
        return ident

    # -- overview ---------------------------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        self._admin(request)
        node = self.node
        m = node.metrics
        # The store's counts, read as /metrics reads them: on reader threads, as the times.
        oldest, newest, log = await asyncio.gather(node.oldest_time(), node.top_time(), m.read_log())
        h = self.history
        # The other workers' figures and traffic: the node's, as /metrics shows them.
        _, samples = await asyncio.gather(m.ask_peers(), h.node_samples())
        f = m.node_figures()
        by_dialect = {d: int(n) for d, n in f["connections"].items()}
        relay = node.relay
        last = samples[-1] if samples else None
        svc = node.consumers
        body = {
            "version": __version__,
            "started": self._started,
            "uptime_s": round(time.monotonic() - self._started_mono, 3),
            "durability": self.info.durability,
            "store": self.info.store,
            "workers": self.info.workers,
            "federation_id": self.federation.node_id if self.federation is not None else "",
            "health": node.health_checks() or {"store": "ok"},
            "broker": relay.health() if relay is not None else {},
            "presence": node.presence.health(),
            "log": {
                "events": log.events,
                "bytes": log.bytes,
                "channels": log.channels,
                "retired_epochs": log.retired_epochs,
                "oldest_ns": str(oldest),
                "newest_ns": str(newest),
            },
            "connections": {
                "total": sum(by_dialect.values()),
                "by_dialect": dict(sorted(by_dialect.items())),
            },
            "subscriptions": int(f["subscriptions"].get("", 0)),
            "consumers": svc.metrics.totals().consumers if svc is not None else 0,
            "events": {
                "published": int(sum(f["published"].values())),
                "delivered": int(sum(f["deliveries"].values())),
                "dropped": int(sum(f["dropped"].values())),
                "in_per_s": round(last.events_in, 3) if last else 0.0,
                "out_per_s": round(last.events_out, 3) if last else 0.0,
            },
            "history": {
                "interval_s": h.interval_s,
                "samples": [
                    [round(s.time, 3), round(s.events_in, 3), round(s.events_out, 3), s.connections]
                    for s in samples
                ],
            },
        }
        return json_response(body)

    # -- channels ---------------------------------------------------------------------------------------

    async def channels(self, request: web.Request) -> web.Response:
        ident = self._admin(request)
        q = request.query
        pattern = parse_pattern(q.get("pattern") or "/**", self._max_channel_bytes)
        text = q.get("q", "")
        after = q.get("after", "")
        limit = page_limit(request)
        rows, cursor, more, scanned = await self._channel_page(ident, pattern, text, after, limit)
        now = time.monotonic()
        out = [self._channel(ci, now) for ci in rows]
        return json_response({"channels": out, "next": cursor if more else None, "scanned": scanned})

    async def tree(self, request: web.Request) -> web.Response:
        """One level of the channel tree: the children of ``prefix`` (a channel path, "" for the root),
        each with whether it is a channel itself and whether channels lie below it, a page at a time."""
        ident = self._admin(request)
        prefix = request.query.get("prefix", "").rstrip("/")
        if "*" in prefix:
            raise BadRequest("prefix is a channel path, without wildcards")
        children, cursor, more = await channel_children(
            self.node,
            ident,
            prefix,
            request.query.get("after", ""),
            page_limit(request),
            self._max_channel_bytes,
        )
        return json_response({"prefix": prefix, "children": children, "next": cursor if more else None})

    async def _channel_page(
        self, ident: Identity, pattern: Pattern, text: str, after: str, limit: int
    ) -> tuple[list[ChannelInfo], str, bool, int]:
        """The page's channels, the cursor after them, whether there may be more, and how many were read.
        Without ``text``, one listing; with it, listings of up to 1,000 channels until the page is full,
        the channels end or :data:`CHANNEL_SCAN_MAX` were read (the cursor then goes on from there)."""
        node = self.node
        if not text:
            page = await node.list_channels(pattern, readable_by=ident, after=after, limit=limit + 1)
            rows = page[:limit]
            return rows, rows[-1].channel if rows else after, len(page) > limit, len(rows)
        rows = []
        cursor, scanned = after, 0
        while scanned < CHANNEL_SCAN_MAX:
            want = min(1000, CHANNEL_SCAN_MAX - scanned)
            page = await node.list_channels(pattern, readable_by=ident, after=cursor, limit=want)
            for i, ci in enumerate(page):
                cursor = ci.channel
                if text in ci.channel:
                    rows.append(ci)
                    if len(rows) == limit:
                        return rows, cursor, i + 1 < len(page) or len(page) == want, scanned + i + 1
            scanned += len(page)
            if len(page) < want:
                return rows, cursor, False, scanned
        return rows, cursor, True, scanned

    def _channel(self, ci: ChannelInfo, now: float) -> dict[str, Any]:
        subs: dict[str, int] = {}
        seen: set[int] = set()
        for sub in self.node.matching(ci.channel):
            sess = sub.session
            if id(sess) not in seen:
                seen.add(id(sess))
                subs[sess.dialect] = subs.get(sess.dialect, 0) + 1
        return {
            "channel": ci.channel,
            "epoch": ci.epoch,
            "first": ci.first,
            "top": ci.top,
            "count": max(ci.top - ci.first + 1, 0),
            "last_ns": str(ci.top_time),
            "rate": self.rates.rate(ci, now),
            "subscribers": dict(sorted(subs.items())),
        }

    # -- federation -------------------------------------------------------------------------------------

    async def federation_links(self, request: web.Request) -> web.Response:
        self._admin(request)
        hub = self.federation
        ups = [
            {
                "name": link.name,
                "state": link.state,
                "upstream": link.upstream,
                "reconnects": link.reconnects,
                "sent_up": link.stats.sent_up,
                "received_down": link.stats.received_down,
                "gaps": link.stats.gaps,
                "lag_s": round(link.stats.lag_down_s, 3),
            }
            for link in self.upstreams
        ]
        downs = (
            [
                {
                    "node": peer,
                    "connected": s.connected,
                    "connections": s.connections,
                    "received": s.received,
                    "refused": s.refused,
                    "sent": s.sent,
                }
                for peer, s in sorted(hub.peers.items())
            ]
            if hub is not None
            else []
        )
        return json_response(
            {"node_id": hub.node_id if hub is not None else "", "upstreams": ups, "downstreams": downs}
        )
