"""The replay service: a subscription with a start position gets its snapshot, its replay, then goes live.

A subscription is registered *holding* (:meth:`SubscriptionRegistry.add`): live events that match it are
held (:class:`~hubbub.core.hold.Hold`) while the snapshot and replay are read (on the reader threads,
:class:`~hubbub.core.reads.LogReads`) and queued, paced by the session's queue; then the
:class:`~hubbub.core.junction.Junction` queues the held ones newer than the snapshot, paced the same way, and
ends the hold (ARCHITECTURE §5). Neither the replay nor the held events ever overflow the queue: replay
traffic never makes a subscriber slow. A replay never hides a gap: trimmed or reset positions are reported as
gaps by the plan, and a replay (or a read-back of held events) that loses its snapshot while it is sent closes
the session as a slow consumer. A replayed (or held) event whose encoding raises closes the
session with an internal error (:class:`~hubbub.core.faults.Faults`), as live delivery does: never a replay
that stops silently, nor a subscription left holding.

Concurrency contract: called from the event loop thread only; store reads run on the reader threads, epoch
changes on the writer thread (``control``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, final

from hubbub.channels import Pattern
from hubbub.disconnect import Disconnect
from hubbub.errors import HubbubError, SubscriptionError
from hubbub.events import Event, Position
from hubbub.log.base import ChannelInfo, EventLog, EventRun, LogStore
from hubbub.selection import Selection, SubtreeFetch

from .access import Access, only_visible
from .filters import delivery_filters, passes, withheld
from .junction import Junction
from .reads import LogReads, ReadAhead, drop
from .replay import Gap, ReplayPlan, ReplaySpan
from .replay_plans import Keep, plan_selection
from .replay_scan import send_scan
from .session import FrameRun, Session
from .subscriptions import Subscription, SubscriptionRegistry

__all__ = ["REPLAY_PAGE", "ReplayService", "fetch_filter", "reads_all"]

log = logging.getLogger("hubbub.node")

T = TypeVar("T")

#: Events per page of an exact channel's replay (ReplayService._replay_span): large enough that the per-page
#: costs (statements, a reader-thread hand-off, one queue step) vanish per event, small enough to hold two.
REPLAY_PAGE = 2048
#: Payload bytes per page of an exact channel's replay (``read_runs(max_bytes=...)``), as ``SCAN_PAGE_BYTES``
#: for a pattern's: the pages in flight hold about 12 MiB of payloads, not 2048 times the largest event.
REPLAY_PAGE_BYTES = 4 << 20
#: Pages of an exact channel's replay read at once while the loop sends the one before them
#: (:class:`~.reads.ReadAhead`): two reader threads, so two cores, on the store's reads (the replay's largest
#: cost) beside the loop's sending.
READ_AHEAD = 2


def fetch_filter(access: Access, session: Session) -> Keep:
    """Whether a fetch for ``session`` selects an event (guble.md §5: events that fail the connection's
    filters or permissions are not part of the selection, so counts and "last N" see only the others). Runs
    on a reader thread: the permission check only reads the identity's grants."""
    authorizer, may_read = access.authorizer, access.may_read

    def keep(e: Event) -> bool:
        if authorizer.enabled and not may_read(session.identity, e.channel):
            return False
        return not e.headers or passes(session, delivery_filters(e))

    return keep


def reads_all(access: Access, session: Session, pattern: Pattern) -> bool:
    """Whether :func:`fetch_filter` accepts every event of ``pattern`` without headers: the session's
    identity reads all of it (a fetch's count may then come from the log's rows)."""
    return access.visibility(session.identity, pattern) is None


