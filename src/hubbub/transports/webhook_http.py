"""The webhooks' HTTP/1.1 client: one POST per delivery over pooled keep-alive connections, and nothing
else (no redirects, no cookies, no proxies, no compression), so that a delivery costs what the request
costs. aiohttp's client, used before, spent about half of the server's CPU per delivery on what a webhook
never needs (its request and response objects, header multidicts, payload wrappers, tracing hooks): measured
with ``bench/webhook_bench.py``, see docs/connectors.md "Cost".

* :class:`ResponseReader` (sans-I/O) reads one response from bytes cut anywhere: the status line, the
  headers (at most :data:`MAX_HEAD` bytes), and a body by ``Content-Length``, ``chunked`` or until the
  connection ends, discarded but for its length (at most :data:`MAX_BODY`); a ``1xx`` interim response is
  passed over. Anything else raises :class:`BadResponse`.
* :class:`HttpClient` keeps, per scheme, host and port, up to ``connections`` idle connections, opens
  another when none is idle (TLS for ``https``, with the system's trust), writes a request in one write and
  answers ``(status, Retry-After)``. A connection goes back to the pool only after a whole response that
  did not ask to close; any failure closes it.

Concurrency contract: event loop thread only; each request holds its connection until its answer.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, cast
from urllib.parse import quote, urlsplit

__all__ = ["MAX_BODY", "MAX_HEAD", "BadResponse", "HttpClient", "Response", "ResponseReader", "target_of"]

#: The most bytes of a response's status line and headers.
MAX_HEAD: Final = 64 << 10
#: The most bytes of a response's body (read and dropped: a webhook's answer is its status).
MAX_BODY: Final = 1 << 20


class BadResponse(Exception):
    """The bytes are not an HTTP/1.1 response this client reads (or one over its bounds)."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    retry_after: str | None
    #: Whether the connection may carry another request.
    keep_alive: bool


