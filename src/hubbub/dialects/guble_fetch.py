"""Guble's fetch selection (protocols/guble.md §5) and slow-consumer catch-up (§6), sans-I/O: which events a
``+ <path> <start> <max>`` receives, where a slow consumer's catch-up starts (:class:`LiveMark`) and in which
order its receivers re-subscribe (:func:`catch_up_steps`).

The selection reads through a :class:`ChannelReader` (a ``LogStore`` is one) and is given the snapshot's
``tops`` (the head of every channel of the subtree, read first): every event it returns is at or below its
channel's top, so the core's hold-and-release junction sees no gap and no duplicate. It is plain Python over
the reader: the server runs it on a reader thread, tests run it over the memory store.

Invariants:

* Events come in the merged order of mapping.md §3 (commit time, then channel bytes, then seq), at most
  ``cap`` (and at most ``max_count`` when given).
* ``keep`` (the connection's delivery filters) is applied before counting, so a filtered-out event never
  takes a place in the window.
* Reads are paged (:data:`PAGE` events at a time) and stop at the snapshot's top: memory is bounded by the
  selection, not by the channel.

Concurrency contract: pure functions; safe on any thread, as the reader is.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from hubbub.channels import Pattern, segments
from hubbub.events import Event

__all__ = [
    "PAGE",
    "CatchUpStep",
    "ChannelReader",
    "LiveMark",
    "catch_up_steps",
    "fetch_selection",
    "merged_key",
    "subtree_pattern",
]

#: Events per read of a channel.
PAGE = 1000


class ChannelReader(Protocol):
    """The reads the selection needs (``hubbub.log.LogStore`` provides them)."""

    def read(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
    ) -> list[Event]: ...

    def read_last(self, channel: str, n: int) -> list[Event]: ...


def merged_key(e: Event) -> tuple[int, bytes, int]:
    """The merged order across channels (mapping.md §3)."""
    return (e.time_ns, e.channel.encode(), e.seq)


def subtree_pattern(channel: str) -> Pattern:
    """Subtree(P): the channel and every channel below it, segment by segment. The root matches all."""
    parts: tuple[str, ...] = () if channel == "/" else tuple(segments(channel))
    text = "/" + "/".join("%2A" * len(p) if p in ("*", "**") else p for p in parts)
    return Pattern(parts, True, (text + "/**") if parts else "/**")


def _events(
    reader: ChannelReader, channel: str, top: int, after_seq: int = 0, from_time: int | None = None
) -> Iterator[Event]:
    """The channel's events after ``after_seq`` (and from ``from_time``) up to the snapshot's ``top``."""
    after = after_seq
    while after < top:
        page = reader.read(channel, after_seq=after, limit=PAGE, from_time=from_time)
        for e in page:
            if e.seq > top:
                return
            yield e
        if len(page) < PAGE:
            return
        after = page[-1].seq


def _last(
    reader: ChannelReader, channel: str, top: int, k: int, keep: Callable[[Event], bool]
) -> list[Event]:
    """The last ``k`` events of the channel (up to ``top``) that ``keep`` accepts, oldest first."""
    n = k
    while True:
        # Commits after the snapshot take room in the window too: grow it until k events at or below
        # ``top`` pass, or the channel has no more.
        raw = reader.read_last(channel, n)
        kept = [e for e in raw if e.seq <= top and keep(e)]
        if len(kept) >= k or len(raw) < n or not k:
            return kept[-k:] if k else []
        n *= 2


def fetch_selection(
    reader: ChannelReader,
    channel: str,
    tops: Mapping[str, int],
    start_id: int | None,
    max_count: int | None,
    keep: Callable[[Event], bool],
    cap: int,
    from_time: int | None = None,
) -> list[Event]:
    """The events of Subtree(channel) a fetch receives (guble.md §5): from ``start_id`` of ``channel`` (and
    the other channels from that event's time) when positive, the last ``-start_id`` (or ``max_count``) when
    negative, everything when absent; with ``from_time``, a catch-up: every event from that time."""
    limit = cap if not max_count else min(max_count, cap)
    if from_time is not None or not start_id:
        streams = [_events(reader, ch, top, 0, from_time) for ch, top in tops.items()]
        merged = (e for e in heapq.merge(*streams, key=merged_key) if keep(e))
        return list(itertools.islice(merged, limit))
    if start_id > 0:
        top = tops.get(channel, 0)
        first = next((e for e in _events(reader, channel, top, start_id - 1) if keep(e)), None)
        if first is None:
            return []
        streams = [
            _events(reader, ch, t, first.seq - 1)
            if ch == channel
            else _events(reader, ch, t, 0, first.time_ns)
            for ch, t in tops.items()
        ]
        merged = (e for e in heapq.merge(*streams, key=merged_key) if keep(e))
        return list(itertools.islice(merged, limit))
    k = min(max_count if max_count else -start_id, cap)
    lasts = [_last(reader, ch, top, k, keep) for ch, top in tops.items()]
    return list(heapq.merge(*lasts, key=merged_key))[-k:]


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
