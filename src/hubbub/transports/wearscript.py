"""WearScript over WebSocket: ``/wearscript/ws`` and ``/wearscript/ws/<secret>`` (protocols/wearscript.md).

hubbub is the WearScript **hub**. The protocol logic (frames, device lists, matching, the test handler) is
the sans-I/O :mod:`hubbub.dialects.wearscript`; this module carries its outputs out:

* :class:`WearscriptService` owns the node's one :class:`~hubbub.dialects.wearscript.WearscriptHub`, the
  connections by hub id, the advertisement of other dialects' subscriptions (through
  :meth:`Node.watch_subscriptions`) and the hub-list broadcast, at most once per 100 ms (§3).
* :class:`WearscriptWire` is one connection, accepted (a device, or a WearScript hub linked below this node)
  or opened by this node (the upstream link, :mod:`hubbub.transports.wearscript_link`): its frames go to
  the dialect, the dialect's ``Publish`` to the log, ``ListenChanged`` to live core subscriptions (one per
  announced channel, so fan-out gives a connection an event once), ``Send``/``Forward`` frames to the
  connections' queues. Data messages reach other WearScript connections through the log and the fan-out,
  like every dialect's events: committed first (§6), never back to the sender (``echo=False``).

Concurrency contract: everything runs on the event loop thread; each connection's frames are handled one
at a time, in order (a ``subscriptions`` frame's core subscriptions exist before the next frame is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

from hubbub.auth import Identity
from hubbub.channels import parse_pattern
from hubbub.core import Encoder, Node, Overflow, ReplayPlan, Session, Subscription
from hubbub.dialects import wearscript as wsd
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, HubbubError, LimitExceeded, ShuttingDown, SubscriptionError
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult, LogStore

from .backpressure import Messages, Socket
from .http import HttpSettings, peer_address, request_token, text_response
from .lifetime import Lifetime
from .pump import SessionPump, keepalive, quietly, stopped

__all__ = [
    "ABOVE_HEADER",
    "HUB_HEADER",
    "WearscriptEncoder",
    "WearscriptService",
    "WearscriptSettings",
    "WearscriptWire",
    "serve",
]

log = logging.getLogger("hubbub.wearscript")

DIALECT = "wearscript"
ROUTE = "/wearscript/ws"
#: The hub list goes out at most this often (§3).
BROADCAST_INTERVAL_S = 0.1
#: Headers of a hubbub WearScript upgrade response (and of the upstream link's request): the hub's id, and
#: the ids of the hubs above it, through its upstream link (hubbub.transports.wearscript_link).
HUB_HEADER = "X-Hubbub-Wearscript-Hub"
ABOVE_HEADER = "X-Hubbub-Wearscript-Above"


@dataclass(frozen=True, slots=True)
class WearscriptSettings:
    """The ``wearscript.*`` configuration keys (docs/dialects/wearscript.md)."""

    group_device: str = wsd.DEFAULT_GROUP_DEVICE
    test_handler: bool = True
    hub_channels: tuple[str, ...] = ()
    advertise_foreign: bool = True
    #: ``wearscript.auth`` resolved: a token is required on the upgrade (§7).
    auth: bool = False
    #: WebSocket keepalive (protocols README §8): a ping this often, close 1001 after this much silence.
    ping_interval_s: float = 30.0
    read_timeout_s: float = 90.0


class WearscriptEncoder:
    """Session encoder: ``[name, *args]`` (mapping.md §5), shared by every WearScript connection."""

    key = DIALECT

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        hit: bytes | None = cache.get(DIALECT)
        if hit is None:
            hit = cache[DIALECT] = wsd.render_event(wsd.name_of(event.channel), event)
        return hit


def _live_only(store: LogStore) -> ReplayPlan:
    """The dialect has no replay (§6): an empty snapshot, so subscribing never reads the log."""
    return ReplayPlan()


def _nothing(plan: ReplayPlan) -> None:
    """No subscribe reply: a device learns nothing back from announcing its list."""


class WearscriptWire:
    """One WearScript connection: the dialect's state machine, its session and its write loop.

    ``publish_headers()`` gives headers added to each event it publishes (the upstream link stamps the
    federation origin); ``encoder`` renders the events it is sent (the link's renders an event that came
    from its peer as an empty frame, which is not sent)."""

    def __init__(
        self,
        service: WearscriptService,
        *,
        send: Callable[[bytes], Awaitable[object]],
        close: Callable[[Disconnect], Awaitable[object]],
        ping: Callable[[], Awaitable[object]],
        encoder: Encoder | None = None,
        publish_headers: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        self.service = service
        node = self.node = service.node
        s = service.http
        self.session = Session(
            DIALECT,
            encoder if encoder is not None else service.encoder,
            max_items=s.send_queue,
            max_bytes=s.send_queue_bytes,
            overflow=Overflow.DROP_OLDEST,  # best effort, no way to report a gap (protocols README §4)
            slow_close_code=Disconnect.TRY_AGAIN_LATER,
            fault_close_code=Disconnect.INTERNAL_ERROR,
            echo=False,  # the sender never gets its own message back (§4 "Self")
        )
        self.proto: wsd.WearscriptConnection | None = None
        self._ping = ping
        self._publish_headers = publish_headers
        self.listening: set[str] = set()
        self.last_recv = time.monotonic()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._group: Lifetime | None = None
        self._writer: asyncio.Task[None] | None = None

        async def send_nonempty(data: bytes) -> None:
            if data:  # an empty frame is an event this connection must not be sent (the link's encoder)
                await send(data)

        self._pump = SessionPump(node, self.session, send=send_nonempty, close=close, max_frame=s.max_frame)

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self, group: Lifetime) -> None:
        """Attach to the node and the hub, queue the greeting, start the writer and keepalive in ``group``."""
        self._group = group
        self.node.attach(self.session)
        self.proto = self.service.join(self)
        self._writer = self._spawn(self._pump.run())
        self._spawn(self._keepalive())
        await self.handle(self.proto.greeting())

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        assert self._group is not None
        t: asyncio.Task[Any] = self._group.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    @property
    def done(self) -> bool:
        s = self.session
        return bool(s.ending or s.kicked or s.closed)

    async def finish(self) -> None:
        """The reader is done: departure notices for the others, a pending close goes out, tasks stop."""
        sess = self.session
        if self.proto is not None:
            for out in self.service.leave(self):  # departure notices go out however this one ended
                if isinstance(out, wsd.Forward):
                    self.service.forward(out)
        if (sess.ending or sess.kicked) and self._writer is not None:
            await stopped(asyncio.wait_for(asyncio.shield(self._writer), 10), self.node, DIALECT, sess.id)
        self.node.detach(sess)
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            await stopped(t, self.node, DIALECT, sess.id)

    # -- inbound ------------------------------------------------------------------------------------------

    async def read(self, ws: Socket) -> None:
        """The connection's frames to the dialect, one at a time, until it ends or the peer goes; read only
        while its replies have room (:class:`Messages`, read-side back-pressure)."""
        proto = self.proto
        assert proto is not None
        try:
            async for msg in Messages(ws, self.session):
                self.last_recv = time.monotonic()
                if msg.type == WSMsgType.BINARY:
                    await self.handle(proto.on_binary(msg.data))
                elif msg.type == WSMsgType.TEXT:
                    await self.handle(proto.on_text())
                elif msg.type == WSMsgType.PING:
                    await ws.pong(msg.data)
                elif msg.type == WSMsgType.PONG:
                    pass
                else:
                    if (
                        msg.type == WSMsgType.ERROR
                        and getattr(msg.data, "code", None) == Disconnect.MESSAGE_TOO_BIG
                    ):
                        # aiohttp refused a frame over limits.max_frame and sent close 1009 itself (§8).
                        self.node.count_bad_input(DIALECT)
                        self.node.limiter.refused("max_frame", DIALECT)
                    break
                if self.done:
                    break
        except ConnectionError:
            pass

    async def handle(self, outputs: list[wsd.Output]) -> None:
        """Carry out the dialect's outputs, in order."""
        service = self.service
        for out in outputs:
            if self.done:
                return
            if isinstance(out, wsd.Send):
                self.session.push(out.data)
            elif isinstance(out, wsd.Forward):
                if out.relayed and out.reply is not None and not self._may_publish(out.reply):
                    return
                service.forward(out, self.proto.id if self.proto is not None else None)
            elif isinstance(out, wsd.Publish):
                await self._publish(out)
            elif isinstance(out, wsd.ListenChanged):
                await self._listen(out.channels)
            elif isinstance(out, wsd.Exists):
                assert self.proto is not None
                await self.handle(self.proto.reply_exists(out.resp, service.exists(out.channel)))
            elif isinstance(out, wsd.HubListChanged):
                service.hub_list_changed()
            elif isinstance(out, wsd.Close):
                self.close(out.code, out.reason)

    def close(self, code: Disconnect, why: str) -> None:
        """Bad input or a refusal: the connection closes (§8), counted and logged at debug level."""
        if code != Disconnect.POLICY_VIOLATION:
            self.node.count_bad_input(DIALECT)
        if code == Disconnect.MESSAGE_TOO_BIG:
            self.node.limiter.refused("max_frame", DIALECT)
        log.debug("closing wearscript connection: %s", why, extra={"session": self.session.id, "code": code})
        self.session.end(code)

    def _may_publish(self, channel: str) -> bool:
        try:
            self.node.access.check_publish(self.session.identity, channel, DIALECT)
        except AuthError:
            self.close(Disconnect.POLICY_VIOLATION, "test-handler reply on a channel not allowed")
            return False
        return True

    async def _listen(self, channels: tuple[str, ...]) -> None:
        """Make the core subscriptions follow the connection's external set (one per channel: its id)."""
        sess, node = self.session, self.node
        want = set(channels)
        for ch in sorted(self.listening - want):
            self.listening.discard(ch)
            with contextlib.suppress(SubscriptionError):  # gone with a detach meanwhile
                node.unsubscribe(sess, ch)
        added = sorted(want - self.listening)
        # All at once: each is registered (and holds live events) as soon as its task starts, so none
        # misses an event published while another's (empty) snapshot is read.
        results = await asyncio.gather(
            *(
                node.subscribe(
                    sess, ch, parse_pattern(wsd.listen_patterns(ch)[0]), on_snapshot=_nothing,
                    planner=_live_only,
                )
                for ch in added
            ),
            return_exceptions=True,
        )  # fmt: skip
        for ch, r in zip(added, results, strict=True):
            if isinstance(r, LimitExceeded):
                self.close(Disconnect.POLICY_VIOLATION, "too many channels")
            elif isinstance(r, SubscriptionError | ShuttingDown):
                pass  # closed meanwhile
            elif isinstance(r, BaseException):
                raise r
            else:
                self.listening.add(ch)

    async def _publish(self, out: wsd.Publish) -> None:
        sess = self.session
        headers: dict[str, str] = self._publish_headers() if self._publish_headers is not None else {}
        if out.head:
            headers[wsd.HEAD_HEADER] = out.head
        req = AppendRequest(
            channel=out.channel,
            publisher=Publisher(DIALECT, sess.user, sess.id, ""),
            payload=out.payload,
            content_type=wsd.CONTENT_TYPE,
            headers=headers,
        )

        def done(r: AppendResult | HubbubError) -> None:
            if isinstance(r, HubbubError):
                # No error reply in WearScript: close (protocols README §5: storage failure → 1011).
                log.warning("wearscript publish failed: %s", r, extra={"session": sess.id})
                sess.end(Disconnect.GOING_AWAY if isinstance(r, ShuttingDown) else Disconnect.INTERNAL_ERROR)

        await self.node.writable()
        try:
            self.node.submit(req, sess, done)
        except (AuthError, LimitExceeded):
            self.close(Disconnect.POLICY_VIOLATION, "publish not allowed")  # §7: dropped, closed 1008
            return
        except ShuttingDown:
            sess.end(Disconnect.GOING_AWAY)
            return

    # -- keepalive ----------------------------------------------------------------------------------------

    async def _keepalive(self) -> None:
        """Ping every ``ping_interval_s``; close with 1001 when nothing arrived for ``read_timeout_s``."""
        st = self.service.settings
        await keepalive(
            self, self.session, self.node, DIALECT, self._ping, st.ping_interval_s, st.read_timeout_s
        )


