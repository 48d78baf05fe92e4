"""``NodeMetrics`` on a node of several processes (``core/stats.py``): a scrape's figures are every
process's summed, each family as its processes count it, over a test notice relay."""

from __future__ import annotations

import asyncio
import functools

from hubbub.core.notices import GONE, Notices
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
    def refusals(i: int) -> dict[str, float]:
        return {label_key("max_frame", "native"): i}

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
            m.add("refusals", functools.partial(refusals, i))
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


def test_a_gone_processs_counters_stay_in_the_sums_and_its_counts_of_things_leave() -> None:
    """A worker killed and restarted takes its counters with it: the others keep them as last heard, so the
    node's counters never fall (Prometheus would read a reset); its connections leave the counts."""

    def conns(i: int) -> dict[str, float]:
        return {"": 7 if i == 2 else 0}

    async def main() -> None:
        procs, sent = mesh(3)
        deliver(procs, sent)
        ms = [_metrics({"native": n}, []) for n in (1, 10, 100)]
        for i, (m, p) in enumerate(zip(ms, procs, strict=True)):  # every process adds the same families
            m.share(p)
            m.add("conns", functools.partial(conns, i), gauge=True)

        async def scrape(i: int) -> dict[str, dict[str, float]]:
            asking = asyncio.get_running_loop().create_task(ms[i].ask_peers())
            await asyncio.sleep(0)
            deliver(procs, sent)
            await asking
            return ms[i].node_figures()

        f = await scrape(1)  # worker 1 hears worker 2 (and worker 2 hears worker 1, from the question)
        assert f["published"] == {"native": 111} and f["conns"] == {"": 7}
        ms[2].published["native"] = 150  # counted after it was last heard: lost with it
        for i in (0, 1):
            procs[i].received(GONE, b"2")
        procs[2] = Notices()  # its restart: a new process of id 2, counting from zero
        procs[2].connect(lambda topic, data: sent.append((2, topic, data)), "2", "inc2-again")
        ms[2] = _metrics({"native": 5}, [])
        ms[2].share(procs[2])
        ms[2].add("conns", lambda: {"": 0}, gauge=True)
        deliver(procs, sent)
        for i in (0, 2, 1):  # worker 0 heard worker 2 only through worker 1; the new worker 2 not at all
            f = await scrape(i)
            assert f["published"] == {"native": 1 + 10 + 100 + 5}, (i, f["published"])
            assert f.get("conns", {}).get("", 0) == 0
        # Worker 1 is gone too: worker 0 kept its last counters, and those of the first worker 2 it was told.
        procs[0].received(GONE, b"1")
        procs[2].received(GONE, b"1")
        for i in (0, 2):
            assert (await scrape(i))["published"] == {"native": 116}

    asyncio.run(main())
