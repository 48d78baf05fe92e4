"""The junction of a subscription's replay and its live stream: the held events, paced (ARCHITECTURE §5).

After a subscription's replay is queued, :class:`Junction` delivers the live events its :class:`~hubbub.core.
hold.Hold` kept while the replay ran, those newer than the snapshot, and then ends the hold, in the same loop
step as it finds the hold empty: from then on live fan-out reaches the subscription directly, after every
held event, with no gap and no duplicate.

Live fan-out holds an event on one holding subscription for its whole connection, so the junction also
delivers each held event to the connection's other live subscriptions that match it, those inside the
snapshot included: the replay's frames name the new subscription alone.

The held events are paced on the session's queue like the replay before them (the queue is waited on, never
overflowed): a replay that ends with a full queue and a hold of thousands of events must not make its
connection a slow consumer, nor, under guble's catch-up policy, drop queued events that no catch-up would
send again. While the junction waits, newer live events join the hold.

A hold that spilled (more live events than it keeps arrived during the replay) names, per channel, the first
event it did not keep. The junction sends the kept ones, starts a fresh hold, then reads the lost ones back
from the log in merged order (mapping.md §3: commit time, then channel, then seq), from those positions to the
end of each channel, and goes on with the fresh hold, skipping what the log gave already; it repeats until a
hold is sent without spilling. Memory stays bounded by the hold's limit and one page per channel read back. A
position the log no longer has (trimmed or reset meanwhile) closes the session as a slow consumer: the client
resumes and is told the gap, never a silent one.

An event whose encoding raises (its connection's encoder) closes the session with an internal error
(:class:`~hubbub.core.faults.Faults`): the rest would come after a gap.

Concurrency contract: called from the event loop thread only; the reads run on the node's reader threads.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from typing import Any, final

from hubbub.events import Event, Position
from hubbub.log.base import EventLog

from .filters import delivery_filters, passes
from .hold import Hold
from .reads import LogReads
from .replay import ReplayPlan, merged_key
from .subscriptions import Subscription, SubscriptionRegistry

__all__ = ["READ_BACK_PAGE", "Junction"]

log = logging.getLogger("hubbub.node")

#: Events per read of a channel when lost events are read back from the log.
READ_BACK_PAGE = 1000


def _read_pages(store: EventLog, wanted: list[tuple[str, int]]) -> list[list[Event]]:
    """One page of each channel after its seq (on a reader thread)."""
    return [store.read(ch, after_seq=after, limit=READ_BACK_PAGE) for ch, after in wanted]


@final
class Junction:
    """One subscription's passage from replay to live (see the module docstring). ``scanned``: of a pattern's
    replay (``ReplayScan``), per channel the last position it queued or passed over (none: the plan's
    ``tops`` are the snapshot); ``spills`` counts the holds that spilled."""

    def __init__(
        self,
        reads: LogReads,
        registry: SubscriptionRegistry,
        sub: Subscription,
        plan: ReplayPlan,
        scanned: dict[str, Position] | None = None,
    ) -> None:
        self.reads = reads
        self.registry = registry
        self.sub = sub
        self.tops = plan.tops
        self.scanned = scanned
        self.spills = 0
        #: Per channel, the last position read back from the log: held events up to it were sent already.
        self.covered: dict[str, Position] = {}
        self._caches: dict[str, dict[Any, Any]] = {}

    async def run(self) -> None:
        """Send the held events (and any lost ones, from the log), then end the hold; returns early when the
        session ends or the subscription goes."""
        sub = self.sub
        hold = sub.holding
        covered = self.covered
        while hold is not None:
            i = 0
            while i < len(hold.events):
                ev = hold.events[i]
                i += 1
                done = covered.get(ev.channel)
                if done is not None and ev.epoch == done.epoch and ev.seq <= done.seq:
                    continue  # read back from the log already
                if not await self._deliver(ev):
                    return
            if not hold.spilled:
                # No await since the last event was taken: nothing can join the hold before it ends.
                self.registry.end_hold(sub)
                return
            self.spills += 1
            lost = hold.lost
            # Live events from now on are held again; the log has every lost one, committed before.
            hold = sub.holding = Hold(hold.limit)
            if not await self._read_back(lost):
                return

    def _alive(self) -> bool:
        sess = self.sub.session
        return not (sess.closed or sess.kicked or sess.ending) and self.registry.is_current(self.sub)

    async def _deliver(self, ev: Event) -> bool:
        """Queue one held (or read back) event to the session for the subscriptions that get it, waiting for
        room first. ``False`` when the session ended or the subscription went."""
        if not self._alive():
            return False
        sub = self.sub
        sess = sub.session
        if ev.headers and not passes(sess, delivery_filters(ev)):
            return True
        scanned = self.scanned
        if scanned is not None:
            # A pattern's replay read the log up to its mark: what it replayed or passed over, per channel,
            # is its snapshot; anything later of any channel is the subscription's live stream.
            done = scanned.get(ev.channel)
            in_snapshot = done is not None and ev.epoch == done.epoch and ev.seq <= done.seq
        else:
            top = self.tops.get(ev.channel)
            in_snapshot = top is not None and ev.seq <= top
        # An event inside the snapshot is not the new subscription's (its replay sent it or passed over it,
        # or its stream starts after it), but the connection's other live subscriptions still get it: live
        # fan-out held it here for the whole connection, and a replay's frame names this subscription alone.
        ids = self.registry.held_ids(sub, ev, in_snapshot)
        if not ids:
            return True
        if sess.needs_room():
            await sess.wait_replay_room()
            if not self._alive():
                return False
            # The connection's subscriptions may have changed meanwhile.
            ids = self.registry.held_ids(sub, ev, in_snapshot)
        if ids:
            try:
                self.registry.fanout.deliver(sess, ev, ids, self._caches)
            except Exception as exc:  # this session's failure: see core/faults.py
                self.registry.faults.close(sess, ev.channel, ev.seq, exc, stage="release of held events")
                return False
        return True

    async def _read_back(self, lost: dict[str, Position]) -> bool:
        """Deliver, in merged order, every event of each lost channel from its lost position on, as far as
        the log has them. ``False`` when the session ended, the subscription went or the log lost them."""
        sub = self.sub
        covered = self.covered
        pending: dict[str, deque[Event]] = {}
        heads: list[tuple[tuple[int, bytes, int], str]] = []
        want = [(ch, pos.seq - 1) for ch, pos in lost.items()]
        #: Per channel, where its next page must start; a first page must hold the lost event itself.
        expect = dict(lost)
        first = set(lost)
        while want:
            pages = await self.reads.call(_read_pages, want)
            for (ch, _after), page in zip(want, pages, strict=True):
                pos = expect.pop(ch)
                broken = not page or page[0].seq != pos.seq or page[0].epoch != pos.epoch
                if broken and (page or ch in first):
                    if not self._alive():
                        return False
                    log.info(
                        "held events lost from the log (trimmed or reset meanwhile)",
                        extra={"dialect": sub.session.dialect, "session": sub.session.id},
                    )
                    sub.session.kick(sub.session.slow_close_code)
                    return False
                first.discard(ch)
                if len(page) == READ_BACK_PAGE:  # the channel may go on: read on after this page
                    expect[ch] = Position(page[-1].seq + 1, page[-1].epoch)
                if page:
                    pending[ch] = deque(page)
                    heapq.heappush(heads, (merged_key(page[0]), ch))
            want = []
            while heads:
                _key, ch = heapq.heappop(heads)
                buf = pending[ch]
                ev = buf.popleft()
                # Events that do not match it went to the session's other subscriptions directly.
                if sub.matches(ev) and not await self._deliver(ev):
                    return False
                covered[ch] = Position(ev.seq, ev.epoch)
                if buf:
                    heapq.heappush(heads, (merged_key(buf[0]), ch))
                elif ch in expect:
                    want = [(ch, ev.seq)]  # its next page decides what comes next
                    break
        return True
