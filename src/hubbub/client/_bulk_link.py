"""The blocking connection of :class:`~hubbub.client.bulk.BulkPublisher`: opening it (TCP, or a WebSocket
upgrade) and saying hello, writing the queued frames out and reading replies into the connection's
:class:`~hubbub.client.protocol.ClientProtocol`. What to send, when, and what to do when the connection
is lost (the window, resends, reconnect attempts) is the publisher's.

Concurrency contract: one thread at a time (no locking); blocking socket I/O with ``timeout`` per wait.
A failed connection is dropped and the publisher told (it reconnects and resends).
"""

from __future__ import annotations

import base64
import os
import select
import socket
import struct
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from hubbub.client._bulk_rows import Item
from hubbub.client._wire import CannotConnect
from hubbub.client.framing import Framing, ws_frame
from hubbub.client.protocol import ClientEvent, ClientProtocol, HelloRefused, Welcome
from hubbub.errors import BadFrame, HubbubError

__all__ = ["BulkLink"]

_MSGPACK_PROTO = "hubbub.v1.msgpack"
#: The longest message the publisher reads from the server.
_READ_MAX = 64 << 20


class BulkLink:
    """One native connection at a time to ``url`` (``tcp://``, ``ws://`` or ``http://``), its protocol and
    its queue of frames to write (:attr:`out`, the same bytearray for the link's life).

    ``on_event`` takes each event read (a reply, a refusal, a server error; it may raise OSError to drop
    the connection); ``on_lost`` is called when a write finds the connection dropped (it reconnects,
    with :meth:`reconnect`, and queues again what was unacknowledged).
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        timeout: float,
        client_name: str,
        on_event: Callable[[ClientEvent], None],
        on_lost: Callable[[], None],
    ) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("tcp", "ws", "http") or not parts.hostname:
            raise ValueError(f"bulk publisher URL must be tcp://, ws:// or http://host:port, not {url!r}")
        self.url = url
        self._ws = scheme != "tcp"
        self._host = parts.hostname
        self._port = parts.port or (80 if self._ws else 7400)
        self._path = parts.path if parts.path not in ("", "/") else "/ws/hubbub"
        self._token = token
        self.timeout = timeout
        self._client_name = client_name
        self._on_event = on_event
        self._on_lost = on_lost
        self.sock: socket.socket | None = None
        #: The connection's protocol (a new one per connection): request ids, replies, framing.
        self.proto = self._new_protocol()
        self.out = bytearray()

    def connect(self) -> None:
        """Open the connection and say hello (no retry here); events read after the welcome go to
        ``on_event``. Raises CannotConnect or the hello's error."""
        try:
            sock = socket.create_connection((self._host, self._port), timeout=self.timeout)
        except OSError as exc:
            raise CannotConnect(f"{self.url}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.timeout)
            rest = self._upgrade(sock) if self._ws else b""
            proto = self._new_protocol()
            sock.sendall(proto.hello())
            events = proto.receive_data(rest)
            while not any(isinstance(e, Welcome | HelloRefused) for e in events):
                data = sock.recv(1 << 16)
                if not data or proto.peer_closed:
                    raise CannotConnect(f"{self.url}: connection closed during hello")
                events += proto.receive_data(data)
            at = next(i for i, e in enumerate(events) if isinstance(e, Welcome | HelloRefused))
            answer = events[at]
            if isinstance(answer, HelloRefused):
                if answer.malformed:
                    raise CannotConnect(f"{self.url}: bad hello reply")
                raise answer.error
            for event in events[at + 1 :]:
                self._on_event(event)
        except BadFrame as exc:  # a reply that is not msgpack
            sock.close()
            raise CannotConnect(f"{self.url}: bad hello reply") from exc
        except HubbubError:
            sock.close()
            raise
        except (OSError, ValueError) as exc:  # a reset, a timeout, a reply that is not msgpack
            sock.close()
            raise CannotConnect(f"{self.url}: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        self.proto = proto
        self.sock = sock

    def reconnect(self, retries: int, retry_interval: float) -> None:
        """:meth:`connect`, up to ``retries`` more times after the first failure, waiting 0.1 s, then twice
        as long each time up to ``retry_interval`` seconds; raises the last CannotConnect."""
        delay = min(0.1, retry_interval)
        for attempt in range(retries + 1):
            try:
                self.connect()
                return
            except CannotConnect:
                if attempt == retries:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, retry_interval)

    def _new_protocol(self) -> ClientProtocol[Item]:
        framing = Framing("ws" if self._ws else "length", _READ_MAX)
        return ClientProtocol(
            "msgpack", framing, client=self._client_name, token=self._token, echo=False, batch=True
        )

    def _upgrade(self, sock: socket.socket) -> bytes:
        key = base64.b64encode(os.urandom(16)).decode()
        auth = f"Authorization: Bearer {self._token}\r\n" if self._token else ""
        sock.sendall(
            (
                f"GET {self._path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {_MSGPACK_PROTO}\r\n{auth}\r\n"
            ).encode()
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = sock.recv(1 << 16)
            if not data or len(buf) > 1 << 16:
                raise CannotConnect(f"{self.url}: WebSocket upgrade refused (no answer)")
            buf += data
        head, rest = buf.split(b"\r\n\r\n", 1)
        status = head.split(b"\r\n", 1)[0].decode("latin-1")
        if " 101 " not in status + " ":
            raise CannotConnect(f"{self.url}: WebSocket upgrade refused ({status})")
        if _MSGPACK_PROTO.encode() not in head:
            raise CannotConnect(f"{self.url}: server did not accept subprotocol {_MSGPACK_PROTO}")
        return rest

    def write_out(self) -> None:
        """Write all of :attr:`out`, reading replies whenever the server has some (so neither side can
        block the other with full buffers); a failed connection is dropped and ``on_lost`` called."""
        while self.out:
            sock = self.sock
            if sock is None:
                self._on_lost()
                continue
            try:
                r, w, _ = select.select([sock], [sock], [], self.timeout)
                if not r and not w:
                    raise TimeoutError("server neither reads nor answers")
                if r:
                    self._read_some(sock)
                    if self.sock is not sock:
                        continue
                if w and self.out:
                    n = sock.send(self.out)
                    del self.out[:n]
            except (OSError, TimeoutError):
                self.drop()
                self._on_lost()

    def wait_read(self, sock: socket.socket, wait: float) -> bool:
        """Read what the server sent within ``wait`` seconds; whether there was anything. Raises the
        socket's error (the caller drops the connection)."""
        r, _, _ = select.select([sock], [], [], wait)
        if r:
            self._read_some(sock)
        return bool(r)

    def _read_some(self, sock: socket.socket) -> None:
        data = sock.recv(1 << 18)
        if not data:
            raise ConnectionResetError("closed by the server")
        proto = self.proto
        on_event = self._on_event
        for event in proto.receive_data(data):
            on_event(event)
        for out in proto.take_outgoing():  # pongs
            sock.sendall(out)
        if proto.peer_closed:
            raise ConnectionResetError("closed by the server")

    def drop(self) -> None:
        """Close the socket after a failure (the queued frames stay until the caller clears them)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        """Close the connection cleanly (a WebSocket close frame first)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                if self._ws:
                    sock.sendall(ws_frame(0x8, struct.pack(">H", 1000)))
            except OSError:
                pass
            sock.close()