class ResponseReader:
    """Reads one response (module docstring). ``feed(data)`` returns the :class:`Response` once it is whole
    (bytes after it are an error: nothing was asked for them), else None; ``eof()`` when the connection
    ended, which completes a body read until the end."""

    __slots__ = ("_buf", "_chunk", "_head", "_left", "_mode", "_read", "_response")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._head: tuple[int, str | None, bool] | None = None
        self._mode = ""  # "length", "chunked" or "close" once the head is read
        self._left = 0  # body bytes still to come (length), or of the current chunk
        self._chunk = "size"  # chunked: "size", "data", "crlf", "trailer"
        self._read = 0
        self._response: Response | None = None

    def feed(self, data: bytes) -> Response | None:
        if self._response is not None:
            if data:
                raise BadResponse("bytes after the response")
            return self._response
        self._buf += data
        while self._head is None:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD + 3:  # (+ 3: the terminator may be all but whole)
                    raise BadResponse("response head too long")
                return None
            if end > MAX_HEAD:
                raise BadResponse("response head too long")
            head = bytes(self._buf[:end])
            del self._buf[: end + 4]
            self._start(head)
        return self._body()

    def eof(self) -> Response:
        """The connection ended: the response read until it ended, else :class:`BadResponse`."""
        if self._response is not None:
            return self._response
        if self._head is not None and self._mode == "close":
            status, retry_after, _ = self._head
            self._response = Response(status, retry_after, False)
            return self._response
        raise BadResponse("the connection ended before the response")

    def _start(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0") or not parts[1].isdigit():
            raise BadResponse("not an HTTP/1.x status line")
        status = int(parts[1])
        if not 100 <= status <= 999:
            raise BadResponse("bad status")
        fields: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not name or name != name.strip():
                raise BadResponse("bad header line")
            key = name.lower()
            if key in fields and key in (b"content-length", b"transfer-encoding"):
                raise BadResponse(f"{key.decode()} given twice")
            fields[key] = value.strip()
        if 100 <= status < 200:  # interim (100 Continue …): the response follows
            return
        close = fields.get(b"connection", b"").lower() == b"close" or parts[0] == b"HTTP/1.0"
        retry_after = fields[b"retry-after"].decode("latin-1") if b"retry-after" in fields else None
        self._head = (status, retry_after, not close)
        if b"transfer-encoding" in fields:
            if fields[b"transfer-encoding"].lower() != b"chunked":
                raise BadResponse("a transfer coding other than chunked")
            self._mode = "chunked"
        elif b"content-length" in fields:
            length = fields[b"content-length"]
            if not length.isdigit() or int(length) > MAX_BODY:
                raise BadResponse("bad or too large Content-Length")
            self._mode, self._left = "length", int(length)
        elif status in (204, 304):
            self._mode, self._left = "length", 0
        else:
            self._mode = "close"
            self._head = (status, retry_after, False)

    def _done(self) -> Response:
        assert self._head is not None
        self._response = Response(*self._head)
        if self._buf:
            raise BadResponse("bytes after the response")
        return self._response

    def _body(self) -> Response | None:
        buf = self._buf
        if self._mode == "length":
            take = min(self._left, len(buf))
            self._left -= take
            del buf[:take]
            return self._done() if self._left == 0 else None
        if self._mode == "close":
            self._read += len(buf)
            buf.clear()
            if self._read > MAX_BODY:
                raise BadResponse("response body too large")
            return None
        while True:  # chunked
            if self._chunk == "data":
                take = min(self._left, len(buf))
                self._left -= take
                self._read += take
                del buf[:take]
                if self._left:
                    return None
                self._chunk = "crlf"
            line_end = buf.find(b"\r\n")
            if line_end > MAX_HEAD or (line_end < 0 and len(buf) > MAX_HEAD + 1):
                raise BadResponse("chunk line too long")
            if line_end < 0:
                return None
            line = bytes(buf[:line_end])
            del buf[: line_end + 2]
            if self._chunk == "crlf":
                if line:
                    raise BadResponse("no CRLF after a chunk")
                self._chunk = "size"
            elif self._chunk == "size":
                size = line.split(b";", 1)[0].strip()
                try:
                    self._left = int(size, 16)
                except ValueError:
                    raise BadResponse("bad chunk size") from None
                if self._left < 0 or self._read + self._left > MAX_BODY:
                    raise BadResponse("response body too large")
                self._chunk = "data" if self._left else "trailer"
            elif not line:  # the end of the trailer section
                return self._done()


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL's requests go, and their first line and ``Host`` header, made once per URL."""

    key: tuple[str, str, int]
    start: bytes


@lru_cache(maxsize=1024)
def target_of(url: str) -> Target:
    """``url`` (http or https) as a :class:`Target`; ``ValueError`` for another scheme or no host."""
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an http(s) URL: {url}")
    port = u.port or (443 if u.scheme == "https" else 80)
    safe = "/%:@!$&'()*+,;=-._~"  # what may stay as it is in a path (RFC 3986); the rest is escaped
    path = quote(u.path or "/", safe=safe) + (f"?{quote(u.query, safe=safe + '?')}" if u.query else "")
    host = u.hostname.encode("idna").decode("ascii") if ":" not in u.hostname else f"[{u.hostname}]"
    default = port == (443 if u.scheme == "https" else 80)
    start = f"POST {path} HTTP/1.1\r\nHost: {host if default else f'{host}:{port}'}\r\n".encode("ascii")
    return Target((u.scheme, u.hostname, port), start)


class _Connection(asyncio.Protocol):
    """One connection: the request's answer arrives in ``answer`` (a future set by the reader)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader()
        self.answer: asyncio.Future[Response] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is not a subclass of it)

    def data_received(self, data: bytes) -> None:
        if self.answer is None or self.answer.done():
            self.close()  # nothing was asked: the peer is not an HTTP server to reuse
            return
        try:
            response = self.reader.feed(data)
        except BadResponse as exc:
            self.answer.set_exception(exc)
            self.close()
            return
        if response is not None:
            self.answer.set_result(response)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None and not self.answer.done():
            try:
                self.answer.set_result(self.reader.eof())
            except BadResponse as bad:
                self.answer.set_exception(ConnectionError(str(bad)) if exc is None else exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class HttpClient:
    """See the module docstring. ``connections``: idle connections kept per target."""

    def __init__(self, connections: int = 8) -> None:
        self._connections = max(1, connections)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, headers: Mapping[str, str], body: bytes) -> Response:
        """POST ``body`` to ``url`` with ``headers`` (``Content-Length`` and ``Host`` are added). Raises
        :class:`BadResponse`, ``OSError`` (refused, reset), ``ConnectionError`` (closed before an answer),
        ``ValueError`` (not an http(s) URL); the caller bounds the time (``asyncio.timeout``)."""
        target = target_of(url)
        head = [target.start]
        head.extend(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items())
        head.append(b"Content-Length: %d\r\n\r\n" % len(body))
        conn = await self._take(target.key)
        try:
            conn.reader = ResponseReader()
            conn.answer = asyncio.get_running_loop().create_future()
            assert conn.transport is not None
            conn.transport.writelines((*head, body))
            response = await conn.answer
        except BaseException:
            conn.close()
            raise
        conn.answer = None
        if response.keep_alive and not conn.closed:
            idle = self._idle.setdefault(target.key, [])
            if len(idle) < self._connections:
                idle.append(conn)
                return response
        conn.close()
        return response

    async def _take(self, key: tuple[str, str, int]) -> _Connection:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        scheme, host, port = key
        tls = None
        if scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        _, conn = await asyncio.get_running_loop().create_connection(
            _Connection, host, port, ssl=tls, server_hostname=host if tls else None
        )
        return conn

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
