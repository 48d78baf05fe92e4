"""Quick native-protocol figures: publish-with-ack throughput and 1->1 end-to-end msgs/s.

Starts a real ``hubbub serve`` on free loopback ports in a temporary directory and drives it over raw TCP
(JSON lines), pipelining publishes in windows. The full side-by-side suite is a separate benchmark.

    python bench/quick_native.py --count 100000 --size 16 --durability commit
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.integration

from tests.integration.serverproc import ServerProcess


class Conn:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(b'{"op":"hello","id":1,"v":1,"batch":true}\n')
        self.lines()

    def lines(self) -> list[bytes]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        head, _, self.buf = self.buf.rpartition(b"\n")
        return head.split(b"\n")


def count_frames(line: bytes, op: bytes) -> int:
    # A batch frame carries many frames; count occurrences of the op cheaply.
    return line.count(b'"op":"' + op + b'"')


def publish_frames(n: int, start: int, payload: str, ack: bool, channel: str) -> bytes:
    a = "true" if ack else "false"
    return b"".join(
        f'{{"op":"publish","id":{start + i},"channel":"{channel}","text":"{payload}","ack":{a}}}\n'.encode()
        for i in range(n)
    )


def bench_ack(port: int, count: int, payload: str, window: int = 2000) -> float:
    c = Conn(port)
    frames = publish_frames(window, 10, payload, True, "/bench/ack")
    t0 = time.perf_counter()
    sent = acked = 0
    while acked < count:
        while sent - acked < window and sent < count:
            c.sock.sendall(frames)
            sent += window
        for line in c.lines():
            acked += count_frames(line, b"reply")
    dt = time.perf_counter() - t0
    c.sock.close()
    return acked / dt


def bench_e2e(port: int, count: int, payload: str, window: int = 2000) -> float:
    sub = Conn(port)
    sub.sock.sendall(b'{"op":"subscribe","id":2,"sub":"s","pattern":"/bench/e2e"}\n')
    sub.lines()
    pub = Conn(port)
    frames = publish_frames(window, 10, payload, False, "/bench/e2e")
    got = 0
    done = threading.Event()

    def reader() -> None:
        nonlocal got
        while got < count:
            for line in sub.lines():
                got += count_frames(line, b"event")
        done.set()

    t = threading.Thread(target=reader, daemon=True)
    t0 = time.perf_counter()
    t.start()
    sent = 0
    while sent < count:
        while sent - got > 4 * window:
            time.sleep(0.0005)
        pub.sock.sendall(frames)
        sent += window
    done.wait(120)
    dt = time.perf_counter() - t0
    pub.sock.close()
    sub.sock.close()
    return got / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=16, help="payload bytes")
    ap.add_argument("--durability", default="commit", choices=["fsync", "commit", "none"])
    args = ap.parse_args()
    payload = "x" * args.size
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp) / "data", ["--durability", args.durability]).start()
        try:
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            ack = bench_ack(srv.ports["native"], args.count, payload)
            e2e = bench_e2e(srv.ports["native"], args.count, payload)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
        finally:
            srv.terminate()
    out = {
        "durability": args.durability,
        "payload_bytes": args.size,
        "count": args.count,
        "publish_ack_msgs_per_s": round(ack),
        "e2e_1to1_msgs_per_s": round(e2e),
        "driver_cpu_s": round((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), 2),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
