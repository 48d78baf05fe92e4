"""qpubs over HTTP (protocols/qpubs.md §3): ``/qpubs/{listen,once,emit,ignore}`` and the README aliases
``/listen?<t>``, ``/once?<t>``, ``/ignore?<t>``, ``/emit?<t>,<value>``.

A listen (or once) request is one stream: a session of its own with one live subscription (the topic's
pattern; a tail topic subscribes a superset which :class:`StreamEncoder` filters), drained by the shared
:class:`~hubbub.transports.pump.SessionPump` into the response body as NDJSON lines or SSE ``data:``
records, with a heartbeat after ``qpubs.heartbeat_s`` of silence. The headers go out once the subscription
is registered (on its snapshot), so a client that saw them may emit and receive its own event. An emit is
committed to the log before it is answered, with the number of recipients at commit time
(:func:`~hubbub.transports.qpubs_common.recipients`).

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from hubbub.auth import ANONYMOUS, Identity
from hubbub.core.api import ConsumerService, Core, Overflow, ReplayPlan, Session
from hubbub.dialects import qpubs as qpd
from hubbub.disconnect import Disconnect
from hubbub.errors import BadChannel, HubbubError
from hubbub.events import Event
from hubbub.selection import LIVE

from .accept import peer_name
from .cross_site import CHANGING_GETS
from .http import HttpSettings, peer_address, request_token
from .lifetime import Lifetime
from .pump import SessionPump, stopped
from .qpubs_common import DIALECT, QpubsSettings, emit, qpubs_error
from .qpubs_delivered import NodeDelivered

__all__ = ["QpubsHttp", "StreamEncoder"]

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
_ALIASES = ("/listen", "/once", "/ignore", "/emit")
_METHODS = {"listen": "GET", "once": "GET", "emit": "POST", "ignore": "POST"}


def reply(status: int, body: dict[str, Any]) -> web.Response:
    """A one-line JSON answer (§3)."""
    return web.Response(status=status, body=orjson.dumps(body) + b"\n", content_type="application/json")


def fail(status: int, error: str) -> web.Response:
    return reply(status, {"ok": False, "error": error})


class StreamEncoder:
    """One HTTP stream's rendering: ``{"topic":…,"value":…}`` as an NDJSON line or an SSE record, filtered
    by the topic (a tail topic's subscription is a superset). ``once`` renders the first match only and then
    ends the session once that frame is queued. Per connection (``once`` keeps state)."""

    per_connection = True

    def __init__(self, topic: qpd.Topic, sse: bool, once: bool) -> None:
        self.topic = topic
        self.sse = sse
        self.once = once
        self.fired = False
        #: A ``once`` counted in some emit's ``delivered`` already (it fires once, so it counts once).
        self.counted = False
        self.session: Session | None = None
        self.key = f"qpubs.http.{'sse' if sse else 'ndjson'}"

    def wants(self, event: Event) -> bool:
        t = self.topic
        if self.once and self.fired:
            return False
        return not t.filtered or t.matches(qpd.topic_name(event.channel, t.separator))

    def recipients(self, event: Event, subs: Sequence[str]) -> int:
        if self.counted or not self.wants(event):
            return 0
        self.counted = self.once
        return 1

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        if not self.wants(event):
            return b""  # not this stream's: the writer skips empty frames
        line: bytes | None = cache.get("qpubs.item")
        if line is None:
            line = cache["qpubs.item"] = orjson.dumps(qpd.render_item(event, self.topic.separator))
        if self.once:
            self.fired = True
            sess = self.session
            if sess is not None:  # ended once this frame is queued (queueing happens after this returns)
                asyncio.get_running_loop().call_soon(sess.end, Disconnect.NORMAL)
        return b"data: " + line + b"\n\n" if self.sse else line + b"\n"


class QpubsHttp:
    """The qpubs routes of one node. ``connections`` holds the tasks of open streams (the server waits for
    them at shutdown)."""

    def __init__(
        self, node: Core, consumers: ConsumerService | None, settings: QpubsSettings, http: HttpSettings
    ) -> None:
        self.node = node
        self.consumers = consumers
        self.settings = settings
        self.http = http
        #: The other worker processes' part of ``delivered`` (shared with the qrpc listener).
        self.delivered = NodeDelivered(node)
        #: Open streams by listener id (``Qpubs-Listener``): their topic text and session, for ``ignore``.
        self.listeners: dict[str, tuple[str, Session]] = {}
        self.connections: set[asyncio.Task[Any]] = set()

    def install(self, app: web.Application, node: Core, settings: HttpSettings) -> None:
        """The :data:`~hubbub.transports.http.RouteInstaller` of the qpubs routes."""
        app.router.add_route("*", "/qpubs/{op}", self.route)
        for path in _ALIASES:
            app.router.add_route("*", path, self.alias)
        app[CHANGING_GETS].add("/emit")  # GET /emit?<topic>,<value> publishes: another site's <img> may not

    # -- requests --

    def _identity(self, request: web.Request, query_token: bool) -> Identity:
        """The request's identity (§8): README §6 for ``/qpubs/*``; the aliases take only the header (their
        whole query string is the topic). Raises ``AuthError``."""
        if not self.settings.auth:
            return ANONYMOUS
        if query_token:
            token = request_token(request)
        else:
            scheme, _, value = request.headers.get("Authorization", "").partition(" ")
            token = value.strip() if scheme.lower() == "bearer" and value.strip() else None
        return self.node.authenticate(token, DIALECT, peer_address(request))

    async def route(self, request: web.Request) -> web.StreamResponse:
        op = request.match_info["op"]
        if op not in _METHODS:
            return fail(404, "not found")
        if request.method != _METHODS[op]:
            return fail(405, "method not allowed")
        q = request.query
        try:
            ident = self._identity(request, query_token=True)
            if op == "emit":
                return await self._emit(request, ident, q.get("topic"), None, from_body=True)
            if op == "ignore":
                return self._ignore(q.get("topic"), q.get("listener"))
            timeout_ms = qpd.parse_timeout_ms(q.get("timeout_ms")) if op == "once" else 0
            return await self._listen(request, ident, q.get("topic"), op == "once", timeout_ms)
        except qpd.QpubsError as exc:
            return fail(exc.status, exc.message)
        except HubbubError as exc:
            e = qpubs_error(exc)
            return fail(e.status, e.message)

    async def alias(self, request: web.Request) -> web.StreamResponse:
        """``/listen?<t>``, ``/once?<t>``, ``/ignore?<t>``, ``/emit?<t>,<value>`` (GET or POST)."""
        if request.method not in ("GET", "POST"):
            return fail(405, "method not allowed")
        op = request.path[1:]
        raw = request.rel_url.raw_query_string
        try:
            ident = self._identity(request, query_token=False)
            if op == "emit":
                topic, value = qpd.alias_emit(raw)
                return await self._emit(request, ident, topic, value, from_body=False)
            topic = qpd.alias_topic(raw)
            if op == "ignore":
                qpd.parse_topic(topic, self.settings.separator)
                return reply(200, {"ok": True, "removed": 0})
            return await self._listen(request, ident, topic, op == "once", 0)
        except qpd.QpubsError as exc:
            return fail(exc.status, exc.message)
        except HubbubError as exc:
            e = qpubs_error(exc)
            return fail(e.status, e.message)

    async def _emit(
        self, request: web.Request, ident: Identity, topic: object, value: Any, *, from_body: bool
    ) -> web.Response:
        """Publish ``value`` (the alias's), or with ``from_body`` the body read as a JSON value."""
        sep = self.settings.separator
        try:
            channel = qpd.emit_channel(topic, sep, self.http.max_channel_bytes)
        except BadChannel:
            raise qpd.QpubsError("bad topic, expected string", "EBADTOPIC") from None
        if from_body:
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                self.node.limiter.refused("max_frame", DIALECT)
                return fail(413, "too large")
            try:
                value = orjson.loads(body)
            except orjson.JSONDecodeError:
                return fail(400, "bad value, expected JSON")
        delivered = await emit(
            self.node,
            self.consumers,
            channel,
            qpd.encode_value(value),
            identity=ident,
            others=self.delivered.others,
        )
        return reply(200, {"ok": True, "delivered": delivered})

    def _ignore(self, topic: object, listener: str | None) -> web.Response:
        if not isinstance(topic, str):
            raise qpd.QpubsError("bad topic, expected string", "EBADTOPIC")
        hit = self.listeners.get(listener or "")
        if hit is None or hit[0] != topic:
            return reply(200, {"ok": True, "removed": 0})
        hit[1].end(Disconnect.NORMAL)
        del self.listeners[listener or ""]
        return reply(200, {"ok": True, "removed": 1})

    # -- streams --

    async def _listen(
        self, request: web.Request, ident: Identity, text: object, once: bool, timeout_ms: int
    ) -> web.StreamResponse:
        topic = qpd.parse_topic(text, self.settings.separator)
        try:
            pattern = topic.pattern(self.http.max_channel_bytes)
        except BadChannel:
            raise qpd.QpubsError("bad topic, expected string", "EBADTOPIC") from None
        sse = not once and SSE in request.headers.get("Accept", "")
        enc = StreamEncoder(topic, sse, once)
        node = self.node
        sess = enc.session = Session(
            DIALECT,
            enc,
            max_items=self.http.send_queue,
            max_bytes=self.http.send_queue_bytes,
            overflow=Overflow.DROP_OLDEST,  # live streams drop their oldest events (§5)
            slow_close_code=Disconnect.TRY_AGAIN_LATER,
            fault_close_code=Disconnect.INTERNAL_ERROR,
            peer=peer_name(request.transport.get_extra_info("peername") if request.transport else None),
        )
        node.access.bind(sess, ident)
        ctype = "application/json" if once else (SSE if sse else NDJSON)
        resp = web.StreamResponse(
            status=200,
            headers={"Content-Type": ctype, "Cache-Control": "no-cache", "Qpubs-Listener": sess.id},
        )
        node.attach(sess)
        self.listeners[sess.id] = (topic.text, sess)
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
        writer: asyncio.Task[None] | None = None
        timer = None
        if once and timeout_ms > 0:
            timer = asyncio.get_running_loop().call_later(timeout_ms / 1000, sess.end, Disconnect.NORMAL)
        try:
            # The stream's writer belongs to the request's lifetime: it ends with the handler.
            async with Lifetime() as life:

                def on_snapshot(plan: ReplayPlan) -> None:
                    nonlocal writer
                    writer = life.create_task(self._write(request, sess, resp, None if once else sse))

                try:
                    if pattern is None:
                        on_snapshot(ReplayPlan())  # a topic that never matches: a stream that stays silent
                    else:
                        # Live listens have no replay (§7): the log is never read.
                        await node.subscribe(sess, "q", pattern, selection=LIVE, on_snapshot=on_snapshot)
                    assert writer is not None
                    await stopped(writer, node, DIALECT, sess.id)
                finally:
                    if writer is not None:
                        writer.cancel()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            if timer is not None:
                timer.cancel()
            node.detach(sess)
            if self.listeners.get(sess.id, (None, None))[1] is sess:
                del self.listeners[sess.id]
            if task is not None:
                self.connections.discard(task)
        return resp

    async def _write(
        self, request: web.Request, sess: Session, resp: web.StreamResponse, sse: bool | None
    ) -> None:
        """Headers now, then the session's frames until it ends (``sse``: ``None`` for once, whose body must
        stay one JSON line: its keepalive writes nothing and only checks that the client is still there)."""
        try:
            await resp.prepare(request)
        except ConnectionError:
            return  # the client went away before the stream began

        async def send(data: bytes) -> None:
            if data:
                await resp.write(data)
                return
            transport = request.transport
            if transport is None or transport.is_closing():
                raise ConnectionResetError("the client went away")

        async def send_many(frames: list[bytes]) -> None:
            await resp.write(b"".join(frames))

        async def end(reason: Disconnect) -> None:
            pass  # the response ends when the handler returns

        beat = (self.settings.heartbeat_s, b"" if sse is None else b": ping\n\n" if sse else b"\n")
        pump = SessionPump(
            self.node, sess, send=send, send_many=send_many, close=end, max_frame=1 << 20, keepalive=beat
        )
        with contextlib.suppress(ConnectionError):
            await pump.run()
