"""Rosters across real nodes (one PostgreSQL, one Redis, both started by the tests): guble's
``/api/subscribers`` on one node lists the receivers of every node, oldest first; the receivers of a node
killed with -9 leave the roster within ``cluster.presence_ttl_s``; those of a node stopped cleanly at once."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.redisserver import RedisServer

from .serverproc import ServerProcess
from .test_cluster import _healthz, _metric

pytestmark = pytest.mark.slow

TTL_S = 1.5


def _node(tmp: Path, name: str, pg_url: str, redis: RedisServer) -> ServerProcess:
    return ServerProcess(
        tmp / name,
        [
            "--store", pg_url, "--broker", redis.url, "--cluster-node-id", name,
            "--cluster-presence-ttl-s", str(TTL_S),
        ],
    ).start()  # fmt: skip


async def _guble(http: aiohttp.ClientSession, node: ServerProcess, user: str, channel: str) -> Any:
    ws = await http.ws_connect(f"http://127.0.0.1:{node.ports['http']}/stream/user/{user}")
    await ws.send_str(f"+ {channel}")
    while True:
        data = (await ws.receive(timeout=20)).data
        text = data.decode() if isinstance(data, bytes) else str(data)
        if text.startswith(f"#subscribed-to {channel}"):
            return ws


async def _roster(http: aiohttp.ClientSession, node: ServerProcess, channel: str) -> list[str]:
    async with http.get(f"http://127.0.0.1:{node.ports['http']}/api/subscribers{channel}") as r:
        assert r.status == 200
        return [m["user_id"] for m in json.loads(await r.read())]


async def _cluster(http: aiohttp.ClientSession, node: ServerProcess) -> list[str]:
    """The live nodes as ``node`` sees them (``GET /api/v1/cluster``)."""
    async with http.get(f"http://127.0.0.1:{node.ports['http']}/api/v1/cluster") as r:
        assert r.status == 200
        body = json.loads(await r.read())
        assert body["node_id"] == node.data_dir.name and body["broker"]["state"] == "up"
        nodes: list[str] = body["nodes"]
        return nodes


async def _until_roster(
    http: aiohttp.ClientSession, node: ServerProcess, channel: str, want: list[str], within: float = 20.0
) -> float:
    """Seconds until ``node`` lists ``want`` on ``channel``."""
    t0 = time.monotonic()
    while (got := await _roster(http, node, channel)) != want:
        assert time.monotonic() - t0 < within, f"roster of {channel}: {got}, want {want}"
        await asyncio.sleep(0.02)  # polling what the nodes decide
    return time.monotonic() - t0


def test_guble_subscribers_span_the_nodes_and_a_killed_node_leaves(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    a, b, c = (_node(tmp_path, n, pg_url, redis_server) for n in "abc")
    try:
        assert _healthz(b)["presence"] == {"state": "up"}

        async def main() -> None:
            async with aiohttp.ClientSession() as http:
                ws1 = await _guble(http, a, "u1", "/room")
                ws2 = await _guble(http, b, "u2", "/room")
                ws3 = await _guble(http, a, "u3", "/room")
                ws4 = await _guble(http, c, "u4", "/other")
                for n in (a, b, c):  # every node lists every node's receivers, oldest first
                    await _until_roster(http, n, "/room", ["u1", "u2", "u3"])
                    await _until_roster(http, n, "/other", ["u4"])
                # A receiver cancelled ("- /room") leaves the roster everywhere.
                await ws3.send_str("- /room")
                await _until_roster(http, b, "/room", ["u1", "u2"])
                assert _metric(a, "hubbub_presence_members") == 1  # node A's own: u1 on /room
                assert await _cluster(http, b) == ["a", "b", "c"]
                # Node A killed -9: its receivers leave node B's and C's rosters within the TTL.
                a.kill()
                waited = await _until_roster(http, c, "/room", ["u2"], within=TTL_S * 4 + 10)
                assert waited < TTL_S * 4 + 5
                await _until_roster(http, b, "/room", ["u2"])
                assert await _cluster(http, b) == ["b", "c"]
                # Node C stopped cleanly: its receiver leaves at once, no TTL.
                assert await asyncio.to_thread(c.terminate) == 0
                assert await _roster(http, b, "/other") == []
                assert await _cluster(http, b) == ["b"]
                for ws in (ws1, ws2, ws3, ws4):
                    await ws.close()

        asyncio.run(main())
    finally:
        for n in (a, b, c):
            n.kill()
