"""The WebSocket driver: one connection of any dialect over a WebSocket, from the upgrade to the close
(ARCHITECTURE §2).

A dialect's route handler checks the upgrade (:func:`upgradable`), authenticates it and prepares the
socket, builds its :class:`~hubbub.transports.wire.DialectWire` and sans-I/O connection
(:class:`~hubbub.dialects.spec.FrameConnection`) and hands both to :func:`run_websocket`, which:

* runs every task of the connection (its write loop, its keepalive) in one
  :class:`~hubbub.transports.lifetime.Lifetime`;
* reads the frames one at a time, only while the connection's replies have room
  (:class:`~hubbub.transports.backpressure.Messages`), and hands each text or binary frame to the
  connection, whose actions the wire carries out before the next frame is read; pings are answered;
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

from aiohttp import WSMsgType, web

from hubbub.auth import Identity
from hubbub.dialects.spec import FrameConnection
from hubbub.disconnect import Disconnect

from .backpressure import Messages, Socket
from .lifetime import Lifetime
from .pump import keepalive, quietly
from .wire import DialectWire

__all__ = ["Keepalive", "run_websocket", "upgradable"]

#: A keepalive's ``(ping_interval_s, read_timeout_s)``.
Keepalive = tuple[float, float]


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
    wire: DialectWire,
    conn: FrameConnection,
    identity: Identity | None,
    *,
    keepalive_s: Keepalive | None = None,
    started: Callable[[], Awaitable[None]] | None = None,
    finishing: Callable[[], None] | None = None,
) -> None:
    """Run one connection over the open ``ws`` until it ends; the socket is closed on return. ``started``
    runs once the session is attached (a greeting), ``finishing`` once the reader is done, before the
    session leaves the node (departure notices, rosters)."""
    sess = wire.session
    try:
        async with Lifetime() as group:
            wire.start(group, identity)
            if started is not None:
                await started()
            if keepalive_s is not None:
                interval, silence = keepalive_s
                wire.spawn(keepalive(wire, sess, wire.node, sess.dialect, ws.ping, interval, silence))
            try:
                await _read(ws, wire, conn)
            finally:
                if finishing is not None:
                    finishing()
                await wire.finish()
    except (asyncio.CancelledError, ConnectionError):
        pass
    finally:
        if not ws.closed:
            code = wire.spec.close_code(sess.kicked or sess.ending or Disconnect.GOING_AWAY)
            await quietly(lambda: ws.close(code=code), wire.node, sess.dialect, sess.id, "close")


async def _read(ws: Socket, wire: DialectWire, conn: FrameConnection) -> None:
    """The connection's frames to the dialect, one at a time, until it ends or the peer goes."""
    sess, node = wire.session, wire.node
    try:
        async for msg in Messages(ws, sess):
            wire.last_recv = time.monotonic()
            kind = msg.type
            if kind is WSMsgType.TEXT or kind is WSMsgType.BINARY:
                await wire.run(conn.receive_frame(msg.data, binary=kind is WSMsgType.BINARY))
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
