"""The WebSocket driver: one connection of any dialect over a WebSocket, from the upgrade to the close
(ARCHITECTURE §2).

A dialect's route handler checks the upgrade (:func:`upgradable`), authenticates it, answers it and takes
the connection from aiohttp (:func:`~hubbub.transports.ws_socket.take_over`: a
:class:`~hubbub.transports.ws_socket.WsSocket`), builds its wire (a :class:`FrameWire`: a
:class:`~hubbub.transports.wire.DialectWire`, or native's :class:`~hubbub.transports.native.NativeConnection`)
and its sans-I/O connection (:class:`~hubbub.dialects.spec.FrameConnection`), and hands both to
:func:`run_websocket` in a task of the connection's own (:func:`detach`), then returns: aiohttp's request,
its tasks and the handler's frames are freed while the connection lives. :func:`run_websocket`:

* runs every task of the connection (its write loop, its keepalive) in one
  :class:`~hubbub.transports.lifetime.Lifetime`;
* hands the frames to the dialect from the socket's ``data_received`` (:class:`_Reader`), only while the
  connection's replies have room (the rule of :mod:`~hubbub.transports.backpressure`: the transport is
  paused until they have), each text or binary frame to the wire's receiver (the connection's actions,
  carried out before the next frame is handed over: the socket waits while an awaited step runs; a frame
  the wire took without waiting, native's common publish, costs no coroutine); pings are answered; an idle
  connection has no task reading it and holds no frame;
* counts a message over ``max_frame`` (the socket sent close 1009, protocols README §9) as the dialect's
  bad input and a refused ``max_frame``, and any other broken frame (1002, 1007) as bad input of ``http``
  (the WebSocket layer's, as the listener counts its own);
* pings every ``ping_interval_s`` and closes 1001 after ``read_timeout_s`` of silence (README §8), where
  the dialect's spec asks for a keepalive;
* on the way out, closes the socket with the session's end or kick reason through the spec's close mapping
  (1001 when the peer or the server ended it without one).

A socket the server opened itself (the WearScript link up, an aiohttp client socket) is read the same way by
a loop over its messages (:func:`_read`).

Concurrency contract: called from the event loop thread; one reader per connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, Protocol, TypeAlias, cast, final

from aiohttp import WSMsgType, web

from hubbub.auth import Identity
from hubbub.core.api import Core, Session
from hubbub.dialects.spec import DialectSpec, FrameConnection
from hubbub.disconnect import Disconnect
from hubbub.ws_frames import BINARY, PING, PONG

from .accept import peer_name
from .backpressure import Messages, Socket, take_ready
from .lifetime import Lifetime
from .pump import keepalive, quietly, stopped
from .ws_socket import WsSocket

__all__ = [
    "WS_CONNECTIONS",
    "BurstWire",
    "FrameWire",
    "Keepalive",
    "Receiver",
    "detach",
    "run_websocket",
    "upgradable",
]

log = logging.getLogger("hubbub.ws")

#: A keepalive's ``(ping_interval_s, read_timeout_s)``.
Keepalive = tuple[float, float]
#: A wire's step for one frame (``frame``, ``binary``): None when it was carried out already, else what to
#: await before the next frame is read.
Receiver: TypeAlias = Callable[[bytes | str, bool], Awaitable[None] | None]


class FrameWire(Protocol):
    """One WebSocket connection as the driver runs it: a dialect's
    :class:`~hubbub.transports.wire.DialectWire`, or a binding's own (native's connection, whose hot path
    takes a common publish without a coroutine)."""

    @property
    def session(self) -> Session: ...

    @property
    def node(self) -> Core: ...

    @property
    def spec(self) -> DialectSpec: ...

    @property
    def done(self) -> bool:
        """The connection ends: read no more."""
        ...

    #: Monotonic time of the last frame received (keepalives).
    last_recv: float

    def start(self, group: Lifetime, identity: Identity | None) -> None:
        """Bind ``identity`` (None: none yet) and start the connection's tasks in ``group``."""
        ...

    def receiver(self, conn: FrameConnection | None) -> Receiver:
        """The step that carries out one frame (through ``conn``, the sans-I/O connection, where the wire
        takes one)."""
        ...

    async def finish(self) -> None:
        """The reader is done: a pending close goes out, the session leaves the node, the tasks stop."""
        ...


