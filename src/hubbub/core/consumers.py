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

Memory: at most ``max_items`` items per consumer are held (pending or outstanding); the rest stay in the store
and are read in pages (``backlog``) as room frees up. Journal notifications come from the ``commit_hook`` of
the node's write batcher, which this service sets; a notification that finds no room (or a consumer still
reading its backlog) is dropped and the item read from the store later, so none is lost between the two.

**Live exclusive groups** (``listenExclusive``): members with the same group name and filter share a group;
each matching event goes to exactly one member, round-robin in join order, at most once, and never to a group
without members. They are live only: nothing is stored.

Concurrency contract: every method is called on the event loop thread; store writes go through
:meth:`Node.write` (the writer thread), store reads through :meth:`Node.read`. Callbacks given to
:meth:`ConsumerService.open` and :meth:`ConsumerService.join` run on the loop and must not block; a callback
that raises is logged and its opener or member is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from hubbub.errors import (
    ConsumerBusy,
    ConsumerExists,
    ConsumerNotFound,
    HubbubError,
    ShuttingDown,
    UnknownBatch,
)
from hubbub.events import Event
from hubbub.log.base import AppendResult, LogStore
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalIndex, JournalItem, Retry, check_spec

from .node import Node

__all__ = ["Batch", "ConsumerService", "GroupMember", "Opener"]

log = logging.getLogger("hubbub.consumers")

_NS: Final = 1_000_000_000
#: Nack backoff: this much per attempt, at most :data:`BACKOFF_MAX_NS` (qpubs.md §6).
BACKOFF_STEP_NS: Final = 100_000_000
BACKOFF_MAX_NS: Final = 5 * _NS
#: How long to wait before reading a backlog again after a failed read.
_RETRY_READ_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch handed to an opener. ``number`` increases per consumer (a redelivery gets a new one);
    ``items`` keep their journal positions."""

    consumer: str
    number: int
    items: tuple[JournalItem, ...]


class Opener:
    """One holder of a consumer (a qpubs ``openSubscription`` call, a native consume). Made by
    :meth:`ConsumerService.open`; loop thread only."""

    def __init__(
        self,
        service: ConsumerService,
        consumer: _Consumer,
        shared: bool,
        on_batch: Callable[[Batch], None],
        on_close: Callable[[str], None] | None,
        batch_max: int = 0,
    ) -> None:
        self._service = service
        self._consumer = consumer
        self.shared = shared
        #: The most items per batch for this opener (0: only ``batch_bytes`` limits it).
        self.batch_max = max(batch_max, 0)
        self._on_batch = on_batch
        self._on_close = on_close
        #: The batch this opener holds (its number), if any.
        self.batch: int | None = None
        #: An ack of this opener is being stored: no new batch until it is.
        self.settling = False
        self.closed = False

    @property
    def name(self) -> str:
        return self._consumer.info.spec.name

    async def ack(self, batch: int) -> None:
        """Acknowledge the whole batch: its items leave the journal, durably, before this returns and before
        this opener gets another batch. Raises :class:`UnknownBatch` when this opener does not hold it, and
        ``StorageError`` when it could not be stored (the items are then delivered again)."""
        await self._service._ack(self, batch)

    async def nack(self, batch: int) -> None:
        """Give the batch back: delivered again (to any opener) after the backoff. Raises
        :class:`UnknownBatch` as :meth:`ack` does."""
        await self._service._nack(self, batch)

    def close(self) -> None:
        """Stop holding the consumer; an outstanding batch goes back to pending at once. Idempotent."""
        self._service._close_opener(self, "closed", notify=False)


class GroupMember:
    """One member of a live exclusive group (:meth:`ConsumerService.join`)."""

    def __init__(self, service: ConsumerService, group: _Group, deliver: Callable[[Event], None]) -> None:
        self._service = service
        self._group = group
        self.deliver = deliver
        self.left = False

    def leave(self) -> None:
        """Leave the group. Idempotent."""
        self._service._leave(self)


@dataclass(eq=False, slots=True)
class _Outstanding:
    opener: Opener
    positions: tuple[int, ...]


@dataclass(eq=False, slots=True)
class _Consumer:
    """The service's state of one consumer (loop thread only)."""

    info: ConsumerInfo
    #: Unacknowledged items held in memory (pending or outstanding), by position.
    items: dict[int, JournalItem] = field(default_factory=dict)
    #: Pending positions that may go out now (a heap) and their bytes.
    ready: list[int] = field(default_factory=list)
    ready_bytes: int = 0
    #: Pending positions waiting out a backoff: a heap of (not_before_ns, pos).
    delayed: list[tuple[int, int]] = field(default_factory=list)
    outstanding: dict[int, _Outstanding] = field(default_factory=dict)
    openers: list[Opener] = field(default_factory=list)
    rr: int = 0
    next_batch: int = 1
    #: Whether the store may hold items not in memory, above ``loaded_to``.
    backlog: bool = True
    loaded_to: int = 0
    reading: bool = False
    dropped: bool = False
    #: When the current batch wait started (loop time), and its timer.
    wait_start: float | None = None
    timer: asyncio.TimerHandle | None = None
    deleted: bool = False

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def spec(self) -> ConsumerSpec:
        return self.info.spec


