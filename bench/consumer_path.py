"""Durable consumer throughput inside one process: events published, journaled, delivered in batches and
acknowledged (each ack stored before the next batch), end to end through a Node and the ConsumerService.

PYTHONPATH=src python bench/consumer_path.py [--store sqlite|memory] [--batch 100] [--events 50000]
    [--openers 1] (--openers > 1: a shared work queue)

The publisher runs concurrently with the consumer; the figure is events acknowledged per second from the first
publish to the last ack. No network: the wire protocols add their own cost on top.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable

from hubbub.core import Batch, ConsumerService, Node, Opener
from hubbub.events import Publisher
from hubbub.log import AppendRequest, RetentionPolicy, open_store
from hubbub.log.consumers import ConsumerSpec


async def run(a: argparse.Namespace, data: str) -> float:
    store = open_store(a.store, data, a.durability, RetentionPolicy(), 600)
    async with Node(store) as node, ConsumerService(node) as svc:
        await svc.create(ConsumerSpec("bench", "/bench/**", shared=a.openers > 1, batch_wait_ms=a.wait_ms))
        done = asyncio.Event()
        acked = 0
        openers: list[Opener] = []

        tasks: set[asyncio.Task[None]] = set()

        def on_batch(k: int) -> Callable[[Batch], None]:
            def cb(b: Batch) -> None:
                async def ack() -> None:
                    nonlocal acked
                    await openers[k].ack(b.number)
                    acked += len(b.items)
                    if acked >= a.events:
                        done.set()

                task = asyncio.ensure_future(ack())
                tasks.add(task)
                task.add_done_callback(tasks.discard)

            return cb

        for k in range(a.openers):
            openers.append(await svc.open("bench", on_batch(k), batch_max=a.batch))
        pub = Publisher("native", "bench", "bench", "")
        t0 = time.perf_counter()
        for i in range(a.events):
            if not node.has_room:
                await node.writable()
            node.submit(AppendRequest(f"/bench/c{i % 10}", pub, b"x" * a.payload, "text/plain"))
            if i % 1000 == 999:
                await asyncio.sleep(0)
        await done.wait()
        return float(a.events / (time.perf_counter() - t0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="sqlite")
    ap.add_argument("--durability", default="commit", choices=["fsync", "commit", "none"])
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--openers", type=int, default=1)
    ap.add_argument("--wait-ms", type=int, default=0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        rate = asyncio.run(run(a, d))
    print(f"{a.store} batch={a.batch} openers={a.openers}: {rate:,.0f} events/s acknowledged")


if __name__ == "__main__":
    main()
