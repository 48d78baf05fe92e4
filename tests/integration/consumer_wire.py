"""A minimal async native-protocol connection for tests of durable consumers over the wire: WebSocket or
TCP, JSON or msgpack, against a real server process."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import msgpack
import orjson

__all__ = ["WAIT", "Wire", "text"]

WAIT = 20.0


class Wire:
    """One native connection. ``request`` answers with the reply (or error) of its id and keeps the pushes
    read meanwhile for :meth:`push`."""

    def __init__(self, transport: str, encoding: str) -> None:
        self.transport = transport
        self.encoding = encoding
        self.pushed: list[dict[str, Any]] = []
        self._ids = 100
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    @classmethod
    async def open(
        cls, ports: dict[str, int], transport: str, encoding: str, token: str | None = None
    ) -> Wire:
        w = cls(transport, encoding)
        if transport == "ws":
            w._http = aiohttp.ClientSession()
            w._ws = await w._http.ws_connect(
                f"http://127.0.0.1:{ports['http']}/ws/hubbub", protocols=(f"hubbub.v1.{encoding}",)
            )
        else:
            w._reader, w._writer = await asyncio.open_connection("127.0.0.1", ports["native"])
        reply = await w.request({"op": "hello", "v": 1, **({"token": token} if token else {})})
        assert reply["op"] == "reply", reply
        return w

    def _dump(self, obj: dict[str, Any]) -> bytes:
        if self.encoding == "json":
            return orjson.dumps(obj)
        out: bytes = msgpack.packb(obj, use_bin_type=True)
        return out

    async def send(self, obj: dict[str, Any]) -> None:
        data = self._dump(obj)
        if self._ws is not None:
            if self.encoding == "json":
                await self._ws.send_str(data.decode())
            else:
                await self._ws.send_bytes(data)
        else:
            assert self._writer is not None
            self._writer.write(
                data + b"\n" if self.encoding == "json" else len(data).to_bytes(4, "big") + data
            )
            await self._writer.drain()

    async def recv(self) -> dict[str, Any]:
        async with asyncio.timeout(WAIT):
            if self._ws is not None:
                msg = await self._ws.receive()
                if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                    raise ConnectionError(f"closed: {msg.type}")
                raw = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
            else:
                assert self._reader is not None
                if self.encoding == "json":
                    raw = await self._reader.readuntil(b"\n")
                else:
                    n = int.from_bytes(await self._reader.readexactly(4), "big")
                    raw = await self._reader.readexactly(n)
        obj = orjson.loads(raw) if self.encoding == "json" else msgpack.unpackb(raw, raw=False)
        assert isinstance(obj, dict)
        return obj

    async def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._ids += 1
        rid = self._ids
        await self.send({**obj, "id": rid})
        while True:
            msg = await self.recv()
            if msg.get("id") == rid and msg.get("op") in ("reply", "error"):
                return msg
            self.pushed.append(msg)

    async def push(self, op: str = "deliver") -> dict[str, Any]:
        """The next push of ``op`` (skipping pings)."""
        while True:
            for i, m in enumerate(self.pushed):
                if m.get("op") == op:
                    return self.pushed.pop(i)
            self.pushed.append(await self.recv())

    async def close(self) -> None:
        """Close abruptly (no ``unconsume``), as a client that goes away."""
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()


def text(item: dict[str, Any]) -> str:
    """An item's payload as text, in either encoding."""
    if "payload" in item:
        return bytes(item["payload"]).decode()
    return str(item["text"])
