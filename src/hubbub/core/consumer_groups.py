"""Live exclusive groups (qpubs ``listenExclusive``): members with the same group name and filter share a
group; each matching event goes to exactly one member, round-robin in join order, at most once, and never to a
group without members. Live only: nothing is stored. Part of :class:`~hubbub.core.ConsumerService`; loop
thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from hubbub.events import Event
from hubbub.log.consumers import ConsumerSpec, JournalIndex

__all__ = ["GroupMember", "LiveGroups"]

log = logging.getLogger("hubbub.consumers")


class GroupMember:
    """One member of a live exclusive group (:meth:`ConsumerService.join`)."""

    def __init__(self, groups: LiveGroups, group: _Group, deliver: Callable[[Event], None]) -> None:
        self._groups = groups
        self._group = group
        self.deliver = deliver
        self.left = False

    def leave(self) -> None:
        """Leave the group. Idempotent."""
        self._groups.leave(self)


@dataclass(eq=False, slots=True)
class _Group:
    id: int
    key: tuple[str, str, str, str]
    members: list[GroupMember] = field(default_factory=list)
    rr: int = 0


class LiveGroups:
    """Every live group, indexed by filter."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str, str, str], _Group] = {}
        self._by_id: dict[int, _Group] = {}
        self.index = JournalIndex()
        self._next = 1

    def __len__(self) -> int:
        return len(self._groups)

    def join(
        self, group: str, pattern: str, deliver: Callable[[Event], None], *, syntax: str, separator: str
    ) -> GroupMember:
        key = (group, syntax, separator, pattern)
        g = self._groups.get(key)
        if g is None:
            spec = ConsumerSpec(f"group-{self._next}", pattern, syntax=syntax, separator=separator)
            self.index.add(self._next, spec)
            g = self._groups[key] = self._by_id[self._next] = _Group(self._next, key)
            self._next += 1
        m = GroupMember(self, g, deliver)
        g.members.append(m)
        return m

    def leave(self, m: GroupMember) -> None:
        if m.left:
            return
        m.left = True
        g = m._group
        i = g.members.index(m)
        g.members.pop(i)
        if g.rr > i:
            g.rr -= 1
        if not g.members:
            self.index.remove(g.id)
            del self._groups[g.key]
            del self._by_id[g.id]

    def leave_all(self) -> None:
        for g in list(self._groups.values()):
            for m in list(g.members):
                self.leave(m)

    def deliver(self, ev: Event) -> None:
        """Give ``ev`` to one member of each group it matches."""
        for gid in self.index.match(ev.channel, ev.tags):
            g = self._by_id.get(gid)
            if g is None or not g.members:
                continue
            i = g.rr % len(g.members)
            g.rr = i + 1
            m = g.members[i]
            try:
                m.deliver(ev)
            except Exception:
                log.exception("a group member's callback failed; it leaves the group")
                self.leave(m)

    def matching(self, channel: str, tags: tuple[str, ...] = ()) -> int:
        return len(self.index.match(channel, tags)) if self.index else 0
