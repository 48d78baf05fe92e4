"""Checks for the HTTP listener's fuzz targets (``atheris_targets.py``: ``http_heads``, ``ws_client_frames``).

``check_heads`` feeds raw bytes, cut into reads, to the listener's per-socket protocol
(``hubbub.transports.http_listener.HttpConnection``) over a fake transport, on an event loop of its own, with
a small application behind it; every answer it writes must be hubbub's: ``Server: hubbub`` and no version,
and a request the parser refuses gets exactly ``400`` ``bad request``, never the input back. Nothing may
raise out of the protocol, and no task may be left behind.

``check_frames`` feeds a client's WebSocket byte stream to the server's frame parser
(``hubbub.ws_frames.FrameParser``, two message limits) whole, in 7-byte pieces and a byte at a time, and
whole with bursts taken at once (``take``): the same messages and control frames each way, then the same
end (more bytes wanted, or the same close code); the only exception is ``FrameError`` with a close code
RFC 6455 gives (1002, 1007, 1009), text messages are ``str``, and the parser never holds more than a
message's limit and one frame not yet whole.
"""

from __future__ import annotations

import asyncio
import logging
import re
from types import SimpleNamespace
from typing import Any

from aiohttp import web

from hubbub.core.limits import Limiter
from hubbub.transports.accept import OpenFiles
from hubbub.transports.http_listener import HttpConnection
from hubbub.ws_frames import BINARY, CLOSE, PING, PONG, TEXT, FrameError, FrameParser

__all__ = ["check_frames", "check_heads"]

_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


class _Transport(asyncio.Transport):
    """What the protocol writes, kept; no socket."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def writelines(self, data: Any) -> None:
        for d in data:
            self.out += d

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default


class _Harness:
    """One event loop and one application for every input."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.manager = self.loop.run_until_complete(self._manager())
        node = SimpleNamespace(limiter=Limiter(), count_bad_input=lambda dialect: None)
        # The transport has no socket: the open-files guard admits every connection, as under the limit.
        self.listener: Any = SimpleNamespace(
            node=node,
            head_timeout_s=60.0,
            lingering=set(),
            warn=lambda *args: None,
            open_files=OpenFiles(node, "http", logging.getLogger("hubbub.fuzz")),
        )

    async def _manager(self) -> web.Server:
        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def echo_length(request: web.Request) -> web.Response:
            body = await request.read()
            return web.Response(text=str(len(body)))

        async def server_header(request: web.Request, response: web.StreamResponse) -> None:
            response.headers["Server"] = "hubbub"  # as the server's application does (transports/http.py)

        app = web.Application(client_max_size=4096)
        app.on_response_prepare.append(server_header)
        app.router.add_get("/", ok)
        app.router.add_post("/p", echo_length)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        assert runner.server is not None
        return runner.server

    def run(self, reads: list[bytes]) -> bytes:
        transport = _Transport()
        conn = HttpConnection(self.manager, self.listener, self.loop)
        conn.connection_made(transport)
        for data in reads:
            if transport.closed:
                break
            conn.data_received(data)
            self._settle()
        conn.connection_lost(None)
        self._settle()
        return bytes(transport.out)

    def _settle(self) -> None:
        """Let the protocol's tasks run until none is ready (a bounded number of loop turns)."""
        for _ in range(20):
            self.loop.run_until_complete(asyncio.sleep(0))


_HARNESS: _Harness | None = None


def check_heads(reads: list[bytes]) -> None:
    global _HARNESS
    if _HARNESS is None:
        _HARNESS = _Harness()
    out = _HARNESS.run(reads)
    for m in _STATUS.finditer(out):
        head = out[m.start() : out.find(b"\r\n\r\n", m.start()) + 4 or len(out)]
        assert b"\r\nServer: hubbub\r\n" in head, out
        assert b"aiohttp" not in head.lower() and b"python" not in head.lower(), out
        if m.group(1) == b"400":
            assert out[m.start() :].split(b"\r\n\r\n", 1)[1].startswith(b"bad request\n"), out
    assert not out or _STATUS.match(out), out
    loop = _HARNESS.loop
    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in left:
        t.cancel()
    if left:
        loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


def _parsed(
    stream: bytes, size: int, limit: int, burst: int = 0
) -> tuple[list[tuple[int, bytes | str]], int]:
    """What the parser gives for ``stream`` fed in ``size``-byte reads: the items, and the close code it
    failed with (0: none, more bytes wanted). With ``burst``, each message is followed by up to ``burst``
    more taken at once (``take``), as the server's reader takes a burst."""
    parser = FrameParser(limit)
    out: list[tuple[int, bytes | str]] = []
    for start in range(0, len(stream), size):
        piece = stream[start : start + size]
        parser.feed(piece)
        try:
            while (item := parser.next()) is not None:
                if burst and item[0] in (TEXT, BINARY):
                    more = parser.take(burst)
                    assert len(more) <= burst
                    out += [item, *((TEXT if isinstance(m, str) else BINARY, m) for m in more)]
                    continue
                op, payload = item
                assert op in (TEXT, BINARY, CLOSE, PING, PONG), item
                assert isinstance(payload, str) == (op == TEXT), item
                assert op < CLOSE or len(payload) <= 125, item
                assert op >= CLOSE or len(payload) <= limit, item
                out.append(item)
        except FrameError as e:
            assert e.code in (1002, 1007, 1009), e.code
            return out, e.code
        # A fragmented message below the limit, and one frame not yet whole (a control frame: 131 bytes).
        assert parser.buffered <= limit + 131, (parser.buffered, limit)
    return out, 0


def check_frames(stream: bytes) -> None:
    for limit in (1 << 20, 40):
        whole = _parsed(stream, max(len(stream), 1), limit)
        for size in (7, 1):
            assert _parsed(stream, size, limit) == whole, (size, limit)
        for burst in (1, 3):
            assert _parsed(stream, max(len(stream), 1), limit, burst) == whole, burst
