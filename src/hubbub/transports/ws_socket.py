"""A WebSocket that hubbub serves itself once aiohttp has answered the upgrade: :func:`take_over` moves the
connection's transport from aiohttp's HTTP protocol to a :class:`WsSocket`, and the route's handler
returns, so that aiohttp's upgrade request, its parser, its tasks and the handler's frames are freed (they
were most of an idle connection's memory).

:class:`WsSocket` is the connection's ``asyncio.Protocol`` and its write side:

* ``data_received`` feeds the client's bytes to a :class:`~hubbub.ws_frames.FrameParser` (RFC 6455 on the
  server's side: masked frames, no extension, fragments reassembled up to the message limit, text UTF-8)
  and hands each message and ping or pong to its :class:`Reader` (the WebSocket driver's), as long as the
  reader takes them; a reader that must wait (back-pressure, an awaited step) stops the socket, which pauses
  the transport until :meth:`WsSocket.resume`. A frame that breaks the protocol fails the connection: a
  close frame with the code the parser gives (1002, 1007, 1009), then the transport is closed.
* Writes (``send_frame``, ``send_bytes``, ``ping``, ``close``) are the calls of aiohttp's
  ``WebSocketResponse`` that the dialects use, framed here (a server's frames: FIN set, no mask) and written
  to the transport; a write waits while the transport's buffer is over its high-water mark.
* The close handshake (RFC 6455 §5.5.1, §7.1.2): a close from the peer is echoed, then the transport is
  closed; after a close sent first, the peer's frames are read on and dropped until its close, which closes
  the transport at once, or for at most :data:`CLOSE_TIMEOUT_S`, after which the transport is aborted.
* The connection's place in the listener's limits (``limits.max_connections``) is released when the
  transport is lost.

An idle socket holds its transport, an empty parser, its reader and a few numbers: no task, no future.

Concurrency contract: everything runs on the event loop thread; one writer per socket (the connection's
pump), one reader (the driver's :class:`Reader`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import TYPE_CHECKING, Any, Final, Protocol, final

from aiohttp import WSMsgType, hdrs, web

from hubbub.disconnect import Disconnect
from hubbub.ws_frames import (
    BINARY,
    CLOSE,
    PING,
    PONG,
    TEXT,
    FrameError,
    FrameParser,
    close_payload,
    control_frame,
)

from .ws_write import WS_WRITE_HIGH_WATER, ws_frames

try:  # aiohttp's compiled XOR (a C loop over the bytes): some ten times the pure one's speed on a kilobyte
    from aiohttp._websocket.mask import (  # type: ignore[import-not-found]
        _websocket_mask_cython as _unmask_into,
    )
except ImportError:  # pragma: no cover - aiohttp built without its extensions
    from hubbub.ws_frames import unmask_into as _unmask_into

if TYPE_CHECKING:
    from hubbub.core.api import Limiter

__all__ = ["CLOSE_TIMEOUT_S", "Reader", "WsSocket", "take_over"]

#: Seconds a close sent by the server waits for the peer's close before the transport is aborted.
CLOSE_TIMEOUT_S: Final = 5.0
_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Reader(Protocol):
    """What a :class:`WsSocket` hands its frames to (the WebSocket driver's reader)."""

    def __call__(self, opcode: int, data: bytes | str) -> bool:
        """One message (``TEXT``, ``BINARY``) or ping or pong, in order. True: hand over the next; False: the
        reader is busy (it calls :meth:`WsSocket.resume` when it is not) or done."""
        ...

    def room(self) -> bool:
        """May a message be handed over now? False: not yet (the reader calls :meth:`WsSocket.resume`)."""
        ...

    def failed(self, code: Disconnect) -> None:
        """The client broke the protocol: the socket is failed with ``code``."""
        ...

    def lost(self) -> None:
        """The connection is gone (closed by either side, or lost)."""
        ...


@final
class WsSocket(asyncio.Protocol):
    """One taken-over WebSocket connection (see the module docstring)."""

    __slots__ = (
        "_busy",
        "_closed",
        "_closing",
        "_drain",
        "_gone",
        "_held",
        "_ip",
        "_limiter",
        "_lost",
        "_parser",
        "_reader",
        "_timer",
        "protocol",
        "transport",
    )

    def __init__(
        self,
        transport: asyncio.Transport,
        max_message: int,
        protocol: str | None,
        limiter: Limiter | None = None,
        ip: str = "",
    ) -> None:
        self.transport = transport
        #: The subprotocol the upgrade chose, if any.
        self.protocol = protocol
        self._parser = FrameParser(max_message, unmask=_unmask_into)
        self._reader: Reader | None = None
        #: A parsed message the reader had no room for yet (handed over first when it resumes).
        self._held: tuple[int, bytes | str] | None = None
        self._busy = True  # until a reader starts
        self._closing = False  # a close frame went out
        self._closed = False  # the transport is closing or lost
        self._gone = False  # the transport is lost
        self._drain: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._limiter = limiter
        self._ip = ip
        #: Set when the transport is lost, once someone waits for that (:meth:`wait_lost`).
        self._lost: asyncio.Future[None] | None = None

    # -- state --------------------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """A close went out or the transport is gone: nothing more is sent."""
        return self._closing or self._closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)

    # -- reading ------------------------------------------------------------------------------------------

    def start(self, reader: Reader) -> None:
        """Hand the frames to ``reader`` from here on (those that came with the upgrade first)."""
        self._reader = _UntilPeerClose(reader) if self._closing else reader
        self.resume()

    def resume(self) -> None:
        """The reader takes frames again: hand over what is parsed, then read the transport again."""
        if self._closed:
            return
        self._busy = False
        self._deliver()
        if not self._busy and not self._closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        if not self._busy:
            self._deliver()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself: connection_lost follows

    def _deliver(self) -> None:
        reader = self._reader
        assert reader is not None
        parser = self._parser
        while not self._busy:
            item = self._held
            if item is None:
                try:
                    item = parser.next()
                except FrameError as e:
                    self._fail(e.code)
                    return
                if item is None:
                    return
            op = item[0]
            if op == CLOSE:
                self._held = None
                self._closed_by_peer(item[1])
                return
            if op in (TEXT, BINARY) and not reader.room():
                self._held = item
                self._stop()
                return
            self._held = None
            if not reader(op, item[1]):
                self._stop()
                return

    def take_ready(self, most: int) -> list[bytes | str]:
        """Up to ``most`` more messages already parsed (a burst that came with the one just handed over),
        stopping before a control frame, a fragment or a frame not yet whole
        (:meth:`~hubbub.ws_frames.FrameParser.take`)."""
        if self._held is not None:
            return []
        return self._parser.take(most)

    def _stop(self) -> None:
        self._busy = True
        if not self._closed:
            self.transport.pause_reading()

    def _closed_by_peer(self, payload: bytes | str) -> None:
        """The peer's close (RFC 6455 §5.5.1): echo its code (unless ours went out first), then close."""
        self._busy = True
        if not self._closing:
            self._closing = True
            self._write(control_frame(CLOSE, bytes(payload[:2]) if isinstance(payload, bytes) else b""))
        self._close_transport(abort=False)

    def _fail(self, code: Disconnect) -> None:
        """Fail the connection (RFC 6455 §7.1.7): close ``code``, then the transport; nothing more is read."""
        self._busy = True
        reader = self._reader
        if reader is not None:
            reader.failed(code)
        if not self._closing:
            self._closing = True
            self._write(control_frame(CLOSE, close_payload(code, code.reason)))
        self._close_transport(abort=False)

    # -- writing ------------------------------------------------------------------------------------------

    async def send_frame(self, data: bytes, kind: WSMsgType) -> None:
        """One data frame (``kind`` text or binary; text is UTF-8 already)."""
        self._check()
        self._write(b"".join(ws_frames([data], TEXT if kind is WSMsgType.TEXT else BINARY)))
        await self.drain()

    async def send_bytes(self, data: bytes) -> None:
        await self.send_frame(data, WSMsgType.BINARY)

    async def send_str(self, data: str) -> None:
        await self.send_frame(data.encode(), WSMsgType.TEXT)

    def control(self, opcode: int, data: bytes) -> None:
        """Write a control frame now (a pong answering a ping), unless the socket is closing."""
        if not (self._closing or self._closed):
            self.transport.write(control_frame(opcode, data[:125]))

    async def ping(self, data: bytes = b"") -> None:
        self._check()
        self._write(control_frame(PING, data[:125]))

    async def pong(self, data: bytes = b"") -> None:
        self._check()
        self._write(control_frame(PONG, data[:125]))

    async def close(self, *, code: int = Disconnect.NORMAL, message: bytes = b"") -> bool:
        """Send a close with ``code`` (the close handshake, module docstring); False when one went out
        already or the transport is gone."""
        if self.closed:
            return False
        self._closing = True
        self._write(control_frame(CLOSE, close_payload(code) + message[:123]))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, self._close_transport, True)
        self._read_to_peer_close()
        return True

    def _read_to_peer_close(self) -> None:
        """After our close, read on (the reader may have stopped reading: it was done, or waiting) and drop
        what comes until the peer's close, which ends the connection at once (:meth:`_closed_by_peer`)."""
        if self._closed:
            return
        self._reader = _UntilPeerClose(self._reader)
        self._held = None
        self._busy = False
        self._deliver()
        if not self._busy and not self._closed:
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        """Write frames framed already (:func:`~hubbub.transports.ws_write.ws_frames`); raises
        ``ConnectionResetError`` once the socket is closing, as aiohttp's writes do."""
        self._check()
        self._write(data)

    @property
    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size()

    async def drain(self) -> None:
        """Wait while the transport's buffer is over its high-water mark."""
        if self._drain is None and self.transport.get_write_buffer_size() <= WS_WRITE_HIGH_WATER:
            return
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drain)

    def _check(self) -> None:
        if self._closing or self._closed:
            raise ConnectionResetError("the WebSocket is closing")

    def _write(self, data: bytes) -> None:
        if not self._closed:
            self.transport.write(data)

    def pause_writing(self) -> None:
        pass  # a write looks at the buffer's size itself (drain)

    def resume_writing(self) -> None:
        self._wake()

    def _wake(self) -> None:
        drain = self._drain
        if drain is not None:
            self._drain = None
            if not drain.done():
                drain.set_result(None)

    # -- the end ------------------------------------------------------------------------------------------

    def _close_transport(self, abort: bool) -> None:
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer.cancel()
        if self._closed:
            return
        self._closed = True
        if abort:
            self.transport.abort()
        else:
            self.transport.close()

    async def wait_lost(self) -> None:
        """Until the transport is lost."""
        if self._gone:
            return
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._lost)

    def abort(self) -> None:
        """Drop the connection now (the server stops, or the connection's task was cancelled)."""
        self._closing = True
        self._close_transport(abort=True)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = self._closing = self._busy = self._gone = True
        lost = self._lost
        if lost is not None and not lost.done():
            lost.set_result(None)
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer.cancel()
        limiter = self._limiter
        if limiter is not None:
            self._limiter = None
            limiter.release(self._ip)
        self._wake()
        reader = self._reader
        if reader is not None:
            reader.lost()


