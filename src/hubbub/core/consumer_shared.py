"""What a log written by several nodes (``LogStore.shared``: PostgreSQL under a cluster) adds to the durable
consumer service (:mod:`hubbub.core.consumers`). Part of :class:`~hubbub.core.ConsumerService`; loop thread
only.

* Other nodes journal for this node's consumers, and nothing local tells of it: the cluster relay hints at
  their commits (:meth:`SharedJournal.others_committed`, the events matched against the consumers' filters),
  and every ``poll_s`` each consumer with openers reads its journal beyond what it has read anyway (the
  safety net for a Redis message lost or a node killed between its commit and its publish).
* Other nodes create and delete consumers: the service takes up those created (at the next poll, or at once
  when a name to open is not known) and drops those deleted (their openers are told ``deleted``).
* One node at a time serves a consumer: its first opener on a node takes the log's hold of it
  (``LogStore.consumer_hold``, a PostgreSQL advisory lock that ends with the node's session), or is refused
  with :class:`~hubbub.errors.ConsumerBusy` while another node holds it; the node gives the hold back when its
  last opener closes and its acks are stored. A node killed lets go at once (its sessions end); a node that
  loses its connection to PostgreSQL loses its holds with it, and another node may then serve the consumer
  too until it reopens.
* Only a node that holds a consumer keeps its items in memory: the node serving it acknowledges them in the
  store, which a copy elsewhere would not see. A node that takes the hold reads the journal afresh (every
  ack answered before the hold ended is stored by then); one that gives it back forgets what it held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from hubbub.errors import ConsumerBusy, HubbubError
from hubbub.events import Event
from hubbub.log.consumers import ConsumerInfo, JournalIndex

from .consumer_delivery import Delivery
from .consumer_state import ConsumerState
from .node import Node

__all__ = ["SharedJournal"]

log = logging.getLogger("hubbub.consumers")


class SharedJournal:
    """See the module docstring. ``by_name``/``by_id`` are the service's own maps (shared, not copied);
    ``add(info)`` and ``forget(state, reason)`` are the service's."""

    def __init__(
        self,
        node: Node,
        by_name: dict[str, ConsumerState],
        by_id: dict[int, ConsumerState],
        delivery: Delivery,
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        add: Callable[[ConsumerInfo], object],
        forget: Callable[[ConsumerState, str], None],
        poll_s: float,
    ) -> None:
        self._node = node
        self._by_name = by_name
        self._by_id = by_id
        self._delivery = delivery
        self._spawn = spawn
        self._add = add
        self._forget = forget
        self.poll_s = max(poll_s, 0.01)
        #: Every consumer's filter, to tell which consumers another node's events journal for.
        self.index = JournalIndex()
        self.closing = False

    def others_committed(self, events: Sequence[Event] | None) -> None:
        """:meth:`ConsumerService.others_committed`: the open consumers ``events`` (None: all) journal for
        read their journals."""
        stale = self._delivery.stale
        if events is None:
            for c in self._by_id.values():
                if c.openers:
                    stale(c)
            return
        by_id = self._by_id
        match = self.index.match
        seen: set[int] = set()
        channel: str | None = None
        tags: tuple[str, ...] | None = None
        for ev in events:
            if ev.channel is channel and ev.tags is tags:
                continue  # a run's events share these objects (workers/frames.py): matched already
            channel, tags = ev.channel, ev.tags
            for cid in match(channel, tags):
                if cid not in seen:
                    seen.add(cid)
                    found = by_id.get(cid)
                    if found is not None and found.openers:
                        stale(found)

    async def reload(self) -> None:
        """Take up the consumers the store has and this service does not, drop those it no longer has
        (only those known before the read: one created here meanwhile is not in the read's answer)."""
        before = set(self._by_id)
        infos: list[ConsumerInfo] = await self._node._reads.call_journal(lambda st: st.consumers())
        ids = {i.id for i in infos}
        for cid in before - ids:
            c = self._by_id.get(cid)
            if c is not None:
                self._forget(c, "deleted")
        for info in infos:
            if info.id not in self._by_id and info.id not in before:
                self._add(info)

    async def hold(self, c: ConsumerState) -> None:
        """Before an opener of ``c``: take the log's hold of it unless this node has it; ConsumerBusy when
        another node holds it."""
        if not self._delivery.shared:
            return
        lock = c.hold_lock = c.hold_lock or asyncio.Lock()
        async with lock:
            if c.held:
                return
            ok: bool = await self._node._reads.call_journal(lambda st: st.consumer_hold(c.id, True))
            if not ok:
                raise ConsumerBusy(f"{c.spec.name}: served by another node")
            c.held = True
            # What memory holds of it may have been acknowledged by the node that served it last (whose
            # acks were stored before its hold ended): read the journal afresh.
            self._delivery.held.discard(c)

    def let_go(self, c: ConsumerState) -> None:
        """``c`` may have no opener left here: give its hold back (unless one opens meanwhile), once the acks
        of ``c`` being stored are (the service calls this again when the last one is): a node that takes
        the hold reads the journal, which must not hold items of an ack that is answered afterwards."""
        if not c.held or c.openers or c.acking or c.hold_lock is None:
            return
        lock = c.hold_lock

        async def give_back() -> None:
            async with lock:
                if not c.held or c.acking or (c.openers and not c.deleted):
                    return
                c.held = False
                if not c.deleted:
                    self._delivery.held.discard(c)  # another node may serve it now
                try:
                    await self._node._reads.call_journal(lambda st: st.consumer_hold(c.id, False))
                except HubbubError as exc:  # the session is gone, and the hold with it
                    log.debug("giving back the hold of %s failed: %s", c.spec.name, exc)

        self._spawn(give_back(), f"consumer-let-go-{c.id}")

    async def find(self, name: str) -> ConsumerState | None:
        """The consumer ``name``, which another node may have created since the last poll (None: none)."""
        if not self._delivery.shared:
            return None
        await self.reload()
        return self._by_name.get(name)

    async def run(self) -> None:
        """Every ``poll_s``: the consumers other nodes created or deleted, the open ones' journals."""
        while not self.closing:
            await asyncio.sleep(self.poll_s)
            try:
                await self.reload()
            except HubbubError as exc:  # the log away: the next interval tries again
                log.debug("reading the consumers failed: %s", exc)
            self.others_committed(None)
