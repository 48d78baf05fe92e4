"""Three real nodes on one PostgreSQL and one Redis, with publishers and subscribers of several dialects
spread over them: a guble WebSocket on node A, Server-Sent Events on node B and the native protocol on node C
all see the events published through the native protocol on A and through HTTP on B, in per-channel seq
order, once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.redisserver import RedisServer

from .nativelines import Lines
from .serverproc import ServerProcess
from .test_cluster import _node

pytestmark = pytest.mark.slow

N = 60


@pytest.fixture
def nodes(tmp_path: Path, pg_url: str, redis_server: RedisServer) -> Iterator[list[ServerProcess]]:
    started = [_node(tmp_path, name, pg_url, redis_server) for name in "abc"]
    try:
        yield started
    finally:
        for n in started:
            n.kill()


async def _guble_seqs(ws: aiohttp.ClientWebSocketResponse, n: int) -> list[int]:
    seqs: list[int] = []
    while len(seqs) < n:
        msg = await ws.receive(timeout=20)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        text = msg.data.decode()
        if text.startswith(("#", "!")):
            continue
        path, seq = text.split("\n", 1)[0].split(",")[:2]
        assert path == "/md/x"
        seqs.append(int(seq))
    return seqs


async def _sse_seqs(resp: aiohttp.ClientResponse, n: int) -> list[int]:
    seqs: list[int] = []
    while len(seqs) < n:
        line = await asyncio.wait_for(resp.content.readline(), 20)
        assert line, "the stream ended"
        if line.startswith(b"data: "):
            seqs.append(int(json.loads(line[6:])["seq"]))
    return seqs


def test_dialects_across_three_nodes(nodes: list[ServerProcess]) -> None:
    a, b, c = nodes

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{a.ports['http']}/stream/user/u1")
            await ws.send_str("+ /md")
            while True:
                first = (await ws.receive(timeout=20)).data.decode()
                if first.startswith("#subscribed-to /md"):
                    break
            sse = await http.get(f"http://127.0.0.1:{b.ports['http']}/api/v1/stream/md/**")
            assert sse.status == 200
            with Lines(c.ports["native"]) as native, Lines(a.ports["native"]) as pub:
                assert native.subscribe("s", "/md/**")["op"] == "reply"
                publish_url = f"http://127.0.0.1:{b.ports['http']}/api/v1/publish/md/x"
                for i in range(N):
                    if i % 2:
                        async with http.post(
                            publish_url, data=f"h{i}", headers={"Content-Type": "text/plain"}
                        ) as r:
                            assert r.status == 200 and (await r.json())["seq"] == i + 1
                    else:
                        assert pub.publish("/md/x", f"n{i}")["seq"] == i + 1
                got_guble, got_sse = await asyncio.gather(_guble_seqs(ws, N), _sse_seqs(sse, N))
                got_native = [native.next_push()["seq"] for _ in range(N)]
            for got in (got_guble, got_sse, got_native):
                assert got == list(range(1, N + 1))
            sse.close()
            await ws.close()

    asyncio.run(main())
