"""Two nodes in one process, each with its own Redis broker (a real Redis the test starts) on one shared
log: a replay's snapshot agrees with the node's live stream when the log holds events the node has not
delivered yet, so every subscriber gets each event once, in order."""

from __future__ import annotations

import asyncio
from typing import Any

from hubbub.channels import parse_pattern
from hubbub.cluster.broker import BrokerSettings, RedisBroker
from hubbub.cluster.view import ClusterView
from hubbub.core import Node, ReplaySpec, Session
from hubbub.events import Publisher
from hubbub.log import MemoryLogStore
from hubbub.log.base import AppendRequest, ChannelInfo, LogPage
from tests.redisserver import RedisServer

from .test_node import Enc


def _req(channel: str, text: str) -> AppendRequest:
    return AppendRequest(channel, Publisher("native"), text.encode(), "text/plain")


async def _frames(sess: Session, n: int) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    async with asyncio.timeout(10):
        while len(out) < n:
            out += [eval(f.decode()) for f in await sess.next_frames()]
    return out


def test_a_snapshot_waits_for_what_the_log_holds_and_nothing_comes_twice(redis_server: RedisServer) -> None:
    async def main() -> None:
        store = MemoryLogStore()
        nodes: list[Node] = []
        brokers: list[RedisBroker] = []
        for name in ("x", "y"):
            # A long gap wait: only the snapshot's catch-up can fill a gap within this test.
            b = RedisBroker(BrokerSettings(redis_server.url, name, gap_wait_s=30.0), store)
            node = Node(store, view=ClusterView(store, b))
            await node.__aenter__()
            await b.start(node)
            nodes.append(node)
            brokers.append(b)
        x, y = nodes
        try:
            live = Session("native", Enc(), max_items=1024, max_bytes=1 << 24)
            y.attach(live)
            await y.subscribe(live, "l", parse_pattern("/v"), on_snapshot=lambda p: None)
            for i in range(3):
                await x.publish(_req("/v", f"p{i}"))
            assert [f[1] for f in await _frames(live, 3)] == [1, 2, 3]
            # Commits node Y never hears of through Redis (a node killed after its commit, before publishing).
            store.append([_req("/v", "q3"), _req("/v", "q4")])
            new = Session("native", Enc(), max_items=1024, max_bytes=1 << 24)
            y.attach(new)
            plans: list[Any] = []
            await y.subscribe(
                new, "n", parse_pattern("/v"), selection=ReplaySpec(last=10), on_snapshot=plans.append
            )
            assert plans[0].position.seq == 5
            (q5,) = store.append([_req("/v", "q5")])  # once more, for a pattern's snapshot this time
            pat = Session("native", Enc(), max_items=1024, max_bytes=1 << 24)
            y.attach(pat)
            await y.subscribe(
                pat, "p", parse_pattern("/**"), selection=ReplaySpec(last=10), on_snapshot=plans.append
            )
            # A pattern's snapshot is the log's mark: it holds q5, which Redis never announced either, and
            # the replay up to it waits for this node to release each page's events (ClusterView.delivered).
            scan = plans[1].scan
            assert scan is not None and scan.mark.time_ns == q5.event.time_ns
            await x.publish(_req("/v", "p6"))
            assert [(f[1], f[3]) for f in await _frames(pat, 7)] == [(i, i < 7) for i in range(1, 8)]
            got = await _frames(new, 7)
            assert [(f[1], f[3]) for f in got] == [(i, i < 6) for i in range(1, 8)]
            assert [f[1] for f in await _frames(live, 4)] == [4, 5, 6, 7]
            await asyncio.sleep(0)
            assert new.queued == 0 and live.queued == 0 and pat.queued == 0  # nothing came twice
            assert brokers[1].sequencer.filled == 3
        finally:
            for b, node in zip(brokers, nodes, strict=True):
                await node.close()
                await b.close()

    asyncio.run(main())


