"""The subscription side of one native connection's client (:class:`~hubbub.client.protocol.ClientProtocol`):
which subscriptions were sent on it, their positions, and what their ``event``, ``gap`` and ``recovered``
frames mean (native.md §5-§6).

Each subscription's :class:`~hubbub.client.positions.SubscriptionPositions` is updated by its frames, in
the order they came, and only events new to it come back (:class:`Delivered`); a subscribe's reply
updates them before any later frame of the subscription. A connection that keeps its own positions (the
federation link) gives an ``event_decoder`` instead: each ``event`` frame comes back once as
:class:`Received`, and every subscription's gaps and ``recovered`` frames come back.

Concurrency contract: owned by its :class:`ClientProtocol` (one owner at a time); no locking, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hubbub.client._wire import Gap, _position, event_from_dict
from hubbub.client.positions import SubscriptionPositions
from hubbub.errors import BadFrame
from hubbub.events import Event, fast_init

__all__ = ["Delivered", "GapNotice", "Received", "Recovered", "SubscriptionFrames"]


@fast_init
@dataclass(frozen=True, slots=True)
class Delivered:
    """An event new to subscription ``sub`` (its positions have moved past it)."""

    sub: str
    event: Event


@fast_init
@dataclass(frozen=True, slots=True)
class Received:
    """An ``event`` frame, decoded by the protocol's own ``event_decoder`` (see :class:`ClientProtocol`)."""

    value: Any


@fast_init
@dataclass(frozen=True, slots=True)
class GapNotice:
    sub: str
    gap: Gap


@fast_init
@dataclass(frozen=True, slots=True)
class Recovered:
    """Subscription ``sub``'s replay is over."""

    sub: str
    frame: dict[str, Any]


class SubscriptionFrames:
    """The subscriptions sent on one connection and their frames (see the module docstring)."""

    def __init__(self, event_decoder: Callable[[dict[str, Any]], Any] | None) -> None:
        self._event_decoder = event_decoder
        #: Subscriptions sent on this connection: id → their positions.
        self.subs: dict[str, SubscriptionPositions] = {}
        #: Subscribe requests in flight: request id → subscription id.
        self.subscribing: dict[int, str] = {}
        #: ``event`` frames received (statistics).
        self.events = 0

    @staticmethod
    def subscribe_frame(
        sub: str, pattern: str, tags: Iterable[str], positions: SubscriptionPositions
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """A ``subscribe`` frame (without ``id``) asking for what ``positions`` has not seen, and the replay
        fields it carries (for :meth:`sent`)."""
        frame: dict[str, Any] = {"op": "subscribe", "sub": sub, "pattern": pattern}
        tag_list = list(tags)
        if tag_list:
            frame["tags"] = tag_list
        fields = positions.request_fields()
        frame.update(fields)
        return frame, fields

    def sent(self, rid: int, sub: str, positions: SubscriptionPositions, fields: dict[str, Any]) -> None:
        """The subscribe request ``rid`` went out: from now on ``sub``'s frames update ``positions``."""
        positions.on_sent(fields)
        self.subs[sub] = positions
        self.subscribing[rid] = sub

    def forget(self, sub: str) -> None:
        """Frames for ``sub`` no longer count (it ended here; the server may still send a few)."""
        self.subs.pop(sub, None)

    def answered(self, rid: int, frame: dict[str, Any]) -> None:
        """Request ``rid`` was answered with ``frame``: a subscribe's reply updates its positions."""
        sid = self.subscribing.pop(rid, None)
        if sid is not None and (positions := self.subs.get(sid)) is not None:
            positions.on_reply(frame)  # before any later frame (gaps, replay) of the subscription

    def event(self, frame: dict[str, Any], out: list[Any]) -> None:
        """An ``event`` frame: a :class:`Delivered` per subscription it is new to, or :class:`Received`."""
        if self._event_decoder is not None:
            self.events += 1
            out.append(Received(self._event_decoder(frame)))
            return
        subs = frame.get("subs")
        if type(subs) is not list:
            return
        event = event_from_dict(frame)
        self.events += 1
        mine = self.subs
        for sid in subs:
            positions = mine.get(sid) if type(sid) is str else None
            if positions is not None and positions.accept(event):
                out.append(Delivered(sid, event))

    def gap(self, frame: dict[str, Any], out: list[Any]) -> None:
        """A ``gap`` frame of a subscription sent here (or any, with an ``event_decoder``)."""
        sid = str(frame.get("sub"))
        positions = self.subs.get(sid)
        if positions is not None or self._event_decoder is not None:
            if positions is None and type(frame.get("position")) is not dict:
                raise BadFrame("gap needs a position")  # a link cannot go on without one
            gap = Gap(
                channel=str(frame.get("channel", "")),
                since=_position(frame.get("since")),
                position=_position(frame.get("position")),
                reason=str(frame.get("reason", "")),
            )
            if positions is not None:
                positions.on_gap(gap)
            out.append(GapNotice(sid, gap))

    def recovered(self, frame: dict[str, Any], out: list[Any]) -> None:
        """A ``recovered`` frame of a subscription sent here (or any, with an ``event_decoder``)."""
        sid = str(frame.get("sub"))
        positions = self.subs.get(sid)
        if positions is not None:
            positions.on_recovered(frame)
        if positions is not None or self._event_decoder is not None:
            out.append(Recovered(sid, frame))
