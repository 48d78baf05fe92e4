"""Replay from the log, end to end: server CPU seconds per 1M replayed events and the client's rate.

Starts ``hubbub serve`` on a SQLite data dir (``durability commit``) holding ``--events`` stored events of
``--size`` bytes on one channel (prefilled once through the store and kept in ``--cache``), subscribes with
a replay and counts the event frames the connection receives. The server's CPU time comes from
``/proc/<pid>/stat`` over exactly the replay, so it is far steadier than the rate on a shared machine.

    PYTHONPATH=src python bench/replay_bench.py --events 1000000 --size 16 --runs 3 \
        [--transport tcp|ws] [--encoding msgpack|json] [--start last|since|from_time]

``ws`` is msgpack only (one WebSocket message per frame, batch off); ``tcp`` asks for ``batch: true``.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import start
from proto import count_stream

CHANNEL = "/b/r"


def prefill(data_dir: Path, total: int, size: int) -> None:
    """Fill a data dir through the store directly, in appends of 1000."""
    from hubbub.events import Publisher
    from hubbub.log import AppendRequest, RetentionPolicy, open_store

    data_dir.mkdir(parents=True)
    pub = Publisher("native", "", "bench", "")
    batch = [AppendRequest(CHANNEL, pub, b"x" * size, "application/octet-stream") for _ in range(1000)]
    st = open_store("sqlite", str(data_dir), "none", RetentionPolicy(), 600)
    try:
        for _ in range(total // 1000):
            st.append(batch)
    finally:
        st.close()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
    return s


def _read_until(s: socket.socket, needle: bytes, buf: bytes = b"") -> bytes:
    while needle not in buf:
        chunk = s.recv(1 << 16)
        if not chunk:
            raise ConnectionError(f"closed while waiting for {needle!r}: {buf[-300:]!r}")
        buf += chunk
    return buf


def _ws_frame(body: bytes) -> bytes:
    n = len(body)
    if n < 126:
        head = bytes([0x82, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([0x82, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x82, 0x80 | 127]) + struct.pack(">Q", n)
    return head + b"\x00\x00\x00\x00" + body


def subscribe_request(start_mode: str, total: int) -> dict[str, object]:
    req: dict[str, object] = {"op": "subscribe", "id": 2, "sub": "s", "pattern": CHANNEL}
    if start_mode == "last":
        req["last"] = total
    elif start_mode == "since":
        req["since"] = {"seq": 0, "epoch": ""}
    else:
        req["from_time"] = 1
    return req


def open_replay(
    transport: str, encoding: str, ports: tuple[int, int], req: dict[str, object]
) -> tuple[socket.socket, bytes, bytes]:
    """Connect, hello, subscribe; returns (socket, bytes after the subscribe reply, event marker)."""
    native, http = ports
    if transport == "ws":
        if encoding != "msgpack":
            raise SystemExit("ws is msgpack only here")
        s = _connect(http)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            (
                f"GET /ws/hubbub HTTP/1.1\r\nHost: 127.0.0.1:{http}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Protocol: hubbub.v1.msgpack\r\n\r\n"
            ).encode()
        )
        buf = _read_until(s, b"\r\n\r\n")
        buf = buf.split(b"\r\n\r\n", 1)[1]
        hello = {"op": "hello", "id": 1, "v": 1}
        s.sendall(_ws_frame(msgpack.packb(hello)) + _ws_frame(msgpack.packb(req)))
        reply = b"\xa3sub\xa1s\xa8position"
        buf = _read_until(s, reply, buf)
        return s, buf.split(reply, 1)[1], b"\xa2op\xa5event"
    s = _connect(native)
    hello = {"op": "hello", "id": 1, "v": 1, "batch": True}
    if encoding == "json":
        s.sendall(json.dumps(hello).encode() + b"\n" + json.dumps(req).encode() + b"\n")
        reply = b'"sub":"s","position"'
        buf = _read_until(s, reply)
        return s, buf.split(reply, 1)[1], b'"op":"event"'
    s.sendall(b"".join(struct.pack(">I", len(b)) + b for b in map(msgpack.packb, (hello, req))))
    reply = b"\xa3sub\xa1s\xa8position"
    buf = _read_until(s, reply)
    return s, buf.split(reply, 1)[1], b"\xa2op\xa5event"


def run_once(args: argparse.Namespace, data_dir: Path) -> tuple[float, float, int]:
    """One replay against a fresh server: (server CPU s, elapsed s, events counted)."""
    srv = start("hubbub-commit", data_dir=str(data_dir))
    try:
        spec = srv.specs["hubbub"]
        ports = (spec.port, spec.http_port)
        req = subscribe_request(args.start, args.events)
        # Warm the server's code paths (and the page cache) with a small replay first.
        warm = {"op": "subscribe", "id": 2, "sub": "s", "pattern": CHANNEL, "last": 10}
        s, _, _ = open_replay(args.transport, args.encoding, ports, warm)
        s.close()
        time.sleep(0.3)
        c0, t0 = srv.cpu_s(), time.perf_counter()
        s, rest, marker = open_replay(args.transport, args.encoding, ports, req)
        got, tail = count_stream(rest, b"", marker)
        try:
            while got < args.events:
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                k, tail = count_stream(chunk, tail, marker)
                got += k
        finally:
            s.close()
        dt = time.perf_counter() - t0
        return srv.cpu_s() - c0, dt, got
    finally:
        srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--transport", choices=("tcp", "ws"), default="tcp")
    ap.add_argument("--encoding", choices=("msgpack", "json"), default="msgpack")
    ap.add_argument("--start", choices=("last", "since", "from_time"), default="last")
    ap.add_argument("--cache", default="/tmp/hubbub-replay-bench")
    args = ap.parse_args()
    data_dir = Path(args.cache) / f"{args.events}x{args.size}"
    if not data_dir.exists():
        print(f"prefilling {args.events} events of {args.size} B into {data_dir}", flush=True)
        prefill(data_dir, args.events, args.size)
    cpus: list[float] = []
    rates: list[float] = []
    for i in range(args.runs):
        cpu, dt, got = run_once(args, data_dir)
        per_m = cpu * 1_000_000 / max(got, 1)
        cpus.append(per_m)
        rates.append(got / dt)
        note = "" if got >= args.events else f" (only {got})"
        print(
            f"run {i + 1}: {got / dt:,.0f} msgs/s, server {per_m:.2f} CPU s per 1M events{note}", flush=True
        )
    print(
        f"median: {statistics.median(rates):,.0f} msgs/s, server {statistics.median(cpus):.2f} CPU s per 1M "
        f"({args.transport} {args.encoding}, {args.start}, {args.events} x {args.size} B)"
    )


if __name__ == "__main__":
    main()
