"""The seam between a node and a cluster relay (:mod:`hubbub.cluster`).

A node with a relay (``Node.relay``) does not fan out its own commits: after the acks, it hands the committed
events to :meth:`Relay.committed`, and the relay calls :meth:`Node.fan_out` for them and for other nodes'
events, in the order it chooses (per-channel seq order). The node knows nothing else of clusters.

A relay that can tell when it has every event committed before a moment (a worker's: ``workers/relay.py``)
is also a :class:`SubscribeBarrier`: the node awaits its :meth:`~SubscribeBarrier.barrier` before it
registers a subscription, so that no event acknowledged before the subscribe arrives at it live, as on one
process (which fans out at commit, before the ack). Without one (a single process, a cluster's Redis relay),
a subscription is registered at once.

Concurrency contract: every method is called on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from hubbub.events import Event
from hubbub.log.base import AppendResult

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Relay", "SubscribeBarrier", "committed_events"]


class Relay(Protocol):
    def committed(self, events: Sequence[tuple[Session | None, Event]]) -> None:
        """A commit's new events (duplicates left out) with their origin sessions, in commit order."""

    def health(self) -> dict[str, Any]:
        """The relay's state for ``/healthz`` (``state``: ``up``, or ``down`` while it serves degraded); empty
        for a relay that is no part of a cluster (a worker's: the node answers as one process)."""

    def statistics(self) -> dict[str, int | float]:
        """Numbers for ``/metrics``."""


@runtime_checkable
class SubscribeBarrier(Protocol):
    async def barrier(self) -> None:
        """Return once every event committed (by any process) before the call has been offered to the
        relay's delivery, so that those not held by a gap are fanned out to the subscriptions made before."""


def committed_events(
    items: Sequence[tuple[Session | None, Any, Any]],
    results: Sequence[AppendResult],
    published: dict[str, int],
) -> list[tuple[Session | None, Event]]:
    """The new events of a commit (its pending items and results) with their origins, counted per dialect
    into ``published``, as the node's own fan-out counts them."""
    out: list[tuple[Session | None, Event]] = []
    for (origin, _done, _t0), r in zip(items, results, strict=True):
        if r.duplicate:
            continue
        ev = r.event
        d = ev.publisher.dialect
        published[d] = published.get(d, 0) + 1
        out.append((origin, ev))
    return out
