"""Per-channel ordering of the committed events a node delivers: its own and every other node's.

Each node commits to the shared log and publishes what it committed through Redis; events of one channel
therefore reach a node from several places (its own commits, each other node's messages), not necessarily in
seq order. :class:`Sequencer` releases them to the node's fan-out in per-channel ``(epoch, seq)`` order, each
once:

* the next seq of a channel's current epoch is released at once, and with it whatever buffered seqs follow;
* a later seq is buffered and the channel's **gap** waits ``gap_wait`` seconds for the missing ones (they
  are usually in flight from another node); then it is **filled from the log**, which holds every committed
  event;
* an event of another epoch waits the same way; the fill then asks the log which epoch is current, finishes
  the old one from the log (its last events may not have arrived), and goes on in the new one;
* anything at or below a channel's released position is a duplicate and dropped.

A fill of a channel that no local subscription matches (``interested``) reads nothing: it only moves the
channel's position to the log's head, dropping what it buffered up to there.

What the log cannot give any more (trimmed in the meantime) is **lost**: ``on_lost(channel)`` is called, and
the node closes the connections subscribed to the channel as slow consumers, so that they resume with their
position and are told of the gap; a silent gap never happens.

Buffers are bounded: beyond ``max_pending`` buffered events, a channel's buffer is dropped and the channel is
filled from the log at once (everything buffered is committed, so the log has it).

Concurrency contract: every method runs on the event loop, except :meth:`released` and :meth:`known`, which
any thread may call (they read one dict entry). Log reads run through ``read``/``head`` (coroutines that
the owner runs off the loop). Fills of one channel never overlap; fills of several run concurrently (at most
``max_fills``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from hubbub.core.supervisor import Supervision, Supervisor
from hubbub.errors import HubbubError
from hubbub.events import Event
from hubbub.log.base import ChannelInfo

__all__ = ["Sequencer"]

log = logging.getLogger("hubbub.cluster")

Origin = TypeVar("Origin")  # what travels with a node's own events (its origin session)

#: Events per log read of a fill.
FILL_PAGE = 1000
#: Retired epochs remembered per channel, to recognise late events of them.
RETIRED_KEPT = 8


@dataclass(slots=True)
class _Chan(Generic[Origin]):
    epoch: str
    last: int
    # The buffers are made when first needed: a node keeps one of these per channel of the log.
    pending: dict[int, tuple[Event, Origin | None]] | None = None
    #: Events of epochs other than ``epoch``, until a fill decides which epoch is current.
    other: dict[str, dict[int, tuple[Event, Origin | None]]] | None = None
    #: The last few epochs finished (``RETIRED_KEPT``).
    retired: tuple[str, ...] = ()
    timer: asyncio.TimerHandle | None = None
    filling: bool = False
    #: Set while a fill runs; waiters of :meth:`Sequencer.catch_up` wait for the fill's end.
    done: asyncio.Event | None = None
    #: A fill was asked for while one ran: run another after it.
    again: bool = False

    def buffered(self) -> int:
        return len(self.pending or ()) + sum(map(len, (self.other or {}).values()))

    def take(self, seq: int) -> tuple[Event, Origin | None] | None:
        """The buffered event ``seq``, removed from the buffer (None: not buffered)."""
        return None if self.pending is None else self.pending.pop(seq, None)

    def retire(self, epoch: str) -> None:
        self.retired = (*self.retired, epoch)[-RETIRED_KEPT:]


class Sequencer(Generic[Origin]):
    """See the module docstring. ``deliver(event, origin)`` receives released events; ``read(channel, epoch,
    after_seq, limit)`` and ``head(channel)`` read the log off the loop."""

    def __init__(
        self,
        deliver: Callable[[Event, Origin | None], None],
        read: Callable[[str, str, int, int], Awaitable[list[Event]]],
        head: Callable[[str], Awaitable[ChannelInfo]],
        on_lost: Callable[[str], None],
        interested: Callable[[str], bool] = lambda channel: True,
        *,
        gap_wait: float = 0.1,
        max_pending: int = 100_000,
        max_fills: int = 4,
    ) -> None:
        self._deliver = deliver
        self._read = read
        self._head = head
        self._on_lost = on_lost
        self._interested = interested
        self.gap_wait = gap_wait
        self.max_pending = max_pending
        self._chans: dict[str, _Chan[Origin]] = {}
        self._fills = asyncio.Semaphore(max_fills)
        #: The fills (one-shot: a fill that fails is reported and tried again by its channel's timer).
        self._tasks = Supervisor("sequencer")
        self._tasks.open()
        self._pending = 0
        self._closed = False
        # statistics
        self.released_count = 0
        self.duplicates = 0
        self.gaps = 0
        self.fills = 0
        self.filled = 0
        self.lost = 0
        self.fill_errors = 0
        self.skipped = 0
        #: The newest commit time known delivered (released, or covered by a sync): see :meth:`note_time`.
        self.max_time = 0

    # -- state --------------------------------------------------------------------------------------------

    def seed(self, heads: list[ChannelInfo]) -> None:
        """Start from these positions (read from the log once this node receives everything committed after
        them): events at or below them are history, not released again."""
        for ci in heads:
            if ci.channel not in self._chans and ci.epoch:
                self._chans[ci.channel] = _Chan(ci.epoch, ci.top)

    def released(self, channel: str) -> tuple[str, int] | None:
        """The channel's released position ``(epoch, seq)``, or None for a channel this node never saw. Any
        thread."""
        st = self._chans.get(channel)
        return None if st is None else (st.epoch, st.last)

    @property
    def buffered(self) -> int:
        return self._pending

    @property
    def channels(self) -> int:
        return len(self._chans)

    # -- events -------------------------------------------------------------------------------------------

    def offer(self, ev: Event, origin: Origin | None = None) -> None:
        """A committed event (this node's own, with its origin, or another node's)."""
        st = self._chans.get(ev.channel)
        if st is None:
            # Not in the seed and never seen since: the channel (or this epoch of it) began after this node
            # subscribed, so every one of its events reaches this node.
            st = self._chans[ev.channel] = _Chan(ev.epoch, 0)
        if ev.epoch == st.epoch:
            if ev.seq <= st.last:
                self.duplicates += 1
                return
            if ev.seq == st.last + 1 and not st.filling:
                st.last = ev.seq
                self._release(ev, origin)
                if st.pending:
                    self._drain(st, purge=False)
                return
            if st.pending is None:
                st.pending = {}
            elif ev.seq in st.pending:
                self.duplicates += 1
                return
            st.pending[ev.seq] = (ev, origin)
        else:
            if ev.epoch in st.retired:
                self.duplicates += 1  # a late event of an epoch this node finished from the log
                return
            if st.other is None:
                st.other = {}
            st.other.setdefault(ev.epoch, {})[ev.seq] = (ev, origin)
        self._pending += 1
        if self._pending > self.max_pending:
            self._overflow(ev.channel, st)
        elif st.timer is None and not st.filling:
            self.gaps += 1
            loop = asyncio.get_running_loop()
            st.timer = loop.call_later(self.gap_wait, self._start_fill, ev.channel)

    def offer_all(self, items: Iterable[tuple[Origin | None, Event]]) -> None:
        """:meth:`offer` each ``(origin, event)``, in order. The next seq of a channel with nothing buffered
        nor being filled (nearly every event: a commit's run of a channel follows the channel's last) is
        released right here, without :meth:`offer`'s other cases."""
        chans = self._chans
        deliver = self._deliver
        for origin, ev in items:
            st = chans.get(ev.channel)
            if (
                st is not None
                and ev.seq == st.last + 1
                and not st.pending
                and not st.filling
                and ev.epoch == st.epoch
            ):
                st.last = ev.seq
                self.released_count += 1
                self.max_time = max(self.max_time, ev.time_ns)
                try:
                    deliver(ev, origin)
                except Exception:  # one faulty delivery must not stop the channel's stream
                    log.exception("cluster: delivering %s #%d failed", ev.channel, ev.seq)
            else:
                self.offer(ev, origin)

    def committed_up_to(self, channel: str, epoch: str, top: int) -> None:
        """Another node committed the channel up to ``(epoch, top)`` without publishing the events: fill
        what is missing from the log now."""
        st = self._chans.get(channel)
        if st is None:
            st = self._chans[channel] = _Chan(epoch, 0)
        if st.epoch == epoch and st.last >= top:
            return
        if epoch in st.retired:
            return
        self._start_fill(channel)

    def sync_all(self, heads: list[ChannelInfo]) -> int:
        """Compare with the log's heads (after an outage): fill every channel behind. Returns how many."""
        n = 0
        for ci in heads:
            if not ci.epoch:
                continue
            st = self._chans.get(ci.channel)
            if st is None:
                st = self._chans[ci.channel] = _Chan(ci.epoch, 0)
            if st.epoch != ci.epoch and ci.epoch in st.retired:
                continue
            if st.epoch != ci.epoch or st.last < ci.top:
                n += 1
                self._start_fill(ci.channel)
        return n

    async def catch_up(self, channel: str, epoch: str, top: int, wait_s: float) -> tuple[str, int] | None:
        """Wait (at most ``wait_s`` seconds) until the channel is released up to ``(epoch, top)`` (a position
        the log holds), filling from the log at once rather than after ``gap_wait``. Returns the released
        position then (which may still be short of it after the timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            st = self._chans.get(channel)
            if st is None:
                st = self._chans[channel] = _Chan(epoch, 0)
            if (st.epoch == epoch and st.last >= top) or epoch in st.retired or self._closed:
                return st.epoch, st.last
            left = deadline - loop.time()
            if left <= 0:
                return st.epoch, st.last
            self._start_fill(channel)
            done = st.done
            if done is None:
                await asyncio.sleep(0)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), left)

    # -- release ------------------------------------------------------------------------------------------

    def note_time(self, time_ns: int) -> None:
        """Everything committed up to ``time_ns`` is released or being filled (a seed or a sync read the log's
        heads after that commit time)."""
        self.max_time = max(self.max_time, time_ns)

    def _release(self, ev: Event, origin: Origin | None) -> None:
        self.released_count += 1
        self.max_time = max(self.max_time, ev.time_ns)
        try:
            self._deliver(ev, origin)
        except Exception:  # one faulty delivery must not stop the channel's stream
            log.exception("cluster: delivering %s #%d failed", ev.channel, ev.seq)

    def _drain(self, st: _Chan[Origin], *, purge: bool = True) -> None:
        """Release the buffered seqs that now follow; with ``purge``, drop those at or below the position
        too. Only a move of the position past buffered seqs (a fill, a loss) leaves such ones: an event
        released in order (``purge=False``) moves it by one, to a seq that was not buffered, and draining
        pops each seq it moves to. A buffer of a few thousand seqs behind a gap (two writers' commits
        racing) was otherwise scanned whole at every event released in front of it."""
        pending = st.pending
        if not pending:
            return
        while pending:
            item = pending.pop(st.last + 1, None)
            if item is None:
                break
            self._pending -= 1
            st.last += 1
            self._release(*item)
        if not purge:
            return
        # Buffered seqs at or below the position (released from the log meanwhile) are duplicates.
        stale = [s for s in pending if s <= st.last]
        for s in stale:
            del pending[s]
            self._pending -= 1
            self.duplicates += 1

    def _overflow(self, channel: str, st: _Chan[Origin]) -> None:
        """Too much buffered: this channel's buffer goes (the log has it all) and it is filled now."""
        n = st.buffered()
        if n:
            log.warning("cluster: %d events buffered for %s; filling it from the log instead", n, channel)
        self._pending -= n
        st.pending = st.other = None
        self._start_fill(channel)

    # -- fills --------------------------------------------------------------------------------------------

    def _start_fill(self, channel: str) -> None:
        st = self._chans.get(channel)
        if st is None or self._closed:
            return
        if st.timer is not None:
            st.timer.cancel()
            st.timer = None
        if st.filling:
            st.again = True
            return
        st.filling = True
        st.done = asyncio.Event()
        self._tasks.spawn(self._fill(channel, st), f"cluster-fill {channel}")

    async def _fill(self, channel: str, st: _Chan[Origin]) -> None:
        retry = False
        try:
            async with self._fills:
                self.fills += 1
                head = await self._head(channel)
                if head.epoch and head.epoch != st.epoch:
                    await self._fill_range(channel, st, None)  # the old epoch's last events
                    self._switch(st, head.epoch)
                else:
                    self._retire_others(st)
                if head.epoch:
                    await self._fill_range(channel, st, head.top)
        except HubbubError as exc:  # the log away: logged and counted, tried again
            self.fill_errors += 1
            self._tasks.supervision.note("sequencer", f"filling {channel} from the log", exc, "tried again")
            retry = True
        except Exception as exc:
            self.fill_errors += 1
            self._tasks.supervision.failed("sequencer", f"filling {channel} from the log", exc, "tried again")
            retry = True
        finally:
            st.filling = False
            if st.done is not None:
                st.done.set()
                st.done = None
        if self._closed:
            return
        self._drain(st)
        if retry:
            loop = asyncio.get_running_loop()
            st.timer = loop.call_later(max(self.gap_wait, 0.5), self._start_fill, channel)
        elif st.again or st.other:
            st.again = False
            self._start_fill(channel)
        elif st.pending and st.timer is None:
            # Seqs beyond the head the fill read: committed since, and in flight.
            loop = asyncio.get_running_loop()
            st.timer = loop.call_later(self.gap_wait, self._start_fill, channel)

    def _switch(self, st: _Chan[Origin], epoch: str) -> None:
        """The log's current epoch is ``epoch``: the one released so far is finished."""
        self._pending -= len(st.pending or ())
        st.retire(st.epoch)
        # The position first: a reader thread (released()) may look between the two stores, and must never
        # see the new epoch with the old epoch's seq.
        st.last = 0
        st.epoch = epoch
        st.pending = st.other.pop(epoch, None) if st.other else None
        self._retire_others(st)

    def _retire_others(self, st: _Chan[Origin]) -> None:
        """Events of epochs that are not the log's current one (nor the released one): late events of an
        epoch retired before this node saw its successor."""
        if not st.other:
            return
        for ep, items in st.other.items():
            if ep != st.epoch:
                st.retire(ep)
                self._pending -= len(items)
                self.duplicates += len(items)
        st.other = None

    async def _fill_range(self, channel: str, st: _Chan[Origin], top: int | None) -> None:
        """Release the released epoch's events after the position up to ``top`` (None: to its end), taking
        buffered events where they are and reading the rest from the log."""
        epoch = st.epoch
        if top is not None and not self._interested(channel):
            # Nobody here subscribes to it: nothing to read or release, only the position to move; what is
            # buffered up to it goes too (another writer's commits racing this node's own on a channel
            # nobody here reads were otherwise read back from the log to be released to no one).
            self.skipped += max(top - st.last, 0)
            st.last = max(st.last, top)
            if st.pending:
                gone = [s for s in st.pending if s <= top]
                for s in gone:
                    del st.pending[s]
                self._pending -= len(gone)
            return
        #: The buffered seqs, sorted, to find the next one past a hole without scanning the buffer at each
        #: hole; taken again when one of them left the buffer (an overflow). Seqs buffered since are read
        #: from the log with the rest and taken from the buffer as they come (``take``).
        buffered: list[int] | None = None
        while top is None or st.last < top:
            nxt = st.last + 1
            item = st.take(nxt)
            if item is not None:
                self._pending -= 1
                st.last = nxt
                self._release(*item)
                continue
            i = 0
            if buffered is not None:
                i = bisect.bisect_right(buffered, nxt)
            if buffered is None or (i < len(buffered) and buffered[i] not in (st.pending or ())):
                buffered = sorted(st.pending or ())
                i = bisect.bisect_right(buffered, nxt)
            stop = buffered[i] - 1 if i < len(buffered) else top
            want = FILL_PAGE if stop is None else min(FILL_PAGE, stop - st.last)
            events = await self._read(channel, epoch, st.last, want)
            if st.epoch != epoch:
                return
            if stop is not None:
                events = [e for e in events if e.seq <= stop]
            if not events:
                if stop is None:
                    return  # the epoch ends here
                self._lose(channel, st, stop)
                continue
            if events[0].seq > st.last + 1:
                self._lose(channel, st, events[0].seq - 1)
            for e in events:
                if e.seq != st.last + 1:
                    continue  # released meanwhile from the buffer
                item = st.take(e.seq)
                if item is not None:
                    self._pending -= 1
                else:
                    self.filled += 1
                st.last = e.seq
                self._release(*(item or (e, None)))

    def _lose(self, channel: str, st: _Chan[Origin], up_to: int) -> None:
        """Seqs after the position up to ``up_to`` are gone from the log: skip them, loudly."""
        n = up_to - st.last
        self.lost += n
        log.warning(
            "cluster: %s: %d events (seq %d..%d) were trimmed before this node could deliver them",
            channel, n, st.last + 1, up_to,
        )  # fmt: skip
        st.last = up_to
        self._drain(st)
        self._on_lost(channel)

    def supervise(self, supervision: Supervision) -> None:
        """Report the fills' failures to ``supervision`` (the node's), from now on."""
        self._tasks.supervision = supervision

    async def close(self) -> None:
        self._closed = True
        for st in self._chans.values():
            if st.timer is not None:
                st.timer.cancel()
                st.timer = None
        await self._tasks.aclose()

    def statistics(self) -> dict[str, Any]:
        return {
            "channels": len(self._chans),
            "buffered": self._pending,
            "released": self.released_count,
            "duplicates": self.duplicates,
            "gaps": self.gaps,
            "fills": self.fills,
            "filled": self.filled,
            "lost": self.lost,
            "fill_errors": self.fill_errors,
            "skipped": self.skipped,
        }
