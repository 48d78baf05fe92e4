"""Native protocol connections: commands from the native codec become node calls; replies go back out.

One :class:`NativeConnection` serves one WebSocket or TCP connection, run by the dialect drivers: it is the
WebSocket driver's wire (:class:`~hubbub.transports.ws_driver.FrameWire`: its :meth:`~NativeConnection.frame`
decodes each frame with the shared codec and takes a common publish without a coroutine), and the
byte-stream driver's through :class:`~hubbub.transports.tcp.NativeStreamWire`, which feeds it a read's
decoded items. :meth:`NativeConnection.start` runs its writer task, which drains the session's queue, and
enters it in the event loop's :class:`Keepalive` for its ping interval (native's keepalive is its own
``ping`` frames, not the driver's WebSocket pings: ``SPEC.keepalive`` is off).

An idle connection is mostly this glue, so its size matters at ten thousand connections: the class has
slots, its publish bookkeeping is created with the first publish, and keepalive is one timer per event loop
and ping interval instead of a task (with its coroutine, sleep future and timer) per connection.

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, ClassVar

from hubbub.auth import Identity
from hubbub.core.api import Core, ReplayPlan, Session
from hubbub.core.flag import Flag
from hubbub.core.session import Overflow
from hubbub.dialects import native as nc
from hubbub.dialects.spec import DialectSpec
from hubbub.disconnect import Disconnect
from hubbub.errors import HubbubError
from hubbub.events import Event, Publisher
from hubbub.selection import ReplaySpec

from .lifetime import Lifetime
from .native_consume import CONSUMER_COMMANDS, NativeConsumers
from .native_publish import NativePublishing
from .pump import Direct, SessionPump, Wire, grace_left, stopped

__all__ = ["BURST_MAX", "Keepalive", "NativeConnection", "NativeEncoder", "dispatch"]

log = logging.getLogger("hubbub.native")

#: The most frames of a WebSocket burst a native connection takes at once (the rest wait for the next turn).
BURST_MAX = 4 * nc.RUN_MAX

_OPEN = nc.Phase.OPEN


class NativeEncoder:
    """Session encoder for one native encoding; sessions with the same encoding share the fan-out cache.

    Stateless apart from its codec: connections that share a codec may share one encoder.
    """

    __slots__ = ("codec", "encode_event", "key")

    #: Its frames name the subscriptions (``subs``; core/session.py).
    names_subscriptions = True

    def __init__(self, codec: nc.NativeCodec) -> None:
        self.codec = codec
        self.key = f"native.{codec.encoding}"
        # The codec's method itself, not a wrapper: one call less per event and subscriber.
        self.encode_event: Callable[[Event, Sequence[str], bool, dict[Any, Any]], bytes] = codec.encode_event

    def encode_run(
        self, proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool
    ) -> list[bytes]:
        """The frames of a run of replayed events, encoded together (``Session.encode_run``)."""
        return nc.run_frames(self.codec.encoding, proto, rows, subs, replay)

    def encode_page(
        self, events: Sequence[Event], subs: Sequence[str], replay: bool, shapes: dict[Any, Any]
    ) -> list[bytes]:
        """The frames of a page of replayed events of any channels (a pattern's replay; ``PageEncoder``)."""
        return nc.page_frames(self.codec.encoding, events, subs, replay, shapes)

    def encode_batches(self, frames: Sequence[bytes], limit: int) -> list[bytes]:
        """Frames packed into ``batch`` frames of at most ``limit`` bytes (``Session.batch_limit``)."""
        return nc.pack_batches(self.codec.encoding, frames, limit)

    def encode_run_batches(
        self, proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool, limit: int
    ) -> list[bytes]:
        """A run's frames packed as :meth:`encode_batches` packs them, built without the single frames
        (``Session.replay_run_chunks``; a replay page to a batching connection)."""
        return nc.run_batches(self.codec.encoding, proto, rows, subs, replay, limit)


class NativeConnection(NativePublishing):
    """Glue between one native connection, its codec and the node.

    The codec (and ``encoder``, built from the codec when not given) may be shared by every connection with
    the same encoding: neither keeps per-connection state.
    """

    __slots__ = ("_consumers", "_layouts", "_pump", "codec", "peer", "ping_interval", "upgrade_token")

    #: What the drivers read of the dialect (the close mapping: native's peers see every reason as it is).
    spec: ClassVar[DialectSpec] = nc.SPEC

    def __init__(
        self,
        node: Core,
        codec: nc.NativeCodec,
        *,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[Disconnect], Awaitable[None]],
        send_many: Callable[[list[bytes]], Awaitable[None]] | None = None,
        wire: Wire | None = None,
        direct: Direct | None = None,
        max_frame: int,
        max_subscriptions: int,
        send_queue: int,
        send_queue_bytes: int,
        ping_interval: float,
        encoder: NativeEncoder | None = None,
    ) -> None:
        self.node = node
        self.codec = codec
        # A JSON WebSocket's learned publish layout (decode_messages), made at its first burst.
        self._layouts: nc.JsonLayouts | None = None
        self.ping_interval = ping_interval
        self.session = Session(
            "native",
            encoder if encoder is not None else NativeEncoder(codec),
            max_items=send_queue,
            max_bytes=send_queue_bytes,
            overflow=Overflow.DISCONNECT,
            slow_close_code=Disconnect.SLOW_CONSUMER,
        )
        self._publisher = Publisher("native")
        self._acked = Flag()
        #: The protocol's own state (hello, publish pipelining) and frames, sans-I/O.
        self.proto = nc.NativeProtocol(
            codec,
            emit=self.session.push,
            end=self.session.end,
            room=self._acked.set,
            max_frame=max_frame,
            max_subscriptions=max_subscriptions,
            max_inflight=send_queue,
            ping_interval=ping_interval,
        )
        self.last_recv = time.monotonic()
        self._pump = SessionPump(
            node,
            self.session,
            send=send,
            close=close,
            max_frame=max_frame,
            # Writes several frames at once (one socket write), for clients that did not ask for batch frames.
            send_many=send_many,
            pack=codec.encode_batches,
            farewell=self._farewell,
            # A transport that frames its writes itself (WebSocket): fan-out runs framed once for all.
            wire=wire,
            # A byte stream whose writes need not wait: a woken write loop writes without a task.
            direct=direct,
        )
        #: A token presented on the WebSocket upgrade (header or query), used when ``hello`` has none.
        self.upgrade_token: str | None = None
        #: The peer's address, for the audit log.
        self.peer = ""
        #: The durable consumers this connection holds (made by its first consumer op).
        self._consumers: NativeConsumers | None = None

    # -- inbound ----------------------------------------------------------------------------------------

    def bad_input(self, exc: HubbubError) -> None:
        """Answer a decoding error: the error frame, then a close when it is fatal."""
        self.node.metrics.count_bad_input("native")
        if exc.code == Disconnect.FRAME_TOO_LARGE:
            self.node.limiter.refused("max_frame", "native")
        self.proto.failed(exc, exc.request_id)

    @property
    def hello_done(self) -> bool:
        return self.proto.open

    @property
    def inflight(self) -> int:
        """Publishes submitted and not completed."""
        return self.proto.inflight

    @property
    def max_inflight(self) -> int:
        return self.proto.max_inflight

    def frame(self, data: bytes | str, binary: bool = False) -> Awaitable[None] | None:
        """One WebSocket frame (the WebSocket driver's step): decoded by the shared codec, a common publish
        submitted at once when nothing asks to wait (:meth:`publish_nowait`: no coroutine), anything else
        returned as :meth:`handle`'s coroutine for the driver to await. A frame that does not decode is
        answered with its error (a fatal one ends the session, and the driver reads no more)."""
        try:
            cmd = self.codec.decode(data)
        except HubbubError as exc:
            self.bad_input(exc)
            return None
        if type(cmd) is nc.Publish and self.publish_nowait(cmd):
            return None
        return self.handle(cmd)

    async def burst(self, frames: list[bytes | str]) -> None:
        """A burst of WebSocket frames (the messages aiohttp's reader parsed from one read; the WebSocket
        driver's burst step): decoded at once (:func:`~hubbub.dialects.native.decode_messages`) and handed
        over as a TCP read's frames are (:func:`dispatch`): the common publishes in runs, one node call each,
        every other frame in its place, read-side back-pressure between them."""
        layouts = self._layouts
        if layouts is None and self.codec.encoding == "json":
            layouts = self._layouts = nc.JsonLayouts()
        await dispatch(self, nc.decode_messages(self.codec, frames, layouts))

    def receiver(self, conn: object = None) -> Callable[[bytes | str, bool], Awaitable[None] | None]:
        """The WebSocket driver's step: :meth:`frame` (native reads its frames itself, no ``conn``)."""
        return self.frame

    @property
    def done(self) -> bool:
        """The session ends or was kicked: the drivers read no more."""
        sess = self.session
        return bool(sess.ending or sess.kicked)

    async def handle(self, cmd: nc.Command) -> None:
        self.last_recv = time.monotonic()
        sess = self.session
        verdict = self.proto.admit(cmd)
        if verdict is not nc.Admit.HANDLE:
            if verdict is nc.Admit.HELLO:
                self._hello(cmd)  # type: ignore[arg-type]  # admit() said it is a Hello
            elif verdict is nc.Admit.REFUSED:
                self.node.metrics.count_bad_input("native")
            return
        try:
            if isinstance(cmd, nc.Publish):
                await self._publish(cmd)
            elif isinstance(cmd, nc.PublishBatch):
                await self._publish_batch(cmd)
            elif isinstance(cmd, nc.Subscribe):
                await self._subscribe(cmd)
            elif isinstance(cmd, nc.Unsubscribe):
                self.node.unsubscribe(sess, cmd.sub)
                sess.push(self.codec.encode_reply(cmd.id, {}))
            elif isinstance(cmd, nc.Ping):
                sess.push(self.codec.encode_push("pong", **({} if cmd.id is None else {"id": cmd.id})))
            elif isinstance(cmd, nc.Auth):
                # Token refresh (native.md §2): new permissions and expiry; a bad token is fatal (4101).
                self.node.login(sess, cmd.token, self.peer)
                self._publisher = Publisher("native", sess.user, sess.id, "")
                sess.push(self.codec.encode_reply(cmd.id, {"user": sess.user}))
            elif isinstance(cmd, CONSUMER_COMMANDS):
                held = self._consumers
                if held is None:
                    held = self._consumers = NativeConsumers(
                        self.node, sess, self.codec, self.proto.max_subscriptions
                    )
                await held.handle(cmd)
        except HubbubError as exc:
            self.proto.failed(exc, getattr(cmd, "id", None))

    def _hello(self, cmd: nc.Hello) -> None:
        sess = self.session
        try:
            # The token of hello, else one presented on the upgrade (README §6); 4100/4101/4103 are fatal.
            self.node.login(sess, cmd.token or self.upgrade_token, self.peer)
        except HubbubError as exc:
            self.proto.fatal(Disconnect.of(exc.code), cmd.id)
            return
        sess.echo = cmd.echo
        if cmd.batch:
            sess.batch_limit = self.proto.max_frame
        # The common publish carries no idempotency key: one Publisher value serves them all.
        self._publisher = Publisher("native", sess.user, sess.id, "")
        self.node.attach(sess)
        self.proto.opened(cmd, sess.id, sess.user)

    async def _subscribe(self, cmd: nc.Subscribe) -> None:
        proto = self.proto
        exact = cmd.pattern.is_exact

        def on_snapshot(plan: ReplayPlan) -> None:
            if exact:
                assert plan.position is not None
                proto.subscribed(cmd.id, cmd.sub, plan.position, None, plan.gaps)
            else:
                proto.subscribed(cmd.id, cmd.sub, None, plan.top_time, plan.gaps)

        def on_replayed(plan: ReplayPlan) -> None:
            proto.recovered(cmd.sub, plan.sent, plan.position if exact else None)

        spec = ReplaySpec(cmd.since, cmd.last, cmd.from_time)
        await self.node.subscribe(
            self.session,
            cmd.sub,
            cmd.pattern,
            cmd.tags,
            spec,
            on_snapshot=on_snapshot,
            on_replayed=on_replayed,
            on_gap=lambda g: proto.gap(cmd.sub, g),
        )

    # -- outbound ---------------------------------------------------------------------------------------

    def _farewell(self, reason: Disconnect) -> bytes | None:
        """The error frame a kicked connection gets before the close (none when the server goes away)."""
        return None if reason == Disconnect.GOING_AWAY else self.codec.encode_error(reason)

    @property
    def last_send(self) -> float:
        """When the connection last wrote (monotonic): the keepalive pings a connection silent for long."""
        return self._pump.last_send

    @last_send.setter
    def last_send(self, t: float) -> None:
        self._pump.last_send = t

    def timed_out(self) -> None:
        """No client frame for three ping intervals (called by :class:`Keepalive`): error 4304, then close."""
        self.node.metrics.count_bad_input("native")
        self.proto.fatal(Disconnect.TIMEOUT, None)

    def start(self, group: Lifetime | None = None, identity: Identity | None = None) -> None:
        """Start the writer and the keepalive. Called once, before the first command. The writer runs only
        while there is something to write (:meth:`SessionPump.start`: an idle connection holds no task for
        it); :meth:`finish` ends it. ``group`` and ``identity`` are unused (the driver's interface): a native
        connection logs in with its ``hello`` (the session is attached then), with the upgrade's token where
        ``hello`` has none."""
        self._pump.start()
        Keepalive.for_interval(self.ping_interval).add(self)

    async def finish(self, close_wait_s: float = 10.0) -> None:
        """The reader is done: a pending close (a fatal error, a kick) goes out first, for at most
        ``close_wait_s`` (none once the handler was cancelled); then the session leaves the node, and the
        writer and the keepalive stop."""
        sess = self.session
        if (sess.ending or sess.kicked) and self._pump.current() is not None and grace_left():
            with contextlib.suppress(TimeoutError):  # the writer is cancelled below
                await asyncio.wait_for(self.wait_written(), close_wait_s)
        Keepalive.for_interval(self.ping_interval).discard(self)
        if self._consumers is not None:
            self._consumers.close()  # their batches are redelivered at once
        # Before the session leaves the node (which closes it): a parked writer must not start for that.
        t = self._pump.stop()
        self.node.detach(self.session)
        await stopped(t, self.node, "native", self.session.id)

    async def wait_written(self) -> None:
        """Wait until the write loop ended (after a graceful end or a kick: the session's end started its
        last run)."""
        t = self._pump.current()
        if t is not None:
            await stopped(asyncio.shield(t), self.node, "native", self.session.id)


