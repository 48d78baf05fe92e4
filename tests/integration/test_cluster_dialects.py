"""Three real nodes on one PostgreSQL and one Redis, with publishers and subscribers of several dialects
spread over them: a guble WebSocket on node A, Server-Sent Events on node B and the native protocol on node C
all see the events published through the native protocol on A and through HTTP on B, in per-channel seq
order, once."""

from __future__ import annotations

import asyncio
import contextlib
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


class _SseReader:
    """Reads an SSE stream in the background until its connection dies: the seqs and the last ``id:``."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp
        self.seqs: list[int] = []
        self.last_id: str | None = None
        self.changed = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            while line := await self.resp.content.readline():
                if line.startswith(b"id: "):
                    self.last_id = line[4:].decode().rstrip("\n")
                elif line.startswith(b"data: ") and b'"seq"' in line:
                    self.seqs.append(int(json.loads(line[6:])["seq"]))
                    self.changed.set()

    async def wait_for(self, n: int) -> None:
        async with asyncio.timeout(20):
            while len(self.seqs) < n:
                self.changed.clear()
                await self.changed.wait()

    async def until_closed(self) -> None:
        await asyncio.wait_for(self.task, 20)


def test_a_node_killed_mid_load_its_clients_of_several_dialects_recover_on_others(
    nodes: list[ServerProcess],
) -> None:
    """Node A, with an SSE stream and a native subscriber on it and a native publisher, is killed -9
    mid-load; publishing goes on through HTTP on node B. The SSE client reconnects to B with Last-Event-ID,
    the native one resubscribes on C from its position: each sees every event once, in seq order, no gap. A
    guble receiver on C, never disconnected, sees every event in order once."""
    a, b, c = nodes

    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_read=20)) as http:
            guble = await http.ws_connect(f"http://127.0.0.1:{c.ports['http']}/stream/user/g")
            await guble.send_str("+ /md")
            while not (await guble.receive(timeout=20)).data.decode().startswith("#subscribed-to /md"):
                pass
            sse = await http.get(f"http://127.0.0.1:{a.ports['http']}/api/v1/stream/md/**")
            assert sse.status == 200
            reader = _SseReader(sse)
            native = Lines(a.ports["native"])
            assert native.subscribe("s", "/md/**")["op"] == "reply"
            pub = Lines(a.ports["native"])

            def publish_on_a(n: int) -> list[int]:
                return [int(pub.publish("/md/x", f"n{i}")["seq"]) for i in range(n)]

            acked = await asyncio.to_thread(publish_on_a, N)
            await reader.wait_for(N // 2)  # the SSE client is under way when A dies
            # In flight at the kill: sent, maybe committed, never acknowledged.
            pub.send({"op": "publish", "id": 9999, "channel": "/md/x", "text": "maybe", "ack": True})
            a.kill()
            pub.close()
            publish_url = f"http://127.0.0.1:{b.ports['http']}/api/v1/publish/md/x"
            for i in range(N):
                async with http.post(publish_url, data=f"h{i}", headers={"Content-Type": "text/plain"}) as r:
                    assert r.status == 200
                    acked.append(int((await r.json())["seq"]))
            top = acked[-1]
            assert acked[:N] == list(range(1, N + 1)) and top in (2 * N, 2 * N + 1)

            # SSE: what node A sent before dying, then the rest from node B after Last-Event-ID.
            await reader.until_closed()
            before, last_id = reader.seqs, reader.last_id
            assert before == list(range(1, len(before) + 1)) and last_id is not None
            headers = {"Last-Event-ID": last_id}
            again = await http.get(f"http://127.0.0.1:{b.ports['http']}/api/v1/stream/md/**", headers=headers)
            assert again.status == 200
            after = await _sse_seqs(again, top - len(before))
            assert before + after == list(range(1, top + 1))
            again.close()

            # Native: the prefix from node A, then a resubscription on node C from its position.
            seen: list[dict[str, object]] = []
            with pytest.raises((ConnectionError, OSError)):
                while True:
                    seen.append(native.next_push())
            native.close()
            assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
            assert seen, "the native subscriber on A got events before A died"
            since = {"/md/x": {"seq": seen[-1]["seq"], "epoch": seen[-1]["epoch"]}}
            with Lines(c.ports["native"]) as resumed:
                assert resumed.subscribe("s", "/md/**", since=since)["op"] == "reply"
                rest = [resumed.next_push()["seq"] for _ in range(top - len(seen))]
                assert [e["seq"] for e in seen] + rest == list(range(1, top + 1))

            # guble on node C: everything, in order, once.
            assert await _guble_seqs(guble, top) == list(range(1, top + 1))
            await guble.close()

    asyncio.run(main())
