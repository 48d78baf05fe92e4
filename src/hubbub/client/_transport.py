"""Transports of the native client: one JSON frame per WebSocket message, or per line over raw TCP.

Each transport sends and receives whole frames and reports the close code it saw; :class:`_Conn` is one
live connection after a successful hello; :func:`_parse_url` picks the transport for a URL. Called from the
client's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from hubbub.errors import HubbubError

log = logging.getLogger("hubbub.client")

WS_PATH = "/ws/hubbub"


class _Transport(Protocol):
    close_code: int | None

    async def send(self, data: bytes) -> None: ...

    async def recv(self) -> str | bytes | None:
        """The next frame, or None once the connection is closed."""
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
        self.writer.write(data + b"\n")
        await self.writer.drain()

    async def recv(self) -> str | bytes | None:
        while True:
            try:
                line = await self.reader.readuntil(b"\n")
            except asyncio.IncompleteReadError:
                return None
            except asyncio.LimitOverrunError:
                # A line over the bound: the stream cannot be resynchronised, so the connection ends.
                log.warning("native TCP line over the client's max_frame; dropping the connection")
                return None
            line = line.rstrip(b"\r\n")
            if line:
                return line

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
    """One live connection after a successful hello."""

    transport: _Transport
    session: str
    ping_interval: float
    max_frame: int
    error: HubbubError | None = None  # the fatal error the server pushed before closing, if any


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
