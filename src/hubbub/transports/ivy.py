"""Ivy over HTTP: the WebSocket at ``/ws`` and the log views and publish at ``/events/`` and ``/log/``.

:func:`ivy_installer` returns the :data:`~hubbub.transports.http.RouteInstaller` that ``server.py`` adds
when ``ivy.enabled`` is true. The protocol logic lives in :mod:`hubbub.dialects.ivy`; this module only
moves frames and requests between aiohttp, the codec and the node.

Concurrency contract: everything runs on the event loop thread; the log reads (the core API's
``read_channel``, ``head``, ``list_channels``) run on the node's reader threads.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

from aiohttp import WSMsgType, web

from hubbub.core.api import LIST_LIMIT, Core
from hubbub.dialects import ivy
from hubbub.disconnect import Disconnect
from hubbub.errors import (
    AuthError,
    BadChannel,
    BadRequest,
    HubbubError,
    LimitExceeded,
)
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest

from .binding import Mounted, Wiring
from .cross_site import cross_site_upgrade
from .http import HttpSettings, RouteInstaller, raw_rest, request_identity, text_response
from .wire import DialectWire
from .ws_driver import detach, run_websocket, upgradable
from .ws_socket import take_over
from .ws_write import WsSink

__all__ = ["IvyEncoder", "IvySettings", "ivy_installer"]

log = logging.getLogger("hubbub.ivy")

DIALECT = "ivy"
PREFIXES = ("/events/", "/log/")
IMMUTABLE = "public, max-age=31536000, immutable"
IMMUTABLE_PRIVATE = "private, max-age=31536000, immutable"
PAGE = 1000


@dataclass(frozen=True, slots=True)
class IvySettings:
    """The ``ivy.*`` configuration keys (docs/dialects/ivy.md)."""

    large_event_bytes: int = ivy.DEFAULT_LARGE_EVENT_BYTES
    ping_interval_s: float = 54.0
    read_timeout_s: float = 60.0
    #: Largest log-read body, in bytes, before the read is refused with 413 (a bound on memory).
    max_log_bytes: int = 64 << 20
    #: ``ivy.auth`` resolved: a token is required on the upgrade and on every ``/events/`` request (§8).
    auth: bool = False


class IvyEncoder:
    """Session encoder: every ivy session with the same large-event threshold shares the rendering."""

    def __init__(self, codec: ivy.IvyCodec) -> None:
        self.codec = codec
        self.key = codec.key

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return self.codec.encode_event(event, cache)


class IvyHttp:
    """The handlers of the ivy routes."""

    def __init__(self, node: Core, settings: HttpSettings, ivy_settings: IvySettings) -> None:
        self.node = node
        self.s = settings
        self.ivy = ivy_settings

    # -- WebSocket ----------------------------------------------------------------------------------------

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        ws = upgradable(request, self.s.max_frame, protocols=(ivy.SUBPROTOCOL,))
        if ws is None:
            return text_response(400, "websocket upgrade required\n")
        if forbidden := cross_site_upgrade(request, anonymous=not self.ivy.auth):
            return forbidden
        try:
            ident = request_identity(self.node, request, DIALECT, self.ivy.auth)
        except AuthError:
            return text_response(401, "unauthorized\n")
        sock, resp = await take_over(request, ws, self.s.max_frame)
        codec = ivy.IvyCodec(
            max_frame=self.s.max_frame,
            max_channel_bytes=self.s.max_channel_bytes,
            large_event_bytes=self.ivy.large_event_bytes,
        )
        conn = ivy.IvyConnection(codec)
        node = self.node

        async def send(data: bytes) -> None:
            await sock.send_frame(data, WSMsgType.TEXT)

        async def close(code: Disconnect) -> None:
            await sock.close(code=ivy.wire_close(code))

        def refused(cmd: object, exc: HubbubError) -> Sequence[object]:
            if isinstance(exc, AuthError | LimitExceeded):  # ivy counts a refused command as bad input
                node.metrics.count_bad_input(DIALECT)
            return conn.refused(cmd, exc)

        wire = DialectWire(
            node,
            ivy.SPEC,
            dialect=DIALECT,
            encoder=IvyEncoder(codec),
            send_queue=self.s.send_queue,
            send_queue_bytes=self.s.send_queue_bytes,
            max_frame=self.s.max_frame,
            send=send,
            close=close,
            refused=refused,
            failed=lambda: conn.failed,
            echo=False,  # the publishing connection never receives its own event (ivy.md §4)
            # Bursts in one write, fan-out runs framed once for every ivy socket (an event is never dropped
            # with an empty frame here: IvyEncoder renders every one).
            wire=WsSink(sock, sock.transport, False),
        )

        async def greet() -> None:
            await wire.run(conn.greeting(wire.session.id))

        # The identity is bound before the session is attached: its subscriptions see the token's
        # permissions, and its expiry closes it (1008).
        keepalive_s = (self.ivy.ping_interval_s, self.ivy.read_timeout_s)
        detach(request, run_websocket(sock, wire, conn, ident, keepalive_s=keepalive_s, started=greet))
        return resp

    # -- /events/ and /log/ -------------------------------------------------------------------------------

    def events_handler(self, prefix: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            if request.method == "GET":
                return await self.log_read(request, prefix)
            if request.method == "POST":
                return await self.publish(request, prefix)
            return text_response(404, "Not Found\n")

        return handler

    async def publish(self, request: web.Request, prefix: str) -> web.Response:
        try:
            ident = request_identity(self.node, request, DIALECT, self.ivy.auth)
        except AuthError:
            return text_response(401, "unauthorized\n")
        try:
            channel = ivy.publish_path(raw_rest(request, prefix), self.s.max_channel_bytes)
        except BadChannel:
            return text_response(400, "invalid path\n")
        try:
            form = await request.post()
        except web.HTTPException:
            raise  # 413 from client_max_size: the shared error middleware answers it
        except Exception:
            return text_response(400, "invalid form body\n")
        data = form.get("data")
        if data is None:
            payload = b""
        elif isinstance(data, str):
            payload = data.encode("utf-8", "replace")
        elif isinstance(data, bytes | bytearray):
            payload = bytes(data)
        else:  # a file part (FormData with a Blob)
            payload = data.file.read()
        sid = form.get("sid")
        sid = sid if isinstance(sid, str) else ""
        origin = self.node.session_by_id(sid) if sid else None
        if origin is not None and origin.dialect != DIALECT:
            origin = None
        req = AppendRequest(
            channel=channel,
            publisher=Publisher(DIALECT, ident.user, sid, ""),
            payload=payload,
            content_type=ivy.CONTENT_TYPE,
        )
        try:
            # The request's own identity decides, not that of the connection its sid names.
            await self.node.publish(req, origin, identity=ident)
        except AuthError:
            return text_response(403, "forbidden\n")
        except LimitExceeded:
            return text_response(429, "too many requests\n")
        except HubbubError as exc:
            log.warning("ivy HTTP publish failed: %s", exc)
            return text_response(503, "unavailable\n")
        return web.Response(status=200, body=b"")

    async def log_read(self, request: web.Request, prefix: str) -> web.Response:
        try:
            ident = request_identity(self.node, request, DIALECT, self.ivy.auth)
        except AuthError:
            return text_response(401, "unauthorized\n")
        try:
            lp = ivy.parse_log_path(raw_rest(request, prefix), self.s.max_channel_bytes)
        except BadRequest:
            return text_response(400, "invalid glob path\n")
        # Log reads check the subscribe permission (README §6): an exact channel the token may not read is
        # refused; a glob leaves out the channels it may not read, as if they held no events.
        visible: Callable[[str], bool] | None = None
        if lp.pattern is None:
            try:
                self.node.access.check_read(ident, lp.channel, DIALECT)
            except AuthError:
                return text_response(403, "forbidden\n")
        else:
            visible = self.node.access.visibility(ident, lp.pattern)
        q = request.query
        try:
            n = ivy.parse_count(q.get("n"))
        except BadRequest:
            return text_response(400, "invalid line count\n")
        at = q.get("at")
        rng = ivy.at_range(at) if at is not None else None
        nothing = at is not None and rng is None
        try:
            top_time, lines, newest = await _read_log(
                self.node, lp, n, rng, nothing, self.ivy.max_log_bytes, visible
            )
        except _TooLarge:
            return text_response(413, "log too large: narrow the read with ?n= or ?at=\n")
        except HubbubError as exc:
            log.warning("ivy log read failed: %s", exc)
            return text_response(503, "unavailable\n")
        cache = IMMUTABLE if at is not None and ivy.immutable_at(rng, top_time) else "no-cache"
        if self.ivy.auth and cache == IMMUTABLE:
            cache = IMMUTABLE_PRIVATE  # a shared cache must not serve one token's read to another
        headers = {"Content-Type": "text/plain", "Accept-Ranges": "bytes", "Cache-Control": cache}
        if not lines:
            return web.Response(status=200, body=b"", headers=headers)
        newest_s = newest // 1_000_000_000
        headers["Last-Modified"] = formatdate(newest_s, usegmt=True)
        ims = request.headers.get("If-Modified-Since")
        if ims is not None and _not_modified(ims, newest_s):
            headers.pop("Content-Type")
            return web.Response(status=304, headers=headers)
        body = b"\n".join(lines)
        rh = request.headers.get("Range")
        if rh is not None:
            r = ivy.parse_range(rh, len(body))
            if r is False:
                headers["Content-Range"] = f"bytes */{len(body)}"
                return web.Response(status=416, body=b"", headers=headers)
            if isinstance(r, tuple):
                a, b = r
                headers["Content-Range"] = f"bytes {a}-{b}/{len(body)}"
                return web.Response(status=206, body=body[a : b + 1], headers=headers)
        return web.Response(status=200, body=body, headers=headers)


def _not_modified(ims: str, newest_s: int) -> bool:
    try:
        since = parsedate_to_datetime(ims)
    except (TypeError, ValueError, IndexError):
        return False
    if since.tzinfo is None:
        return False
    return since.timestamp() >= newest_s


class _TooLarge(Exception):
    """The log read would exceed ``ivy.max_log_bytes``."""


async def _events(
    node: Core, channel: str, n: int | None, rng: tuple[int, int] | None
) -> AsyncIterator[Event]:
    """The channel's events oldest first: in the ``at`` range if given; without one, from the n-th last."""
    after = 0
    lo: int | None = None
    hi: int | None = None
    if rng is not None:
        lo, hi = rng
    elif n is not None:
        info = await node.head(channel)
        if info.empty:
            return
        # Retained events are contiguous from ``first`` to ``top``: start right before the n-th last.
        after = max(info.first - 1, info.top - n, 0)
    while True:
        page = (await node.read_channel(channel, since=after, limit=PAGE, from_time=lo, to_time=hi)).events
        for ev in page:
            yield ev
        if len(page) < PAGE:
            return
        after = page[-1].seq


