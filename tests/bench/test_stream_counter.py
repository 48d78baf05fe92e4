"""The bench driver's delivery count (bench/proto.py ``StreamCounter``): every marker in a socket's stream is
counted exactly once, wherever the reads split it, with the read buffer shared between connections."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from proto import StreamCounter

MARKER = b"\xa2op\xa5event"
#: Markers whole, one split by every possible read boundary, and bytes that begin a marker and stop.
STREAM = b"".join(b"<%d>" % i + MARKER + b"x" * (i % 5) + MARKER[: i % len(MARKER)] for i in range(200))


def _count_through(stream: bytes, first: int, size: int, counters: int = 1) -> list[int]:
    """Each of ``counters`` sockets sends ``stream`` (its first ``first`` bytes handed over as already read)
    to a counter; the counters share one buffer of ``size`` bytes, which bounds every read."""
    buf = bytearray(size)
    got = []
    for _ in range(counters):
        a, b = socket.socketpair()
        with a, b:
            counter = StreamCounter(MARKER, buf)
            n = counter.feed(stream[:first])
            a.sendall(stream[first:])
            a.shutdown(socket.SHUT_WR)
            while (k := counter.recv(b)) >= 0:
                n += k
            got.append(n)
    return got


def test_every_marker_counts_once_wherever_the_reads_split_it() -> None:
    want = STREAM.count(MARKER)
    assert want == 200
    for size in (len(MARKER), len(MARKER) + 1, 17, 64, 1 << 16):
        for first in (0, 1, len(MARKER) - 1, 100):
            assert _count_through(STREAM, first, size) == [want], (size, first)


def test_counters_sharing_a_buffer_count_their_own_streams() -> None:
    assert _count_through(STREAM, 5, 23, counters=3) == [200, 200, 200]
    # A stream that ends inside a marker counts only the whole ones.
    assert _count_through(MARKER * 3 + MARKER[:-1], 0, 11) == [3]
