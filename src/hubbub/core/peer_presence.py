"""The presence of a node of several worker processes on one log (``serve --workers N``): the node's rosters.

A cluster node answers its rosters for the whole cluster through Redis (``cluster/presence.py``); the
workers of one node have the parent in Redis's place. :class:`PeerPresence` keeps this worker's members in
memory (a :class:`~hubbub.core.presence.LocalPresence`, the truth for this worker) and tells every change
to the other workers through the node's notices (``core/notices.py``), each of which keeps a copy of every
other worker's members: a read (guble's ``/api/subscribers``, mist's ``who`` and ``listall``) answers from
memory, at once, for the whole node. A worker that joins (started, or restarted) is told every other's
members; a worker gone (killed: the parent tells, ``notices.gone``) leaves every roster at once, and its part
of the counters with it (as a dead node's does from a cluster's). A change reaches the other workers one hop
through the parent later (eventually consistent, well under a millisecond on an idle machine).

Messages (msgpack, topic :data:`TOPIC`), each with the sender's id ``p``: ``["j", p, roster, key, fields,
since_ns, n]`` (a member joined or changed its fields), ``["l", p, roster, key]`` (left), ``["c", p, counter,
value]`` (the sender's part of a counter), ``["S", p, {roster: [[key, fields, since_ns, n], ...]},
{counter: value}]`` (everything of the sender, to a worker that joined), ``["s", p]`` (a worker's presence
has started: tell it everything).

Concurrency contract: every method is called on the event loop (the :class:`~hubbub.core.presence.Presence`
contract); the reads never wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgpack

from .notices import Notices
from .presence import LocalPresence, Member

__all__ = ["TOPIC", "PeerPresence"]

log = logging.getLogger("hubbub.node")

TOPIC: Final = "presence"


class PeerPresence:
    """See the module docstring. ``notices``: the node's, connected with this worker's id."""

    def __init__(self, notices: Notices) -> None:
        self.notices = notices
        self.local = LocalPresence(notices.me)
        #: The other workers' members and counters, by worker id.
        self._others: dict[str, LocalPresence] = {}
        self._unwatch: list[Callable[[], None]] = [
            notices.watch(TOPIC, self._received),
            notices.watch_peers(self._peer),
        ]
        self._send(["s"])  # the others' members, which they told at this worker's hello, before this existed

    def close(self) -> None:
        for unwatch in self._unwatch:
            unwatch()

    def _send(self, msg: list[Any]) -> None:
        me = self.notices.me
        if me:
            self.notices.send(TOPIC, msgpack.packb([msg[0], me, *msg[1:]]))

    # -- writes (this worker's members) ---------------------------------------------------------------

    def join(self, roster: str, key: str, fields: Mapping[str, str]) -> None:
        self.local.join(roster, key, fields)
        m = self.local.rosters[roster][key]
        self._send(["j", roster, key, dict(m.fields), m.since_ns, m.n])

    def leave(self, roster: str, key: str) -> None:
        self.local.leave(roster, key)
        self._send(["l", roster, key])

    def add(self, counter: str, n: int = 1) -> None:
        self.local.add(counter, n)
        self._send(["c", counter, self.local.counters[counter]])

    # -- reads (the node's) ---------------------------------------------------------------------------

    def _all(self) -> list[LocalPresence]:
        return [self.local, *self._others.values()]

    async def members(self, roster: str) -> list[Member]:
        out = [m for p in self._all() for m in p.rosters.get(roster, {}).values()]
        out.sort(key=lambda m: m.order)
        return out

    async def count(self, roster: str) -> int:
        return sum(len(p.rosters.get(roster, ())) for p in self._all())

    async def total(self, counter: str) -> int:
        return sum(p.counters.get(counter, 0) for p in self._all())

    async def nodes(self) -> list[str]:
        return []  # the workers are one node

    def statistics(self) -> dict[str, int | float]:
        everyone = self._all()
        return {
            "rosters": len({r for p in everyone for r in p.rosters}),
            "members": sum(len(m) for p in everyone for m in p.rosters.values()),
        }

    def health(self) -> dict[str, str]:
        return {"state": "local"}

    # -- the other workers ----------------------------------------------------------------------------

    def _peer(self, peer: str, joined: bool) -> None:
        if not joined:
            self._others.pop(peer, None)
            return
        rosters = {
            r: [[k, dict(m.fields), m.since_ns, m.n] for k, m in members.items()]
            for r, members in self.local.rosters.items()
        }
        self._send(["S", rosters, dict(self.local.counters)])

    def _received(self, data: bytes) -> None:
        try:
            msg = msgpack.unpackb(data)
            kind, peer = str(msg[0]), str(msg[1])
            if kind == "s":
                self._peer(peer, True)
                return
            if peer not in self.notices.peers:
                return  # gone, or not yet said hello: its state comes with its hello's answer
            other = self._others.setdefault(peer, LocalPresence(peer))
            if kind == "j":
                roster, key, fields = str(msg[2]), str(msg[3]), {str(a): str(b) for a, b in msg[4].items()}
                member = Member(key, fields, int(msg[5]), peer, int(msg[6]))
                other.rosters.setdefault(roster, {})[key] = member
            elif kind == "l":
                other.leave(str(msg[2]), str(msg[3]))
            elif kind == "c":
                other.counters[str(msg[2])] = int(msg[3])
            elif kind == "S":
                fresh = LocalPresence(peer)
                for roster, entries in msg[2].items():
                    fresh.rosters[str(roster)] = {
                        str(k): Member(str(k), {str(a): str(b) for a, b in f.items()}, int(t), peer, int(n))
                        for k, f, t, n in entries
                    }
                fresh.counters = {str(c): int(v) for c, v in msg[3].items()}
                self._others[peer] = fresh
        except (ValueError, TypeError, IndexError, KeyError, AttributeError, msgpack.UnpackException) as exc:
            log.warning("presence: a notice from another worker was not understood: %s", exc)
