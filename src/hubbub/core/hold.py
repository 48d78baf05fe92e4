"""The live events of a subscription held while its replay is read and sent, bounded.

A subscription with a replay is registered *holding* (:meth:`SubscriptionRegistry.add`): live events that
match it are kept on its :class:`Hold` instead of delivered, until the replay service has sent the replay and
then the held events newer than the snapshot (:mod:`hubbub.core.junction`). A replay paced by a slow
connection may last while many events are published, so the hold keeps at most ``limit`` events; past that
it *spills*: it keeps, per channel, only the position of the first event it did not keep, and the junction
reads those events back from the log. The hold's memory is bounded by ``limit`` events and one position per
channel, whatever the replay's length: replay traffic never makes a subscriber "slow" (ARCHITECTURE §5).

A connection that stalls during its replay is therefore not closed by its hold: its replay waits on its
queue, the hold stops growing, and the connection goes on from the log once it reads again (or is closed by
its transport's keepalive when it never does).

Several subscriptions of one connection may replay at once (guble's receivers, a transport subscribing a
list of channels, a client resubscribing after a reconnect). Live fan-out then holds an event on *each* of
them that matches it, all sharing one :class:`Share`, and each one's junction sends it unless its own replay
covered it: what one replay's snapshot left out is every replaying subscription's own business. The
connection's live subscriptions that match it get it once, with the first of them, its *owner*
(:attr:`Share.live`: the ones live at the fan-out). A connection whose frames do not name subscriptions
(``Encoder.names_subscriptions`` unset: guble, mist, wearscript...) gets it once in all, from the first
junction that sends it (:attr:`Share.sent`); one whose frames do (native) once per subscription, each frame
right after its own subscription's replay, in that subscription's order.

A spilled hold reads its lost events back from the log, where who owned them is no longer known, so it
keeps what decides it, bounded by its channels: ``last``, per channel, the last event it lost (the read-back
ends there: what follows is on the next hold), ``shared`` (it lost an event shared with another one) and
``joined``, for each subscription of the connection that went live while it was spilled, ``last`` as it was
then (the lost events up to those positions are not that subscription's).

Invariants:

* Events reach :meth:`Hold.add` in commit order per channel (the node's fan-out order), so everything of a
  channel from its position in :attr:`Hold.lost` on was not kept, and nothing before it was lost.
* Once the hold has spilled, it keeps no more events: every later one is lost (and recorded), so the kept
  events are all older than the lost ones.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from hubbub.events import Event, Position

if TYPE_CHECKING:
    from .subscriptions import Subscription

__all__ = ["Hold", "Share"]


@final
class Share:
    """One held event of one connection, kept by the hold of each of its replaying subscriptions that match
    it: ``owner``, the one that sends it to ``live`` too (the connection's subscriptions live at the fan-out
    that match it), and ``sent``, whether a junction sent it to the connection yet."""

    __slots__ = ("live", "owner", "sent")

    def __init__(self, owner: Subscription, live: tuple[Subscription, ...]) -> None:
        self.owner = owner
        self.live = live
        self.sent = False


@final
class Hold:
    """See the module docstring. ``events``: the kept events, in fan-out order, and ``shares``, each one's
    :class:`Share`; ``lost``: per channel, the position of the first
    event not kept (empty until the hold spills); ``last``, ``shared``, ``joined``: what the read-back of the
    lost events needs (the module docstring)."""

    __slots__ = ("events", "joined", "last", "limit", "lost", "shared", "shares", "spilled")

    def __init__(self, limit: int) -> None:
        self.events: list[Event] = []
        self.shares: list[Share] = []
        self.lost: dict[str, Position] = {}
        self.last: dict[str, Position] = {}
        self.joined: dict[Subscription, dict[str, Position]] = {}
        self.limit = limit
        self.spilled = False
        self.shared = False

    def __len__(self) -> int:
        return len(self.events)

    def add(self, event: Event, share: Share, alone: bool) -> None:
        """Hold ``event`` (``alone``: no other hold keeps its ``share``), or record it as lost once the hold
        has spilled."""
        if not self.spilled:
            if len(self.events) < self.limit:
                self.events.append(event)
                self.shares.append(share)
                return
            self.spilled = True
        pos = Position(event.seq, event.epoch)
        if event.channel not in self.lost:
            self.lost[event.channel] = pos
        self.last[event.channel] = pos
        if not alone:
            self.shared = True

    def joins(self, sub: Subscription) -> None:
        """``sub``, another subscription of the connection, is live from now on: of the events this spilled
        hold lost, it is owed those after the ones lost so far."""
        self.joined[sub] = dict(self.last)
