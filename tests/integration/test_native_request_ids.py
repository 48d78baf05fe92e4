"""A request id that no encoding can echo (a JSON integer past 64 bits) gets error 4001 without an id, and the
connection goes on, in every native transport and encoding: WebSocket JSON and msgpack, TCP JSON lines and
length-prefixed msgpack. msgpack itself carries no integer past 64 bits, so its frames try the extremes it
does carry (echoed, as any out-of-range integer id is)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import orjson
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 10.0
HUGE = 2**70
BAD_REQUEST = {"op": "error", "code": 4001, "message": "bad request", "temporary": False}

#: (frame bytes, the error frame it must get) per encoding. JSON ids are written by hand: past 64 bits.
CASES: dict[str, list[tuple[bytes, dict[str, Any]]]] = {
    "json": [
        (b'{"op":"ping","id":%d}' % HUGE, BAD_REQUEST),
        (b'{"op":"publish","id":%d,"channel":"/a","text":"x","ack":true}' % HUGE, BAD_REQUEST),
        (b'{"op":"subscribe","id":%d,"sub":"s","pattern":"/a"}' % -HUGE, BAD_REQUEST),
        (b'{"op":"unsubscribe","id":%d,"sub":"s"}' % (2**64), BAD_REQUEST),
        (b'{"op":"unsubscribe","id":%d,"sub":"s"}' % (2**64 - 1), {**BAD_REQUEST, "id": 2**64 - 1}),
    ],
    "msgpack": [
        (msgpack.packb({"op": "ping", "id": 2**64 - 1}), {**BAD_REQUEST, "id": 2**64 - 1}),
        (
            msgpack.packb({"op": "publish", "id": -(2**63), "channel": "/a", "payload": b"x", "ack": True}),
            {**BAD_REQUEST, "id": -(2**63)},
        ),
    ],
}


def _server(tmp_path: Path) -> Server:
    cli = {
        "data_dir": str(tmp_path / "d"),
        "store": "memory",
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
    }
    return Server(load_config(cli=cli, env={}))


def _load(encoding: str, data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = orjson.loads(data) if encoding == "json" else msgpack.unpackb(data)
    return obj


def _dump(encoding: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj) if encoding == "json" else msgpack.packb(obj)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_websocket_answers_4001_and_stays_open(tmp_path: Path, encoding: str) -> None:
    async def main() -> None:
        async with _server(tmp_path) as server, aiohttp.ClientSession() as http:
            url = f"ws://127.0.0.1:{server.ports['http']}/ws/hubbub"
            ws = await http.ws_connect(url, protocols=[f"hubbub.v1.{encoding}"])

            async def send(data: bytes) -> None:
                await (ws.send_str(data.decode()) if encoding == "json" else ws.send_bytes(data))

            async def recv() -> dict[str, Any]:
                msg = await asyncio.wait_for(ws.receive(), WAIT)
                assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
                data = msg.data.encode() if isinstance(msg.data, str) else msg.data
                return _load(encoding, data)

            await send(_dump(encoding, {"op": "hello", "id": 1, "v": 1}))
            assert (await recv())["op"] == "reply"
            for i, (frame, want) in enumerate(CASES[encoding]):
                await send(frame)
                assert await recv() == want
                await send(_dump(encoding, {"op": "ping", "id": 100 + i}))  # still open, still answering
                assert await recv() == {"op": "pong", "id": 100 + i}
            await ws.close()

    asyncio.run(main())


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_tcp_answers_4001_and_stays_open(tmp_path: Path, encoding: str) -> None:
    def framed(data: bytes) -> bytes:
        return data + b"\n" if encoding == "json" else len(data).to_bytes(4, "big") + data

    async def main() -> None:
        async with _server(tmp_path) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.ports["native"])

            async def recv() -> dict[str, Any]:
                if encoding == "json":
                    data = await asyncio.wait_for(reader.readline(), WAIT)
                else:
                    head = await asyncio.wait_for(reader.readexactly(4), WAIT)
                    data = await asyncio.wait_for(reader.readexactly(int.from_bytes(head, "big")), WAIT)
                return _load(encoding, data)

            writer.write(framed(_dump(encoding, {"op": "hello", "id": 1, "v": 1})))
            assert (await recv())["op"] == "reply"
            for i, (frame, want) in enumerate(CASES[encoding]):
                writer.write(framed(frame))
                assert await recv() == want
                writer.write(framed(_dump(encoding, {"op": "ping", "id": 100 + i})))
                assert await recv() == {"op": "pong", "id": 100 + i}
            writer.close()
            await writer.wait_closed()

    asyncio.run(main())
