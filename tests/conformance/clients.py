"""The vector runner's connections: WebSocket, raw TCP and HTTP stream clients.

Concurrency contract: called from the event loop only. Each client owns one reader task that moves received
units into the client's buffer, so expectations and quiet windows only ever look at buffers; ``close()``
stops the reader and closes the connection, so nothing outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections import deque
from collections.abc import Sequence
from typing import Any

import aiohttp

from .framing import Len32Splitter, LineSplitter, MqttSplitter, SseEvent, SseParser
from .placeholders import VectorError
from .units import Closed, Item, Unit

__all__ = ["CLOSE_TIMEOUT_S", "Client", "HttpStreamClient", "TcpClient", "WsClient"]

CLOSE_TIMEOUT_S = 5.0


class Client:
    """One connection with a reader task that fills a buffer. Called from the event loop only."""

    kind = "?"

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: deque[Item] = deque()
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.closed_by_step = False
        self.closed_seen: Closed | None = None
        self.history: deque[str] = deque(maxlen=5)
        self.notes: list[str] = []

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._reader(), name=f"vector-client-{self.name}")

    async def _reader(self) -> None:
        raise NotImplementedError

    def _push(self, item: Item) -> None:
        self._items.append(item)
        self._arrived.set()

    def buffered(self) -> list[Item]:
        return list(self._items)

    def is_open(self) -> bool:
        return (
            not self.closed_by_step
            and self.closed_seen is None
            and not any(isinstance(i, Closed) for i in self._items)
        )

    async def next(self, wait_s: float) -> Item | None:
        """The next unconsumed item, waiting up to ``wait_s`` seconds. Once the close was consumed, it is
        returned again at once. None on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while not self._items:
            if self.closed_seen is not None:
                return self.closed_seen
            self._arrived.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return None
        item = self._items.popleft()
        if isinstance(item, Closed):
            self.closed_seen = item
        self.history.append(item.describe())
        return item

    async def wait_arrival(self) -> None:
        """Return once something is buffered."""
        while not self._items:
            self._arrived.clear()
            await self._arrived.wait()

    async def wait_closed(self, wait_s: float) -> bool:
        """Wait until the connection's end is buffered and consume it (data units before it stay)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            for item in self._items:
                if isinstance(item, Closed):
                    self._items.remove(item)
                    self.closed_seen = item
                    return True
            if self.closed_seen is not None or self.closed_by_step:
                return True
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)

    async def send(self, kind: str, data: bytes) -> None:
        """``kind`` is text, binary, json (compact JSON, text) or msgpack; see README §3.2."""
        raise NotImplementedError

    async def close(self) -> None:
        """Close from the client side (the ``close`` step and the end of the case). Idempotent."""
        raise NotImplementedError

    async def _stop_reader(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class WsClient(Client):
    kind = "ws"

    def __init__(self, name: str, ws: aiohttp.ClientWebSocketResponse[Any]) -> None:
        super().__init__(name)
        self.ws = ws
        self._start()

    async def _reader(self) -> None:
        ws = self.ws
        try:
            while True:
                msg = await ws.receive()
                if msg.type is aiohttp.WSMsgType.TEXT:
                    data = msg.data if isinstance(msg.data, bytes) else str(msg.data).encode()
                    self._push(Unit(data, binary=False))
                elif msg.type is aiohttp.WSMsgType.BINARY:
                    self._push(Unit(bytes(msg.data), binary=True))
                elif msg.type is aiohttp.WSMsgType.CLOSE:
                    self._push(Closed(int(msg.data), str(msg.extra or "")))
                    return
                elif msg.type is aiohttp.WSMsgType.CLOSING:  # our own close() is under way
                    return
                elif msg.type is aiohttp.WSMsgType.ERROR:  # a protocol error: no close code was received
                    self._push(Closed(None, f"WebSocket error: {msg.data!r}"))
                    return
                else:
                    # CLOSED: the TCP connection ended without a close frame. aiohttp reports 1000 for that;
                    # RFC 6455 §7.1.5 calls it 1006, which is what a test must see.
                    self._push(Closed(1006, "the TCP connection ended without a close frame"))
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._push(Closed(None, f"reader failed: {exc!r}"))

    async def send(self, kind: str, data: bytes) -> None:
        try:
            if kind in ("text", "json"):
                await self.ws.send_str(data.decode("utf-8", "surrogatepass"))
            else:
                await self.ws.send_bytes(data)
        except (ConnectionError, aiohttp.ClientError, RuntimeError) as exc:
            # The server may close first (a frame over the limit); expect_close judges that, not the send.
            self.notes.append(f"send failed: {exc!r}")

    async def close(self) -> None:
        if not self.ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(code=1000), CLOSE_TIMEOUT_S)
        await self._stop_reader()


class TcpClient(Client):
    kind = "tcp"

    def __init__(
        self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mode: str
    ) -> None:
        super().__init__(name)
        self.reader = reader
        self.writer = writer
        self.mode = mode
        self._start()

    async def _reader(self) -> None:
        lines = LineSplitter() if self.mode == "lines" else None
        frames: Len32Splitter | MqttSplitter | None = (
            Len32Splitter() if self.mode == "len32" else MqttSplitter() if self.mode == "mqtt" else None
        )
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    if lines is not None:
                        for unit in lines.end():
                            self._push(Unit(unit))
                    rest = (
                        f", {frames.leftover()} bytes of an incomplete frame"
                        if frames and frames.leftover()
                        else ""
                    )
                    self._push(Closed(None, "EOF" + rest))
                    return
                units = lines.feed(data) if lines is not None else frames.feed(data) if frames else []
                for unit in units:
                    self._push(Unit(unit))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._push(Closed(None, f"connection error: {exc!r}"))

    async def send(self, kind: str, data: bytes) -> None:
        if kind == "json":
            data += b"\n"
        elif kind == "msgpack":
            data = struct.pack(">I", len(data)) + data
        try:
            self.writer.write(data)
            await self.writer.drain()
        except ConnectionError as exc:
            self.notes.append(f"send failed: {exc!r}")

    async def close(self) -> None:
        await self._stop_reader()
        if not self.writer.is_closing():
            self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), CLOSE_TIMEOUT_S)


class HttpStreamClient(Client):
    kind = "http"

    def __init__(self, name: str, resp: aiohttp.ClientResponse) -> None:
        super().__init__(name)
        self.resp = resp
        self.sse = resp.headers.get("Content-Type", "").lower().startswith("text/event-stream")
        self._start()

    async def _reader(self) -> None:
        sse = SseParser() if self.sse else None
        lines = LineSplitter(ndjson=True)
        try:
            async for chunk in self.resp.content.iter_any():
                self._emit(sse.feed(chunk) if sse else lines.feed(chunk))
            self._emit(sse.feed(b"", final=True) if sse else lines.end())
            self._push(Closed(None, "end of stream"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._push(Closed(None, f"stream error: {exc!r}"))

    def _emit(self, units: Sequence[SseEvent | bytes]) -> None:
        for u in units:
            self._push(Unit(u.data.encode(), sse=u) if isinstance(u, SseEvent) else Unit(u))

    async def send(self, kind: str, data: bytes) -> None:
        raise VectorError("an HTTP stream client cannot send")

    async def close(self) -> None:
        await self._stop_reader()
        self.resp.close()