class BurstWire(FrameWire, Protocol):
    """A wire that takes a burst of frames at once (native's connection)."""

    def burst(self, frames: list[bytes | str]) -> Awaitable[None]:
        """Carry out a burst of frames (those aiohttp's reader parsed from one read, in order) before the
        next frame is read, with read-side back-pressure between them."""
        ...


#: The tasks of the app's open WebSocket connections (:func:`detach`), which the server waits for when it
#: stops.
WS_CONNECTIONS: Final = web.AppKey("hubbub_ws_connections", set[asyncio.Task[None]])


def upgradable(
    request: web.Request,
    max_frame: int,
    headers: dict[str, str] | None = None,
    protocols: tuple[str, ...] = (),
) -> web.WebSocketResponse | None:
    """The upgrade's answer for ``request`` (the dialect's subprotocols, ``headers``; no compression: hubbub
    negotiates no extension), for :func:`~hubbub.transports.ws_socket.take_over`, or None when the request
    is no WebSocket upgrade (the route answers 400)."""
    ws = web.WebSocketResponse(protocols=protocols, max_msg_size=max_frame, autoping=False, compress=False)
    if headers:
        ws.headers.update(headers)
    return ws if ws.can_prepare(request).ok else None


def detach(request: web.Request, connection: Coroutine[Any, Any, object]) -> None:
    """Run ``connection`` (:func:`run_websocket` on a taken-over socket) in a task of its own, which the
    server waits for when it stops: the route's handler returns, and aiohttp's request with it."""
    task: asyncio.Task[None] = asyncio.get_running_loop().create_task(_connection(connection))
    tasks = request.app.get(WS_CONNECTIONS)
    if tasks is not None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _connection(connection: Coroutine[Any, Any, object]) -> None:
    try:
        await connection
    except (asyncio.CancelledError, ConnectionError):
        pass
    except Exception:
        # aiohttp logged a handler's failure; the connection's own task logs it (no one awaits it).
        log.exception("a WebSocket connection failed")


async def run_websocket(
    ws: Socket | WsSocket,
    wire: FrameWire,
    conn: FrameConnection | None,
    identity: Identity | None,
    *,
    keepalive_s: Keepalive | None = None,
    started: Callable[[], Awaitable[None]] | None = None,
    finishing: Callable[[], None] | None = None,
    bursts: int = 0,
) -> None:
    """Run one connection over the open ``ws`` until it ends; the socket is closed on return. ``started``
    runs once the session is attached (a greeting), ``finishing`` once the reader is done, before the
    session leaves the node (departure notices, rosters). ``conn`` is None for a wire that reads frames
    itself (native). With ``bursts`` (the most frames a :class:`BurstWire` takes at once; 0: none), a frame
    and the ones parsed with it go to the wire's ``burst`` at once."""
    sess = wire.session
    if not sess.peer:
        sess.peer = peer_name(ws.get_extra_info("peername"))
    try:
        async with Lifetime() as group:
            wire.start(group, identity)
            if started is not None:
                await started()
            alive: asyncio.Task[None] | None = None
            if keepalive_s is not None:
                interval, silence = keepalive_s
                ping = keepalive(wire, sess, wire.node, sess.dialect, ws.ping, interval, silence)
                alive = group.create_task(ping)
            try:
                if isinstance(ws, WsSocket):
                    reader = _Reader(ws, wire, wire.receiver(conn), bursts, group)
                    ws.start(reader)
                    await reader.ended
                else:
                    await _read(ws, wire, wire.receiver(conn), bursts)
            finally:
                if finishing is not None:
                    finishing()
                await wire.finish()
                if alive is not None:
                    alive.cancel()
                    await stopped(alive, wire.node, sess.dialect, sess.id)
    except asyncio.CancelledError:
        if isinstance(ws, WsSocket):
            ws.abort()  # the server stops: no waiting for the peer's close
    except ConnectionError:
        pass
    finally:
        if not ws.closed:
            code = wire.spec.close_code(sess.kicked or sess.ending or Disconnect.GOING_AWAY)
            await quietly(lambda: ws.close(code=code), wire.node, sess.dialect, sess.id, "close")
        if isinstance(ws, WsSocket):
            # The task lasts until the transport is gone (the peer's close, or CLOSE_TIMEOUT_S): the server,
            # stopping, waits for it or cancels it, and a cancelled one drops the connection.
            try:
                await ws.wait_lost()
            except asyncio.CancelledError:
                ws.abort()
                raise


