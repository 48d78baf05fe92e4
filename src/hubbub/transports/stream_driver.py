"""The byte-stream driver: one connection of any dialect over TCP or TLS, from the accepted socket to the
close (ARCHITECTURE §2).

A dialect's stream listener (:class:`~hubbub.transports.stream_listener.StreamListener`, which admits the
socket, makes the TLS handshake and holds the first-message deadline) hands each socket to
:func:`serve_stream` with the dialect's :class:`Opener`, which:

* opens the connection's :class:`StreamWire` before the first read (``open(b"")``) or, for a dialect that
  tells its variant from the first bytes (mist's generations), on the first read;
* hands each read of the socket (in slices of at most ``read_chunk`` bytes) to the wire from the socket's
  ``data_received`` (:class:`~hubbub.transports.stream_socket.StreamSocket`), whose actions (every message
  the read completes) are carried out before the next read is handed over, each waiting for its room
  (read-side back-pressure, :mod:`~hubbub.transports.backpressure`): a read the wire takes without waiting
  (a common publish) costs no task; one that must wait goes on in a task while the socket is paused. An idle
  connection has no task reading it;
* tells the listener the first complete message came (``Accepted.heard``);
* runs every task of the connection in one :class:`~hubbub.transports.lifetime.Lifetime`, ends the wire
  (its pending close goes out) and closes the socket on every path, cancellation included
  (:func:`close_stream`): no socket outlives its connection.

Every byte-stream connection writes through :func:`drain` (the write timeout) and ends through
:func:`close_stream`.

Concurrency contract: called from the event loop thread; one reader per connection.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Coroutine, Generator
from typing import Any, ClassVar, Generic, Protocol, TypeVar, final

from hubbub.core.api import Core, Session

from .accept import peer_name
from .lifetime import Lifetime
from .pump import WriteTimeout, grace_left, io_failed
from .stream_listener import READER_LIMIT, Accepted, Refusal, StreamListener

__all__ = [
    "CLOSE_WAIT_S",
    "WRITE_TIMEOUT_S",
    "Opener",
    "ServiceStreams",
    "StreamDirect",
    "StreamIO",
    "StreamWire",
    "close_stream",
    "drain",
    "serve_stream",
]

#: Seconds a closing connection may take to send what it still has (the last frames, a slow consumer's
#: error) before its socket is aborted: a peer that stopped reading must not hold the socket, nor keep the
#: server from shutting down.
CLOSE_WAIT_S = 5.0
#: Seconds a write may wait for a peer that stopped reading before the connection is aborted: the default of
#: ``limits.write_timeout_s``, which the server gives every TCP listener.
WRITE_TIMEOUT_S: float = 30.0


async def drain(writer: asyncio.StreamWriter, limit_s: float = WRITE_TIMEOUT_S) -> None:
    """``writer.drain()``, aborting the connection when the peer has not read for ``limit_s`` seconds
    (:class:`~hubbub.transports.pump.WriteTimeout`, which the write loop counts). The timer is set only when
    the transport's buffer is over its high-water mark (a drain that would wait): the common write costs
    nothing more. Every TCP listener's writes (native, mist, qrpc) go through it."""
    transport = writer.transport
    if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
        await writer.drain()
        return
    try:
        await asyncio.wait_for(writer.drain(), limit_s)
    except TimeoutError:
        transport.abort()
        raise WriteTimeout("the peer read nothing within the write timeout") from None


async def close_stream(
    writer: asyncio.StreamWriter, node: Core | None, dialect: str, session_id: str, what: str = "close"
) -> None:
    """Close a TCP connection's socket, on every path: ``close()`` (what is buffered still goes out), up to
    :data:`CLOSE_WAIT_S` for the peer to take it, else ``abort()``. A connection whose task is being cancelled
    (a stopping server cancels those that outlast its grace period) is aborted at once, and so is one whose
    wait is cancelled. Every TCP listener's connection (native, mist, qrpc) ends through it, last in its
    handler's ``finally``, so no socket outlives its handler's task: an unclosed one would only be found by
    the garbage collector, as a ``ResourceWarning``, or never while its event loop runs."""
    writer.close()
    if not grace_left():
        writer.transport.abort()
        return
    try:
        await asyncio.wait_for(writer.wait_closed(), CLOSE_WAIT_S)
    except BaseException as exc:
        # Not closed yet (timed out, cancelled) or ended by an error (then a no-op). Only then: after a close
        # that went through, CPython 3.11's abort() fails on the spent transport.
        writer.transport.abort()
        if isinstance(exc, ConnectionError | TimeoutError):
            return
        if isinstance(exc, Exception):
            io_failed(node, dialect, session_id, what, exc)
            return
        raise


