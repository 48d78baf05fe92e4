"""The subscription registry: attached sessions, their subscriptions in the router, and live fan-out.

The registry owns the router, the sessions and their subscriptions, and the set of subscriptions still
*holding* (a replay being read and sent: live events for them are kept on the subscription's
:class:`~hubbub.core.hold.Hold`, see :class:`~hubbub.core.replay_service.ReplayService` and
:class:`~hubbub.core.junction.Junction`). Committed batches come in
through its :class:`~hubbub.core.live.LiveFanOut` (``live``), in commit order;
:class:`~hubbub.core.fanout.FanOut` does the per-session delivery.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import final

from hubbub.auth import Identity
from hubbub.channels import Pattern
from hubbub.errors import LimitExceeded, ShuttingDown, SubscriptionError
from hubbub.events import Event
from hubbub.router import Router

from .access import Access
from .fanout import FanOut
from .faults import Faults
from .hold import Hold
from .live import LiveFanOut
from .session import Session

__all__ = ["Subscription", "SubscriptionRegistry"]


@dataclass(eq=False, slots=True)
class Subscription:
    """One subscription of one session. Identity-hashed: the router uses it as its key."""

    session: Session
    sub_id: str
    pattern: Pattern
    tags: frozenset[str]
    #: The live events held while the subscription's replay runs (``None``: live).
    holding: Hold | None = None
    #: The channels of the pattern the session's identity may read, when not all (``Access.visibility``).
    visible: Callable[[str], bool] | None = None

    def matches(self, event: Event) -> bool:
        return (
            self.pattern.matches(event.channel)
            and self.tags.issubset(event.tags)
            and (self.visible is None or self.visible(event.channel))
        )


@final
class SubscriptionRegistry:
    """See the module docstring. ``published`` and ``deliveries`` count per dialect (the node's statistics);
    ``on_slow`` is set on every attached session (called once when it is kicked as a slow consumer)."""

    def __init__(self, access: Access, max_subscriptions: int, on_slow: Callable[[Session], None]) -> None:
        self.access = access
        self.max_subscriptions = max_subscriptions
        self.on_slow = on_slow
        self.router: Router[Subscription] = Router()
        self._subs: dict[Session, dict[str, Subscription]] = {}
        #: Subscriptions whose replay is still being read: live events for them are held (see add).
        self._holding: set[Subscription] = set()
        self._sessions: set[Session] = set()
        self._by_id: dict[str, Session] = {}
        self.published: dict[str, int] = {}
        self.deliveries: dict[str, int] = {}
        #: Events dropped by the overflow policy of sessions since detached, per dialect (:meth:`dropped`).
        self._dropped_detached: dict[str, int] = {}
        #: The sessions closed because serving them raised (an encoder, a filter, a queue's hook).
        self.faults = Faults()
        # Live delivery: reads the router and the holding set, counts into ``deliveries``.
        self.fanout = FanOut(self.router, self._holding, self.deliveries, self.faults)
        #: Committed events in: matched, counted into ``published``, and handed to ``fanout`` (core/live.py).
        self.live = LiveFanOut(self.router, self._holding, self.fanout, self.published)
        #: Called with (subscription, True) when a subscription is added and (subscription, False) when it
        #: goes (``Node.watch_subscriptions``); a watcher must not add or drop subscriptions itself.
        self.watchers: list[Callable[[Subscription, bool], None]] = []
        #: Called with a session whose identity changed (:meth:`rebind`): what else it holds under its
        #: permissions (the durable consumers' openers, ``ConsumerService.rebind``) follows them too.
        self.rebound: list[Callable[[Session], None]] = []

    # -- sessions ---------------------------------------------------------------------------------------

    def attach(self, session: Session) -> None:
        if session.bucket is None:
            session.bucket = self.access.limiter.bucket()
        self._sessions.add(session)
        self._by_id[session.id] = session
        self._subs[session] = {}
        session.on_slow = self.on_slow

    def detach(self, session: Session) -> None:
        """Forget a session and all its subscriptions. Idempotent."""
        subs = self._subs.pop(session, None)
        if subs:
            for s in subs.values():
                self.router.remove(s.pattern, s, s.tags)
                self._holding.discard(s)
            self.fanout.clear_plans()
            for w in self.watchers:
                for s in subs.values():
                    w(s, False)
        if session in self._sessions:
            self._sessions.discard(session)
            n = session.stats.dropped
            if n:
                d = session.dialect
                self._dropped_detached[d] = self._dropped_detached.get(d, 0) + n
        self.access.unbind(session)
        if self._by_id.get(session.id) is session:
            del self._by_id[session.id]
        session.close()

    def dropped(self) -> dict[str, int]:
        """Events dropped by the overflow policy, per dialect, since the node started: the sessions detached
        (counted when they were) and the attached ones. A counter: it never goes down as connections close."""
        out = dict(self._dropped_detached)
        for s in self._sessions:
            if s.stats.dropped:
                out[s.dialect] = out.get(s.dialect, 0) + s.stats.dropped
        return out

    def rebind(self, session: Session, ident: Identity) -> None:
        """The session's identity changed (``Node.login``): its subscriptions follow the new permissions, and
        so does what it holds elsewhere (the :attr:`rebound` hooks)."""
        for hook in self.rebound:
            hook(session)
        subs = self._subs.get(session)
        if subs:
            for s in subs.values():
                self.router.remove(s.pattern, s, s.tags)
                s.visible = self.access.visibility(ident, s.pattern)
                self.router.add(s.pattern, s, s.tags, s.visible)
            self.fanout.clear_plans()

    def watch(self, watcher: Callable[[Subscription, bool], None]) -> Callable[[], None]:
        """``Node.watch_subscriptions``: call ``watcher(subscription, added)`` whenever a subscription of any
        session comes (``True``) or goes (``False``), on the loop, right after the change (the wearscript hub
        advertises what the other dialects listen to). Returns the function that stops the watching."""
        watchers = self.watchers
        watchers.append(watcher)

        def stop() -> None:
            if watcher in watchers:
                watchers.remove(watcher)

        return stop

    def session_by_id(self, session_id: str) -> Session | None:
        """The attached session with this id (ivy's HTTP ``sid`` names the connection to exclude)."""
        return self._by_id.get(session_id)

    @property
    def sessions(self) -> frozenset[Session]:
        return frozenset(self._sessions)

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    # -- subscriptions ----------------------------------------------------------------------------------

    def add(self, session: Session, sub_id: str, pattern: Pattern, tags: frozenset[str]) -> Subscription:
        """Register a subscription *holding*: live events that match it are kept on its :class:`Hold`
        (at most four times the session's queue bound, then spilled) until :meth:`end_hold`. Raises
        :class:`SubscriptionError` (4200), :class:`LimitExceeded` (4007) or :class:`ShuttingDown` (the session
        is detached)."""
        subs = self._subs.get(session)
        if subs is None:
            raise ShuttingDown("session is closed")
        if sub_id in subs:
            raise SubscriptionError("sub id in use", code=4200)
        if len(subs) >= self.max_subscriptions:
            self.access.limiter.refused("max_subscriptions", session.dialect)
            raise LimitExceeded("too many subscriptions")
        visible = self.access.visibility(session.identity, pattern)
        sub = Subscription(
            session, sub_id, pattern, tags, holding=Hold(session.max_items * 4), visible=visible
        )
        self._holding.add(sub)
        subs[sub_id] = sub
        self.router.add(pattern, sub, tags, visible)
        self.fanout.clear_plans()
        for w in self.watchers:
            w(sub, True)
        return sub

    def is_current(self, sub: Subscription) -> bool:
        """Whether ``sub`` is still registered (not unsubscribed or detached meanwhile)."""
        subs = self._subs.get(sub.session)
        return subs is not None and subs.get(sub.sub_id) is sub

    def unsubscribe(self, session: Session, sub_id: str) -> None:
        subs = self._subs.get(session)
        sub = subs.get(sub_id) if subs else None
        if sub is None:
            raise SubscriptionError("not subscribed", code=4201)
        self.drop(sub)

    def drop(self, sub: Subscription) -> None:
        self._holding.discard(sub)
        subs = self._subs.get(sub.session)
        current = False
        if subs is not None and subs.get(sub.sub_id) is sub:
            del subs[sub.sub_id]
            current = True
        self.router.remove(sub.pattern, sub, sub.tags)
        self.fanout.clear_plans()
        if current:
            for w in self.watchers:
                w(sub, False)

    def subscriptions(self, session: Session) -> list[Subscription]:
        return list(self._subs.get(session, {}).values())

    def held_ids(
        self, sub: Subscription, event: Event, in_snapshot: bool, live: Collection[Subscription]
    ) -> list[str]:
        """The ids, in the order the subscriptions were created, of the subscriptions of ``sub``'s session
        that get ``event``, held on ``sub`` (or read back from the log for its hold): ``sub`` itself unless
        the event is inside its snapshot, and those of ``live`` (the session's live subscriptions that
        ``sub`` owes it, ``core/hold.py``) still subscribed and matching it."""
        subs = self._subs.get(sub.session)
        if not subs:
            return []
        return [
            s.sub_id
            for s in subs.values()
            if (not in_snapshot if s is sub else s in live) and s.matches(event)
        ]

    def end_hold(self, sub: Subscription) -> None:
        """``sub`` is live: live fan-out reaches it directly from now on (its held events were sent). A
        spilled hold of another subscription of its session owes it the events it loses from now on."""
        sub.holding = None
        self._holding.discard(sub)
        for s in self._subs.get(sub.session, {}).values():
            hold = s.holding
            if hold is not None and hold.spilled:
                hold.joins(sub)
