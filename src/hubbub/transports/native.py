"""Native protocol connections: commands from the native codec become node calls; replies go back out.

One :class:`NativeConnection` serves one WebSocket or TCP connection. The transport feeds it decoded
commands (in order); :meth:`NativeConnection.start` runs its writer task, which drains the session's queue,
and enters it in the event loop's :class:`Keepalive` for its ping interval.

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
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, ClassVar

from hubbub.core import Node, ReplayPlan, ReplaySpec, Session
from hubbub.core.flag import Flag
from hubbub.core.session import FrameRun, Overflow
from hubbub.dialects import native as nc
from hubbub.dialects.native_common import event_batches, event_frames, pack_batches
from hubbub.errors import HubbubError
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult

__all__ = ["Keepalive", "NativeConnection", "NativeEncoder"]

log = logging.getLogger("hubbub.native")

SHUTDOWN_CODE = 1001
#: A queued run of at least this many event frames is packed on its own (and the packing shared); shorter
#: ones are packed together with the frames around them.
SHARED_PACK_MIN = 32
#: Batch frames of one writer pass up to this many bytes in all are written with one ``send_many``.
SEND_MANY_MAX = 64 << 10


class NativeEncoder:
    """Session encoder for one native encoding; sessions with the same encoding share the fan-out cache.

    Stateless apart from its codec: connections that share a codec may share one encoder.
    """

    __slots__ = ("codec", "encode_event", "key")

    def __init__(self, codec: nc.NativeCodec) -> None:
        self.codec = codec
        self.key = f"native.{codec.encoding}"
        # The codec's method itself, not a wrapper: one call less per event and subscriber.
        self.encode_event: Callable[[Event, Sequence[str], bool, dict[Any, Any]], bytes] = codec.encode_event

    def encode_run(
        self, proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool
    ) -> list[bytes]:
        """The frames of a run of replayed events, encoded together (``Session.encode_run``)."""
        return event_frames(self.codec.encoding, proto, rows, subs, replay)

    def encode_batches(self, frames: Sequence[bytes], limit: int) -> list[bytes]:
        """Frames packed into ``batch`` frames of at most ``limit`` bytes (``Session.batch_limit``)."""
        return pack_batches(self.codec.encoding, frames, limit)

    def encode_run_batches(
        self, proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool, limit: int
    ) -> list[bytes]:
        """A run's frames packed as :meth:`encode_batches` packs them, built without the single frames
        (``Session.replay_run_chunks``; a replay page to a batching connection)."""
        return event_batches(self.codec.encoding, proto, rows, subs, replay, limit)


class NativeConnection:
    """Glue between one native connection, its codec and the node.

    The codec (and ``encoder``, built from the codec when not given) may be shared by every connection with
    the same encoding: neither keeps per-connection state.
    """

    __slots__ = (
        "_acked",
        "_close",
        "_pending",
        "_publisher",
        "_send",
        "_send_many",
        "_writer",
        "batch",
        "codec",
        "hello_done",
        "inflight",
        "last_recv",
        "last_send",
        "max_frame",
        "max_inflight",
        "max_subscriptions",
        "node",
        "peer",
        "ping_interval",
        "session",
        "upgrade_token",
    )

    def __init__(
        self,
        node: Node,
        codec: nc.NativeCodec,
        *,
        send: Callable[[bytes], Awaitable[None]],
        close: Callable[[int], Awaitable[None]],
        send_many: Callable[[list[bytes]], Awaitable[None]] | None = None,
        max_frame: int,
        max_subscriptions: int,
        send_queue: int,
        send_queue_bytes: int,
        ping_interval: float,
        encoder: NativeEncoder | None = None,
    ) -> None:
        self.node = node
        self.codec = codec
        self._send = send
        # Writes several frames at once (one socket write), for clients that did not ask for batch frames.
        self._send_many = send_many
        self._close = close
        self.max_frame = max_frame
        self.max_subscriptions = max_subscriptions
        self.ping_interval = ping_interval
        self.session = Session(
            "native",
            encoder if encoder is not None else NativeEncoder(codec),
            max_items=send_queue,
            max_bytes=send_queue_bytes,
            overflow=Overflow.DISCONNECT,
            slow_close_code=4302,
        )
        self.hello_done = False
        self._publisher = Publisher("native")
        self.batch = False
        self.inflight = 0
        self.max_inflight = send_queue
        self._acked = Flag()
        #: (request id, ack wanted) of each publish in flight, oldest first; created by the first publish (an
        #: empty deque is some 750 bytes, and many connections only subscribe).
        self._pending: deque[tuple[int, bool]] | None = None
        self.last_recv = time.monotonic()
        self.last_send = time.monotonic()
        self._writer: asyncio.Task[None] | None = None
        #: A token presented on the WebSocket upgrade (header or query), used when ``hello`` has none.
        self.upgrade_token: str | None = None
        #: The peer's address, for the audit log.
        self.peer = ""

    # -- inbound ----------------------------------------------------------------------------------------

    def bad_input(self, exc: HubbubError) -> None:
        """Answer a decoding error: the error frame, then a close when it is fatal."""
        self.node.count_bad_input("native")
        if exc.code == 4003:  # frame_too_large
            self.node.limiter.refused("max_frame", "native")
        self.session.push(self.codec.encode_error(exc.code, exc.request_id, exc.detail))
        if exc.fatal:
            self.session.end(exc.code)

    async def handle(self, cmd: nc.Command) -> None:
        self.last_recv = time.monotonic()
        sess = self.session
        if not self.hello_done:
            if not isinstance(cmd, nc.Hello):
                if isinstance(cmd, nc.Pong):
                    return
                self._fatal(4005, getattr(cmd, "id", None))
                return
            self._hello(cmd)
            return
        try:
            if isinstance(cmd, nc.Publish):
                await self._publish(cmd)
            elif isinstance(cmd, nc.Subscribe):
                await self._subscribe(cmd)
            elif isinstance(cmd, nc.Unsubscribe):
                self.node.unsubscribe(sess, cmd.sub)
                sess.push(self.codec.encode_reply(cmd.id, {}))
            elif isinstance(cmd, nc.Ping):
                sess.push(self.codec.encode_push("pong", **({} if cmd.id is None else {"id": cmd.id})))
            elif isinstance(cmd, nc.Pong):
                pass
            elif isinstance(cmd, nc.Hello):
                self._fatal(4005, cmd.id, "hello already done")
            elif isinstance(cmd, nc.Auth):
                # Token refresh (native.md §2): new permissions and expiry; a bad token is fatal (4101).
                self.node.login(sess, cmd.token, self.peer)
                self._publisher = Publisher("native", sess.user, sess.id, "")
                sess.push(self.codec.encode_reply(cmd.id, {"user": sess.user}))
        except HubbubError as exc:
            sess.push(self.codec.encode_error(exc.code, getattr(cmd, "id", None), exc.detail))
            if exc.fatal:
                sess.end(exc.code)

    def _fatal(self, code: int, req_id: int | None, detail: str = "", **extra: Any) -> None:
        self.node.count_bad_input("native")
        self.session.push(self.codec.encode_error(code, req_id, detail, **extra))
        self.session.end(code)

    def _hello(self, cmd: nc.Hello) -> None:
        if cmd.v != 1:
            self._fatal(4006, cmd.id, supported=[1])
            return
        sess = self.session
        try:
            # The token of hello, else one presented on the upgrade (README §6); 4100/4101/4103 are fatal.
            self.node.login(sess, cmd.token or self.upgrade_token, self.peer)
        except HubbubError as exc:
            self.session.push(self.codec.encode_error(exc.code, cmd.id))
            self.session.end(exc.code)
            return
        sess.echo = cmd.echo
        self.batch = cmd.batch
        if cmd.batch:
            sess.batch_limit = self.max_frame
        self.hello_done = True
        # The common publish carries no idempotency key: one Publisher value serves them all.
        self._publisher = Publisher("native", sess.user, sess.id, "")
        self.node.attach(sess)
        pi = self.ping_interval
        sess.push(
            self.codec.encode_hello_reply(
                cmd.id,
                sess.id,
                sess.user,
                int(pi) if float(pi).is_integer() else pi,
                self.max_frame,
                self.max_subscriptions,
                self.batch,
            )
        )

    def publish_nowait(self, cmd: nc.Publish) -> bool:
        """Submit a publish at once when nothing asks to wait; False means call :meth:`handle` instead.

        The common case of the hot path: no coroutine, no closure, one request object per publish.
        """
        self.last_recv = time.monotonic()  # a publishing client is not silent (keepalive, native.md §2)
        if (
            not self.hello_done
            or self.inflight >= self.max_inflight
            or self.session.queued >= self.session.max_items
            or not self.node.has_room
        ):
            return False
        try:
            self._submit(cmd)
        except HubbubError as exc:
            self.session.push(self.codec.encode_error(exc.code, cmd.id, exc.detail))
            if exc.fatal:
                self.session.end(exc.code)
        return True

    async def publish_many(self, cmds: list[nc.Publish]) -> None:
        """Submit the publishes of one read, in order: as many as back-pressure allows in one batch (one node
        call, one FIFO extension), the rest one by one through :meth:`handle`, which waits for room.

        Stops early once the session ends (a fatal error answered one of them), as :meth:`handle` would.
        """
        self.last_recv = time.monotonic()
        sess = self.session
        done = 0
        if self.hello_done and self.node.has_room:
            room = min(self.max_inflight - self.inflight, sess.max_items - sess.queued)
            if room >= len(cmds):
                done = len(cmds) if self._submit_many(cmds) else 0
            elif room > 1:
                done = room if self._submit_many(cmds[:room]) else 0
        for cmd in cmds[done:] if done else cmds:
            await self.handle(cmd)
            if sess.ending or sess.kicked:
                return

    async def publish_run(self, run: nc.PublishRun) -> None:
        """Submit a run of common publishes, as :meth:`publish_many` would their commands: the requests are
        made straight from the run's lists. Publishes beyond the back-pressure room wait in :meth:`handle`.
        """
        self.last_recv = time.monotonic()
        sess = self.session
        n = len(run)
        done = 0
        if self.hello_done and self.node.has_room:
            room = min(self.max_inflight - self.inflight, sess.max_items - sess.queued)
            if room >= n:
                done = n if self._submit_run(run, n) else 0
            elif room > 1:
                done = room if self._submit_run(run, room) else 0
        if done == n:
            return
        for cmd in run.commands(done):
            await self.handle(cmd)
            if sess.ending or sess.kicked:
                return

    def _submit_run(self, run: nc.PublishRun, count: int) -> bool:
        """Submit the first ``count`` publishes of ``run`` as one batch; False when the node refused them
        (nothing was queued), as :meth:`_submit_many`."""
        pub = self._publisher
        channels, payloads, types, replies = run.channels, run.payloads, run.content_types, run.replies
        if count < len(replies):
            channels, payloads, types = channels[:count], payloads[:count], types[:count]
            replies = replies[:count]
        reqs = [AppendRequest(c, pub, p, t) for c, p, t in zip(channels, payloads, types, strict=True)]
        try:
            self.node.submit_many(reqs, self.session, self._done, self._done_many)
        except HubbubError:
            return False
        # The node completes publishes in submission order (see _submit).
        pending = self._pending
        if pending is None:
            pending = self._pending = deque()
        pending.extend(replies)
        self.inflight += count
        return True

    def _submit_many(self, cmds: list[nc.Publish]) -> bool:
        """Submit publishes as one batch; False when the node refused them (nothing was queued): the caller
        then submits them one by one, which answers each with its own error."""
        sess = self.session
        pub = self._publisher
        reqs = [
            AppendRequest(
                c.channel,
                pub if not c.idem else Publisher("native", sess.user, sess.id, c.idem),
                c.payload,
                c.content_type,
                c.headers,
                c.tags,
                c.idem,
            )
            for c in cmds
        ]
        try:
            self.node.submit_many(reqs, sess, self._done, self._done_many)
        except HubbubError:
            return False
        # The node completes publishes in submission order, so the replies' ids queue here (see _submit).
        pending = self._pending
        if pending is None:
            pending = self._pending = deque()
        pending.extend([(c.id, c.ack) for c in cmds])
        self.inflight += len(cmds)
        return True

    async def _publish(self, cmd: nc.Publish) -> None:
        # Read-side back-pressure: bounded publishes in flight and a bounded reply queue.
        sess = self.session
        if self.inflight >= self.max_inflight:
            self._acked.clear()
            await self._acked.wait()
        if sess.queued >= sess.max_items:
            await sess.wait_room()
        if not self.node.has_room:
            await self.node.writable()
        self._submit(cmd)

    def _submit(self, cmd: nc.Publish) -> None:
        sess = self.session
        req = AppendRequest(
            cmd.channel,
            self._publisher if not cmd.idem else Publisher("native", sess.user, sess.id, cmd.idem),
            cmd.payload,
            cmd.content_type,
            cmd.headers,
            cmd.tags,
            cmd.idem,
        )
        self.node.submit(req, sess, self._done)
        # The node completes publishes in submission order (Node.submit), so the replies' ids queue here.
        pending = self._pending
        if pending is None:
            pending = self._pending = deque()
        pending.append((cmd.id, cmd.ack))
        self.inflight += 1

    def _done(self, r: AppendResult | HubbubError) -> None:
        """A publish of this connection was committed (or failed): reply, and release read back-pressure."""
        assert self._pending is not None  # _submit queued this publish's entry
        rid, want_ack = self._pending.popleft()
        self.inflight -= 1
        if self.inflight < self.max_inflight // 2:
            self._acked.set()
        if isinstance(r, HubbubError):
            self.session.push(self.codec.encode_error(r.code, rid, r.detail))
        elif want_ack:
            self.session.push(self.codec.encode_publish_reply(rid, r.event, r.duplicate))

    def _done_many(self, results: list[AppendResult]) -> None:
        """A run of this connection's publishes was committed (``Node.submit_many``): the replies of those
        that asked for one, queued in one step."""
        pending = self._pending
        assert pending is not None  # _submit_many / _submit_run queued the entries
        k = len(results)
        self.inflight -= k
        if self.inflight < self.max_inflight // 2:
            self._acked.set()
        popleft = pending.popleft
        encode = self.codec.encode_publish_reply
        frames = []
        for r in results:
            rid, want_ack = popleft()
            if want_ack:
                frames.append(encode(rid, r.event, r.duplicate))
        if frames:
            self.session.push_replies(frames)

    async def _subscribe(self, cmd: nc.Subscribe) -> None:
        sess = self.session
        codec = self.codec
        spec = ReplaySpec(cmd.since, cmd.last, cmd.from_time)
        exact = cmd.pattern.is_exact

        def on_snapshot(plan: ReplayPlan) -> None:
            if exact:
                assert plan.position is not None
                sess.push(codec.encode_subscribe_reply(cmd.id, cmd.sub, plan.position, None))
            else:
                sess.push(codec.encode_subscribe_reply(cmd.id, cmd.sub, None, plan.top_time))
            for g in plan.gaps:
                sess.push(
                    codec.encode_push(
                        "gap",
                        sub=cmd.sub,
                        channel=g.channel,
                        since={"seq": g.since.seq, "epoch": g.since.epoch},
                        position={"seq": g.position.seq, "epoch": g.position.epoch},
                        reason=g.reason,
                    )
                )

        def on_replayed(plan: ReplayPlan) -> None:
            fields: dict[str, Any] = {"sub": cmd.sub, "replayed": plan.sent}
            if exact and plan.position is not None:
                fields["position"] = {"seq": plan.position.seq, "epoch": plan.position.epoch}
            sess.push(codec.encode_push("recovered", **fields))

        await self.node.subscribe(
            sess, cmd.sub, cmd.pattern, cmd.tags, spec, on_snapshot=on_snapshot, on_replayed=on_replayed
        )

    # -- outbound ---------------------------------------------------------------------------------------

    async def write_loop(self) -> None:
        """Drain the session's queue to the socket until the session ends; then close the connection."""
        sess = self.session
        codec = self.codec
        try:
            while True:
                if self.batch:
                    entries = await sess.next_entries(self.max_frame)
                    if not entries:
                        break
                    self.last_send = time.monotonic()
                    await self._send_batches(entries)
                    del entries
                    continue
                frames = await sess.next_frames(self.max_frame)
                if not frames:
                    break
                self.last_send = time.monotonic()
                if self._send_many is not None and len(frames) > 1:
                    await self._send_many(frames)
                else:
                    for f in frames:
                        await self._send(f)
                # Not kept while waiting for the next frames: a connection idle after a burst would hold it.
                del frames
            if sess.kicked:
                if sess.kicked != SHUTDOWN_CODE:
                    with contextlib.suppress(Exception):
                        await self._send(codec.encode_error(sess.kicked))
                await self._close(sess.kicked)
            elif sess.ending:
                await self._close(sess.ending)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception:
            log.debug("native write loop ended", exc_info=True)

    async def _send_batches(self, entries: list[bytes | FrameRun]) -> None:
        """Send queued entries packed into ``batch`` frames within ``max_frame`` (native.md §3.5), in order.

        A long run of events (:class:`FrameRun`) goes out as its own batch frames, packed once for every
        connection that holds the same run; single frames and short runs between them are packed together.
        """
        limit = self.max_frame
        pack = self.codec.encode_batches
        out: list[bytes] = []
        loose: list[bytes] = []
        for e in entries:
            if type(e) is not FrameRun:
                loose.append(e)
            elif e.frames is not None and e.packed is None and e.count < SHARED_PACK_MIN:
                loose += e.frames
            else:
                if loose:
                    out += pack(loose, limit)
                    loose = []
                out += e.batches(pack, limit)
        if loose:
            out += pack(loose, limit)
        # Small batches go out in one write; large ones one by one, as the transport writes a single message
        # without copying it (a write of several joins them).
        if len(out) > 1 and self._send_many is not None and sum(map(len, out)) <= SEND_MANY_MAX:
            await self._send_many(out)
        else:
            for f in out:
                await self._send(f)

    def timed_out(self) -> None:
        """No client frame for three ping intervals (called by :class:`Keepalive`): error 4304, then close."""
        self._fatal(4304, None)

    def start(self) -> None:
        """Start the writer task and the keepalive. Called once, before the first command."""
        self._writer = asyncio.ensure_future(self.write_loop())
        Keepalive.for_interval(self.ping_interval).add(self)

    async def finish(self) -> None:
        """The peer is gone: detach from the node and stop the writer and the keepalive."""
        Keepalive.for_interval(self.ping_interval).discard(self)
        self.node.detach(self.session)
        t = self._writer
        if t is not None:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    async def wait_written(self) -> None:
        """Wait until the write loop ended (after a graceful end or a kick)."""
        t = self._writer
        if t is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(t)


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

    __slots__ = ("_handle", "_loop", "_members", "interval", "period")

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

    def add(self, conn: NativeConnection) -> None:
        self._members[conn] = None
        if self._handle is None:
            self._handle = self._loop.call_later(self.period, self._tick)

    def discard(self, conn: NativeConnection) -> None:
        """Forget ``conn``. Idempotent."""
        self._members.pop(conn, None)
        if not self._members and self._handle is not None:
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
