"""Live fan-out: committed events to the sessions whose subscriptions match them.

Concurrency contract: called from the event loop only, by the :class:`~hubbub.core.node.Node` that owns the
:class:`FanOut` (its commit completion, and the release of held events after a replay). The node's ordering
guarantees (see :mod:`hubbub.core.node`) hold because the node hands events over in commit order: each session
gets a live event at most once, with the ids of every subscription of that session that matches it, and an
event for a subscription whose replay is still being read is held on that subscription instead: on each such
subscription of the session that matches it, the first one sending it to the session's live ones too
(:mod:`hubbub.core.hold`).

Isolation: an encoder, a delivery filter or a session's queue that raises for one session costs that session
only (:class:`~hubbub.core.faults.Faults` closes it, logs, counts); the delivery loop resumes with the next
session, and the fan-out with the next event. Each loop has one ``try`` around it, resumed after the failed
session (its iterator continues where it stopped), never one per session.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast, final

from hubbub.events import Event
from hubbub.log.base import EventRun, runs_of
from hubbub.router import Router

from .faults import Faults
from .filters import FILTER_PREFIX, delivery_filters, passes
from .hold import Share
from .session import RUN_ENTRY_MIN, BatchEncoder, Encoder, FrameRun, Session, packed_limit

if TYPE_CHECKING:
    from .subscriptions import Subscription

__all__ = ["PLAN_CACHE_SIZE", "FanOut"]

#: Fan-out groupings kept (see FanOut._plan); cleared when full.
PLAN_CACHE_SIZE = 4096

#: A fan-out run to one connection of at least this many events is encoded as :class:`EventRun` pieces when
#: the connection's encoder can (``RunEncoder.encode_run``: shared fields encoded once per run).
_RUN_ENCODE_MIN = 4

#: One session's share of a fan-out: the session, its matching subscription ids, those subscriptions.
_Group = tuple[Session, tuple[str, ...], list["Subscription"]]


@final
class FanOut:
    """The node's live delivery. ``router`` and ``holding`` (the subscriptions whose replay is still being
    read) are the node's, only read here; each delivery is counted, per dialect, in ``deliveries``; a session
    whose delivery raised goes to ``faults``. Keeps the grouping of each matched subscription tuple by session
    (:meth:`_plan`), which the node clears whenever a subscription comes or goes (:meth:`clear_plans`)."""

    __slots__ = ("_holding", "_plans", "deliveries", "faults", "router")

    def __init__(
        self,
        router: Router[Subscription],
        holding: set[Subscription],
        deliveries: dict[str, int],
        faults: Faults,
    ) -> None:
        self.router = router
        self._holding = holding
        self.deliveries = deliveries
        self.faults = faults
        self._plans: dict[int, tuple[tuple[Subscription, ...], list[_Group]]] = {}

    def clear_plans(self) -> None:
        """Forget every cached grouping: the router's subscriptions changed."""
        self._plans.clear()

    def fan_out_run(
        self,
        subs: tuple[Subscription, ...],
        events: Sequence[Event],
        origin: Session | None,
        runs: list[EventRun] | None = None,
    ) -> None:
        """Fan out events that match the same subscriptions, none of them holding or filtered: every
        connection with the same encoding and subscription ids shares one :class:`FrameRun`, queued at once
        (and, for batching connections, packed into batch frames once for all of them); a per-connection
        encoder (``Encoder.per_connection``) encodes its own frames, through the run's shared rendering cache.

        A session's overflow may change the subscriptions meanwhile (a catch-up unsubscribes): ``subs`` holds
        for this run only, and the caller matches the next run's events after this call. ``runs``:
        ``runs_of(events)``, when the caller has them already."""
        plan = self._plan(subs)
        deliveries = self.deliveries
        if len(events) == 1:
            # One event (a lone publish, or a burst whose events each reach other connections, as sparse tag
            # subscriptions make them): no run to share, so no FrameRun per connection, only the shared
            # rendering per encoding (what fan_out does).
            ev = events[0]
            renders: dict[str, dict[Any, Any]] = {}
            deliver = self.deliver
            todo = iter(plan)
            logged: set[str] | None = None
            while True:
                try:
                    for sess, ids, _group in todo:
                        if sess is origin and not sess.echo:
                            continue
                        deliver(sess, ev, ids, renders)
                    return
                except Exception as exc:  # one session's failure: see the module docstring
                    logged = self.faults.close(sess, ev.channel, ev.seq, exc, logged)
        if len(plan) == 1:
            # One connection (the 1→1 case): no frame sharing to arrange, encode and queue the run directly.
            sess, ids, _group = plan[0]
            if sess is origin and not sess.echo:
                return
            try:
                limit = _packs(sess, len(events))
                if limit:
                    entry = _packed_run(sess.encoder, events, ids, runs, limit)
                else:
                    frames = _run_frames(sess.encoder, events, ids, runs)
                    entry = FrameRun(frames, sum(map(len, frames)))
                n = sess.deliver_run(entry)
            except Exception as exc:  # this session's failure: see the module docstring
                self.faults.close(sess, events[0].channel, events[0].seq, exc, events=len(events))
                return
            if n:
                d = sess.dialect
                deliveries[d] = deliveries.get(d, 0) + n
            return
        run_caches: dict[str, list[dict[Any, Any]]] = {}
        run_frames: dict[tuple[str, tuple[str, ...], int], FrameRun] = {}
        todo = iter(plan)
        logged = None
        while True:
            try:
                for sess, ids, _group in todo:
                    if sess is origin and not sess.echo:
                        continue
                    enc = sess.encoder
                    # Batching connections that take packed-only runs share them per batch size.
                    limit = _packs(sess, len(events))
                    fk = (enc.key, ids, limit)
                    hit = run_frames.get(fk)
                    if hit is None and limit:
                        hit = run_frames[fk] = _packed_run(enc, events, ids, runs, limit)
                    elif hit is not None and getattr(enc, "per_connection", False):
                        # Frames encoded for another connection: this encoder must see its own
                        # connection's events (Encoder.per_connection), so it encodes them, through the same
                        # rendering cache.
                        shared = run_caches.get(enc.key) or [{} for _ in events]
                        encode = enc.encode_event
                        frames = [encode(ev, ids, False, c) for ev, c in zip(events, shared, strict=True)]
                        hit = FrameRun(frames, sum(map(len, frames)))
                    elif hit is None:
                        if (
                            len(events) >= _RUN_ENCODE_MIN
                            and hasattr(enc, "encode_run")
                            and not getattr(enc, "per_connection", False)
                        ):
                            if runs is None:
                                runs = runs_of(events)
                            frames = _run_frames(enc, events, ids, runs)
                        else:
                            caches = run_caches.get(enc.key)
                            if caches is None:
                                caches = run_caches[enc.key] = [{} for _ in events]
                            encode = enc.encode_event
                            frames = [encode(ev, ids, False, c) for ev, c in zip(events, caches, strict=True)]
                        # Kept only once encoded whole: after a failure, the next session of the encoding
                        # tries again (its own failure closes it too).
                        hit = run_frames[fk] = FrameRun(frames, sum(map(len, frames)))
                    n = sess.deliver_run(hit)
                    if n:
                        d = sess.dialect
                        deliveries[d] = deliveries.get(d, 0) + n
                return
            except Exception as exc:  # one session's failure: see the module docstring
                first = events[0]
                logged = self.faults.close(sess, first.channel, first.seq, exc, logged, events=len(events))

    def fan_out(self, event: Event, origin: Session | None) -> None:
        """Fan out one event: to the sessions of its matching subscriptions that pass its delivery filters,
        or held for a matching subscription whose replay is still being read."""
        subs = self.router.match(event.channel, event.tags)
        if not subs:
            return
        # The filters depend on the session only: checked per session in the loop, where a failure costs
        # that session alone (and the grouping of the unfiltered match stays cacheable).
        filters: list[tuple[str, str]] | None = None
        if event.headers and any(k.startswith(FILTER_PREFIX) for k in event.headers):
            filters = delivery_filters(event)
        caches: dict[str, dict[Any, Any]] = {}
        if len(subs) == 1:
            s = subs[0]
            sess = s.session
            if sess is origin and not sess.echo:
                return
            try:
                if filters is not None and not passes(sess, filters):
                    return
                if s.holding is not None:
                    s.holding.add(event, Share(s, ()), True)
                    return
                self.deliver(sess, event, (s.sub_id,), caches)
            except Exception as exc:  # this session's failure: see the module docstring
                self.faults.close(sess, event.channel, event.seq, exc)
            return
        plan = self._plan(subs)
        holding = self._holding
        deliver = self.deliver
        todo = iter(plan)
        logged: set[str] | None = None
        while True:
            try:
                for sess, ids, group in todo:
                    if sess is origin and not sess.echo:
                        continue
                    if filters is not None and not passes(sess, filters):
                        continue
                    if holding and _hold(group, event):
                        continue
                    deliver(sess, event, ids, caches)
                return
            except Exception as exc:  # one session's failure: see the module docstring
                logged = self.faults.close(sess, event.channel, event.seq, exc, logged)

    def _plan(self, subs: tuple[Subscription, ...]) -> list[_Group]:
        """The matched subscriptions grouped by session, in match order: each session gets an event once,
        listing all its matching subscription ids. The router returns the same tuple for a channel until
        its subscriptions change, so the grouping is cached by that tuple's identity."""
        hit = self._plans.get(id(subs))
        if hit is not None and hit[0] is subs:
            return hit[1]
        groups: dict[Session, list[Subscription]] = {}
        for s in subs:
            g = groups.get(s.session)
            if g is None:
                groups[s.session] = [s]
            else:
                g.append(s)
        plan = [(sess, tuple(s.sub_id for s in group), group) for sess, group in groups.items()]
        if len(self._plans) >= PLAN_CACHE_SIZE:
            self._plans.clear()
        # The entry keeps ``subs`` alive, so its id cannot be reused while the entry exists.
        self._plans[id(subs)] = (subs, plan)
        return plan

    def deliver(
        self, sess: Session, event: Event, sub_ids: Sequence[str], caches: dict[str, dict[Any, Any]]
    ) -> None:
        """Queue ``event`` to ``sess`` for its subscriptions ``sub_ids``, encoded through the cache of the
        session's encoding in ``caches`` (shared by every session of one fan-out)."""
        key = sess.encoder.key
        cache = caches.get(key)
        if cache is None:
            cache = caches[key] = {}
        if sess.deliver(event, sub_ids, cache):
            d = sess.dialect
            self.deliveries[d] = self.deliveries.get(d, 0) + 1


