"""Native WebSocket connections without batch frames: bursts go out as one write of many WebSocket frames
(see ``ws_frames``); every client library must still read them as separate, intact messages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import msgpack
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports.ws_write import ws_frames

WAIT = 10.0


@pytest.mark.parametrize("opcode", [0x1, 0x2, 0x81, 0x82])
def test_ws_frames_use_each_length_form(opcode: int) -> None:
    sizes = [0, 1, 124, 125, 126, 127, 65535, 65536]
    out = b"".join(ws_frames([b"a" * n for n in sizes], opcode))
    heads = []
    pos = 0
    while pos < len(out):
        b0, b1 = out[pos], out[pos + 1]
        assert b0 == 0x80 | opcode and not b1 & 0x80  # FIN + text or binary (as given), unmasked
        n, pos = b1, pos + 2
        if n == 126:
            n, pos = int.from_bytes(out[pos : pos + 2], "big"), pos + 2
        elif n == 127:
            n, pos = int.from_bytes(out[pos : pos + 8], "big"), pos + 8
        heads.append(n)
        pos += n
    assert heads == sizes and pos == len(out)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_burst_reaches_a_non_batch_ws_subscriber_as_separate_messages(tmp_path: Path, encoding: str) -> None:
    async def main() -> None:
        cli = {
            "data_dir": str(tmp_path / "d"),
            "http.listen": "127.0.0.1:0",
            "native.tcp_listen": "127.0.0.1:0",
        }
        async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
            url = f"ws://127.0.0.1:{server.ports['http']}/ws/hubbub"
            binary = encoding == "msgpack"

            async def send(ws: aiohttp.ClientWebSocketResponse, obj: dict[str, object]) -> None:
                if binary:
                    await ws.send_bytes(msgpack.packb(obj, use_bin_type=True))
                else:
                    await ws.send_json(obj)

            async def recv(ws: aiohttp.ClientWebSocketResponse) -> dict[str, object]:
                msg = await asyncio.wait_for(ws.receive(), WAIT)
                assert msg.type == (aiohttp.WSMsgType.BINARY if binary else aiohttp.WSMsgType.TEXT), msg
                out: dict[str, object] = msgpack.unpackb(msg.data) if binary else msg.json()
                return out

            sub = await http.ws_connect(url, protocols=[f"hubbub.v1.{encoding}"], max_msg_size=1 << 24)
            await send(sub, {"op": "hello", "id": 1, "v": 1})
            assert (await recv(sub))["op"] == "reply"
            await send(sub, {"op": "subscribe", "id": 2, "sub": "s", "pattern": "/burst"})
            assert (await recv(sub))["op"] == "reply"
            pub = await http.ws_connect(url, protocols=[f"hubbub.v1.{encoding}"])
            await send(pub, {"op": "hello", "id": 1, "v": 1, "batch": True})
            assert (await recv(pub))["op"] == "reply"
            sizes = [i % 7 * 40 for i in range(300)] + [70_000]  # every length form, in one burst
            for i, n in enumerate(sizes):
                field = "payload" if binary else "text"
                await send(pub, {"op": "publish", "id": 10 + i, "channel": "/burst", field: "x" * n})
            for i, n in enumerate(sizes):
                ev = await recv(sub)
                assert ev["op"] == "event" and ev["seq"] == i + 1, ev
                body = ev["payload"] if binary else ev["text"]
                assert isinstance(body, (str, bytes)), ev
                assert len(body) == n
            await pub.close()
            await sub.close()

    asyncio.run(main())
