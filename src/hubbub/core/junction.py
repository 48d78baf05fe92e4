"""The junction of a subscription's replay and its live stream: the held events, paced (ARCHITECTURE §5).

After a subscription's replay is queued, :class:`Junction` delivers the live events its :class:`~hubbub.core.
hold.Hold` kept while the replay ran, those newer than the snapshot, and then ends the hold, in the same loop
step as it finds the hold empty: from then on live fan-out reaches the subscription directly, after every
held event, with no gap and no duplicate.

Live fan-out holds an event on every replaying subscription of its connection that matches it
(:mod:`hubbub.core.hold`), and on the first of them, its owner, for the connection's live subscriptions that
match it too: each junction delivers a held event to its own subscription unless the event is inside its
snapshot, and the owner's to those live subscriptions, those inside the snapshot included (the replay's
frames name the new subscription alone). So every subscription gets each event once, whichever replays end
first: its replay or its own hold, or its live stream.

The held events are paced on the session's queue like the replay before them (the queue is waited on, never
overflowed): a replay that ends with a full queue and a hold of thousands of events must not make its
connection a slow consumer, nor, under guble's catch-up policy, drop queued events that no catch-up would
send again. While the junction waits, newer live events join the hold.

A hold that spilled (more live events than it keeps arrived during the replay) names, per channel, the first
event it did not keep. The junction sends the kept ones, starts a fresh hold, then reads the lost ones back
from the log in merged order (mapping.md §3: commit time, then channel, then seq), from those positions to the
last event the hold lost of each channel (what follows is on the fresh hold), and goes on with the fresh
hold; it repeats until a hold is sent without spilling. A lost event goes to the live subscriptions the hold
owed it to: those live when the fresh hold started, and of those that went live while the hold was spilled,
only the events it lost after that; when the hold also lost events shared with another replaying
subscription, which of them this hold owned (or another junction sent) is not known, and an event owed to
them, or any for a connection whose frames do not name subscriptions, closes the session as a slow consumer
(the client resumes; neither a gap nor a duplicate goes out). Memory stays bounded by the hold's limit and
one page per channel read back. A position the log no longer has (trimmed or reset meanwhile) closes the
session as a slow consumer: the client resumes and is told the gap, never a silent one.

An event whose encoding raises (its connection's encoder) closes the session with an internal error
(:class:`~hubbub.core.faults.Faults`): the rest would come after a gap.

Concurrency contract: called from the event loop thread only; the reads run on the node's reader threads.
"""

from __future__ import annotations

import heapq
import logging
from collections import deque
from collections.abc import Collection
from typing import final

from hubbub.events import Event, Position
from hubbub.log.base import EventLog

