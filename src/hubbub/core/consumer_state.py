"""The durable-consumer service's values and per-consumer state (see :mod:`hubbub.core.consumers`).

``Batch`` and ``Opener`` are public (re-exported by ``hubbub.core``); ``ConsumerState`` and ``Outstanding``
are the service's own bookkeeping, shared by its parts (:mod:`.consumers`, :mod:`.consumer_delivery`).
Loop thread only.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from hubbub.errors import UnknownBatch
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalItem

if TYPE_CHECKING:
    from .consumers import ConsumerService
    from .session import Session

__all__ = ["BACKOFF_MAX_NS", "BACKOFF_STEP_NS", "Batch", "ConsumerState", "Opener", "Outstanding"]

NS: Final = 1_000_000_000
#: Nack backoff: this much per attempt, at most :data:`BACKOFF_MAX_NS` (qpubs.md §6).
BACKOFF_STEP_NS: Final = 100_000_000
BACKOFF_MAX_NS: Final = 5 * NS


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch handed to an opener. ``number`` increases per consumer (a redelivery gets a new one);
    ``items`` keep their journal positions. ``inherited_to``: the consumer's ``inherited_to`` when the batch
    was cut (:meth:`maybe_sent`)."""

    consumer: str
    number: int
    items: tuple[JournalItem, ...]
    inherited_to: int = 0

    def maybe_sent(self, item: JournalItem) -> bool:
        """Whether ``item`` may have gone out before: given back by this process (``attempts``), or pending
        when this process took the consumer up (``ConsumerState.inherited_to``), when the previous holder (a
        process that crashed or stopped, another worker or node) may have sent it. ``attempts`` alone counts
        this process's redeliveries (and the stored give-backs); a dialect whose redelivery flag must be set
        on every possible redelivery (MQTT's DUP) asks this."""
        return item.attempts > 0 or item.pos <= self.inherited_to


class Opener:
    """One holder of a consumer (a qpubs ``openSubscription`` call, a native consume). Made by
    :meth:`ConsumerService.open`; loop thread only."""

    def __init__(
        self,
        service: ConsumerService,
        consumer: ConsumerState,
        shared: bool,
        on_batch: Callable[[Batch], None],
        on_close: Callable[[str], None] | None,
        batch_max: int = 0,
        bytes_max: int = 0,
    ) -> None:
        self._service = service
        self._consumer = consumer
        self.shared = shared
        #: The most items per batch for this opener (0: only ``batch_bytes`` limits it).
        self.batch_max = max(batch_max, 0)
        #: The most event bytes per batch for this opener, below the consumer's ``batch_bytes`` (0: that).
        self.bytes_max = max(bytes_max, 0)
        self._on_batch = on_batch
        self._on_close = on_close
        #: The batch this opener holds (its number), if any.
        self.batch: int | None = None
        #: An ack of this opener is being stored: no new batch until it is.
        self.settling = False
        self.closed = False
        #: The session it was opened for (``ConsumerService.open``), whose identity must keep the right to
        #: use the consumer (``ConsumerService.rebind``).
        self.session: Session | None = None

    @property
    def name(self) -> str:
        return self._consumer.info.spec.name

    @property
    def consumer(self) -> ConsumerState:
        return self._consumer

    def deliver(self, batch: Batch) -> None:
        """Hand ``batch`` to the opener's callback (the service's parts only)."""
        self._on_batch(batch)

    def notify_close(self, reason: str) -> None:
        if self._on_close is not None:
            self._on_close(reason)

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


@dataclass(eq=False, slots=True)
class Outstanding:
    opener: Opener
    positions: tuple[int, ...]
    #: The items' event sizes together.
    size: int = 0