def test_events_committed_and_never_published_reach_live_subscribers(redis_server: RedisServer) -> None:
    async def main() -> None:
        store = MemoryLogStore()
        b = RedisBroker(BrokerSettings(redis_server.url, "y", gap_wait_s=30.0, poll_interval_s=0.05), store)
        node = Node(store, view=ClusterView(store, b))
        await node.__aenter__()
        await b.start(node)
        try:
            live = Session("native", Enc(), max_items=1024, max_bytes=1 << 24)
            node.attach(live)
            await node.subscribe(live, "l", parse_pattern("/w/**"), on_snapshot=lambda p: None)
            # The last commits of another node that died before publishing them: no later event shows a gap.
            store.append([_req("/w/a", "a1"), _req("/w/b", "b1"), _req("/w/a", "a2")])
            got = await _frames(live, 3)  # found by the watch of the log's newest commit time
            assert sorted((f[0], f[1]) for f in got) == [("/w/a", 1), ("/w/a", 2), ("/w/b", 1)]
            assert [f[1] for f in got if f[0] == "/w/a"] == [1, 2]
            assert b.watch_syncs >= 1
        finally:
            await node.close()
            await b.close()

    asyncio.run(main())


class _CountingStore(MemoryLogStore):
    """Counts the channel heads read through :meth:`channels`."""

    heads_read = 0

    def channels(self, *args: Any, **kwargs: Any) -> list[ChannelInfo]:
        out = super().channels(*args, **kwargs)
        self.heads_read += len(out)
        return out


def test_a_catch_up_reads_the_channels_committed_to_since_the_last_not_every_head(
    redis_server: RedisServer,
) -> None:
    async def main() -> None:
        store = _CountingStore()
        store.append([_req(f"/idle/{i}", "x") for i in range(3000)])
        b = RedisBroker(BrokerSettings(redis_server.url, "y", gap_wait_s=30.0, poll_interval_s=0.05), store)
        node = Node(store, view=ClusterView(store, b))
        await node.__aenter__()
        await b.start(node)
        try:
            seeded = store.heads_read
            assert seeded == 3000  # the seed knows every channel's position once
            live = Session("native", Enc(), max_items=1024, max_bytes=1 << 24)
            node.attach(live)
            await node.subscribe(live, "l", parse_pattern("/w/**"), on_snapshot=lambda p: None)
            # Commits of a node that died before publishing them: the watch's catch-up finds them.
            store.append([_req("/w/a", "a1"), _req("/w/b", "b1"), _req("/w/a", "a2"), _req("/idle/7", "y")])
            got = await _frames(live, 3)
            assert [(f[0], f[1]) for f in got if f[0] == "/w/a"] == [("/w/a", 1), ("/w/a", 2)]
            assert [(f[0], f[1]) for f in got if f[0] == "/w/b"] == [("/w/b", 1)]
            assert b.watch_syncs >= 1
            assert b.sequencer.released("/idle/7") == (store.head("/idle/7").epoch, 2)
            # The catch-up read the four events committed since the seed, not the 3,000 heads again.
            assert store.heads_read == seeded
        finally:
            await node.close()
            await b.close()

    asyncio.run(main())


class _RowReadsStore(MemoryLogStore):
    """Counts the events read through :meth:`read_log` (what the default count and census build)."""

    log_events_read = 0

    def read_log(self, *args: Any, **kwargs: Any) -> LogPage:
        page = super().read_log(*args, **kwargs)
        self.log_events_read += len(page.events)
        return page

    def count_log(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return (-1, -1)  # the store's own count: the view must give it, not count the events itself

    def log_census(self, *args: Any, **kwargs: Any) -> dict[str, tuple[str, int, int]]:
        return {"/own": ("e", 1, 1)}


def test_the_views_count_and_census_are_the_stores_own_read_of_the_rows(redis_server: RedisServer) -> None:
    """A cluster node's census (a pattern's replay from a time) and count (a guble fetch) are of the log's
    rows as they are, like ``read_log``: the view gives the engine's grouped read, not one that builds every
    event of the range."""
    store = _RowReadsStore()
    store.append([_req(f"/c/{i % 7}", f"e{i}") for i in range(50)])
    view = ClusterView(store, RedisBroker(BrokerSettings(redis_server.url, "y"), store))
    mark = view.log_mark()
    assert view.count_log(0, mark, "/c/") == (-1, -1)
    assert view.count_log(0, mark, channel="/c/1", from_time=5) == (-1, -1)
    assert view.log_census(0, mark, "/c/", from_time=5) == {"/own": ("e", 1, 1)}
    assert store.log_events_read == 0
