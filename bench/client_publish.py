"""Client-side publish throughput of hubbub's Python clients: the cost of the client library per publish.

Starts a real ``hubbub serve`` (memory-free defaults, SQLite without fsync) on free loopback ports in a
temporary directory, then drives it from this process with:

* ``bulk-tcp`` / ``bulk-ws``: :class:`~hubbub.client.bulk.BulkPublisher` (pipelined acknowledged publishes,
  msgpack), ``--count`` publishes of ``--size`` bytes, window 1024, then ``flush``;
* ``async-tcp`` / ``async-ws``: :class:`~hubbub.client.AsyncClient`, ``--tasks`` concurrent tasks each
  awaiting acknowledged publishes, ``--count`` / 5 publishes in all (each waits for its reply).

For each: publishes per second (wall) and this process's CPU per publish (µs), the client's own cost. The
machine may be loaded: compare two trees in alternated runs, e.g.::

    for i in 1 2 3; do for t in OLD NEW; do PYTHONPATH=$t/src python bench/client_publish.py; done; done
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.integration

from tests.integration.serverproc import ServerProcess

from hubbub.client import AsyncClient
from hubbub.client.bulk import BulkPublisher


def _bulk(url: str, count: int, payload: bytes) -> tuple[float, float]:
    with BulkPublisher(url, window=1024, keep_acks=False) as pub:
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(count):
            pub.publish("/bench/bulk", payload, idem=f"k{i}")
        pub.flush()
        return time.perf_counter() - t0, time.process_time() - c0


async def _async(url: str, count: int, tasks: int, payload: bytes) -> tuple[float, float]:
    async with AsyncClient.connect(url) as client:
        per = count // tasks

        async def run(n: int) -> None:
            for _ in range(n):
                await client.publish("/bench/async", payload)

        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(run(per) for _ in range(tasks)))
        return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=64)
    args = ap.parse_args()
    payload = b"x" * args.size
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp) / "data", ["--durability", "none"]).start()
        try:
            tcp = f"tcp://127.0.0.1:{srv.ports['native']}"
            ws = f"ws://127.0.0.1:{srv.ports['http']}"
            n, m = args.count, args.count // 5
            rows = [
                ("bulk-tcp", n, _bulk(tcp, n, payload)),
                ("bulk-ws", n, _bulk(ws, n, payload)),
                ("async-tcp", m, asyncio.run(_async(tcp, m, args.tasks, payload))),
                ("async-ws", m, asyncio.run(_async(ws, m, args.tasks, payload))),
            ]
        finally:
            srv.terminate()
    for name, n, (wall, cpu) in rows:
        print(f"{name:10} {n / wall:>10,.0f} pub/s   client CPU {cpu / n * 1e6:6.1f} µs/pub")


if __name__ == "__main__":
    main()
