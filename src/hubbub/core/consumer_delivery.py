"""How a durable consumer's journal reaches its openers: journal notifications, backlog reads, batching, and
the settle writes. Parts of :class:`~hubbub.core.ConsumerService` (:mod:`hubbub.core.consumers` states the
rules); loop thread only.

* :class:`Settles` stores acks and retries (nack backoffs, items given back): the first of a loop tick at
  once on the loop when it can, the rest of the tick together at its end (on the loop, or on the writer
  thread when the store or a busy writer requires it).
* :class:`Delivery` takes each commit's journal items (the batcher's ``commit_hook``), reads backlogs in
  pages, and hands pending items to idle openers in batches (``batch_wait_ms``, ``batch_bytes``, round-robin).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from itertools import repeat
from typing import Any, Final

from hubbub.errors import HubbubError, StorageError
from hubbub.log.appended import Committed, expand_runs
from hubbub.log.base import ConsumerJournal
from hubbub.log.consumers import JournalItem, Retry

from .consumer_groups import LiveGroups
from .consumer_state import NS, Batch, ConsumerState, Opener, Outstanding
from .node import Node

__all__ = ["ITEM_OVERHEAD", "Delivery", "Held", "Settles"]

log = logging.getLogger("hubbub.consumers")

#: How long to wait before reading a backlog again after a failed read.
_RETRY_READ_S: Final = 1.0

#: What one held item costs in memory beyond its event's ``size``, as counted against ``held_bytes_max``:
#: the ``Event`` and ``JournalItem`` objects, their small fields, and the item's dict and heap entries
#: (tracemalloc: 404 bytes beyond a 100-byte payload per event published on the node, no headers or tags).
ITEM_OVERHEAD: Final = 400

Spawn = Callable[[Coroutine[Any, Any, None], str], None]


class Settles:
    """Acks and retries, each loop tick's written in at most two store transactions (see :meth:`soon`)."""

    def __init__(self, node: Node, spawn: Spawn) -> None:
        self._node = node
        self._spawn = spawn
        self.acks: list[tuple[int, tuple[int, ...]]] = []
        self.retries: list[Retry] = []
        self._fut: asyncio.Future[None] | None = None
        #: A write was made at once in this loop tick (:meth:`soon`).
        self._hot = False
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def queued(self) -> bool:
        return bool(self.acks or self.retries)

    def soon(self) -> asyncio.Future[None]:
        """The future of the settle write that takes what is queued now.

        The first write of a loop tick is made at once when it can be made on the loop (:meth:`_inline`):
        the future is then done on return, and an ack is answered in the tick it arrived in instead of two
        ticks later (the write at the tick's end, then the waiter's wake-up), each of which waits for
        whatever else the loop has to do under load. What is queued later in the same tick is written
        once, at its end, as every write was before: many consumers acking together still share a
        transaction or two per tick.
        """
        fut = self._fut
        if fut is None:
            loop = self.loop
            assert loop is not None
            fut = self._fut = loop.create_future()
            if self._hot or not self._inline():
                loop.call_soon(self.write)
            else:
                self._hot = True
                loop.call_soon(self._cool)
                self.write()
        return fut

    def _cool(self) -> None:
        self._hot = False

    def _inline(self) -> bool:
        """Whether a write may be made right here on the loop: the store allows it and nothing else is
        being written (the writer thread is idle)."""
        writer = self._node._batcher.writer
        return writer is not None and writer.idle and self._node._store.inline_settle

    def write(self) -> None:
        fut, self._fut = self._fut, None
        acks, self.acks = self.acks, []
        retries, self.retries = self.retries, []

        async def write() -> None:
            try:
                await self._node._batcher.control(lambda st: _settle(st, acks, retries))
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

        writer = self._node._batcher.writer
        if (acks or retries) and writer is not None and self._inline():
            # Right here on the loop (the store allows it, and nothing else is being written): no thread
            # hand-offs between the ack and its answer.
            try:
                writer.control_inline(lambda st: _settle(st, acks, retries))
            except HubbubError as exc:
                log.warning("storing consumer acks failed: %s", exc)
                if fut is not None and not fut.done():
                    fut.set_exception(exc)
                    fut.exception()
                return
            except Exception:
                log.exception("storing consumer acks failed")
                if fut is not None and not fut.done():
                    fut.set_exception(StorageError("storage failure"))
                    fut.exception()
                return
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif acks or retries:
            self._spawn(write(), "consumer-settle")
        elif fut is not None and not fut.done():
            fut.set_result(None)


