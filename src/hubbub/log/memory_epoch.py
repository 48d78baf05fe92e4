"""``Epoch``: one epoch of a channel of the memory store, its retained events held as columns.

A store that keeps millions of events in process memory pays for each object it keeps in the cyclic garbage
collector, not in the append: every :class:`~hubbub.events.Event` (a slotted object pointing at other
objects) is tracked, so each young collection walks those of the last tens of thousands of events, and each
full collection walks them all (bench/RESULTS.md: on a memory-store 1→1 run, 17% of the server's CPU went to
collections that found nothing to free). Here an epoch keeps what differs per event in lists of values the
collector does not track (times, payloads, sizes and log positions: ints and bytes), and what a burst shares
(publisher, content type, headers, tags) once per stretch of events that share it, so the objects it keeps
grow with the bursts, not with the events. Events are built when they are read.

Concurrency: none of its own; the memory store's lock guards every epoch.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from hubbub.events import Event, Publisher
from hubbub.log.base import EventRun

__all__ = ["NO_HEADERS", "Epoch", "Shared", "payload_bytes"]

#: What the events of a stretch share: ``(publisher, content type, headers, tags)``.
Shared = tuple[Publisher, str, Mapping[str, str], tuple[str, ...]]


@dataclass(slots=True, eq=False)
class Epoch:
    """One epoch of channel ``channel`` (the current one, or a retired one).

    The retained events are always the contiguous seqs ``first .. top``; event ``i`` (from the oldest) has
    seq ``first + i``, time ``times[i]``, payload ``payloads[i]``, size ``sizes[i]`` (payload, header and tag
    bytes) and log position ``pos[i]``, and the :data:`Shared` fields of the stretch it falls in: stretch
    ``k`` starts at seq ``starts[k]`` and its events share ``shared[k]`` (``starts`` ascending; the first
    stretch may start before ``first`` once older events were trimmed).
    """

    channel: str
    epoch: str
    id: int
    top: int = 0
    top_time: int = 0
    held: int = 0  # bytes of the retained events (their sizes summed)
    times: list[int] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    shared: list[Shared] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.times)

    @property
    def first(self) -> int:
        return self.top - len(self.times) + 1

    # -- appending (the store's append) ------------------------------------------------------------

    def share(
        self, seq: int, publisher: Publisher, ctype: str, headers: Mapping[str, str], tags: tuple[str, ...]
    ) -> None:
        """The events from ``seq`` on share these fields (until the next call): a new stretch unless the last
        one has them already. Publishers are compared by identity first (a burst shares one object)."""
        if self.shared:
            pub, ct, hd, tg = self.shared[-1]
            if (pub is publisher or pub == publisher) and ct == ctype and hd == headers and tg == tags:
                return
        self.starts.append(seq)
        self.shared.append((publisher, ctype, headers, tags))

    def add_run(self, seq: int, t: int, pos: int, pub: Publisher, ctype: str, payloads: list[bytes]) -> None:
        """Add a run's events (one publisher's burst, without headers or tags): seqs from ``seq``, times from
        ``t`` and log positions from ``pos``, one each; the columns grow in bulk, without a step per event."""
        self.share(seq, pub, ctype, NO_HEADERS, ())
        k = len(payloads)
        self.times += range(t, t + k)
        self.payloads += payloads
        sizes = list(map(len, payloads))
        self.sizes += sizes
        self.pos += range(pos, pos + k)
        self.took(seq + k - 1, t + k - 1, sum(sizes))

    def took(self, top: int, top_time: int, nbytes: int) -> None:
        """Events up to ``top`` (the last at ``top_time``), ``nbytes`` in all, were added to the columns."""
        self.top = top
        self.top_time = top_time
        self.held += nbytes

    def trim_to(self, first: int) -> int:
        """Drop every event below ``first``; returns how many were dropped."""
        n = min(max(first - self.first, 0), len(self.times))
        if n:
            self.held -= sum(self.sizes[:n])
            del self.times[:n]
            del self.payloads[:n]
            del self.sizes[:n]
            del self.pos[:n]
            # Keep the stretch the new first event falls in, and those after it.
            k = bisect.bisect_right(self.starts, self.first) - 1 if self.times else len(self.starts)
            del self.starts[:k]
            del self.shared[:k]
        return n

    # -- reading -------------------------------------------------------------------------------------

    def _stretches(self, lo: int, hi: int) -> Iterator[tuple[int, int, Shared]]:
        """``(start, end, shared)`` index ranges covering events ``lo .. hi - 1`` (0 <= lo < hi <= len)."""
        first, starts = self.first, self.starts
        k = bisect.bisect_right(starts, first + lo) - 1
        while lo < hi:
            end = hi if k + 1 == len(starts) else min(hi, starts[k + 1] - first)
            yield lo, end, self.shared[k]
            lo, k = end, k + 1

    def events(self, lo: int = 0, hi: int | None = None) -> list[Event]:
        """Events ``lo .. hi - 1`` (indexes from the oldest retained), built from the columns."""
        hi = len(self.times) if hi is None else min(hi, len(self.times))
        lo = max(lo, 0)
        out: list[Event] = []
        if lo >= hi:
            return out
        ch, epoch, first, times, payloads = self.channel, self.epoch, self.first, self.times, self.payloads
        for a, b, (pub, ctype, headers, tags) in self._stretches(lo, hi):
            out += [
                Event(ch, seq, epoch, t, pub, p, ctype, headers, tags)
                for seq, t, p in zip(range(first + a, first + b), times[a:b], payloads[a:b], strict=True)
            ]
        return out

    def runs(self, lo: int, hi: int) -> list[EventRun]:
        """Events ``lo .. hi - 1`` as runs (:class:`EventRun`): one per stretch, without an event per row."""
        out: list[EventRun] = []
        ch, epoch, first = self.channel, self.epoch, self.first
        for a, b, (pub, ctype, headers, tags) in self._stretches(max(lo, 0), min(hi, len(self.times))):
            rows = list(zip(self.times[a:b], self.payloads[a:b], strict=True))
            t, p = rows[0]
            out.append(EventRun(Event(ch, first + a, epoch, t, pub, p, ctype, headers, tags), rows))
        return out

    def index_at_time(self, time_ns: int) -> int:
        """The index of the first retained event at or after ``time_ns`` (``len`` when none is)."""
        return bisect.bisect_left(self.times, time_ns)

    def oldest_first(self) -> Iterator[tuple[int, Epoch, int]]:
        """``(time_ns, epoch, index)`` of the retained events, oldest first."""
        for i, t in enumerate(self.times):
            yield t, self, i


#: The headers of every event appended without any: one empty dict for all of them rather than one each (64
#: bytes an event, which a store that keeps millions of events allocates and touches once per publish).
#: Events are never mutated (``hubbub.events``), so sharing it is safe.
NO_HEADERS: Final[dict[str, str]] = {}

#: The item types of a list of bytes only.
_BYTES: Final = {bytes}


def payload_bytes(payloads: Sequence[bytes | bytearray | memoryview]) -> list[bytes]:
    """``payloads`` as a list of ``bytes`` (what the columns keep: a decoder may hand over views of its
    buffer): the list itself when it is one already (the usual run, checked without a Python loop)."""
    if type(payloads) is list and set(map(type, payloads)) == _BYTES:
        return payloads  # (every item is bytes: checked)
    return [p if type(p) is bytes else bytes(p) for p in payloads]
