"""Writing to a WebSocket from the server's side: the RFC 6455 framing of data frames (FIN set, no mask, no
per-message deflate: hubbub never negotiates it), and :class:`WsSink`, the write calls of one socket.

A burst of frames framed here goes out in one ``transport.write``, and a fan-out run's bytes are framed once
for every connection that holds it (the pump's ``wire``, :meth:`~hubbub.core.session.FrameRun.wire`).

Concurrency contract: called from the event loop thread; one writer (the connection's pump) per socket.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from aiohttp import WSMsgType

from hubbub.disconnect import Disconnect

if TYPE_CHECKING:
    from .ws_socket import WsSocket

__all__ = [
    "WS_WRITE_HIGH_WATER",
    "WsSink",
    "ws_binary_burst",
    "ws_frames",
    "ws_text_burst",
]

#: Bytes buffered on a WebSocket's transport above which a burst write waits for the peer to read.
WS_WRITE_HIGH_WATER = 1 << 20

#: The two-byte headers of server-to-client text and binary frames (FIN set, no mask) of payloads up to 125
#: bytes, by first byte and length: a burst's common frame takes its header from here.
_SHORT_HEADS: Final = {head: [bytes((head, n)) for n in range(126)] for head in (0x81, 0x82)}
#: The headers of longer payloads: up to 65,535 bytes, and beyond.
_MID_HEAD: Final = struct.Struct("!BBH").pack
_LONG_HEAD: Final = struct.Struct("!BBQ").pack


def ws_frames(frames: list[bytes], opcode: int) -> list[bytes]:
    """Server-to-client WebSocket frames (RFC 6455 §5.2: FIN set, no mask) for ``frames`` (``opcode`` text or
    binary, with or without the FIN bit), as header and payload pieces to join: one write of a burst."""
    head = 0x80 | opcode
    short = _SHORT_HEADS[head]
    sizes = list(map(len, frames))
    if sizes and sizes.count(sizes[0]) == len(sizes):
        # Frames of one size (a fan-out run of one payload size, as a rule): one header for all of them.
        n = sizes[0]
        hdr = short[n] if n < 126 else _MID_HEAD(head, 126, n) if n < 65536 else _LONG_HEAD(head, 127, n)
        out = [hdr] * (2 * len(sizes))
        out[1::2] = frames
        return out
    out = []
    add = out.append
    for f in frames:
        n = len(f)
        if n < 126:
            add(short[n])
        elif n < 65536:
            add(_MID_HEAD(head, 126, n))
        else:
            add(_LONG_HEAD(head, 127, n))
        add(f)
    return out


def ws_text_burst(frames: list[bytes]) -> bytes:
    """``frames`` as server-to-client text frames, in one piece: one write (a :class:`SessionPump`'s
    ``wire`` framing, shared by every connection, so that a fan-out run is framed once for all of them)."""
    return b"".join(ws_frames(frames, 0x1))


def ws_binary_burst(frames: list[bytes]) -> bytes:
    """:func:`ws_text_burst` for binary frames."""
    return b"".join(ws_frames(frames, 0x2))


class WsSink:
    """The send, close and burst-send callables of one WebSocket's connection (native's
    :class:`~hubbub.transports.native.NativeConnection`, a dialect's wire).

    Bound methods of a slotted object rather than closures: a connection that idles keeps these alive, and
    three closures with their cells cost several times as much.
    """

    __slots__ = ("opcode", "transport", "type", "ws")

    def __init__(self, ws: WsSocket, transport: asyncio.Transport | None, binary: bool) -> None:
        self.ws = ws
        self.transport = transport
        self.type = WSMsgType.BINARY if binary else WSMsgType.TEXT
        self.opcode = 0x82 if binary else 0x81

    async def send(self, data: bytes) -> None:
        # Frames are encoded already (JSON text is UTF-8): no decode and re-encode for text frames.
        await self.ws.send_frame(data, self.type)

    async def close(self, code: Disconnect) -> None:
        await self.ws.close(code=code)

    async def send_many(self, frames: list[bytes]) -> None:
        # One write for a burst of frames. Data frames from a server are unmasked and uncompressed here (no
        # per-message deflate is negotiated), so the RFC 6455 framing is the header alone.
        transport = self.transport
        if transport is None or transport.is_closing():
            for f in frames:
                await self.send(f)
            return
        await self.write(b"".join(ws_frames(frames, self.opcode)))

    @property
    def frame(self) -> Callable[[list[bytes]], bytes]:
        """The framing of this socket's data frames, for :meth:`write` (the pump's ``wire``)."""
        return ws_binary_burst if self.opcode == 0x82 else ws_text_burst

    async def write(self, data: bytes) -> None:
        """Write frames already framed (:attr:`frame`). A socket closing or closed is gone: as aiohttp's own
        writes do, this raises ``ConnectionResetError``."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the WebSocket's transport is closing")
        transport.write(data)
        if transport.get_write_buffer_size() > WS_WRITE_HIGH_WATER:
            await self.ws.drain()

    def writable(self) -> bool:
        """Whether :meth:`put` may write now: the transport is open and holds at most
        :data:`WS_WRITE_HIGH_WATER` bytes (the pump's write without a task)."""
        transport = self.transport
        return (
            transport is not None
            and not transport.is_closing()
            and transport.get_write_buffer_size() <= WS_WRITE_HIGH_WATER
        )

    def put(self, data: bytes) -> None:
        """:meth:`write` without the wait, for the pump while :meth:`writable`: the bytes go to the
        transport at once (a buffer it takes over its high-water mark is waited for by the next write)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the WebSocket's transport is closing")
        transport.write(data)
