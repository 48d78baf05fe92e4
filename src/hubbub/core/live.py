"""Live fan-out of committed events: matched against the subscriptions, counted as published, and handed to
:class:`~hubbub.core.fanout.FanOut` in runs.

A commit's events come in through :meth:`LiveFanOut.fan_out_committed` (the write batcher's ``on_committed``
on a node without a relay), what a cluster relay releases through :meth:`LiveFanOut.fan_out_events`
(``Node.fan_out_many``), both in commit order. Consecutive events with the same subscriptions and origin
fan out as one run, each connection taking the run's frames in one step; a subscription still holding (its
replay being read, ``SubscriptionRegistry``) gets its events one by one, kept on its hold.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, final

from hubbub.events import Event, Publisher
from hubbub.log.appended import Committed, RunAppended, RunEvents, expand_runs
from hubbub.log.base import EventRun
from hubbub.router import Router

from .batcher import Pending, run_length
from .fanout import FanOut
from .filters import FILTER_PREFIX
from .session import Session

if TYPE_CHECKING:
    from .subscriptions import Subscription

__all__ = ["LiveFanOut"]


@final
class LiveFanOut:
    """See the module docstring. ``router``, ``holding`` (the subscriptions holding) and ``published`` (per
    dialect) are the registry's own, held by reference."""

    def __init__(
        self,
        router: Router[Subscription],
        holding: set[Subscription],
        fanout: FanOut,
        published: dict[str, int],
    ) -> None:
        self.router = router
        self._holding = holding
        self.fanout = fanout
        self.published = published

    def fan_out_committed(self, items: list[Pending], result: list[Committed]) -> None:
        """Fan out a committed batch (after its acks), in commit order (:meth:`fan_out_events`), counting
        each new event as published.

        The batch's leading runs (:func:`~hubbub.core.batcher.run_length`: one connection's burst to one
        channel, the steady state of a publisher) fan out as the runs they are, with one match each and
        without grouping their events again (a run the store answered as one, ``RunAppended``, without an
        event each unless an encoder asks for them), unless a subscription is holding (its events go one by
        one)."""
        i, n = 0, len(items)
        # (A run's fan-out may start a hold, by a catch-up: the next run then goes one by one.)
        while i < n and not self._holding:
            k = run_length(items[i])
            if not k:
                break
            first = result[i]
            if type(first) is RunAppended:
                self._fan_out_run(items[i][0], first.run, RunEvents(first.run))
            else:
                events = [r.event for r in result[i : i + k]]  # type: ignore[union-attr]  # (not a run)
                run = _as_run(events)
                if run is None:
                    break
                self._fan_out_run(items[i][0], run, events)
            i += k
        if i < n:
            self.fan_out_events(
                [
                    (item[0], r.event)
                    for item, r in zip(items[i:], expand_runs(result[i:]), strict=True)
                    if not r.duplicate
                ],
                self.published,
            )

    def _fan_out_run(self, origin: Session | None, run: EventRun, events: Sequence[Event]) -> None:
        """Fan out one committed run (:meth:`fan_out_committed`), ``events`` its events."""
        proto = run.proto
        dialect = proto.publisher.dialect
        self.published[dialect] = self.published.get(dialect, 0) + len(run.rows)
        subs = self.router.match(proto.channel, ())
        if subs:
            self.fanout.fan_out_run(subs, events, origin, [run])

    def fan_out_events(
        self, events: Iterable[tuple[Session | None, Event]], published: dict[str, int] | None = None
    ) -> None:
        """Fan out committed events with their origin sessions, in the order given: a commit's
        (:meth:`fan_out_committed`, which counts them in ``published``, per dialect), or what a cluster relay
        releases at once (``Node.fan_out_many``)."""
        fan_out, fan_out_run = self.fanout.fan_out, self.fanout.fan_out_run
        match = self.router.match
        # Consecutive events with the same subscribers and origin (one publisher's burst on one channel)
        # fan out as a run: each connection then takes the run's frames in one step (see FanOut.fan_out_run).
        run: list[Event] = []
        run_subs: tuple[Subscription, ...] = ()
        run_origin: Session | None = None
        # While the last event joined ``run``: its channel and tags. The next event with the same channel
        # and tags objects, origin and publisher, and no headers (so no delivery filter) joins the run
        # without asking the router: it matches what the run's first event matched, since nothing ran in
        # between that could subscribe, unsubscribe or start a replay (the run fans out only once it ends).
        run_channel: str | None = None
        run_tags: tuple[str, ...] = ()
        # The channel and tags of the last event that matched nothing: the next with the same ones matches
        # nothing either (no fan-out ran in between, so nothing could subscribe), without asking the router.
        none_channel: str | None = None
        none_tags: tuple[str, ...] = ()
        # Published events are counted per run of one publisher: ``counted`` of ``pub``'s so far.
        pub: Publisher | None = None
        counted = 0
        for origin, ev in events:
            p = ev.publisher
            if p is pub:
                counted += 1
                if (
                    ev.channel is run_channel
                    and origin is run_origin
                    and ev.tags is run_tags
                    and not ev.headers
                ):
                    run.append(ev)
                    continue
            else:
                if pub is not None and published is not None:
                    published[pub.dialect] = published.get(pub.dialect, 0) + counted
                pub, counted = p, 1
            run_channel = None
            if ev.channel is none_channel and ev.tags == none_tags:
                continue
            subs = match(ev.channel, ev.tags)
            if not subs:
                none_channel, none_tags = ev.channel, ev.tags
                continue
            none_channel = None
            if not self._holding and not (
                ev.headers and any(k.startswith(FILTER_PREFIX) for k in ev.headers)
            ):
                # Tagged events of one burst match the same subscriptions through different router results
                # (the cache is keyed by their tags): equal tuples of the same subscriptions, compared by
                # identity element by element (Subscription is identity-compared), still make a run.
                if origin is run_origin and (subs is run_subs or (ev.tags and subs == run_subs)):
                    run.append(ev)
                    run_channel, run_tags = ev.channel, ev.tags
                    continue
                if run:
                    fan_out_run(run_subs, run, run_origin)
                    # That fan-out may have unsubscribed a session (a guble catch-up, which replays from the
                    # log what it dropped and all that follows): match again, so it gets no event twice.
                    subs = match(ev.channel, ev.tags)
                    if not subs:
                        run, run_subs = [], ()
                        continue
                run, run_subs, run_origin = [ev], subs, origin
                run_channel, run_tags = ev.channel, ev.tags
                continue
            if run:
                fan_out_run(run_subs, run, run_origin)
                run, run_subs = [], ()
            fan_out(ev, origin)
        if run:
            fan_out_run(run_subs, run, run_origin)
        if pub is not None and published is not None:
            published[pub.dialect] = published.get(pub.dialect, 0) + counted


def _as_run(events: list[Event]) -> EventRun | None:
    """The events of a submitted run answered one by one, as the :class:`EventRun` they are (None when
    they are not one after all: the caller fans them out one by one)."""
    first, last = events[0], events[-1]
    if last.seq - first.seq != len(events) - 1 or last.epoch != first.epoch or first.headers or first.tags:
        return None
    return EventRun(first, [(e.time_ns, e.payload) for e in events])
