"""The suite's light-load latency (``--scenarios latency``) of two or more source trees, run alternately.

PYTHONPATH=src python bench/latency_trees.py --trees main=/work/main/src,branch=src [--kinds hubbub,hubbub-ws]
    [--rounds 4] [--samples 3000] [--payload 16] [--rate 1000]

Each round starts ``hubbub serve`` (memory store, durability none, bench/procs.py) from each tree in turn and
runs the latency scenario of bench/scenarios.py on each kind: one event every millisecond, timed by the
driver's raw sockets from ``sendall`` to its delivery. A busy shared machine moves every figure, so the trees
alternate (in turn first, round by round) and the medians over rounds are compared. ``--rate 1e6`` sends
each event as soon as the previous one arrived: the server's path with warm caches, steadier on a loaded
machine than the sleeps between events of the suite's rate, whose wake-ups the other processes delay.
Printed per run, then per tree and kind: p50, p99 and
p99.9 in µs, and the server's CPU per event: ``perf stat``'s task-clock when ``perf`` is on PATH (exact),
else ``/proc`` (in clock ticks), with the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import start
from scenarios import latency


def _task_clock_ms(path: str) -> float | None:
    for line in Path(path).read_text().splitlines():
        if "task-clock" in line:
            return float(line.split()[0].replace(",", ""))
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--trees", required=True, help="NAME=SRC,... (a src directory of a hubbub checkout)")
    ap.add_argument("--kinds", default="hubbub", help="comma list of hubbub, hubbub-ws, hubbub-json, ...")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--payload", type=int, default=16)
    ap.add_argument("--rate", type=float, default=1000.0, help="events per second (the suite's: 1000)")
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    kinds = args.kinds.split(",")
    perf = shutil.which("perf")
    rows: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
    for r in range(args.rounds):
        order = list(trees.items())
        for name, src in order if r % 2 == 0 else order[::-1]:
            for kind in kinds:
                srv = start("hubbub", src=os.path.abspath(src))
                stat = None
                try:
                    out = tempfile.mktemp(prefix="perfstat-")
                    if perf is not None:
                        cmd = [perf, "stat", "-e", "task-clock", "-p", str(srv.proc.pid), "-o", out]
                        stat = subprocess.Popen(cmd)
                        time.sleep(0.3)
                    res = latency(srv, srv.specs[kind], f"lt{r}{kind}".replace("-", ""), args.payload,
                                  args.samples, args.rate)  # fmt: skip
                    events = args.samples + 50  # the scenario's warm-up included
                    cpu_us = res.server_cpu_s / events * 1e6
                    if stat is not None:
                        stat.send_signal(2)
                        stat.wait(10)
                        ms = _task_clock_ms(out)
                        cpu_us = ms * 1e3 / events if ms is not None else cpu_us
                        os.unlink(out)
                finally:
                    srv.stop()
                x = res.extra
                rows.setdefault((name, kind), []).append((x["p50"], x["p99"], x["p99.9"], cpu_us))
                load = os.getloadavg()[0]
                print(
                    f"round {r} {name:>8} {kind:<14} p50 {x['p50']:6.0f} p99 {x['p99']:7.0f} "
                    f"p99.9 {x['p99.9']:7.0f} µs  server CPU {cpu_us:6.1f} µs/event  load {load:.1f}",
                    flush=True,
                )
    print("medians over rounds:")
    for (name, kind), v in rows.items():
        med = [statistics.median(c) for c in zip(*v, strict=True)]
        print(
            f"{name:>8} {kind:<14} p50 {med[0]:6.0f} p99 {med[1]:7.0f} p99.9 {med[2]:7.0f} µs  "
            f"server CPU {med[3]:6.1f} µs/event"
        )


if __name__ == "__main__":
    main()
