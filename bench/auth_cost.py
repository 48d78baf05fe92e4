"""The cost of auth on the publish hot path: ``bench/core_path.py`` with ``auth.mode = off`` against the same
run with every connection authenticated by a JWT (``--auth jwt``; ``jwt-narrow`` also checks every
delivery), interleaved in one process so that drift on a shared machine hits both alike.

    PYTHONPATH=src python bench/auth_cost.py [--events 200000] [--rounds 7] [--store memory|sqlite] [--ack]
        [--subs N] [--modes off,jwt,jwt-narrow]

Prints one JSON object: per mode the best CPU time per event (µs, process time) over the rounds and all of
them, and each mode's overhead against ``off`` in percent (target: within 5 %).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core_path

from hubbub.server import tune_gc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--store", default="memory", choices=["memory", "sqlite"])
    ap.add_argument("--durability", default="none", choices=["fsync", "commit", "none"])
    ap.add_argument("--ack", action="store_true")
    ap.add_argument("--subs", type=int, default=1)
    ap.add_argument("--modes", default="off,jwt,jwt-narrow")
    args = ap.parse_args()
    args.default_gc = False
    tune_gc()
    modes = args.modes.split(",")
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            args.auth = m
            cpu[m].append(float(asyncio.run(core_path.run(args))["cpu_us_per_event"]))
    best = {m: min(v) for m, v in cpu.items()}
    out = {
        "events": args.events,
        "store": args.store,
        "ack": args.ack,
        "subs": args.subs,
        "cpu_us_per_event": best,
        "cpu_us_per_event_all": {m: sorted(v) for m, v in cpu.items()},
    }
    if "off" in best:
        out["overhead_pct"] = {
            m: round(100 * (b / best["off"] - 1), 1) for m, b in best.items() if m != "off"
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
