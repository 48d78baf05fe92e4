"""The aiohttp application: native WebSocket and HTTP API, health, metrics (protocols README §1).

Channel names are taken from the *raw* request path (before percent-decoding), so ``%2F`` inside a segment
stays part of the segment (mapping.md §2.3).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from hubbub.auth import ANONYMOUS, Identity
from hubbub.channels import parse_pattern, route_channel
from hubbub.config import member_node
from hubbub.core.api import Core, Gap, ReplayPlan, Session
from hubbub.core.session import Overflow
from hubbub.dialects import native as nc
from hubbub.disconnect import Disconnect
from hubbub.errors import BadRequest, EpochMismatch, HubbubError
from hubbub.events import Event, Position, Publisher
from hubbub.federation.wire import BELOW_HEADER, NODE_HEADER, parse_node
from hubbub.log.base import AppendRequest
from hubbub.selection import EventResume, ReplaySpec

from .accept import peer_name
from .cors import install_cors
from .cross_site import cross_site_guard, cross_site_upgrade, install_cross_site, origin_allowed
from .lifetime import Lifetime
from .metrics import CONTENT_TYPE, ConsumerCollector, ConsumerSeries, NodeCollector, render_metrics
from .native import BURST_MAX, NativeConnection, NativeEncoder
from .pump import Direct, SessionPump, Wire, stopped
from .ws_driver import WS_CONNECTIONS, detach, run_websocket, upgradable
from .ws_socket import take_over
from .ws_write import WsSink

if TYPE_CHECKING:
    from .federation_peer import FederationHub

__all__ = [
    "TOKEN_COOKIE",
    "HttpSettings",
    "RouteInstaller",
    "build_app",
    "native_codec",
    "native_connection",
    "origin_allowed",
    "peer_address",
    "raw_rest",
    "request_identity",
    "request_token",
    "text_response",
]

log = logging.getLogger("hubbub.http")

NATIVE_PROTOCOLS = ("hubbub.v1.json", "hubbub.v1.msgpack")
SSE_PING_S = 15.0


@dataclass(frozen=True, slots=True)
class HttpSettings:
    max_frame: int
    max_channel_bytes: int
    max_subscriptions: int
    send_queue: int
    send_queue_bytes: int
    ping_interval: float
    codec_limits: dict[str, int]
    #: ``cors_origin`` parsed: ``()`` is off, ``("*",)`` any origin, else the allowed origins (README §1).
    cors_origins: tuple[str, ...] = ()


def text_response(status: int, body: str, headers: dict[str, str] | None = None) -> web.Response:
    """A ``text/plain; charset=utf-8`` response (every dialect's plain-text answers)."""
    return web.Response(
        status=status,
        body=body.encode(),
        headers={"Content-Type": "text/plain; charset=utf-8", **(headers or {})},
    )


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


def _error(exc: HubbubError, **extra: Any) -> web.Response:
    status, body = nc.render_http_error(exc.code, exc.detail, message=exc.message, **extra)
    return _json(status, body)


def raw_rest(request: web.Request, prefix: str) -> str:
    """The raw (still percent-encoded) path after a route prefix: the channel text of mapping.md §2.3."""
    raw = request.raw_path.split("?", 1)[0]
    return raw[len(prefix) :] if raw.startswith(prefix) else ""


def _errors(node: Core) -> Any:
    """Middleware: a 404 and a 413 in plain text (a 413 counted by dialect: bodies over ``limits.max_frame``;
    connection limits are checked once per socket, when it is accepted: ``transports/http_listener.py``),
    and a :class:`HubbubError` as its JSON error. One middleware: each one's frame stays for a WebSocket's
    whole life."""

    @web.middleware
    async def errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Any:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return text_response(404, "404 page not found\n")
        except web.HTTPRequestEntityTooLarge:
            node.limiter.refused("max_frame", route_dialect(request.path))
            return text_response(413, "request body too large\n")
        except web.HTTPException:
            raise
        except HubbubError as exc:
            return _error(exc)

    return errors


#: The cookie a browser page may set for clients that build their URLs themselves (ivy-client.js).
TOKEN_COOKIE: Final = "hubbub_token"


def request_token(request: web.Request) -> str | None:
    """The token of a request or WebSocket upgrade (README §6, docs/security.md "Token presentation"), in
    this order: ``Authorization: Bearer <token>``; the ``token`` query; ``Authorization: Basic`` (the
    password, or the user name when the password is empty: what clients send for a URL such as
    ``ws://TOKEN@host/…``); the ``hubbub_token`` cookie (browser clients that build their URLs themselves),
    taken only from a request without ``Origin`` or from the server's own origin or one of ``cors_origin``'s,
    so that another site's page cannot use a visitor's cookie. Only finds the token: ``Access`` checks it."""
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    query = request.query.get("token")
    if query:
        return query
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return password or user or None
    cookie = request.cookies.get(TOKEN_COOKIE)
    if cookie and origin_allowed(request):
        return cookie
    return None


def peer_address(request: web.Request) -> str:
    """The client's address (the socket's; proxies' forwarding headers are not trusted)."""
    return request.remote or ""


def request_identity(
    node: Core, request: web.Request, dialect: str, auth: bool = True, fallback: str | None = None
) -> Identity:
    """The identity of one request or WebSocket upgrade of ``dialect`` (README §6): from its token when the
    dialect's auth is on (``fallback``: the dialect's own place for it, used when the request presents none
    of :func:`request_token`'s), :data:`~hubbub.auth.ANONYMOUS` when it is off (``<dialect>.auth = off``).
    Raises ``AuthError`` 4100/4101/4103, audited, which every dialect answers with ``401``."""
    if not auth:
        return ANONYMOUS
    return node.authenticate(request_token(request) or fallback, dialect, peer_address(request))


NATIVE_PATHS = ("/ws/hubbub", "/healthz", "/metrics")


#: Path prefixes of the other dialects' routes (README §1), for the ``dialect`` label of refusals.
_DIALECT_PREFIXES: tuple[tuple[str, str], ...] = (
    ("/events/", "ivy"),
    ("/log/", "ivy"),
    ("/stream/", "guble"),
    ("/api/", "guble"),  # after native's /api/v1/ (route_dialect)
    ("/admin/", "guble"),
    ("/wearscript/", "wearscript"),
    ("/mist/", "mist"),
    ("/qpubs/", "qpubs"),
)


def route_dialect(path: str) -> str:
    """The dialect a request path belongs to (README §1), ``http`` when none claims it."""
    if path in NATIVE_PATHS or path.startswith("/api/v1/"):
        return "native"
    if path == "/ws":
        return "ivy"
    if path == "/api":
        return "guble"
    for prefix, dialect in _DIALECT_PREFIXES:
        if path.startswith(prefix):
            return dialect
    return "http"


class SseEncoder:
    key = "native.sse"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return nc.render_sse_event(event, replay, cache)


class NativeHttp:
    """Handlers of the native surface."""

    def __init__(self, node: Core, settings: HttpSettings, registry: CollectorRegistry) -> None:
        self.node = node
        self.s = settings
        self.registry = registry
        self.connections: set[asyncio.Task[Any]] = set()
        # One codec and session encoder per encoding, shared by every WebSocket: neither keeps state of a
        # connection, and a codec's msgpack packer alone allocates a 256 KiB buffer.
        self._codecs = {
            enc: native_codec(enc, settings.max_frame, settings.codec_limits) for enc in ("json", "msgpack")
        }
        self._encoders = {enc: NativeEncoder(codec) for enc, codec in self._codecs.items()}
        #: Links from downstream hubbub nodes (docs/federation.md), when this node takes them.
        self.federation: FederationHub | None = None

    # -- WebSocket --------------------------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        """``/ws/hubbub``: a native connection (or a downstream node's federation link, which names its node)
        on the WebSocket driver, the connection its own wire (:class:`NativeConnection`)."""
        ws = upgradable(request, self.s.max_frame, protocols=NATIVE_PROTOCOLS)
        if ws is None:
            return text_response(400, "websocket upgrade required\n")
        # With auth off the connection is anonymous; a federation link names its node in a header no page
        # can set, and sends no Origin.
        if forbidden := cross_site_upgrade(request, anonymous=self.node.access.authenticator is None):
            return forbidden
        protocol = ws.can_prepare(request).protocol
        if protocol is None:
            return text_response(400, "unsupported subprotocol\n")
        fed = self.federation
        peer = request.headers.get(NODE_HEADER) if fed is not None else None
        if fed is not None and peer is not None and (refused := _federation_upgrade(fed, peer, ws)):
            return refused
        sock, resp = await take_over(request, ws, self.s.max_frame)
        encoding = "msgpack" if protocol.endswith("msgpack") else "json"
        codec = self._codecs[encoding]
        sink = WsSink(sock, sock.transport, encoding == "msgpack")
        if fed is not None and peer is not None:
            conn: NativeConnection = _federation_connection(fed, peer, request, codec, sink, self.s)
        else:
            conn = native_connection(
                self.node,
                codec,
                self.s,
                sink.send,
                sink.close,
                sink.send_many,
                self._encoders[encoding],
                wire=sink,
            )
        conn.upgrade_token = request_token(request)
        conn.peer = peer_address(request)
        detach(request, run_websocket(sock, conn, None, None, bursts=BURST_MAX))
        return resp

    # -- HTTP API ---------------------------------------------------------------------------------------

    def _identity(self, request: web.Request) -> Identity:
        """The request's identity (README §6), or ``AuthError`` 4100/4101/4103, answered 401."""
        return self.node.authenticate(request_token(request), "native", peer_address(request))

    async def publish(self, request: web.Request) -> web.Response:
        ident = self._identity(request)
        channel = route_channel(raw_rest(request, "/api/v1/publish/"), self.s.max_channel_bytes)
        body = await request.read()
        content_type, headers, tags, idem = nc.http_publish_fields(
            request.headers.get("Content-Type"),
            request.query.getall("tag", []),
            list(request.headers.items()),
            request.headers.get("Idempotency-Key", ""),
            **self.s.codec_limits,
        )
        req = AppendRequest(
            channel=channel,
            publisher=Publisher("native", ident.user, secrets.token_hex(8), idem),
            payload=body,
            content_type=content_type,
            headers=headers,
            tags=tags,
            idem=idem,
        )
        r = await self.node.publish(req, identity=ident)
        ev = r.event
        out: dict[str, Any] = {
            "channel": ev.channel,
            "seq": ev.seq,
            "epoch": ev.epoch,
            "time": str(ev.time_ns),
        }
        if r.duplicate:
            out["duplicate"] = True
        return _json(200, orjson.dumps(out) + b"\n")

    async def log_read(self, request: web.Request) -> web.Response:
        ident = self._identity(request)
        channel = route_channel(raw_rest(request, "/api/v1/log/"), self.s.max_channel_bytes)
        self.node.access.check_read(ident, channel, "native")
        q = request.query
        fmt = q.get("format", "json")
        if fmt not in ("json", "jsonl", "msgpack"):
            raise BadRequest("format must be json, jsonl or msgpack")
        since = _int_param(q, "since", 0)
        limit = min(_int_param(q, "limit", 100), 1000)
        from_time = _int_param(q, "from_time", None)
        to_time = _int_param(q, "to_time", None)
        if limit < 0 or since < 0:
            raise BadRequest("since and limit must not be negative")
        epoch = q.get("epoch")

        page = await self.node.read_channel(
            channel, since=since, limit=limit, from_time=from_time, to_time=to_time, epoch=epoch
        )
        info, events = page.info, page.events
        if not page.epoch_matches:
            return _error(
                HubbubError("epoch mismatch", code=4202), position={"seq": info.top, "epoch": info.epoch}
            )
        first = info.first if not info.empty else 0
        body, ctype, extra = nc.render_log(
            info.channel, info.epoch, first, info.top, since < first - 1, events, fmt
        )
        return web.Response(status=200, body=body, headers={"Content-Type": ctype, **extra})

    async def trim(self, request: web.Request) -> web.Response:
        """``POST /api/v1/trim/<channel>?seq=S&epoch=E`` (a hubbub v1 addition, docs/native.md "Admin"): trim
        the events with ``seq <= S`` of the channel's epoch E, its current one or a retired one still holding
        events. The reply is that epoch's position afterwards and whether it is the current one. The store's
        typed trim errors map to statuses: ``TrimEpochGone`` (E is neither) to 409 with the current position,
        ``TrimOutOfRange`` (S beyond the epoch's top) to 400 (code 4001, through the error middleware). Needs
        an admin identity when auth is on (403 otherwise)."""
        self.node.access.check_admin(self._identity(request), "native")
        channel = route_channel(raw_rest(request, "/api/v1/trim/"), self.s.max_channel_bytes)
        q = request.query
        seq = _int_param(q, "seq", None)
        epoch = q.get("epoch", "")
        if seq is None or not epoch:
            raise BadRequest("seq and epoch are required")
        if seq < 0:
            raise BadRequest("seq must not be negative")
        try:
            done = await self.node.trim(channel, epoch, seq)
        except EpochMismatch as exc:
            head = exc.head
            return _error(exc, position={"seq": head.top, "epoch": head.epoch})
        info = done.info
        out = {
            "channel": info.channel,
            "epoch": info.epoch,
            "first": info.first,
            "top": info.top,
            "current": done.current,
        }
        return _json(200, orjson.dumps(out) + b"\n")

    async def channels(self, request: web.Request) -> web.Response:
        ident = self._identity(request)
        pattern = parse_pattern("/" + raw_rest(request, "/api/v1/channels/"), self.s.max_channel_bytes)
        after = request.query.get("after", "")
        limit = min(_int_param(request.query, "limit", 1000), 10000)
        if limit < 0:
            raise BadRequest("limit must not be negative")
        # A hubbub addition (docs/native.md "Admin"): also the channels trimmed (or aged out) to nothing.
        empty = request.query.get("include_empty", "")
        if empty not in ("", "0", "1", "false", "true"):
            raise BadRequest("include_empty must be 0, 1, false or true")
        include_empty = empty in ("1", "true")

        # Channels the identity may not read are left out, as if they held no events.
        infos = await self.node.list_channels(
            pattern, readable_by=ident, after=after, limit=limit, include_empty=include_empty
        )
        out = {
            "channels": [
                {"channel": ci.channel, "epoch": ci.epoch, "first": ci.first, "top": ci.top} for ci in infos
            ]
        }
        return _json(200, orjson.dumps(out) + b"\n")

    async def stream(self, request: web.Request) -> web.StreamResponse:
        """``GET /api/v1/stream/<pattern>``: Server-Sent Events (native.md "SSE"); see :func:`_sse_stream`."""
        return await _sse_stream(self, request, self._identity(request))

    async def healthz(self, request: web.Request) -> web.Response:
        # From state only (Node.health_checks): a probe here would wait as long as an unreachable store does.
        checks = self.node.health_checks()
        if checks:
            return _json(503, orjson.dumps({"status": "fail", "checks": checks}) + b"\n")
        relay = self.node.relay
        broker = relay.health() if relay is not None else {}
        if broker:
            # A node without its broker still serves (from the log, later): degraded, not failed.
            presence = self.node.presence.health()
            up = broker.get("state") == "up" and presence.get("state") != "down"
            body = {"status": "ok" if up else "degraded", "broker": broker, "presence": presence}
            return _json(200, orjson.dumps(body) + b"\n")
        return _json(200, b'{"status":"ok"}\n')

    async def cluster(self, request: web.Request) -> web.Response:
        """``GET /api/v1/cluster``: this node's id, the live nodes and their members (presence heartbeats: a
        node of several workers is one member per worker) and the states of its broker and presence
        (docs/cluster.md); ``{"nodes":[]}`` on a single node. An ``admin`` token (node ids and states are the
        operators'; a monitor without one scrapes ``/metrics``)."""
        self.node.access.check_admin(self._identity(request), "native")
        relay = self.node.relay
        broker = relay.health() if relay is not None else {}
        if not broker:  # a single node, or the workers of one on SQLite
            return _json(200, b'{"nodes":[]}\n')
        member = str(broker.get("node_id"))
        members = await self.node.presence.nodes()
        body = {
            "node_id": member_node(member),
            "member": member,
            "nodes": sorted({member_node(m) for m in members}),
            "members": members,
            "broker": broker,
            "presence": self.node.presence.health(),
        }
        return _json(200, orjson.dumps(body) + b"\n")

    async def metrics(self, request: web.Request) -> web.Response:
        # Any valid token may scrape; /healthz stays open for load balancers. Each consumer's own series
        # only for an identity the core shows them to (admin): the rest is the same for every scraper.
        ident = self._identity(request)
        try:
            await self.node.metrics.read_log()  # the log's counts, on a reader thread (not the loop)
        except HubbubError as exc:
            log.debug("reading the log's counts failed: %s", exc)  # the last counts are shown
        if (svc := self.node.consumers) is not None:
            try:
                await svc.metrics.refresh()  # the journals' backlogs, as the store counts them
            except HubbubError as exc:
                log.debug("reading the consumers' backlogs failed: %s", exc)
        try:
            await self.node.metrics.refresh()  # numbers kept in the log (MQTT's retained messages, sessions)
        except HubbubError as exc:
            log.debug("reading numbers from the log failed: %s", exc)
        body = render_metrics(self.registry, ConsumerSeries(self.node, ident))
        return web.Response(status=200, body=body, headers={"Content-Type": CONTENT_TYPE})


async def _sse_stream(self: NativeHttp, request: web.Request, ident: Identity) -> web.StreamResponse:
    """The SSE stream of one request: a session subscribed to the pattern, drained by a pump."""
    pattern = parse_pattern("/" + raw_rest(request, "/api/v1/stream/"), self.s.max_channel_bytes)
    q = request.query
    tags = nc.http_stream_tags(q.getall("tag", []), **self.s.codec_limits)
    last = _int_param(q, "last", None)
    from_time = _int_param(q, "from_time", None)
    last_id = request.headers.get("Last-Event-ID") or q.get("last_event_id")
    selection: ReplaySpec | EventResume = ReplaySpec(last=last, from_time=from_time)
    if last_id:
        t, epoch, seq, ch = nc.parse_sse_last_event_id(last_id)
        if not pattern.matches(ch):
            raise BadRequest("Last-Event-ID names a channel outside the pattern")
        # Resume after the id's event in the merged order, trimmed channels told as gaps.
        selection = EventResume(ch, Position(seq, epoch), t)
    elif last is not None and from_time is not None:
        raise BadRequest("give at most one of last and from_time")
    if last is not None and last < 1:
        raise BadRequest("last must be at least 1")
    sess = Session(
        "native",
        SseEncoder(),
        max_items=self.s.send_queue,
        max_bytes=self.s.send_queue_bytes,
        overflow=Overflow.DISCONNECT,
        peer=peer_name(request.transport.get_extra_info("peername") if request.transport else None),
    )
    # The stream's events are filtered by the identity's subscribe grant, and it ends at the token's
    # expiry (the session is kicked; the writer sees the end).
    self.node.access.bind(sess, ident)
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    self.node.attach(sess)
    task = asyncio.current_task()
    if task is not None:
        self.connections.add(task)
    writer: asyncio.Task[None] | None = None
    try:
        # The stream's writer belongs to the request's lifetime: it ends with the handler, whatever ends it.
        async with Lifetime() as life:

            def on_snapshot(plan: ReplayPlan) -> None:
                # The subscription is registered now: only from here on may the headers go out (a client
                # that saw them may publish and must then receive its event).
                nonlocal writer
                writer = life.create_task(_sse_writer(self.node, request, sess, resp))
                for g in plan.gaps:
                    sess.push(nc.render_sse_gap(g.channel, g.reason, g.since, g.position))

            def on_replayed(plan: ReplayPlan) -> None:
                sess.push(nc.render_sse_recovered(plan.sent))

            def on_gap(g: Gap) -> None:
                sess.push(nc.render_sse_gap(g.channel, g.reason, g.since, g.position))

            try:
                await self.node.subscribe(
                    sess,
                    "sse",
                    pattern,
                    tags,
                    selection,
                    on_snapshot=on_snapshot,
                    on_replayed=on_replayed,
                    on_gap=on_gap,
                )
                assert writer is not None
                await stopped(writer, self.node, "native", sess.id)
            finally:
                if writer is not None:
                    writer.cancel()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        self.node.detach(sess)
        if task is not None:
            self.connections.discard(task)
    return resp


async def _sse_writer(node: Core, request: web.Request, sess: Session, resp: web.StreamResponse) -> None:
    try:
        await resp.prepare(request)
        await resp.write(b"retry: 2000\n\n")
    except ConnectionError:
        return  # the client went away before the stream began (the pump reports its own I/O failures)

    async def send_many(frames: list[bytes]) -> None:
        await resp.write(b"".join(frames))

    async def end(reason: Disconnect) -> None:
        pass  # the response ends when the handler returns

    pump = SessionPump(
        node,
        sess,
        send=resp.write,
        send_many=send_many,
        close=end,
        max_frame=1 << 20,
        keepalive=(SSE_PING_S, b": ping\n\n"),
    )
    with contextlib.suppress(ConnectionError):  # the client went away: the stream is over
        await pump.run()


def _int_param(q: Any, name: str, default: Any) -> Any:
    v = q.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None


def native_connection(
    node: Core,
    codec: nc.NativeCodec,
    s: HttpSettings,
    send: Callable[[bytes], Awaitable[None]],
    close: Callable[[Disconnect], Awaitable[None]],
    send_many: Callable[[list[bytes]], Awaitable[None]] | None = None,
    encoder: NativeEncoder | None = None,
    wire: Wire | None = None,
    direct: Direct | None = None,
) -> NativeConnection:
    """A native connection (WebSocket or TCP) in ``codec``'s encoding, with the server's limits (``wire``: a
    WebSocket's own framing, ``direct``: a byte stream's writes without waiting, see
    :class:`~hubbub.transports.pump.SessionPump`)."""
    return NativeConnection(
        node,
        codec,
        send=send,
        close=close,
        send_many=send_many,
        wire=wire,
        direct=direct,
        encoder=encoder,
        max_frame=s.max_frame,
        max_subscriptions=s.max_subscriptions,
        send_queue=s.send_queue,
        send_queue_bytes=s.send_queue_bytes,
        ping_interval=s.ping_interval,
    )


def native_codec(encoding: str, max_frame: int, limits: dict[str, int]) -> nc.NativeCodec:
    """A native codec with the server's limits."""
    return nc.NativeCodec(
        "msgpack" if encoding == "msgpack" else "json",
        max_frame=max_frame,
        max_channel_bytes=limits["max_channel_bytes"],
        max_tags=limits["max_tags"],
        max_tag_bytes=limits["max_tag_bytes"],
        max_headers=limits["max_headers"],
        max_header_bytes=limits["max_header_bytes"],
    )


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    """``Server: hubbub``, without versions (aiohttp would announce its own and Python's)."""
    response.headers["Server"] = "hubbub"


#: Adds one dialect's routes to the application (called once, before the application starts).
RouteInstaller = Callable[[web.Application, Core, HttpSettings], None]


def build_app(
    node: Core, settings: HttpSettings, installers: Sequence[RouteInstaller] = ()
) -> tuple[web.Application, NativeHttp]:
    """The aiohttp application with the native routes and each enabled dialect's routes."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(NodeCollector(node))
    registry.register(ConsumerCollector(node))
    native = NativeHttp(node, settings, registry)
    app = web.Application(
        middlewares=[_errors(node), cross_site_guard(settings.cors_origins)],
        client_max_size=settings.max_frame,
    )
    app.on_response_prepare.append(_server_header)
    install_cors(app, settings.cors_origins)  # global: every route, native and dialects alike
    install_cross_site(app, settings.cors_origins)
    app[WS_CONNECTIONS] = native.connections  # every dialect's WebSocket connections (ws_driver.detach)
    app.router.add_get("/ws/hubbub", native.websocket)
    app.router.add_post("/api/v1/publish/{rest:.*}", native.publish)
    app.router.add_get("/api/v1/log/{rest:.*}", native.log_read)
    app.router.add_post("/api/v1/trim/{rest:.*}", native.trim)
    app.router.add_get("/api/v1/channels/{rest:.*}", native.channels)
    app.router.add_get("/api/v1/stream/{rest:.*}", native.stream)
    app.router.add_get("/healthz", native.healthz)
    app.router.add_get("/metrics", native.metrics)
    app.router.add_get("/api/v1/cluster", native.cluster)
    for install in installers:
        install(app, node, settings)
    return app, native


def _federation_upgrade(fed: FederationHub, peer: str, ws: web.WebSocketResponse) -> web.Response | None:
    """A downstream hubbub node's federation link (transports/federation_peer.py) asks to upgrade: the
    refusal (400 for a bad node id, 409 for a cycle), or ``None`` with this node's answer headers set."""
    node_id = parse_node(peer)
    why = "bad federation node id" if node_id is None else fed.refusal(node_id)
    if why is not None:
        return text_response(400 if node_id is None else 409, why + "\n")
    ws.headers.update(fed.upgrade_headers())
    return None


def _federation_connection(
    fed: FederationHub, peer: str, request: web.Request, codec: nc.NativeCodec, sink: WsSink, s: HttpSettings
) -> NativeConnection:
    """The native connection of a downstream node's federation link."""
    return fed.connection(
        peer,
        codec,
        below=request.headers.get(BELOW_HEADER),
        send=sink.send,
        close=sink.close,
        send_many=sink.send_many,
        max_frame=s.max_frame,
        max_subscriptions=s.max_subscriptions,
        send_queue=s.send_queue,
        send_queue_bytes=s.send_queue_bytes,
        ping_interval=s.ping_interval,
    )
