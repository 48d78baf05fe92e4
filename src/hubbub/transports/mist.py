"""Mist, both generations (protocols/mist.md): the WebSocket routes, ``/mist/ping`` and the connection wiring
shared with the TCP listener (:mod:`hubbub.transports.mist_tcp`).

The protocol logic is the sans-I/O :mod:`hubbub.dialects.mist`; this module carries its outputs out:

* :class:`MistService` is the node's mist state: the token registry (``data_dir/mist-tokens.json``), which
  tokens mist accepts (§8), the open connections, the shared session encoders,
  and the HTTP routes ``/mist/ws`` (2015), ``/mist/v1/ws`` (1.x) and ``/mist/ping``.
* :class:`MistWire` is one connection of either generation over either transport: ``Send`` outputs go to
  its session's queue, ``Publish`` to the log (committed before delivery, §6), ``Subscribe`` to a live core
  subscription ``/**`` with the tag set (the router's tag index matches it, §5), the registry commands to
  the registry (admin permission through ``node.access``), ``Authenticate`` to :meth:`MistService.login`.
  A :class:`~hubbub.transports.pump.SessionPump` writes the queue; every task of the connection belongs to
  the :class:`~hubbub.transports.lifetime.Lifetime` of its handler.

``who`` and ``listall`` read the node's presence (:mod:`hubbub.core.presence`; ``Node.presence``), so they
answer for the whole cluster on a cluster node and for this node alone otherwise: every accepted connection
adds one to the counter :data:`CONNECTIONS`, and a connection holding at least one subscription is a member of
the roster :data:`SUBSCRIBERS` (key: its session id; field ``tags``: the distinct tags of its subscriptions,
a sorted JSON array), joined on its first subscription and left on its last unsubscribe or close.

Concurrency contract: everything runs on the event loop thread; a connection's input is handled one piece at
a time, in order (a subscription exists in the core before the next command is read). Registry writes (an
fsync each) run on the default executor.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from aiohttp import WSMsgType, web

from hubbub.auth import ANONYMOUS, EVERYTHING, NOTHING, Authenticator, Identity
from hubbub.auth.mist_registry import MistAuthenticator, MistTokenRegistry
from hubbub.core.api import Core
from hubbub.dialects import actions as a
from hubbub.dialects import mist as md
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, HubbubError, LimitExceeded, RateLimited
from hubbub.events import Event

from .cross_site import cross_site_upgrade
from .http import HttpSettings, peer_address, request_token, text_response
from .lifetime import Lifetime
from .wire import DialectWire
from .ws_driver import detach, run_websocket, upgradable
from .ws_socket import take_over

__all__ = [
    "MistEncoder",
    "MistService",
    "MistSettings",
    "MistWire",
    "Proto",
    "mist_token",
]

log = logging.getLogger("hubbub.mist")

DIALECT: Final = "mist"
WS_2015: Final = "/mist/ws"
WS_1: Final = "/mist/v1/ws"
PING: Final = "/mist/ping"
#: Every mist subscription is ``/**`` with a tag set (mist.md §5: events of every channel).
_EVERY_CHANNEL: Final = "/**"
#: The identity of ``mist.token`` (the upstream master token): everything, the registry included.
MASTER: Final = Identity("", EVERYTHING, EVERYTHING, admin=True, via="mist-token")
#: The identity of a 2015 WebSocket client with a registry token: it reads (through its tag check) only.
REGISTRY_READER: Final = Identity("", NOTHING, EVERYTHING, admin=False, via="mist-registry")

Proto: TypeAlias = md.Mist2015Connection | md.Mist2015WsConnection | md.Mist1Connection | md.Mist1WsConnection
#: The presence counter of mist connections accepted (``who``'s first number, summed over the nodes).
CONNECTIONS: Final = "mist.connections"
#: The presence roster of mist connections holding a subscription (``who``'s second number; ``listall``).
SUBSCRIBERS: Final = "mist.subscribers"


@dataclass(frozen=True, slots=True)
class MistSettings:
    """The ``mist.*`` keys resolved (docs/dialects/mist.md); limits are the shared ``limits.*``."""

    channel: str = md.DEFAULT_CHANNEL
    #: ``mist.auth`` resolved: tokens are checked (§8).
    auth: bool = False
    #: ``mist.token``: an extra master token ("" for none).
    token: str = ""
    max_tags: int = md.DEFAULT_MAX_TAGS
    max_tag_bytes: int = md.DEFAULT_MAX_TAG_BYTES
    #: WebSocket keepalive (protocols README §8): a ping this often, close 1001 after this much silence.
    ping_interval_s: float = 30.0
    read_timeout_s: float = 90.0


class MistEncoder:
    """Session encoder of one rendering (2015 line, 2015 WS, 1.x), shared by every connection using it.

    ``replica`` is the encoder of a 2015 replication peer: an event another peer published renders as an
    empty frame, which the wire does not send (mist.md §5)."""

    __slots__ = ("_render", "key", "replica")

    def __init__(self, key: str, render: Callable[[Event], bytes], replica: bool = False) -> None:
        self.key = key + ".replica" if replica else key
        self._render = render
        self.replica = replica

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        if self.replica and md.REPLICA_HEADER in event.headers:
            return b""
        hit: bytes | None = cache.get(self.key)
        if hit is None:
            hit = cache[self.key] = self._render(event)
        return hit


def _sub_id(tags: frozenset[str]) -> str:
    # The tag set identifies the subscription (one per distinct set per connection); \x1f cannot be confused
    # with a tag boundary the way "," could (1.x tags may hold commas).
    return "\x1f".join(sorted(tags))


def _is_error_reply(proto: Proto, data: bytes) -> bool:
    """Whether a dialect reply is an error answer (counted as bad input). Replies carry no event, so the
    error marker can only be the dialect's own: a 2015 ``error`` line, a 2015 WS ``"success":false``, a
    1.x ``"error"`` key (JSON escapes any quote inside a string, so the raw key cannot come from data)."""
    if isinstance(proto, md.Mist2015Connection):
        return data.startswith(b"error ")
    if isinstance(proto, md.Mist2015WsConnection):
        return data.startswith(b'{"success":false')
    return b'"error":"' in data


class MistWire:
    """One mist connection's binding: the dialect's state machine on a
    :class:`~hubbub.transports.wire.DialectWire`, with the handlers of mist's own actions (tag
    subscriptions, the roster, ``listall``/``who``, the token registry, authentication).

    ``send`` writes one frame (a TCP write or a WebSocket frame), ``close`` closes the connection, and
    ``send_many`` (TCP) writes several frames at once: one write for a burst, where an empty frame (a replica
    event for a replication peer) adds nothing."""

    def __init__(
        self,
        service: MistService,
        proto: Proto,
        *,
        send: Callable[[bytes], Awaitable[object]],
        close: Callable[[Disconnect], Awaitable[object]],
        send_many: Callable[[list[bytes]], Awaitable[object]] | None = None,
        peer: str = "",
    ) -> None:
        self.service = service
        self.proto = proto
        self.peer = peer
        self.node = service.node
        h = service.http
        self.wire = DialectWire(
            service.node,
            md.SPEC,
            dialect=proto.generation,
            encoder=service.encoder_for(proto),
            send_queue=h.send_queue,
            send_queue_bytes=h.send_queue_bytes,
            max_frame=h.max_frame,
            send=send,
            close=close,
            send_many=send_many,
            refused=self._refused,
            failed=self._failed,
            echo=proto.echo,  # 2015 delivers to the publisher, 1.x never (mist.md §5)
            pace=True,  # a TCP read's outputs are those of every line or value it completes
            after=self._after,
        )
        self.session = self.wire.session
        self._replica = False
        #: The tags this connection shows in the :data:`SUBSCRIBERS` roster (None: not a member).
        self._roster: frozenset[str] | None = None
        self._roster_stale = False
        registry = self._registry
        self.wire.handle(
            {
                md.Send: self._send,
                md.Publish: self._publish,
                md.Subscribe: self._subscribe,
                md.Unsubscribe: self._unsubscribe,
                md.ListAll: self._listall,
                md.Who: self._who,
                md.Authenticate: self._authenticate,
                md.Register: registry,
                md.Unregister: registry,
                md.SetTags: registry,
                md.UnsetTags: registry,
                md.TokenTags: registry,
            }
        )

    # -- lifecycle ----------------------------------------------------------------------------------------

    def start(self, group: Lifetime) -> None:
        """A TCP connection (the byte-stream driver's :class:`~hubbub.transports.stream_driver.StreamWire`):
        bind its first identity (none with auth on: it must send its token first), attach to the node and
        the service, start the writer in ``group``."""
        self.wire.start(group, self.service.first_identity())
        self.service.join(self)

    @property
    def messages(self) -> int:
        """Complete lines or values received (a TCP connection's)."""
        proto = self.proto
        return proto.messages if isinstance(proto, md.Mist2015Connection | md.Mist1Connection) else 0

    async def feed(self, data: bytes) -> None:
        """One TCP read: the outputs of every line or value it completes."""
        proto = self.proto
        assert isinstance(proto, md.Mist2015Connection | md.Mist1Connection)
        await self.handle(proto.receive_data(data))

    @property
    def done(self) -> bool:
        return self.wire.done

    def _failed(self) -> bool:
        return bool(self.proto.failed)

    def leave(self) -> None:
        """The reader is done: the connection leaves the service and the roster."""
        self.service.leave(self)
        if self._roster is not None:
            self._roster = None
            self.node.presence.leave(SUBSCRIBERS, self.session.id)

    async def finish(self) -> None:
        """The reader is done: it leaves, a pending close goes out (for at most 10 s), the writer stops."""
        self.leave()
        await self.wire.finish()

    # -- the dialect's outputs ----------------------------------------------------------------------------

    async def handle(self, outputs: Sequence[object]) -> None:
        """Carry out the dialect's outputs, in order, waiting for the session's room after each
        (read-side back-pressure, :mod:`~hubbub.transports.backpressure`: a TCP read's outputs are those of
        every line or value it completes, thousands of ``ping`` lines in one 64 KiB read)."""
        await self.wire.run(outputs)

    def _after(self) -> None:
        """After a run of outputs: the roster, and the replication encoder once asked for."""
        if self._roster_stale:
            self._roster_stale = False
            self._show_roster()
        if isinstance(self.proto, md.Mist2015Connection) and self.proto.replica and not self._replica:
            # enable-replication: from now on, events of replication peers are not sent here (mist.md §5).
            self._replica = True
            self.session.encoder = self.service.encoder_for(self.proto)

    def _show_roster(self) -> None:
        """Bring this connection's entry in the :data:`SUBSCRIBERS` roster up to date (a presence write only
        when its tags changed)."""
        proto = self.proto
        tags = frozenset[str]().union(*proto.subscriptions) if proto.subscribed else None
        if tags == self._roster:
            return
        self._roster = tags
        if tags is None:
            self.node.presence.leave(SUBSCRIBERS, self.session.id)
        else:
            self.node.presence.join(SUBSCRIBERS, self.session.id, {"tags": json.dumps(sorted(tags))})

    def _refused(self, cmd: object, exc: HubbubError) -> list[md.Output]:
        """The core refused ``cmd``: the dialect's answer (replies, or a close). A rate-limited publish has
        no reply in mist: it is dropped (counted by the limiter)."""
        if isinstance(exc, RateLimited):
            return []
        assert isinstance(cmd, md.Command)
        return self.proto.reply_error(cmd, exc)

    async def _send(self, out: md.Send) -> None:
        if _is_error_reply(self.proto, out.data):
            self.node.metrics.count_bad_input(self.session.dialect)
        self.session.push(out.data)

    async def _publish(self, cmd: md.Publish) -> None:
        await self.wire.publish(
            cmd, a.Publish(cmd.channel, cmd.payload, md.CONTENT_TYPE, cmd.headers, cmd.tags)
        )

    async def _subscribe(self, cmd: md.Subscribe) -> None:
        self._roster_stale = True
        (exc,) = await self.wire.subscribe([a.Subscribe(_sub_id(cmd.tags), _EVERY_CHANNEL, cmd.tags)])
        if isinstance(exc, LimitExceeded | AuthError):
            self.wire.refuse(cmd, exc)
        # else: subscribed, or closed meanwhile

    async def _unsubscribe(self, cmd: md.Unsubscribe) -> None:
        self._roster_stale = True
        await self.wire.run([a.Unsubscribe(_sub_id(cmd.tags))])

    async def _listall(self, cmd: md.ListAll) -> None:
        assert isinstance(self.proto, md.Mist1Connection | md.Mist1WsConnection)
        self._show_roster()  # this connection's own subscriptions count at once
        self.session.push(self.proto.reply_listall(cmd, await self.service.listall()))

    async def _who(self, cmd: md.Who) -> None:
        assert isinstance(self.proto, md.Mist1Connection | md.Mist1WsConnection)
        self._show_roster()
        self.session.push(self.proto.reply_who(cmd, *await self.service.who()))

    async def _authenticate(self, cmd: md.Authenticate) -> None:
        proto = self.proto
        assert isinstance(proto, md.Mist2015Connection | md.Mist1Connection)
        found = self.service.login(cmd.token, allow_registry=False, peer=self.peer)
        if found is None:
            self.node.metrics.count_bad_input(self.session.dialect)
            await self.handle(proto.auth_result(None))
            return
        identity, grant = found
        self.node.access.bind(self.session, identity)  # before any subscription: the first line is auth
        await self.handle(proto.auth_result(grant))

    async def _registry(self, cmd: md.RegistryCommand) -> None:
        """A registry command (mist.md §7): an administrator's only when auth is on."""
        node, sess = self.node, self.session
        try:
            node.access.check_admin(sess.identity, sess.dialect)
        except AuthError as exc:
            self.wire.refuse(cmd, exc)
            return
        registry = self.service.registry
        call: Callable[[], bool | frozenset[str] | None]
        if isinstance(cmd, md.Register):
            call = lambda: registry.register(cmd.token, cmd.tags)  # noqa: E731
        elif isinstance(cmd, md.Unregister):
            call = lambda: registry.unregister(cmd.token)  # noqa: E731
        elif isinstance(cmd, md.SetTags):
            call = lambda: registry.set_tags(cmd.token, cmd.tags)  # noqa: E731
        elif isinstance(cmd, md.UnsetTags):
            call = lambda: registry.unset_tags(cmd.token, cmd.tags)  # noqa: E731
        else:
            call = lambda: registry.tags(cmd.token)  # noqa: E731
        try:
            result = await asyncio.get_running_loop().run_in_executor(None, call)
        except HubbubError as exc:  # StorageError: the registry cannot be written
            log.error("mist token registry: %s", exc)
            self.wire.refuse(cmd, exc)
            return
        proto = self.proto
        assert not isinstance(proto, md.Mist2015WsConnection)  # it has no registry commands
        reply = proto.reply_registry(cmd, result)
        if reply is not None:
            sess.push(reply)


def mist_token(request: web.Request) -> str | None:
    """The token of a mist WebSocket upgrade (mist.md §8): the ``X-Auth-Token`` header, the query
    ``x-auth-token`` or ``X-AUTH-TOKEN``, else the README §6 forms (``Authorization: Bearer``, ``token``)."""
    token = request.headers.get("X-Auth-Token")
    if token:
        return token
    q = request.query
    return q.get("x-auth-token") or q.get("X-AUTH-TOKEN") or request_token(request)


class MistService:
    """The node's mist state and HTTP routes. See the module docstring.

    ``authenticator`` verifies the global tokens (``auth.*``; None with ``auth.mode = off``)."""

    def __init__(
        self,
        node: Core,
        settings: MistSettings,
        http: HttpSettings,
        registry: MistTokenRegistry,
        authenticator: Callable[[], Authenticator | None],
    ) -> None:
        self.node = node
        self.settings = settings
        self.http = http
        self.registry = registry
        self._authenticator = authenticator
        self._auth = MistAuthenticator(master_token=settings.token, registry=registry)
        self.wires: set[MistWire] = set()
        #: Mist connections this node accepted since start (both generations, every transport).
        self.lifetime = 0
        self._encoders: dict[tuple[str, bool], MistEncoder] = {}

    # -- connections --

    def encoder_for(self, proto: Proto) -> MistEncoder:
        """The shared encoder of the connection's rendering (a replication peer's of its own)."""
        if isinstance(proto, md.Mist2015Connection):
            key, render = "mist2015.tcp", md.render_event_tcp
        elif isinstance(proto, md.Mist2015WsConnection):
            key, render = "mist2015.ws", md.render_event_ws
        else:
            key, render = "mist1", md.render_event
        replica = proto.replica if isinstance(proto, md.Mist2015Connection) else False
        enc = self._encoders.get((key, replica))
        if enc is None:
            enc = self._encoders[key, replica] = MistEncoder(key, render, replica)
        return enc

    def tcp_proto(self, first: bytes) -> md.Mist2015Connection | md.Mist1Connection:
        """The state machine of a TCP connection whose first bytes are ``first`` (mist.md §1)."""
        h, s = self.http, self.settings
        proto = md.tcp_connection(
            first,
            max_frame=h.max_frame,
            max_subscriptions=h.max_subscriptions,
            max_tags=s.max_tags,
            max_tag_bytes=s.max_tag_bytes,
            channel=s.channel,
            auth_required=s.auth,
        )
        assert proto is not None  # first is never empty
        return proto

    def first_identity(self) -> Identity | None:
        """A new TCP connection's identity: everyone's with auth off, none until its token otherwise."""
        return None if self.settings.auth else ANONYMOUS

    def join(self, wire: MistWire) -> None:
        self.wires.add(wire)
        self.lifetime += 1
        self.node.presence.add(CONNECTIONS)

    def leave(self, wire: MistWire) -> None:
        self.wires.discard(wire)

    async def listall(self) -> set[str]:
        """The distinct tags of every mist subscription (1.x ``listall``): every node's, through the
        presence (this node's alone on a single node, or while a cluster's Redis is away)."""
        out: set[str] = set()
        for m in await self.node.presence.members(SUBSCRIBERS):
            try:
                tags = json.loads(m.fields.get("tags", "[]"))
            except ValueError:
                continue  # not written by this module: ignore
            if isinstance(tags, list):
                out.update(t for t in tags if isinstance(t, str))
        return out

    async def who(self) -> tuple[int, int]:
        """``who``'s numbers, summed over the nodes: mist connections accepted since start, and open ones
        holding at least one subscription."""
        presence = self.node.presence
        return await presence.total(CONNECTIONS), await presence.count(SUBSCRIBERS)

    def login(
        self, token: str | None, *, allow_registry: bool, peer: str
    ) -> tuple[Identity, md.MistGrant] | None:
        """What ``token`` allows on mist (mist.md §8): ``mist.token``, then a global token, then (where
        ``allow_registry``: the 2015 WebSocket) a registry token with tags. None (audited) when refused."""
        if token:
            if self._auth.check(token) is not None:
                return MASTER, md.MistGrant()
            authenticator = self._authenticator()
            if authenticator is not None:
                try:
                    ident = authenticator.authenticate(token)
                except AuthError:
                    pass
                else:
                    return ident, md.MistGrant(ident.user)
            if allow_registry:
                access = self._auth.check(token, allow_registry=True)
                if access is not None:
                    return REGISTRY_READER, md.MistGrant("", access.registry_tags)
        code = 4101 if token else 4100
        self.node.access.refused(AuthError("mist token refused", code=code), DIALECT, peer)
        return None

    # -- HTTP --

    def install(self, app: web.Application, node: Core, settings: HttpSettings) -> None:
        """The :data:`~hubbub.transports.http.RouteInstaller` of the mist routes (mist.md §1)."""
        app.router.add_get(WS_2015, self.websocket_2015, allow_head=False)
        app.router.add_get(WS_1, self.websocket_1, allow_head=False)
        app.router.add_get(PING, self.ping)

    async def ping(self, request: web.Request) -> web.StreamResponse:
        return text_response(200, "pong\n")

    async def websocket_2015(self, request: web.Request) -> web.StreamResponse:
        return await self._websocket(request, generation="mist2015")

    async def websocket_1(self, request: web.Request) -> web.StreamResponse:
        return await self._websocket(request, generation="mist1")

    async def _websocket(self, request: web.Request, generation: str) -> web.StreamResponse:
        ws = upgradable(request, self.http.max_frame)
        if ws is None:
            return text_response(400, "websocket upgrade required\n")
        if forbidden := cross_site_upgrade(request, anonymous=not self.settings.auth):
            return forbidden
        peer = peer_address(request)
        identity: Identity = ANONYMOUS
        grant = md.MistGrant()
        if self.settings.auth:
            found = self.login(mist_token(request), allow_registry=generation == "mist2015", peer=peer)
            if found is None:
                return text_response(401, "unauthorized\n")
            identity, grant = found
        sock, resp = await take_over(request, ws, self.http.max_frame)
        h, s = self.http, self.settings
        proto: md.Mist2015WsConnection | md.Mist1WsConnection
        if generation == "mist2015":
            proto = md.Mist2015WsConnection(
                max_frame=h.max_frame,
                max_subscriptions=h.max_subscriptions,
                max_tags=s.max_tags,
                max_tag_bytes=s.max_tag_bytes,
                channel=s.channel,
                grant=grant,
            )
        else:
            proto = md.Mist1WsConnection(
                max_frame=h.max_frame,
                max_subscriptions=h.max_subscriptions,
                max_tags=s.max_tags,
                max_tag_bytes=s.max_tag_bytes,
                channel=s.channel,
                auth_required=s.auth,
                grant=grant,
            )

        async def send(data: bytes) -> None:
            await sock.send_frame(data, WSMsgType.TEXT)

        async def close(code: Disconnect) -> None:
            await sock.close(code=code)

        mist = MistWire(self, proto, send=send, close=close, peer=peer)

        async def joined() -> None:
            self.join(mist)

        run = run_websocket(
            sock,
            mist.wire,
            proto,
            identity,
            keepalive_s=(s.ping_interval_s, s.read_timeout_s),
            started=joined,
            finishing=mist.leave,
        )
        detach(request, run)
        return resp
