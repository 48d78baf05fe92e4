"""Small statistics helpers of the core (exported on ``/metrics`` by the transports).

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["Histogram"]


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
