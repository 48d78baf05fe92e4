"""qpubs' ``delivered`` across the worker processes of one node (``serve --workers N``).

``delivered`` (protocols/qpubs.md §3, ``qpubs_common.py``) counts the recipients an emitted event reached.
On a node of several workers the event reaches the connections of every worker, each counted where it is:
the worker that committed the emit counts its own (in the publish's ``done``, before its fan-out) and every
other worker counts its own as the event arrives from the parent, before its fan-out there
(``Notices.watch_arrivals``), and tells the emitting worker in one notice per arrival batch. The emit's
answer waits for every live worker's count (``Notices.peers``): exact, at the cost of one hop through the
parent and back after the commit (measured in the commit that made this), and no work at all on a single
process. A worker that dies before it answers is no longer waited for (``notices.gone``); a worker that does
not answer within :data:`WAIT_S` (its event stream overflowed and it read the log instead, say) is counted
as reaching nobody. A cluster's nodes have no such membership: each counts its own (docs/dialects/qpubs.md).

The other workers count the connections of every dialect (each qpubs stream once); the durable
subscriptions' journal and ``listenExclusive`` groups are counted by the emitting worker alone (the
journal is the log's, one for the node).

Messages (msgpack, topic :data:`TOPIC`): ``[sender, emitter, [[channel, epoch, seq, n], ...]]``.

Concurrency contract: everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Sequence
from typing import Final

import msgpack

from hubbub.core.api import Core
from hubbub.events import Event

from .qpubs_common import DIALECT, session_recipients

__all__ = ["TOPIC", "WAIT_S", "NodeDelivered"]

log = logging.getLogger("hubbub.qpubs")

TOPIC: Final = "qpubs.delivered"
#: How long an emit's answer waits for the other workers' counts.
WAIT_S: Final = 2.0
#: Counts kept that came before their emit's commit was answered (bounded: old ones are dropped).
EARLY_MAX: Final = 4096

_Key = tuple[str, str, int]


class _Wait:
    """One emit waiting for the other workers' counts."""

    __slots__ = ("done", "expected", "total")

    def __init__(self, expected: set[str]) -> None:
        self.expected = expected
        self.total = 0
        self.done = asyncio.Event()

    def add(self, peer: str, n: int) -> None:
        if peer in self.expected:
            self.total += n
            self.drop(peer)

    def drop(self, peer: str) -> None:
        self.expected.discard(peer)
        if not self.expected:
            self.done.set()


class NodeDelivered:
    """The other workers' part of ``delivered`` (see the module docstring); one per node, shared by the
    HTTP routes and the qrpc listener."""

    def __init__(self, node: Core) -> None:
        self.node = node
        self.notices = node.notices
        self._waits: dict[_Key, _Wait] = {}
        self._early: collections.OrderedDict[_Key, list[tuple[str, int]]] = collections.OrderedDict()
        self.timeouts = 0
        self._unwatch: list[Callable[[], None]] = [
            self.notices.watch(TOPIC, self._received),
            self.notices.watch_arrivals(self._arrived),
            self.notices.watch_peers(self._peer),
        ]

    def close(self) -> None:
        for unwatch in self._unwatch:
            unwatch()

    @property
    def shared(self) -> bool:
        """Whether other workers count too (an emit's answer waits for them)."""
        return bool(self.notices.peers)

    async def others(self, event: Event) -> int:
        """The other workers' recipients of ``event`` (committed by this worker), once each has answered
        (0 on a single process)."""
        peers = self.notices.peers
        if not peers:
            return 0
        key = (event.channel, event.epoch, event.seq)
        wait = _Wait(set(peers))
        for peer, n in self._early.pop(key, ()):
            wait.add(peer, n)
        if wait.expected:
            self._waits[key] = wait
            try:
                await asyncio.wait_for(wait.done.wait(), WAIT_S)
            except TimeoutError:
                self.timeouts += 1
                log.info("qpubs: workers %s did not count an emit on %s", sorted(wait.expected), key[0])
            finally:
                self._waits.pop(key, None)
        return wait.total

    # -- the other workers ------------------------------------------------------------------------------

    def _arrived(self, process: str, events: Sequence[Event]) -> None:
        """Another worker's events, before their fan-out here: count this worker's recipients of its emits."""
        me = self.notices.me
        if not me:
            return
        counts = [
            [ev.channel, ev.epoch, ev.seq, session_recipients(self.node, ev, None)]
            for ev in events
            if ev.publisher.dialect == DIALECT
        ]
        if counts:
            self.notices.send(TOPIC, msgpack.packb([me, process, counts]))

    def _received(self, data: bytes) -> None:
        try:
            sender, to, counts = msgpack.unpackb(data)
            if to != self.notices.me:
                return
            for channel, epoch, seq, n in counts:
                key = (str(channel), str(epoch), int(seq))
                wait = self._waits.get(key)
                if wait is not None:
                    wait.add(str(sender), int(n))
                else:  # before this worker's own answer to the emit: kept a while
                    self._early.setdefault(key, []).append((str(sender), int(n)))
                    while len(self._early) > EARLY_MAX:
                        self._early.popitem(last=False)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            log.warning("qpubs: a delivered count from another worker was not understood: %s", exc)

    def _peer(self, peer: str, joined: bool) -> None:
        if not joined:
            for wait in list(self._waits.values()):
                wait.drop(peer)
