"""The node's recent traffic for the dashboard (docs/dashboard.md): events in and out per second and open
connections, sampled server-side into a bounded ring, so a page that opens has the last 15 minutes at once.

:class:`TrafficHistory` reads the node's counters (``Node.metrics``: what ``/metrics`` exports, nothing
counted twice) every :data:`SAMPLE_S` seconds and keeps the last :data:`HISTORY_SAMPLES` samples: each is
``(time, in/s, out/s, connections)``, the rates from the difference of the counters since the sample before.
A sample costs a sum over a few per-dialect counters and one pass over the attached sessions' dialects.

Concurrency contract: event loop thread only; :meth:`TrafficHistory.start` once, :meth:`close` to stop. The
sampling loop belongs to a :class:`~hubbub.core.api.Supervisor` of the node's supervision (restarted with
backoff if it fails).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, final

from hubbub.core.api import Core, Policy, Supervisor

__all__ = ["HISTORY_SAMPLES", "SAMPLE_S", "Sample", "TrafficHistory"]

#: Seconds between two samples.
SAMPLE_S: Final = 2.0
#: Samples kept: 15 minutes of them.
HISTORY_SAMPLES: Final = int(15 * 60 / SAMPLE_S)


@dataclass(frozen=True, slots=True)
class Sample:
    """One point of the history: Unix time (seconds), events committed and events delivered per second
    since the sample before, connections open."""

    time: float
    events_in: float
    events_out: float
    connections: int


@final
class TrafficHistory:
    """The ring of :class:`Sample` (see the module docstring)."""

    def __init__(self, node: Core, interval_s: float = SAMPLE_S, samples: int = HISTORY_SAMPLES) -> None:
        self._node = node
        self.interval_s = interval_s
        self.samples: deque[Sample] = deque(maxlen=samples)
        self._last: tuple[float, int, int] | None = None
        self._tasks = Supervisor("dashboard", node.supervision)

    async def __aenter__(self) -> TrafficHistory:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        self.sample()  # the base of the first rates
        self._tasks.open()
        self._tasks.run("traffic-history", self._run, Policy.RESTART)

    async def close(self) -> None:
        await self._tasks.aclose()

    def totals(self) -> tuple[int, int]:
        """Events committed and events delivered since the node started, every dialect's."""
        m = self._node.metrics
        return sum(m.published.values()), sum(m.deliveries.values())

    def sample(self) -> Sample | None:
        """Take one sample now (None for the first: rates need a sample before)."""
        now = time.monotonic()
        published, delivered = self.totals()
        last, self._last = self._last, (now, published, delivered)
        if last is None or now <= last[0]:
            return None
        dt = now - last[0]
        s = Sample(
            time.time(),
            (published - last[1]) / dt,
            (delivered - last[2]) / dt,
            len(self._node.sessions),
        )
        self.samples.append(s)
        return s

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.sample()