@final
class _Reader:
    """A taken-over socket's frames to the dialect (:class:`~hubbub.transports.ws_socket.Reader`), called
    from the socket's ``data_received``: a step that must wait (room for replies, an awaited action) runs
    as a task of the connection's :class:`~hubbub.transports.lifetime.Lifetime` while the socket waits,
    and resumes it. ``ended`` is set once the connection reads no more."""

    __slots__ = ("bursts", "ended", "group", "receive", "sock", "wire")

    def __init__(
        self, sock: WsSocket, wire: FrameWire, receive: Receiver, bursts: int, group: Lifetime
    ) -> None:
        self.sock = sock
        self.wire = wire
        self.receive = receive
        self.bursts = bursts
        self.group = group
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __call__(self, opcode: int, data: bytes | str) -> bool:
        if self.ended.done():
            return False  # the connection is ending: nothing more is read
        wire = self.wire
        wire.last_recv = time.monotonic()
        if opcode == PING:
            self.sock.control(PONG, data if isinstance(data, bytes) else b"")
            return True
        if opcode == PONG:
            return True
        more = self.sock.take_ready(self.bursts) if self.bursts else None
        if more:
            more.insert(0, data)
            del data
            pending: Awaitable[None] | None = cast(BurstWire, wire).burst(more)
            del more
        else:
            pending = self.receive(data, opcode == BINARY)
        if pending is not None:
            self.group.create_task(self._step(pending))
            return False
        if wire.done:
            self.end()
            return False
        return True

    def room(self) -> bool:
        if self.ended.done():
            return False
        if self.wire.session.has_room:
            return True
        self.group.create_task(self._room())
        return False

    async def _step(self, pending: Awaitable[None]) -> None:
        try:
            await pending
        except ConnectionError:
            self.end()
            return
        del pending
        if self.wire.done:
            self.end()
        else:
            self.sock.resume()

    async def _room(self) -> None:
        sess = self.wire.session
        await sess.wait_room()
        if sess.closed or sess.kicked or sess.ending or self.wire.done:
            self.end()
        else:
            self.sock.resume()

    def failed(self, code: Disconnect) -> None:
        """A message over ``max_frame`` is the dialect's bad input and a refused ``max_frame``; any other
        broken frame (1002, 1007) the WebSocket layer's, counted with dialect ``http`` as the listener's."""
        sess = self.wire.session
        node = self.wire.node
        if code == Disconnect.MESSAGE_TOO_BIG:
            node.metrics.count_bad_input(sess.dialect)
            node.limiter.refused("max_frame", sess.dialect)
        else:
            node.metrics.count_bad_input("http")
            log.debug("broken WebSocket frame from %s: failed (%d)", sess.peer, code)
        self.end()

    def lost(self) -> None:
        self.end()

    def end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)


async def _read(ws: Socket, wire: FrameWire, receive: Receiver, bursts: int) -> None:
    """The connection's frames to the dialect, one at a time (or a burst at once, with ``bursts``), until it
    ends or the peer goes. Nothing of a burst is held while the next frame is awaited (an idle connection
    keeps this frame: only the wire, the receiver and a number)."""
    sess, node = wire.session, wire.node
    try:
        async for msg in Messages(ws, sess):
            wire.last_recv = time.monotonic()
            kind = msg.type
            if kind is WSMsgType.TEXT or kind is WSMsgType.BINARY:
                more = await take_ready(ws, bursts) if bursts else None
                if more:
                    more.insert(0, msg.data)
                    del msg
                    pending: Awaitable[None] | None = cast(BurstWire, wire).burst(more)
                    del more
                else:
                    pending = receive(msg.data, kind is WSMsgType.BINARY)
                    del msg  # not held while the next frame is awaited
                if pending is not None:
                    await pending
                    del pending
            elif kind is WSMsgType.PING:
                await ws.pong(msg.data)
            elif kind is not WSMsgType.PONG:
                if kind is WSMsgType.ERROR and getattr(msg.data, "code", None) == Disconnect.MESSAGE_TOO_BIG:
                    # aiohttp refused a frame over limits.max_frame and sent close 1009 itself.
                    node.metrics.count_bad_input(sess.dialect)
                    node.limiter.refused("max_frame", sess.dialect)
                break
            if wire.done:
                break
    except ConnectionError:
        pass