@final
class _UntilPeerClose:
    """The reader of a socket whose close went out first (RFC 6455 §1.4, §5.5.1): the peer's messages and
    pings before its close are dropped (nothing more is sent after a close); the end of the connection, or
    a broken frame, still reaches the connection's reader."""

    __slots__ = ("reader",)

    def __init__(self, reader: Reader | None) -> None:
        self.reader = reader

    def __call__(self, opcode: int, data: bytes | str) -> bool:
        return True

    def room(self) -> bool:
        return True

    def failed(self, code: Disconnect) -> None:
        if self.reader is not None:
            self.reader.failed(code)

    def lost(self) -> None:
        if self.reader is not None:
            self.reader.lost()


def _accept(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


async def take_over(
    request: web.Request, ws: web.WebSocketResponse, max_message: int
) -> tuple[WsSocket, web.StreamResponse]:
    """Answer ``request``'s upgrade (101, with ``ws``'s subprotocol choice and headers; aiohttp checked the
    handshake, ``ws.can_prepare``) and take its connection from aiohttp: a :class:`WsSocket` reading
    messages up to ``max_message`` bytes, and the response for the handler to return (sent already: aiohttp
    writes nothing more and forgets the connection). Raises ``ConnectionResetError`` when the peer is
    gone."""
    chosen = ws.can_prepare(request).protocol
    headers = {
        hdrs.UPGRADE: "websocket",
        hdrs.CONNECTION: "upgrade",
        hdrs.SEC_WEBSOCKET_ACCEPT: _accept(request.headers[hdrs.SEC_WEBSOCKET_KEY]),
    }
    if chosen is not None:
        headers[hdrs.SEC_WEBSOCKET_PROTOCOL] = chosen
    resp = web.StreamResponse(status=101, headers=headers)
    resp.headers.update(ws.headers)
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    handler = request.protocol
    hand_over = getattr(handler, "hand_over", None)
    if hand_over is not None:
        transport, tail, limiter, ip = hand_over()
    else:  # a plain aiohttp handler (not hubbub's listener): no limits to carry
        transport, tail, limiter, ip = _hand_over(handler), b"", None, ""
    sock = WsSocket(transport, max_message, chosen, limiter, ip)
    transport.set_protocol(sock)
    if tail:
        sock.data_received(tail)
    transport.pause_reading()  # until the driver's reader starts
    return sock, resp


def _hand_over(handler: web.RequestHandler) -> asyncio.Transport:
    transport = handler.transport
    if transport is None or transport.is_closing():
        raise ConnectionResetError("the connection closed during the upgrade")
    handler.transport = None
    web.RequestHandler.connection_lost(handler, None)
    return transport
