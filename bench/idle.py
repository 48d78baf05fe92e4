"""Idle memory: a server's memory growth per idle connection, up to more connections than one process of the
driver or of the server may hold.

One process holds at most its hard RLIMIT_NOFILE of sockets (20,000 on the development machine, which cannot
raise it), and one source address to one port has only the ephemeral port range (about 28,000). So the
connections are opened by several holder processes, each from its own loopback address (Linux routes all of
127.0.0.0/8 to ``lo``), and beyond one process's limit hubbub runs as a node of several workers
(``--workers``), measured as one server: the sum over all its processes (:func:`node_workers`,
:func:`node_skip`).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import socket
import time
from dataclasses import replace
from typing import Any

from procs import Server, raise_nofile
from proto import Conn, Spec, open_pub
from scenarios import Result

__all__ = ["holder_capacity", "idle_memory", "node_skip", "node_workers"]

CTX = mp.get_context("fork")

#: Sockets a holder process keeps below its RLIMIT_NOFILE (its pipes, the modules it reads, ...), and
#: ephemeral ports kept free on each source address for everything else on the machine.
FD_HEADROOM, PORT_HEADROOM = 512, 1000


def holder_capacity() -> int:
    """Connections one holder process opens: under its hard RLIMIT_NOFILE, and under the ephemeral port
    range, since each holder connects from its own loopback address (:func:`idle_memory`)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        ports = hi - lo + 1
    except (OSError, ValueError):
        ports = 16_384  # the IANA range, elsewhere
    return max(1, min(raise_nofile() - FD_HEADROOM, ports - PORT_HEADROOM))


def _hold_worker(spec: Spec, n: int, opened: Any, stop: Any, hold: float) -> None:
    raise_nofile()
    conns: list[Conn] = []
    try:
        for _ in range(n):
            conns.append(open_pub(spec))  # handshake (and hubbub hello) done, then idle
            opened.value = len(conns)
        stop.wait(hold)
    finally:
        for c in conns:
            c.close()


def idle_memory(server: Server, spec: Spec, n: int, settle: float = 1.0) -> Result:
    """Server memory growth per idle connection with ``n`` connections open (bytes/connection): (RSS with
    the ``n`` open - RSS before) / ``n``, the RSS summed over the server's processes (a node of several
    workers is one server, :meth:`Server.rss`); the same of the PSS in ``extra``.

    The connections are opened by at least 2 holder processes, each at most :func:`holder_capacity`, holder
    ``w`` from loopback address 127.0.0.<w+1>, so that neither the driver's RLIMIT_NOFILE nor the ephemeral
    ports of one source address cap ``n``."""
    # Warm the server's code paths before taking the baseline: on a node, every worker's (the kernel hands
    # each connection to one worker by a hash: 16 per worker miss one of 3 with odds of 1 in 600,000).
    workers = len(server.pids()) - 2  # a node: the parent, its fork server, the workers
    probes = [open_pub(spec) for _ in range(16 * workers if workers > 0 else 1)]
    for c in probes:
        c.close()
    time.sleep(0.3)
    rss0, pss0 = server.rss(), server.pss()
    cap = holder_capacity()
    holders = max(2, -(-n // cap))
    shares = [n // holders + (1 if w < n % holders else 0) for w in range(holders)]
    open_s = 120.0 + n / 250  # 50,000 WebSocket handshakes on a busy 2-core machine take a minute or two
    stop = CTX.Event()
    vals = [CTX.RawValue("q", 0) for _ in range(holders)]
    procs = [
        CTX.Process(
            target=_hold_worker,
            args=(replace(spec, source=f"127.0.0.{w + 1}" if w else ""), k, vals[w], stop, open_s + 300),
        )
        for w, k in enumerate(shares)
    ]
    t0 = time.perf_counter()
    s0 = server.cpu_s()
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + open_s
        while sum(v.value for v in vals) < n and time.monotonic() < deadline:
            if not all(p.is_alive() for p in procs):
                break
            time.sleep(0.05)
        opened = sum(v.value for v in vals)
        time.sleep(settle)
        rss1, pss1 = server.rss(), server.pss()
        dt = time.perf_counter() - t0
        s1 = server.cpu_s()
        nprocs = len(server.pids())
    finally:
        stop.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join(5)
    per = (rss1 - rss0) / max(opened, 1)
    note = "" if opened >= n else f"only {opened} of {n} connections opened"
    extra = {
        "connections": opened,
        "rss_total_per_conn": rss1 / max(opened, 1),
        "rss_bytes": rss1,
        "pss_per_conn": (pss1 - pss0) / max(opened, 1),
        "server_processes": nprocs,
        "holders": holders,
    }
    return Result(per, "B/conn", extra, s1 - s0, 0.0, dt, note)


#: The share of a node's connections its busiest worker may get: the kernel spreads a port's connections over
#: the workers' SO_REUSEPORT sockets by a hash of the addresses, not evenly (±1 % at 50,000 over 3).
WORKER_SKEW = 1.15

#: Memory an idle connection needs beyond hubbub's own, on both ends: the sockets in the kernel and the
#: driver's objects. A run that does not fit in the memory available is skipped.
MACHINE_BYTES_PER_CONN = 64 << 10

#: The most workers a node gets for the bench: beyond that the machine is not one to measure on.
MAX_WORKERS = 8


def node_workers(n: int) -> int:
    """The workers of a hubbub node that holds ``n`` connections with each worker under its RLIMIT_NOFILE
    (at least 2: a node is several workers)."""
    return max(2, math.ceil(n * WORKER_SKEW / (raise_nofile() - FD_HEADROOM)))


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _loopback(addr: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, 0))
        except OSError:
            return False
    return True


def node_skip(n: int) -> str | None:
    """Why this machine cannot open ``n`` idle connections to a node of :func:`node_workers` workers, or
    None when it can."""
    workers, holders = node_workers(n), max(2, math.ceil(n / holder_capacity()))
    if workers > MAX_WORKERS:
        return f"RLIMIT_NOFILE hard {raise_nofile()}: {n:,} connections need {workers} workers"
    need, free = n * MACHINE_BYTES_PER_CONN, _available_memory()
    if free < need:
        return f"{n:,} connections need {need / 2**30:.1f} GiB of memory, {free / 2**30:.1f} GiB available"
    last = f"127.0.0.{holders}"
    if holders > 1 and not _loopback(last):
        return f"{last} is not a local address here (the holders connect from 127.0.0.1 to {last})"
    return None
