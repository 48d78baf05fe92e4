"""A federation link's subscriptions to the node above, for one connection, sans-I/O.

:class:`UpstreamSubscriptions` is the state machine the link's connection keeps beside its
:class:`~hubbub.client.protocol.ClientProtocol`: which patterns are subscribed upstream (and with which
subscription id), which subscribe requests are unanswered, which replays have not ended, which patterns the
node above refused, and the newest upstream time seen when subscribing (where channels not in the link's
cursor are recovered from next time). Per pattern::

    wanted ──changes()──▶ asking ──subscribed()──▶ subscribed (replaying ──recovered()──▶ live)
                            └──not_subscribed()──▶ refused (not asked again on this connection)
                                                   or live only (4203: too much missed; asked live)
    subscribed ──changes() without it──▶ unsubscribed

Invariants: a pattern has at most one subscription and one request in flight; the time mark is handed out
only once no subscription is asking or replaying (so every channel before it has come).

Concurrency contract: one owner (the link's connection); no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hubbub.channels import Pattern

from . import Cursor

__all__ = ["UpstreamSubscriptions"]

#: The error that says a subscription missed too much to recover: it is asked again live.
TOO_FAR_BEHIND = 4203


class UpstreamSubscriptions:
    """One connection's subscriptions upstream (see the module docstring)."""

    def __init__(self) -> None:
        self.subs: dict[str, str] = {}  # pattern text -> sub id (subscribed upstream)
        self.asking = 0  # subscribe requests in flight
        self.replaying: set[str] = set()  # pattern texts whose replay has not ended
        self.refused: set[str] = set()  # refused upstream (not asked again on this connection)
        self.live_only: set[str] = set()  # too much missed to recover: subscribed live
        self._top_time = 0
        self._next_sub = 0

    def synced(self, want: Iterable[str]) -> bool:
        """Subscribed to exactly ``want`` (less what was refused), every request answered, replays over."""
        return set(self.subs) == set(want) - self.refused and not self.asking and not self.replaying

    def changes(
        self, want: Mapping[str, Pattern], cursor: Cursor
    ) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
        """What to send to be subscribed to ``want``: the subscription ids to unsubscribe, and a subscribe
        frame (without its request id) per new pattern, each counted as asking from now on.

        A new subscription recovers from ``cursor`` whenever it comes (unless the pattern is live only):
        the channels it matches that have a position, from there; and when a pattern ``cursor`` holds
        covers it (:meth:`~hubbub.federation.Cursor.owed_from`), the others from after the time that one
        is recovered to. The new frames are made before the patterns going are released, so a narrower
        pattern that replaces a wider one recovers what the wider one would have had. The patterns
        subscribed are held in ``cursor`` from now on; those unsubscribed, or refused and no longer wanted,
        are released (the interest went: nothing is owed for them any more)."""
        new = []
        for text, pattern in want.items():
            if text in self.subs or text in self.refused:
                continue
            self._next_sub += 1
            sid = f"s{self._next_sub}"
            frame: dict[str, Any] = {"op": "subscribe", "sub": sid, "pattern": text}
            owed = cursor.owed_from(pattern)
            if text not in self.live_only:
                since = cursor.since(pattern)
                if since and pattern.is_exact:
                    frame["since"] = since[text]  # an exact channel's since is its position alone
                elif since:
                    frame["since"] = since
                if owed is not None and not (since and pattern.is_exact):
                    # Even from 0 (held before the link knew any upstream time): a held pattern's
                    # channels never need a position of their own to be recovered.
                    frame["from_time"] = owed + 1
                if "since" in frame or "from_time" in frame:
                    self.replaying.add(text)
            # A pattern never held is caught up from about now: the newest upstream time this link knows.
            cursor.hold(pattern, cursor.last_time if owed is None else owed)
            self.subs[text] = sid
            self.asking += 1
            new.append((text, frame))
        gone = []
        for text in [t for t in self.subs if t not in want]:
            gone.append(self.subs.pop(text))
            self.replaying.discard(text)
            cursor.release(text)
        for text in self.refused - want.keys():
            cursor.release(text)  # refused while wanted, and wanted no more
        return gone, new

    def subscribed(self, top_time: object) -> int:
        """A subscribe was answered (``top_time``: the upstream's newest event then). Returns the time mark
        to record (0: none yet)."""
        self.asking -= 1
        # Recovered up to the upstream's newest event then (1: its log was empty, so from its start).
        top = top_time if type(top_time) is int and top_time >= 0 else 0
        self._top_time = max(self._top_time, top or 1)
        return self._mark()

    def not_subscribed(self, text: str, code: int) -> bool:
        """A subscribe was refused with ``code``. True when it is a gap (too much missed: the pattern is
        asked again live); otherwise (a permission, a limit) it is not asked again on this connection."""
        self.asking -= 1
        self.subs.pop(text, None)
        self.replaying.discard(text)
        behind = code == TOO_FAR_BEHIND
        (self.live_only if behind else self.refused).add(text)
        return behind

    def recovered(self, sid: str, more: bool) -> int:
        """Subscription ``sid``'s replay is over (``more``: the node above cut it; the rest comes in the next
        round, from the cursor, and no time mark is taken from this one). Returns the time mark (0: none)."""
        self.replaying -= {t for t, s in self.subs.items() if s == sid}
        if more:
            self._top_time = 0
        return self._mark()

    def _mark(self) -> int:
        if not self.replaying and not self.asking and self._top_time:
            top, self._top_time = self._top_time, 0
            return top
        return 0
