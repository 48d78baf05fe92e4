"""WearScript over WebSocket: ``/wearscript/ws`` and ``/wearscript/ws/<secret>`` (protocols/wearscript.md).

hubbub is the WearScript **hub**. The protocol logic (frames, device lists, matching, the test handler) is
the sans-I/O :mod:`hubbub.dialects.wearscript`; this module carries its outputs out:

* :class:`WearscriptService` owns the node's one :class:`~hubbub.dialects.wearscript.WearscriptHub`, the
  connections by hub id, the advertisement of other dialects' subscriptions (through
  :meth:`Node.watch_subscriptions`) and the hub-list broadcast, at most once per 100 ms (§3).
* :class:`~hubbub.transports.wearscript_peers.HubPeers` makes the hubs of a node's worker processes one
  hub: device lists, departures, advertised names and test-handler replies cross between them.
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
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hubbub.auth import Identity
from hubbub.core.api import Core, Encoder, Subscription
from hubbub.dialects import actions as a
from hubbub.dialects import wearscript as wsd
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, LimitExceeded
from hubbub.events import Event

from .backpressure import Socket
from .http import HttpSettings, peer_address, request_token, text_response
from .wearscript_peers import HubPeers
from .wire import DialectWire
from .ws_driver import detach, run_websocket, upgradable
from .ws_socket import WsSocket, take_over

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


class WearscriptWire:
    """One WearScript connection's binding: the dialect's state machine on a
    :class:`~hubbub.transports.wire.DialectWire`, with the handlers of WearScript's own actions.

    ``publish_headers()`` gives headers added to each event it publishes (the upstream link stamps the
    federation origin); ``encoder`` renders the events it is sent (the link's renders an event that came
    from its peer as an empty frame, which is not sent)."""

    def __init__(
        self,
        service: WearscriptService,
        *,
        send: Callable[[bytes], Awaitable[object]],
        close: Callable[[Disconnect], Awaitable[object]],
        encoder: Encoder | None = None,
        publish_headers: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        self.service = service
        s = service.http
        self.wire = DialectWire(
            service.node,
            wsd.SPEC,
            dialect=DIALECT,
            encoder=encoder if encoder is not None else service.encoder,
            send_queue=s.send_queue,
            send_queue_bytes=s.send_queue_bytes,
            max_frame=s.max_frame,
            send=send,
            close=close,
            refused=wsd.refused,
            echo=False,  # the sender never gets its own message back (§4 "Self")
        )
        self.session = self.wire.session
        #: Greeted: sent its greeting (before, it is sent nothing else; the greeting holds what came
        #: meanwhile), and the hub list it was last sent.
        self.greeted = False
        self.hub_list: list[str] | None = None
        self.proto = service.join(self)
        self._publish_headers = publish_headers
        self.listening: set[str] = set()
        self.wire.handle(
            {
                wsd.Forward: self._forward,
                wsd.Publish: self._publish,
                wsd.ListenChanged: self._listen,
                wsd.Exists: self._exists,
                wsd.HubListChanged: self._hub_list_changed,
            }
        )

    async def greet(self) -> None:
        await self.service.peers.sync()  # the node's other workers' devices and names, as they are now
        greeting = self.proto.greeting()
        self.greeted = True
        self.hub_list = self.service.hub.hub_list()
        await self.wire.run(greeting)

    def depart(self) -> None:
        """The reader is done: departure notices for the others, however this one ended."""
        for out in self.service.leave(self):
            if isinstance(out, wsd.Forward):
                self.service.forward(out)

    async def _forward(self, out: wsd.Forward) -> None:
        if out.relayed and out.reply is not None and not self._may_publish(out.reply):
            return
        self.service.forward(out, self.proto.id)

    async def _exists(self, out: wsd.Exists) -> None:
        await self.wire.run(self.proto.reply_exists(out.resp, self.service.exists(out.channel)))

    async def _hub_list_changed(self, out: wsd.HubListChanged) -> None:
        self.service.hub_list_changed()

    def _may_publish(self, channel: str) -> bool:
        try:
            self.wire.node.access.check_publish(self.session.identity, channel, DIALECT)
        except AuthError:
            self.wire.close(Disconnect.POLICY_VIOLATION, "test-handler reply on a channel not allowed")
            return False
        return True

    async def _listen(self, out: wsd.ListenChanged) -> None:
        """Make the core subscriptions follow the connection's external set (one per channel: its id)."""
        want = set(out.channels)
        for ch in sorted(self.listening - want):
            self.listening.discard(ch)
            await self.wire.run([a.Unsubscribe(ch)])
        added = sorted(want - self.listening)
        subs = [a.Subscribe(ch, wsd.listen_patterns(ch)[0]) for ch in added]
        for ch, r in zip(added, await self.wire.subscribe(subs), strict=True):
            if isinstance(r, LimitExceeded):
                self.wire.close(Disconnect.POLICY_VIOLATION, "too many channels")
            elif r is None:
                self.listening.add(ch)
            # else: SubscriptionError, ShuttingDown: closed meanwhile
        self.service.peers.subscribed(self.proto.id)  # the other processes may send to it now

    async def _publish(self, out: wsd.Publish) -> None:
        headers: dict[str, str] = self._publish_headers() if self._publish_headers is not None else {}
        if out.head:
            headers[wsd.HEAD_HEADER] = out.head
        await self.wire.publish(out, a.Publish(out.channel, out.payload, wsd.CONTENT_TYPE, headers))


