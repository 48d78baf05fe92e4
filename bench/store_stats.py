"""How long ``LogStore.stats()`` (what ``/metrics`` and the admin overview show as the log's events, bytes and
channels) takes with ``--events`` events on ``--channels`` channels, SQLite or PostgreSQL (a temporary server,
tests/pgserver.py), and how long the event loop is held by one ``/metrics``-style read of it: called on the
loop (``--on-loop``) or on a reader thread (what the node does).

    PYTHONPATH=src python bench/store_stats.py --store sqlite --events 1000000 --channels 10000
    PYTHONPATH=src python bench/store_stats.py --store postgres --events 1000000 --channels 10000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hubbub.events import Publisher
from hubbub.log import AppendRequest, LogStore, RetentionPolicy, open_store


def fill(st: LogStore, events: int, channels: int, batch: int = 5000) -> None:
    pub = Publisher("native", "user", "app", "")
    for start in range(0, events, batch):
        st.append(
            [
                AppendRequest(f"/bench/c{i % channels:05d}", pub, b"x" * 20, "text/plain")
                for i in range(start, min(start + batch, events))
            ]
        )


async def ticker(gaps: list[float], stop: asyncio.Event) -> None:
    """Ticks every 0.1 ms until ``stop``, appending the time between ticks to ``gaps``."""
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.0001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def loop_hold(st: LogStore, on_loop: bool | None, rounds: int) -> list[float]:
    """The longest gap between ticks of a 0.1 ms ticker while each stats read runs, per round (ms);
    ``on_loop=None``: no read (the ticker's own noise on this machine)."""
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(rounds):
        gaps: list[float] = []
        stop = asyncio.Event()
        t = asyncio.create_task(ticker(gaps, stop))
        await asyncio.sleep(0.002)
        if on_loop:
            st.stats()
        elif on_loop is False:
            await loop.run_in_executor(None, st.stats)
        await asyncio.sleep(0.002)
        stop.set()
        await t
        out.append(max(gaps) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="sqlite", choices=["sqlite", "postgres"])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--channels", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=50)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        pg = None
        url = "sqlite"
        if a.store == "postgres":
            from pgserver import PgServer  # type: ignore[import-not-found]

            pg = PgServer().start()
            url = pg.url()
        try:
            st = open_store(url, d, "commit", RetentionPolicy(), 600)
            t0 = time.perf_counter()
            fill(st, a.events, a.channels)
            took = time.perf_counter() - t0
            print(f"filled {a.events:,} events on {a.channels:,} channels in {took:.1f} s")
            times = []
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                s = st.stats()
                times.append((time.perf_counter() - t0) * 1000)
            assert s.events == a.events and s.channels == a.channels, s
            times.sort()
            print(
                f"{a.store}: stats() median {statistics.median(times):.2f} ms, "
                f"p95 {times[int(len(times) * 0.95)]:.2f} ms, max {times[-1]:.2f} ms"
            )
            for on_loop in (None, True, False):
                holds = sorted(asyncio.run(loop_hold(st, on_loop, a.rounds)))
                where = {None: "not at all", True: "on the loop", False: "on a thread"}[on_loop]
                print(
                    f"  loop held while stats() runs {where}: median {statistics.median(holds):.2f} ms, "
                    f"max {holds[-1]:.2f} ms"
                )
            st.close()
        finally:
            if pg is not None:
                pg.stop()


if __name__ == "__main__":
    main()