class Keepalive:
    """Keepalive of native connections (native.md §2): one timer for every connection of an event loop with
    the same ping interval, instead of a sleeping task per connection.

    Each tick (every fifth of the interval; every interval when it is below one second) looks at every
    member: one that received nothing for three intervals times out (4304); one that completed ``hello``
    and sent nothing for an interval gets a ``ping``. A connection is thus pinged between one interval and
    one tick after its last frame, and closed at most one tick after the third silent interval. A tick
    costs well under a microsecond per connection. The timer runs only while there are members.

    Concurrency contract: called from the event loop thread only.
    """

    __slots__ = ("_empty", "_handle", "_loop", "_members", "interval", "period")

    #: The instances of each running event loop, by ping interval.
    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Keepalive]]] = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, interval: float, loop: asyncio.AbstractEventLoop) -> None:
        if not interval > 0:
            raise ValueError("ping interval must be positive")
        self.interval = interval
        self.period = interval if interval < 1.0 else interval / 5
        self._loop = loop
        # A dict, not a set: ticks visit connections in the order they joined.
        self._members: dict[NativeConnection, None] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._empty = asyncio.Event()
        self._empty.set()

    @classmethod
    def for_interval(cls, interval: float) -> Keepalive:
        """The running event loop's keepalive for ``interval`` (created on first use)."""
        loop = asyncio.get_running_loop()
        per_loop = cls._by_loop.get(loop)
        if per_loop is None:
            per_loop = cls._by_loop[loop] = {}
        ka = per_loop.get(interval)
        if ka is None:
            ka = per_loop[interval] = cls(interval, loop)
        return ka

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[NativeConnection]:
        """The member connections, in the order they joined."""
        return iter(list(self._members))

    async def wait_empty(self) -> None:
        """Wait until no connection is a member (every one has finished or timed out)."""
        await self._empty.wait()

    def add(self, conn: NativeConnection) -> None:
        self._members[conn] = None
        self._empty.clear()
        if self._handle is None:
            self._handle = self._loop.call_later(self.period, self._tick)

    def discard(self, conn: NativeConnection) -> None:
        """Forget ``conn``. Idempotent."""
        self._members.pop(conn, None)
        if not self._members:
            self._empty.set()
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None

    def _tick(self) -> None:
        self._handle = None
        interval = self.interval
        silent = 3 * interval
        now = time.monotonic()
        ping: bytes | None = None
        ping_codec: nc.NativeCodec | None = None
        for conn in list(self._members):
            if conn.session.closed:
                self._members.pop(conn, None)
            elif now - conn.last_recv > silent:
                self._members.pop(conn, None)
                conn.timed_out()
            elif conn.hello_done and now - conn.last_send >= interval:
                conn.last_send = now
                codec = conn.codec
                if codec is not ping_codec:
                    # Connections of one transport and encoding share their codec: encode the ping once.
                    ping, ping_codec = codec.encode_push("ping"), codec
                assert ping is not None
                conn.session.push(ping)
        if self._members:
            self._handle = self._loop.call_later(self.period, self._tick)
        else:
            self._empty.set()


