"""The guble dialect's routes: WebSocket at ``/stream/…``, REST at ``/api/…``, admin at ``/admin/…``
(protocols/guble.md).

One :class:`GubleConnection` serves one WebSocket: it feeds decoded commands to the node and drains the
session's queue to the socket (always binary frames). :class:`GubleHub` owns the connections and serves the
HTTP endpoints; :func:`install` adds its routes to the application.

Receivers (guble.md §3, §5): one per canonical channel and connection, each a node subscription to the
channel's subtree. A receiver with a start id replays the guble selection (a
:class:`~hubbub.selection.SubtreeFetch`, which the node plans on a reader thread) and then goes live with
the node's hold-and-release junction, so there is no gap and no duplicate. A fetch with ``maxCount`` reads
once and never subscribes.

Slow consumers (README §4, guble.md §6): sessions use ``Overflow.CATCH_UP``. When the queue overflows, the
session drops its queued live events and calls :meth:`GubleConnection._on_catch_up`, which unsubscribes the
live receivers at once and re-subscribes them with a replay of every event after the last live event the
connection wrote (by commit time, which is unique and increasing across the whole log), framed like a fetch
and ending in ``#subscribed-to``.

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson
from aiohttp import web

from hubbub.auth import Identity
from hubbub.channels import route_channel
from hubbub.core.api import Core, ReplayPlan
from hubbub.dialects import guble as gc
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, BadChannel, HubbubError, SubscriptionError
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult
from hubbub.selection import LIVE, LiveOnly, SubtreeFetch

from .binding import Mounted, Wiring
from .connector import Connector
from .cross_site import cross_site_upgrade
from .guble_connectors import DeviceConnector, apns_connector, fcm_connector
from .http import HttpSettings, RouteInstaller, raw_rest, request_identity, text_response
from .lifetime import Lifetime
from .sms import SmsGateway
from .wire import DialectWire
from .ws_driver import detach, run_websocket, upgradable
from .ws_socket import take_over

__all__ = [
    "GUBLE_HUB",
    "GubleConnection",
    "GubleHub",
    "GubleSettings",
    "install",
    "roster_name",
    "subtree_pattern",
]

log = logging.getLogger("hubbub.guble")

HEARTBEAT_S = 30.0
OCTET_STREAM = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class GubleSettings:
    """The ``guble.*`` configuration keys (guble.md §1)."""

    node_id: int = 0
    health_endpoint: str = "/admin/healthcheck"
    metrics_endpoint: str = "/admin/metrics"
    #: ``guble.auth`` resolved: a token on the ``/stream/`` upgrade and on every REST and admin call (§9).
    auth: bool = False


# -- replay selection ---------------------------------------------------------------------------------------

subtree_pattern = gc.subtree_pattern


def fetch_count(plan: ReplayPlan) -> int:
    """The number of events a fetch's plan sends (its ``#fetch-start`` count)."""
    return plan.scan.limit or 0 if plan.scan is not None else 0


# -- connections --------------------------------------------------------------------------------------------


def roster_name(channel: str) -> str:
    """The presence roster of guble's receivers on exactly ``channel`` (canonical)."""
    return f"guble:{channel}"


class _Encoder:
    """The session's encoder: the shared rendering, plus a record of each queued event frame (its time and
    whether it is a replay) so the write loop knows the last live event it wrote. That record is this
    connection's own (``per_connection``): the fan-out calls the encoder for each guble session, never handing
    one the frames encoded for another, as guble receiver ids (``g1``, ...) repeat across connections."""

    per_connection = True

    def __init__(self, codec: gc.GubleCodec, mark: gc.LiveMark, catch_up: set[str]) -> None:
        self.codec = codec
        self.key = f"guble.{codec.node_id}"
        self.mark = mark
        self.catch_up = catch_up

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        # A catch-up replay stands in for dropped live events: it counts as live for the next catch-up.
        self.mark.queued(event.time_ns, not replay or bool(subs and subs[0] in self.catch_up))
        return self.codec.encode_event(event, cache)


def _farewell(reason: Disconnect) -> bytes | None:
    """The notice before an internal-error close (core/faults.py): guble's own ``!error-server-internal``
    (guble.md §3); a slow consumer's 1013 and every other close come without one, as in guble."""
    return gc.error_text(HubbubError()) if reason == Disconnect.INTERNAL_ERROR else None