class Held:
    """What every consumer's held items cost together (``total``: event sizes plus :data:`ITEM_OVERHEAD`
    each; each consumer's share in ``ConsumerState.held_bytes``). Past ``max_items``, a consumer still takes
    journal notifications while ``total`` is below ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0

    def take(self, c: ConsumerState, positions: Sequence[int], size: int) -> list[JournalItem]:
        """Remove the items at ``positions`` from ``c``'s memory (acknowledged) and return them; ``size``:
        their events' sizes together (known when the batch was cut)."""
        pop = c.items.pop
        items = [it for it in map(pop, positions, repeat(None)) if it is not None]
        if len(items) != len(positions):  # (not while outstanding; kept for safety)
            size = sum(it.event.size for it in items)
        held = size + ITEM_OVERHEAD * len(items)
        c.held_bytes -= held
        self.total -= held
        return items

    def put_back(self, c: ConsumerState, items: Sequence[JournalItem]) -> None:
        """Items :meth:`take` took are pending again (their ack could not be stored), as given back: the
        opener had them, so their next delivery is a redelivery (attempts + 1, in memory; the journal keeps
        what it had, and a process that takes the consumer up flags what was pending anyway)."""
        for it in items:
            c.items[it.pos] = JournalItem(it.pos, it.event, it.attempts + 1, 0)
            c.add_ready(it.pos)
            c.ready_bytes += it.event.size
        held = sum(it.event.size for it in items) + ITEM_OVERHEAD * len(items)
        c.held_bytes += held
        self.total += held

    def forget(self, c: ConsumerState) -> None:
        """``c`` is gone (deleted): what it held no longer counts."""
        self.total -= c.held_bytes
        c.held_bytes = 0

    def discard(self, c: ConsumerState) -> None:
        """Forget the items of ``c`` held in memory, to be read from the journal again: on a shared log,
        when this node takes the consumer's hold or gives it back. While another node serves it, that node's
        acknowledgements remove items from the store and from nothing here, so what this node read or was
        notified of before it took the hold may have been acknowledged since. Called with no opener of
        ``c`` on this node (so nothing out); a journal read under way is dropped when it returns
        (``ConsumerState.generation``)."""
        self.forget(c)
        c.discard()


