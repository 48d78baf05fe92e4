"""The durable-consumer service's figures for ``/metrics`` (docs/consumers.md "Monitoring"). Part of
:class:`~hubbub.core.ConsumerService`; loop thread only.

The counters live on each :class:`~.consumer_state.ConsumerState` and on the service's parts, bumped where
the work is done (a few integer increments per batch, ack or nack); this module only reads them at scrape
time. The journal backlog is the store's own count of unacknowledged items (``ConsumerInfo.pending``, read
once per scrape by :meth:`ConsumerMetrics.refresh`) less the items out with openers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from hubbub.auth import Identity
from hubbub.log.consumers import ConsumerInfo

from .consumer_delivery import Delivery
from .consumer_groups import LiveGroups
from .consumer_state import NS, ConsumerState
from .node import Node

__all__ = [
    "LABELLED_MAX",
    "OPENERS_FAMILY",
    "SUMMED_TOTALS",
    "TOTALS_FAMILY",
    "ConsumerFigures",
    "ConsumerMetrics",
    "ConsumerTotals",
]

#: At most this many consumers get series of their own (the first by name); the totals count them all.
LABELLED_MAX: Final = 1000


@dataclass(frozen=True, slots=True)
class ConsumerFigures:
    """One consumer's figures. ``pending``: journal items not out with an opener (in memory or still in the
    store); ``outstanding``: items delivered and not yet acknowledged or given back; ``oldest_unacked_s``:
    the age (since its commit) of the oldest unacknowledged item this node holds, pending or outstanding
    (0: none). Counters since this node took the consumer up."""

    name: str
    pending: int
    outstanding: int
    openers: int
    batches: int
    acked: int
    nacked: int
    redelivered: int
    oldest_unacked_s: float
    #: When this node last stored an acknowledgement (``time.time_ns()``; 0: never since it took it up).
    last_ack_ns: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerTotals:
    """Every consumer's and live group's figures together (the counters are the service's own)."""

    consumers: int
    pending: int
    outstanding: int
    openers: int
    batches: int
    acked: int
    nacked: int
    redelivered: int
    groups: int
    group_members: int
    group_events: int


#: The fields of :class:`ConsumerTotals` that add up across a node's worker processes (each counts its own
#: deliveries and openers; the consumers and their backlog are the shared log's, the same in every worker).
SUMMED_TOTALS = ("openers", "batches", "acked", "nacked", "redelivered", "group_events")
#: Their family in the node's figures (``NodeMetrics.add``): the counters, and the openers (a gauge).
TOTALS_FAMILY = "consumers"
OPENERS_FAMILY = "consumer_openers"


class ConsumerMetrics:
    """Reads the service's state; ``by_name`` is the service's own map (shared, not copied)."""

    def __init__(self, node: Node, by_name: dict[str, ConsumerState], delivery: Delivery, groups: LiveGroups):
        self._node = node
        self._by_name = by_name
        self._delivery = delivery
        self._groups = groups
        # Each scrape sums them across the node's workers.
        node.metrics.add(TOTALS_FAMILY, self.summed)
        node.metrics.add(OPENERS_FAMILY, lambda: {"openers": self.totals().openers}, gauge=True)

    def summed(self) -> dict[str, float]:
        """This process's counters that add up across the node's workers (:data:`SUMMED_TOTALS`)."""
        totals = self.totals()
        return {field: getattr(totals, field) for field in SUMMED_TOTALS if field != "openers"}

    async def refresh(self) -> None:
        """Read every consumer's unacknowledged count from the store (one read; ``HubbubError`` when the log
        is away, and the figures keep the last count read)."""
        infos: list[ConsumerInfo] = await self._node._reads.call_journal(lambda st: st.consumers())
        by_name = self._by_name
        for info in infos:
            c = by_name.get(info.spec.name)
            if c is not None and c.id == info.id:
                c.stored_pending = info.pending

    def shown_to(self, identity: Identity | None) -> bool:
        """Whether ``identity`` may see each consumer's own figures, which name every consumer (and so what
        its name tells of its channels and users): an admin, or anyone with auth off. Others see the
        totals only."""
        return self._node.access.may_admin(identity)

    def consumers(self, limit: int = LABELLED_MAX, after: str = "") -> Iterator[ConsumerFigures]:
        """The figures of the first ``limit`` consumers by name (those named after ``after``)."""
        now_ns = time.time_ns()
        names = sorted(n for n in self._by_name if n > after) if after else sorted(self._by_name)
        for name in names[:limit]:
            yield figures(self._by_name[name], now_ns)

    def figures(self, name: str) -> ConsumerFigures | None:
        """One consumer's figures, None when this node does not know it."""
        c = self._by_name.get(name)
        return None if c is None else figures(c, time.time_ns())

    def totals(self) -> ConsumerTotals:
        pending = outstanding = openers = 0
        for c in self._by_name.values():
            out = _outstanding(c)
            pending += _pending(c, out)
            outstanding += out
            openers += len(c.openers)
        d = self._delivery
        return ConsumerTotals(
            consumers=len(self._by_name),
            pending=pending,
            outstanding=outstanding,
            openers=openers,
            batches=d.batches,
            acked=d.acked,
            nacked=d.nacked,
            redelivered=d.redelivered,
            groups=len(self._groups),
            group_members=self._groups.members,
            group_events=self._groups.delivered,
        )


def figures(c: ConsumerState, now_ns: int) -> ConsumerFigures:
    out = _outstanding(c)
    return ConsumerFigures(
        name=c.spec.name,
        pending=_pending(c, out),
        outstanding=out,
        openers=len(c.openers),
        batches=c.batches,
        acked=c.acked,
        nacked=c.nacked,
        redelivered=c.redelivered,
        oldest_unacked_s=_oldest_age(c, now_ns),
        last_ack_ns=c.last_ack_ns,
    )


def _outstanding(c: ConsumerState) -> int:
    return sum(len(o.positions) for o in c.outstanding.values())


def _pending(c: ConsumerState, outstanding: int) -> int:
    if c.stored_pending >= 0:
        return max(c.stored_pending - outstanding, 0)
    # Not read from the store yet: what this node holds.
    return c.ready_count + sum(1 for _, pos in c.delayed if pos in c.items)


def _oldest_age(c: ConsumerState, now_ns: int) -> float:
    """Items enter memory in journal order, so the lowest position held is the oldest unacknowledged one."""
    items = c.items
    first = c.next_ready()
    lowest = [] if first is None else [first]
    lowest.extend(min(o.positions) for o in c.outstanding.values() if o.positions)
    lowest.extend(pos for _, pos in c.delayed if pos in items)
    held = [p for p in lowest if p in items]
    if not held:
        return 0.0
    return max(now_ns - items[min(held)].event.time_ns, 0) / NS
