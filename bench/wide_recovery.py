"""Catch-up of a wildcard subscriber far behind, and subscribing ``/**`` on a log of many channels.

A backlog is appended straight to a fresh SQLite log (``--channels`` channels with one event each, the
subscriber's positions, then ``--behind`` events round-robin over them); a server starts on it, and a Python
client over WebSocket subscribes ``/**`` with ``since`` those positions and reads every event, each checked
(channel, seq, payload, in commit order). Prints the catch-up rate and the server's RSS growth, then the time
of a plain ``/**`` subscribe (no replay) and of one with ``from_time`` now (nothing to replay) on that log.

    PYTHONPATH=src python bench/wide_recovery.py --channels 1000 --behind 200000
    PYTHONPATH=src python bench/wide_recovery.py --channels 100000 --behind 0      # subscribe latency only
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

from hubbub.client import AsyncClient
from hubbub.config import load_config
from hubbub.events import Event, Position, Publisher
from hubbub.log import DB_FILENAME, AppendRequest, SqliteLogStore
from hubbub.server import Server


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def build(data: Path, channels: int, behind: int) -> tuple[list[Event], list[tuple[str, int, bytes]]]:
    store = SqliteLogStore(data / DB_FILENAME)
    pub = Publisher("native", "", "bench", "")
    firsts: list[Event] = []
    want: list[tuple[str, int, bytes]] = []
    try:
        for s in range(0, channels, 10000):
            reqs = [
                AppendRequest(f"/b/c{i:06d}", pub, b"0", "text/plain")
                for i in range(s, min(s + 10000, channels))
            ]
            firsts += [r.event for r in store.append(reqs)]
        for s in range(0, behind, 10000):
            n = min(10000, behind - s)
            reqs = [
                AppendRequest(f"/b/c{i % channels:06d}", pub, str(i).encode(), "text/plain")
                for i in range(s, s + n)
            ]
            want += [(r.event.channel, r.event.seq, r.event.payload) for r in store.append(reqs)]
    finally:
        store.close()
    return firsts, want


async def run(args: argparse.Namespace) -> None:
    data = Path(tempfile.mkdtemp(prefix="hubbub-wide-"))
    t0 = time.perf_counter()
    firsts, want = build(data, args.channels, args.behind)
    print(
        f"backlog: {args.channels} channels, {args.behind} events behind "
        f"({time.perf_counter() - t0:.1f} s to write)"
    )
    cfg = load_config(
        cli={"data_dir": str(data), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}, env={}
    )
    async with Server(cfg) as server:
        url = f"ws://127.0.0.1:{server.ports['http']}"
        async with AsyncClient.connect(url) as client:
            for label, kw in (("plain", {}), ("from_time now", {"from_time": time.time_ns()})):
                t = time.perf_counter()
                async with client.subscribe("/**", **kw):  # type: ignore[arg-type]
                    pass
                print(
                    f"subscribe /** ({label}) on {args.channels} channels: "
                    f"{(time.perf_counter() - t) * 1000:.1f} ms"
                )
            if args.behind:
                since = {e.channel: Position(e.seq, e.epoch) for e in firsts}
                rss0 = peak = rss_mib()
                t = time.perf_counter()
                async with client.subscribe("/**", since=since) as sub:
                    for i, (ch, seq, payload) in enumerate(want):
                        ev = await sub.get(60)
                        assert isinstance(ev, Event), ev
                        assert (ev.channel, ev.seq, ev.payload) == (ch, seq, payload), (i, ev)
                        if i % 10000 == 0:
                            peak = max(peak, rss_mib())
                dt = time.perf_counter() - t
                print(
                    f"catch-up /** {args.behind} events over {args.channels} channels: {dt:.2f} s, "
                    f"{args.behind / dt:,.0f} events/s, every event checked; process RSS (server and client) "
                    f"{rss0:.0f} -> peak {peak:.0f} MiB (+{peak - rss0:.0f})"
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--channels", type=int, default=1000)
    p.add_argument("--behind", type=int, default=100_000)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
