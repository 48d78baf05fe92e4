"""The node's recent traffic for the dashboard (docs/dashboard.md): events in and out per second and open
connections, sampled server-side into a bounded ring, so a page that opens has the last 15 minutes at once.

:class:`TrafficHistory` reads the node's counters (``Node.metrics``: what ``/metrics`` exports, nothing
counted twice) every :data:`SAMPLE_S` seconds and keeps the last :data:`HISTORY_SAMPLES` samples: each is
``(time, in/s, out/s, connections)``, the rates from the difference of the counters since the sample before.
A sample costs a sum over a few per-dialect counters and one pass over the attached sessions' dialects.

On a node of several worker processes each worker samples its own traffic; :meth:`TrafficHistory.node_samples`
asks the other workers for their rings (a question through the node's notices, :data:`HISTORY_TOPIC`, when
the overview is read) and adds to each of this worker's samples each other worker's sample nearest in time
(they sample at the same interval, at phases of their own), so the overview's rates and history are the
node's.

Concurrency contract: event loop thread only; :meth:`TrafficHistory.start` once, :meth:`close` to stop. The
sampling loop belongs to a :class:`~hubbub.core.api.Supervisor` of the node's supervision (restarted with
backoff if it fails).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from dataclasses import dataclass
from typing import Final, final

import msgpack

from hubbub.core.api import Core, Policy, Supervisor

__all__ = ["HISTORY_SAMPLES", "HISTORY_TOPIC", "SAMPLE_S", "Sample", "TrafficHistory", "add_nearest"]

#: The question for a worker's samples (answer: msgpack ``[[time, in/s, out/s, connections], ...]``).
HISTORY_TOPIC: Final = "admin.history"

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
        node.notices.answer(HISTORY_TOPIC, self._answer)

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

    def _answer(self, _: bytes) -> bytes:
        return bytes(
            msgpack.packb([[s.time, s.events_in, s.events_out, s.connections] for s in self.samples])
        )

    async def node_samples(self) -> list[Sample]:
        """The node's history: this worker's samples, each with the other workers' nearest in time added
        (this worker's alone on a single process, or for a worker that does not answer within a second)."""
        out = list(self.samples)
        for answer in await self._node.notices.ask(HISTORY_TOPIC):
            try:
                theirs = [
                    Sample(float(t), float(i), float(o), int(c)) for t, i, o, c in msgpack.unpackb(answer)
                ]
            except (ValueError, TypeError, msgpack.UnpackException):
                continue  # not an answer of ours
            out = add_nearest(out, theirs, self.interval_s)
        return out

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.sample()


def add_nearest(mine: list[Sample], theirs: list[Sample], interval_s: float) -> list[Sample]:
    """``mine``, each sample with the rates and connections of the sample of ``theirs`` nearest in time
    added, when one is within half of ``interval_s`` of it (both in time order, sampled at that interval:
    each of theirs is then near one of mine at most)."""
    times = [s.time for s in theirs]
    out: list[Sample] = []
    for s in mine:
        j = bisect.bisect_left(times, s.time)
        near = [k for k in (j - 1, j) if 0 <= k < len(theirs)]
        k = min(near, key=lambda k: abs(times[k] - s.time), default=None)
        if k is None or abs(times[k] - s.time) > interval_s / 2:
            out.append(s)
            continue
        t = theirs[k]
        out.append(
            Sample(
                s.time, s.events_in + t.events_in, s.events_out + t.events_out, s.connections + t.connections
            )
        )
    return out