class WearscriptService:
    """The node's WearScript hub: every connection, the hub list and its broadcast. See the module
    docstring. Create it before the node has sessions (the foreign subscriptions are counted from then)."""

    def __init__(self, node: Core, settings: WearscriptSettings, http: HttpSettings) -> None:
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
        self._last_broadcast = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._unwatch = node.watch_subscriptions(self._watch)
        self.peers = HubPeers(self)

    def close(self) -> None:
        self._unwatch()
        self.peers.close()
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
        self.wires.pop(wire.proto.id, None)
        return wire.proto.on_close()

    def forward(self, out: wsd.Forward, asker: int | None = None, *, local_only: bool = False) -> None:
        """A frame for other connections: ``subscriptions`` frames as they came, test-handler replies to
        the connections that may read their channel. Only the ``asker``'s own reply is an answer to its
        request (a reply: its reads wait for room); for every other connection the frame is traffic it did
        not ask for, queued as an event, so a connection that stops reading loses the oldest of them (its
        overflow policy, counted) instead of being closed 1013 at four times its bound by another's
        requests. A reply that matches other processes' connections goes to them too (``local_only``: a
        reply from another process, for this one's connections alone)."""
        may_read = self.node.access.may_read
        remote = False
        for cid in out.targets:
            wire = self.wires.get(cid)
            if wire is None:
                remote = remote or self.hub.is_remote(cid)
                continue
            if not wire.greeted:
                continue  # its greeting, computed later, holds the change
            if out.reply is not None and not may_read(wire.session.identity, out.reply):
                continue
            wire.session.push(out.data, is_event=cid != asker)
        if remote and out.reply is not None and not local_only:
            self.peers.reply(out)

    def exists(self, channel: str) -> bool:
        """``exists`` (§5): does any subscription of any dialect match the channel?"""
        return bool(self.node.matching(channel))

    # -- the hub list --

    def _watch(self, sub: Subscription, added: bool) -> None:
        """Other dialects' subscriptions are advertised (§3); mist tag subscriptions are not."""
        if sub.session.dialect in (DIALECT, "federation") or sub.tags:  # not the federation links: their /**
            return
        hub = self.hub
        if hub.foreign_added(sub.pattern) if added else hub.foreign_removed(sub.pattern):
            self.hub_list_changed()
            self.peers.names_changed()

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
        frame = self.hub.hub_list_frame()
        for wire in self.wires.values():
            if wire.greeted and wire.hub_list != current:  # (a greeting may have had it already)
                wire.hub_list = current
                wire.session.push(frame)

    # -- HTTP --

    def install(self, app: web.Application, node: Core, settings: HttpSettings) -> None:
        """The :data:`~hubbub.transports.http.RouteInstaller` of the WearScript routes."""
        for path in wsd.SPEC.ws_routes:
            app.router.add_get(path, self.websocket, allow_head=False)

    def identity(self, request: web.Request) -> Identity | None:
        """The upgrade's identity (§7): the ``<secret>`` path segment, else the header or query token
        (README §6); ``None`` when auth is off for this dialect. Raises ``AuthError``."""
        if not self.settings.auth:
            return None
        token = request.match_info.get("secret") or request_token(request)
        return self.node.authenticate(token, DIALECT, peer_address(request))

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        headers = {HUB_HEADER: self.hub_id, ABOVE_HEADER: ",".join(self.above)}
        ws = upgradable(request, self.http.max_frame, headers)
        if ws is None:
            return text_response(400, "websocket upgrade required\n")
        # No cross-site check (transports/cross_site.py ``cross_site_upgrade``): WearScript's protocol
        # promises its clients any Origin, a foreign one too (docs/security.md "Cross-site requests").
        try:
            ident = self.identity(request)
        except AuthError:
            return text_response(401, "unauthorized\n")
        below = request.headers.get(HUB_HEADER)
        if below and (below == self.hub_id or below in self.above):
            # A hubbub hub linking up from above this one (or this one itself): a cycle (409 tells it so).
            return text_response(409, "this link would close a cycle of hubs\n")
        sock, resp = await take_over(request, ws, self.http.max_frame)
        if below:
            self.below[below] += 1

        async def run() -> None:
            try:
                await serve(self, sock, ident)
            finally:
                if below:
                    self.below[below] -= 1
                    if self.below[below] <= 0:
                        del self.below[below]

        detach(request, run())
        return resp


async def serve(
    service: WearscriptService,
    ws: Socket | WsSocket,
    ident: Identity | None,
    *,
    encoder: Encoder | None = None,
    publish_headers: Callable[[], dict[str, str]] | None = None,
) -> WearscriptWire:
    """Run one WearScript connection over an open WebSocket (accepted, or opened by the upstream link)
    until it ends; the socket is closed on return."""

    async def send(data: bytes) -> None:
        await ws.send_bytes(data)

    async def close(code: Disconnect) -> None:
        await ws.close(code=wsd.wire_close(code))

    wearscript = WearscriptWire(
        service, send=send, close=close, encoder=encoder, publish_headers=publish_headers
    )
    st = service.settings
    await run_websocket(
        ws,
        wearscript.wire,
        wearscript.proto,
        ident,  # bound before the session is attached: its expiry closes it (1008)
        keepalive_s=(st.ping_interval_s, st.read_timeout_s),
        started=wearscript.greet,
        finishing=wearscript.depart,
    )
    return wearscript
