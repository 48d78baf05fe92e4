"""Where one native subscription has got to, and what to ask for when it subscribes again, sans-I/O.

:class:`SubscriptionPositions` is the resume state of a subscription (native.md §6): the last position
delivered per channel (and, for an exact channel, the position the stream has reached), the newest event
time seen, and whether the last request's replay has completed. From it come the replay fields of each
subscribe request (:meth:`SubscriptionPositions.request_fields`): the caller's options the first time,
afterwards the positions reached, so that a resubscription after a reconnect brings no gap (every channel,
seen or not, is recovered) and no duplicate (what was delivered is dropped if the server sends it again).

The state machine, fed by :class:`~hubbub.client.protocol.ClientProtocol` in the order frames arrive:

======================  =====================================================================
``on_sent(fields)``     a subscribe request went out with these fields: nothing complete yet
``on_reply(frame)``     the server confirmed it: exact (``position``) or a pattern (``top_time``);
                        complete at once when no replay was asked for
``accept(event)``       an event: ``False`` (dropped) when at or before its channel's position
``on_gap(gap)``         a gap: the channel goes on after it (an exact channel is then complete)
``on_recovered(frame)`` the replay is over: complete
======================  =====================================================================

Invariants: a channel's position only moves forward within an epoch; events are accepted at most once per
position; ``request_fields`` never asks for less than what was delivered.

Concurrency contract: one owner (the client's event loop); no I/O.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from hubbub.client._wire import Gap, _position
from hubbub.events import Event, Position

__all__ = ["SubscriptionPositions"]


def _pos(p: Position) -> dict[str, Any]:
    return {"seq": p.seq, "epoch": p.epoch}


class SubscriptionPositions:
    """The resume state of one subscription (see the module docstring)."""

    __slots__ = (
        "_complete",
        "_exact",
        "_exact_pos",
        "_last_time",
        "_replay_requested",
        "_seen_since_sent",
        "_sent",
        "_top_time",
        "dups",
        "from_time",
        "gaps",
        "last",
        "positions",
        "received",
        "replayed",
        "since",
        "subscribes",
    )

    def __init__(
        self,
        since: Position | Mapping[str, Position] | None = None,
        last: int | None = None,
        from_time: int | None = None,
    ) -> None:
        self.since = since
        self.last = last
        self.from_time = from_time
        self._sent: dict[str, Any] | None = None
        self._replay_requested = False
        self._complete = False
        self._seen_since_sent = False
        self._exact: bool | None = isinstance(since, Position) or None
        self._exact_pos: Position | None = since if isinstance(since, Position) else None
        #: The last delivered position per channel.
        self.positions: dict[str, Position] = dict(since) if isinstance(since, Mapping) else {}
        self._last_time = 0
        self._top_time = 0
        self.received = 0
        self.dups = 0
        self.gaps = 0
        self.replayed = 0
        self.subscribes = 0

    @property
    def position(self) -> Position | None:
        """For an exact channel: the position the stream has reached (None before the first reply)."""
        return self._exact_pos if self._exact else None

    def request_fields(self) -> dict[str, Any]:
        """The replay fields of the next subscribe request.

        First time: the caller's options. Afterwards (a resume): if the previous request's replay had not
        started delivering anything, the same fields again; otherwise the exact channel's last position, or
        for a pattern the map of every channel seen plus ``from_time`` just after the newest event seen (or,
        once live, after the snapshot's newest event), so channels never seen are recovered as well. Event
        times are unique and increase in commit order, so nothing is skipped or repeated.
        """
        if self._sent is None:
            fields: dict[str, Any] = {}
            since = self.since
            if isinstance(since, Position):
                fields["since"] = _pos(since)
            elif since is not None:
                fields["since"] = {ch: _pos(p) for ch, p in since.items()}
            if self.last is not None:
                fields["last"] = self.last
            if self.from_time is not None:
                fields["from_time"] = self.from_time
            return fields
        if not self._complete and not self._seen_since_sent:
            return dict(self._sent)
        if self._exact:
            if self._exact_pos is None:
                return dict(self._sent)
            return {"since": _pos(self._exact_pos)}
        base = max(self._last_time, self._top_time) if self._complete else self._last_time
        fields = {"from_time": base + 1}
        if self.positions:
            fields["since"] = {ch: _pos(p) for ch, p in self.positions.items()}
        return fields

    def on_sent(self, fields: dict[str, Any]) -> None:
        self._sent = fields
        self._replay_requested = bool(fields.keys() & {"since", "last", "from_time"})
        self._complete = False
        self._seen_since_sent = False
        self.subscribes += 1

    def on_reply(self, frame: Mapping[str, Any]) -> None:
        if "position" in frame:
            self._exact = True
            if not self._replay_requested:
                self._exact_pos = _position(frame["position"])
                self._complete = True
        else:
            self._exact = False
            with contextlib.suppress(TypeError, ValueError):
                self._top_time = int(frame.get("top_time", 0))
            if not self._replay_requested:
                self._complete = True

    def on_recovered(self, frame: Mapping[str, Any]) -> None:
        self._complete = True
        with contextlib.suppress(TypeError, ValueError):
            self.replayed += int(frame.get("replayed", 0))
        if self._exact and "position" in frame:
            self._exact_pos = _position(frame["position"])

    def on_gap(self, gap: Gap) -> None:
        self.gaps += 1
        self.positions[gap.channel] = gap.position
        if self._exact:
            self._exact_pos = gap.position
            self._complete = True  # an exact channel gets a gap and no replay

    def accept(self, event: Event) -> bool:
        """Whether ``event`` is new for this subscription (then it is its channel's position now)."""
        last = self._exact_pos if self._exact else self.positions.get(event.channel)
        if last is not None and last.epoch == event.epoch and event.seq <= last.seq:
            self.dups += 1
            return False
        pos = Position(event.seq, event.epoch)
        self.positions[event.channel] = pos
        if self._exact:
            self._exact_pos = pos
        self._last_time = max(self._last_time, event.time_ns)
        self._seen_since_sent = True
        self.received += 1
        return True
