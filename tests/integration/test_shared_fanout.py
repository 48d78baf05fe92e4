"""Several connections of each dialect sharing one fan-out, over real sockets on 127.0.0.1.

Two connections of every dialect (native over WebSocket in JSON, msgpack and with batch frames, native over
TCP, ivy, guble and SSE) subscribe to one channel, then a native publisher sends a burst: each connection
gets every event once, in order. The burst fans out as runs shared between sessions of the same encoding
(``FanOut.fan_out_run``), which is the path this exercises.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 10.0
N = 200
PAIR = 2


@contextlib.asynccontextmanager
async def serve(data_dir: Path) -> AsyncIterator[Server]:
    cli = {"data_dir": str(data_dir), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}
    async with Server(load_config(cli=cli, env={})) as server:
        yield server


Collect = Callable[[], Awaitable[list[str]]]


async def native_ws(http: aiohttp.ClientSession, addr: str, encoding: str, batch: bool) -> Collect:
    ws = await http.ws_connect(f"ws://{addr}/ws/hubbub", protocols=[f"hubbub.v1.{encoding}"])

    async def send(obj: dict[str, Any]) -> None:
        if encoding == "json":
            await ws.send_str(json.dumps(obj))
        else:
            await ws.send_bytes(msgpack.packb(obj))

    async def frames() -> list[dict[str, Any]]:
        msg = await ws.receive(timeout=WAIT)
        obj = json.loads(msg.data) if encoding == "json" else msgpack.unpackb(msg.data)
        return list(obj["frames"]) if obj.get("op") == "batch" else [obj]

    await send({"op": "hello", "id": 1, "v": 1, "batch": batch})
    assert (await frames())[0]["op"] == "reply"
    await send({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/shared/x"})
    assert (await frames())[0]["op"] == "reply"

    async def collect() -> list[str]:
        got: list[str] = []
        while len(got) < N:
            for f in await frames():
                if f.get("op") == "event":
                    got.append(f["text"] if encoding == "json" else bytes(f["payload"]).decode())
        await ws.close()
        return got

    return collect


async def native_tcp(port: int) -> Collect:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send(obj: dict[str, Any]) -> None:
        writer.write(json.dumps(obj).encode() + b"\n")
        await writer.drain()

    async def frame() -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(await asyncio.wait_for(reader.readline(), WAIT))
        return obj

    await send({"op": "hello", "id": 1, "v": 1})
    assert (await frame())["op"] == "reply"
    await send({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/shared/x"})
    assert (await frame())["op"] == "reply"

    async def collect() -> list[str]:
        got: list[str] = []
        while len(got) < N:
            f = await frame()
            if f.get("op") == "event":
                got.append(f["text"])
        writer.close()
        return got

    return collect


async def ivy_ws(http: aiohttp.ClientSession, addr: str) -> Collect:
    ws = await http.ws_connect(f"ws://{addr}/ws", protocols=("ivy1",))
    assert (await ws.receive_str(timeout=WAIT)).startswith("@")
    await ws.send_str("+/shared/x")
    await ws.send_str("@")  # a time request: its reply means the subscription is in place
    assert (await ws.receive_str(timeout=WAIT)).startswith("##@")

    async def collect() -> list[str]:
        got: list[str] = []
        while len(got) < N:
            line = await ws.receive_str(timeout=WAIT)
            got.append(line.rsplit(":", 1)[1])
        await ws.close()
        return got

    return collect


async def guble_ws(http: aiohttp.ClientSession, addr: str) -> Collect:
    ws = await http.ws_connect(f"ws://{addr}/stream/")
    assert (await ws.receive(timeout=WAIT)).data.startswith(b"#connected")
    await ws.send_str("+ /shared/x")
    assert (await ws.receive(timeout=WAIT)).data == b"#subscribed-to /shared/x"

    async def collect() -> list[str]:
        got: list[str] = []
        while len(got) < N:
            data: bytes = (await ws.receive(timeout=WAIT)).data
            got.append(data.rsplit(b"\n", 1)[1].decode())
        await ws.close()
        return got

    return collect


async def sse(http: aiohttp.ClientSession, addr: str) -> Collect:
    resp = await http.get(f"http://{addr}/api/v1/stream/shared/x")
    assert resp.status == 200
    assert await asyncio.wait_for(resp.content.readline(), WAIT) == b"retry: 2000\n"

    async def collect() -> list[str]:
        got: list[str] = []
        while len(got) < N:
            line = await asyncio.wait_for(resp.content.readline(), WAIT)
            if line.startswith(b"data: "):
                got.append(json.loads(line[6:])["text"])
        resp.close()
        return got

    return collect


@pytest.mark.parametrize("how", ["publish", "publish_batch"])
def test_every_dialect_shares_a_burst_between_two_connections(tmp_path: Path, how: str) -> None:
    """``publish_batch``: the same events as batches of rows (docs/native.md "Batched publishes"), mixed with
    single publishes; every dialect gets them as if each had been published alone, in order."""

    async def main() -> None:
        async with serve(tmp_path / "d") as server, aiohttp.ClientSession() as http:
            addr = f"127.0.0.1:{server.ports['http']}"
            subscribers: dict[str, list[Collect]] = {
                "native json": [await native_ws(http, addr, "json", False) for _ in range(PAIR)],
                "native msgpack": [await native_ws(http, addr, "msgpack", False) for _ in range(PAIR)],
                "native batch": [await native_ws(http, addr, "json", True) for _ in range(PAIR)],
                "native tcp": [await native_tcp(server.ports["native"]) for _ in range(PAIR)],
                "ivy": [await ivy_ws(http, addr) for _ in range(PAIR)],
                "guble": [await guble_ws(http, addr) for _ in range(PAIR)],
                "sse": [await sse(http, addr) for _ in range(PAIR)],
            }
            # The SSE stream's subscription is in place once its headers came; the others replied already.
            pub = await http.ws_connect(f"ws://{addr}/ws/hubbub", protocols=["hubbub.v1.json"])
            await pub.send_str(json.dumps({"op": "hello", "id": 1, "v": 1}))
            assert json.loads((await pub.receive(timeout=WAIT)).data)["op"] == "reply"
            # One message per publish, sent without waiting: the server reads them as a burst.
            i = 0
            while i < N:
                if how == "publish_batch" and i % 70 == 0:
                    rows = [f"e{j}" for j in range(i, min(N, i + 60))]
                    frame = {"op": "publish_batch", "id": 10 + i, "channel": "/shared/x", "texts": rows}
                    await pub.send_str(json.dumps(frame))
                    i += len(rows)
                    continue
                await pub.send_str(
                    json.dumps({"op": "publish", "id": 10 + i, "channel": "/shared/x", "text": f"e{i}"})
                )
                i += 1
            want = [f"e{i}" for i in range(N)]
            for dialect, conns in subscribers.items():
                results = await asyncio.gather(*(c() for c in conns))
                for got in results:
                    assert got == want, dialect
            await pub.close()

    asyncio.run(main())
