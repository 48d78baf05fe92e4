"""Server CPU per pipelined request on the read loops: what reading a request, answering it and writing the
reply costs the server, for the requests a client pipelines.

    PYTHONPATH=src python bench/request_path.py [--count 200000] [--window 2000] [--only tcp_ping,...]

One fresh ``hubbub serve`` process (commit durability, default limits), driven from this process over
loopback; each scenario sends ``--count`` requests in windows of ``--window`` unanswered requests:

* ``tcp_publish_ack``: native TCP (JSON lines) publishes with ``ack`` (``bench/quick_native.py``'s).
* ``tcp_ping``: native TCP pings, each answered with a pong.
* ``ws_publish_ack``: native WebSocket (JSON) publishes with ``ack``.
* ``ws_ping``: native WebSocket pings.
* ``mist2015_ping``: mist 2015 TCP ``ping`` lines, each answered ``pong``.

Figures are the server's user + system CPU seconds (``/proc/<pid>/stat``) over the scenario, per request,
in microseconds: steadier than throughput on a machine shared with other work. A window above
``limits.send_queue`` (1,024) makes the server stop reading while the replies fill the queue
(read-side back-pressure), which the figures include.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.integration
sys.path.insert(0, str(Path(__file__).resolve().parent))

from quick_native import Conn, bench_ack, count_frames
from tests.integration.serverproc import ServerProcess

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def tcp_pings(port: int, count: int, window: int) -> None:
    c = Conn(port)
    frames = b"".join(b'{"op":"ping","id":%d}\n' % i for i in range(window))
    sent = got = 0
    while got < count:
        while sent - got < window and sent < count:
            c.sock.sendall(frames)
            sent += window
        for line in c.lines():
            got += count_frames(line, b"pong")
    c.sock.close()


def mist_pings(port: int, count: int, window: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    frames = b"ping\n" * window
    sent = got = 0
    tail = b""
    while got < count:
        while sent - got < window and sent < count:
            sock.sendall(frames)
            sent += window
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        data = tail + chunk
        got += data.count(b"pong\n")
        tail = data[data.rfind(b"\n") + 1 :]
    sock.close()


async def ws_requests(port: int, count: int, window: int, frame: str, reply: str) -> None:
    """``count`` frames (``frame`` with ``%d`` for the id), at most ``window`` unanswered."""
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"ws://127.0.0.1:{port}/ws/hubbub", protocols=["hubbub.v1.json"])
        await ws.send_str('{"op":"hello","id":0,"v":1}')
        await ws.receive()
        got = 0
        more = asyncio.Event()

        async def reader() -> None:
            nonlocal got
            while got < count:
                msg = await ws.receive()
                got += msg.data.count(reply)
                more.set()

        task = asyncio.ensure_future(reader())
        sent = 0
        while sent < count:
            while sent - got >= window:
                more.clear()
                await more.wait()
            k = min(window - (sent - got), count - sent)
            for i in range(sent, sent + k):
                await ws.send_str(frame % (i + 1))
            sent += k
        await task
        await ws.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    args = ap.parse_args(argv)
    n, w = args.count, args.window
    publish = '{"op":"publish","id":%d,"channel":"/bench/ws","text":"xxxxxxxxxxxxxxxx","ack":true}'
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        srv = ServerProcess(Path(tmp) / "data", ["--durability", "commit"]).start()
        assert srv.proc is not None
        native, http, mist = srv.ports["native"], srv.ports["http"], srv.ports["mist"]
        scenarios: dict[str, Callable[[], object]] = {
            "tcp_publish_ack": lambda: bench_ack(native, n, "x" * 16, w),
            "tcp_ping": lambda: tcp_pings(native, n, w),
            "ws_publish_ack": lambda: asyncio.run(ws_requests(http, n, w, publish, '"op":"reply"')),
            "ws_ping": lambda: asyncio.run(ws_requests(http, n, w, '{"op":"ping","id":%d}', '"op":"pong"')),
            "mist2015_ping": lambda: mist_pings(mist, n, w),
        }
        only = set(filter(None, args.only.split(",")))
        try:
            for name, run in scenarios.items():
                if only and name not in only:
                    continue
                c0 = cpu_s(srv.proc.pid)
                run()
                out[name] = round((cpu_s(srv.proc.pid) - c0) / n * 1e6, 2)
        finally:
            srv.terminate()
    print(json.dumps({"count": n, "window": w, "server_cpu_us_per_request": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