class GubleConnection:
    """Glue between one guble WebSocket, the codec and the node."""

    def __init__(
        self,
        hub: GubleHub,
        user: str,
        send: Callable[[bytes], Any],
        close: Callable[[Disconnect], Any],
    ) -> None:
        self.hub = hub
        self.node = hub.node
        self.codec = hub.codec
        #: The receivers' state machine (dialects/guble_receivers.py): table, replacement, notices, catch-up.
        self.state = gc.GubleReceivers(self.codec)
        s = hub.http
        self.wire = DialectWire(
            self.node,
            gc.SPEC,
            dialect="guble",
            encoder=_Encoder(self.codec, self.state.mark, self.state.catch_up_subs),
            send_queue=s.send_queue,
            send_queue_bytes=s.send_queue_bytes,
            max_frame=s.max_frame,
            send=send,
            close=close,
            echo=True,
            session_id=gc.new_xid(),
            user=user,
            on_frames=self.state.mark.written,
            farewell=_farewell,
        )
        self.session = self.wire.session
        self.session.on_catch_up = self._on_catch_up
        self.wire.handle(
            {
                gc.Send: self._answered(self._publish),
                gc.Receive: self._answered(self._receive),
                gc.Cancel: self._answered(self._cancel),
            }
        )

    @property
    def receivers(self) -> dict[str, gc.Receiver]:
        return self.state.receivers

    @property
    def catch_ups(self) -> int:
        """Catch-ups from the log so far (the session dropped its queued live events)."""
        return self.state.catch_ups

    # -- helpers ----------------------------------------------------------------------------------------

    def _push(self, data: bytes) -> None:
        self.session.push(data)

    def _notice(self, name: str, arg: str | None = None) -> None:
        self.session.push(self.state.notice(name, arg))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return self.wire.spawn(coro)

    # -- commands ---------------------------------------------------------------------------------------

    async def handle(self, cmd: gc.Command) -> None:
        """Carry out one decoded command."""
        await self.wire.run([cmd])

    def _answered(self, command: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        """``command`` with a refusal of the core answered by its ``!error`` line (guble.md §3)."""

        async def answered(cmd: gc.Command) -> None:
            try:
                await command(cmd)
            except HubbubError as exc:
                self._push(gc.error_text(exc))

        return answered

    async def _cancel(self, cmd: gc.Cancel) -> None:
        rec = self.state.cancel(cmd.channel)
        if rec is not None:
            self._stop(rec)
            self._notice("canceled", rec.path)

    async def _publish(self, cmd: gc.Send) -> None:
        sess = self.session
        lim = self.hub.http.codec_limits
        req = AppendRequest(
            channel=cmd.channel,
            publisher=Publisher("guble", sess.user, sess.id, cmd.msg_id),
            payload=cmd.body,
            content_type=OCTET_STREAM,
            headers=gc.headers_for_send(cmd, lim["max_headers"], lim["max_header_bytes"]),
        )

        def done(r: AppendResult | HubbubError) -> None:
            if isinstance(r, HubbubError):
                sess.push(gc.error_text(r))
            else:
                sess.push(self.codec.encode_notice("send"))

        await self.node.writable()
        self.node.submit(req, sess, done)

    def _present(self, rec: gc.Receiver) -> None:
        """List the connection as a subscriber of ``rec``'s channel (``/api/subscribers``, cluster-wide)."""
        sess = self.session
        fields = {"application_id": sess.id, "user_id": sess.user}
        self.node.presence.join(roster_name(rec.channel), sess.id, fields)

    def _absent(self, rec: gc.Receiver) -> None:
        self.node.presence.leave(roster_name(rec.channel), self.session.id)

    def _stop(self, rec: gc.Receiver) -> None:
        if rec.task is not None and not rec.task.done():
            rec.task.cancel()
        rec.live = False
        self._absent(rec)
        with contextlib.suppress(SubscriptionError):
            self.node.unsubscribe(self.session, rec.sub_id)

    async def _receive(self, cmd: gc.Receive) -> None:
        rec, old = self.state.add(cmd.channel)
        if old is not None:
            self._stop(old)  # a second "+" for the same path replaces the receiver silently
        if not cmd.fetches:
            # No snapshot to skip: every event held while subscribing is released.
            await self._subscribe(rec, LIVE, fetch=False)
            return
        selection = SubtreeFetch(cmd.channel, cmd.start_id, cmd.max_count)
        if cmd.subscribes:
            # The fetch's events count as live ones for a catch-up (LiveMark): the receiver goes live while
            # some may still be queued, and a catch-up must then send those again, from the last one written.
            self.state.catch_up_subs.add(rec.sub_id)
            rec.task = self._spawn(self._run(rec, self._subscribe(rec, selection, fetch=True)))
        else:
            rec.task = self._spawn(self._run(rec, self._fetch_only(rec, selection)))

    async def _run(self, rec: gc.Receiver, coro: Any) -> None:
        try:
            await coro
        except HubbubError as exc:
            if rec.dropped:
                return  # a catch-up unsubscribed it meanwhile and re-subscribes the channel
            if self.state.discard(rec):
                self._absent(rec)
            if not isinstance(exc, SubscriptionError):  # 4201: cancelled while reading
                self._push(gc.error_text(exc))

    async def _subscribe(self, rec: gc.Receiver, selection: SubtreeFetch | LiveOnly, fetch: bool) -> None:
        state = self.state

        def on_snapshot(plan: ReplayPlan) -> None:
            # The receiver's stream starts with its fetch: a catch-up may reach back that far.
            start = plan.scan.from_time if plan.scan is not None else None
            self._push(state.snapshot_notice(rec, fetch, fetch_count(plan), start))

        def on_replayed(plan: ReplayPlan) -> None:
            for notice in state.replayed_notices(rec):
                self._push(notice)

        try:
            await self.node.subscribe(
                self.session,
                rec.sub_id,
                rec.pattern,
                selection=selection,
                on_snapshot=on_snapshot,
                on_replayed=on_replayed,
            )
        finally:
            state.catch_up_subs.discard(rec.sub_id)  # every fetch frame is queued (or never will be)
        if state.subscribed(rec):
            self.hub.total_subscriptions += 1
            # Joining again after a catch-up keeps the connection's place in the roster.
            self._present(rec)

    async def _fetch_only(self, rec: gc.Receiver, fetch: SubtreeFetch) -> None:
        sess = self.session
        try:
            plan = await self.node.fetch(sess, rec.pattern, fetch)
            self._notice("fetch-start", f"{rec.path} {fetch_count(plan)}")
            await self.node.send_fetched(sess, rec.pattern, plan)
            if not (sess.closed or sess.kicked):
                self._notice("fetch-end", rec.path)
        finally:
            self.state.discard(rec)

    # -- slow consumer: catch up from the log -----------------------------------------------------------

    def _on_catch_up(self) -> None:
        """Called by the session (inside a push) when it dropped its queued live events.

        Every event frame queued was dropped (and the new one was not queued); each has a commit time after
        the newest live event written (``gc.LiveMark``). The live receivers, and those re-subscribing in a
        catch-up already under way, are unsubscribed at once and queued for a catch-up from that time."""
        stopped_live, stop, start = self.state.drop_live()
        for r in stop:
            if r.task is not None:
                r.task.cancel()
        for r in stopped_live:
            with contextlib.suppress(SubscriptionError):
                self.node.unsubscribe(self.session, r.sub_id)
        if start:
            self._spawn(self._catch_up())

    async def _catch_up(self) -> None:
        state = self.state
        try:
            while steps := state.take_pending():
                # Ancestors first: a receiver inside another one's subtree gets its events through that one's
                # replay, and only re-subscribes (an empty fetch) once the ancestor is live again.
                for old, step in steps:
                    rec = state.resubscriber(old)
                    if rec is None:
                        continue  # cancelled or replaced meanwhile
                    selection = SubtreeFetch(rec.channel, from_time=step.from_time, empty=step.covered)
                    rec.task = self._spawn(self._run(rec, self._subscribe(rec, selection, fetch=True)))
                    await asyncio.wait([rec.task])
                    state.catch_up_subs.discard(rec.sub_id)
        finally:
            state.end_catch_up()

    # -- outbound ---------------------------------------------------------------------------------------

    def start(self, group: Lifetime) -> None:
        """Attach and start the writer; every task of the connection is one of ``group`` (its lifetime), and
        :meth:`finish` ends them before the group closes."""
        self.wire.start(group, None)
        self.greet()

    def greet(self) -> None:
        """The ``#connected`` frame, first on the connection (guble.md §2)."""
        self._push(self.codec.encode_connected(self.session.id, self.session.user))

    def leave(self) -> None:
        """The reader is done: every receiver stops."""
        self.hub.connections.discard(self)
        for rec in list(self.receivers.values()):
            self._stop(rec)
        self.receivers.clear()

    async def finish(self) -> None:
        self.leave()
        await self.wire.finish()


# -- the hub: WebSocket and HTTP handlers -------------------------------------------------------------------


def _json(status: int, obj: Any, charset: bool = False) -> web.Response:
    resp = web.Response(status=status, body=orjson.dumps(obj))
    resp.headers["Content-Type"] = "application/json; charset=utf-8" if charset else "application/json"
    return resp


#: The family of guble's own counters in the node's figures (``NodeMetrics.add``: summed across workers).
_FAMILY = "guble"


class GubleHub:
    """Every guble connection of one server, and the guble HTTP handlers."""

    def __init__(self, node: Core, http: HttpSettings, settings: GubleSettings) -> None:
        self.node = node
        self.http = http
        self.settings = settings
        self.codec = gc.GubleCodec(
            max_frame=http.max_frame, max_channel_bytes=http.max_channel_bytes, node_id=settings.node_id
        )
        self.connections: set[GubleConnection] = set()
        self.total_subscriptions = 0
        node.metrics.add(_FAMILY, lambda: {"total_subscriptions": self.total_subscriptions})

    def live_receivers(self) -> list[tuple[GubleConnection, gc.Receiver]]:
        out = [(c, r) for c in self.connections for r in c.receivers.values() if r.live]
        out.sort(key=lambda cr: cr[1].order)
        return out

    # -- WebSocket --------------------------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        ws = upgradable(request, self.http.max_frame)
        if ws is None:
            return text_response(400, "websocket upgrade required\n")
        if forbidden := cross_site_upgrade(request, anonymous=not self.settings.auth):
            return forbidden
        # guble-cli and guble's Go client build the URL as <url>/user/<name>, with no query or header of ours:
        # with auth on, a token not given otherwise is the /user/ segment (docs/dialects/guble.md "Auth").
        in_path = unquote(gc.user_id_from_path(request.raw_path)) or None
        try:
            ident = request_identity(self.node, request, "guble", self.settings.auth, fallback=in_path)
        except AuthError:
            return text_response(401, "unauthorized\n")
        sock, resp = await take_over(request, ws, self.http.max_frame)

        async def close(code: Disconnect) -> None:
            await sock.close(code=gc.wire_close(code))

        # With auth on, the token's user replaces the userId of the URL (guble.md §9).
        user = ident.user if self.settings.auth else gc.user_id_from_path(request.raw_path)
        conn = GubleConnection(self, user, sock.send_bytes, close)
        self.connections.add(conn)

        async def greet() -> None:
            conn.greet()

        # The identity is bound before the session is attached: its expiry closes it (1008).
        frames = gc.GubleFrames(self.codec, gc.error_text)
        # guble's spec has no keepalive of its own: the server pings every HEARTBEAT_S and drops a peer
        # silent for half as long again (what aiohttp's heartbeat did).
        keepalive_s = (HEARTBEAT_S, HEARTBEAT_S * 1.5)

        async def run() -> None:
            try:
                await run_websocket(
                    sock, conn.wire, frames, ident, keepalive_s=keepalive_s, started=greet,
                    finishing=conn.leave,
                )  # fmt: skip
            finally:
                self.connections.discard(conn)  # also when the connection failed before its reader ran

        detach(request, run())
        return resp

    # -- REST -------------------------------------------------------------------------------------------

    def _identity(self, request: web.Request) -> Identity:
        """The request's identity (guble.md §9); ``AuthError`` when it has no valid token."""
        return request_identity(self.node, request, "guble", self.settings.auth)

    def _head(self, request: web.Request) -> web.Response:
        """``HEAD`` anywhere under ``/api/``: 200 with no body (guble.md §4), as upstream's REST handler
        answers before it looks at the path; guble's ``restclient.Check()`` is a ``HEAD`` of its endpoint.
        With ``guble.auth``, a valid token is still needed (401)."""
        try:
            self._identity(request)
        except AuthError:
            return text_response(401, "unauthorized\n")
        return web.Response(status=200)

    async def api(self, request: web.Request) -> web.Response:
        """Any other path under guble's REST prefix (``/api``, ``/api/``, ``/api/message`` without a slash,
        ...; never native's ``/api/v1/``): ``HEAD`` 200, ``GET`` and ``POST`` 404 (no topic), others 405."""
        if request.method == "HEAD":
            return self._head(request)
        if request.method in ("GET", "POST"):
            return text_response(404, "404 page not found\n")
        return text_response(405, "Method not allowed\n")

    async def message(self, request: web.Request) -> web.Response:
        if request.method == "HEAD":
            return self._head(request)
        rest = raw_rest(request, "/api/message/")
        if not rest:
            return text_response(404, "404 page not found\n")
        try:
            ident = self._identity(request)
        except AuthError:
            return text_response(401, "unauthorized\n")
        if request.method != "POST":
            return text_response(405, "Method not allowed\n")
        try:
            channel = route_channel(rest, self.http.max_channel_bytes)
        except BadChannel:
            return text_response(400, "invalid path\n")
        body = await request.read()
        lim = self.http.codec_limits
        try:
            headers = gc.rest_publish_headers(
                request.headers.items(), request.query.items(), lim["max_headers"], lim["max_header_bytes"]
            )
        except HubbubError as exc:
            return text_response(400, f"{exc.detail}\n")
        q = request.query
        user = ident.user if self.settings.auth else q.get("userId", "")
        req = AppendRequest(
            channel=channel,
            publisher=Publisher("guble", user, gc.new_xid(), q.get("messageId", "")),
            payload=body,
            content_type=request.headers.get("Content-Type") or OCTET_STREAM,
            headers=headers,
        )
        try:
            await self.node.publish(req, identity=ident)
        except AuthError:
            return text_response(403, "forbidden\n")
        except HubbubError as exc:
            return text_response(500 if exc.code != 4303 else 503, f"{exc.message}\n")
        return text_response(200, "OK")

    async def subscribers(self, request: web.Request) -> web.Response:
        if request.method == "HEAD":
            return self._head(request)
        rest = raw_rest(request, "/api/subscribers/")
        if not rest:
            return text_response(404, "404 page not found\n")
        try:
            ident = self._identity(request)
        except AuthError:
            return text_response(401, "unauthorized\n")
        if request.method != "GET":
            return text_response(405, "Method not allowed\n")
        try:
            channel = route_channel(rest, self.http.max_channel_bytes)
        except BadChannel:
            return text_response(400, "invalid path\n")
        try:  # who listens on a topic is read access to it
            self.node.access.check_read(ident, channel, "guble")
        except AuthError:
            return text_response(403, "forbidden\n")
        # Every node's receivers (node.presence: this node's alone, or the cluster's), oldest first.
        members = await self.node.presence.members(roster_name(channel))
        out = [{k: m.fields.get(k, "") for k in ("application_id", "user_id")} for m in members]
        return _json(200, out)

    # -- admin ------------------------------------------------------------------------------------------

    def _admin(self, request: web.Request) -> web.Response | None:
        """``None`` when the request may use ``/admin/*``: with auth on, a token with the ``admin`` claim
        (401 without a valid token, 403 without the claim). Native ``/healthz`` stays open for probes."""
        try:
            ident = self._identity(request)
        except AuthError:
            return text_response(401, "unauthorized\n")
        try:
            self.node.access.check_admin(ident, "guble")
        except AuthError:
            return text_response(403, "forbidden\n")
        return None

    async def healthcheck(self, request: web.Request) -> web.Response:
        refused = self._admin(request)
        if refused is not None:
            return refused
        checks = self.node.health_checks()  # the node's state, as /healthz: never waits on the store
        return _json(503 if checks else 200, checks, charset=True)

    def counters(self) -> dict[str, int]:
        """The JSON counters of ``/admin/metrics``: guble's key names, then the counters of ``/metrics``; the
        node's, every worker's summed (as ``/metrics``: :meth:`metrics` asks the other workers first)."""
        f = self.node.metrics.node_figures()
        out: dict[str, int] = {
            "router.total_messages_incoming": int(sum(f["published"].values())),
            "router.total_messages_routed": int(sum(f["deliveries"].values())),
            "router.total_subscriptions": int(f.get(_FAMILY, {}).get("total_subscriptions", 0)),
            "router.current_routes": int(f["subscriptions"].get("", 0)),
        }
        for name, family in (
            ("hubbub_connections", "connections"),
            ("hubbub_events_published_total", "published"),
            ("hubbub_deliveries_total", "deliveries"),
            ("hubbub_dropped_total", "dropped"),
            ("hubbub_bad_input_total", "bad_input"),
            ("hubbub_slow_consumer_closes_total", "slow_closes"),
            ("hubbub_write_timeouts_total", "write_timeouts"),
        ):
            for d, v in sorted(f[family].items()):
                out[f"{name}.{d}"] = int(v)
        return out

    async def metrics(self, request: web.Request) -> web.Response:
        refused = self._admin(request)
        if refused is not None:
            return refused
        await self.node.metrics.ask_peers()
        return _json(200, self.counters(), charset=True)

    async def router(self, request: web.Request) -> web.Response:
        refused = self._admin(request)
        if refused is not None:
            return refused
        if request.method != "GET":
            return _json(405, {"error": "Error method not allowed. Only HTTP GET is accepted"})
        out: dict[str, list[dict[str, Any]]] = {}
        for c, r in self.live_receivers():
            out.setdefault(r.path, []).append(
                {
                    "RouteParams": {"application_id": c.session.id, "user_id": c.session.user},
                    "Path": r.path,
                    "ChannelSize": self.http.send_queue,
                }
            )
        return _json(200, out)


#: The installed hub, for tests and tools: ``app[GUBLE_HUB]``.
GUBLE_HUB = web.AppKey("guble_hub", GubleHub)


def install(app: web.Application, node: Core, http: HttpSettings, *, settings: GubleSettings) -> None:
    """Add the guble routes (a :data:`~hubbub.transports.http.RouteInstaller` once ``settings`` is bound)."""
    hub = GubleHub(node, http, settings)
    app[GUBLE_HUB] = hub
    app.router.add_get("/stream/{rest:.*}", hub.websocket)
    app.router.add_route("*", "/api/message/{rest:.*}", hub.message)
    app.router.add_route("*", "/api/subscribers/{rest:.*}", hub.subscribers)
    # The rest of the REST prefix, after the routes above; native's /api/v1/ is not guble's.
    app.router.add_route("*", "/api", hub.api)
    app.router.add_route("*", r"/api/{rest:(?!v1(?:/|$)).*}", hub.api)
    if settings.health_endpoint:
        app.router.add_route("*", settings.health_endpoint, hub.healthcheck)
    if settings.metrics_endpoint:
        app.router.add_route("*", settings.metrics_endpoint, hub.metrics)
    app.router.add_route("*", "/admin/router", hub.router)


class GubleMounted(Mounted):
    """guble wired on a node, with its device connectors (``guble.fcm``): their routes are installed with
    guble's, their deliveries start once the listeners are up and stop first."""

    def __init__(
        self, installer: RouteInstaller, devices: list[DeviceConnector], sms: SmsGateway | None
    ) -> None:
        super().__init__(gc.SPEC, installer)
        self.devices = devices
        self.sms = sms

    def links(self) -> Iterable[AbstractAsyncContextManager[object]]:
        return [*self.devices, *([self.sms] if self.sms is not None else [])]

    def connectors(self) -> Iterable[Connector]:
        return [d.connector for d in self.devices] + ([self.sms.connector] if self.sms is not None else [])


async def mount(w: Wiring) -> Mounted:
    """guble's binding (``guble.SPEC``): its settings from the ``guble`` section, its routes, and its
    device connectors."""
    cfg = w.config.section(gc.GubleConfig)
    auth = w.auth("guble")
    settings = GubleSettings(cfg.node_id, cfg.health_endpoint, cfg.metrics_endpoint, auth=auth)
    devices = [await fcm_connector(w, cfg, auth)] if cfg.fcm else []
    if cfg.apns:
        devices.append(await apns_connector(w, cfg, auth))
    sms = None
    if cfg.sms:
        sms = SmsGateway(w.node, w.consumers, cfg, w.config.cluster.poll_interval_s)
        await sms.prepare(w.consumers)

    def installer(app: web.Application, node: Core, http: HttpSettings) -> None:
        install(app, node, http, settings=settings)
        for d in devices:
            d.install(app)

    return GubleMounted(installer, devices, sms)
