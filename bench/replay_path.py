"""CPU cost per event of a replay from the log, in process and without sockets.

Drives the real pieces (``NativeConnection``, ``Node.subscribe`` with its reader threads, the SQLite store,
the event encoding, the connection's write loop and batch frames) over a data dir prefilled by
``bench/replay_bench.py`` (opened read-only, so it is never changed), and counts the event frames the
connection would have written. Process CPU time per event is much steadier than a socket benchmark's rate on a
shared machine; ``bench/replay_bench.py`` remains the end-to-end measure.

    PYTHONPATH=src python bench/replay_path.py --events 1000000 --size 16 [--encoding json] [--batch off]
        [--start last|since|from_time] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_bench import CHANNEL, prefill

from hubbub.core import Node, NodeSettings
from hubbub.dialects import native as nc
from hubbub.log import RetentionPolicy, open_store
from hubbub.transports.native import NativeConnection


class Sink:
    """A connection's socket side: counts bytes and event frames written."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.bytes = 0
        self.events = 0
        self.done = asyncio.Event()
        self.want = 0

    async def send(self, data: bytes) -> None:
        self.bytes += len(data)
        self.events += data.count(self.marker)
        if self.events >= self.want:
            self.done.set()

    async def send_many(self, frames: list[bytes]) -> None:
        for f in frames:
            await self.send(f)

    async def close(self, code: int) -> None:
        self.done.set()


async def run(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    store = open_store("sqlite", str(data_dir), "commit", RetentionPolicy(), 600, readonly=True)
    codec = nc.NativeCodec(args.encoding)
    marker = b'"op":"event"' if args.encoding == "json" else b"\xa2op\xa5event"
    sink = Sink(marker)
    sink.want = args.events
    async with Node(store, NodeSettings()) as node:
        conn = NativeConnection(
            node,
            codec,
            send=sink.send,
            close=sink.close,
            send_many=sink.send_many,
            max_frame=1 << 20,
            max_subscriptions=1024,
            send_queue=65536,
            send_queue_bytes=256 << 20,
            ping_interval=3600.0,
        )
        conn.start()
        await conn.handle(nc.Hello(1, 1, None, "", True, args.batch == "on"))
        req: dict[str, Any] = {"op": "subscribe", "id": 2, "sub": "s", "pattern": CHANNEL}
        if args.start == "last":
            req["last"] = args.events
        elif args.start == "since":
            req["since"] = {"seq": 0, "epoch": ""}
        else:
            req["from_time"] = 1
        cmd = codec.decode_object(req)
        prof = cProfile.Profile() if args.profile else None
        c0, t0 = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        await conn.handle(cmd)
        await asyncio.wait_for(sink.done.wait(), 600)
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.profile)
        c1, t1 = time.process_time(), time.perf_counter()
        await conn.finish()
    return {
        "events": sink.events,
        "cpu_s_per_1m": round((c1 - c0) * 1e6 / max(sink.events, 1), 3),
        "events_per_s": round(sink.events / (t1 - t0)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--encoding", choices=("msgpack", "json"), default="msgpack")
    ap.add_argument("--batch", choices=("on", "off"), default="on")
    ap.add_argument("--start", choices=("last", "since", "from_time"), default="last")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop, as the server does")
    ap.add_argument("--profile", default="", help="write a cProfile of the (last) run here")
    ap.add_argument("--cache", default="/tmp/hubbub-replay-bench")
    args = ap.parse_args()
    data_dir = Path(args.cache) / f"{args.events}x{args.size}"
    if not data_dir.exists():
        prefill(data_dir, args.events, args.size)
    runs = []
    for _ in range(args.repeat):
        if args.uvloop:
            import uvloop

            runs.append(uvloop.run(run(args, data_dir)))
        else:
            runs.append(asyncio.run(run(args, data_dir)))
    out = dict(runs[-1])
    out["cpu_s_per_1m_all"] = sorted(r["cpu_s_per_1m"] for r in runs)
    out["cpu_s_per_1m_median"] = statistics.median(r["cpu_s_per_1m"] for r in runs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
