"""CPU cost of the live fan-out alone: committed batches through ``LiveFanOut.fan_out_committed``.

Drives the node's real registry, router, ``FanOut`` and sessions with real encoders (native JSON frames and
native SSE events, so two encodings share each fan-out), in process, without a store, a writer thread or
sockets: only the work between "the commit returned" and "the frames are queued on every session" is timed
(process CPU time around each ``fan_out_committed`` call). Queues are emptied between batches, outside the
timing. Use it for before/after figures of fan-out changes; ``bench/core_path.py`` measures the whole
publish path, ``hubbub bench`` the end-to-end rates.

    PYTHONPATH=src python bench/fanout_path.py [--subs 100] [--events 200000] [--batch 100] [--repeat 5]

Scenarios (each session subscribes to ``/f/*``):

* ``single``: events alternate between ``/f/a`` and ``/f/b``, so no two consecutive events share a router
  result: every event fans out alone (the path of a lone publish, or of sparse tag subscriptions), each
  session encoding it through the rendering shared by its encoding.
* ``run``: every event on ``/f/a``: a batch is one run, encoded once per encoding and queued on every session
  as one shared entry.
* ``filtered``: as ``single``, each event carrying a ``:filter.user_id`` every session passes, so it takes
  the per-event path (``FanOut.fan_out``) that held subscriptions and filters use.

The figure is the best of ``--repeat`` runs, in µs of CPU per event (all its deliveries) and ns per delivery.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from typing import Any

from hubbub.channels import parse_pattern
from hubbub.core import Node, NodeSettings
from hubbub.core.session import Encoder, Session
from hubbub.dialects import native as nc
from hubbub.events import Event, Publisher
from hubbub.log import RetentionPolicy, open_store
from hubbub.log.appended import Committed
from hubbub.log.base import AppendResult
from hubbub.transports.http import SseEncoder
from hubbub.transports.native import NativeEncoder

SCENARIOS = ("single", "run", "filtered")


def events(scenario: str, n: int) -> list[Event]:
    pub = Publisher("native", "u", "app", "")
    headers = {":filter.user_id": "u"} if scenario == "filtered" else {}
    out = []
    for i in range(n):
        ch = "/f/a" if scenario == "run" or i % 2 == 0 else "/f/b"
        out.append(Event(ch, i + 1, "e", 1_000_000 + i, pub, b"x" * 16, "text/plain", headers))
    return out


async def run(scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    store = open_store("memory", "", "none", RetentionPolicy(), 120)
    async with Node(store, NodeSettings()) as node:
        encoders: list[Encoder] = [NativeEncoder(nc.NativeCodec("json")), SseEncoder()]
        sessions = []
        for i in range(args.subs):
            sess = Session("native", encoders[i % 2], max_items=1 << 20, max_bytes=1 << 30, user="u")
            node.attach(sess)
            sub = node._registry.add(sess, "s", parse_pattern("/f/*"), frozenset())
            node._registry.end_hold(sub)  # live at once: no replay to wait for
            sessions.append(sess)
        evs = events(scenario, args.batch)
        items: list[Any] = [(None, None, 0.0)] * args.batch
        results: list[Committed] = [AppendResult(ev) for ev in evs]
        fan_out = node._registry.live.fan_out_committed
        cpu = 0.0
        batches = max(1, args.events // args.batch)
        gc.collect()
        for _ in range(batches):
            c0 = time.process_time()
            fan_out(items, results)
            cpu += time.process_time() - c0
            for s in sessions:
                s._clear()  # the writer's part, not timed
        delivered = sum(s.stats.delivered for s in sessions)
        assert delivered == batches * args.batch * args.subs, (delivered, batches, args.subs)
        for s in sessions:
            node.detach(s)
    n = batches * args.batch
    return {
        "scenario": scenario,
        "subs": args.subs,
        "events": n,
        "cpu_us_per_event": round(1e6 * cpu / n, 3),
        "ns_per_delivery": round(1e9 * cpu / (n * args.subs), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subs", type=int, default=100, help="subscribed sessions (half JSON, half SSE)")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=100, help="events per committed batch")
    ap.add_argument("--repeat", type=int, default=5, help="runs; the figures are the best run's")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list of " + ", ".join(SCENARIOS))
    args = ap.parse_args()
    for scenario in args.scenarios.split(","):
        rows = [asyncio.run(run(scenario, args)) for _ in range(args.repeat)]
        best = min(rows, key=lambda r: r["cpu_us_per_event"])
        best["cpu_us_per_event_all"] = sorted(r["cpu_us_per_event"] for r in rows)
        print(json.dumps(best))


if __name__ == "__main__":
    main()
