"""The cost of encoding a durable consumer's ``deliver`` frame, per item: ``deliver_frame`` (a template per
event shape) against the per-item rule it replaced (``pos``, ``attempts``, then the event frame's body), in
the same process, alternating.

PYTHONPATH=src python bench/deliver_encode.py [--batch 100] [--payload 100] [--reps 7] [--channels 1]

Events are what a store read gives (each with its own, equal ``Publisher``) or what the live path gives (one
shared ``Publisher``). The figure is the best of ``--reps`` timings, in µs per item.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import orjson

from hubbub.dialects.native_common import MSGPACK_BODY_PAIRS, Encoding, event_body_json, event_body_msgpack
from hubbub.dialects.native_deliver import deliver_frame
from hubbub.events import Event, Publisher
from hubbub.log.consumers import JournalItem

_MP_ITEM_HEAD = bytes([0x80 | (MSGPACK_BODY_PAIRS + 2)]) + msgpack.packb("pos")
_MP_ATTEMPTS = msgpack.packb("attempts")
_MP_DELIVER = b"\x84" + b"".join(msgpack.packb(x) for x in ("op", "deliver", "consumer"))


def per_item_rule(encoding: Encoding, consumer: str, batch: int, items: Sequence[Any]) -> bytes:
    """The encoder before the templates (tests/unit/test_native_deliver.py keeps the same rule)."""
    if encoding == "json":
        parts = [b'{"op":"deliver","consumer":', orjson.dumps(consumer), b',"batch":%d,"items":[' % batch]
        for i, it in enumerate(items):
            parts.append(b'%s{"pos":%d,"attempts":%d' % (b"," if i else b"", it.pos, it.attempts))
            parts.append(event_body_json(it.event))
            parts.append(b"}")
        parts.append(b"]}")
        return b"".join(parts)
    pack = msgpack.Packer(use_bin_type=True)
    out = [_MP_DELIVER, pack.pack(consumer), pack.pack("batch"), pack.pack(batch), pack.pack("items")]
    out.append(pack.pack_array_header(len(items)))
    for it in items:
        out += [_MP_ITEM_HEAD, pack.pack(it.pos), _MP_ATTEMPTS, pack.pack(it.attempts)]
        out.append(event_body_msgpack(it.event))
    return b"".join(out)


def batch_of(n: int, payload: int, shared: bool, channels: int = 1) -> list[JournalItem]:
    pub = Publisher("native", "bench", "s1")
    return [
        JournalItem(
            i + 1,
            Event(
                f"/bench/c{i % channels}",
                i + 1,
                "k3j2a9x1",
                1795313749574424198 + i,
                pub if shared else Publisher("native", "bench", "s1"),
                b"x" * payload,
                "application/octet-stream",
            ),
        )
        for i in range(n)
    ]


def _per_item(
    f: Callable[[Encoding, str, int, Sequence[Any]], bytes], enc: Encoding, items: list[Any], n: int
) -> float:
    """µs per item of ``n`` calls."""
    return timeit.timeit(lambda: f(enc, "bench", 7, items), number=n) / n / len(items) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--channels", type=int, default=1, help="the batch's events round-robin over N channels")
    a = ap.parse_args()
    encoders: dict[str, Callable[[Encoding, str, int, Sequence[Any]], bytes]] = {
        "per-item rule": per_item_rule,
        "deliver_frame": deliver_frame,
    }
    for shared in (False, True):
        items = batch_of(a.batch, a.payload, shared, a.channels)
        for enc in ("msgpack", "json"):
            assert per_item_rule(enc, "bench", 7, items) == deliver_frame(enc, "bench", 7, items)
            n = max(200_000 // a.batch, 1)
            best: dict[str, float] = {}
            for _ in range(a.reps):
                for name, f in encoders.items():
                    t = _per_item(f, enc, items, n)
                    best[name] = min(best.get(name, t), t)
            what = "one shared publisher" if shared else "a publisher per event (store reads)"
            print(
                f"batch {a.batch} {enc:7} {what:36}: per-item rule {best['per-item rule']:.2f} µs/item,"
                f" deliver_frame {best['deliver_frame']:.2f} µs/item"
            )


if __name__ == "__main__":
    main()
