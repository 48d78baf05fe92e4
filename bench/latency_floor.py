"""The floor under hubbub's light-load latency on this machine: a bare uvloop forwarder, timed as the suite's
``latency`` scenario times hubbub.

PYTHONPATH=src python bench/latency_floor.py [--modes protocol,streams,spin] [--rounds 2] [--samples 3000]
    [--rate 1000] [--spin 1500]

A server process (this script with ``--serve MODE``) accepts two connections and writes whatever the first
sends to the second: ``protocol`` from ``data_received`` (an ``asyncio.Protocol``, no task), as hubbub's
stream transports read now (transports/stream_reads.py), ``streams`` from a task reading an
``asyncio.StreamReader`` and writing with ``StreamWriter.writelines``, as they read before (bench/procs.py's
server is replaced by it, nothing else), ``spin`` as ``protocol`` after a fixed step of pure arithmetic per
event (``--spin`` additions in a Python loop: a path of a chosen length that touches next to no memory).
The driver sends 16 bytes every 1/``rate`` s and times each from ``sendall`` to its arrival on the other
connection, as bench/scenarios.py ``latency`` does. Printed per run: p50 and p99 in µs and the server's CPU
per event (``perf stat``'s task-clock when ``perf`` is on PATH, else ``/proc`` in clock ticks), with the
load average.

What it tells: the share of hubbub's light-load figures (bench/latency_trees.py) that any uvloop server of
one read and one write per event pays on this machine (the wake-ups, the loopback write that wakes the
reader, a task's step for ``streams``), against the share that is hubbub's own code path. On a busy
shared virtual machine a wake-up after a millisecond idle costs tens of µs of CPU, and code runs several
times slower than in a tight loop, its caches cold; the figures move with the load, so compare them with a
hubbub run made at the same time.

``spin`` is the control for what sets the light-load tail: set ``--spin`` so that its back-to-back CPU per
event (``--rate 1e6``) matches a server's path, and its p99 at the suite's rate shows what a path of that
length gets on this machine however little memory it touches (bench/RESULTS.md, "Light load's p99 on a
shared machine").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


class _Forward(asyncio.Protocol):
    """The ``protocol`` server: the first connection's bytes go to the second, from ``data_received``."""

    peers: list[Any] = []  # uvloop's transports, which are not asyncio.Transport subclasses

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peers.append(transport)

    def data_received(self, data: bytes) -> None:
        self.peers[1].write(data)


class _Spin(_Forward):
    """The ``spin`` server: ``protocol``'s forwarder after ``steps`` additions per event."""

    steps = 0

    def data_received(self, data: bytes) -> None:
        x = 0
        for i in range(self.steps):
            x += i
        self.peers[1].write(data)


async def _serve(mode: str, spin: int) -> None:
    loop = asyncio.get_running_loop()
    _Spin.steps = spin
    if mode in ("protocol", "spin"):
        srv = await loop.create_server(_Forward if mode == "protocol" else _Spin, "127.0.0.1", 0)
    else:
        writers: list[asyncio.StreamWriter] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)
            while data := await reader.read(1 << 16):
                writers[1].writelines([data])

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


def _run(a: socket.socket, b: socket.socket, samples: int, rate: float) -> list[float]:
    out: list[float] = []
    interval = 1.0 / rate
    msg = b"x" * 16
    nxt = time.perf_counter()
    for _ in range(samples):
        while (now := time.perf_counter()) < nxt:
            if nxt - now > 0.0005:
                time.sleep(nxt - now - 0.0003)
        t0 = time.perf_counter()
        a.sendall(msg)
        got = 0
        while got < len(msg):
            got += len(b.recv(1 << 16))
        out.append(time.perf_counter() - t0)
        nxt += interval
    out.sort()
    return out


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(mode: str, samples: int, rate: float, spin: int) -> tuple[float, float, float]:
    """p50 and p99 in µs, and the server's CPU per event in µs."""
    cmd = [sys.executable, __file__, "--serve", mode, "--spin", str(spin)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        a = socket.create_connection(("127.0.0.1", port))
        time.sleep(0.1)  # the server takes the first connection as the sender's
        b = socket.create_connection(("127.0.0.1", port))
        time.sleep(0.1)  # and the second, before the first sends
        for s in (a, b):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        b.settimeout(10)
        _run(a, b, 200, rate)  # warm-up
        perf = shutil.which("perf")
        stat = None
        out_path = tempfile.mktemp(prefix="perfstat-")
        if perf is not None:
            stat = subprocess.Popen([perf, "stat", "-e", "task-clock", "-p", str(proc.pid), "-o", out_path])
            time.sleep(0.3)
        c0 = _cpu_s(proc.pid)
        lat = _run(a, b, samples, rate)
        cpu_us = (_cpu_s(proc.pid) - c0) / samples * 1e6
        if stat is not None:
            stat.send_signal(signal.SIGINT)
            stat.wait(10)
            for line in Path(out_path).read_text().splitlines():
                if "task-clock" in line:
                    cpu_us = float(line.split()[0].replace(",", "")) * 1e3 / samples
            os.unlink(out_path)
        a.close()
        b.close()
    finally:
        proc.kill()
        proc.wait()
    return lat[len(lat) // 2] * 1e6, lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e6, cpu_us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--modes", default="protocol,streams")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=1000.0, help="events per second (the suite's: 1000)")
    ap.add_argument("--spin", type=int, default=1500, help="the spin mode's additions per event")
    args = ap.parse_args()
    if args.serve:
        import uvloop

        uvloop.run(_serve(args.serve, args.spin))
        return
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for r in range(args.rounds):
        for mode in args.modes.split(","):
            p50, p99, cpu = _measure(mode, args.samples, args.rate, args.spin)
            rows.setdefault(mode, []).append((p50, p99, cpu))
            print(
                f"round {r} {mode:<9} p50 {p50:6.0f} p99 {p99:7.0f} µs  server CPU {cpu:6.1f} µs/event  "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    print("medians over rounds:")
    for mode, v in rows.items():
        med = [statistics.median(c) for c in zip(*v, strict=True)]
        print(f"{mode:<9} p50 {med[0]:6.0f} p99 {med[1]:7.0f} µs  server CPU {med[2]:6.1f} µs/event")


if __name__ == "__main__":
    main()
