"""Mist clients for the integration tests, written from what the real clients put on the wire.

:class:`GoClient2015` behaves as the mist 2015 Go client (``jshawl/mist`` ``client.go``): one TCP
connection, a reader that splits each line on single spaces into at most three fields (``publish`` lines
become messages with their tags split on ``,``; ``list`` lines become the subscription lists, split on
spaces then commas; ``pong``; ``error …``), the subscriptions it made kept client-side, and, when the
connection drops, a reconnect (with its own backoff) that re-sends ``subscribe`` for each of them.

:class:`Client1x` behaves as the 1.x Go client (``nanopack/mist`` ``clients``): JSON objects written one per
line, replies read with a streaming JSON decoder, ``auth`` first when it has a token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

WAIT = 10.0


@dataclass(frozen=True)
class Message:
    tags: tuple[str, ...]
    data: str


class GoClient2015:
    """See the module docstring. ``messages`` holds delivered events; ``replies`` every other line."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.subscriptions: list[tuple[str, ...]] = []
        self.messages: asyncio.Queue[Message] = asyncio.Queue()
        self.replies: asyncio.Queue[str] = asyncio.Queue()
        self.lists: asyncio.Queue[list[tuple[str, ...]]] = asyncio.Queue()
        self.reconnected = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._task = asyncio.create_task(self._read(reader))

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()

    async def _write(self, line: str) -> None:
        assert self._writer is not None
        self._writer.write(line.encode() + b"\n")
        await self._writer.drain()

    async def subscribe(self, tags: list[str]) -> None:
        self.subscriptions.append(tuple(tags))
        await self._write("subscribe " + ",".join(tags))

    async def unsubscribe(self, tags: list[str]) -> None:
        self.subscriptions.remove(tuple(tags))
        await self._write("unsubscribe " + ",".join(tags))

    async def publish(self, tags: list[str], data: str) -> None:
        await self._write(f"publish {','.join(tags)} {data}")

    async def ping(self) -> None:
        """A round trip: once ``pong`` is back, every earlier command was handled."""
        await self._write("ping")
        assert await asyncio.wait_for(self.replies.get(), WAIT) == "pong"

    async def list(self) -> list[tuple[str, ...]]:
        await self._write("list")
        return await asyncio.wait_for(self.lists.get(), WAIT)

    async def next_message(self) -> Message:
        return await asyncio.wait_for(self.messages.get(), WAIT)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            line = await reader.readline()
            if not line:
                if self._closing:
                    return
                await self._reconnect()
                return
            fields = line.rstrip(b"\n").decode().split(" ", 2)
            if fields[0] == "publish" and len(fields) == 3:
                self.messages.put_nowait(Message(tuple(fields[1].split(",")), fields[2]))
            elif fields[0] == "list":
                rest = " ".join(fields[1:])
                self.lists.put_nowait([tuple(s.split(",")) for s in rest.split(" ") if s])
            else:
                self.replies.put_nowait(" ".join(fields))

    async def _reconnect(self) -> None:
        """The Go client's reconnect: dial again with backoff, then re-subscribe everything it had."""
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
        backoff = 0.05
        while True:
            try:
                reader, self._writer = await asyncio.open_connection(self.host, self.port)
                break
            except OSError:
                await asyncio.sleep(backoff)  # the client's own retry backoff, not a test wait
                backoff = min(backoff * 2, 0.5)
        for tags in self.subscriptions:
            await self._write("subscribe " + ",".join(tags))
        self.reconnected.set()
        self._task = asyncio.create_task(self._read(reader))


class Client1x:
    """See the module docstring. ``inbox`` holds every decoded object the server sent."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.inbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._decoder = json.JSONDecoder()
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, host: str, port: int, token: str = "") -> Client1x:
        reader, writer = await asyncio.open_connection(host, port)
        client = cls(reader, writer)
        if token:
            await client.send(command="auth", data=token)
        return client

    async def send(self, **msg: Any) -> None:
        self.writer.write(json.dumps(msg).encode() + b"\n")
        await self.writer.drain()

    async def recv(self) -> dict[str, Any] | None:
        """The next object, or None once the server closed the connection."""
        return await asyncio.wait_for(self.inbox.get(), WAIT)

    async def ping(self) -> None:
        await self.send(command="ping")
        assert await self.recv() == {"command": "ping", "data": "pong"}

    async def _read(self) -> None:
        buf = ""
        while True:
            chunk = await self.reader.read(65536)
            if not chunk:
                self.inbox.put_nowait(None)
                return
            buf += chunk.decode()
            while True:
                buf = buf.lstrip()
                if not buf:
                    break
                try:
                    obj, end = self._decoder.raw_decode(buf)
                except json.JSONDecodeError:
                    break  # incomplete: wait for more
                self.inbox.put_nowait(obj)
                buf = buf[end:]

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