class StreamDirect:
    """A byte stream's writes without waiting: the write loop's :class:`~hubbub.transports.pump.Direct`.
    ``parts`` gives the pieces of one write of frames in the dialect's framing, written with ``writelines``
    (the transport sends them together, without joining them first)."""

    __slots__ = ("_parts", "_transport", "_writer")

    def __init__(self, writer: asyncio.StreamWriter, parts: Callable[[list[bytes]], list[bytes]]) -> None:
        self._writer = writer
        self._transport = writer.transport
        self._parts = parts

    def writable(self) -> bool:
        transport = self._transport
        return transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]

    def write(self, frames: list[bytes]) -> None:
        self._writer.writelines(self._parts(frames))


class StreamIO:
    """A stream connection's writes, for its :class:`~hubbub.transports.wire.DialectWire`: ``send`` one
    frame, ``send_many`` a burst in one write, ``close`` the socket; a write waits ``write_timeout`` seconds
    at most for a peer that reads nothing (then the connection is aborted, ``WriteTimeout``)."""

    __slots__ = ("timeout", "writer")

    def __init__(self, writer: asyncio.StreamWriter, write_timeout: float) -> None:
        self.writer = writer
        self.timeout = write_timeout

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await drain(self.writer, self.timeout)

    async def send_many(self, frames: list[bytes]) -> None:
        self.writer.write(b"".join(frames))  # a stream: a burst of frames goes out in one write
        await drain(self.writer, self.timeout)

    async def close(self, code: object) -> None:
        self.writer.close()


class StreamWire(Protocol):
    """One byte-stream connection as the driver runs it (a dialect's binding over a
    :class:`~hubbub.transports.wire.DialectWire`)."""

    @property
    def session(self) -> Session: ...

    @property
    def done(self) -> bool: ...

    @property
    def messages(self) -> int:
        """Complete messages received so far."""
        ...

    def start(self, group: Lifetime) -> None: ...

    async def feed(self, data: bytes) -> None:
        """Carry out the actions of one read, in order, each waiting for the session's room."""
        ...

    async def finish(self) -> None: ...


class Opener(Protocol):
    """A dialect's stream side: its name, its read size, and its connections."""

    @property
    def dialect(self) -> str: ...

    @property
    def node(self) -> Core: ...

    @property
    def read_chunk(self) -> int: ...

    def open(self, first: bytes, acc: Accepted) -> StreamWire | None:
        """The connection of ``acc`` whose first bytes are ``first`` (``b""`` before the first read), or None
        while the dialect needs bytes to choose it."""
        ...


class _Served(Protocol):
    @property
    def node(self) -> Core: ...


S = TypeVar("S", bound=_Served)


class ServiceStreams(Generic[S]):
    """An :class:`Opener` whose connections belong to one service object (mist's TCP, qrpc, MQTT): it keeps
    the service and the write timeout each connection's :class:`StreamIO` gets; a subclass names its
    ``dialect`` and ``read_chunk`` and opens its connections (:meth:`io` gives one its socket's side)."""

    __slots__ = ("service", "write_timeout")

    dialect: ClassVar[str]
    read_chunk: ClassVar[int]

    def __init__(self, service: S, write_timeout: float) -> None:
        self.service = service
        self.write_timeout = write_timeout

    @property
    def node(self) -> Core:
        return self.service.node

    def io(self, acc: Accepted) -> StreamIO:
        """The send, send_many and close of ``acc``'s socket."""
        return StreamIO(acc.writer, self.write_timeout)


async def listen_streams(
    node: Core,
    dialect: str,
    opener: Opener,
    host: str,
    port: int,
    on_connection: Callable[[asyncio.Task[None]], None],
    *,
    first_message_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
    refusal: Refusal | None = None,
    reader_limit: int = READER_LIMIT,
) -> StreamListener:
    """Start ``dialect``'s listener on ``host:port``, every socket it admits run on this driver with
    ``opener`` (:func:`serve_stream`); admission, refusal and the first-message timeout are the listener's.
    ``on_connection`` is given each connection's task."""

    async def serve(acc: Accepted) -> None:
        await serve_stream(acc, opener)

    listener = StreamListener(
        node,
        dialect,
        serve,
        on_connection,
        first_message_timeout_s=first_message_timeout_s,
        ssl_context=ssl_context,
        refusal=refusal,
        reader_limit=reader_limit,
    )
    await listener.start(host, port)
    return listener


