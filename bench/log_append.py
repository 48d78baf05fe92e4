"""Append throughput of a log engine: --events requests in batches of --batch, round-robin over --channels.

PYTHONPATH=src python bench/log_append.py --channels 10 [--durability fsync|none] [--headers]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from hubbub.events import Publisher
from hubbub.log import AppendRequest, RetentionPolicy, open_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="sqlite")
    ap.add_argument("--durability", default="commit", choices=["fsync", "commit", "none"])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--channels", type=int, default=10)
    ap.add_argument("--headers", action="store_true")
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
    with tempfile.TemporaryDirectory() as d:
        st = open_store(a.store, d, a.durability, RetentionPolicy(), 600)
        t0 = time.perf_counter()
        for batch in batches:
            st.append(batch)
        dt = time.perf_counter() - t0
        n = st.stats().events
        st.close()
    print(f"{a.store}/{a.durability}: {n / dt:,.0f} events/s ({a.channels} channels)")


if __name__ == "__main__":
    main()