from .filters import delivery_filters, passes
from .hold import Hold, Share
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
        #: Whether the session's frames name its subscriptions (``Encoder.names_subscriptions``).
        self.names: bool = getattr(sub.session.encoder, "names_subscriptions", False)

    async def run(self) -> None:
        """Send the held events (and any lost ones, from the log), then end the hold; returns early when the
        session ends or the subscription goes."""
        sub = self.sub
        hold = sub.holding
        while hold is not None:
            i = 0
            while i < len(hold.events):
                ev, share = hold.events[i], hold.shares[i]
                i += 1
                if not await self._deliver(ev, share.live if share.owner is sub else (), share):
                    return
            if not hold.spilled:
                # No await since the last event was taken: nothing can join the hold before it ends.
                self.registry.end_hold(sub)
                return
            self.spills += 1
            spilled = hold
            # The live subscriptions it owed lost events to: none going live from now on (they were holding).
            live_then = [s for s in self.registry.subscriptions(sub.session) if s.holding is None]
            # Live events from now on are held again; the log has every lost one, committed before.
            hold = sub.holding = Hold(hold.limit)
            if not await self._read_back(spilled, live_then):
                return

    def _alive(self) -> bool:
        sess = self.sub.session
        return not (sess.closed or sess.kicked or sess.ending) and self.registry.is_current(self.sub)

    async def _deliver(self, ev: Event, live: Collection[Subscription], share: Share | None = None) -> bool:
        """Queue one held (or read back) event to the session for the subscriptions that get it (this one
        and those of ``live``), waiting for room first, unless the session's frames do not name its
        subscriptions and another junction sent it (``share``). ``False`` when the session ended or the
        subscription went."""
        if not self._alive():
            return False
        sub = self.sub
        sess = sub.session
        once = share if share is not None and not self.names else None
        if once is not None and once.sent:
            return True
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
        # or its stream starts after it), but the connection's live subscriptions it owes it still get it:
        # live fan-out held it here for them, and a replay's frame names this subscription alone.
        ids = self.registry.held_ids(sub, ev, in_snapshot, live)
        if not ids:
            return True
        if sess.needs_room():
            await sess.wait_replay_room()
            if not self._alive():
                return False
            if once is not None and once.sent:
                # Another junction holding it sent it meanwhile (it waited for room too, and got it first).
                return True
            # The connection's subscriptions may have changed meanwhile.
            ids = self.registry.held_ids(sub, ev, in_snapshot, live)
        if ids:
            if once is not None:
                once.sent = True
            try:
                # A rendering cache of its own: an encoder caches an event's bytes in it under a fixed key.
                self.registry.fanout.deliver(sess, ev, ids, {})
            except Exception as exc:  # this session's failure: see core/faults.py
                self.registry.faults.close(sess, ev.channel, ev.seq, exc, stage="release of held events")
                return False
        return True

    def _lost(self, why: str) -> None:
        """Close the session as a slow consumer: what the hold lost cannot be sent without a gap or a
        duplicate (the client resumes from what it has)."""
        if self._alive():
            sess = self.sub.session
            log.info(why, extra={"dialect": sess.dialect, "session": sess.id})
            sess.kick(sess.slow_close_code)

    async def _read_back(self, spilled: Hold, live_then: list[Subscription]) -> bool:
        """Deliver, in merged order, every event of each lost channel from its lost position to the last one
        the hold lost, to this subscription and to the live ones it owed them to (the module docstring).
        ``False`` when the session ended, the subscription went or the log lost them."""
        sub = self.sub
        lost, last, joined = spilled.lost, spilled.last, spilled.joined
        pending: dict[str, deque[Event]] = {}
        heads: list[tuple[tuple[int, bytes, int], str]] = []
        want = [(ch, pos.seq - 1) for ch, pos in lost.items()]
        #: Per channel, where its next page must start; a first page must hold the lost event itself.
        expect = dict(lost)
        first = set(lost)
        while want:
            pages = await self.reads.call(_read_pages, want)
            for (ch, _after), read in zip(want, pages, strict=True):
                pos = expect.pop(ch)
                page = read
                broken = not page or page[0].seq != pos.seq or page[0].epoch != pos.epoch
                if broken and (page or ch in first):
                    self._lost("held events lost from the log (trimmed or reset meanwhile)")
                    return False
                first.discard(ch)
                end = last[ch].seq
                if page and page[-1].seq > end:  # the events after it are on the next hold
                    page = [e for e in page if e.seq <= end]
                elif len(page) == READ_BACK_PAGE and page[-1].seq < end:  # read on after this page
                    expect[ch] = Position(page[-1].seq + 1, page[-1].epoch)
                if page:
                    pending[ch] = deque(page)
                    heapq.heappush(heads, (merged_key(page[0]), ch))
            want = []
            while heads:
                _key, ch = heapq.heappop(heads)
                buf = pending[ch]
                ev = buf.popleft()
                # Events that do not match it went to the session's other subscriptions without this hold.
                if sub.matches(ev):
                    owed = [s for s in live_then if s.matches(ev) and _owed(joined.get(s), ev)]
                    if spilled.shared and (owed or not self.names):
                        # Whether this hold or another one owed it to them, or sent it, is not known.
                        self._lost(
                            "held events shared with another replaying subscription lost from the hold"
                        )
                        return False
                    if not await self._deliver(ev, owed):
                        return False
                if buf:
                    heapq.heappush(heads, (merged_key(buf[0]), ch))
                elif ch in expect:
                    want = [(ch, ev.seq)]  # its next page decides what comes next
                    break
        return True


def _owed(joined: dict[str, Position] | None, ev: Event) -> bool:
    """Whether a lost event is owed to a subscription that went live while the hold was spilled, the hold's
    last lost events being ``joined`` then (``None``: live before the hold spilled)."""
    if joined is None:
        return True
    before = joined.get(ev.channel)
    return before is None or ev.epoch != before.epoch or ev.seq > before.seq
