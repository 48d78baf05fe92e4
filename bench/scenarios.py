"""Scenario runners: throughput (any publishers → any subscribers, with or without acks), latency and replay
(idle memory: bench/idle.py). Publishers and subscribers run in worker processes (fork), sharing only
counters.

Each throughput run is bounded twice: by a message count and by a duration. The rate is the number counted
when the first bound is reached, divided by the time it took. CPU seconds of the server and of every driver
process are read from /proc over exactly that interval.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import selectors
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from procs import Server
from proto import (
    Spec,
    StreamCounter,
    ack_marker,
    count_stream,
    deliver_marker,
    open_pub,
    open_sub,
    pub_frames,
    resp,
)

# pub_frames: the publishers build their frames with this module's name for it, which publish_cpu.py replaces.
__all__ = ["Result", "latency", "pub_frames", "replay", "throughput"]

CTX = mp.get_context("fork")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    value: float  # the headline figure (rate, µs or bytes)
    unit: str
    extra: dict[str, float] = field(default_factory=dict)
    server_cpu_s: float = 0.0
    driver_cpu_s: float = 0.0
    elapsed_s: float = 0.0
    note: str = ""


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _cpus(pids: list[int]) -> float:
    return sum(_cpu(p) for p in pids)


def subject(kind: str, name: str) -> str:
    if kind.startswith("hubbub"):
        return f"/b/{name}"
    if kind.startswith("mqtt"):
        return f"b/{name}"
    if kind == "js":
        return f"js.{name}"
    return f"b.{name}"


# -- workers ---------------------------------------------------------------------------------------------


def _sub_worker(
    spec: Spec, subj: str, nconns: int, count: Any, ready: Any, stop: Any, deadline: float
) -> None:
    conns = [open_sub(spec, subj) for _ in range(nconns)]
    marker = deliver_marker(spec, subj)
    sel = selectors.DefaultSelector()
    buf = bytearray(1 << 20)  # every connection's reads, one at a time
    n = 0
    for c in conns:
        c.sock.setblocking(False)
        counter = StreamCounter(marker, buf)
        sel.register(c.sock, selectors.EVENT_READ, counter)
        n += counter.feed(c.rest)
    count.value = n
    ready.set()
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            for key, _ in sel.select(0.05):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    got = key.data.recv(s)
                except BlockingIOError:
                    continue
                if got < 0:
                    sel.unregister(s)
                    continue
                n += got
            count.value = n
    finally:
        for c in conns:
            c.close()


def _pub_worker(
    spec: Spec,
    subj: str,
    nconns: int,
    payload: bytes,
    total: int,
    ack: bool,
    window: int,
    sent_v: Any,
    acked_v: Any,
    delivered: list[Any],
    fanout: int,
    all_sent: list[Any],
    ready: Any,
    go: Any,
    stop: Any,
    deadline: float,
) -> None:
    conns = [open_pub(spec) for _ in range(nconns)]
    chunk_n = max(1, min(window // 4, 256))
    frames = pub_frames(spec, subj, payload, chunk_n, ack)
    amark = ack_marker(spec)
    tails = [b""] * nconns
    ready.set()
    go.wait(60)
    sent = acked = 0
    i = 0
    try:
        while sent < total and not stop.is_set() and time.monotonic() < deadline:
            # Drain replies/acks without blocking so the server never stalls on our receive buffer.
            for j, c in enumerate(conns):
                while True:
                    try:
                        data = c.sock.recv(1 << 20, socket.MSG_DONTWAIT)
                    except (BlockingIOError, InterruptedError):
                        break
                    if not data:
                        raise ConnectionError("server closed a publisher")
                    if amark:
                        got, tails[j] = count_stream(data, tails[j], amark)
                        acked += got
            acked_v.value = acked
            if ack and sent - acked >= window:
                time.sleep(0.0002)
                continue
            if fanout and sum(v.value for v in all_sent) * fanout - sum(v.value for v in delivered) >= (
                window * fanout
            ):
                time.sleep(0.0002)
                continue
            conns[i % nconns].sock.sendall(frames)
            i += 1
            sent += chunk_n
            sent_v.value = sent
        # Collect the outstanding acks (bounded by the deadline) so the ack count is complete.
        while ack and acked < sent and not stop.is_set() and time.monotonic() < deadline:
            for j, c in enumerate(conns):
                c.sock.settimeout(0.05)
                try:
                    data = c.sock.recv(1 << 20)
                except (TimeoutError, BlockingIOError):
                    continue
                if not data:
                    raise ConnectionError("server closed a publisher")
                got, tails[j] = count_stream(data, tails[j], amark)
                acked += got
            acked_v.value = acked
        stop.wait(max(0.0, deadline - time.monotonic()))
    finally:
        for c in conns:
            c.close()


# -- throughput ------------------------------------------------------------------------------------------


def throughput(
    server: Server,
    pub_spec: Spec,
    sub_spec: Spec | None,
    name: str,
    payload_size: int,
    count: int,
    pubs: int = 1,
    subs: int = 1,
    ack: bool = False,
    window: int = 2000,
    duration: float = 5.0,
) -> Result:
    """Publish up to ``count`` messages over ``pubs`` connections to ``subs`` subscribers, for at most
    ``duration`` seconds. With subscribers the figure is deliveries/s, without them acked publishes/s."""
    subj = subject(pub_spec.kind, name)
    payload = b"x" * payload_size
    setup_deadline = time.monotonic() + 60 + duration * 3
    stop = CTX.Event()
    go = CTX.Event()
    procs: list[Any] = []
    delivered: list[Any] = []
    if sub_spec is not None and subs:
        nw = 1 if subs < 10 else 2
        for w in range(nw):
            v, ready = CTX.RawValue("q", 0), CTX.Event()
            n = subs // nw + (1 if w < subs % nw else 0)
            p = CTX.Process(target=_sub_worker, args=(sub_spec, subj, n, v, ready, stop, setup_deadline))
            p.start()
            procs.append((p, ready))
            delivered.append(v)
    npw = 1 if pubs < 10 else 2
    sents = [CTX.RawValue("q", 0) for _ in range(npw)]
    ackeds = [CTX.RawValue("q", 0) for _ in range(npw)]
    fan = subs if delivered else 0
    for w in range(npw):
        n = pubs // npw + (1 if w < pubs % npw else 0)
        ready = CTX.Event()
        args = (
            pub_spec,
            subj,
            n,
            payload,
            count // npw,
            ack,
            window,
            sents[w],
            ackeds[w],
            delivered,
            fan,
            sents,
        )
        procs.append((CTX.Process(target=_pub_worker, args=(*args, ready, go, stop, setup_deadline)), ready))
    try:
        for _p, ready in procs[: len(delivered)]:
            if not ready.wait(60):
                raise RuntimeError("subscribers not ready")
        for p, _ in procs[len(delivered) :]:
            p.start()
        for _p, ready in procs[len(delivered) :]:
            if not ready.wait(60):
                raise RuntimeError("publishers not ready")
        if sub_spec is not None and sub_spec.kind == "js":
            time.sleep(0.2)  # push consumer creation settles
        pids = [p.pid for p, _ in procs] + [os.getpid()]
        base = sum(v.value for v in delivered)
        s0, d0, t0 = server.cpu_s(), _cpus(pids), time.perf_counter()
        go.set()
        target = count * subs if delivered else count
        end = t0 + duration
        done = 0
        while time.perf_counter() < end:
            done = (sum(v.value for v in delivered) - base) if delivered else sum(v.value for v in ackeds)
            if done >= target:
                break
            if not any(p.is_alive() for p, _ in procs):
                break
            time.sleep(0.005)
        t1 = time.perf_counter()
        s1, d1 = server.cpu_s(), _cpus(pids)
        done = (sum(v.value for v in delivered) - base) if delivered else sum(v.value for v in ackeds)
    finally:
        stop.set()
        for p, _ in procs:
            if p.pid is not None:
                p.join(10)
                if p.is_alive():
                    p.kill()
                    p.join(5)
    dt = t1 - t0
    note = "" if done >= target else f"time-capped at {duration:.0f}s"
    if done == 0:
        note = "nothing delivered"
    return Result(done / dt, "msgs/s", {"count": done}, s1 - s0, d1 - d0, dt, note)


# -- latency ---------------------------------------------------------------------------------------------


def latency(server: Server, spec: Spec, name: str, payload_size: int, samples: int, rate: float) -> Result:
    """One message every 1/``rate`` s; each is timed from ``sendall`` to its delivery on another connection.

    The rate is light on purpose (no queueing); a message that takes longer than the interval delays the
    next one, so this measures service latency, not latency under a fixed open-loop load.
    """
    subj = subject(spec.kind, name)
    sub = open_sub(spec, subj)
    pub = open_pub(spec)
    sub.sock.settimeout(10)
    try:
        frame = pub_frames(spec, subj, b"x" * payload_size, 1, False)
        marker = deliver_marker(spec, subj)
        tail = b""
        out: list[float] = []
        interval = 1.0 / rate
        s0, d0 = server.cpu_s(), _cpus([os.getpid()])
        t_start = time.perf_counter()
        nxt = t_start
        for i in range(samples + 50):
            while (now := time.perf_counter()) < nxt:
                if nxt - now > 0.0005:
                    time.sleep(nxt - now - 0.0003)
            t0 = time.perf_counter()
            pub.sock.sendall(frame)
            got = 0
            while not got:
                got, tail = count_stream(sub.sock.recv(1 << 16), tail, marker)
            dt = time.perf_counter() - t0
            if i >= 50:  # warm-up
                out.append(dt)
            with contextlib.suppress(BlockingIOError):
                pub.sock.recv(1 << 16, socket.MSG_DONTWAIT)  # redis publisher replies
            nxt += interval
        elapsed = time.perf_counter() - t_start
        s1, d1 = server.cpu_s(), _cpus([os.getpid()])
    finally:
        sub.close()
        pub.close()
    out.sort()

    def pct(q: float) -> float:
        return out[min(len(out) - 1, int(q * len(out)))] * 1e6

    p50, p99, p999 = pct(0.5), pct(0.99), pct(0.999)
    return Result(p99, "µs p99", {"p50": p50, "p99": p99, "p99.9": p999}, s1 - s0, d1 - d0, elapsed)


# -- replay ----------------------------------------------------------------------------------------------


def _resp_xrange_replay(spec: Spec, key: str, total: int, batch: int = 10_000) -> int:
    c = open_pub(spec)
    got = 0
    start = b"-"
    marker = b"$1\r\nd\r\n"
    try:
        while got < total:
            want = min(batch, total - got)
            c.sock.sendall(resp("XRANGE", key, start, "+", "COUNT", str(want)))
            buf = b""
            n = 0
            tail = b""
            while n < want:
                chunk = c.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("redis closed")
                k, tail = count_stream(chunk, tail, marker)
                n += k
                buf += chunk
            # The reply ends with the last entry's payload; its id is the line before its field list.
            idx = buf.rfind(b"\r\n*2\r\n$1\r\nd\r\n")
            start = b"(" + buf[:idx].rsplit(b"\r\n", 1)[1]
            got += n
    finally:
        c.close()
    return got


def replay(server: Server, spec: Spec, name: str, total: int, timeout: float = 120.0) -> Result:
    """Read ``total`` stored events: hubbub with ``last``, JetStream with a deliver-all push consumer, Redis
    streams with XRANGE pages of 10k."""
    subj = subject(spec.kind, name)
    s0, d0, t0 = server.cpu_s(), _cpus([os.getpid()]), time.perf_counter()
    if spec.kind == "xredis":
        got = _resp_xrange_replay(spec, subj, total)
    else:
        sub = open_sub(spec, subj, replay_last=total)
        marker = deliver_marker(spec, subj)
        got, tail = count_stream(sub.rest, b"", marker)
        deadline = time.monotonic() + timeout
        try:
            while got < total and time.monotonic() < deadline:
                chunk = sub.sock.recv(1 << 20)
                if not chunk:
                    break
                k, tail = count_stream(chunk, tail, marker)
                got += k
        finally:
            sub.close()
    dt = time.perf_counter() - t0
    s1, d1 = server.cpu_s(), _cpus([os.getpid()])
    note = "" if got >= total else f"only {got} of {total}"
    return Result(got / dt, "msgs/s", {"count": got}, s1 - s0, d1 - d0, dt, note)
