"""The node's counters (:class:`NodeMetrics`, exported on ``/metrics`` by the transports) and a histogram.

On a node of several worker processes the figures that add up across processes are the node's: each scrape
asks the other workers for theirs (:meth:`NodeMetrics.ask_peers`, a question through the node's notices,
answered from the counters as they stand: nothing is counted or sent on the hot path) and
:meth:`NodeMetrics.node_figures` sums them with this process's (``core/peer_figures.py``, which also keeps
the counters of a worker gone, so that the node's counters never fall). Those are the families of
:meth:`NodeMetrics.figures`: the open connections and subscriptions, every counter (events published and
delivered, dropped, bad input, closes, failures, the ack latency histogram's buckets) and what components
add (:meth:`NodeMetrics.add`: the refusals of the limits and of authentication, the token timers, the
durable consumers' deliveries and openers, guble's subscriptions). The log's figures are read from the
shared log by each process and need no sum.

Concurrency contract: called from the event loop thread only; the log's counts are read on a reader thread
(:meth:`NodeMetrics.read_log`).
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from hubbub.log.base import StoreStats

from .peer_figures import FIGURES_TOPIC, Figures, PeerFigures, add_figures, label_key, labels_of

if TYPE_CHECKING:
    from .notices import Notices
    from .session import Session

__all__ = ["FIGURES_TOPIC", "Figures", "Histogram", "NodeMetrics", "label_key", "labels_of"]

#: The families of :meth:`NodeMetrics.figures` that count things now (the others count since the start).
_GAUGES = ("connections", "subscriptions")


class NodeMetrics:
    """Every counter of the node, in one object: what ``/metrics`` (and guble's admin metrics) read at scrape
    time. Counts per dialect (failures: per component), that never go down. The parts that count (publishes
    in the subscription registry, deliveries in the fan-out, internal closes in the faults, the ack latency in
    the batcher, failures in the supervision) count into their own dicts, which this object holds by
    reference: counting costs no extra call. The transports count what they see (bad input, socket
    failures, write timeouts) through the ``count_*`` methods.

    Concurrency contract: called from the event loop thread only."""

    __slots__ = (
        "_added",
        "_dropped",
        "_gauges",
        "_log",
        "_log_stats",
        "_peers",
        "_sessions",
        "_subscriptions",
        "ack_latency",
        "bad_input",
        "before_scrape",
        "component_failures",
        "deliveries",
        "internal_closes",
        "io_errors",
        "published",
        "slow_closes",
        "write_timeouts",
    )

    def __init__(
        self,
        published: dict[str, int],
        deliveries: dict[str, int],
        internal_closes: dict[str, int],
        ack_latency: Histogram,
        component_failures: dict[str, int],
        dropped: Callable[[], dict[str, int]],
        sessions: Callable[[], Iterable[Session]],
        subscriptions: Callable[[], int],
        log: Callable[[], Awaitable[StoreStats]],
    ) -> None:
        #: Events published (committed), per publisher's dialect.
        self.published = published
        #: Events delivered to connections (each copy counted).
        self.deliveries = deliveries
        #: Connections closed because serving them raised (core/faults.py).
        self.internal_closes = internal_closes
        #: Time from publish to acknowledgement.
        self.ack_latency = ack_latency
        #: Failures of a component's background tasks (core/supervisor.py ``Supervision.failures``).
        self.component_failures = component_failures
        self._dropped = dropped
        self._sessions = sessions
        self._subscriptions = subscriptions
        self._log = log
        self._log_stats = StoreStats(events=0, bytes=0, channels=0, retired_epochs=0)
        #: Bad input seen (each answered with the dialect's error, or a close).
        self.bad_input: dict[str, int] = {}
        #: Connections closed as slow consumers.
        self.slow_closes: dict[str, int] = {}
        #: Unexpected socket failures the transports met (each logged at warning).
        self.io_errors: dict[str, int] = {}
        #: Connections aborted because the peer read nothing for the write timeout.
        self.write_timeouts: dict[str, int] = {}
        #: Reads a component makes before each scrape, for numbers kept in the log (:meth:`refresh`).
        self.before_scrape: list[Callable[[], Awaitable[None]]] = []
        #: Families that components add to :meth:`figures` (:meth:`add`), and those of them that are gauges.
        self._added: dict[str, Callable[[], Mapping[str, float]]] = {}
        self._gauges = frozenset(_GAUGES)
        #: The other worker processes' figures (core/peer_figures.py).
        self._peers = PeerFigures(self.figures, lambda: self._gauges)

    def share(self, notices: Notices) -> None:
        """Answer the node's other processes' question for this one's :meth:`figures` (they ask at each
        scrape), and ask theirs in :meth:`ask_peers`."""
        self._peers.share(notices)

    def add(
        self, family: str, figures: Callable[[], Mapping[str, float]], *, gauge: bool = False
    ) -> Callable[[], None]:
        """Add a family of figures that add up across the node's processes, read at each scrape:
        ``figures()`` maps a :func:`label_key` to its value. Counters (since the process started) by
        default; ``gauge``: counts of this process's things now (not kept for a worker gone). Returns the
        removal."""
        self._added[family] = figures
        if gauge:
            self._gauges |= {family}

        def remove() -> None:
            if self._added.get(family) is figures:
                del self._added[family]

        return remove

    def figures(self) -> Figures:
        """This process's figures that add up across the node's processes (see the module docstring)."""
        h = self.ack_latency
        out: Figures = {
            "connections": dict(self.connections()),
            "subscriptions": {"": self.subscriptions()},
            "published": dict(self.published),
            "deliveries": dict(self.deliveries),
            "dropped": dict(self.dropped()),
            "bad_input": dict(self.bad_input),
            "slow_closes": dict(self.slow_closes),
            "io_errors": dict(self.io_errors),
            "write_timeouts": dict(self.write_timeouts),
            "internal_closes": dict(self.internal_closes),
            "component_failures": dict(self.component_failures),
            "ack_latency": {
                **{str(i): n for i, n in enumerate(h.counts)},
                "sum": h.sum,
                "count": h.count,
            },
        }
        for family, fn in self._added.items():
            out[family] = dict(fn())
        return out

    async def refresh(self) -> None:
        """Run every :attr:`before_scrape` read and :meth:`ask_peers` (``/metrics`` awaits it before
        rendering)."""
        for fn in list(self.before_scrape):
            await fn()
        await self.ask_peers()

    async def ask_peers(self) -> None:
        """Ask the node's other processes (workers) for their :meth:`figures`, for :meth:`node_figures`
        (nothing on a single process; a worker that does not answer within a second counts nothing in this
        scrape)."""
        await self._peers.ask()

    def node_figures(self) -> Figures:
        """:meth:`figures` on the whole node: this process's now, plus the other workers' as
        :meth:`ask_peers` last heard them and the last counters of workers gone (core/peer_figures.py; this
        process's alone on a single process)."""
        out = self.figures()
        add_figures(out, self._peers.summed())
        return out

    def peers(self, family: str) -> dict[str, float]:
        """Family ``family`` of the other workers' figures, as :meth:`node_figures` adds them."""
        return self._peers.summed().get(family, {})

    def node_connections(self) -> dict[str, int]:
        """Open connections per dialect on the whole node (as :meth:`node_figures`)."""
        out = self.connections()
        for d, n in self._peers.live("connections").items():
            out[d] = out.get(d, 0) + int(n)
        return out

    def dropped(self) -> dict[str, int]:
        """Events dropped by the sessions' overflow policy since the node started."""
        return self._dropped()

    def connections(self) -> dict[str, int]:
        """Open connections (attached sessions), per dialect."""
        out: dict[str, int] = {}
        for s in self._sessions():
            out[s.dialect] = out.get(s.dialect, 0) + 1
        return out

    def subscriptions(self) -> int:
        """Subscriptions in the router now, every dialect's."""
        return self._subscriptions()

    async def read_log(self) -> StoreStats:
        """Read the log's retained events, bytes and channels (``LogStore.stats``) on a reader thread, and
        keep them for :meth:`log`. Never on the loop: the store sums its channels' rows (a few ms with 10,000
        channels on SQLite, a round trip to PostgreSQL, a call to the parent with workers). Raises the store's
        ``StorageError``, the kept counts unchanged."""
        self._log_stats = await self._log()
        return self._log_stats

    def log(self) -> StoreStats:
        """The log's counts as :meth:`read_log` last read them (zeros before the first read)."""
        return self._log_stats

    def count_bad_input(self, dialect: str) -> None:
        self.bad_input[dialect] = self.bad_input.get(dialect, 0) + 1

    def count_slow_close(self, dialect: str) -> None:
        self.slow_closes[dialect] = self.slow_closes.get(dialect, 0) + 1

    def count_io_error(self, dialect: str) -> None:
        self.io_errors[dialect] = self.io_errors.get(dialect, 0) + 1

    def count_write_timeout(self, dialect: str) -> None:
        self.write_timeouts[dialect] = self.write_timeouts.get(dialect, 0) + 1


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
