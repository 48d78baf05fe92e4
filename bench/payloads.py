"""Payloads of the benches: fixed sizes, or ``mixed`` sizes as a log of chat messages with the odd attachment.

``mixed`` draws each size from :data:`MIXED` (64 B to 32 KiB, 887 B on average; seeded, so every run builds
the same log). :func:`text_payloads` makes payloads that differ from one another and hold only base64
letters, so no marker a load driver counts (``proto.count_stream``) can occur inside one, in msgpack or JSON
(no quote, no byte above 0x7f).
"""

from __future__ import annotations

import base64
import random

__all__ = ["MIXED", "payload_sizes", "text_payloads"]

#: ``mixed`` payload sizes as (share, smallest, largest bytes), each drawn uniformly in its range; 887 bytes
#: on average.
MIXED = ((0.62, 64, 256), (0.25, 256, 1024), (0.10, 1024, 4096), (0.026, 4096, 16384), (0.004, 16384, 32768))


def payload_sizes(n: int, kind: str) -> list[int]:
    """``n`` payload sizes: ``fixed``, 100 bytes each; a number, that many bytes each; ``mixed``, drawn from
    :data:`MIXED` (seeded: every run builds the same log)."""
    if kind == "fixed":
        return [100] * n
    if kind != "mixed":
        return [int(kind)] * n
    rnd = random.Random(1)
    shares = [m[0] for m in MIXED]
    return [rnd.randint(lo, hi) for _, lo, hi in rnd.choices(MIXED, weights=shares, k=n)]


def text_payloads(n: int, kind: str) -> list[bytes]:
    """``n`` payloads of :func:`payload_sizes`, each a slice of 1 MiB of seeded random base64 text at a
    random place (so payloads differ, as real ones do)."""
    rnd = random.Random(2)
    blob = base64.b64encode(rnd.randbytes(3 << 18)) * 2  # 2 MiB: a slice of up to 32 KiB from its first half
    return [blob[(at := rnd.randrange(1 << 20)) : at + size] for size in payload_sizes(n, kind)]
