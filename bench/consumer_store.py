"""The store's share of a durable consumer: what journaling adds to an append, and what an ack costs, measured
as the calling thread's CPU time (less disturbed by other load than rates).

PYTHONPATH=src python bench/consumer_store.py [--store sqlite|memory] [--durability commit] [--batch 100]
    [--events 60000] [--runs 3]

Each run opens a fresh store and appends ``--events`` events (100-byte payloads, one channel, one publisher)
in appends of ``--batch``; with a consumer of every event, each append is followed by the settle that
acknowledges its items (a batch acked in order). Prints µs of thread CPU per event: append without a
consumer, append with one (the difference is the journal's cost), and the settle. No event loop, no network.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from hubbub.events import Publisher
from hubbub.log import AppendRequest, RetentionPolicy, open_store
from hubbub.log.consumers import ConsumerSpec


def run(a: argparse.Namespace, consumer: bool) -> tuple[float, float]:
    pub = Publisher("native", "bench", "bench", "")
    with tempfile.TemporaryDirectory() as d:
        store = open_store(a.store, d, a.durability, RetentionPolicy(), 600)
        try:
            cid = store.consumer_create(ConsumerSpec("bench", "/bench/**"))[0].id if consumer else 0
            append = settle = 0.0
            pos = 0
            for _ in range(a.events // a.batch):
                reqs = [AppendRequest("/bench/a", pub, b"x" * 100, "text/plain") for _ in range(a.batch)]
                t = time.thread_time()
                store.append(reqs)
                append += time.thread_time() - t
                if consumer:
                    t = time.thread_time()
                    store.consumer_settle([(cid, list(range(pos + 1, pos + a.batch + 1)))])
                    settle += time.thread_time() - t
                    pos += a.batch
        finally:
            store.close()
    n = a.events // a.batch * a.batch
    return append / n * 1e6, settle / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="sqlite")
    ap.add_argument("--durability", default="commit", choices=["fsync", "commit", "none"])
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--events", type=int, default=60_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    plain: list[float] = []
    journaled: list[float] = []
    settles: list[float] = []
    for _ in range(a.runs):
        plain.append(run(a, False)[0])
        j, s = run(a, True)
        journaled.append(j)
        settles.append(s)

    def fmt(xs: list[float]) -> str:
        return " ".join(f"{x:.2f}" for x in xs)

    load = os.getloadavg()[0]
    print(f"# {a.store} {a.durability} batch={a.batch} load={load:.2f}; µs of thread CPU per event")
    print(f"append, no consumer:   {fmt(plain)}")
    print(f"append, one consumer:  {fmt(journaled)}")
    print(f"settle (ack of batch): {fmt(settles)}")


if __name__ == "__main__":
    main()
