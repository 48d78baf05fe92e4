"""The suite's persistent publishing (``--scenarios persist``: SQLite, ``durability=commit``) of two or more
source trees, run alternately, a fresh server for every run.

PYTHONPATH=src python bench/persist_trees.py --trees before=/tmp/before/src,now=src [--mode e2e|ack]
    [--kind hubbub] [--rounds 6] [--payload 16] [--duration 4]

Each round starts ``hubbub serve --durability commit`` (bench/procs.py) from each tree in turn (the order
flips every round) and runs bench/scenarios.py ``throughput`` once: ``ack``, one publisher with a window of
4,000 unacknowledged publishes and no subscriber; ``e2e``, the same publisher and one subscriber, counted
at the subscriber. Printed per run, then per tree: events per second and the server's µs of CPU per event
(``/proc``, in clock ticks). A persistent run's rate depends on how its commits batch, which moves with
the machine's load as much as with the code: compare medians over rounds, and count the rounds each tree
wins, rather than trusting one pair (bench/publish_cpu.py measures the CPU of one long-lived server per
tree instead, steadier for a change that does not touch the batching).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios
from procs import start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--trees", required=True, help="name=src,name=src,... (each tree's src directory)")
    ap.add_argument("--mode", choices=("e2e", "ack"), default="e2e")
    ap.add_argument("--kind", default="hubbub", help="the client (bench/procs.py spec), e.g. hubbub-wsjson")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--payload", type=int, default=16)
    ap.add_argument("--duration", type=float, default=4.0)
    args = ap.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for rnd in range(args.rounds):
        order = list(trees.items())
        if rnd % 2:
            order.reverse()
        for name, src in order:
            srv = start("hubbub-commit", src=src)
            try:
                spec = srv.specs[args.kind]
                res = scenarios.throughput(
                    srv,
                    spec,
                    spec if args.mode == "e2e" else None,
                    f"pt{rnd}{name}",
                    args.payload,
                    2_000_000,
                    ack=True,
                    window=4000,
                    duration=args.duration,
                )
            finally:
                srv.stop()
            cpu = res.server_cpu_s / res.extra["count"] * 1e6
            results[name].append((res.value, cpu))
            line = f"{res.value:>11,.0f}/s  {cpu:5.2f} µs/event"
            print(f"round {rnd} {name:>8} {args.mode} {args.kind}: {line}")
    print("medians over rounds:")
    for name, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{name:>8} {args.mode} {args.kind}: {rate:>11,.0f}/s  {cpu:5.2f} µs/event")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
