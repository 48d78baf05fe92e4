"""Append throughput of a log engine: --events requests in batches of --batch, round-robin over --channels,
and the appending thread's CPU per event (steadier than the rate on a shared machine; the garbage collector
set up as a server process's, :func:`hubbub.server.tune_gc`).

PYTHONPATH=src python bench/log_append.py --channels 10 [--durability fsync|none] [--headers] [--repeat 5]

``--store postgres`` starts a throwaway PostgreSQL server (tests/pgserver.py), a new database per run, and
also reports the CPU per event of the store's writer backend (PostgreSQL's side of the appends).

``--runs``: each batch is one :class:`~hubbub.log.base.AppendRun` per channel (``--batch / --channels``
events each: connections' bursts, as core's batcher commits them), handed to the store as runs when it
``takes_runs``, else as their requests (``AppendRun.requests``, timed too: core's batcher makes them).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hubbub.events import Publisher
from hubbub.log import AppendRequest, AppendRun, RetentionPolicy, open_store
from hubbub.server import tune_gc

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _backend_pid(st: Any) -> int:
    """The PostgreSQL backend of the store's writer connection (0 for any other engine)."""
    conn = getattr(st, "_conn", None)
    return int(conn.info.backend_pid) if conn is not None else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="sqlite", help="sqlite, memory, postgres (a throwaway server), a URL")
    ap.add_argument("--durability", default="commit", choices=["fsync", "commit", "none"])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--channels", type=int, default=10)
    ap.add_argument("--headers", action="store_true")
    ap.add_argument("--runs", action="store_true", help="batches of runs (see above)")
    ap.add_argument("--repeat", type=int, default=1, help="runs; the figures are the best run's")
    a = ap.parse_args()
    pub = Publisher("native", "user", "app", "")
    hdr, tags = ({"x-trace": "abc123"}, ("t1", "t2")) if a.headers else ({}, ())
    payload = b"x" * a.payload
    batches: list[Sequence[AppendRequest | AppendRun]]
    if a.runs:
        per = a.batch // a.channels
        batches = [
            [AppendRun(f"/bench/c{c}", pub, "text/plain", [payload] * per) for c in range(a.channels)]
            for _ in range(a.events // (per * a.channels))
        ]
    else:
        batches = [
            [
                AppendRequest(
                    f"/bench/c{(b * a.batch + i) % a.channels}", pub, payload, "text/plain", hdr, tags
                )
                for i in range(a.batch)
            ]
            for b in range(a.events // a.batch)
        ]
    pg = None
    if a.store == "postgres":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from pgserver import PgServer  # type: ignore[import-not-found]

        pg = PgServer().start()
    tune_gc()
    runs = []
    try:
        for r in range(a.repeat):
            with tempfile.TemporaryDirectory() as d:
                where = pg.create_database(f"bench{r}") if pg is not None else a.store
                st = open_store(where, d, a.durability, RetentionPolicy(), 600)
                takes = st.takes_runs
                backend = _backend_pid(st)
                b0 = _cpu_s(backend) if backend else 0.0
                t0, c0 = time.perf_counter(), time.thread_time()
                for batch in batches:
                    if takes or not a.runs:
                        st.append(batch)  # type: ignore[arg-type]
                    else:
                        st.append([q for run in batch for q in run.requests()])  # type: ignore[union-attr]
                dt, cpu = time.perf_counter() - t0, time.thread_time() - c0
                db = _cpu_s(backend) - b0 if backend else 0.0
                n = st.stats().events
                st.close()
            runs.append((n / dt, 1e6 * cpu / n, 1e6 * db / n))
    finally:
        if pg is not None:
            pg.stop()
    rate = max(r[0] for r in runs)
    cpus = sorted(r[1] for r in runs)
    dbs = sorted(r[2] for r in runs)
    shape = f"runs of {a.batch // a.channels}" if a.runs else "requests"
    print(
        f"{a.store}/{a.durability} ({shape}, takes runs: {takes}): {rate:,.0f} events/s "
        f"({a.channels} channels), "
        f"{cpus[0]:.2f} µs of CPU per event (all: {', '.join(f'{c:.2f}' for c in cpus)})"
        + (f", database backend {dbs[0]:.2f} µs (all: {', '.join(f'{c:.2f}' for c in dbs)})" if pg else "")
    )


if __name__ == "__main__":
    main()
