"""Delivery filters (mapping.md §6): ``:filter.<name>`` pseudo-headers that restrict which connections get an
event. Live fan-out, replay and the release of held events all apply them, so a connection sees the same
events whichever way they reach it (README §3).

Pure functions of an event and a session: called from the event loop, and from reader threads while a replay
page is encoded (:meth:`~hubbub.core.node.Node._replay_span`).
"""

from __future__ import annotations

from hubbub.events import Event

from .session import Session

__all__ = ["FILTER_PREFIX", "delivery_filters", "passes", "withheld"]

FILTER_PREFIX = ":filter."


def delivery_filters(event: Event) -> list[tuple[str, str]]:
    """The event's delivery filters (mapping.md §6): ``:filter.<name>`` pseudo-headers."""
    n = len(FILTER_PREFIX)
    return [(k[n:], v) for k, v in event.headers.items() if k.startswith(FILTER_PREFIX)]


def passes(session: Session, filters: list[tuple[str, str]]) -> bool:
    """Whether a connection's parameters equal every filter. ``user_id`` is the connection's user,
    ``application_id`` its session id; any other filter name matches no connection."""
    for name, value in filters:
        if name == "user_id":
            if session.user != value:
                return False
        elif name == "application_id":
            if session.id != value:
                return False
        else:
            return False
    return True


def withheld(session: Session, event: Event) -> bool:
    """Whether the event's delivery filters keep it from ``session``; an event without filters never is.
    Cheap for the common event without headers: replays call it once per event (or per run)."""
    headers = event.headers
    return (
        bool(headers)
        and any(k.startswith(FILTER_PREFIX) for k in headers)
        and not passes(session, delivery_filters(event))
    )