class WearscriptService:
    """The node's WearScript hub: every connection, the hub list and its broadcast. See the module
    docstring. Create it before the node has sessions (the foreign subscriptions are counted from then)."""

    def __init__(self, node: Node, settings: WearscriptSettings, http: HttpSettings) -> None:
        self.node = node
        self.settings = settings
        self.http = http
        self.encoder = WearscriptEncoder()
        self.hub = wsd.WearscriptHub(
            settings.group_device,
            test_handler=settings.test_handler,
            hub_channels=settings.hub_channels,
            advertise_foreign=settings.advertise_foreign,
        )
        self.wires: dict[int, WearscriptWire] = {}
        #: This hub's id in links between hubs, and the ids of the hubs above it while its link is up.
        self.hub_id = "ws-" + secrets.token_hex(6)
        self.above: list[str] = []
        #: The ids of the hubbub hubs linked up to this one (connections that named their hub), with counts.
        self.below: Counter[str] = Counter()
        self._sent_list = self.hub.hub_list()
        self._last_broadcast = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._unwatch = node.watch_subscriptions(self._watch)

    def close(self) -> None:
        self._unwatch()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- connections --

    def join(self, wire: WearscriptWire) -> wsd.WearscriptConnection:
        proto = wsd.WearscriptConnection(
            self.hub, max_frame=self.http.max_frame, max_channels=self.http.max_subscriptions
        )
        self.wires[proto.id] = wire
        return proto

    def leave(self, wire: WearscriptWire) -> list[wsd.Output]:
        proto = wire.proto
        assert proto is not None
        self.wires.pop(proto.id, None)
        return proto.on_close()

    def forward(self, out: wsd.Forward, asker: int | None = None) -> None:
        """A frame for other connections: ``subscriptions`` frames as they came, test-handler replies to
        the connections that may read their channel. Only the ``asker``'s own reply is an answer to its
        request (a reply: its reads wait for room); for every other connection the frame is traffic it did
        not ask for, queued as an event, so a connection that stops reading loses the oldest of them (its
        overflow policy, counted) instead of being closed 1013 at four times its bound by another's
        requests."""
        may_read = self.node.access.may_read
        for cid in out.targets:
            wire = self.wires.get(cid)
            if wire is None:
                continue
            if out.reply is not None and not may_read(wire.session.identity, out.reply):
                continue
            wire.session.push(out.data, is_event=cid != asker)

    def exists(self, channel: str) -> bool:
        """``exists`` (§5): does any subscription of any dialect match the channel?"""
        return bool(self.node.router.match(channel))

    # -- the hub list --

    def _watch(self, sub: Subscription, added: bool) -> None:
        """Other dialects' subscriptions are advertised (§3); mist tag subscriptions are not."""
        if sub.session.dialect in (DIALECT, "federation") or sub.tags:  # not the federation links: their /**
            return
        hub = self.hub
        if hub.foreign_added(sub.pattern) if added else hub.foreign_removed(sub.pattern):
            self.hub_list_changed()

    def hub_list_changed(self) -> None:
        """Broadcast the hub list now, or when 100 ms have passed since the last broadcast."""
        if self._timer is not None:
            return
        loop = asyncio.get_running_loop()
        wait = self._last_broadcast + BROADCAST_INTERVAL_S - loop.time()
        if wait <= 0:
            self._broadcast()
        else:
            self._timer = loop.call_later(wait, self._broadcast)

    def _broadcast(self) -> None:
        self._timer = None
        self._last_broadcast = asyncio.get_running_loop().time()
        current = self.hub.hub_list()
        if current == self._sent_list:
            return
        self._sent_list = current
        frame = self.hub.hub_list_frame()
        for wire in self.wires.values():
            wire.session.push(frame)

    # -- HTTP --

    def install(self, app: web.Application, node: Node, settings: HttpSettings) -> None:
        """The :data:`~hubbub.transports.http.RouteInstaller` of the WearScript routes."""
        app.router.add_get(ROUTE, self.websocket, allow_head=False)
        app.router.add_get(ROUTE + "/{secret}", self.websocket, allow_head=False)

    def identity(self, request: web.Request) -> Identity | None:
        """The upgrade's identity (§7): the ``<secret>`` path segment, else the header or query token
        (README §6); ``None`` when auth is off for this dialect. Raises ``AuthError``."""
        if not self.settings.auth:
            return None
        token = request.match_info.get("secret") or request_token(request)
        return self.node.authenticate(token, DIALECT, peer_address(request))

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=self.http.max_frame, autoping=False, compress=False)
        ws.headers[HUB_HEADER] = self.hub_id
        ws.headers[ABOVE_HEADER] = ",".join(self.above)
        if not ws.can_prepare(request).ok:
            return text_response(400, "websocket upgrade required\n")
        try:
            ident = self.identity(request)
        except AuthError:
            return text_response(401, "unauthorized\n")
        below = request.headers.get(HUB_HEADER)
        if below and (below == self.hub_id or below in self.above):
            # A hubbub hub linking up from above this one (or this one itself): a cycle (409 tells it so).
            return text_response(409, "this link would close a cycle of hubs\n")
        await ws.prepare(request)  # any Origin, or none (§1)
        if below:
            self.below[below] += 1
        try:
            await serve(self, ws, ident)
        finally:
            if below:
                self.below[below] -= 1
                if self.below[below] <= 0:
                    del self.below[below]
        return ws


