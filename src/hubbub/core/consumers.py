"""Durable consumers and live exclusive groups: the core service behind qpubs subscriptions (qpubs.md §6), and
the native protocol's and the Python client's consumers (docs/consumers.md).

A consumer is defined and journaled by the log store (:mod:`hubbub.log.consumers`): every committed event
that matches it is copied into its journal in the commit's own transaction. This service hands the journal
out to **openers** in batches and settles what they acknowledge:

* An opener with no outstanding batch gets the next one once items are pending: the service waits up to
  ``batch_wait_ms`` for more, then sends up to ``batch_bytes`` of events (``Event.size``; at least one item),
  in journal order. One batch per opener at a time.
* ``ack`` removes the batch's items from the journal durably (a writer-thread transaction, grouped per loop
  tick) before it returns and before that opener gets another batch. ``nack`` gives the items back with a
  backoff of 100 ms times their attempts (at most 5 s), stored with them. An opener that closes or goes away
  gives its batch back at once (attempts + 1). After a restart every unacknowledged item is pending again.
* Order: a consumer whose openers are not shared delivers in journal order (so per channel in commit order),
  redeliveries included: a nacked batch holds back everything after it until its backoff ends. A work queue
  (openers with ``shared``) gives each batch to exactly one opener, round-robin among the idle ones, and lets
  later items pass a batch that waits out its backoff.

Memory: each consumer may hold ``max_items`` items (pending or outstanding), and more while every consumer's
held items together count less than ``held_bytes_max`` (event sizes plus about 400 bytes each: a publisher
that runs ahead of its consumer need not have its events read back from the store); the rest stay in the
store and are read in pages of at most ``max_items`` (``backlog``) as room frees up. Journal notifications
come from the ``commit_hook`` of the node's write batcher, which this service sets; a notification that finds
no room (or a consumer still reading its backlog) is dropped and the item read from the store later, so none
is lost between the two.
On a log other nodes write too (``LogStore.shared``, a cluster), a notification is taken only when it
continues what was read, and other nodes' items are read from the store when the cluster relay hints at them
(:meth:`ConsumerService.others_committed`) and every ``poll_s`` (:mod:`.consumer_shared`); only a consumer
this node holds (serves) keeps items in memory, read afresh when the node takes its hold.

**Live exclusive groups** (``listenExclusive``): members with the same group name and filter share a group;
each matching event goes to exactly one member, round-robin in join order among those whose identity may read
it, at most once, and never to a group without such a member. They are live only: nothing is stored. On a
cluster node they take every node's events from the relay (:meth:`ConsumerService.released`), and the nodes
share each group's events (:mod:`.consumer_groups`).

**Permissions** (docs/consumers.md "Permissions"): every dialect gives the caller's identity to
:meth:`~ConsumerService.create`, :meth:`~ConsumerService.open` and :meth:`~ConsumerService.delete`, which
check it here, once for all of them (``Access.check_consumer``): using a consumer takes read over all it can
journal, creating one an identity with a user too, deleting it being its owner (the creator's user,
recorded at creation), or admin. Acks and nacks
go through an opener, which only an allowed caller gets; an opener opened for a session is closed when that
session logs in as an identity that may not use it (:meth:`~ConsumerService.rebind`).

The service is split in parts: :mod:`.consumer_catalog` (the consumers a node knows, created and deleted),
:mod:`.consumer_state` (batches, openers, per-consumer state), :mod:`.consumer_delivery` (notifications,
backlog reads, batching, settle writes) and :mod:`.consumer_groups` (live groups); this module holds the
service's API, openers and acks.

Concurrency contract: every method is called on the event loop thread; store writes go through
:meth:`Node.write` (the writer thread), store reads through :meth:`Node.read`. Callbacks given to
:meth:`ConsumerService.open` and :meth:`ConsumerService.join` run on the loop and must not block; a callback
that raises is logged and its opener or member is closed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from hubbub.auth import Identity
from hubbub.errors import (
    AuthError,
    ConsumerBusy,
    ShuttingDown,
)
from hubbub.events import Event
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec

from .consumer_catalog import Catalog
from .consumer_delivery import Delivery, Settles
from .consumer_groups import GroupMember, GroupShares, LiveGroups
from .consumer_metrics import ConsumerMetrics
from .consumer_state import BACKOFF_MAX_NS, BACKOFF_STEP_NS, Batch, ConsumerState, Opener
from .node import Node
from .session import Session
from .supervisor import Supervisor

__all__ = ["BACKOFF_MAX_NS", "BACKOFF_STEP_NS", "Batch", "ConsumerService", "GroupMember", "Opener"]

log = logging.getLogger("hubbub.consumers")


class ConsumerService:
    """See the module docstring. ``async with ConsumerService(node)`` inside the node's own ``async with``
    loads the consumers and sets the batcher's ``commit_hook``, before any publish should be accepted."""

    def __init__(
        self,
        node: Node,
        *,
        max_items: int = 10_000,
        held_bytes_max: int = 64 << 20,
        poll_s: float = 1.0,
        max_consumers: int = 0,
    ) -> None:
        self._node = node
        self._by_name: dict[str, ConsumerState] = {}
        self._by_id: dict[int, ConsumerState] = {}
        #: The service's tasks: fills, settle writes (finished before close returns), the shared log's poll.
        self._tasks = Supervisor("consumers", node.supervision)
        self._tasks.open()
        self._groups = LiveGroups(node.access)
        self._settles = Settles(node, self._spawn)
        self._delivery = Delivery(
            node,
            self._by_id,
            self._groups,
            self._settles,
            self._spawn,
            lambda o, reason: self._close_opener(o, reason, notify=True),
            max(max_items, 1),
            max(held_bytes_max, 0),
        )
        self._catalog = Catalog(
            node,
            self._by_name,
            self._by_id,
            self._delivery,
            self._spawn,
            lambda o, reason: self._close_opener(o, reason, notify=True),
            max_consumers,
            poll_s,
        )
        self._shared = self._catalog.shared
        #: The openers each session holds (given to :meth:`open`), for :meth:`rebind`.
        self._held: dict[Session, set[Opener]] = {}
        self._closing = False
        #: The figures for ``/metrics`` (:mod:`.consumer_metrics`).
        self.metrics = ConsumerMetrics(node, self._by_name, self._delivery, self._groups)

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def __aenter__(self) -> ConsumerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Load every consumer (their unacknowledged items become pending) and hook into the node."""
        self._delivery.loop = self._settles.loop = asyncio.get_running_loop()
        self._node._batcher.commit_hook = self._delivery.committed
        self._node.consumers = self
        self._node._registry.rebound.append(self.rebind)
        await self._shared.reload()  # every consumer, at first
        if self._delivery.shared:
            self._tasks.run("consumer-poll", self._shared.run)
            if self._node.relay is not None:  # a cluster: groups span the nodes
                self._groups.span(GroupShares(self._node.presence, self._shared.poll_s), self._spawn)

    async def close(self) -> None:
        """Close every opener and member, and wait for the settles under way."""
        if self._closing:
            return
        self._closing = self._delivery.closing = self._shared.closing = True
        if self._node._batcher.commit_hook == self._delivery.committed:
            self._node._batcher.commit_hook = None
        if self._node.consumers is self:
            self._node.consumers = None
        if self.rebind in self._node._registry.rebound:
            self._node._registry.rebound.remove(self.rebind)
        for c in list(self._by_name.values()):
            for o in list(c.openers):
                self._close_opener(o, "shutdown", notify=True)
            if c.timer is not None:
                c.timer.cancel()
        self._groups.leave_all()
        if self._settles.queued:
            self._settles.write()
        await self._tasks.aclose()  # the settle writes finish, the rest is cancelled

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """A one-shot task of the service (its parts' fills and settle writes); a failure is logged and
        counted (``core/supervisor.py``). Settle writes are waited for at close, the others cancelled."""
        if self._tasks.closed:
            # Closed: nothing more runs (an item whose settle never started is delivered again later).
            coro.close()
            return
        self._tasks.spawn(coro, name, finish=name.startswith("consumer-settle"))

    # -- definitions ----------------------------------------------------------------------------------------

    async def create(
        self, spec: ConsumerSpec, *, identity: Identity | None = None, dialect: str = "native"
    ) -> tuple[ConsumerInfo, bool]:
        """Create the consumer unless it exists (then its own spec is kept): ``(info, created)``. Every event
        committed after this returns is journaled for it. ``identity`` is the caller's (``None``: not
        authenticated, refused everything when auth is on): it needs the permission to use ``spec`` and, for
        one that exists, that one (:meth:`Access.check_consumer`); its user becomes the owner. Raises
        ``BadRequest``, ``BadChannel``, ``TooManyConsumers`` (``dialect`` counts it), ``AuthError`` 4102."""
        self._check_open()
        return await self._catalog.create(spec, identity, dialect)

    async def delete(self, name: str, *, identity: Identity | None = None, dialect: str = "native") -> bool:
        """Delete the consumer and its journal, closing its openers (``on_close("deleted")``): whether it
        existed. ``identity`` (as for :meth:`create`) must be allowed to manage it: use it, and own it or be
        admin. Raises ``AuthError`` 4102 (nothing deleted)."""
        self._check_open()
        return await self._catalog.delete(name, identity, dialect)

    def info(self, name: str) -> ConsumerInfo | None:
        """The consumer ``name`` as this node knows it (None: not known here)."""
        return None if (c := self._by_name.get(name)) is None else c.info

    async def find(self, name: str) -> ConsumerInfo | None:
        """As :meth:`info`, and on a shared log also a consumer another node created since this node last
        read the consumers (read from the store then), as :meth:`open` finds it."""
        c = self._by_name.get(name) or await self._shared.find(name)
        return None if c is None else c.info

    async def consumers(self) -> list[ConsumerInfo]:
        """Every consumer as the store has it now (counts included)."""
        infos: list[ConsumerInfo] = await self._node._reads.call_journal(lambda st: st.consumers())
        return infos

    async def open(
        self,
        name: str,
        on_batch: Callable[[Batch], None],
        on_close: Callable[[str], None] | None = None,
        *,
        spec: ConsumerSpec | None = None,
        create: bool = True,
        reuse: bool = True,
        shared: bool | None = None,
        batch_max: int = 0,
        bytes_max: int = 0,
        identity: Identity | None = None,
        session: Session | None = None,
        dialect: str = "native",
    ) -> Opener:
        """Open the consumer ``name``: ``on_batch`` gets its batches. When it does not exist it is created
        from ``spec`` if ``create`` (else :class:`ConsumerNotFound`); when it exists and ``reuse`` is false,
        :class:`ConsumerExists`. ``shared`` (default: the consumer's own) must be true for this opener and
        every other one, else :class:`ConsumerBusy`. ``on_close(reason)`` runs when the service closes the
        opener (``deleted``, ``shutdown``, ``error``), not after :meth:`Opener.close`. ``batch_max``: the
        most items per batch for this opener (0: no limit but ``batch_bytes``); ``bytes_max``: the most event
        bytes (0: ``batch_bytes``), e.g. what one frame of the opener's connection may carry. ``identity``
        (as for :meth:`create`) must be allowed to use the consumer, whether it exists or is created here
        (else ``AuthError`` 4102); acks and nacks go through the opener, so they need nothing more. The
        ``session`` whose identity it is (if any) keeps the opener only while its identity may use the
        consumer (:meth:`rebind`). ``dialect`` labels a refusal."""
        self._check_open()
        c = await self._catalog.to_open(name, spec if create else None, reuse, identity, dialect)
        await self._shared.hold(c)  # on a shared log: no other node serves it
        share = c.spec.shared if shared is None else shared
        if c.openers and not (share and all(o.shared for o in c.openers)):
            raise ConsumerBusy(f"{name}: already listening")
        if session is not None and session.identity is not identity:  # logged in again meanwhile
            try:
                self._node.access.check_consumer(session.identity, c.spec, dialect)
            except AuthError:
                self._shared.let_go(c)
                raise
        o = Opener(self, c, share, on_batch, on_close, batch_max, bytes_max)
        c.openers.append(o)
        if session is not None:
            o.session = session
            self._held.setdefault(session, set()).add(o)
        if self._delivery.shared:
            self._delivery.stale(c)  # other nodes may have journaled items since it was last read
        else:
            self._delivery.schedule(c)
        return o

    def _check_open(self) -> None:
        if self._closing or self._node.closing:
            raise ShuttingDown()

    # -- acks -----------------------------------------------------------------------------------------------

    async def _ack(self, o: Opener, batch: int) -> None:
        c = o.consumer
        out = c.take_outstanding(o, batch)
        items = self._delivery.held.take(c, out.positions, out.size)
        o.settling = True
        generation = c.generation
        c.acking += 1  # the hold stays while it is stored (SharedJournal.let_go)
        try:
            self._settles.acks.append((c.id, out.positions))
            await self._settles.soon()
        except BaseException:
            # Not stored: the items are still in the journal, so they go out again (at least once).
            if not c.deleted and c.generation == generation:  # (else they are read again)
                self._delivery.held.put_back(c, items)
            raise
        finally:
            o.settling = False
            c.acking -= 1
            self._delivery.schedule(c)
            self._shared.let_go(c)  # its openers may have closed meanwhile
        self._delivery.acked += len(items)
        c.acknowledged(len(items))

    async def _nack(self, o: Opener, batch: int) -> None:
        c = o.consumer
        out = c.take_outstanding(o, batch)
        self._delivery.nacked += len(out.positions)
        c.nacked += len(out.positions)
        attempts = max((c.items[p].attempts for p in out.positions if p in c.items), default=0) + 1
        delay = min(BACKOFF_STEP_NS * attempts, BACKOFF_MAX_NS)
        self._delivery.give_back(c, out.positions, time.time_ns() + delay)
        self._delivery.schedule(c)
        await self._settles.soon()

    # -- openers ------------------------------------------------------------------------------------------

    def rebind(self, session: Session) -> None:
        """``session`` has a new identity (``Node.login``, through ``SubscriptionRegistry.rebound``). Its
        openers of consumers that identity may not use are closed (``on_close("forbidden")``), their batches
        pending again, as a live subscription stops getting the events its session may no longer read."""
        for o in list(self._held.get(session, ())):
            try:
                self._node.access.check_consumer(session.identity, o.consumer.spec, session.dialect)
            except AuthError:
                self._close_opener(o, "forbidden", notify=True)

    def _close_opener(self, o: Opener, reason: str, *, notify: bool) -> None:
        if o.closed:
            return
        o.closed = True
        if o.session is not None and (held := self._held.get(o.session)) is not None:
            held.discard(o)
            if not held:
                del self._held[o.session]
        c = o.consumer
        if o in c.openers:
            i = c.openers.index(o)
            c.openers.remove(o)
            if c.rr > i:
                c.rr -= 1
        if o.batch is not None:
            out = c.outstanding.pop(o.batch, None)
            o.batch = None
            if out is not None and not c.deleted:
                self._delivery.give_back(c, out.positions, 0)
        if not c.deleted:
            self._delivery.schedule(c)
        self._shared.let_go(c)
        if notify:
            try:
                o.notify_close(reason)
            except Exception:
                log.exception("a consumer's close callback failed")

    # -- other nodes' commits (shared log), live exclusive groups ----------------------------------------

    def others_committed(self, events: Sequence[Event] | None = None) -> None:
        """Other nodes committed ``events`` (None: unknown): see :mod:`.consumer_shared`."""
        self._shared.others_committed(events)

    def released(self, event: Event) -> None:
        """A cluster relay released ``event`` (any node's) in per-channel order: to the live groups."""
        self._groups.deliver(event)

    def join(
        self,
        group: str,
        pattern: str,
        deliver: Callable[[Event], None],
        *,
        syntax: str = "native",
        separator: str = ".",
        session: Session | None = None,
    ) -> GroupMember:
        """Join the live group ``(group, pattern)``: each matching event committed from now on goes to exactly
        one member, round-robin in join order among those whose ``session`` may read it (``LiveGroups``).
        Raises ``BadChannel``/``BadRequest`` for a bad pattern."""
        self._check_open()
        return self._groups.join(group, pattern, deliver, syntax=syntax, separator=separator, session=session)

    def groups_matching(self, channel: str, tags: tuple[str, ...] = ()) -> int:
        """How many live groups an event on ``channel`` reaches (each counts once: qpubs ``delivered``)."""
        return self._groups.matching(channel, tags)

    @property
    def has_groups(self) -> bool:
        return bool(self._groups.index)

    def statistics(self) -> dict[str, Any]:
        return _statistics(self._by_name, self._delivery, self._groups)


def _statistics(by_name: dict[str, ConsumerState], d: Delivery, groups: LiveGroups) -> dict[str, Any]:
    return {
        "consumers": len(by_name),
        "openers": sum(len(c.openers) for c in by_name.values()),
        "held_items": sum(len(c.items) for c in by_name.values()),
        "held_bytes": d.held.total,
        "held_bytes_max": d.held.limit,
        "batches": d.batches,
        "acked": d.acked,
        "redelivered": d.redelivered,
        "groups": len(groups),
        "group_rosters_unread": groups.unread,
    }