class Delivery:
    """Journal items in, batches out. ``by_id`` is the service's own map of consumers (shared, not copied);
    ``close_opener(opener, reason)`` closes an opener whose callback failed."""

    def __init__(
        self,
        node: Node,
        by_id: dict[int, ConsumerState],
        groups: LiveGroups,
        settles: Settles,
        spawn: Spawn,
        close_opener: Callable[[Opener, str], None],
        max_items: int,
        held_bytes_max: int = 0,
    ) -> None:
        self._node = node
        self._by_id = by_id
        self._groups = groups
        self._settles = settles
        self._spawn = spawn
        self._close_opener = close_opener
        self.max_items = max_items
        self.held = Held(held_bytes_max)
        #: The log is written by other nodes too (``ConsumerJournal.shared``): see :meth:`committed`.
        self.shared = node._store.shared
        self._dirty: set[ConsumerState] = set()
        self._pump_scheduled = False
        # Consumer ids that journal notifications named before the service knew them (see adopt).
        self._unknown: set[int] = set()
        self._unknown_overflow = False
        #: Creates under way (their consumer may journal before create() resumes).
        self.creating = 0
        self.closing = False
        self.loop: asyncio.AbstractEventLoop | None = None
        # statistics
        self.batches = 0
        self.redelivered = 0
        self.acked = 0
        self.nacked = 0

    def adopt(self, c: ConsumerState, *, new: bool) -> None:
        """Start serving ``c``. One just created (``new``) has an empty journal: unless a notification
        already named it, everything it gets comes through notifications, and nothing is read. On a shared
        log nothing is read before this node takes the consumer's hold (:meth:`Held.discard`)."""
        empty = new and not self._unknown_overflow and c.id not in self._unknown
        self._unknown.discard(c.id)
        if self.shared:
            return  # c.backlog stays: read once held
        if empty:
            c.backlog = c.inheriting = False  # no earlier holder
        else:
            self._spawn(self.fill(c), f"consumer-fill-{c.id}")

    # -- journal notifications -----------------------------------------------------------------------------

    def committed(self, committed: list[Committed]) -> None:
        """The batcher's ``commit_hook``: take each commit's journal items, and feed live groups (on a node
        with a cluster relay, the relay's releases feed them instead: :meth:`ConsumerService.released`).

        On a shared log (``ConsumerJournal.shared``) other nodes journal too, and nothing here hears of it: an
        item is taken only when it is the next position after ``loaded_to``; otherwise the consumer reads its
        journal from ``loaded_to`` on (positions are allocated under the log lock, in commit order, so a read
        that sees an item sees every earlier one). And another node may serve the consumer, acknowledging
        items in the store alone: only the consumers this node holds take items (:meth:`Held.discard`)."""
        by_id, index = self._by_id, self._groups.index
        if not by_id and not self.creating and (index.empty or self._node.relay is not None):
            return  # nothing to do per event (a create under way must see its early items: _unknown)
        groups = index if self._node.relay is None else None
        results = expand_runs(committed)  # (a run answered as one journaled nothing: groups want its events)
        shared = self.shared
        max_items = self.max_items
        held, held_max = self.held.total, self.held.limit
        touched: set[ConsumerState] = set()
        push = heapq.heappush
        item = JournalItem
        overhead = ITEM_OVERHEAD
        # The consumer of the previous item (a burst's items mostly go to the same one): its look-up and
        # its entry in ``touched`` are done once per run, not per item.
        last_cid = -1
        last: ConsumerState | None = None
        for r in results:
            if r.duplicate:
                continue
            journal = r.journal
            if journal:
                ev = r.event
                size = -1
                for cid, pos in journal:
                    if cid == last_cid:
                        c = last
                    else:
                        c = by_id.get(cid)
                        if c is None:
                            # Not known yet (created, and its create() not resumed): it reads its journal.
                            if len(self._unknown) < 4096:
                                self._unknown.add(cid)
                            else:
                                self._unknown_overflow = True
                        elif shared and not c.held:
                            c = None  # served by another node, or by none: read once held
                        else:
                            touched.add(c)
                        last_cid, last = cid, c
                    if c is None:
                        continue
                    if pos <= c.loaded_to:
                        continue  # a backlog read saw this commit before its notification came: loaded
                    items = c.items
                    if (
                        c.backlog
                        or c.reading
                        or (len(items) >= max_items and held >= held_max)
                        or (shared and pos != c.loaded_to + 1)
                    ):
                        # No room: the item stays in the store, read when room frees up (fill).
                        c.backlog = c.dropped = True
                        continue
                    items[pos] = item(pos, ev)
                    c.loaded_to = pos
                    # Above loaded_to, so above every position held: in order (add_ready's usual case).
                    fresh = c.fresh
                    if not fresh or pos > fresh[-1]:
                        fresh.append(pos)
                    else:
                        push(c.ready, pos)
                    if size < 0:
                        size = ev.size
                    c.ready_bytes += size
                    c.held_bytes += size + overhead
                    held += size + overhead
            if groups:
                self._groups.deliver(r.event)
        self.held.total = held
        for c in touched:
            self.schedule(c)

    def stale(self, c: ConsumerState) -> None:
        """The journal of ``c`` may hold items beyond ``loaded_to`` that no notification brought (another
        node committed them): read it (at once if it has room, else as items are acknowledged)."""
        if c.deleted:
            return
        c.backlog = c.dropped = True
        self.schedule(c)

    async def fill(self, c: ConsumerState) -> None:
        """Read the consumer's items beyond ``loaded_to`` from the store while it has a backlog and room."""
        if c.reading:
            return
        c.reading = True
        try:
            while c.backlog and not c.deleted and not self.closing and (c.held or not self.shared):
                room = self.max_items - len(c.items)
                if room < max(self.max_items // 4, 1):
                    return  # called again as items are acknowledged
                c.dropped = False
                generation = c.generation
                try:
                    got: list[JournalItem] = await self._node._reads.call_journal(
                        _items, c.id, c.loaded_to, room
                    )
                except HubbubError as exc:
                    log.warning("reading consumer %s failed: %s", c.spec.name, exc)
                    await asyncio.sleep(_RETRY_READ_S)
                    continue
                if c.deleted:
                    return
                if c.generation != generation:
                    continue  # memory was discarded meanwhile: what was read may be acknowledged since
                now_ns = time.time_ns()
                items, loaded_to, push, add_ready = c.items, c.loaded_to, heapq.heappush, c.add_ready
                added = held = 0
                for it in got:
                    pos = it.pos
                    if pos <= loaded_to or pos in items:
                        continue
                    items[pos] = it
                    size = it.event.size
                    held += size + ITEM_OVERHEAD
                    if it.not_before_ns > now_ns:
                        push(c.delayed, (it.not_before_ns, pos))
                    else:
                        add_ready(pos)
                        added += size
                c.ready_bytes += added
                c.held_bytes += held
                self.held.total += held
                if got:
                    c.loaded_to = max(c.loaded_to, got[-1].pos)
                c.read_to_loaded(complete=len(got) < room and not c.dropped)
                self.schedule(c)
        finally:
            c.reading = False

    # -- batching -------------------------------------------------------------------------------------------

    def schedule(self, c: ConsumerState) -> None:
        """Pump ``c`` once at the end of this loop tick (coalescing a tick's commits and acks)."""
        self._dirty.add(c)
        if not self._pump_scheduled and self.loop is not None:
            self._pump_scheduled = True
            self.loop.call_soon(self._pump_dirty)

    def _pump_dirty(self) -> None:
        self._pump_scheduled = False
        dirty, self._dirty = self._dirty, set()
        for c in dirty:
            self._pump(c)

    def _timer(self, c: ConsumerState, delay: float) -> None:
        if c.timer is not None:
            c.timer.cancel()
        assert self.loop is not None
        c.timer = self.loop.call_later(max(delay, 0.0), self._on_timer, c)

    def _on_timer(self, c: ConsumerState) -> None:
        c.timer = None
        self._pump(c)

    def _pump(self, c: ConsumerState) -> None:
        """Hand out what can go out now; arm the timer for what must wait (batch wait, backoff)."""
        if c.deleted or self.closing:
            return
        if (
            c.backlog
            and not c.reading
            and len(c.items) < self.max_items * 3 // 4
            and (c.held or not self.shared)
        ):
            self._spawn(self.fill(c), f"consumer-fill-{c.id}")
        now_ns = time.time_ns()
        while c.delayed and c.delayed[0][0] <= now_ns:
            _, pos = heapq.heappop(c.delayed)
            it = c.items.get(pos)
            if it is not None:
                c.add_ready(pos)
                c.ready_bytes += it.event.size
        idle = [o for o in c.openers if o.batch is None and not o.settling]
        # Ordered delivery (no shared openers): nothing passes a batch that waits out its backoff.
        ordered = not any(o.shared for o in c.openers)
        wake: float | None = (c.delayed[0][0] - now_ns) / NS if c.delayed and c.openers else None
        if idle and (c.fresh or c.ready) and not (ordered and c.delayed):
            assert self.loop is not None
            now = self.loop.time()
            if c.wait_start is None:
                c.wait_start = now
            deadline = c.wait_start + c.spec.batch_wait_ms / 1000
            n, size = c.ready_count, c.ready_bytes
            full = size >= c.spec.batch_bytes or any(
                (o.batch_max and n >= o.batch_max) or (o.bytes_max and size >= o.bytes_max) for o in idle
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
                    if not (c.fresh or c.ready):
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

    def _dispatch(self, c: ConsumerState, o: Opener) -> None:
        limit = min(c.spec.batch_bytes, o.bytes_max) if o.bytes_max else c.spec.batch_bytes
        out, size = c.take_ready(o.batch_max or c.ready_count, limit)
        if not out:
            return
        c.ready_bytes -= size
        number = c.next_batch
        c.next_batch += 1
        c.outstanding[number] = Outstanding(o, tuple([it.pos for it in out]), size)
        o.batch = number
        again = len([it for it in out if it.attempts])
        self.batches += 1
        self.redelivered += again
        c.batches += 1
        c.redelivered += again
        try:
            o.deliver(Batch(c.spec.name, number, tuple(out), c.inherited_to))
        except Exception:
            log.exception("a consumer's batch callback failed; closing the opener")
            self._close_opener(o, "error")

    def give_back(self, c: ConsumerState, positions: Sequence[int], not_before_ns: int) -> None:
        """Outstanding items back to pending (attempts + 1), now or after ``not_before_ns``; stored."""
        kept = c.give_back(positions, not_before_ns)
        if kept:
            self._settles.retries.append(Retry(c.id, kept, not_before_ns))
            self._settles.soon()


def _items(store: ConsumerJournal, consumer_id: int, after: int, limit: int) -> list[JournalItem]:
    return store.consumer_items(consumer_id, after, limit)


def _settle(store: ConsumerJournal, acks: list[tuple[int, tuple[int, ...]]], retries: list[Retry]) -> None:
    store.consumer_settle(acks, retries)
