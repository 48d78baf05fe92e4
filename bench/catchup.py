"""Catch-up of a wildcard subscriber far behind: hubbub against a JetStream ordered consumer, same backlog.

The backlog is ``behind`` events of ``size`` bytes round-robin over ``channels`` channels, already stored
before the subscriber asks for it:

- hubbub: appended straight to a fresh SQLite log (each channel first gets one event, the subscriber's
  position); the subscriber sends ``subscribe`` ``/b/w/**`` with ``since`` every channel's position (native
  TCP, msgpack, ``batch:true``), so the server plans the replay from the 1,000 positions and replays the log
  in commit order.
- JetStream: published with acks to stream ``B`` (file storage) on ``js.w.c<N>``; the subscriber creates an
  ordered consumer (what ``nats.go``'s ``OrderedConsumer`` creates: ephemeral push, ``DeliverAll``, no acks,
  flow control, idle heartbeat, memory state, one replica) filtered on ``js.w.>`` and answers every flow
  control request.

The figure is events delivered per second from the subscribe request (or the consumer's creation) to the
last event, with the server's and the driver's CPU over that interval. The driver counts deliveries by a
marker (``proto.count_stream``); the exact delivery of a wide catch-up (every channel, seq and payload) is
checked by ``bench/wide_recovery.py`` and ``tests/integration/test_wide_recovery.py``.

Run alone, it measures hubbub's side only: the server CPU per event of the catch-up (steadier than the rate
on a shared machine) over ``--runs`` runs, a fresh server each, for each ``--kind`` (native TCP msgpack or
JSON lines with ``batch:true``, WebSocket msgpack or JSON one frame per message) and ``--payload`` (bytes, or
``mixed``: 64 B to 32 KiB, ``payloads.MIXED``). With several ``--src`` trees (another checkout's ``src``)
the runs alternate between them, run 1 of each tree, then run 2 of each, so a machine's load falls on both::

    PYTHONPATH=src python bench/catchup.py --kind hubbub --kind hubbub-wsjson --payload 16 --runs 5 \
        --src /tmp/main/src --src src
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from payloads import text_payloads
from procs import Server, start
from proto import (
    JSON_KINDS,
    Conn,
    Spec,
    _hub_open,
    _hub_send_obj,
    _nats_open,
    _read_until,
    _reply_marker,
    count_stream,
    deliver_marker,
    nats_request,
)
from scenarios import Result, _cpus

__all__ = ["catchup_hubbub", "catchup_js", "prefill_hubbub", "prefill_js"]

_WIDE = "w"  # the channels are /b/w/c<N> (hubbub) and js.w.c<N> (JetStream)
_FC = re.compile(rb"HMSG \S+ \d+ (\S+) \d+ \d+\r\nNATS/1.0 100 FlowControl Request")


def _name(i: int, channels: int) -> str:
    return f"c{i % channels:05d}"


def prefill_hubbub(
    data_dir: str, channels: int, behind: int, size: int | str
) -> dict[str, dict[str, object]]:
    """Write the backlog to a fresh SQLite log in ``data_dir`` (payloads of ``size`` bytes, all ``x``, or
    ``"mixed"``: :func:`payloads.text_payloads`); returns the subscriber's ``since`` map (every channel's
    first event, the backlog after it)."""
    from hubbub.events import Publisher
    from hubbub.log import AppendRequest, RetentionPolicy, open_store

    pub = Publisher("native", "", "bench", "")
    payload = b"x" * size if isinstance(size, int) else b"x"
    bodies = text_payloads(behind, size) if isinstance(size, str) else None
    since: dict[str, dict[str, object]] = {}
    st = open_store("sqlite", data_dir, "none", RetentionPolicy(), 600)
    try:
        firsts = [
            AppendRequest(f"/b/{_WIDE}/{_name(i, channels)}", pub, payload, "application/octet-stream")
            for i in range(channels)
        ]
        for r in st.append(firsts):
            since[r.event.channel] = {"seq": r.event.seq, "epoch": r.event.epoch}
        for s in range(0, behind, 10_000):
            part = range(s, min(s + 10_000, behind))
            st.append(
                [
                    AppendRequest(
                        f"/b/{_WIDE}/{_name(i, channels)}",
                        pub,
                        payload if bodies is None else bodies[i],
                        "application/octet-stream",
                    )
                    for i in part
                ]
            )
    finally:
        st.close()
    return since


def prefill_js(spec: Spec, channels: int, behind: int, size: int, window: int = 5_000) -> None:
    """Publish the backlog to stream ``B`` with acks, ``window`` at a time; every publish acknowledged."""
    payload = b"x" * size
    c = _nats_open(spec)
    try:
        c.sock.sendall(b"SUB _I.a 1\r\n")
        acked, tail = 0, b""
        for s in range(0, behind, window):
            n = min(window, behind - s)
            c.sock.sendall(
                b"".join(
                    b"PUB js.%s.%s _I.a %d\r\n%s\r\n"
                    % (_WIDE.encode(), _name(i, channels).encode(), size, payload)
                    for i in range(s, s + n)
                )
            )
            while acked < s + n:
                chunk = c.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("nats-server closed the prefill connection")
                if b"-ERR" in chunk or b'"error"' in chunk:
                    raise RuntimeError(f"JetStream refused a publish: {chunk[:300]!r}")
                k, tail = count_stream(chunk, tail, b"MSG _I.a")
                acked += k
    finally:
        c.close()


def _drain(
    conn: Conn,
    marker: bytes,
    total: int,
    timeout: float,
    on_chunk: Callable[[bytes], None] | None = None,
    end: bytes = b"",
) -> int:
    """Count ``marker`` in what ``conn`` receives until ``total`` of them (and, with ``end``, that marker once
    after them) or ``timeout``; each read also goes to ``on_chunk``. Returns the count."""
    got, tail = count_stream(conn.rest, b"", marker)
    ended, etail = count_stream(conn.rest, b"", end) if end else (1, b"")
    deadline = time.monotonic() + timeout
    conn.sock.settimeout(timeout)
    while (got < total or not ended) and time.monotonic() < deadline:
        chunk = conn.sock.recv(1 << 20)
        if not chunk:
            break
        if on_chunk is not None:
            on_chunk(chunk)
        k, tail = count_stream(chunk, tail, marker)
        got += k
        if end:
            k, etail = count_stream(chunk, etail, end)
            ended += k
    return got


def _result(server: Server, got: int, total: int, t0: float, s0: float, d0: float) -> Result:
    dt = time.perf_counter() - t0
    s1, d1 = server.cpu_s(), _cpus([os.getpid()])
    note = "" if got == total else f"{got} of {total}"
    return Result(got / dt, "msgs/s", {"count": got}, s1 - s0, d1 - d0, dt, note)


def catchup_hubbub(
    server: Server, spec: Spec, since: dict[str, dict[str, object]], total: int, timeout: float = 300.0
) -> Result:
    """Subscribe ``/b/w/**`` with ``since`` and read the ``total`` events behind."""
    c = _hub_open(spec, batch=True)
    try:
        reply = _reply_marker(spec.kind)
        req = {"op": "subscribe", "id": 2, "sub": "w", "pattern": f"/b/{_WIDE}/**", "since": since}
        s0, d0, t0 = server.cpu_s(), _cpus([os.getpid()]), time.perf_counter()
        c.sock.sendall(_hub_send_obj(spec, req))
        buf = _read_until(c.sock, reply, c.rest, timeout)
        c.rest = buf.split(reply, 1)[1]
        # The replay ends with one "recovered" frame: reading up to it shows a count past ``total``.
        end = b'"op":"recovered"' if spec.kind in JSON_KINDS else b"\xa2op\xa9recovered"
        got = _drain(c, deliver_marker(spec, ""), total, timeout, end=end)
        return _result(server, got, total, t0, s0, d0)
    finally:
        c.close()


def catchup_js(server: Server, spec: Spec, total: int, timeout: float = 300.0) -> Result:
    """Create an ordered consumer with ``DeliverAll`` on ``js.w.>`` and read the ``total`` stored events."""
    c = _nats_open(spec)
    dlv = f"dlv.{os.getpid()}.{time.monotonic_ns()}"
    answered: set[bytes] = set()
    carry = [b""]

    def flow_control(chunk: bytes) -> None:
        # A request split across two reads is found in the carried tail; each is answered once.
        data = carry[0] + chunk
        carry[0] = data[-256:]
        if b"FlowControl" not in data:
            return
        for m in _FC.finditer(data):
            if m.group(1) not in answered:
                answered.add(m.group(1))
                c.sock.sendall(b"PUB %s 0\r\n\r\n" % m.group(1))

    try:
        c.sock.sendall(b"SUB %s 1\r\nPING\r\n" % dlv.encode())
        _read_until(c.sock, b"PONG\r\n")
        cfg = {
            "deliver_subject": dlv,
            "deliver_policy": "all",
            "ack_policy": "none",
            "max_deliver": 1,
            "ack_wait": 22 * 3600 * 10**9,
            "flow_control": True,
            "idle_heartbeat": 5 * 10**9,
            "mem_storage": True,
            "num_replicas": 1,
            "filter_subject": f"js.{_WIDE}.>",
        }
        s0, d0, t0 = server.cpu_s(), _cpus([os.getpid()]), time.perf_counter()
        nats_request(spec, "$JS.API.CONSUMER.CREATE.B", {"stream_name": "B", "config": cfg})
        got = _drain(c, deliver_marker(spec, ""), total, timeout, flow_control)
        r = _result(server, got, total, t0, s0, d0)
        r.note = ", ".join(x for x in ("ordered consumer, DeliverAll on js.w.>", r.note) if x)
        return r
    finally:
        c.close()


def _one(src: str | None, data: str, kind: str, since: dict[str, dict[str, object]], behind: int) -> Result:
    """One catch-up on a fresh server running ``src`` on the backlog in ``data``."""
    with start("hubbub-commit", data_dir=data, src=src) as srv:
        return catchup_hubbub(srv, srv.specs[kind], since, behind)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--channels", type=int, default=1_000)
    p.add_argument("--behind", type=int, default=100_000)
    p.add_argument("--payload", action="append", help="bytes per payload, or mixed (repeatable; default 16)")
    p.add_argument(
        "--kind",
        action="append",
        choices=("hubbub", "hubbub-json", "hubbub-ws", "hubbub-wsjson"),
        help="the subscriber's transport and encoding (repeatable; default hubbub: TCP msgpack batch)",
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--src", action="append", help="a source tree to run the server from (repeatable)")
    a = p.parse_args()
    srcs: list[str | None] = [str(Path(x).resolve()) for x in a.src] if a.src else [None]
    for payload in a.payload or ["16"]:
        size: int | str = int(payload) if payload.isdigit() else payload
        with tempfile.TemporaryDirectory(prefix="hubbub-catchup-") as tmp:
            data = os.path.join(tmp, "data")
            since = prefill_hubbub(data, a.channels, a.behind, size)
            for kind in a.kind or ["hubbub"]:
                cpu: dict[str | None, list[float]] = {s: [] for s in srcs}
                for run in range(a.runs):
                    for src in srcs:
                        r = _one(src, data, kind, since, a.behind)
                        us = r.server_cpu_s / max(1, int(r.extra["count"])) * 1e6
                        cpu[src].append(us)
                        print(
                            f"{payload} B {kind} run {run + 1} {src or 'src'}: {r.value:,.0f} events/s, "
                            f"server {us:.2f} µs/event {r.note}",
                            flush=True,
                        )
                for src in srcs:
                    xs = cpu[src]
                    print(
                        f"== {payload} B {kind} {src or 'src'}: server µs/event median "
                        f"{statistics.median(xs):.2f} (runs {', '.join(f'{x:.2f}' for x in xs)})",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