def _hold(group: list[Subscription], event: Event) -> bool:
    """Hold ``event`` on every subscription of ``group`` (one session's, matching it) whose replay is still
    being read; ``False`` when none is. Each of them sends it for itself at its junction, unless its replay
    covered it; the first one sends it to the group's live subscriptions too (see :mod:`hubbub.core.hold`)."""
    if len(group) == 1:
        s = group[0]
        if s.holding is None:
            return False
        s.holding.add(event, Share(s, ()), True)
        return True
    holders = [s for s in group if s.holding is not None]
    if not holders:
        return False
    share = Share(holders[0], tuple(s for s in group if s.holding is None))
    alone = len(holders) == 1
    for s in holders:
        assert s.holding is not None
        s.holding.add(event, share, alone)
    return True


def _run_frames(
    encoder: Encoder, events: Sequence[Event], ids: tuple[str, ...], runs: list[EventRun] | None
) -> list[bytes]:
    """The live event frames of ``events`` (one fan-out run) for a connection whose matching subscriptions are
    ``ids``. Through ``RunEncoder.encode_run`` (every field the events share encoded once per
    :class:`EventRun`; ``runs``: ``runs_of(events)`` when already grouped) when the encoder has it and the run
    has at least ``_RUN_ENCODE_MIN`` events, else event by event; the same bytes either way."""
    encode_run = getattr(encoder, "encode_run", None)
    if encode_run is None or len(events) < _RUN_ENCODE_MIN:
        encode = encoder.encode_event
        return [encode(ev, ids, False, {}) for ev in events]
    frames: list[bytes] = []
    for r in runs_of(events) if runs is None else runs:
        frames += encode_run(r.proto, r.rows, ids, False)
    return frames


