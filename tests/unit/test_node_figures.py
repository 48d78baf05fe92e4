"""``NodeMetrics`` on a node of several processes (``core/stats.py``): a scrape's figures are every
process's summed, each family as its processes count it, over a test notice relay."""

from __future__ import annotations

import asyncio

from hubbub.core.stats import FIGURES_TOPIC, Histogram, NodeMetrics, label_key, labels_of
from hubbub.log.base import StoreStats

from .notice_mesh import deliver, mesh


def _metrics(published: dict[str, int], latencies: list[float]) -> NodeMetrics:
    ack = Histogram((0.001, 0.01))
    for v in latencies:
        ack.observe(v)

    async def log() -> StoreStats:
        return StoreStats(events=0, bytes=0, channels=0, retired_epochs=0)

    return NodeMetrics(published, {}, {}, ack, {}, dict, sessions=list, subscriptions=lambda: 2, log=log)


def test_a_scrape_sums_every_processs_figures() -> None:
    async def main() -> None:
        procs, sent = mesh(3)
        deliver(procs, sent)
        ms = [
            _metrics({"native": 3}, [0.0005]),
            _metrics({"native": 1, "mqtt": 4}, [0.005, 0.5]),
            _metrics({}, []),
        ]
        for i, (m, p) in enumerate(zip(ms, procs, strict=True)):
            m.share(p)
            m.count_bad_input("guble")
            m.add("refusals", lambda i=i: {label_key("max_frame", "native"): i})
        procs[2].answer(FIGURES_TOPIC, lambda _: b"\x93")  # an answer that is not figures: left out
        asking = asyncio.get_running_loop().create_task(ms[0].ask_peers())
        await asyncio.sleep(0)
        deliver(procs, sent)
        await asking
        f = ms[0].node_figures()
        assert f["published"] == {"native": 4, "mqtt": 4}
        assert f["bad_input"] == {"guble": 2} and f["subscriptions"] == {"": 4}
        assert f["ack_latency"] == {"0": 1, "1": 1, "2": 1, "sum": 0.5055, "count": 3}
        assert [(labels_of(k), v) for k, v in f["refusals"].items()] == [(["max_frame", "native"], 1)]
        # Process 1 alone, without asking again: its own figures and those heard last (none).
        assert ms[1].node_figures()["published"] == {"native": 1, "mqtt": 4}

    asyncio.run(main())
