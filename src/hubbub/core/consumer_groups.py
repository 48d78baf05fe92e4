"""Live exclusive groups (qpubs ``listenExclusive``): members with the same group name and filter share a
group; each matching event goes to exactly one member, round-robin in join order, at most once, and never to a
group without members. Only a member whose session may read the event's channel (``Access``, the node's one
rule; checked at each event, so a login that changes the identity counts at once) is given it: the others
are passed over in the round, and an event no member may read goes to none of them (as a live listen skips
what its token may not read). Live only: nothing is stored. Part of :class:`~hubbub.core.ConsumerService`;
loop thread only.

**Across the nodes of a cluster** (:class:`GroupShares`, set on a shared log): a node releases every node's
events to its groups, so a group with members on several nodes would get each event once per node. Instead,
each node with members of a group is a member of the presence roster ``consumer.group:<group key>`` (key: a
random token of the node's service), read again every ``refresh_s`` and whenever the node joins a group; an
event goes to the group's members on the node at ``(crc32(channel) + seq) % n`` of the roster's tokens in
order, so every node picks the same one. A node counts for an event only if it joined the roster ``settle_s``
before the event's commit time (longer than a refresh, so that every node sees it before it takes a share;
while no node has, the earliest to join takes every event): every node decides each event alike, and joining
sends no event to two nodes. A node leaving or killed keeps its share until the others read the roster
again (killed: until its entry expires, ``cluster.presence_ttl_s``): those events go to nobody (at most once
holds), and so do the events a node releases between joining a group and its first read of the roster
(milliseconds: :meth:`GroupMember.ready` waits for that read). While Redis is away each node sees only
itself and delivers every event to its own members.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import zlib
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from hubbub.events import Event
from hubbub.log.consumers import ConsumerSpec, JournalIndex

from .access import Access
from .presence import Presence
from .session import Session

__all__ = ["GroupMember", "GroupShares", "LiveGroups"]

log = logging.getLogger("hubbub.consumers")


class GroupMember:
    """One member of a live exclusive group (:meth:`ConsumerService.join`). ``session``: whose identity
    (as it is at each event: a login may change it) must be allowed to read an event's channel for the
    event to go to this member; None: an identity of None (nothing, with auth on)."""

    def __init__(
        self, groups: LiveGroups, group: _Group, deliver: Callable[[Event], None], session: Session | None
    ) -> None:
        self._groups = groups
        self._group = group
        self.deliver = deliver
        self.session = session
        self.left = False

    def leave(self) -> None:
        """Leave the group. Idempotent."""
        self._groups.leave(self)

    async def ready(self) -> None:
        """Until this node takes its share of the group's events: at once, except on a cluster node whose
        group is new here (one read of its roster, at most a few seconds)."""
        shares = self._groups.shares
        if shares is not None:
            await shares.ready(self._group.roster)


@dataclass(eq=False, slots=True)
class _Group:
    id: int
    key: tuple[str, str, str, str]
    members: list[GroupMember] = field(default_factory=list)
    rr: int = 0
    #: The group's presence roster (:class:`GroupShares`).
    roster: str = ""


class GroupShares:
    """Which node of a cluster delivers each event of a live group (see the module docstring)."""

    def __init__(self, presence: Presence, refresh_s: float, settle_s: float | None = None) -> None:
        self.presence = presence
        self.token = secrets.token_hex(8)
        self.refresh_s = refresh_s
        self.settle_ns = int((refresh_s + 1.0 if settle_s is None else settle_s) * 1e9)
        #: Per roster of a group with members here: ``(token, since_ns)`` of every node's entry, by token
        #: (None until the roster is first read).
        self.views: dict[str, list[tuple[str, int]] | None] = {}
        self._read: dict[str, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self.closed = False

    def joined(self, roster: str) -> None:
        self.presence.join(roster, self.token, {})
        self.views[roster] = None
        self._read.setdefault(roster, asyncio.Event())
        self._wake.set()

    @property
    def pending(self) -> int:
        """Rosters not read yet since this node joined them."""
        return sum(1 for v in self.views.values() if v is None)

    async def ready(self, roster: str, timeout_s: float = 5.0) -> None:
        """Until ``roster`` has been read since this node joined it (or ``timeout_s``)."""
        read = self._read.get(roster)
        if read is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(read.wait(), timeout_s)

    def left(self, roster: str) -> None:
        self.presence.leave(roster, self.token)
        self.views.pop(roster, None)
        if (read := self._read.pop(roster, None)) is not None:
            read.set()

    def mine(self, roster: str, ev: Event) -> bool:
        """Whether this node delivers ``ev`` to its members of the group whose roster is ``roster``."""
        view = self.views.get(roster)
        if view is None:
            return False  # not read yet: another node may hold the group
        if len(view) < 2:
            return True
        cutoff = ev.time_ns - self.settle_ns  # the commit's time: the same for every node
        tokens = [t for t, since in view if since <= cutoff]
        if not tokens:
            return min(view, key=lambda e: (e[1], e[0]))[0] == self.token
        return tokens[(zlib.crc32(ev.channel.encode()) + ev.seq) % len(tokens)] == self.token

    async def run(self) -> None:
        """Read every roster of this node's groups every ``refresh_s``, and at once after a join."""
        while not self.closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.refresh_s)
            self._wake.clear()
            for roster in list(self.views):
                try:
                    members = await self.presence.members(roster)
                except Exception as exc:  # a presence answers without Redis; anything else: next time
                    log.debug("reading the roster %s failed: %s", roster, exc)
                    continue
                if roster in self.views:  # not left meanwhile
                    view = sorted((m.key, m.since_ns) for m in members)
                    if not any(t == self.token for t, _ in view):
                        view = sorted([*view, (self.token, time.time_ns())])  # written soon
                    self.views[roster] = view
                    if (read := self._read.pop(roster, None)) is not None:
                        read.set()


