"""The HTTP and WebSocket listener: what happens to a socket before, around and below aiohttp's routing.

aiohttp serves each accepted socket with a ``RequestHandler`` (its HTTP/1.1 protocol); hubbub's listener
(:class:`HttpListener`, an aiohttp site) makes each one an :class:`HttpConnection`, which adds four things
aiohttp does not do for a server exposed to anyone:

* **Admission at accept.** Every accepted socket counts against ``limits.max_connections`` and
  ``limits.max_connections_per_ip`` from ``connection_made`` (after the TLS handshake on a TLS listener)
  until it closes, whatever it sends, a keep-alive socket between requests included. A socket over a limit
  is answered at once, before anything it sent is read: ``503`` with native error 4009 and ``Connection:
  close``, its write side shut so the answer is not lost to a reset, and closed when the peer closes or
  after :data:`REFUSAL_LINGER_S` (at once beyond :data:`REFUSALS_LINGERING_MAX` such sockets). The route is
  not known then, so the refusal is counted with dialect ``http``.
* **Open files.** A socket accepted while the process is short of descriptors gets the same ``503`` and is
  closed at once, before the limits (``transports/accept.py``, :class:`~hubbub.transports.accept.OpenFiles`).
* **A head timeout** (``http.head_timeout_s``): a connection that has not sent a whole request head within
  that time of its accept, or of the first byte of a later request on a kept-alive connection, is closed;
  the same bound applies to a TLS handshake. A kept-alive connection idle between requests is closed after
  :data:`KEEPALIVE_S`.
* **Its own error answers.** A request aiohttp cannot parse (a request line or header over 8 KiB, a bad
  method, bad header characters, a bad chunk size) gets ``400`` ``bad request`` with ``Server: hubbub``;
  aiohttp's answer would name its and Python's versions and echo the input back, and its ERROR record with
  a traceback for each would let anyone fill the log. Such requests are counted and logged as a warning at
  most once per :data:`WARN_EVERY_S` per kind.
* **The hand-over of WebSockets.** Once a route answers a WebSocket upgrade, the connection leaves aiohttp
  (:meth:`HttpConnection.hand_over`, called by ``transports/ws_socket.py``'s ``take_over``): the transport
  goes to hubbub's own WebSocket protocol with the bytes that followed the upgrade request and the
  connection's place in the limits, and aiohttp's request, parser and handler task end.

The listener's own bad input (malformed heads, heads not sent in time) is counted in
``hubbub_bad_input_total{dialect="http"}``.

Concurrency contract: everything here runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import Any, Final, cast

from aiohttp import web
from aiohttp.http import HttpProcessingError, RawRequestMessage
from aiohttp.streams import StreamReader

from hubbub.core.api import Core, Limiter
from hubbub.dialects import native as nc
from hubbub.disconnect import Disconnect

from .accept import (
    REFUSAL_LINGER_S,
    REFUSALS_LINGERING_MAX,
    WARN_EVERY_S,
    BadInputLog,
    OpenFiles,
    Throttle,
    reuse_port,
)

__all__ = [
    "KEEPALIVE_S",
    "REFUSALS_LINGERING_MAX",
    "REFUSAL_LINGER_S",
    "WARN_EVERY_S",
    "HttpConnection",
    "HttpListener",
    "Throttle",
]

log = logging.getLogger("hubbub.http")

#: Seconds a kept-alive HTTP connection may idle between requests (aiohttp's default is an hour; the socket
#: holds a place in the connection limits all that time).
KEEPALIVE_S: Final = 75.0


def _refusal() -> bytes:
    status, body = nc.render_http_error(Disconnect.TOO_MANY_CONNECTIONS.code)
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nServer: hubbub\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


#: The whole answer to a socket over a connection limit.
REFUSAL: Final = _refusal()


class HttpListener(web.BaseSite):
    """The listening socket of the aiohttp application (an aiohttp site in place of ``web.TCPSite``): every
    socket it accepts is served by an :class:`HttpConnection`. Holds what the connections share: the
    node (its limiter and counters), the head timeout, the refused sockets still lingering, the warnings'
    throttles."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        node: Core,
        *,
        head_timeout_s: float,
        ssl_context: Any = None,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port
        self.node = node
        self.head_timeout_s = head_timeout_s
        #: Refused sockets waiting for their peer to close (see :data:`REFUSAL_LINGER_S`).
        self.lingering: set[asyncio.Transport] = set()
        self._bad_input = BadInputLog(node, "http", log)
        self.open_files = OpenFiles(node, "http", log)

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (once started; the configured one before)."""
        sockets = getattr(self._server, "sockets", None)  # asyncio's and uvloop's servers alike
        return int(sockets[0].getsockname()[1]) if sockets else self._port

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        manager = self._runner.server
        assert manager is not None

        def connection() -> HttpConnection:
            return HttpConnection(manager, self, loop)

        # The handshake of a TLS connection comes before connection_made: bounded by the same timeout.
        tls: dict[str, Any] = {"ssl_handshake_timeout": self.head_timeout_s} if self._ssl_context else {}
        self._server = await loop.create_server(
            connection,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=True,
            reuse_port=reuse_port(),
            **tls,
        )

    async def stop(self) -> None:
        await super().stop()
        for transport in list(self.lingering):
            transport.abort()

    def warn(self, kind: str, msg: str, *args: object) -> None:
        """Count one piece of bad input on the listener, and log it as a warning unless one of the same
        ``kind`` was logged less than :data:`WARN_EVERY_S` ago."""
        self._bad_input.warn(kind, msg, *args)


class HttpConnection(web.RequestHandler):
    """One accepted socket of :class:`HttpListener`: aiohttp's HTTP/1.1 protocol with admission, the head
    timeout, hubbub's error answers and the hand-over of WebSockets (module docstring)."""

    __slots__ = ("_admitted", "_body", "_heads", "_ip", "_listener", "_timer")

    def __init__(self, manager: web.Server, listener: HttpListener, loop: asyncio.AbstractEventLoop) -> None:
        # No access log (aiohttp takes None for that, as AppRunner(access_log=None) passes it).
        no_log: Any = None
        super().__init__(manager, loop=loop, access_log=no_log, keepalive_timeout=KEEPALIVE_S)
        self._listener = listener
        self._ip = ""
        self._admitted = False
        #: The head timer, or for a refused socket its linger timer.
        self._timer: asyncio.TimerHandle | None = None
        #: Requests parsed when the head timer was set: one more means the head arrived.
        self._heads = 0
        #: The body of the last request parsed, while it may still be arriving.
        self._body: StreamReader | None = None

    # -- admission ------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if self._listener.open_files.short(transport, ip):
            # Answered and closed at once: a refusal lingering would hold the descriptor that is short.
            self.transport = None
            sock = cast(asyncio.Transport, transport)
            sock.write(REFUSAL)
            sock.close()
            return
        if self._listener.node.limiter.admit(ip, "http") is not None:
            self._refuse(transport)
            return
        self._ip = ip
        self._admitted = True
        super().connection_made(transport)
        self._arm_head_timer()

    def _refuse(self, base: asyncio.BaseTransport) -> None:
        transport = self.transport = cast(asyncio.Transport, base)  # a stream's: kept for connection_lost
        transport.write(REFUSAL)
        lingering = self._listener.lingering
        if len(lingering) < REFUSALS_LINGERING_MAX and transport.can_write_eof():
            # The peer reads the answer and its end, then closes; anything it sent meanwhile is dropped
            # (closing a socket with unread bytes would reset it, and the answer could be lost).
            transport.write_eof()
            lingering.add(transport)
            self._timer = self._loop.call_later(REFUSAL_LINGER_S, transport.abort)
        else:
            transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None
        if not self._admitted:
            if self.transport is not None:
                self._listener.lingering.discard(self.transport)
                self.transport = None
            return
        self._admitted = False
        self._listener.node.limiter.release(self._ip)
        super().connection_lost(exc)

    # -- reading --------------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return  # a refused socket: what it sends is not read
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:  # a head arrived (or a parse error, answered 400)
            timer = self._timer
            if timer is not None:
                timer.cancel()
                self._timer = None
            self._parsed()
        elif self._timer is None and not (self._request_in_progress or self._messages or self._upgraded):
            self._arm_head_timer()  # the first bytes of a later request on a kept-alive connection

    def _parsed(self) -> None:
        """After the parser gave a request or an error. aiohttp's parser, failing in a body (a bad chunk size
        in a later read), drops that body without ending it: the handler reading it would wait for ever, and
        the error answer queued behind it would never go out. The body gets the error instead: its handler
        fails, and :meth:`handle_error` answers 400."""
        msg, payload = self._messages[-1]
        body = self._body
        if isinstance(msg, RawRequestMessage):
            self._body = None if payload.is_eof() else payload
        elif body is not None:
            self._body = None
            if not body.is_eof() and body.exception() is None:
                body.set_exception(msg.exc)
                body.feed_eof()  # read to its end: aiohttp does not linger on it after the answer

    def _arm_head_timer(self) -> None:
        self._heads = self._request_count
        self._timer = self._loop.call_later(self._listener.head_timeout_s, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._timer = None
        if (
            self._request_count != self._heads
            or self._request_in_progress
            or self._messages
            or self.transport is None
        ):
            return
        self._listener.warn(
            "head_timeout",
            "no HTTP request head from %s within %g s: connection closed",
            self._ip,
            self._listener.head_timeout_s,
        )
        self.force_close()

    def hand_over(self) -> tuple[asyncio.Transport, bytes, Limiter | None, str]:
        """The route answered a WebSocket upgrade and hubbub serves the connection itself from here on
        (``transports/ws_socket.py``): the transport, the bytes that came after the upgrade request, and the
        connection's place in the limits (the new protocol releases it when the transport is lost). aiohttp
        forgets the connection: its handler ends without writing or closing anything."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the connection closed during the upgrade")
        tail, self._message_tail = self._message_tail, b""
        admitted, self._admitted = self._admitted, False
        timer = self._timer
        if timer is not None:
            timer.cancel()
            self._timer = None
        self.transport = None
        web.RequestHandler.connection_lost(self, None)
        return transport, tail, self._listener.node.limiter if admitted else None, self._ip

    # -- error answers --------------------------------------------------------------------------------------

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's ERROR with a traceback, but for a client's malformed request (seen in a body a handler
        did not read): a counted, throttled warning."""
        exc = kw.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self._bad_request(exc, 400)
            return
        super().log_exception(*args, **kw)

    def _bad_request(self, exc: HttpProcessingError, status: int) -> None:
        self._listener.warn(
            "bad_request", "malformed HTTP request from %s (%s): answered %d", self._ip,
            type(exc).__name__, status,
        )  # fmt: skip

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse (400) or whose handler failed (500, 504), made
        hubbub's: ``Server: hubbub``, a fixed body (never the input), and for a client's bad request a
        counted, throttled warning rather than an ERROR with a traceback. A handler's failure is a defect
        of hubbub: that one is logged with its traceback."""
        if isinstance(exc, HttpProcessingError):
            status = 400  # also when a handler's read of the body failed so (see _parsed)
            self._bad_request(exc, status)
        else:
            log.error("HTTP request from %s failed: answered %d", self._ip, status, exc_info=exc)
        if request.writer.output_size > 0:
            # Some of the response went out already: no other can be sent.
            raise ConnectionError("the response was partly sent: no error response can follow")
        phrase = HTTPStatus(status).phrase.lower() if status in HTTPStatus._value2member_map_ else "error"
        resp = web.Response(
            status=status,
            body=f"{phrase}\n".encode(),
            headers={"Content-Type": "text/plain; charset=utf-8", "Server": "hubbub"},
        )
        resp.force_close()
        return resp
