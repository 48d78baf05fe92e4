"""The socket pump: one write loop for every connection, whatever its dialect and transport.

A :class:`SessionPump` drains one session's bounded queue to a socket (a WebSocket, a TCP stream) and closes
the connection with the session's :class:`~hubbub.disconnect.Disconnect` reason once the session ends. The
dialect shapes what goes out through three optional hooks, never through a loop of its own:

* ``pack``: for a session with ``batch_limit`` set (native ``batch`` frames), how queued entries become
  batch frames; runs shared by several sessions are packed once for all of them.
* ``on_frames``: sees every list of frames before it is written (guble tracks its live position there).
* ``farewell``: the frame to send before closing a kicked session (native's error frame), or ``None``.
* ``wire``: for a transport that frames messages itself (a :class:`Wire`: a WebSocket's frame headers, and
  the raw write of the framed bytes), the queue is taken with its runs whole and each fan-out run is framed
  once for every connection that holds it (:meth:`~hubbub.core.session.FrameRun.wire`): a subscriber's
  share of a fan-out is then one write of shared bytes, as a batching session's is.

``keepalive`` (seconds, frame) writes the frame whenever the queue stayed empty that long (SSE's comment
line); dialects that ping from their own timers (native's :class:`~hubbub.transports.native.Keepalive`,
ivy) or leave it to the WebSocket layer (guble) do not set it.

Failures of the socket end the loop: an expected one (the peer went away: ``ConnectionError``) quietly, a
peer that read nothing for the write timeout (:class:`WriteTimeout`) with a count in the node's
``write_timeouts``, any other with a warning naming the connection and a count in the node's ``io_errors``
(:func:`io_failed`). Either way the session is closed then: nothing more can be written, and a reader waiting
for room in its queue (``Session.wait_room``, read-side back-pressure) must wake, see the connection gone and
end it, or the connection would hold its session, subscriptions and connection slot for good. The loop never
raises (only cancellation propagates), so it runs as a task of the connection's
:class:`~hubbub.transports.lifetime.Lifetime` without taking the connection down with it.

An idle connection need not hold a task for its write loop: :meth:`SessionPump.start` runs it only while
there is something to write. The loop parks once the queue is empty (:meth:`~hubbub.core.session.Session.
call_when_ready`: a callback, no coroutine, no future) and a new task takes over when a frame is queued or the
session ends; a connection whose queue stays empty holds none (a task, its coroutines and its future are some
1.4 KiB per connection). :meth:`SessionPump.stop` ends it either way.

A woken pump of a socket that can write at once (``direct``, a :class:`Direct`: a byte stream's transport,
whose write goes to the kernel right away while its buffer is below its high-water mark; or a ``wire``, a
WebSocket's, whose :meth:`Wire.put` does the same with the bytes it framed) needs no task at all: one callback
at the end of the loop step that queued the frame (``call_soon``, so that every frame of that step, a commit's
whole fan-out, goes out in the same write), or at the end of the commit that queued it (which holds its
writes, :mod:`hubbub.core.flushes`), takes the queue and writes it. Only what must wait (a buffer over its
high-water mark, the session's end and close, a batching session's frames on a ``wire``) goes to a task,
which waits for the room as before. This spares each event delivered at light load a task's creation, its
coroutines and a loop step, which is most of the write's share of the latency (bench/suite.py ``latency``),
and a fan-out to many connections a task per connection for each commit.

Concurrency contract: everything runs on the event loop thread; at most one task per connection runs
:meth:`run` at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, final

from hubbub.core.api import Core, Disconnect, Session
from hubbub.core.flushes import Deferred, call_soon
from hubbub.core.session import FrameRun

__all__ = [
    "SEND_MANY_MAX",
    "SHARED_PACK_MIN",
    "Alive",
    "Direct",
    "Pack",
    "SessionPump",
    "Wire",
    "WriteTimeout",
    "grace_left",
    "io_failed",
    "keepalive",
    "quietly",
    "stopped",
]

log = logging.getLogger("hubbub.transport")

#: A queued run of at least this many event frames is packed on its own (and the packing shared); shorter
#: ones are packed together with the frames around them.
SHARED_PACK_MIN = 32
#: Batch frames of one writer pass up to this many bytes in all are written with one ``send_many``.
SEND_MANY_MAX = 64 << 10

#: Packs frames into batch frames of at most ``limit`` bytes (``BatchEncoder.encode_batches``).
Pack = Callable[[Sequence[bytes], int], list[bytes]]


class Wire(Protocol):
    """A socket that frames its messages itself (a WebSocket's :class:`~hubbub.transports.ws_write.WsSink`):
    the pump's ``wire``. One object rather than two callables: an idle connection keeps it."""

    @property
    def frame(self) -> Callable[[list[bytes]], bytes]:
        """Frames into the bytes of one write: a module-level function, the same object for every socket
        that frames alike (a fan-out run is framed once per such function)."""
        ...

    async def write(self, data: bytes) -> None:
        """Write bytes :attr:`frame` made."""
        ...

    def writable(self) -> bool:
        """Whether :meth:`put` may write now: the socket is open and its write buffer at or below its
        high-water mark."""
        ...

    def put(self, data: bytes) -> None:
        """Write bytes :attr:`frame` made at once, without waiting (only when :meth:`writable`); a failure
        raises as :meth:`write` would."""
        ...


class Direct(Protocol):
    """A socket whose writes go out without waiting while its buffer is below its high-water mark (a byte
    stream's transport): the pump's ``direct``, which writes there without a task (see the module docstring).
    """

    def writable(self) -> bool:
        """Whether the socket's write buffer is at or below its high-water mark: a write need not wait."""
        ...

    def write(self, frames: list[bytes]) -> None:
        """Write ``frames`` in the socket's framing (as ``send_many`` would) at once, without waiting; a
        failure raises as a write of the write loop would (``ConnectionError`` when the peer went away)."""
        ...


class WriteTimeout(ConnectionResetError):
    """A write waited longer than the write timeout for a peer that reads nothing; the connection was aborted.
    A ``ConnectionError``, so every path that expects a peer to go away handles it; the pump and
    :func:`quietly` count it in the node's ``metrics.write_timeouts`` (``hubbub_write_timeouts_total``)."""


def write_timed_out(node: Core | None, dialect: str, session_id: str) -> None:
    """Count a connection aborted by the write timeout (:class:`WriteTimeout`), per dialect."""
    if node is not None:
        node.metrics.count_write_timeout(dialect)
    log.info("write timeout: connection aborted", extra={"dialect": dialect, "session": session_id})


def grace_left() -> bool:
    """False once the running task (a connection's handler) was cancelled: a stopping server cancels the
    connections that outlast its grace period, and their close then skips every wait for the peer (the last
    frames, the close itself) and aborts the socket. A handler that swallowed the cancellation to run its
    ``finally`` still sees it here (``Task.cancelling``)."""
    task = asyncio.current_task()
    return task is None or not task.cancelling()


def io_failed(node: Core | None, dialect: str, session_id: str, what: str, exc: BaseException) -> None:
    """An unexpected socket failure: a warning with the connection's context, counted per dialect in the
    node's ``metrics.io_errors`` (``hubbub_io_errors``)."""
    if node is not None:
        node.metrics.count_io_error(dialect)
    log.warning(
        "%s failed on a %s connection: %s: %s",
        what,
        dialect,
        type(exc).__name__,
        exc,
        extra={"dialect": dialect, "session": session_id},
    )


async def quietly(
    io: Callable[[], Awaitable[object]], node: Core | None, dialect: str, session_id: str, what: str
) -> None:
    """Run the socket operation ``io()`` (a close, a last frame) on a connection that may be gone already:
    a peer that left (``ConnectionError``, a timeout) is expected and passes silently (an abort by the write
    timeout is counted), anything else is reported with :func:`io_failed`. Cancellation propagates."""
    try:
        await io()
    except WriteTimeout:
        write_timed_out(node, dialect, session_id)
    except (ConnectionError, TimeoutError):
        pass
    except Exception as exc:
        io_failed(node, dialect, session_id, what, exc)


async def stopped(task: Awaitable[object] | None, node: Core | None, dialect: str, session_id: str) -> None:
    """Wait for a connection's task that was cancelled or is ending (its write loop, its keepalive), or for
    ``wait_for``/``shield`` around one: its own failures are reported where they happen; a failure that
    escaped is reported here. Cancelled, timed out or the peer gone: nothing to report."""
    if task is None:
        return
    try:
        await task
    except (asyncio.CancelledError, ConnectionError, TimeoutError):
        pass
    except Exception as exc:
        io_failed(node, dialect, session_id, "connection task", exc)


@final
class SessionPump:
    """See the module docstring. ``last_send`` is the monotonic time of the last write (keepalive)."""

    __slots__ = (
        "_close",
        "_direct",
        "_farewell",
        "_keepalive",
        "_on_frames",
        "_pack",
        "_send",
        "_send_many",
        "_soon",
        "_task",
        "_wire",
        "last_send",
        "max_frame",
        "node",
        "session",
    )

    def __init__(
        self,
        node: Core,
        session: Session,
        *,
        send: Callable[[bytes], Awaitable[object]],
        close: Callable[[Disconnect], Awaitable[object]],
        max_frame: int,
        send_many: Callable[[list[bytes]], Awaitable[object]] | None = None,
        pack: Pack | None = None,
        on_frames: Callable[[list[bytes]], None] | None = None,
        farewell: Callable[[Disconnect], bytes | None] | None = None,
        keepalive: tuple[float, bytes] | None = None,
        wire: Wire | None = None,
        direct: Direct | None = None,
    ) -> None:
        self.node = node
        self.session = session
        self._send = send
        self._close = close
        self._send_many = send_many
        self._pack = pack
        self._on_frames = on_frames
        self._farewell = farewell
        self._keepalive = keepalive
        # Only for a plain writer: on_frames and keepalive work on the frames one by one.
        self._wire = wire if on_frames is None and keepalive is None else None
        # Only for a loop that parks (start): a keepalive loop waits with nothing queued.
        self._direct = direct if keepalive is None else None
        self._soon: asyncio.Handle | Deferred | None = None
        self.max_frame = max_frame
        self.last_send = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Run the write loop whenever there is something to write (see the module docstring), until
        :meth:`stop`. Not for a pump with ``keepalive``, whose loop writes when nothing is queued."""
        assert self._keepalive is None
        self.session.call_when_ready(self._resume)

    def _resume(self) -> None:
        """Something to write (the session's callback): with a ``direct`` socket, a callback at the end of
        this loop step, or of the commit that queued it (:mod:`~hubbub.core.flushes`), writes it
        (:meth:`_write_now`); else, and for the session's end, a task runs the loop until the queue is
        empty."""
        sess = self.session
        if sess.kicked or sess.closed or sess.ending or (self._direct is None and not self._writes_now()):
            self._task = asyncio.get_running_loop().create_task(self.run(park=True))
        else:
            self._soon = call_soon(self._write_now)

    def _writes_now(self) -> bool:
        """Whether this pump writes without a task (see the module docstring): it has a ``direct`` socket,
        or a ``wire`` and the loop would write through it (a batching session's frames go out as the loop's
        ``send``s, one per large batch frame, so they keep the task)."""
        if self._direct is not None:
            return True
        return self._wire is not None and not (self.session.batch_limit and self._pack is not None)

    def _write_now(self) -> None:
        """Write what is queued to the ``direct`` socket (or the ``wire``, framed as the loop frames it)
        while it takes it without waiting, then park again; what must wait (a buffer over its high-water
        mark, the session's end or close) goes to a task. Takes at most ``max_frame`` bytes of the queue per
        write, as the loop does."""
        self._soon = None
        sess = self.session
        direct = self._direct
        wire = self._wire if direct is None else None
        try:
            if wire is not None:
                while sess.queued and not (sess.kicked or sess.closed or sess.ending) and wire.writable():
                    data = self._wired(sess.take_entries(self.max_frame))
                    self.last_send = time.monotonic()
                    wire.put(data)
            else:
                assert direct is not None
                while sess.queued and not (sess.kicked or sess.closed or sess.ending) and direct.writable():
                    if sess.batch_limit and self._pack is not None:
                        out = self._packed(sess.take_entries(self.max_frame))
                    else:
                        out = sess.take_frames(self.max_frame)
                        if self._on_frames is not None:
                            self._on_frames(out)
                    self.last_send = time.monotonic()
                    direct.write(out)
        except Exception as exc:
            self._failed(exc)  # the session is closed: nothing more to write
            return
        if sess.queued or sess.kicked or sess.closed or sess.ending:
            self._task = asyncio.get_running_loop().create_task(self.run(park=True))
        else:
            sess.call_when_ready(self._resume)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task running the write loop started by :meth:`start`; None while it is parked, or while a
        ``direct`` write waits for the end of the loop step. Once the session ended it stays, done when the
        connection is closed."""
        return self._task

    def current(self) -> asyncio.Task[None] | None:
        """:attr:`task`, once a ``direct`` write still due at the end of this loop step was done now: a
        session that ended since (a fatal error's reply, then the close) has its last run then, which a
        connection's finish waits for."""
        soon = self._soon
        if soon is not None:
            soon.cancel()
            self._write_now()
        return self._task

    def stop(self) -> asyncio.Task[None] | None:
        """Stop what :meth:`start` started: the parked loop starts no more, a running one is cancelled (the
        task is returned, to be awaited)."""
        self.session.forget_ready(self._resume)
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        task = self._task
        if task is not None:
            task.cancel()
        return task

    async def run(self, *, park: bool = False) -> None:
        """Drain the session's queue to the socket until the session ends; then close the connection. With
        ``park`` (:meth:`start`), return once the queue is empty instead of waiting, to be run again."""
        sess = self.session
        send, send_many, on_frames = self._send, self._send_many, self._on_frames
        keepalive = self._keepalive
        try:
            while True:
                if park and not sess.queued and not (sess.kicked or sess.closed or sess.ending):
                    self._task = None
                    sess.call_when_ready(self._resume)
                    return
                if sess.batch_limit and self._pack is not None:
                    entries = await sess.next_entries(self.max_frame)
                    if not entries:
                        break
                    self.last_send = time.monotonic()
                    await self._send_batches(entries)
                    del entries
                    continue
                if self._wire is not None:
                    entries = await sess.next_entries(self.max_frame)
                    if not entries:
                        break
                    self.last_send = time.monotonic()
                    await self._send_wired(entries)
                    del entries
                    continue
                if keepalive is None:
                    frames = await sess.next_frames(self.max_frame)
                else:
                    try:
                        frames = await asyncio.wait_for(sess.next_frames(self.max_frame), keepalive[0])
                    except TimeoutError:
                        await send(keepalive[1])
                        continue
                if not frames:
                    break
                self.last_send = time.monotonic()
                if on_frames is not None:
                    on_frames(frames)
                if send_many is not None and len(frames) > 1:
                    await send_many(frames)
                else:
                    for f in frames:
                        await send(f)
                # Not kept while waiting for the next frames: a connection idle after a burst would hold it.
                del frames
            reason = sess.kicked or sess.ending
            if reason:
                if sess.kicked and self._farewell is not None:
                    last = self._farewell(sess.kicked)
                    if last is not None:
                        await quietly(lambda: send(last), self.node, sess.dialect, sess.id, "farewell frame")
                await self._close(reason)
        except Exception as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        """A write failed: counted as its kind is (see the module docstring), and the session closed, so that
        a reader waiting for room wakes, sees the connection gone and ends it."""
        sess = self.session
        if isinstance(exc, WriteTimeout):
            write_timed_out(self.node, sess.dialect, sess.id)
        elif not isinstance(exc, ConnectionError):  # else the peer is gone: nothing to report
            io_failed(self.node, sess.dialect, sess.id, "write loop", exc)
        sess.close()

    async def _send_batches(self, entries: list[bytes | FrameRun]) -> None:
        """Send queued entries packed into batch frames within ``max_frame`` (native.md §3.5), in order.

        A long run of events (:class:`FrameRun`) goes out as its own batch frames, packed once for every
        connection that holds the same run; single frames and short runs between them are packed together.
        """
        out = self._packed(entries)
        # Small batches go out in one write; large ones one by one, as the transport writes a single message
        # without copying it (a write of several joins them).
        if len(out) > 1 and self._send_many is not None and sum(map(len, out)) <= SEND_MANY_MAX:
            await self._send_many(out)
        else:
            for f in out:
                await self._send(f)

    def _packed(self, entries: list[bytes | FrameRun]) -> list[bytes]:
        """The batch frames of queued entries, in order (see :meth:`_send_batches`)."""
        limit = self.max_frame
        pack = self._pack
        assert pack is not None
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
            out += pack(loose, limit) if len(loose) > 1 else loose  # (a frame alone goes as itself)
        return out

    async def _send_wired(self, entries: list[bytes | FrameRun]) -> None:
        """Send queued entries in one write of the transport's framing (:meth:`_wired`)."""
        wire = self._wire
        assert wire is not None
        await wire.write(self._wired(entries))

    def _wired(self, entries: list[bytes | FrameRun]) -> bytes:
        """Queued entries as the bytes of one write of the ``wire``'s framing, in order: each run framed once
        for every connection that holds it, the single frames between runs framed together."""
        wire = self._wire
        assert wire is not None
        frame = wire.frame
        pieces: list[bytes] = []
        loose: list[bytes] = []
        for e in entries:
            if type(e) is FrameRun:
                if loose:
                    pieces.append(frame(loose))
                    loose = []
                pieces.append(e.wire(frame))
            else:
                loose.append(e)
        if loose:
            pieces.append(frame(loose))
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class Alive(Protocol):
    """What :func:`keepalive` watches on a connection: whether it ended, and when it last received."""

    @property
    def done(self) -> bool: ...

    @property
    def last_recv(self) -> float: ...


async def keepalive(
    conn: Alive,
    session: Session,
    node: Core | None,
    dialect: str,
    ping: Callable[[], Awaitable[object]],
    interval: float,
    silence: float,
) -> None:
    """A WebSocket keepalive (protocols README §8): ``ping`` every ``interval`` seconds; the session ends
    with 1001 (``Disconnect.GOING_AWAY``) once nothing has arrived for ``silence`` seconds. A ping to a peer
    that is gone is left to the reader; any other failure is logged and counted (:func:`io_failed`)."""
    last_ping = time.monotonic()
    while not conn.done:
        now = time.monotonic()
        await asyncio.sleep(max(0.01, min(last_ping + interval, conn.last_recv + silence) - now))
        now = time.monotonic()
        if now - conn.last_recv >= silence:
            log.debug("read timeout", extra={"dialect": dialect, "session": session.id})
            session.kick(Disconnect.GOING_AWAY)
            return
        if now - last_ping >= interval:
            last_ping = now
            try:
                await ping()
            except ConnectionError:
                pass  # the peer is gone: the reader sees it and ends the connection
            except Exception as exc:
                io_failed(node, dialect, session.id, "ping", exc)
