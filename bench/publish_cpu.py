"""Server CPU per event of persistent publishing (SQLite, ``durability=commit``), one server per source tree.

For each ``--payload`` (bytes, or ``mixed``: sizes drawn from ``payloads.MIXED``, one publisher's frames
cycling through 256 of them) it measures acked publishes (no subscriber) and end to end (one subscriber),
native TCP msgpack (or each ``--kind`` of client: ``hubbub-json``, JSON lines over TCP; ``hubbub-ws`` and
``hubbub-wsjson``, msgpack and JSON over WebSocket, what a browser speaks), ``--events`` publishes with a
window of 4,000 unacknowledged, over ``--rounds`` rounds (``--modes ack`` or ``e2e`` for one of the two;
``--subs`` subscribers end to end, the figure then per delivery).
Every ``--src`` tree's server runs for the whole bench, and each measurement alternates between them (the
order flips each round), so a shared machine's load and a server's start fall on every tree alike; the
figure is the server's CPU over the measurement per event delivered (steadier than the rate)::

    PYTHONPATH=src python bench/publish_cpu.py --payload 16 --payload 100 --payload mixed --rounds 6 \
        --src /tmp/main/src --src src
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import scenarios as sc
from payloads import payload_sizes
from procs import start

_SIZES: dict[str, list[int]] = {}
_plain_frames = sc.pub_frames


def _frames(spec: Any, subject: str, payload: bytes, n: int, ack: bool) -> bytes:
    """``sc.pub_frames``, but an empty payload stands for ``mixed``: ``n`` frames of the mixed sizes."""
    if payload:
        return _plain_frames(spec, subject, payload, n, ack)
    sizes = _SIZES["mixed"]
    return b"".join(_plain_frames(spec, subject, b"x" * sizes[i % len(sizes)], 1, ack) for i in range(n))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--payload", action="append", help="bytes or mixed (repeatable; default 16, 100, mixed)")
    p.add_argument("--src", action="append", help="a source tree to run a server from (repeatable)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--events", type=int, default=40_000)
    p.add_argument("--duration", type=float, default=3.0, help="most seconds per measurement")
    p.add_argument(
        "--kind",
        action="append",
        choices=("hubbub", "hubbub-json", "hubbub-ws", "hubbub-wsjson"),
        help="client kind (repeatable; default hubbub: native TCP msgpack; hubbub-wsjson: WebSocket JSON)",
    )
    p.add_argument("--modes", default="ack,e2e", help="ack, e2e or both (comma-separated)")
    p.add_argument("--subs", type=int, default=1, help="subscribers end to end (per delivery)")
    a = p.parse_args()
    kinds: list[str] = a.kind or ["hubbub"]
    modes = a.modes.split(",")
    payloads = a.payload or ["16", "100", "mixed"]
    srcs: list[str | None] = [str(Path(x).resolve()) for x in a.src] if a.src else [None]
    _SIZES["mixed"] = payload_sizes(256, "mixed")
    sc.pub_frames = _frames  # the publishers are forked: they build their frames with this
    cpu: dict[tuple[str, str, str, str | None], list[float]] = {}
    with ExitStack() as stack:
        servers = {src: stack.enter_context(start("hubbub-commit", src=src)) for src in srcs}
        for r in range(a.rounds):
            order = srcs if r % 2 == 0 else srcs[::-1]
            for payload in payloads:
                size = 0 if payload == "mixed" else int(payload)
                for kind, client in ((m, k) for m in modes for k in kinds):
                    for src in order:
                        srv = servers[src]
                        spec = srv.specs[client]
                        res = sc.throughput(
                            srv,
                            spec,
                            spec if kind == "e2e" else None,
                            f"{kind}{payload}r{r}",
                            size,
                            a.events,
                            subs=a.subs if kind == "e2e" else 0,
                            ack=True,
                            window=4000,
                            duration=a.duration,
                        )
                        n = res.extra["count"]
                        us = res.server_cpu_s / n * 1e6 if n else float("nan")
                        cpu.setdefault((payload, kind, client, src), []).append(us)
                        print(
                            f"round {r + 1} {payload} B {kind} {client} {src or 'src'}: {us:.2f} µs/event",
                            file=sys.stderr,
                        )
    for payload in payloads:
        for kind, client in ((m, k) for m in modes for k in kinds):
            line = [f"{payload} B {kind} {client}:"]
            for src in srcs:
                xs = cpu[(payload, kind, client, src)]
                line.append(f"{src or 'src'} median {statistics.median(xs):.2f} (min {min(xs):.2f})")
            print("  ".join(line))


if __name__ == "__main__":
    main()
