"""The accept side of every byte-stream listener (native TCP, mist TCP of both generations, qrpc; plain or
TLS): what happens to a socket before its dialect reads it, the same for every dialect.

* **Admission at accept.** Every accepted socket counts against ``limits.max_connections`` and
  ``limits.max_connections_per_ip`` from the TCP accept (on a TLS listener, before its handshake) until it
  closes, whatever it sends.
* **Refusal at once.** A socket over a limit is never served: it gets the dialect's refusal where the
  dialect has one that can be sent before a handshake (native: error 4009, in the framing its first byte
  picks), else nothing; its write side is then shut, and it is closed when the peer closes or after
  :data:`~hubbub.transports.accept.REFUSAL_LINGER_S` (at once beyond
  :data:`~hubbub.transports.accept.REFUSALS_LINGERING_MAX` such sockets). A TLS listener makes no handshake
  for it. Refusals are counted by the limiter, with the listener's dialect.
* **Open files.** A socket accepted while the process is short of descriptors is closed at once, before
  the limits (``transports/accept.py``, :class:`~hubbub.transports.accept.OpenFiles`).
* **The first-message timeout** (``tcp.first_message_timeout_s``): from the accept, a socket has that long
  to finish its TLS handshake and send its dialect's first complete message (a native frame, a mist line
  or JSON value, a qrpc line); otherwise it is closed, counted in ``hubbub_bad_input_total{dialect}`` and
  logged as a throttled warning. The dialect says when its first message is complete
  (:meth:`Accepted.heard`). From then on the dialect's own rules apply (native's pings; TCP keepalive, so a
  mist or qrpc client that has spoken may idle as long as its peer is alive): the timeout is about the
  first message only, because every TCP dialect's client speaks first (native ``hello``, mist's commands
  and its first-message token, qrpc's calls).

Concurrency contract: everything runs on the event loop thread. Each admitted socket gets one task, made at
accept and given to ``on_connection`` (the server waits for it on shutdown), which makes the TLS handshake,
runs the dialect's ``serve`` and, when that returns, gives the socket's place in the limits back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, cast, final

from hubbub.core.api import Core

from .accept import REFUSAL_LINGER_S, REFUSALS_LINGERING_MAX, BadInputLog, OpenFiles, reuse_port
from .stream_reads import StreamReads

__all__ = ["KEEPALIVE", "Accepted", "Refusal", "Serve", "StreamListener", "keep_alive", "peer_ip"]

log = logging.getLogger("hubbub.tcp")

#: A dialect's connection: it reads ``reads``, writes ``writer``, calls :meth:`Accepted.heard` once its
#: first message is complete, and closes the writer when it is done.
Serve = Callable[["Accepted"], Awaitable[None]]
#: A dialect's answer to a socket over a connection limit, given the first bytes the socket sent (an empty
#: answer: none).
Refusal = Callable[[bytes], bytes]

#: Bytes a connection's reads may buffer while its task runs, before the socket's reading is paused
#: (asyncio's default limit of a ``StreamReader``).
READER_LIMIT: Final = 1 << 16
#: TCP keepalive of the server's side of every TCP connection (native, mist, qrpc): seconds idle before the
#: first probe, seconds between probes, probes unanswered before the kernel drops the connection. A peer that
#: vanished without closing (powered off, unplugged, forgotten by a NAT) thus frees its connection, its
#: subscriptions and its place in the limits within about a minute, also in dialects with no ping of their
#: own (mist, qrpc); native's pings notice it sooner.
KEEPALIVE: tuple[int, int, int] = (30, 10, 3)


class _HasExtraInfo(Protocol):
    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


def keep_alive(stream: _HasExtraInfo) -> None:
    """Turn on :data:`KEEPALIVE` for the socket of ``stream`` (a transport or a stream writer), where the
    platform has the options."""
    sock = stream.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    idle, interval, probes = KEEPALIVE
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", probes)):
            opt = getattr(socket, name, None)
            if opt is not None:
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)
    except OSError as exc:  # the peer may be gone already; the read that follows sees it
        log.debug("TCP keepalive not set: %s", exc)


def peer_ip(stream: _HasExtraInfo) -> str:
    """The peer's IP address (empty when the transport does not know it)."""
    peer = stream.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


#: How early a loop may fire a timer against ``loop.time()`` (uvloop: whole milliseconds, rounded down).
TIMER_SLACK_S = 0.002


