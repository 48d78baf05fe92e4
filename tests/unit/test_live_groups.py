"""Live exclusive groups (core/consumer_groups.py ``LiveGroups``) with auth on: each event goes to the next
member, in round-robin, whose session's identity may read its channel, as that identity is at the event (a
login that changes it counts from the next event); a member that may not is passed over, an event no member
may read goes to none, and ``matching`` (qpubs ``delivered``) counts only a group some member may read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hubbub.auth import Grant, Identity, TokenAuthorizer
from hubbub.core.access import Access
from hubbub.core.consumer_groups import LiveGroups
from hubbub.core.session import Session
from hubbub.events import Event, Publisher


class _Enc:
    key = "test"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return event.payload


def _reader(*reads: str) -> Session:
    s = Session("qpubs", _Enc(), max_items=100, max_bytes=1 << 20)
    s.identity = Identity("u", Grant.parse([]), Grant.parse(list(reads)), via="static")
    return s


def _ev(channel: str, seq: int) -> Event:
    return Event(channel, seq, "e", seq, Publisher("qpubs"), b"%d" % seq, "text/plain")


def test_each_event_to_the_next_member_that_may_read_it() -> None:
    groups = LiveGroups(Access(TokenAuthorizer()))
    got: dict[str, list[tuple[str, int]]] = {"x": [], "xy": [], "none": []}
    sessions = {"x": _reader("/g/x/**"), "xy": _reader("/g/**"), "none": None}

    def into(name: str) -> Callable[[Event], None]:
        return lambda ev: got[name].append((ev.channel, ev.seq))

    for name, sess in sessions.items():  # join order: x, xy, then a member without a session
        groups.join("G", "/g/**", into(name), syntax="native", separator=".", session=sess)
    events = [_ev(ch, i) for i, ch in enumerate(["/g/x", "/g/x", "/g/y", "/g/x", "/g/z", "/g/y", "/g/x"], 1)]
    counted = []
    for ev in events:
        counted.append(groups.matching(ev.channel))
        groups.deliver(ev)
    assert counted == [1] * len(events)  # xy may read every one of them
    # Only xy may read /g/y and /g/z; the turn passes over the others (the member without a session, with
    # no identity, may read nothing), and /g/x goes to whichever of x and xy comes next.
    assert got == {
        "x": [("/g/x", 1), ("/g/x", 4), ("/g/x", 7)],
        "xy": [("/g/x", 2), ("/g/y", 3), ("/g/z", 5), ("/g/y", 6)],
        "none": [],
    }
    assert groups.delivered == len(events)
    # xy's connection logs in again as an identity that reads only /g/x: from the next event on, /g/y is
    # nobody's (not delivered, not counted), and /g/x goes on to both in turn.
    xy = sessions["xy"]
    assert xy is not None
    xy.identity = Identity("u", Grant.parse([]), Grant.parse(["/g/x/**"]), via="static")
    assert groups.matching("/g/y") == 0
    for ev in (_ev("/g/y", 8), _ev("/g/x", 9), _ev("/g/x", 10)):
        groups.deliver(ev)
    assert got["xy"][4:] == [("/g/x", 9)] and got["x"][3:] == [("/g/x", 10)] and got["none"] == []
    assert groups.delivered == len(events) + 2
