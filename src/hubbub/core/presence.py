"""Presence: who is connected where, for the rosters dialects show (guble's ``/api/subscribers``, mist
``who``).

A **roster** is a named set of members (``guble:/foo`` for guble's receivers on ``/foo``); each member has a
key unique in its roster across the cluster (a connection id, say), a few string fields the roster shows, and
the time it joined, which orders it (oldest first). A **counter** is a named number each node adds to (mist's
"connections accepted since start"); its total is the sum over the live nodes.

The node always has a presence (``Node.presence``): :class:`LocalPresence` on one node, which answers from
memory; on a cluster node the composition root replaces it with the Redis one (``hubbub.cluster.presence``),
which answers for the whole cluster: every node keeps its own members in Redis under keys that expire unless
its heartbeat refreshes them, so a dead node's members disappear after the TTL. Transports use only this
interface, so they work the same on one node and on many.

Concurrency contract: every method is called on the event loop. :meth:`Presence.join`, :meth:`Presence.leave`
and :meth:`Presence.add` never block (a cluster presence writes them to Redis in the background);
:meth:`Presence.members`, :meth:`Presence.count` and :meth:`Presence.total` are coroutines (a cluster presence
reads Redis, bounded in time, and answers with this node's own members alone while Redis is away).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["LocalPresence", "Member", "Presence"]


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a roster. ``node``: the id of the node holding it ("" on a single node); ``since_ns``
    (wall clock) and ``n`` (a per-node counter, for ties) order the roster, oldest first."""

    key: str
    fields: Mapping[str, str]
    since_ns: int
    node: str = ""
    n: int = 0

    @property
    def order(self) -> tuple[int, str, int]:
        return (self.since_ns, self.node, self.n)


class Presence(Protocol):
    def join(self, roster: str, key: str, fields: Mapping[str, str]) -> None:
        """Add ``key`` to ``roster`` with ``fields``; joining again updates the fields and keeps its place."""

    def leave(self, roster: str, key: str) -> None:
        """Remove ``key`` from ``roster`` (nothing when it is not there)."""

    def add(self, counter: str, n: int = 1) -> None:
        """Add ``n`` to this node's part of ``counter``."""

    async def members(self, roster: str) -> list[Member]:
        """Every member of ``roster``, oldest first."""

    async def count(self, roster: str) -> int:
        """How many members ``roster`` has."""

    async def total(self, counter: str) -> int:
        """``counter`` summed over the live nodes."""

    async def nodes(self) -> list[str]:
        """The ids of the live nodes, this one included, sorted (empty on a single node)."""

    def statistics(self) -> dict[str, int | float]:
        """Numbers for ``/metrics`` (``hubbub_presence_<name>``)."""

    def health(self) -> dict[str, str]:
        """For ``/healthz``: ``state`` is ``local`` (one node), ``up`` or ``down`` (Redis away: rosters show
        this node's members only)."""


class LocalPresence:
    """This node's members and counters, in memory: the whole presence of a single node, and the part of a
    cluster presence that is this node's own (see the module docstring)."""

    def __init__(self, node: str = "") -> None:
        self.node = node
        self.rosters: dict[str, dict[str, Member]] = {}
        self.counters: dict[str, int] = {}
        self._n = itertools.count(1)

    def join(self, roster: str, key: str, fields: Mapping[str, str]) -> None:
        members = self.rosters.setdefault(roster, {})
        old = members.get(key)
        if old is not None:
            if old.fields != fields:
                members[key] = Member(key, dict(fields), old.since_ns, self.node, old.n)
            return
        members[key] = Member(key, dict(fields), time.time_ns(), self.node, next(self._n))

    def leave(self, roster: str, key: str) -> None:
        members = self.rosters.get(roster)
        if members is not None and members.pop(key, None) is not None and not members:
            del self.rosters[roster]

    def add(self, counter: str, n: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + n

    def local_members(self, roster: str) -> list[Member]:
        """This node's members of ``roster``, oldest first (synchronous)."""
        return sorted(self.rosters.get(roster, {}).values(), key=lambda m: m.order)

    async def members(self, roster: str) -> list[Member]:
        return self.local_members(roster)

    async def count(self, roster: str) -> int:
        return len(self.rosters.get(roster, ()))

    async def total(self, counter: str) -> int:
        return self.counters.get(counter, 0)

    async def nodes(self) -> list[str]:
        return [self.node] if self.node else []

    def statistics(self) -> dict[str, int | float]:
        return {"rosters": len(self.rosters), "members": sum(len(m) for m in self.rosters.values())}

    def health(self) -> dict[str, str]:
        return {"state": "local"}