async def _channels(node: Core, lp: ivy.LogPath) -> AsyncIterator[str]:
    """The read's channel, or every channel its glob matches in byte order, listed a page at a time (a glob
    over more channels than one listing returns reads them all)."""
    pattern = lp.pattern
    if pattern is None:
        yield lp.channel
        return
    after = ""
    while True:
        page = await node.list_channels(pattern, after=after, limit=LIST_LIMIT)
        for ci in page:
            yield ci.channel
        if len(page) < LIST_LIMIT:
            return
        after = page[-1].channel


async def _read_log(
    node: Core,
    lp: ivy.LogPath,
    n: int | None,
    rng: tuple[int, int] | None,
    nothing: bool,
    max_bytes: int,
    visible: Callable[[str], bool] | None = None,
) -> tuple[int, list[bytes], int]:
    """(top_time read first, the rendered lines, the newest returned time), through the node's typed reads:
    a page of at most ``PAGE`` events per reader-thread hop, rendered on the loop. A glob reads only the
    channels ``visible`` accepts (all when it is ``None``)."""
    top_time = await node.top_time()
    if nothing:
        return top_time, [], 0
    lines: list[bytes] = []
    total = 0
    newest = 0
    async for ch in _channels(node, lp):
        if visible is not None and not visible(ch):
            continue
        kept: deque[tuple[int, bytes]] = deque()
        size = 0
        async for ev in _events(node, ch, n, rng):
            line = ivy.render_log_line(ev).encode()
            kept.append((ev.time_ns, line))
            size += len(line) + 1
            if n is not None and len(kept) > n:
                size -= len(kept.popleft()[1]) + 1
            if total + size > max_bytes + 1:
                raise _TooLarge
        for t, line in kept:
            newest = max(newest, t)
            lines.append(line)
        total += size
    return top_time, lines, newest


def ivy_installer(ivy_settings: IvySettings) -> RouteInstaller:
    """The installer of the ivy routes, for ``build_app``."""

    def install(app: web.Application, node: Core, settings: HttpSettings) -> None:
        h = IvyHttp(node, settings, ivy_settings)
        app.router.add_get("/ws", h.websocket, allow_head=False)
        for prefix in PREFIXES:
            app.router.add_route("*", prefix + "{rest:.*}", h.events_handler(prefix))

    return install


async def mount(w: Wiring) -> Mounted:
    """ivy's binding (``ivy.SPEC``): its settings from the ``ivy`` section, its routes."""
    cfg = w.config.section(ivy.IvyConfig)
    settings = IvySettings(
        large_event_bytes=cfg.large_event_bytes,
        ping_interval_s=cfg.ping_interval_s,
        read_timeout_s=cfg.read_timeout_s,
        max_log_bytes=cfg.max_log_bytes,
        auth=w.auth("ivy"),
    )
    return Mounted(ivy.SPEC, ivy_installer(settings))
