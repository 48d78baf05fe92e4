"""A minimal qrpc client for tests (protocols/qpubs.md §4): calls out as JSON lines, and every line in kept
per call id, as the npm ``qrpc`` client routes them to each call's callback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
from collections import defaultdict
from typing import Any

WAIT = 10.0


class QrpcClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._ids = itertools.count(1)
        self.lines: dict[str, asyncio.Queue[dict[str, Any]]] = defaultdict(asyncio.Queue)
        self.eof = asyncio.Event()
        self._task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(
        cls, port: int, host: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None
    ) -> QrpcClient:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 22, ssl=ssl_context)
        return cls(reader, writer)

    async def _read(self) -> None:
        try:
            while True:
                line = await self.reader.readline()
                if not line:
                    break
                msg = json.loads(line)
                self.lines[str(msg["id"])].put_nowait(msg)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.eof.set()

    def send(self, name: str, m: Any, call_id: str | None = None) -> str:
        cid = call_id if call_id is not None else f"c{next(self._ids)}"
        self.writer.write(json.dumps({"v": 1, "id": cid, "n": name, "m": m}).encode() + b"\n")
        return cid

    async def next(self, call_id: str, wait: float = WAIT) -> dict[str, Any]:
        """The next line of the call ``call_id``."""
        return await asyncio.wait_for(self.lines[call_id].get(), wait)

    async def call(self, name: str, m: Any) -> Any:
        """A call's final result; raises ``CallError`` for a final error."""
        msg = await self.next(self.send(name, m))
        assert msg["s"] == "end", msg
        if msg.get("e"):
            raise CallError(msg["e"]["code"], msg["e"]["message"])
        return msg.get("m")

    async def close(self) -> None:
        self.writer.close()
        self._task.cancel()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()
        await asyncio.gather(self._task, return_exceptions=True)

    def abort(self) -> None:
        """Drop the connection at once (a client that dies)."""
        self.writer.transport.abort()
        self._task.cancel()


class CallError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
