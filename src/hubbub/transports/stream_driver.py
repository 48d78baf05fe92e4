"""The byte-stream driver: one connection of any dialect over TCP or TLS, from the accepted socket to the
close (ARCHITECTURE §2).

A dialect's stream listener (:class:`~hubbub.transports.stream_listener.StreamListener`, which admits the
socket, makes the TLS handshake and holds the first-message deadline) hands each socket to
:func:`serve_stream` with the dialect's :class:`Opener`, which:

* opens the connection's :class:`StreamWire` before the first read (``open(b"")``) or, for a dialect that
  tells its variant from the first bytes (mist's generations), on the first read;
* feeds each read to the wire, whose actions (every message the read completes) are carried out before the
  next read, each waiting for its room (read-side back-pressure, :mod:`~hubbub.transports.backpressure`):
  while the connection waits for bytes, in the socket's ``data_received`` as the read comes, the rest of a
  feed that must wait in the connection's task (:mod:`~hubbub.transports.stream_reads`);
* tells the listener the first complete message came (``Accepted.heard``);
* runs every task of the connection in one :class:`~hubbub.transports.lifetime.Lifetime`, ends the wire
  (its pending close goes out) and closes the socket on every path, cancellation included
  (:func:`close_stream`): no socket outlives its connection.

Every byte-stream connection writes through :func:`drain` (the write timeout) and ends through
:func:`close_stream`; one that its dialect ends (``close``, :func:`end_stream`) lingers first, on a plain
socket: the server's side is shut and the peer's last bytes are read and dropped until it ends its own
(:func:`linger`), so that its last answer is not lost to a reset.

Concurrency contract: called from the event loop thread; one reader per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import ClassVar, Final, Generic, Protocol, TypeVar

from hubbub.core.api import Core, Session
from hubbub.disconnect import Disconnect

from .accept import REFUSAL_LINGER_S, peer_name
from .lifetime import Lifetime
from .pump import WriteTimeout, grace_left, io_failed
from .stream_listener import READER_LIMIT, Accepted, Refusal, StreamListener
from .stream_reads import FINISHED, StreamReads, run_eagerly

__all__ = [
    "CLOSE_WAIT_S",
    "LINGER_S",
    "WRITE_TIMEOUT_S",
    "Opener",
    "ServiceStreams",
    "StreamDirect",
    "StreamIO",
    "StreamWire",
    "close_stream",
    "drain",
    "end_stream",
    "linger",
    "serve_stream",
]

#: Seconds a closing connection may take to send what it still has (the last frames, a slow consumer's
#: error) before its socket is aborted: a peer that stopped reading must not hold the socket, nor keep the
#: server from shutting down.
CLOSE_WAIT_S = 5.0
#: Seconds a connection the server ends (bad input, a limit, a kick) reads on for the peer to end its side
#: after the server's (:func:`linger`), before its socket is closed.
LINGER_S: Final = REFUSAL_LINGER_S
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
    the garbage collector, as a ``ResourceWarning``, or never while its event loop runs. A lingering close
    (:func:`linger`) first waits up to :data:`LINGER_S` for the peer's end of stream."""
    if not grace_left():
        writer.transport.abort()
        return
    reads = writer.transport.get_protocol()
    lingering = reads.lingering if isinstance(reads, StreamReads) else None
    if lingering is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(lingering), LINGER_S)
    writer.close()
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

    __slots__ = ("_parts", "_transport")

    def __init__(self, writer: asyncio.StreamWriter, parts: Callable[[list[bytes]], list[bytes]]) -> None:
        self._transport = writer.transport
        self._parts = parts

    def writable(self) -> bool:
        transport = self._transport
        return transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]

    def write(self, frames: list[bytes]) -> None:
        self._transport.writelines(self._parts(frames))  # (the writer's writelines, without its call)


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
        end_stream(self.writer, code)


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
    def read_chunk(self) -> int:
        """The most bytes fed at once from reads buffered while the connection was busy (a read handled as
        it comes is fed whole: the transport's, up to 256 KiB)."""
        ...

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
    reads, dialect = acc.reads, opener.dialect
    wire = opener.open(b"", acc)
    peer = peer_name(acc.writer.get_extra_info("peername"))

    quiet = True  # no complete message yet: the listener's first-message timer runs

    def read_now(data: bytes) -> Awaitable[None] | None:
        # A read handed over by the socket's data_received while the loop below waits (stream_reads): fed
        # here, up to its end or its first wait, whose rest the loop awaits.
        nonlocal quiet
        assert wire is not None
        rest = run_eagerly(wire.feed(data))
        if quiet and wire.messages:
            acc.heard()
            quiet = False
        if rest is None and wire.done:
            return FINISHED
        return rest

    try:
        if wire is not None:
            wire.session.peer = peer
            wire.start(group)
        while wire is None or not wire.done:
            got = await reads.next(read_now if wire is not None else None, opener.read_chunk)
            if not isinstance(got, bytes):
                await got  # the rest of a read handled as it came
                continue
            if not got:
                break
            if wire is None:
                wire = opener.open(got, acc)
                if wire is None:
                    continue
                wire.session.peer = peer
                wire.start(group)
            await wire.feed(got)
            del got
            if quiet and wire.messages:
                acc.heard()
                quiet = False
    except (ConnectionError, asyncio.CancelledError):
        pass
    except Exception:
        logging.getLogger(f"hubbub.{dialect}").exception("%s TCP connection failed", dialect)
    finally:
        try:
            if wire is not None:
                await wire.finish()
        finally:  # also when cancelled (a stopping server): no socket outlives the connection
            sid = wire.session.id if wire is not None else ""
            await close_stream(acc.writer, opener.node, dialect, sid)


def end_stream(writer: asyncio.StreamWriter, code: object) -> None:
    """The dialect ends the connection with ``code`` (after its last frames): the socket is closed at once
    when the server stops (``GOING_AWAY``: every connection closes, none waits for its peer), else its
    close lingers (:func:`linger`). Every stream dialect's ``close`` (native's, and :class:`StreamIO`'s)."""
    if code == Disconnect.GOING_AWAY or not grace_left() or not linger(writer):
        writer.close()


def linger(writer: asyncio.StreamWriter) -> bool:
    """Start a lingering close (RFC 9112 §9.6, what HTTP servers do): the server's side is shut (FIN after
    what is buffered, the dialect's answer last), and what the peer still sends is read and dropped until it
    ends its side; :func:`close_stream` closes the socket then, or after :data:`LINGER_S`. Closed at once
    instead, a socket with bytes unread answers them with a reset, and a peer that had not yet read the
    server's last bytes loses them: the answer that says why its connection ends. False when the socket
    cannot half-close (TLS) or is closing already."""
    transport = writer.transport
    reads = transport.get_protocol()
    if transport.is_closing() or not transport.can_write_eof() or not isinstance(reads, StreamReads):
        return False
    try:
        transport.write_eof()
    except (OSError, RuntimeError):
        return False
    reads.linger()
    return True
