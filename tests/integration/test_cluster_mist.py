"""Mist ``who`` and ``listall`` across real nodes (one PostgreSQL, one Redis, both started by the tests): a
1.x client on node A counts and lists the subscriptions of mist clients on node B (the presence counter
``mist.connections`` and roster ``mist.subscribers``); an unsubscribe, a close, or node B killed with -9 takes
them out again (the last within ``cluster.presence_ttl_s``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.redisserver import RedisServer

from .mist_clients import Client1x
from .test_cluster_presence import TTL_S, _node

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"


async def _ask(c: Client1x, command: str) -> str:
    await c.send(command=command)
    reply: dict[str, Any] | None = await c.recv()
    assert reply is not None and reply["command"] == command, reply
    data: str = reply.get("data", "")  # an empty answer has no "data"
    return data


def _who(lifetime: int, subscribers: int) -> str:
    return f"Lifetime  connections: {lifetime}\nSubscribers connected: {subscribers}"


async def _until(c: Client1x, command: str, want: str, within: float = 20.0) -> float:
    """Seconds until ``command`` on ``c`` answers ``want`` (presence is written in the background)."""
    t0 = time.monotonic()
    while (got := await _ask(c, command)) != want:
        assert time.monotonic() - t0 < within, f"{command}: {got!r}, want {want!r}"
        await asyncio.sleep(0.02)  # polling what the nodes decide
    return time.monotonic() - t0


def test_mist_who_and_listall_count_every_nodes_subscribers(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    a, b = (_node(tmp_path, n, pg_url, redis_server) for n in "ab")
    try:

        async def main() -> None:
            x = await Client1x.connect(HOST, a.ports["mist"])
            # Node A alone: one connection (x), no subscriber.
            assert await _ask(x, "who") == _who(1, 0)
            assert await _ask(x, "listall") == ""
            s1 = await Client1x.connect(HOST, b.ports["mist"])
            s2 = await Client1x.connect(HOST, b.ports["mist"])
            await s1.send(command="subscribe", tags=["t2", "t1"])
            await s1.send(command="subscribe", tags=["t3"])
            await s2.send(command="subscribe", tags=["t1", "t9"])
            await x.send(command="subscribe", tags=["mine"])
            # Node B's subscribers show on node A, with node A's own.
            await _until(x, "listall", "mine t1 t2 t3 t9")
            await _until(x, "who", _who(3, 3))
            await _until(s1, "listall", "mine t1 t2 t3 t9")  # and the other way round
            # An unsubscribe takes its tags out; the last one takes the connection out of the count.
            await s1.send(command="unsubscribe", tags=["t3"])
            await _until(x, "listall", "mine t1 t2 t9")
            await s2.send(command="unsubscribe", tags=["t9", "t1"])
            await _until(x, "listall", "mine t1 t2")
            await _until(x, "who", _who(3, 2))
            # A close leaves at once.
            await s2.close()
            await s1.send(command="subscribe", tags=["t4"])
            await _until(x, "listall", "mine t1 t2 t4")
            # Node B killed -9: its subscriber and its connections leave within the TTL.
            b.kill()
            waited = await _until(x, "listall", "mine", within=TTL_S * 4 + 10)
            assert waited < TTL_S * 4 + 5
            await _until(x, "who", _who(1, 1))
            await s1.close()
            await x.close()

        asyncio.run(main())
    finally:
        for n in (a, b):
            n.kill()
