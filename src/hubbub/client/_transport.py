"""Transports of the native client: one JSON frame per WebSocket message, or JSON lines over raw TCP.

Each transport sends bytes the client's :class:`~hubbub.client.protocol.ClientProtocol` encoded, hands back
what it reads (whole WebSocket messages; raw TCP's bytes as they come, framed by the protocol) and reports
the close code it saw. :class:`Connector` opens a transport and completes the hello; :class:`_Conn` is one
live connection after a successful hello; :func:`_parse_url` picks the transport for a URL. Called from the
client's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from hubbub import __version__
from hubbub.client._wire import CannotConnect
from hubbub.client.framing import Framing
from hubbub.client.protocol import ClientEvent, ClientProtocol, HelloRefused, Welcome
from hubbub.errors import BadFrame, FrameTooLarge, HubbubError

log = logging.getLogger("hubbub.client")

WS_PATH = "/ws/hubbub"
SUBPROTOCOL = "hubbub.v1.json"
DEFAULT_CLIENT_NAME = f"hubbub-py/{__version__}"


class _Transport(Protocol):
    close_code: int | None

    async def send(self, data: bytes) -> None: ...

    async def recv(self) -> str | bytes | None:
        """What was read next (a message, or a stream's bytes), or None once the connection is closed."""
        ...

    async def close(self) -> None: ...


class _WsTransport:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.close_code: int | None = None

    async def send(self, data: bytes) -> None:
        await self.ws.send_str(data.decode())

    async def recv(self) -> str | bytes | None:
        while True:
            msg = await self.ws.receive()
            if msg.type == aiohttp.WSMsgType.TEXT:
                return str(msg.data)
            if msg.type == aiohttp.WSMsgType.BINARY:
                return bytes(msg.data)
            if msg.type in (aiohttp.WSMsgType.PING, aiohttp.WSMsgType.PONG):
                continue
            self.close_code = self.ws.close_code
            return None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()


class _TcpTransport:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.close_code: int | None = None

    async def send(self, data: bytes) -> None:
        self.writer.write(data)  # framed by the protocol (a line)
        await self.writer.drain()

    async def recv(self) -> str | bytes | None:
        data = await self.reader.read(1 << 16)
        return data or None

    async def close(self) -> None:
        self.writer.close()
        try:
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)
        except TimeoutError:
            self.writer.transport.abort()  # a peer that does not read must not hold up the reconnect
        except Exception:
            pass


@dataclass(eq=False)
class _Conn:
    """One live connection after a successful hello: its transport and its protocol state."""

    transport: _Transport
    proto: ClientProtocol[Any]
    #: Events read with the hello's reply, after it (dispatched first by the reader).
    early: list[ClientEvent]
    error: HubbubError | None = None  # the fatal error the server pushed before closing, if any

    @property
    def session(self) -> str:
        return self.proto.session

    @property
    def ping_interval(self) -> float:
        return self.proto.ping_interval

    @property
    def max_frame(self) -> int:
        return self.proto.max_frame


class Connector:
    """Opens connections to one URL: a transport, then the hello (no retries here). Owns the aiohttp
    session of the WebSocket transport; :meth:`close` it with the client."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        client_name: str,
        echo: bool,
        batch: bool,
        max_frame: int,
        timeout: float,
    ) -> None:
        self.url = url
        self.kind, self.ws_url, self.host, self.port = _parse_url(url)
        self._token = token
        self._client_name = client_name
        self._echo = echo
        self._batch = batch
        self._max_frame = max_frame
        self._timeout = timeout
        self._http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def connect(self) -> _Conn:
        """Open a transport and complete the hello. Raises CannotConnect, or the server's hello error."""
        transport = await self._open()
        try:
            async with asyncio.timeout(self._timeout):
                return await self._hello(transport)
        except BaseException as exc:
            await transport.close()
            if isinstance(exc, TimeoutError):
                raise CannotConnect(f"{self.url}: no hello reply") from exc
            raise

    async def _open(self) -> _Transport:
        try:
            async with asyncio.timeout(self._timeout):
                if self.kind == "tcp":
                    reader, writer = await asyncio.open_connection(
                        self.host, self.port, limit=self._max_frame
                    )
                    return _TcpTransport(reader, writer)
                if self._http is None:
                    self._http = aiohttp.ClientSession()
                headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
                ws = await self._http.ws_connect(
                    self.ws_url,
                    protocols=(SUBPROTOCOL,),
                    headers=headers,
                    max_msg_size=self._max_frame,
                    autoping=True,
                    compress=0,
                    # A dead peer must not hold up the reconnect for aiohttp's default 10 s.
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=2.0),
                )
                if ws.protocol != SUBPROTOCOL:
                    await ws.close()
                    raise CannotConnect(f"{self.url}: server did not accept subprotocol {SUBPROTOCOL}")
                return _WsTransport(ws)
        except aiohttp.WSServerHandshakeError as exc:
            msg = f"{self.url}: WebSocket upgrade refused ({exc.status} {exc.message})"
            raise CannotConnect(msg) from exc
        except (OSError, aiohttp.ClientError) as exc:
            raise CannotConnect(f"{self.url}: {exc}") from exc
        except TimeoutError as exc:
            raise CannotConnect(f"{self.url}: timed out") from exc

    async def _hello(self, transport: _Transport) -> _Conn:
        framing = Framing("lines", self._max_frame) if self.kind == "tcp" else None
        proto: ClientProtocol[Any] = ClientProtocol(
            "json", framing, client=self._client_name, token=self._token, echo=self._echo, batch=self._batch
        )
        try:
            await transport.send(proto.hello())
            while True:
                raw = await transport.recv()
                if raw is None:
                    raise CannotConnect(f"{self.url}: connection closed during hello")
                try:
                    events = proto.receive_data(raw)
                except (BadFrame, FrameTooLarge) as exc:
                    raise CannotConnect(f"{self.url}: bad hello reply") from exc
                for i, ev in enumerate(events):
                    if isinstance(ev, HelloRefused):
                        if ev.malformed:
                            raise CannotConnect(f"{self.url}: bad hello reply")
                        raise ev.error
                    if isinstance(ev, Welcome):
                        return _Conn(transport, proto, events[i + 1 :])
        except (OSError, aiohttp.ClientError) as exc:
            raise CannotConnect(f"{self.url}: {exc}") from exc


def _parse_url(url: str) -> tuple[str, str, str, int]:
    """(kind, url, host, port): kind is ``ws`` or ``tcp``; ``url`` is the WebSocket URL for ``ws``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "tcp":
        if not parts.hostname or parts.port is None:
            raise ValueError(f"tcp URL needs a host and a port: {url!r}")
        return "tcp", url, parts.hostname, parts.port
    if scheme in ("ws", "http"):
        ws_scheme = "ws"
    elif scheme in ("wss", "https"):
        ws_scheme = "wss"
    else:
        raise ValueError(
            f"unsupported URL scheme {parts.scheme!r} (use ws://, wss://, http://, https:// or tcp://)"
        )
    if not parts.hostname:
        raise ValueError(f"URL needs a host: {url!r}")
    path = parts.path if parts.path not in ("", "/") else WS_PATH
    query = f"?{parts.query}" if parts.query else ""
    port = parts.port or (443 if ws_scheme == "wss" else 80)
    return "ws", f"{ws_scheme}://{parts.netloc}{path}{query}", parts.hostname, port