@final
class ReplayService:
    """See the module docstring. ``store``: the log as the node reads it (a cluster node's view,
    ``hubbub.cluster.view``); ``control(fn)`` runs ``fn(store)`` on the writer thread, with the log store."""

    def __init__(
        self,
        store: EventLog,
        reads: LogReads,
        registry: SubscriptionRegistry,
        control: Callable[[Callable[[LogStore], Any]], Awaitable[Any]],
    ) -> None:
        self.store = store
        self.reads = reads
        self.registry = registry
        self._control = control
        #: Awaited before a subscription is registered: the node's relay's (``core/relay.py``
        #: ``SubscribeBarrier``, a worker's), else None (a single process: registered at once).
        self.barrier: Callable[[], Awaitable[None]] | None = None
        #: Holds that spilled (more live events arrived during a replay than a hold keeps; Junction).
        self.spills = 0

    async def subscribe(
        self,
        session: Session,
        sub_id: str,
        pattern: Pattern,
        tags: frozenset[str],
        selection: Selection,
        *,
        on_snapshot: Callable[[ReplayPlan], None],
        on_replayed: Callable[[ReplayPlan], None] | None = None,
        on_gap: Callable[[Gap], None] | None = None,
    ) -> Subscription:
        """``Node.subscribe``: see there."""
        registry = self.registry
        barrier = self.barrier
        if barrier is not None:
            await barrier()  # what was acknowledged before this subscribe is fanned out first
        sub = registry.add(session, sub_id, pattern, tags)
        visible = sub.visible
        keep = fetch_filter(registry.access, session) if isinstance(selection, SubtreeFetch) else None
        keep_all = keep is not None and reads_all(registry.access, session, pattern)
        try:
            plan = await self.reads.call(plan_selection, pattern, selection, keep, keep_all)
            if visible is not None:
                only_visible(plan, pattern, visible)
            for ch in plan.ahead:
                epoch = next(g.position.epoch for g in plan.gaps if g.channel == ch)
                info = await self._new_epoch_if_lost(ch, epoch)
                if info is None:
                    continue  # the client's error: the channel keeps its epoch, the gap says so
                pos = Position(info.top, info.epoch)
                plan.tops[ch] = 0
                plan.gaps = [g if g.channel != ch else Gap(ch, g.since, pos, g.reason) for g in plan.gaps]
                if pattern.is_exact:
                    plan.position = pos
        except BaseException:
            registry.drop(sub)
            raise
        if not registry.is_current(sub):  # unsubscribed or detached meanwhile
            raise SubscriptionError("subscription was cancelled", code=4201)
        on_snapshot(plan)
        sent = 0
        try:
            for ev in plan.events:
                if session.closed or session.kicked:
                    break
                if ev.headers and withheld(session, ev):
                    continue  # not this connection's, as in live fan-out (README §3)
                if session.needs_room():
                    await session.wait_replay_room()
                # A rendering cache of the event's own (encoders cache its bytes under fixed keys).
                sent += session.deliver(ev, [sub_id], {}, replay=True)
        except Exception as exc:  # this session's failure: see core/faults.py
            registry.faults.close(session, ev.channel, ev.seq, exc, stage="replay")
        covered: dict[str, Position] | None = None
        if plan.span is not None and not (session.closed or session.kicked):
            sent += await self._replay_span(session, sub_id, plan.span)
        elif plan.scan is not None and not (session.closed or session.kicked):
            done = await send_scan(
                self.reads,
                self.store,
                session,
                [sub_id],
                pattern,
                visible,
                plan.scan,
                plan.tops,
                registry.faults,
                on_gap=on_gap,
            )
            sent += done.sent
            covered = done.expect
        plan.sent = sent
        if on_replayed is not None and plan.replayed:
            on_replayed(plan)
        junction = Junction(self.reads, registry, sub, plan, covered)
        try:
            await junction.run()
        finally:
            # A junction ends early when its subscription is replaced (guble's catch-up going live again
            # cancels it): the spills it had are counted all the same.
            self.spills += junction.spills
        return sub

    async def fetch(self, session: Session, pattern: Pattern, fetch: SubtreeFetch) -> ReplayPlan:
        """``Node.fetch``: the plan of a fetch without subscribing, filtered for ``session``; its events are
        sent with :meth:`send_fetched`."""
        access = self.registry.access
        return await self.reads.call(
            plan_selection, pattern, fetch, fetch_filter(access, session), reads_all(access, session, pattern)
        )

    async def send_fetched(self, session: Session, pattern: Pattern, plan: ReplayPlan) -> int:
        """``Node.send_fetched``: queue the events of a fetched plan's scan (``Node.fetch``; a counted
        :class:`~hubbub.core.replay.ReplayScan`) to ``session`` without subscribing, paced by its queue, at
        most the counted number; returns how many were queued. A scan that no longer finds what it counted
        closes the session as a slow consumer (the count went out already)."""
        if plan.scan is None:
            return 0
        registry = self.registry
        visible = registry.access.visibility(session.identity, pattern)
        done = await send_scan(
            self.reads, self.store, session, [], pattern, visible, plan.scan, {}, registry.faults, exact=False
        )
        return done.sent

    async def _replay_span(self, session: Session, sub_id: str, span: ReplaySpan) -> int:
        """Queue an exact channel's replay page by page: each page is read (:meth:`EventLog.read_runs`) and,
        when the session's encoder is a :class:`~hubbub.core.session.RunEncoder`, encoded on a reader thread
        while the loop queues and writes the previous one (:data:`READ_AHEAD` pages read at once); the queue
        paces the reading, so the replay holds at most ``READ_AHEAD + 1`` pages whatever its length. Runs
        whose delivery filters withhold them from the session are passed over (neither encoded nor queued).
        Returns how many events it queued.

        The reader thread also cuts each run into the chunks the queue takes (``Session.replay_chunks``); for
        a batching session they come as batch frames already (``Session.replay_run_chunks``), built without
        the single event frames, so the loop only queues them and the writer sends them as they are.

        The snapshot promised every event of the span. If a page does not continue it exactly (the events were
        trimmed or the channel reset meanwhile, which a slow replay invites), the session is closed as a slow
        consumer rather than leave a silent gap: the client resumes with ``since`` and gets an explicit gap.
        A failed read closes the session with the error's code (the subscription's reply went out already);
        an encoding that raises (on the reader thread or here), with an internal error (core/faults.py).
        """
        read_runs = self.store.read_runs
        channel, top = span.channel, span.top
        subs = (sub_id,)
        encode_run = getattr(session.encoder, "encode_run", None)
        chunks = session.replay_chunks
        packed_chunks = session.replay_run_chunks

        def read_page(after: int) -> tuple[list[EventRun], list[list[FrameRun] | None] | None]:
            runs = read_runs(channel, after, top, REPLAY_PAGE, max_bytes=REPLAY_PAGE_BYTES)
            if encode_run is None:
                return runs, None
            # A run's events share their headers, so one filter check covers the run; a withheld run
            # (None) is not encoded at all.
            return runs, [
                None
                if r.proto.headers and withheld(session, r.proto)
                else packed_chunks(r, subs) or chunks(encode_run(r.proto, r.rows, subs, True))
                for r in runs
            ]

        after = span.after
        sent = 0
        ahead = ReadAhead(self.reads, read_page, top, REPLAY_PAGE, READ_AHEAD)
        pending = ahead.take(after)
        try:
            while after < top:
                try:
                    runs, encoded = await pending
                except HubbubError as exc:
                    log.warning("replay read failed: %s", exc, extra={"session": session.id})
                    session.kick(Disconnect.of(exc.code))
                    break
                end = runs[-1].last_seq if runs else after
                if runs and end < top:
                    pending = ahead.take(end)
                for i, run in enumerate(runs):
                    if run.proto.seq != after + 1 or run.proto.epoch != span.epoch:
                        break
                    chunked: list[FrameRun] | None
                    if encoded is not None:
                        chunked = encoded[i]
                    elif run.proto.headers and withheld(session, run.proto):
                        chunked = None
                    else:
                        chunked = session.replay_chunks(session.encode_run(run, subs))
                    if chunked is None:
                        # Withheld by its delivery filters: passed over, but the replay's position moves
                        # past it, so the continuity check and the live junction see no gap.
                        if session.closed or session.kicked or session.ending:
                            return sent
                        after += len(run.rows)
                        continue
                    n = await session.replay_runs(chunked)
                    sent += n
                    after += n
                    if n < len(run.rows):
                        return sent
                if after != end or not runs:
                    if after < top and not (session.closed or session.kicked or session.ending):
                        log.info(
                            "replay lost its snapshot (trimmed or reset meanwhile)",
                            extra={"dialect": session.dialect, "session": session.id},
                        )
                        session.kick(session.slow_close_code)
                    break
        except Exception as exc:  # an encoding (here or on the reader thread): see core/faults.py
            self.registry.faults.close(session, channel, after + 1, exc, stage="replay")
        finally:
            drop(pending)
            ahead.close()
        return sent

    async def _new_epoch_if_lost(self, channel: str, epoch: str) -> ChannelInfo | None:
        """A client saw commits beyond the top of the channel's epoch ``epoch`` (a ``since`` ahead). Where the
        store says commits of that epoch may have been lost (the previous server stopped without closing the
        log, and did not sync every commit), continuity is broken: start a new epoch (the old one's events
        stay in the store) and return its head, as native.md §6 asks. Anywhere else the claim cannot be true
        (nothing was lost: ``fsync``, a clean stop, an epoch begun since) and would only let a client cut
        every other client's recovery short, so nothing changes and this returns ``None``.

        On the writer thread: the check and the reset are one step, so of several clients claiming the same
        lost commits only the first starts a new epoch (the others find a newer one)."""

        def new_epoch(st: LogStore) -> ChannelInfo | None:
            return st.reset_channel(channel) if st.commits_may_be_lost(channel, epoch) else None

        info: ChannelInfo | None = await self._control(new_epoch)
        return info