async def serve(
    service: WearscriptService,
    ws: Socket,
    ident: Identity | None,
    *,
    encoder: Encoder | None = None,
    publish_headers: Callable[[], dict[str, str]] | None = None,
) -> WearscriptWire:
    """Run one WearScript connection over an open WebSocket (accepted, or opened by the upstream link)
    until it ends; the socket is closed on return."""
    node = service.node

    async def send(data: bytes) -> None:
        await ws.send_bytes(data)

    async def close(code: Disconnect) -> None:
        await ws.close(code=wsd.wire_close(code))

    async def ping() -> None:
        await ws.ping()

    wire = WearscriptWire(
        service, send=send, close=close, ping=ping, encoder=encoder, publish_headers=publish_headers
    )
    if ident is not None:
        # Bound before the session is attached: its subscriptions see the token's permissions, and its
        # expiry closes it (1008).
        node.access.bind(wire.session, ident)
    try:
        async with Lifetime() as group:
            await wire.start(group)
            try:
                await wire.read(ws)
            finally:
                await wire.finish()
    except (asyncio.CancelledError, ConnectionError):
        pass
    finally:
        if not ws.closed:
            sess = wire.session
            code = wsd.wire_close(sess.kicked or sess.ending or Disconnect.GOING_AWAY)
            await quietly(lambda: ws.close(code=code), node, DIALECT, sess.id, "close")
    return wire
