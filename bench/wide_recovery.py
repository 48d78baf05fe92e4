"""Catch-up of a wildcard subscriber far behind, and subscribing ``/**`` on a log of many channels.

A backlog is appended straight to a fresh SQLite log (``--channels`` channels with one event each, the
subscriber's positions, then ``--behind`` events round-robin over them); a server starts on it, and a Python
client over WebSocket subscribes ``/**`` with ``since`` those positions and reads every event, each checked
(channel, seq, payload, in commit order). Prints the time of a plain ``/**`` subscribe (no replay) and of one
with ``from_time`` now (nothing to replay) on that log, then the catch-up rate and the RSS growth during
the catch-up.

By default the server runs in this process (the RSS figure is then server and client together). With
``--server-process`` it is a ``hubbub serve`` child with the default limits, and the figure is the server's
own: its VmRSS sampled every 50 ms during the catch-up against its VmRSS just before it (the recovery's
memory must not grow with the events replayed: the bound is 64 MiB for 1,000,000).

    PYTHONPATH=src python bench/wide_recovery.py --channels 1000 --behind 200000
    PYTHONPATH=src python bench/wide_recovery.py --channels 100000 --behind 0      # subscribe latency only
    PYTHONPATH=src python bench/wide_recovery.py --behind 1000000 --server-process # the server's RSS growth
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from hubbub.client import AsyncClient
from hubbub.events import Event, Position, Publisher
from hubbub.log import DB_FILENAME, AppendRequest, SqliteLogStore
from hubbub.server import Server
from hubbub.server_config import load_config

ROOT = Path(__file__).resolve().parents[1]


def rss_mib(pid: int | str = "self", field: str = "VmRSS") -> float:
    """``field`` (VmRSS, or VmHWM: the peak) of process ``pid`` in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
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


@contextlib.asynccontextmanager
async def in_process(data: Path) -> AsyncIterator[tuple[str, int | str]]:
    """A server in this process: its WebSocket URL and the pid whose RSS is measured (this one)."""
    cfg = load_config(
        cli={"data_dir": str(data), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}, env={}
    )
    async with Server(cfg) as server:
        yield f"ws://127.0.0.1:{server.ports['http']}", "self"


def spawn(data: Path) -> subprocess.Popen[bytes]:
    """Start ``hubbub serve`` on ``data`` with the default limits, its output in ``data/server.log``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [
        sys.executable, "-m", "hubbub", "serve", "--data-dir", str(data), "--http-listen", "127.0.0.1:0",
        "--native-tcp-listen", "127.0.0.1:0", "--qpubs-qrpc-listen", "127.0.0.1:0",
        "--mist-tcp-listen", "127.0.0.1:0", "--mqtt-tcp-listen", "127.0.0.1:0", "--log-format", "json",
    ]  # fmt: skip
    with open(data / "server.log", "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def http_port(data: Path) -> int:
    """The HTTP port the server on ``data`` logged it listens on, or 0 when it has not yet."""
    for line in (data / "server.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if rec.get("message") == "listening" and rec.get("listener") == "http":
                return int(rec["address"].rsplit(":", 1)[1])
    return 0


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.asynccontextmanager
async def child_process(data: Path) -> AsyncIterator[tuple[str, int | str]]:
    """A ``hubbub serve`` child on ``data``: its WebSocket URL and pid."""
    proc = spawn(data)
    try:
        deadline = time.monotonic() + 60
        while not (port := http_port(data)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("hubbub serve did not start: see " + str(data / "server.log"))
            await asyncio.sleep(0.05)
        yield f"ws://127.0.0.1:{port}", proc.pid
    finally:
        stop(proc)


async def sample_peak(pid: int | str, peak: list[float]) -> None:
    """Keep ``peak[0]`` the highest VmRSS of ``pid`` seen, every 50 ms, until cancelled."""
    while True:
        peak[0] = max(peak[0], rss_mib(pid))
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="hubbub-wide-") as tmp:  # the backlog: 80 MB per 1,000,000 events
        await measure(args, Path(tmp))


async def measure(args: argparse.Namespace, data: Path) -> None:
    t0 = time.perf_counter()
    firsts, want = build(data, args.channels, args.behind)
    print(
        f"backlog: {args.channels} channels, {args.behind} events behind "
        f"({time.perf_counter() - t0:.1f} s to write)"
    )
    serve = child_process if args.server_process else in_process
    async with serve(data) as (url, pid), AsyncClient.connect(url) as client:
        for label, kw in (("plain", {}), ("from_time now", {"from_time": time.time_ns()})):
            t = time.perf_counter()
            async with client.subscribe("/**", **kw):  # type: ignore[arg-type]
                pass
            print(
                f"subscribe /** ({label}) on {args.channels} channels: "
                f"{(time.perf_counter() - t) * 1000:.1f} ms"
            )
        if not args.behind:
            return
        since = {e.channel: Position(e.seq, e.epoch) for e in firsts}
        rss0 = rss_mib(pid)
        peak = [rss0]
        sampler = asyncio.create_task(sample_peak(pid, peak))
        t = time.perf_counter()
        try:
            async with client.subscribe("/**", since=since) as sub:
                for i, (ch, seq, payload) in enumerate(want):
                    ev = await sub.get(60)
                    assert isinstance(ev, Event), ev
                    assert (ev.channel, ev.seq, ev.payload) == (ch, seq, payload), (i, ev)
        finally:
            sampler.cancel()
        dt = time.perf_counter() - t
        whose = "server's" if args.server_process else "process (server and client)"
        print(
            f"catch-up /** {args.behind} events over {args.channels} channels: {dt:.2f} s, "
            f"{args.behind / dt:,.0f} events/s, every event checked; {whose} RSS "
            f"{rss0:.0f} -> peak {peak[0]:.0f} MiB (+{peak[0] - rss0:.0f}), "
            f"VmHWM {rss_mib(pid, 'VmHWM'):.0f} MiB"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--channels", type=int, default=1000)
    p.add_argument("--behind", type=int, default=100_000)
    p.add_argument(
        "--server-process", action="store_true", help="run the server as a child process and measure its RSS"
    )
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
