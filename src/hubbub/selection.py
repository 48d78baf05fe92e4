"""Replay selections: what a new subscription (or a fetch) gets from the log before it goes live.

A selection is a value, never a function: a dialect or a transport says *what* it wants, and the core turns
it into a plan over the log on a reader thread (``core/replay.py``, ``core/replay_plans.py``). So no code
outside the core ever runs over the store, and a dialect's state machine can name a selection without
importing the core (this is a leaf module: the standard library and ``events`` only).

=================  ==========================================================================================
selection          what is replayed, then live
=================  ==========================================================================================
:data:`LIVE`       nothing; the log is not read at all (ivy, mist, wearscript, qpubs listens)
:class:`ReplaySpec` native's: nothing but the snapshot's heads, or ``since`` (a position, or a map of them
                   with ``from_time`` for the others), ``last`` N, or ``from_time`` (native.md §6)
:class:`EventResume` after one event in the merged order (an SSE ``Last-Event-ID``): its channel after its
                   position, every other channel from the next time, trimmed channels told as gaps
:class:`SubtreeFetch` guble's fetch over a channel's subtree (guble.md §5), counted before it is sent,
                   or a catch-up from a time (guble.md §6)
:class:`CursorResume` a federation link's cursor: every channel after its position, the others from a
                   time, with no limit; gaps told and passed over
=================  ==========================================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeAlias

from hubbub.events import Position

__all__ = ["LIVE", "CursorResume", "EventResume", "LiveOnly", "ReplaySpec", "Selection", "SubtreeFetch"]


@dataclass(frozen=True, slots=True)
class LiveOnly:
    """Live events only: an empty snapshot, so subscribing never reads the log, and every event held while
    the subscription was registered is released."""


#: The one :class:`LiveOnly` value.
LIVE = LiveOnly()


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """What a native subscriber asked for. At most one of the three, except ``from_time`` with a ``since``
    map. None of them: no replay, but the snapshot's heads (an exact channel's position, a pattern's
    ``top_time``) for the reply."""

    since: Position | Mapping[str, Position] | None = None
    last: int | None = None
    from_time: int | None = None

    @property
    def wanted(self) -> bool:
        return self.since is not None or self.last is not None or self.from_time is not None


@dataclass(frozen=True, slots=True)
class EventResume:
    """Resume after the event ``position`` of ``channel`` committed at ``time_ns``: event times are unique
    across the whole log, so "after it in the merged order" is exactly that channel after its position and
    every other channel of the pattern from ``time_ns + 1``. A channel whose retained events start after
    ``time_ns`` while earlier ones were trimmed is reported as a ``trimmed`` gap."""

    channel: str
    position: Position
    time_ns: int


@dataclass(frozen=True, slots=True)
class SubtreeFetch:
    """Guble's fetch over the subscription's pattern (``channel``'s subtree, guble.md §5): with ``start_id``
    > 0 from the first event of ``channel`` itself with that id, with a negative one the last
    ``-start_id`` (or ``max_count``) events, else from the start; at most ``max_count`` events (when the
    start is not "last"). With ``from_time`` a catch-up: every event from that time (guble.md §6);
    ``empty``: a selection of no event (a catch-up receiver inside another one's subtree).

    Events the connection may not read or whose delivery filters it fails are not part of the selection:
    counts and "last N" see only the others. The plan's scan is counted before it is sent (``#fetch-start``
    announces the exact count)."""

    channel: str
    start_id: int | None = None
    max_count: int | None = None
    from_time: int | None = None
    empty: bool = False


@dataclass(frozen=True, slots=True)
class CursorResume:
    """A federation link's replay, with no limit: every channel of the pattern after its position in
    ``since``, channels not in it from ``from_time`` (none when it is ``None``). A position the log no
    longer holds (trimmed, another epoch, ahead) is a gap, and the channel goes on from where its log is."""

    since: Mapping[str, Position]
    from_time: int | None = None


Selection: TypeAlias = LiveOnly | ReplaySpec | EventResume | SubtreeFetch | CursorResume
