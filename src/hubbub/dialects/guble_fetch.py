"""Guble's fetch and slow-consumer catch-up (protocols/guble.md §5, §6), sans-I/O: the merged order of a
fetch, the subtree a receiver gets, where a slow consumer's catch-up starts (:class:`LiveMark`) and in which
order its receivers re-subscribe (:func:`catch_up_steps`). The selection itself is a
:class:`~hubbub.selection.SubtreeFetch`, a scan of the log the core plans (``core/replay_plans.py``).

Concurrency contract: pure functions and per-connection objects; no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from hubbub.channels import Pattern, segments
from hubbub.events import Event

__all__ = [
    "CatchUpStep",
    "LiveMark",
    "catch_up_steps",
    "merged_key",
    "render_path",
    "subtree_pattern",
]


def merged_key(e: Event) -> tuple[int, bytes, int]:
    """The merged order across channels (mapping.md §3)."""
    return (e.time_ns, e.channel.encode(), e.seq)


def render_path(channel: str) -> str:
    """The guble rendering of a canonical channel (mapping.md §2.5): ``,`` becomes ``%2C``."""
    return channel.replace(",", "%2C") if "," in channel else channel


def subtree_pattern(channel: str) -> Pattern:
    """Subtree(P): the channel and every channel below it, segment by segment. The root matches all."""
    parts: tuple[str, ...] = () if channel == "/" else tuple(segments(channel))
    text = "/" + "/".join("%2A" * len(p) if p in ("*", "**") else p for p in parts)
    return Pattern(parts, True, (text + "/**") if parts else "/**")


# -- slow consumers: catching up from the log (guble.md §6) --------------------------------------------------


class LiveMark:
    """The commit time of the newest *live* event a connection has written: where its catch-up starts.

    Every event frame queued is recorded (:meth:`queued`: its commit time, and whether it is a replay that
    does not count); frames are matched in order as the connection writes them (:meth:`written`). When the
    queue drops its live events (:meth:`dropped`), the record goes too: everything dropped was committed
    after :attr:`last_live_ns`, because live events reach a connection in commit order. Guble event frames
    start with ``/``; notifications with ``#`` or ``!``.
    """

    __slots__ = ("_queued", "last_live_ns")

    def __init__(self) -> None:
        self._queued: deque[tuple[int, bool]] = deque()
        self.last_live_ns = 0

    def queued(self, time_ns: int, counts: bool) -> None:
        """An event frame was queued; ``counts`` is false for a replay (a fetch's events are not live)."""
        self._queued.append((time_ns, counts))

    def written(self, frames: Iterable[bytes]) -> None:
        """These frames are being written, in order."""
        q = self._queued
        for f in frames:
            if f[:1] == b"/" and q:
                t, counts = q.popleft()
                if counts and t > self.last_live_ns:
                    self.last_live_ns = t

    def dropped(self) -> int:
        """The queued events were dropped: forget them; the catch-up starts after the returned time."""
        self._queued.clear()
        return self.last_live_ns


@dataclass(frozen=True, slots=True)
class CatchUpStep:
    """Re-subscribe ``channel`` with a fetch of every event from ``from_time``; ``covered``: the channel is
    inside another re-subscribing receiver's subtree, whose replay brings its events, so its own fetch is
    empty (it only re-subscribes)."""

    channel: str
    covered: bool
    from_time: int


def catch_up_steps(receivers: Iterable[tuple[str, int]], from_ns: int) -> list[CatchUpStep]:
    """The catch-up of the dropped receivers, given as (channel, time registered): ancestors first, each
    replaying from just after ``from_ns`` (the last live event written), or from its registration when later
    (a receiver gets nothing from before it existed)."""
    batch = sorted(receivers, key=lambda r: len(subtree_pattern(r[0]).parts))
    patterns = [(ch, subtree_pattern(ch)) for ch, _ in batch]
    return [
        CatchUpStep(
            ch,
            any(other != ch and p.matches(ch) for other, p in patterns),
            max(from_ns + 1, registered),
        )
        for ch, registered in batch
    ]