class LiveGroups:
    """Every live group, indexed by filter. ``access`` decides which members may read an event (none
    given: every member may; the node's own with auth off)."""

    def __init__(self, access: Access | None = None) -> None:
        self._access = access
        #: Set on a shared log: the node's share of each group's events (module docstring).
        self.shares: GroupShares | None = None
        self._groups: dict[tuple[str, str, str, str], _Group] = {}
        self._by_id: dict[int, _Group] = {}
        self.index = JournalIndex()
        self._next = 1
        #: Events handed to members (``/metrics``).
        self.delivered = 0

    def __len__(self) -> int:
        return len(self._groups)

    def span(self, shares: GroupShares, spawn: Callable[[Coroutine[Any, Any, None], str], None]) -> None:
        """Share the groups' events with the other nodes of a cluster (the module docstring)."""
        self.shares = shares
        spawn(shares.run(), "consumer-group-shares")

    @property
    def unread(self) -> int:
        """Rosters of this node's groups not read since it joined them (:class:`GroupShares`)."""
        return 0 if self.shares is None else self.shares.pending

    def join(
        self,
        group: str,
        pattern: str,
        deliver: Callable[[Event], None],
        *,
        syntax: str,
        separator: str,
        session: Session | None = None,
    ) -> GroupMember:
        key = (group, syntax, separator, pattern)
        g = self._groups.get(key)
        if g is None:
            spec = ConsumerSpec(f"group-{self._next}", pattern, syntax=syntax, separator=separator)
            self.index.add(self._next, spec)
            roster = "consumer.group:" + json.dumps(key, separators=(",", ":"))
            g = self._groups[key] = self._by_id[self._next] = _Group(self._next, key, roster=roster)
            self._next += 1
            if self.shares is not None:
                self.shares.joined(roster)
        m = GroupMember(self, g, deliver, session)
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
            if self.shares is not None:
                self.shares.left(g.roster)
            self.index.remove(g.id)
            del self._groups[g.key]
            del self._by_id[g.id]

    def leave_all(self) -> None:
        for g in list(self._groups.values()):
            for m in list(g.members):
                self.leave(m)

    def _reader(self, g: _Group, channel: str) -> int:
        """The index of the member of ``g`` that gets an event on ``channel``: the next in round-robin order
        that may read it (-1: none may; the event is then not the group's to deliver, as for a group
        without members). A member that may not read is passed over, never picked and skipped: the event
        goes to a member that may, and that member's turn is taken."""
        members = g.members
        n = len(members)
        start = g.rr % n
        access = self._access
        if access is None or not access.authorizer.enabled:
            return start
        for k in range(n):
            i = (start + k) % n
            s = members[i].session
            if access.may_read(None if s is None else s.identity, channel):
                return i
        return -1

    def deliver(self, ev: Event) -> None:
        """Give ``ev`` to one member of each group it matches that may read it (of this node's share, on a
        cluster)."""
        if not self.index:
            return
        shares = self.shares
        for gid in self.index.match(ev.channel, ev.tags):
            g = self._by_id.get(gid)
            if g is None or not g.members or (shares is not None and not shares.mine(g.roster, ev)):
                continue
            i = self._reader(g, ev.channel)
            if i < 0:
                continue
            g.rr = i + 1
            m = g.members[i]
            self.delivered += 1
            try:
                m.deliver(ev)
            except Exception:
                log.exception("a group member's callback failed; it leaves the group")
                self.leave(m)

    @property
    def members(self) -> int:
        return sum(len(g.members) for g in self._groups.values())

    def matching(self, channel: str, tags: tuple[str, ...] = ()) -> int:
        """How many groups an event on ``channel`` goes to: those it matches with a member that may read
        it."""
        if not self.index:
            return 0
        n = 0
        for gid in self.index.match(channel, tags):
            g = self._by_id.get(gid)
            if g is not None and g.members and self._reader(g, channel) >= 0:
                n += 1
        return n
