"""Append throughput of a log engine: --events requests in batches of --batch, round-robin over --channels,
and the appending thread's CPU per event (steadier than the rate on a shared machine; the garbage collector
set up as a server process's, :func:`hubbub.server.tune_gc`).

PYTHONPATH=src python bench/log_append.py --channels 10 [--durability fsync|none] [--headers] [--repeat 5]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from hubbub.events import Publisher
from hubbub.log import AppendRequest, RetentionPolicy, open_store
from hubbub.server import tune_gc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="sqlite")
    ap.add_argument("--durability", default="commit", choices=["fsync", "commit", "none"])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--channels", type=int, default=10)
    ap.add_argument("--headers", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs; the figures are the best run's")
    a = ap.parse_args()
    pub = Publisher("native", "user", "app", "")
    hdr, tags = ({"x-trace": "abc123"}, ("t1", "t2")) if a.headers else ({}, ())
    batches = [
        [
            AppendRequest(
                f"/bench/c{(b * a.batch + i) % a.channels}", pub, b"x" * a.payload, "text/plain", hdr, tags
            )
            for i in range(a.batch)
        ]
        for b in range(a.events // a.batch)
    ]
    tune_gc()
    runs = []
    for _ in range(a.repeat):
        with tempfile.TemporaryDirectory() as d:
            st = open_store(a.store, d, a.durability, RetentionPolicy(), 600)
            t0, c0 = time.perf_counter(), time.thread_time()
            for batch in batches:
                st.append(batch)
            dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
            n = st.stats().events
            st.close()
        runs.append((n / dt, 1e6 * cpu / n))
    rate = max(r[0] for r in runs)
    cpus = sorted(r[1] for r in runs)
    print(
        f"{a.store}/{a.durability}: {rate:,.0f} events/s ({a.channels} channels), "
        f"{cpus[0]:.2f} µs of CPU per event (all: {', '.join(f'{c:.2f}' for c in cpus)})"
    )


if __name__ == "__main__":
    main()
