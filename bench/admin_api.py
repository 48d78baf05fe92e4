"""The dashboard's admin API at size: response times with 10,000 channels and 5,000 connections.

Starts a real ``hubbub serve`` (SQLite, ``commit``) on free loopback ports in a temporary directory, publishes
one event to each of ``--channels`` channels (native TCP, pipelined JSON lines), opens ``--connections``
native TCP connections (each says hello and subscribes to one channel), then times each admin route
``--rounds`` times, one request at a time, and prints the median, 95th percentile and largest time per route,
and the server's CPU time per request.

    python bench/admin_api.py --channels 10000 --connections 5000 --rounds 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.integration

from tests.integration.serverproc import ServerProcess

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


async def publish_channels(port: int, n: int) -> None:
    """One event on each of ``n`` channels, acknowledged, over one native TCP connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b'{"op":"hello","id":0,"v":1}\n')
    await reader.readline()
    window = 1000
    for start in range(0, n, window):
        lines = [
            b'{"op":"publish","id":%d,"channel":"/bench/%03d/c%05d","text":"x","ack":true}\n'
            % (i + 1, i % 100, i)
            for i in range(start, min(start + window, n))
        ]
        writer.write(b"".join(lines))
        await writer.drain()
        got = 0
        while got < len(lines):
            line = await reader.readline()
            if b'"reply"' in line:
                got += 1
            elif b'"error"' in line:
                raise RuntimeError(line.decode())
    writer.close()


async def open_connections(port: int, n: int, channels: int) -> list[asyncio.StreamWriter]:
    """``n`` native TCP connections, each subscribed to one channel (idle afterwards)."""
    out: list[asyncio.StreamWriter] = []

    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        c = i % channels
        writer.write(
            b'{"op":"hello","id":0,"v":1}\n{"op":"subscribe","id":1,"sub":"s","pattern":"/bench/%03d/c%05d"}\n'
            % (c % 100, c)
        )
        await reader.readline()
        await reader.readline()
        out.append(writer)

    for start in range(0, n, 250):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 250, n))))
    return out


async def time_routes(base: str, pid: int, rounds: int) -> list[tuple[str, list[float], float]]:
    routes = [
        ("overview", "/api/v1/admin/overview"),
        ("channels, first page (100)", "/api/v1/admin/channels?limit=100"),
        ("channels, a page mid-way", "/api/v1/admin/channels?limit=100&after=/bench/050/c05000"),
        ("channels, pattern /bench/042/**", "/api/v1/admin/channels?pattern=/bench/042/**&limit=100"),
        ("channels, search q=c0999 (scans)", "/api/v1/admin/channels?q=c0999&limit=100"),
        ("tree, level /bench (100 sub-trees)", "/api/v1/admin/channels/tree?prefix=/bench&limit=100"),
        ("tree, level /bench/042 (100 channels)", "/api/v1/admin/channels/tree?prefix=/bench/042&limit=100"),
        ("connections, first page (100)", "/api/v1/admin/connections?limit=100"),
        ("connections, a page mid-way", "/api/v1/admin/connections?limit=100&after=8"),
        ("connections, filtered q=127", "/api/v1/admin/connections?limit=100&q=127.0.0.1:6"),
        ("consumers", "/api/v1/admin/consumers"),
        ("cluster", "/api/v1/cluster"),
    ]
    out = []
    async with aiohttp.ClientSession() as http:
        for name, path in routes:
            times = []
            c0 = cpu_s(pid)
            for _ in range(rounds):
                t = time.perf_counter()
                async with http.get(base + path) as r:
                    await r.read()
                    assert r.status == 200, (path, r.status)
                times.append(time.perf_counter() - t)
            out.append((name, times, (cpu_s(pid) - c0) / rounds))
    return out


async def main(args: argparse.Namespace) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp) / "data").start()
        try:
            assert srv.proc is not None
            t = time.perf_counter()
            await publish_channels(srv.ports["native"], args.channels)
            print(f"published to {args.channels} channels in {time.perf_counter() - t:.1f} s")
            t = time.perf_counter()
            conns = await open_connections(srv.ports["native"], args.connections, args.channels)
            print(f"opened {len(conns)} connections in {time.perf_counter() - t:.1f} s")
            results = await time_routes(f"http://127.0.0.1:{srv.ports['http']}", srv.proc.pid, args.rounds)
            print(f"\n{'route':40} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'server CPU ms':>14}")
            for name, times, cpu in results:
                times.sort()
                p95 = times[max(int(len(times) * 0.95) - 1, 0)]
                print(
                    f"{name:40} {statistics.median(times) * 1e3:10.2f} {p95 * 1e3:8.2f} "
                    f"{times[-1] * 1e3:8.2f} {cpu * 1e3:14.2f}"
                )
            for w in conns:
                w.close()
        finally:
            srv.kill()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--channels", type=int, default=10_000)
    p.add_argument("--connections", type=int, default=5_000)
    p.add_argument("--rounds", type=int, default=50)
    asyncio.run(main(p.parse_args()))
