"""What the consumer service's loop spends per item it holds, in process, without a store or network: taking
journal notifications (``Delivery.committed``: an item, a map entry and a pending position each) and cutting
batches from the pending items (``ConsumerState.take_ready``), for one consumer that holds every item of a
backlog until it is cut.

PYTHONPATH=src python bench/consumer_held.py [--items 60000] [--commit 500] [--batch 100] [--reps 7]

The figure is the best of ``--reps`` runs, in µs per item.
"""

from __future__ import annotations

import argparse
import time
import types
from typing import Any

from hubbub.core.consumer_delivery import Delivery
from hubbub.core.consumer_state import ConsumerState
from hubbub.events import Event, Publisher
from hubbub.log.appended import Committed
from hubbub.log.base import AppendResult
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=60_000)
    ap.add_argument("--commit", type=int, default=500, help="events per commit notification")
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    node: Any = types.SimpleNamespace(_store=types.SimpleNamespace(shared=False), relay=None)
    groups: Any = types.SimpleNamespace(index={})
    pub = Publisher("native", "bench", "", "")
    n = a.items
    results: list[Committed] = [
        AppendResult(Event("/bench/a", i, "e", 0, pub, b"x" * 100, "", {}, ()), False, ((1, i + 1),))
        for i in range(n)
    ]
    notify: list[float] = []
    cut: list[float] = []
    for _ in range(a.reps):
        by_id: dict[int, ConsumerState] = {}
        d = Delivery(node, by_id, groups, node, lambda coro, name: None, lambda o, r: None, 10**9, 1 << 40)
        d.schedule = lambda c: None  # type: ignore[method-assign]  # no loop: the batches are cut below
        c = by_id[1] = ConsumerState(ConsumerInfo(1, ConsumerSpec("bench", "/bench/**"), 0))
        c.backlog = False
        t = time.perf_counter()
        for k in range(0, n, a.commit):
            d.committed(results[k : k + a.commit])
        notify.append(time.perf_counter() - t)
        t = time.perf_counter()
        while c.ready_count:
            c.take_ready(a.batch, 1 << 30)
        cut.append(time.perf_counter() - t)
    per_notify, per_cut = min(notify) / n * 1e6, min(cut) / n * 1e6
    print(f"notify {per_notify:.3f} µs/item, cut batches of {a.batch} {per_cut:.3f} µs/item")


if __name__ == "__main__":
    main()
