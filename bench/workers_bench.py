"""A node on 1 and on N worker processes (``hubbub serve --workers N``): throughput of fan-out and of
persistent publishes, and the server's CPU per event (the parent and every worker together).

    hubbub bench --workers 1,2 [--quick]
    PYTHONPATH=src python bench/workers_bench.py --workers 1,2      # the same

Every run: a fresh SQLite node (durability ``commit``), native TCP msgpack clients from the suite's load
driver (``scenarios.throughput``); connections land on the workers as the kernel spreads them
(``SO_REUSEPORT``). Scenarios:

* ``fanout``: one publisher, ``--subs`` subscribers of one channel: deliveries/s;
* ``persist-ack``: ``--pubs`` publishers, each with 4,000 acknowledged publishes in flight: acks/s;
* ``persist-e2e``: one acknowledged publisher and one subscriber: deliveries/s.

On a shared machine the rates depend on what else runs: the table gives the load average before each run
and the server's CPU per event, which depends less on it.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(HERE.parent / "src") not in sys.path:
    sys.path.insert(0, str(HERE.parent / "src"))

from procs import raise_nofile, start  # noqa: E402
from scenarios import Result, throughput  # noqa: E402

__all__ = ["main", "run"]


def run(
    workers: list[int], *, subs: int, pubs: int, count: int, duration: float, size: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in workers:
        run_for = partial(throughput, count=count, duration=duration)
        plan = [
            ("fanout", partial(run_for, subs=subs, window=500)),
            ("persist-ack", partial(run_for, pubs=pubs, subs=0, ack=True, window=4000)),
            ("persist-e2e", partial(run_for, ack=True, window=4000)),
        ]
        for name, fn in plan:
            with start("hubbub-commit", workers=n) as srv:
                spec = srv.specs["hubbub"]
                load = os.getloadavg()[0]
                sub_spec = None if name == "persist-ack" else spec
                r: Result = fn(srv, spec, sub_spec, f"w{name[0]}{size}", size)
            events = r.extra.get("count", 0.0)
            # Per event published: fan-out delivers each to every subscriber.
            published = events / subs if name == "fanout" else events
            rows.append(
                {
                    "workers": n,
                    "scenario": name,
                    "rate": r.value,
                    "unit": r.unit,
                    "server_cpu_s": r.server_cpu_s,
                    "driver_cpu_s": r.driver_cpu_s,
                    "elapsed_s": r.elapsed_s,
                    "cpu_us_per_event": 1e6 * r.server_cpu_s / published if published else 0.0,
                    "cpu_us_per_delivery": 1e6 * r.server_cpu_s / events if events else 0.0,
                    "load": load,
                    "note": r.note,
                }
            )
            print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    return (
        f"| {row['workers']} | {row['scenario']} | {row['rate']:,.0f} {row['unit']} "
        f"| {row['server_cpu_s']:.2f} "
        f"| {row['cpu_us_per_event']:.1f} | {row['cpu_us_per_delivery']:.1f} | {row['driver_cpu_s']:.2f} "
        f"| {row['elapsed_s']:.1f} | {row['load']:.1f} | {row['note']} |"
    )


HEADER = (
    "| workers | scenario | rate | server CPU s | server µs / event published | server µs / delivery "
    "| driver CPU s | s | load (1 min) | note |\n|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2", help="comma list of worker counts (default 1,2)")
    ap.add_argument("--subs", type=int, default=20, help="fan-out subscribers (default 20)")
    ap.add_argument("--pubs", type=int, default=4, help="persistent publishers (default 4)")
    ap.add_argument("--size", type=int, default=16, help="payload bytes (default 16)")
    ap.add_argument("--quick", action="store_true", help="small counts, 1.5 s windows")
    args = ap.parse_args(argv)
    raise_nofile()
    workers = [int(w) for w in args.workers.split(",") if w]
    count, duration = (20_000, 1.5) if args.quick else (400_000, 5.0)
    print(HEADER, flush=True)
    run(workers, subs=args.subs, pubs=args.pubs, count=count, duration=duration, size=args.size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
