"""Presence (core/presence.py): the local rosters of one node, and the Redis-backed ones of a cluster (a real
``redis-server`` the tests start): one node's members show on another's rosters, in join order; a node
that stops its heartbeat (as a killed one does) leaves them after the TTL; a node whose entries Redis lost
writes them again; while Redis is away a node answers with its own members."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

import pytest

from hubbub.cluster.presence import RedisPresence
from hubbub.core import LocalPresence
from tests.redisserver import RedisServer

pytestmark = pytest.mark.slow


async def _until(check: Callable[[], Awaitable[bool]], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)  # polling a condition Redis and the writers decide


def test_local_presence_keeps_join_order_and_counts() -> None:
    async def main() -> None:
        p = LocalPresence()
        p.join("r", "a", {"user": "1"})
        p.join("r", "b", {"user": "2"})
        p.join("r", "a", {"user": "3"})  # joining again: new fields, same place
        assert [(m.key, m.fields["user"]) for m in await p.members("r")] == [("a", "3"), ("b", "2")]
        p.leave("r", "a")
        p.leave("r", "zz")
        assert [m.key for m in await p.members("r")] == ["b"] and await p.count("r") == 1
        p.leave("r", "b")
        assert await p.members("r") == [] and p.rosters == {}
        p.add("c")
        p.add("c", 2)
        assert await p.total("c") == 3 and await p.total("other") == 0
        assert await p.nodes() == [] and await LocalPresence("n1").nodes() == ["n1"]

    asyncio.run(main())


def test_rosters_span_the_nodes_and_a_silent_node_expires(redis_server: RedisServer) -> None:
    async def main() -> None:
        one = RedisPresence(redis_server.url, "one", "t", ttl_s=1.5)
        two = RedisPresence(redis_server.url, "two", "t", ttl_s=30.0)
        await one.start()
        await two.start()
        try:
            assert one.up and two.up
            one.join("guble:/a", "c1", {"user_id": "u1"})
            two.join("guble:/a", "c2", {"user_id": "u2"})
            one.join("guble:/a", "c3", {"user_id": "u3"})
            one.join("guble:/b", "c1", {"user_id": "u1"})
            one.add("conns", 3)
            two.add("conns", 2)

            async def both_see_all() -> bool:
                return all([await p.count("guble:/a") == 3 for p in (one, two)])

            async def summed_to_5(p: RedisPresence) -> bool:
                return await _eq(p.total("conns"), 5)

            await _until(both_see_all, "both nodes to list the three members")
            assert await one.nodes() == ["one", "two"] == await two.nodes()
            for p in (one, two):
                ms = await p.members("guble:/a")
                assert [(m.key, m.node, m.fields["user_id"]) for m in ms] == [
                    ("c1", "one", "u1"),
                    ("c2", "two", "u2"),
                    ("c3", "one", "u3"),
                ]
                assert [m.key for m in await p.members("guble:/b")] == ["c1"]
                await _until(functools.partial(summed_to_5, p), "the counter's sum")
            one.leave("guble:/a", "c1")
            await _until(lambda: _eq(two.count("guble:/a"), 2), "a leave to reach the other node")

            # Node one goes silent, as a node killed -9 does: no heartbeat, nothing removed.
            assert one._task is not None
            one._task.cancel()
            t0 = time.monotonic()
            await _until(lambda: _eq(two.count("guble:/a"), 1), "node one's members to expire", within=30)
            assert time.monotonic() - t0 < 10
            assert [m.key for m in await two.members("guble:/a")] == ["c2"]
            assert await two.members("guble:/b") == []
            assert await two.total("conns") == 2
            assert await two.nodes() == ["two"]
        finally:
            await two.close()
            one._closed = True
            await one._redis.aclose()

    asyncio.run(main())


async def _eq(value: Awaitable[int], want: int) -> bool:
    return await value == want


def test_a_closed_node_leaves_at_once_and_lost_entries_are_written_again(redis_server: RedisServer) -> None:
    async def main() -> None:
        one = RedisPresence(redis_server.url, "one", "t", ttl_s=0.6)
        two = RedisPresence(redis_server.url, "two", "t", ttl_s=30.0)
        await one.start()
        await two.start()
        try:
            one.join("r", "k", {"x": "1"})
            await _until(lambda: _eq(two.count("r"), 1), "the member on the other node")
            # Redis loses everything (as a restart without persistence does): the heartbeat writes it back.
            await two._redis.flushall()
            await _until(lambda: _eq(two.count("r"), 1), "the member written again", within=30)
            assert one.resyncs >= 2
        finally:
            await one.close()
        # A node that closes removes its members at once (no TTL wait).
        assert await two.count("r") == 0
        await two.close()

    asyncio.run(main())


def test_redis_away_rosters_show_this_node_and_recover(redis_server: RedisServer) -> None:
    async def main() -> None:
        one = RedisPresence(redis_server.url, "one", "t", ttl_s=0.9)
        two = RedisPresence(redis_server.url, "two", "t", ttl_s=0.9)
        await one.start()
        await two.start()
        try:
            one.join("r", "a", {})
            two.join("r", "b", {})
            await _until(lambda: _eq(one.count("r"), 2), "both members")
            redis_server.kill()  # kill -9
            one.join("r", "a2", {})
            await _until(lambda: _up(one, False), "node one to notice Redis is away")
            assert [m.key for m in await one.members("r")] == ["a", "a2"]
            assert one.health() == {"state": "down"}
            redis_server.start()
            await _until(lambda: _eq(two.count("r"), 3), "every member back once Redis is", within=30)
            assert [m.key for m in await two.members("r")] == ["a", "b", "a2"]
            assert one.up and one.statistics()["members"] == 2
        finally:
            await one.close()
            await two.close()

    asyncio.run(main())


async def _up(p: RedisPresence, want: bool) -> bool:
    return p.up == want
