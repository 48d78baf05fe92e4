"""The seam between a node and a cluster relay (:mod:`hubbub.cluster`).

A node with a relay (``Node.relay``) does not fan out its own commits: after the acks, it hands the committed
events to :meth:`Relay.committed`, and the relay calls :meth:`Node.fan_out` for them and for other nodes'
events, in the order it chooses (per-channel seq order). The node knows nothing else of clusters.

Concurrency contract: every method is called on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hubbub.events import Event
from hubbub.log.base import AppendResult

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Relay", "committed_events"]


class Relay(Protocol):
    def committed(self, events: Sequence[tuple[Session | None, Event]]) -> None:
        """A commit's new events (duplicates left out) with their origin sessions, in commit order."""

    def health(self) -> dict[str, Any]:
        """The relay's state for ``/healthz`` (``state``: ``up``, or ``down`` while it serves degraded); empty
        for a relay that is no part of a cluster (a worker's: the node answers as one process)."""

    def statistics(self) -> dict[str, int | float]:
        """Numbers for ``/metrics``."""


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
