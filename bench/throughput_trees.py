"""The suite's non-persistent 1→1 throughput (``--scenarios 1to1``) of two or more source trees, run
alternately.

PYTHONPATH=src python bench/throughput_trees.py --trees main=/work/main/src,branch=src
    [--kinds hubbub,hubbub-ws] [--rounds 3] [--runs 2] [--count 3000000] [--duration 5] [--payload 16]

Each round starts ``hubbub serve`` (memory store, durability none, bench/procs.py) from each tree in turn and
runs the throughput scenario of bench/scenarios.py ``--runs`` times on each kind: one publisher and one
subscriber connection, a window of 2,000 events, until ``--count`` events are delivered or ``--duration``
seconds pass. The server of this scenario is CPU-bound (one core), so its CPU per delivered event is the
figure to compare; the rate moves with whatever else the machine runs. A busy shared machine moves every
figure, so the trees alternate (in turn first, round by round) and the medians over rounds are compared.
Printed per run, then per tree and kind: deliveries per second and the server's µs of CPU per delivery
(``/proc``, in clock ticks), with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import start
from scenarios import throughput


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--trees", required=True, help="NAME=SRC,... (a src directory of a hubbub checkout)")
    ap.add_argument("--kinds", default="hubbub", help="comma list of hubbub, hubbub-ws, hubbub-json, ...")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=2, help="runs per server (the first warms it)")
    ap.add_argument("--count", type=int, default=3_000_000, help="most events per run")
    ap.add_argument("--duration", type=float, default=5.0, help="most seconds per run")
    ap.add_argument("--payload", type=int, default=16)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    kinds = args.kinds.split(",")
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        order = list(trees.items())
        for name, src in order if r % 2 == 0 else order[::-1]:
            for kind in kinds:
                srv = start("hubbub", src=os.path.abspath(src))
                try:
                    for i in range(args.runs):
                        spec = srv.specs[kind]
                        res = throughput(
                            srv, spec, spec, f"tt{r}{i}{kind}".replace("-", ""), args.payload, args.count,
                            duration=args.duration,
                        )  # fmt: skip
                        n = res.extra["count"]
                        cpu_us = res.server_cpu_s / n * 1e6 if n else float("nan")
                        rows.setdefault((name, kind), []).append((res.value, cpu_us))
                        print(
                            f"round {r} {name:>8} {kind:<14} {res.value:12,.0f}/s  server CPU {cpu_us:5.2f} "
                            f"µs/event  load {os.getloadavg()[0]:.1f}",
                            flush=True,
                        )
                finally:
                    srv.stop()
    print("medians over rounds:")
    for (name, kind), v in rows.items():
        rate, cpu = (statistics.median(c) for c in zip(*v, strict=True))
        print(f"{name:>8} {kind:<14} {rate:12,.0f}/s  server CPU {cpu:5.2f} µs/event")


if __name__ == "__main__":
    main()