async def serve_stream(acc: Accepted, opener: Opener) -> None:
    """Run the connection of ``acc`` until it ends or the peer goes; the socket is closed on return."""
    async with Lifetime() as group:
        await _serve(acc, opener, group)


async def _serve(acc: Accepted, opener: Opener, group: Lifetime) -> None:
    dialect = opener.dialect
    feed = _Feed(acc, opener, group)
    try:
        wire = opener.open(b"", acc)
        if wire is not None:
            feed.begin(wire)
        if not feed.finished.done():
            acc.protocol.start(feed, opener.read_chunk)
        await feed.finished
    except (ConnectionError, asyncio.CancelledError):
        pass
    except Exception:
        logging.getLogger(f"hubbub.{dialect}").exception("%s TCP connection failed", dialect)
    finally:
        try:
            await feed.stop()
            if feed.wire is not None:
                await feed.wire.finish()
        finally:  # also when cancelled (a stopping server): no socket outlives the connection
            sid = feed.wire.session.id if feed.wire is not None else ""
            await close_stream(acc.writer, opener.node, dialect, sid)


@final
class _Resumed:
    """The rest of a wire's ``feed`` coroutine that was stepped once from ``data_received`` and is waiting
    on ``first`` (what it yielded): awaited in a task, it goes on where it stopped (a ``yield from`` of the
    started coroutine)."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, None]:
        coro, value = self._coro, self._first
        self._first = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:
                try:
                    value = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    value = coro.send(sent)
                except StopIteration:
                    return


@final
class _Feed:
    """A connection's reads to its wire, called from its socket's ``data_received``
    (:class:`~hubbub.transports.stream_socket.Feeder`): the wire's ``feed`` is stepped at once, and one that
    completes without waiting (the common publish) costs no task; one that must wait (room for replies, an
    awaited action) goes on in a task of the connection's :class:`~hubbub.transports.lifetime.Lifetime`
    while the socket waits, and resumes it. ``finished`` is set once the connection reads no more."""

    __slots__ = ("acc", "finished", "group", "opener", "peer", "step", "wire")

    def __init__(self, acc: Accepted, opener: Opener, group: Lifetime) -> None:
        self.acc = acc
        self.opener = opener
        self.group = group
        self.peer = peer_name(acc.writer.get_extra_info("peername"))
        self.wire: StreamWire | None = None
        self.step: asyncio.Task[None] | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def begin(self, wire: StreamWire) -> None:
        self.wire = wire
        wire.session.peer = self.peer
        wire.start(self.group)
        if wire.done:
            self.end()

    def __call__(self, data: bytes) -> bool:
        if self.finished.done():
            return False
        wire = self.wire
        if wire is None:
            wire = self.opener.open(data, self.acc)
            if wire is None:
                return True
            self.begin(wire)
            if self.finished.done():
                return False
        try:
            coro = wire.feed(data)
            del data
            try:
                waiting = coro.send(None)
            except StopIteration:
                pass
            else:
                self.step = self.group.create_task(self._step(_Resumed(coro, waiting)))
                return False
        except Exception as exc:
            self._failed(exc)
            return False
        return self._fed()

    def _fed(self) -> bool:
        wire = self.wire
        assert wire is not None
        if wire.messages:
            self.acc.heard()
        if wire.done:
            self.end()
            return False
        return True

    async def _step(self, rest: _Resumed) -> None:
        try:
            await rest
        except Exception as exc:
            self._failed(exc)
            return
        finally:
            self.step = None
        if self._fed():
            self.acc.protocol.resume()

    def _failed(self, exc: Exception) -> None:
        if not isinstance(exc, ConnectionError | asyncio.IncompleteReadError):
            dialect = self.opener.dialect
            logging.getLogger(f"hubbub.{dialect}").error("%s TCP connection failed", dialect, exc_info=exc)
        self.end()

    def ended(self) -> None:
        self.end()

    def end(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    async def stop(self) -> None:
        """The connection ends: a step still running is cancelled and waited for."""
        self.end()
        step = self.step
        if step is not None and not step.done():
            step.cancel()
            await asyncio.wait([step])
