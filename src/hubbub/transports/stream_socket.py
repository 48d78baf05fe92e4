"""The ``asyncio.Protocol`` of an admitted byte-stream socket (native TCP, mist TCP, qrpc, MQTT; plain or
TLS): its bytes go from ``data_received`` straight to the connection's :class:`Feeder` (the stream
driver's), with no task waking up for each read, and it is the protocol of the socket's
``asyncio.StreamWriter`` (write flow control, ``drain``, ``wait_closed``).

* **Reading.** Each read, in slices of at most the dialect's read size, is handed to the feeder in order. A
  feeder that must wait (an awaited step: the session's replies have no room, a call that awaits) returns
  False: the transport is paused until it calls :meth:`StreamSocket.resume`, and what still came meanwhile
  (a TLS transport may hand over what it decrypted already) is held, in order, and handed over first.
  Before the feeder starts, reads are held too; beyond twice the listener's reader limit the transport is
  paused (the bound of asyncio's ``StreamReader``).
* **The end.** The peer's end of stream (a half-close: the server may still write its last frames) or the
  transport's loss reaches the feeder (:meth:`Feeder.ended`) once everything read before it was handed
  over; a connection reset drops what was held, as a ``StreamReader``'s read raised at once.

An idle socket holds its transport, its feeder and a few flags: no task, no future.

Concurrency contract: everything runs on the event loop thread; one feeder per socket.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, cast, final

__all__ = ["Feeder", "StreamSocket"]


class Feeder(Protocol):
    """What a :class:`StreamSocket` hands its bytes to (the stream driver's reader)."""

    def __call__(self, data: bytes) -> bool:
        """One read (or a slice of one), in order. True: hand over the next; False: busy (it calls
        :meth:`StreamSocket.resume` when it is not) or done."""
        ...

    def ended(self) -> None:
        """The peer ended the stream or the transport is gone: nothing more comes."""
        ...


@final
class StreamSocket(asyncio.Protocol):
    """One admitted byte-stream socket (see the module docstring)."""

    __slots__ = (
        "_busy",
        "_chunk",
        "_closed",
        "_drains",
        "_eof",
        "_feeder",
        "_gone",
        "_held",
        "_held_size",
        "_limit",
        "_loop",
        "_paused",
        "_reading_paused",
        "_tls",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self.transport: asyncio.Transport | None = None
        self._feeder: Feeder | None = None
        self._chunk = 1 << 18
        #: Reads not handed over yet (before the feeder starts, or while it is busy).
        self._held: list[bytes] = []
        self._held_size = 0
        self._busy = True  # until a feeder starts
        self._eof = False  # the peer's end of stream, or the transport lost
        self._gone = False  # the transport is lost
        self._tls = False
        self._reading_paused = False
        self._paused = False  # writing: the transport's buffer is over its high-water mark
        self._drains: list[asyncio.Future[None]] = []
        self._closed: asyncio.Future[None] | None = None

    # -- reading ------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._tls = transport.get_extra_info("sslcontext") is not None

    def start(self, feeder: Feeder, chunk: int) -> None:
        """Hand the reads to ``feeder`` from here on, in slices of at most ``chunk`` bytes (what came
        before first)."""
        self._feeder = feeder
        self._chunk = chunk
        self.resume()

    def resume(self) -> None:
        """The feeder takes bytes again: hand over what is held, then read the transport again (or tell
        the feeder of the end that came meanwhile)."""
        feeder = self._feeder
        assert feeder is not None
        self._busy = False
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            self._held_size = 0
            self._hand(data)
            if self._busy:
                return
        if self._eof:
            self._busy = True
            feeder.ended()
            return
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._busy:
            self._hold(data)
        else:
            self._hand(data)

    def _hold(self, data: bytes) -> None:
        self._held.append(data)
        self._held_size += len(data)
        if self._held_size > 2 * self._limit:
            self._pause_reading()

    def _hand(self, data: bytes) -> None:
        feeder = self._feeder
        assert feeder is not None
        chunk = self._chunk
        while True:
            rest = b""
            if len(data) > chunk:
                data, rest = data[:chunk], data[chunk:]
            if not feeder(data):
                self._busy = True
                if rest:
                    self._held.insert(0, rest)
                    self._held_size += len(rest)
                self._pause_reading()
                return
            if not rest:
                return
            data = rest

    def _pause_reading(self) -> None:
        transport = self.transport
        if not self._reading_paused and transport is not None and not self._gone:
            self._reading_paused = True
            transport.pause_reading()

    def eof_received(self) -> bool:
        self._end()
        # A half-close: the server's side stays open for its last frames (TLS closes, whatever is said).
        return not self._tls

    def _end(self) -> None:
        if self._eof:
            return
        self._eof = True
        feeder = self._feeder
        if feeder is not None and not self._busy:
            self._busy = True
            feeder.ended()

    # -- writing (the protocol of the socket's ``StreamWriter``) --------------------------------------------

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def _wake(self) -> None:
        drains, self._drains = self._drains, []
        for waiter in drains:
            if not waiter.done():
                waiter.set_result(None)

    async def _drain_helper(self) -> None:
        """``StreamWriter.drain``'s wait: while the transport's buffer is over its high-water mark."""
        if self._gone:
            raise ConnectionResetError("Connection lost")
        if not self._paused:
            return
        waiter = self._loop.create_future()
        self._drains.append(waiter)
        await waiter

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        """``StreamWriter.wait_closed``'s wait: until the transport is lost."""
        closed = self._closed
        if closed is None:
            closed = self._closed = self._loop.create_future()
            if self._gone:
                closed.set_result(None)
        return closed

    # -- the end ------------------------------------------------------------------------------------------

    def connection_lost(self, exc: BaseException | None) -> None:
        self._gone = True
        if exc is not None:  # a reset: what was read and not handed over is dropped
            self._held.clear()
            self._held_size = 0
        self._wake()
        closed = self._closed
        if closed is not None and not closed.done():
            closed.set_result(None)
        self._end()
