"""Small statistics helpers of the core (exported on ``/metrics`` by the transports).

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["DialectCounters", "Histogram"]


class DialectCounters:
    """What happened to connections, per dialect: counters (they never go down) that ``/metrics`` exports."""

    __slots__ = ("bad_input", "io_errors", "slow_closes", "write_timeouts")

    def __init__(self) -> None:
        self.bad_input: dict[str, int] = {}
        #: Connections closed as slow consumers.
        self.slow_closes: dict[str, int] = {}
        #: Unexpected socket failures the transports met (each logged at warning).
        self.io_errors: dict[str, int] = {}
        #: Connections aborted because the peer read nothing for the write timeout.
        self.write_timeouts: dict[str, int] = {}

    def count_bad_input(self, dialect: str) -> None:
        self.bad_input[dialect] = self.bad_input.get(dialect, 0) + 1

    def count_slow_close(self, dialect: str) -> None:
        self.slow_closes[dialect] = self.slow_closes.get(dialect, 0) + 1


class Histogram:
    """A fixed-bucket histogram (cumulative on export)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        """Record ``n`` observations of ``v``."""
        self.sum += v * n
        self.count += n
        self.counts[bisect.bisect_left(self.buckets, v)] += n
