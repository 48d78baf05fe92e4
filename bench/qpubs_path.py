"""qpubs over qrpc through a ``hubbub serve`` process: emits, live listens and durable subscriptions.

    PYTHONPATH=src python bench/qpubs_path.py [--events 20000] [--store sqlite|memory] [--payload 100]

Scenarios (a fresh server each; ``--store memory`` runs with ``--durability none``, ``sqlite`` with the
default commit durability):

* ``emit``: one qrpc connection pipelines emits (at most 1000 unanswered); events/s answered, each answer
  sent after its commit.
* ``listen``: one connection emits, three connections ``listen`` on ``b.*``; events/s delivered (events x 3
  / first emit → last item at every listener).
* ``durable b=1`` / ``durable b=100``: a subscription is created, the producer emits while one consumer
  opens it and acks every batch (the ack stored before the next batch); events/s acknowledged end to end.
  ``qpubs.batch_bytes`` is set so that a batch holds 1 or about 100 events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 1000


def serve(store: str, tmp: str, extra: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    log = Path(tmp) / "server.log"
    base = ["--store", "memory", "--durability", "none"] if store == "memory" else []
    cmd = [
        sys.executable, "-m", "hubbub", "serve", "--data-dir", os.path.join(tmp, "data"),
        "--http-listen", "127.0.0.1:0", "--native-tcp-listen", "127.0.0.1:0",
        "--qpubs-qrpc-listen", "127.0.0.1:0", "--log-format", "json",
        "--limits-send-queue", "65536", "--limits-send-queue-bytes", str(256 << 20), *base, *extra,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("message") == "listening" and rec.get("listener") == "qrpc":
                return proc, int(rec["address"].rsplit(":", 1)[1])
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"hubbub did not start: {log.read_text()[-2000:]}")


class Conn:
    """A qrpc connection: lines out, each line in to the handler of its call id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.n = 0
        self.task = asyncio.ensure_future(self._read())

    @classmethod
    async def open(cls, port: int) -> Conn:
        r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
        return cls(r, w)

    async def _read(self) -> None:
        while line := await self.reader.readline():
            msg = orjson.loads(line)
            h = self.handlers.get(msg["id"])
            if h is not None:
                h(msg)

    def send(self, name: str, m: Any, handler: Callable[[dict[str, Any]], None]) -> str:
        self.n += 1
        cid = str(self.n)
        self.handlers[cid] = handler
        self.writer.write(orjson.dumps({"v": 1, "id": cid, "n": name, "m": m}) + b"\n")
        return cid

    async def call(self, name: str, m: Any) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        def answer(msg: dict[str, Any]) -> None:
            if not fut.done():
                fut.set_result(msg.get("m"))

        self.send(name, m, answer)
        return await fut

    def close(self) -> None:
        self.writer.close()
        self.task.cancel()


async def emit_all(c: Conn, topic: str, events: int, value: Any) -> None:
    """Pipelined emits, at most WINDOW unanswered; returns when every one is answered."""
    room = asyncio.Semaphore(WINDOW)
    done = asyncio.Event()
    left = events

    def answered(msg: dict[str, Any]) -> None:
        nonlocal left
        assert msg.get("e") is None, msg
        room.release()
        c.handlers.pop(msg["id"], None)
        left -= 1
        if not left:
            done.set()

    for _ in range(events):
        await room.acquire()
        c.send("emit", {"topic": topic, "value": value}, answered)
        if c.n % 64 == 0:
            await c.writer.drain()
    await done.wait()


async def s_emit(port: int, a: argparse.Namespace) -> float:
    c = await Conn.open(port)
    t0 = time.perf_counter()
    await emit_all(c, "a.x", a.events, "x" * a.payload)
    c.close()
    rate: float = a.events / (time.perf_counter() - t0)
    return rate


async def s_listen(port: int, a: argparse.Namespace) -> float:
    listeners = [await Conn.open(port) for _ in range(3)]
    got = [0, 0, 0]
    done = asyncio.Event()
    for k, c in enumerate(listeners):

        def item(msg: dict[str, Any], k: int = k) -> None:
            got[k] += 1
            if min(got) >= a.events:
                done.set()

        c.send("listen", {"topic": "b.*"}, item)
        await c.call("ignore", {"topic": "__barrier__"})
    p = await Conn.open(port)
    t0 = time.perf_counter()
    await emit_all(p, "b.x", a.events, "x" * a.payload)
    await asyncio.wait_for(done.wait(), 120)
    rate: float = a.events * 3 / (time.perf_counter() - t0)
    for c in [p, *listeners]:
        c.close()
    return rate


async def s_durable(port: int, a: argparse.Namespace) -> float:
    p, q = await Conn.open(port), await Conn.open(port)
    await q.call("createSubscription", {"topic": "jobs.*", "subId": "bench"})
    acked = 0
    done = asyncio.Event()

    def batch(msg: dict[str, Any]) -> None:
        m = msg["m"]
        n = len(m["items"])

        def ok(reply: dict[str, Any]) -> None:
            nonlocal acked
            q.handlers.pop(reply["id"], None)
            acked += n
            if acked >= a.events:
                done.set()

        q.send("ack", {"subId": "bench", "batch": m["batch"]}, ok)

    t0 = time.perf_counter()
    q.send("openSubscription", {"subId": "bench"}, batch)
    await emit_all(p, "jobs.x", a.events, "x" * a.payload)
    await asyncio.wait_for(done.wait(), 300)
    rate: float = a.events / (time.perf_counter() - t0)
    p.close()
    q.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--store", default="sqlite", choices=["sqlite", "memory"])
    ap.add_argument("--payload", type=int, default=100)
    a = ap.parse_args()
    # An event's size for batch_bytes is its payload: the JSON string, quotes included. 1 makes one-event
    # batches; 100 x size, batches of 100 events once enough are pending.
    size = a.payload + 2
    runs: list[tuple[str, Any, list[str]]] = [
        ("emit", s_emit, []),
        ("listen x3", s_listen, []),
        ("durable b=1", s_durable, ["--qpubs-batch-bytes", "1"]),
        ("durable b=100", s_durable, ["--qpubs-batch-bytes", str(100 * size)]),
    ]
    for name, fn, extra in runs:
        with tempfile.TemporaryDirectory() as tmp:
            proc, port = serve(a.store, tmp, extra)
            try:
                rate = asyncio.run(fn(port, a))
            finally:
                proc.terminate()
                proc.wait(20)
        print(f"{a.store:7} {name:14} {rate:12,.0f} events/s")


if __name__ == "__main__":
    main()
