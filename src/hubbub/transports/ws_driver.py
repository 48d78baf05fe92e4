"""The WebSocket driver: one connection of any dialect over a WebSocket, from the upgrade to the close
(ARCHITECTURE §2).

A dialect's route handler checks the upgrade (:func:`upgradable`), authenticates it and prepares the
socket, builds its wire (a :class:`FrameWire`: a :class:`~hubbub.transports.wire.DialectWire`, or native's
:class:`~hubbub.transports.native.NativeConnection`) and its sans-I/O connection
(:class:`~hubbub.dialects.spec.FrameConnection`) and hands both to :func:`run_websocket`, which:

* runs every task of the connection (its write loop, its keepalive) in one
  :class:`~hubbub.transports.lifetime.Lifetime`;
* reads the frames one at a time, only while the connection's replies have room
  (:class:`~hubbub.transports.backpressure.Messages`), and hands each text or binary frame to the wire's
  receiver (the connection's actions, carried out before the next frame is read; a frame the wire took
  without waiting, native's common publish, costs no coroutine); pings are answered; a frame is not kept
  while the next is awaited (an idle connection would hold its last one, up to ``max_frame`` bytes);
* counts a frame aiohttp refused as too large (it sent close 1009 itself, protocols README §9) as bad input
  and a refused ``max_frame``;
* pings every ``ping_interval_s`` and closes 1001 after ``read_timeout_s`` of silence (README §8), where
  the dialect's spec asks for a keepalive;
* on the way out, closes the socket with the session's end or kick reason through the spec's close mapping
  (1001 when the peer or the server ended it without one).

Concurrency contract: called from the event loop thread; one reader per connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeAlias, cast

from aiohttp import WSMsgType, web

from hubbub.auth import Identity
from hubbub.core.api import Core, Session
from hubbub.dialects.spec import DialectSpec, FrameConnection
from hubbub.disconnect import Disconnect

from .accept import peer_name
from .backpressure import Messages, Socket, take_ready
from .lifetime import Lifetime
from .pump import keepalive, quietly, stopped

__all__ = ["BurstWire", "FrameWire", "Keepalive", "Receiver", "run_websocket", "upgradable"]

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


def upgradable(
    request: web.Request,
    max_frame: int,
    headers: dict[str, str] | None = None,
    protocols: tuple[str, ...] = (),
    heartbeat: float | None = None,
) -> web.WebSocketResponse | None:
    """A WebSocket response for ``request`` (frames up to ``max_frame``, the dialect's subprotocols, pings
    answered by the reader, no compression), or None when the request is no WebSocket upgrade (the route
    answers 400). With ``heartbeat`` aiohttp pings every ``heartbeat`` seconds and answers pings itself
    (a dialect whose spec has no keepalive of the driver's)."""
    ws = web.WebSocketResponse(
        protocols=protocols,
        max_msg_size=max_frame,
        autoping=heartbeat is not None,
        heartbeat=heartbeat,
        compress=False,
    )
    if headers:
        ws.headers.update(headers)
    return ws if ws.can_prepare(request).ok else None


async def run_websocket(
    ws: Socket,
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
    and the ones aiohttp parsed with it (:func:`~hubbub.transports.backpressure.take_ready`) go to the
    wire's ``burst`` at once."""
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
                await _read(ws, wire, wire.receiver(conn), bursts)
            finally:
                if finishing is not None:
                    finishing()
                await wire.finish()
                if alive is not None:
                    alive.cancel()
                    await stopped(alive, wire.node, sess.dialect, sess.id)
    except (asyncio.CancelledError, ConnectionError):
        pass
    finally:
        if not ws.closed:
            code = wire.spec.close_code(sess.kicked or sess.ending or Disconnect.GOING_AWAY)
            await quietly(lambda: ws.close(code=code), wire.node, sess.dialect, sess.id, "close")


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