@final
class StreamListener:
    """One byte-stream listener of ``dialect`` (module docstring): the listening socket, the sockets refused
    and still lingering, the counted warnings. :meth:`start` binds it; :meth:`close` stops it."""

    __slots__ = (
        "_bad_input",
        "_on_connection",
        "_serve",
        "_server",
        "dialect",
        "first_message_timeout_s",
        "lingering",
        "loop",
        "node",
        "open_files",
        "reader_limit",
        "refusal",
        "ssl_context",
    )

    def __init__(
        self,
        node: Core,
        dialect: str,
        serve: Serve,
        on_connection: Callable[[asyncio.Task[None]], None],
        *,
        first_message_timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
        refusal: Refusal | None = None,
        reader_limit: int = READER_LIMIT,
    ) -> None:
        self.node = node
        self.dialect = dialect
        self._serve = serve
        self._on_connection = on_connection
        self.first_message_timeout_s = first_message_timeout_s
        self.ssl_context = ssl_context
        self.refusal = refusal
        self.reader_limit = reader_limit
        #: Refused sockets waiting for their peer to close, each with its abort timer.
        self.lingering: dict[asyncio.Transport, asyncio.TimerHandle] = {}
        self._bad_input = BadInputLog(node, dialect, log)
        self.open_files = OpenFiles(node, dialect, log)
        self._server: asyncio.AbstractServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self, host: str, port: int) -> None:
        loop = self.loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Admission(self), host, port, reuse_port=reuse_port())

    @property
    def port(self) -> int:
        """The bound port (once started)."""
        server = self._server
        assert server is not None
        sockets = cast(asyncio.Server, server).sockets  # asyncio's and uvloop's servers alike
        return int(sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting, and drop the refused sockets still lingering. The admitted connections' tasks
        are the owner's (``on_connection``) to end."""
        if self._server is not None:
            self._server.close()
        for transport, timer in list(self.lingering.items()):
            timer.cancel()
            transport.abort()
        self.lingering.clear()

    async def wait_closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()

    # -- one socket ---------------------------------------------------------------------------------------

    def _admitted(self, transport: asyncio.Transport, ip: str) -> None:
        """A socket the limiter admitted (called from its ``connection_made``, before anything is read):
        its task serves it, after the TLS handshake on a TLS listener."""
        loop = self.loop
        assert loop is not None
        acc = Accepted(self, ip)
        tls: socket.socket | None = None
        if self.ssl_context is None:
            acc.attach(transport)
        else:
            # The handshake needs the socket unread, and neither asyncio nor uvloop lets a protocol keep
            # it so until loop.start_tls runs in a task (uvloop starts reading once connection_made
            # returns): the accepting transport gives its socket (a duplicate of the descriptor) up before
            # it read anything, and loop.connect_accepted_socket makes the handshake on it.
            sock = transport.get_extra_info("socket")
            tls = socket.socket(fileno=os.dup(sock.fileno()))
            transport.abort()
        self._on_connection(loop.create_task(self._run(acc, tls)))

    async def _run(self, acc: Accepted, tls: socket.socket | None) -> None:
        try:
            if tls is None or await self._handshake(acc, tls):
                await self._serve(acc)
        except Exception:
            log.exception("%s TCP connection failed", self.dialect)
        finally:
            acc.heard()  # the timer, if the connection ended before its first message
            if acc.open and not acc.transport.is_closing():
                acc.transport.abort()
            self.node.limiter.release(acc.ip)

    async def _handshake(self, acc: Accepted, sock: socket.socket) -> bool:
        """The TLS handshake on ``sock``, within what is left of the first-message time; True once the
        socket speaks TLS, False (counted as a timeout when the time is up) if it failed."""
        loop = self.loop
        assert loop is not None and self.ssl_context is not None
        try:
            transport, _ = await loop.connect_accepted_socket(
                lambda: acc.reads,
                sock,
                ssl=self.ssl_context,
                ssl_handshake_timeout=max(acc.deadline - loop.time(), 0.001),
            )
        except BaseException as exc:
            sock.close()  # where the loop closed it already (or holds it still), a no-op
            if not isinstance(exc, OSError):  # OSError: ssl.SSLError, a reset, the handshake's timeout
                raise
            # uvloop keeps its timers in whole milliseconds, so the handshake's timeout can fire up to 1 ms
            # before the deadline as loop.time() reads it: such a failure is the timeout all the same.
            if loop.time() >= acc.deadline - TIMER_SLACK_S:
                self.count_timeout(acc)
            else:
                log.debug("TLS handshake with %s failed: %s", acc.ip, exc)
            return False
        acc.attach(transport, connected=True)
        return True

    def count_timeout(self, acc: Accepted) -> None:
        """Count and log (throttled) a socket whose first message (or handshake) did not come in time."""
        what = "no first message" if acc.open else "no TLS handshake"
        self._bad_input.warn(
            "first_message_timeout",
            "%s from %s on the %s listener within %g s: connection closed",
            what,
            acc.ip,
            self.dialect,
            self.first_message_timeout_s,
        )


@final
class Accepted:
    """One admitted socket of a :class:`StreamListener`, as its dialect's ``serve`` sees it: ``reads`` (the
    socket's protocol, :class:`~hubbub.transports.stream_reads.StreamReads`), ``writer``, the peer's address
    ``ip``, and :meth:`heard`."""

    __slots__ = (
        "_listener",
        "_timer",
        "deadline",
        "ip",
        "open",
        "reads",
        "transport",
        "writer",
    )

    def __init__(self, listener: StreamListener, ip: str) -> None:
        loop = listener.loop
        assert loop is not None
        self._listener = listener
        self.ip = ip
        self.reads = StreamReads(listener.reader_limit, loop)
        self.transport: asyncio.Transport
        self.writer: asyncio.StreamWriter
        #: Whether the socket is attached to its streams (after the TLS handshake on a TLS listener).
        self.open = False
        #: The loop time by which the first message must be complete (the accept's, plus the timeout).
        self.deadline = loop.time() + listener.first_message_timeout_s
        self._timer: asyncio.TimerHandle | None = None

    def attach(self, transport: asyncio.Transport, *, connected: bool = False) -> None:
        """Give the socket to the streams (``connected``: the loop gave it to :attr:`reads` already), and
        start the first-message timer, for what is left of the time."""
        loop = self._listener.loop
        assert loop is not None
        self.transport = transport
        if not connected:
            transport.set_protocol(self.reads)
            self.reads.connection_made(transport)
        self.writer = asyncio.StreamWriter(transport, self.reads, None, loop)
        self.open = True
        self._timer = loop.call_at(self.deadline, self._expire)

    def heard(self) -> None:
        """The dialect has the connection's first complete message: the first-message timer stops, and
        the dialect's own rules apply from here on. Cheap once done (called after every read)."""
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        """The first message did not come in time: counted, logged, and the socket closed at once (a peer
        that said nothing is owed no flush); the dialect's read sees the end."""
        self._timer = None
        self._listener.count_timeout(self)
        self.transport.abort()


class _Admission(asyncio.Protocol):
    """The protocol of a socket just accepted: admits it (then hands it on) or refuses it, and then stays
    its protocol while it lingers."""

    __slots__ = ("_answer", "_listener", "_transport")

    def __init__(self, listener: StreamListener) -> None:
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._answer: Refusal | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = cast(asyncio.Transport, transport)
        lst = self._listener
        ip = peer_ip(sock)
        if lst.open_files.short(sock, ip):
            sock.abort()  # no refusal lingers then: its descriptor is what is short, freed at once
            return
        keep_alive(sock)
        if lst.node.limiter.admit(ip, lst.dialect) is None:
            lst._admitted(sock, ip)
            return
        lingering = lst.lingering
        if len(lingering) >= REFUSALS_LINGERING_MAX or not sock.can_write_eof():
            sock.close()
            return
        assert lst.loop is not None
        self._transport = sock
        lingering[sock] = lst.loop.call_later(REFUSAL_LINGER_S, sock.abort)
        if lst.refusal is not None and lst.ssl_context is None:
            self._answer = lst.refusal  # sent once the first bytes pick its form
        else:
            # The peer reads the end and closes; anything it sent meanwhile is dropped (closing a socket
            # with unread bytes would reset it).
            sock.write_eof()

    def data_received(self, data: bytes) -> None:
        answer, sock = self._answer, self._transport
        if answer is None or sock is None:
            return  # a refused socket: what it sends is not read
        self._answer = None
        reply = answer(data)
        if reply:
            sock.write(reply)
        sock.write_eof()

    def eof_received(self) -> bool:
        return False  # the refused peer is done: close

    def connection_lost(self, exc: BaseException | None) -> None:
        sock = self._transport
        if sock is not None:
            self._transport = None
            timer = self._listener.lingering.pop(sock, None)
            if timer is not None:
                timer.cancel()
