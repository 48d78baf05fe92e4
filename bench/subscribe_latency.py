"""Subscribe latency on a node of 1 and of N worker processes: the round trip of a native subscribe (a
pattern, no replay) and its reply, each followed by its unsubscribe, on several connections in turn
(spread over the workers by the kernel, ``SO_REUSEPORT``). On workers a subscribe waits for the worker's
relay to have every event committed before it (``WorkerRelay.barrier``: one call to the log owner and a
marker back through the worker's events socket).

    PYTHONPATH=src python bench/subscribe_latency.py --workers 1,2 [--src OTHER/src]

Prints the median and 90th percentile per node; ``--src`` runs another tree's package (compare two trees).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from procs import start  # noqa: E402

__all__ = ["main", "run"]


class _Lines:
    """A native TCP connection speaking JSON lines, one request at a time."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20.0)
        self.buf = b""
        self.ids = 0
        assert self.request({"op": "hello", "v": 1})["op"] == "reply"

    def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.ids += 1
        self.sock.sendall(json.dumps({**obj, "id": self.ids}).encode() + b"\n")
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            msg: dict[str, Any] = json.loads(line)
            if msg.get("id") == self.ids:
                return msg


def run(workers: list[int], *, conns: int, count: int, src: str | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for n in workers:
        with start("hubbub-commit", workers=n, src=src) as srv:
            port = srv.specs["hubbub"].port
            load = os.getloadavg()[0]
            took: list[float] = []
            for _ in range(conns):
                c = _Lines(port)
                for i in range(count):
                    t0 = time.perf_counter()
                    reply = c.request({"op": "subscribe", "sub": f"s{i}", "pattern": "/bench/**"})
                    took.append(time.perf_counter() - t0)
                    assert reply["op"] == "reply", reply
                    c.request({"op": "unsubscribe", "sub": f"s{i}"})
                c.sock.close()
        took.sort()
        rows.append(
            {
                "workers": n,
                "subscribes": len(took),
                "median_us": round(statistics.median(took) * 1e6),
                "p90_us": round(took[int(len(took) * 0.9)] * 1e6),
                "load": round(load, 1),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--count", type=int, default=250, help="subscribes per connection")
    ap.add_argument("--src", default=None, help="another tree's src directory")
    args = ap.parse_args(argv)
    rows = run([int(w) for w in args.workers.split(",")], conns=args.conns, count=args.count, src=args.src)
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