async def dispatch(conn: NativeConnection | None, items: Sequence[nc.RunItem]) -> bool:
    """Hand one read's decoded items to the connection, in order; True when the connection must close.

    A run of common publishes (the usual read: a client's pipelined burst) goes to the connection at once,
    and so do consecutive other publishes, so the node takes them in one call each
    (:meth:`NativeConnection.publish_run`, :meth:`NativeConnection.publish_many`).

    Read-side back-pressure (:mod:`~hubbub.transports.backpressure`): one read may hold thousands of requests
    (pings, bad frames, ...), each answered; after each item, the rest of the read waits while the
    connection's replies fill its queue.
    """
    n = len(items)
    i = 0
    while i < n:
        item = items[i]
        if conn is None:
            if isinstance(item, HubbubError):
                return True
            i += 1
            continue
        if isinstance(item, HubbubError):
            conn.bad_input(item)
            if item.fatal:
                return True
            i += 1
        elif isinstance(item, nc.PublishRun):
            await conn.publish_run(item)
            i += 1
            if len(item.replies) >= nc.RUN_MAX and i < n:
                # A burst (runs are cut at RUN_MAX publishes): the other connections' turn before the next
                # run, and this one's commit (see RUN_MAX).
                await asyncio.sleep(0)
        elif type(item) is nc.Publish:
            j = i + 1
            while j < n and type(items[j]) is nc.Publish:
                j += 1
            run: list[nc.Publish] = items[i:j]  # type: ignore[assignment]  # all Publish, checked above
            await conn.publish_many(run)
            i = j
        else:
            await conn.handle(item)
            i += 1
        sess = conn.session
        if sess.ending or sess.kicked:
            return True
        if not sess.has_room:
            await sess.wait_room()
            if sess.ending or sess.kicked or sess.closed:
                return True
    return False