def _packs(sess: Session, k: int) -> int:
    """The batch size of a session that takes a run of ``k`` live events as a packed-only :class:`FrameRun`
    (:func:`_packed_run`; ``session.packed_limit``), else 0: a run shorter than ``RUN_ENTRY_MIN`` is queued
    frame by frame. Under DISCONNECT a run the queue cannot take whole closes the session either way, and the
    close clears what was queued."""
    return packed_limit(sess) if k >= RUN_ENTRY_MIN else 0


def _packed_run(
    encoder: Encoder, events: Sequence[Event], ids: tuple[str, ...], runs: list[EventRun] | None, limit: int
) -> FrameRun:
    """The live frames of ``events`` (one fan-out run) as a packed-only :class:`FrameRun` of batch frames of
    at most ``limit`` bytes, built without the single frames (``BatchEncoder.encode_run_batches``), as
    ``Session.replay_run_chunks`` builds a replay's: the bytes a batching writer would have packed, without
    a frame per event first; shared by every connection of the encoding, ids and batch size."""
    encode = cast("BatchEncoder", encoder).encode_run_batches
    packed: list[bytes] = []
    for r in runs_of(events) if runs is None else runs:
        packed += encode(r.proto, r.rows, ids, False, limit)
    return FrameRun(None, sum(map(len, packed)), packed, limit, len(events))
