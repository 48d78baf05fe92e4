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

Invariants:

* Events reach :meth:`Hold.add` in commit order per channel (the node's fan-out order), so everything of a
  channel from its position in :attr:`Hold.lost` on was not kept, and nothing before it was lost.
* Once the hold has spilled, it keeps no more events: every later one is lost (and recorded), so the kept
  events are all older than the lost ones.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

from typing import final

from hubbub.events import Event, Position

__all__ = ["Hold"]


@final
class Hold:
    """See the module docstring. ``events``: the kept events, in fan-out order; ``lost``: per channel, the
    position of the first event not kept (empty until the hold spills)."""

    __slots__ = ("events", "limit", "lost", "spilled")

    def __init__(self, limit: int) -> None:
        self.events: list[Event] = []
        self.lost: dict[str, Position] = {}
        self.limit = limit
        self.spilled = False

    def __len__(self) -> int:
        return len(self.events)

    def add(self, event: Event) -> None:
        """Hold ``event``, or record it as lost once the hold has spilled."""
        if not self.spilled:
            if len(self.events) < self.limit:
                self.events.append(event)
                return
            self.spilled = True
        if event.channel not in self.lost:
            self.lost[event.channel] = Position(event.seq, event.epoch)