@dataclass(eq=False, slots=True)
class ConsumerState:
    """The service's state of one consumer (loop thread only)."""

    info: ConsumerInfo
    #: Unacknowledged items held in memory (pending or outstanding), by position.
    items: dict[int, JournalItem] = field(default_factory=dict)
    #: Pending positions that may go out now: ``fresh``, ascending (items as they enter memory, in journal
    #: order: the usual case, O(1) at both ends), and ``ready``, a heap (items given back, or out of order);
    #: the next to go is the lower of their heads (:meth:`next_ready`). ``ready_bytes``: their bytes.
    fresh: deque[int] = field(default_factory=deque)
    ready: list[int] = field(default_factory=list)
    ready_bytes: int = 0
    #: What the held items count against the service's ``held_bytes_max`` (``Held.total``, all consumers).
    held_bytes: int = 0
    #: Pending positions waiting out a backoff: a heap of (not_before_ns, pos).
    delayed: list[tuple[int, int]] = field(default_factory=list)
    outstanding: dict[int, Outstanding] = field(default_factory=dict)
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
    #: On a shared log: this node holds the consumer (``LogStore.consumer_hold``); taken and given back
    #: under ``hold_lock``. Only while it does are the items in memory this node's to hand out: another
    #: node serving it acknowledges them in the store alone (``Held.discard``).
    held: bool = False
    hold_lock: asyncio.Lock | None = None
    #: Acks of this consumer being stored: the hold is not given back before they are (another node would
    #: read the journal without them and hand their items out again).
    acking: int = 0
    #: Positions up to this one were pending when this process took the consumer up (at start, or with its
    #: hold on a shared log) and may have been handed out by the previous holder: the journal records
    #: acknowledgements and give-backs, not hand-outs (:meth:`Batch.maybe_sent`). Set by the first complete
    #: read of the journal after the take-up (``inheriting`` until it is complete), which may take in a few
    #: items journaled after the take-up too: they are marked, which errs on the side of "maybe sent".
    inherited_to: int = 0
    inheriting: bool = True
    #: Counts the discards of what memory held (``Held.discard``): a journal read that started before
    #: one is out of date when it returns.
    generation: int = 0
    #: Counters for ``/metrics`` (since this node took the consumer up): batches handed out, items
    #: acknowledged, items given back by nack, items delivered again (``attempts`` above 0).
    batches: int = 0
    acked: int = 0
    nacked: int = 0
    redelivered: int = 0
    #: When this node last stored an acknowledgement of the consumer's (``time.time_ns()``; 0: never).
    last_ack_ns: int = 0
    #: Unacknowledged items in the store's journal at the last :meth:`ConsumerService.refresh_counts`
    #: (-1: not read yet).
    stored_pending: int = -1

    def acknowledged(self, n: int) -> None:
        """``n`` items' acknowledgement is stored: counted, and the time of the last one kept."""
        self.acked += n
        self.last_ack_ns = time.time_ns()

    def read_to_loaded(self, *, complete: bool) -> None:
        """A read of the journal reached ``loaded_to``; ``complete``: it reached the journal's end (no
        backlog is left). While it is the first read since the take-up (``inheriting``), what it read was
        pending then, or may have been: no notification is taken before it is complete (``backlog``)."""
        if self.inheriting:
            self.inherited_to = self.loaded_to
        if complete:
            self.backlog = self.inheriting = False

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def ready_count(self) -> int:
        """Pending positions that may go out now."""
        return len(self.fresh) + len(self.ready)

    def add_ready(self, pos: int) -> None:
        """``pos`` may go out now (its bytes are the caller's to count)."""
        fresh = self.fresh
        if not fresh or pos > fresh[-1]:
            fresh.append(pos)
        else:
            heapq.heappush(self.ready, pos)

    def next_ready(self) -> int | None:
        """The lowest position that may go out now, if any (not removed)."""
        fresh, ready = self.fresh, self.ready
        if fresh:
            return ready[0] if ready and ready[0] < fresh[0] else fresh[0]
        return ready[0] if ready else None

    def pop_ready(self) -> int:
        """Remove and return the lowest position that may go out now (there is one)."""
        fresh, ready = self.fresh, self.ready
        if fresh and not (ready and ready[0] < fresh[0]):
            return fresh.popleft()
        return heapq.heappop(ready)

    def take_ready(self, most: int, limit: int) -> tuple[list[JournalItem], int]:
        """Remove the lowest pending items that may go out now, at most ``most`` of them and ``limit`` event
        bytes (but at least one), and return them with their bytes (``ready_bytes`` is the caller's)."""
        out: list[JournalItem] = []
        add = out.append
        size = 0
        fresh, get = self.fresh, self.items.get
        if not self.ready:
            # Only items in journal order (the usual case): from the front of ``fresh``.
            popleft = fresh.popleft
            n = 0
            while fresh and n < most:
                it = get(fresh[0])
                if it is None:  # acknowledged meanwhile (cannot happen while pending; kept for safety)
                    popleft()
                    continue
                s = it.event.size
                if n and size + s > limit:
                    break
                popleft()
                size += s
                add(it)
                n += 1
            return out, size
        while len(out) < most:
            pos = self.next_ready()
            if pos is None:
                break
            it = get(pos)
            if it is None:  # as above
                self.pop_ready()
                continue
            s = it.event.size
            if out and size + s > limit:
                break
            self.pop_ready()
            size += s
            add(it)
        return out, size

    def give_back(self, positions: Sequence[int], not_before_ns: int) -> tuple[int, ...]:
        """Outstanding items back to pending with attempts + 1, now or, with ``not_before_ns``, after it;
        the positions still held (the caller stores their retry)."""
        kept: list[int] = []
        items = self.items
        for pos in positions:
            it = items.get(pos)
            if it is None:
                continue
            items[pos] = JournalItem(pos, it.event, it.attempts + 1, not_before_ns)
            kept.append(pos)
            if not_before_ns:
                heapq.heappush(self.delayed, (not_before_ns, pos))
            else:
                self.add_ready(pos)
                self.ready_bytes += it.event.size
        return tuple(kept)

    def take_outstanding(self, opener: Opener, batch: int) -> Outstanding:
        """Remove the batch ``batch`` that ``opener`` holds from the outstanding ones and return it; raises
        :class:`UnknownBatch` when ``opener`` does not hold it."""
        out = self.outstanding.get(batch)
        if opener.closed or out is None or out.opener is not opener:
            raise UnknownBatch(f"{self.spec.name}: unknown batch {batch}")
        del self.outstanding[batch]
        opener.batch = None
        return out

    def discard(self) -> None:
        """Forget every item held in memory (none out), to be read from the journal again from the start;
        a read under way when this is called is out of date when it returns (``generation``). What the
        items counted in ``held_bytes`` is the caller's to uncount first (``Held.discard``)."""
        assert not self.outstanding, "discarding a consumer's memory with batches out"
        self.generation += 1
        self.items.clear()
        self.fresh.clear()
        self.ready.clear()
        self.delayed.clear()
        self.ready_bytes = 0
        self.loaded_to = self.inherited_to = 0
        self.backlog = self.dropped = self.inheriting = True
        self.wait_start = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    @property
    def spec(self) -> ConsumerSpec:
        return self.info.spec
