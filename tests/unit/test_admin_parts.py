"""The admin API's parts on their own: each channel's rate from two listings (``ChannelRates``) and the
bounded traffic history (``TrafficHistory``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hubbub.core import Node
from hubbub.events import Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, ChannelInfo, RetentionPolicy
from hubbub.transports.admin_api import ChannelRates
from hubbub.transports.admin_history import Sample, TrafficHistory, add_nearest


def test_channel_rates_come_from_two_listings() -> None:
    rates = ChannelRates(most=2)
    a = ChannelInfo("/a", "e1", 1, 10, 0)
    assert rates.rate(a, 100.0) is None  # first seen
    assert rates.rate(ChannelInfo("/a", "e1", 1, 30, 0), 104.0) == 5.0
    # Listed again too soon to tell: the rate told before, and the base kept.
    assert rates.rate(ChannelInfo("/a", "e1", 1, 31, 0), 104.5) == 5.0
    assert rates.rate(ChannelInfo("/a", "e1", 1, 30, 0), 106.0) == 0.0
    # Another epoch, or a listing too old: no rate.
    assert rates.rate(ChannelInfo("/a", "e2", 1, 3, 0), 108.0) is None
    assert rates.rate(ChannelInfo("/a", "e2", 1, 3, 0), 2000.0) is None
    # Bounded: the least recently listed channel is forgotten first.
    rates.rate(ChannelInfo("/b", "e", 1, 1, 0), 2001.0)
    rates.rate(ChannelInfo("/c", "e", 1, 1, 0), 2002.0)
    assert rates.rate(ChannelInfo("/a", "e2", 1, 9, 0), 2003.0) is None
    assert rates.rate(ChannelInfo("/c", "e", 1, 5, 0), 2004.0) == 2.0


def test_traffic_history_is_a_bounded_ring_of_rates(tmp_path: Path) -> None:
    async def main() -> None:
        store = open_store("memory", str(tmp_path), "none", RetentionPolicy(), 0)
        async with Node(store) as node:
            h = TrafficHistory(node, interval_s=3600, samples=3)
            async with h:
                for i in range(5):
                    await node.publish(AppendRequest("/x", Publisher("native"), b"%d" % i, "text/plain"))
                    assert h.sample() is not None
                assert len(h.samples) == 3
                assert all(s.events_in > 0 and s.events_out == 0 and s.connections == 0 for s in h.samples)
                assert h.totals() == (5, 0)

    asyncio.run(main())


def test_another_workers_samples_add_to_the_nearest_in_time() -> None:
    mine = [Sample(100.0, 1, 2, 3), Sample(102.0, 1, 2, 3), Sample(104.0, 1, 2, 3)]
    # Another worker's, at another phase: started after this one's first sample, with a gap.
    theirs = [Sample(101.2, 10, 20, 30), Sample(103.3, 100, 200, 300), Sample(109.0, 5, 5, 5)]
    assert add_nearest(mine, theirs, 2.0) == [
        Sample(100.0, 1, 2, 3),  # none of theirs within a second
        Sample(102.0, 11, 22, 33),
        Sample(104.0, 101, 202, 303),
    ]
    assert add_nearest(mine, [], 2.0) == mine