@dataclass(eq=False, slots=True)
class _Group:
    id: int
    key: tuple[str, str, str, str]
    members: list[GroupMember] = field(default_factory=list)
    rr: int = 0


class ConsumerService:
    """See the module docstring. Use as ``async with ConsumerService(node) as consumers`` inside the node's
    own ``async with``: it loads the consumers and sets the batcher's ``commit_hook``, before any publish
    should be accepted."""

    def __init__(self, node: Node, *, max_items: int = 10_000) -> None:
        self._node = node
        self._max_items = max(max_items, 1)
        self._by_name: dict[str, _Consumer] = {}
        self._by_id: dict[int, _Consumer] = {}
        self._dirty: set[_Consumer] = set()
        # Consumer ids that journal notifications named before the service knew them (see _add).
        self._unknown: set[int] = set()
        self._unknown_overflow = False
        #: Creates under way (their consumer may journal before create() resumes).
        self._creating = 0
        self._pump_scheduled = False
        # Settles (acks and retries) of this loop tick, written together.
        self._acks: list[tuple[int, tuple[int, ...]]] = []
        self._retries: list[Retry] = []
        self._settle_fut: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._groups: dict[tuple[str, str, str, str], _Group] = {}
        self._group_ids: dict[int, _Group] = {}
        self._group_index = JournalIndex()
        self._next_group = 1
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # statistics
        self.batches = 0
        self.acked = 0
        self.redelivered = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def __aenter__(self) -> ConsumerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Load every consumer (their unacknowledged items become pending) and hook into the node."""
        self._loop = asyncio.get_running_loop()
        self._node.batcher.commit_hook = self._committed
        infos: list[ConsumerInfo] = await self._node.reads.call(lambda st: st.consumers())
        for info in infos:
            if info.spec.name not in self._by_name:
                self._add(info)

    async def close(self) -> None:
        """Close every opener and member, and wait for the settles under way."""
        if self._closing:
            return
        self._closing = True
        if self._node.batcher.commit_hook == self._committed:
            self._node.batcher.commit_hook = None
        for c in list(self._by_name.values()):
            for o in list(c.openers):
                self._close_opener(o, "shutdown", notify=True)
            if c.timer is not None:
                c.timer.cancel()
        for g in list(self._groups.values()):
            for m in list(g.members):
                self._leave(m)
        if self._acks or self._retries:
            self._write_settles()
        for t in list(self._tasks):
            if t.get_name().startswith("consumer-settle"):
                with contextlib.suppress(Exception):
                    await t
            else:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _add(self, info: ConsumerInfo, *, new: bool = False) -> _Consumer:
        """Start serving a consumer. One just created (``new``) has an empty journal: unless a notification
        already named it, everything it gets comes through notifications, and nothing is read."""
        c = _Consumer(info)
        self._by_name[info.spec.name] = self._by_id[info.id] = c
        if new and not self._unknown_overflow and info.id not in self._unknown:
            c.backlog = False
        else:
            self._spawn(self._fill(c), f"consumer-fill-{info.id}")
        self._unknown.discard(info.id)
        return c

    # -- definitions ----------------------------------------------------------------------------------------

    async def create(self, spec: ConsumerSpec) -> tuple[ConsumerInfo, bool]:
        """Create the consumer unless it exists (then its own spec is kept): ``(info, created)``. Every event
        committed after this returns is journaled for it. Raises ``BadRequest``/``BadChannel``."""
        self._check_open()
        check_spec(spec)
        self._creating += 1
        try:
            info, created = await self._node.batcher.control(lambda st: st.consumer_create(spec))
        finally:
            self._creating -= 1
        c = self._by_name.get(info.spec.name)
        if c is None or c.id != info.id:
            if c is not None:  # deleted and created again meanwhile
                self._forget(c, "deleted")
            c = self._add(info, new=created)
        return c.info, created

    async def delete(self, name: str) -> bool:
        """Delete the consumer and its journal, closing its openers (``on_close("deleted")``)."""
        self._check_open()
        found: bool = await self._node.batcher.control(lambda st: st.consumer_delete(name))
        c = self._by_name.get(name)
        if c is not None:
            self._forget(c, "deleted")
        return found

    def _forget(self, c: _Consumer, reason: str) -> None:
        c.deleted = True
        for o in list(c.openers):
            self._close_opener(o, reason, notify=True)
        if c.timer is not None:
            c.timer.cancel()
        if self._by_name.get(c.spec.name) is c:
            del self._by_name[c.spec.name]
        self._by_id.pop(c.id, None)

    def info(self, name: str) -> ConsumerInfo | None:
        c = self._by_name.get(name)
        return None if c is None else c.info

    async def consumers(self) -> list[ConsumerInfo]:
        """Every consumer as the store has it now (counts included)."""
        infos: list[ConsumerInfo] = await self._node.reads.call(lambda st: st.consumers())
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
    ) -> Opener:
        """Open the consumer ``name``: ``on_batch`` gets its batches. When it does not exist it is created
        from ``spec`` if ``create`` (else :class:`ConsumerNotFound`); when it exists and ``reuse`` is false,
        :class:`ConsumerExists`. ``shared`` (default: the consumer's own) must be true for this opener and
        every other one, else :class:`ConsumerBusy`. ``on_close(reason)`` runs when the service closes the
        opener (``deleted``, ``shutdown``, ``error``), not after :meth:`Opener.close`. ``batch_max``: the
        most items per batch for this opener (0: no limit but ``batch_bytes``)."""
        self._check_open()
        c = self._by_name.get(name)
        if c is None:
            if not create or spec is None:
                raise ConsumerNotFound(f"{name}: not found")
            if spec.name != name:
                raise ValueError("spec.name differs from name")
            _, created = await self.create(spec)
            if not created and not reuse:
                raise ConsumerExists(f"{name}: exists, may not reuse")
            c = self._by_name.get(name)
            if c is None:
                raise ConsumerNotFound(f"{name}: not found")
        elif not reuse:
            raise ConsumerExists(f"{name}: exists, may not reuse")
        share = c.spec.shared if shared is None else shared
        if c.openers and not (share and all(o.shared for o in c.openers)):
            raise ConsumerBusy(f"{name}: already listening")
        o = Opener(self, c, share, on_batch, on_close, batch_max)
        c.openers.append(o)
        self._schedule(c)
        return o

    def _check_open(self) -> None:
        if self._closing or self._node.closing:
            raise ShuttingDown()

    # -- journal notifications -----------------------------------------------------------------------------

    def _committed(self, results: list[AppendResult]) -> None:
        """The batcher's ``commit_hook``: take each commit's journal items, and feed live groups."""
        by_id = self._by_id
        groups = self._group_index
        if not by_id and not groups and not self._creating:
            return  # nothing to do per event (a create under way must see its early items: _unknown)
        for r in results:
            if r.duplicate:
                continue
            if r.journal:
                ev = r.event
                for cid, pos in r.journal:
                    c = by_id.get(cid)
                    if c is None:
                        # Not known yet (created, and its create() not resumed): it reads its journal.
                        if len(self._unknown) < 4096:
                            self._unknown.add(cid)
                        else:
                            self._unknown_overflow = True
                        continue
                    if c.backlog or c.reading or len(c.items) >= self._max_items:
                        c.backlog = c.dropped = True
                        self._schedule(c)
                        continue
                    c.items[pos] = JournalItem(pos, ev)
                    c.loaded_to = pos
                    heapq.heappush(c.ready, pos)
                    c.ready_bytes += ev.size
                    self._schedule(c)
            if groups:
                ev = r.event
                for gid in groups.match(ev.channel, ev.tags):
                    self._group_deliver(self._group_ids[gid], ev)

    async def _fill(self, c: _Consumer) -> None:
        """Read the consumer's items beyond ``loaded_to`` from the store while it has a backlog and room."""
        if c.reading:
            return
        c.reading = True
        try:
            while c.backlog and not c.deleted and not self._closing:
                room = self._max_items - len(c.items)
                if room < max(self._max_items // 4, 1):
                    return  # called again as items are acknowledged
                c.dropped = False
                try:
                    got: list[JournalItem] = await self._node.reads.call(_items, c.id, c.loaded_to, room)
                except HubbubError as exc:
                    log.warning("reading consumer %s failed: %s", c.spec.name, exc)
                    await asyncio.sleep(_RETRY_READ_S)
                    continue
                if c.deleted:
                    return
                now_ns = time.time_ns()
                for it in got:
                    if it.pos in c.items or it.pos <= c.loaded_to:
                        continue
                    c.items[it.pos] = it
                    if it.not_before_ns > now_ns:
                        heapq.heappush(c.delayed, (it.not_before_ns, it.pos))
                    else:
                        heapq.heappush(c.ready, it.pos)
                        c.ready_bytes += it.event.size
                if got:
                    c.loaded_to = max(c.loaded_to, got[-1].pos)
                if len(got) < room and not c.dropped:
                    c.backlog = False
                self._schedule(c)
        finally:
            c.reading = False

    # -- batching -------------------------------------------------------------------------------------------

    def _schedule(self, c: _Consumer) -> None:
        """Pump ``c`` once at the end of this loop tick (coalescing a tick's commits and acks)."""
        self._dirty.add(c)
        if not self._pump_scheduled and self._loop is not None:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump_dirty)

    def _pump_dirty(self) -> None:
        self._pump_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for c in dirty:
            self._pump(c)

    def _timer(self, c: _Consumer, delay: float) -> None:
        if c.timer is not None:
            c.timer.cancel()
        assert self._loop is not None
        c.timer = self._loop.call_later(max(delay, 0.0), self._on_timer, c)

    def _on_timer(self, c: _Consumer) -> None:
        c.timer = None
        self._pump(c)

    def _pump(self, c: _Consumer) -> None:
        """Hand out what can go out now; arm the timer for what must wait (batch wait, backoff)."""
        if c.deleted or self._closing:
            return
        if c.backlog and not c.reading and len(c.items) < self._max_items * 3 // 4:
            self._spawn(self._fill(c), f"consumer-fill-{c.id}")
        now_ns = time.time_ns()
        while c.delayed and c.delayed[0][0] <= now_ns:
            _, pos = heapq.heappop(c.delayed)
            it = c.items.get(pos)
            if it is not None:
                heapq.heappush(c.ready, pos)
                c.ready_bytes += it.event.size
        idle = [o for o in c.openers if o.batch is None and not o.settling]
        # Ordered delivery (no shared openers): nothing passes a batch that waits out its backoff.
        ordered = not any(o.shared for o in c.openers)
        wake: float | None = (c.delayed[0][0] - now_ns) / _NS if c.delayed and c.openers else None
        if idle and c.ready and not (ordered and c.delayed):
            assert self._loop is not None
            now = self._loop.time()
            if c.wait_start is None:
                c.wait_start = now
            deadline = c.wait_start + c.spec.batch_wait_ms / 1000
            full = c.ready_bytes >= c.spec.batch_bytes or any(
                o.batch_max and len(c.ready) >= o.batch_max for o in idle
            )
            if not full and now < deadline:
                wake = deadline - now if wake is None else min(wake, deadline - now)
            else:
                c.wait_start = None
                # A copy: a batch callback may close its opener (or another) at once.
                ring = list(c.openers)
                n = len(ring)
                start = c.rr % n
                for k in range(n):
                    if not c.ready:
                        break
                    o = ring[(start + k) % n]
                    if not o.closed and o.batch is None and not o.settling:
                        self._dispatch(c, o)
                        c.rr = (start + k + 1) % n
        else:
            c.wait_start = None
        if wake is not None:
            self._timer(c, wake)
        elif c.timer is not None:
            c.timer.cancel()
            c.timer = None

    def _dispatch(self, c: _Consumer, o: Opener) -> None:
        limit = c.spec.batch_bytes
        most = o.batch_max or len(c.ready)
        out: list[JournalItem] = []
        size = 0
        while c.ready and len(out) < most:
            it = c.items.get(c.ready[0])
            if it is None:  # acknowledged meanwhile (cannot happen while pending; kept for safety)
                heapq.heappop(c.ready)
                continue
            s = it.event.size
            if out and size + s > limit:
                break
            heapq.heappop(c.ready)
            c.ready_bytes -= s
            size += s
            out.append(it)
        if not out:
            return
        number = c.next_batch
        c.next_batch += 1
        c.outstanding[number] = _Outstanding(o, tuple(it.pos for it in out))
        o.batch = number
        self.batches += 1
        self.redelivered += sum(1 for it in out if it.attempts)
        try:
            o._on_batch(Batch(c.spec.name, number, tuple(out)))
        except Exception:
            log.exception("a consumer's batch callback failed; closing the opener")
            self._close_opener(o, "error", notify=True)

    def _give_back(self, c: _Consumer, positions: Sequence[int], not_before_ns: int) -> None:
        """Outstanding items back to pending (attempts + 1), now or after ``not_before_ns``; stored."""
        kept: list[int] = []
        for pos in positions:
            it = c.items.get(pos)
            if it is None:
                continue
            c.items[pos] = JournalItem(pos, it.event, it.attempts + 1, not_before_ns)
            kept.append(pos)
            if not_before_ns:
                heapq.heappush(c.delayed, (not_before_ns, pos))
            else:
                heapq.heappush(c.ready, pos)
                c.ready_bytes += it.event.size
        if kept:
            self._retries.append(Retry(c.id, tuple(kept), not_before_ns))
            self._settle_soon()

    # -- acks -----------------------------------------------------------------------------------------------

    def _take(self, o: Opener, batch: int) -> tuple[_Consumer, _Outstanding]:
        c = o._consumer
        out = c.outstanding.get(batch)
        if o.closed or out is None or out.opener is not o:
            raise UnknownBatch(f"{c.spec.name}: unknown batch {batch}")
        del c.outstanding[batch]
        o.batch = None
        return c, out

    async def _ack(self, o: Opener, batch: int) -> None:
        c, out = self._take(o, batch)
        items = [c.items.pop(p) for p in out.positions if p in c.items]
        o.settling = True
        try:
            self._acks.append((c.id, out.positions))
            await self._settle_soon()
        except BaseException:
            # Not stored: the items are still in the journal, so they go out again (at least once).
            for it in items:
                if not c.deleted:
                    c.items[it.pos] = it
                    heapq.heappush(c.ready, it.pos)
                    c.ready_bytes += it.event.size
            raise
        finally:
            o.settling = False
            self._schedule(c)
        self.acked += len(items)

    async def _nack(self, o: Opener, batch: int) -> None:
        c, out = self._take(o, batch)
        attempts = max((c.items[p].attempts for p in out.positions if p in c.items), default=0) + 1
        delay = min(BACKOFF_STEP_NS * attempts, BACKOFF_MAX_NS)
        self._give_back(c, out.positions, time.time_ns() + delay)
        self._schedule(c)
        await self._settle_soon()

    def _settle_soon(self) -> asyncio.Future[None]:
        """The future of the settle write that takes what is queued now (one per loop tick)."""
        fut = self._settle_fut
        if fut is None:
            assert self._loop is not None
            fut = self._settle_fut = self._loop.create_future()
            self._loop.call_soon(self._write_settles)
        return fut

    def _write_settles(self) -> None:
        fut, self._settle_fut = self._settle_fut, None
        acks, self._acks = self._acks, []
        retries, self._retries = self._retries, []

        async def write() -> None:
            try:
                await self._node.batcher.control(lambda st: _settle(st, acks, retries))
            except BaseException as exc:
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
                    fut.exception()  # retrieved: an opener that went away does not wait for it
                if not isinstance(exc, HubbubError):
                    raise
                log.warning("storing consumer acks failed: %s", exc)
                return
            if fut is not None and not fut.done():
                fut.set_result(None)

        if acks or retries:
            self._spawn(write(), "consumer-settle")
        elif fut is not None and not fut.done():
            fut.set_result(None)

    # -- openers ------------------------------------------------------------------------------------------

    def _close_opener(self, o: Opener, reason: str, *, notify: bool) -> None:
        if o.closed:
            return
        o.closed = True
        c = o._consumer
        if o in c.openers:
            i = c.openers.index(o)
            c.openers.remove(o)
            if c.rr > i:
                c.rr -= 1
        if o.batch is not None:
            out = c.outstanding.pop(o.batch, None)
            o.batch = None
            if out is not None and not c.deleted:
                self._give_back(c, out.positions, 0)
        if not c.deleted:
            self._schedule(c)
        if notify and o._on_close is not None:
            try:
                o._on_close(reason)
            except Exception:
                log.exception("a consumer's close callback failed")

    # -- live exclusive groups -------------------------------------------------------------------------------

    def join(
        self,
        group: str,
        pattern: str,
        deliver: Callable[[Event], None],
        *,
        syntax: str = "native",
        separator: str = ".",
    ) -> GroupMember:
        """Join the live group ``(group, pattern)``: each matching event committed from now on goes to exactly
        one member, round-robin in join order. Raises ``BadChannel``/``BadRequest`` for a bad pattern."""
        self._check_open()
        key = (group, syntax, separator, pattern)
        g = self._groups.get(key)
        if g is None:
            spec = ConsumerSpec(f"group-{self._next_group}", pattern, syntax=syntax, separator=separator)
            self._group_index.add(self._next_group, spec)
            g = self._groups[key] = self._group_ids[self._next_group] = _Group(self._next_group, key)
            self._next_group += 1
        m = GroupMember(self, g, deliver)
        g.members.append(m)
        return m

    def _leave(self, m: GroupMember) -> None:
        if m.left:
            return
        m.left = True
        g = m._group
        i = g.members.index(m)
        g.members.pop(i)
        if g.rr > i:
            g.rr -= 1
        if not g.members:
            self._group_index.remove(g.id)
            del self._groups[g.key]
            del self._group_ids[g.id]

    def _group_deliver(self, g: _Group, ev: Event) -> None:
        if not g.members:
            return
        i = g.rr % len(g.members)
        g.rr = i + 1
        m = g.members[i]
        try:
            m.deliver(ev)
        except Exception:
            log.exception("a group member's callback failed; it leaves the group")
            self._leave(m)

    def groups_matching(self, channel: str, tags: tuple[str, ...] = ()) -> int:
        """How many live groups an event on ``channel`` reaches (each counts once: qpubs ``delivered``)."""
        return len(self._group_index.match(channel, tags)) if self._group_index else 0

    def statistics(self) -> dict[str, Any]:
        return {
            "consumers": len(self._by_name),
            "openers": sum(len(c.openers) for c in self._by_name.values()),
            "held_items": sum(len(c.items) for c in self._by_name.values()),
            "batches": self.batches,
            "acked": self.acked,
            "redelivered": self.redelivered,
            "groups": len(self._groups),
        }


def _items(store: LogStore, consumer_id: int, after: int, limit: int) -> list[JournalItem]:
    return store.consumer_items(consumer_id, after, limit)


def _settle(store: LogStore, acks: list[tuple[int, tuple[int, ...]]], retries: list[Retry]) -> None:
    store.consumer_settle(acks, retries)
