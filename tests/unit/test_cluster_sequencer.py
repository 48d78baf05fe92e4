"""hubbub.cluster.sequencer: per-channel release in seq order, gaps filled from a real log (the memory
engine), epochs, duplicates, lost events, bounded buffers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hubbub.cluster.sequencer import Sequencer
from hubbub.events import Event, Publisher
from hubbub.log import AppendRequest, ChannelInfo, MemoryLogStore

T = TypeVar("T")


def _append(store: MemoryLogStore, channel: str, n: int) -> list[Event]:
    reqs = [AppendRequest(channel, Publisher("native"), f"{i}".encode(), "text/plain") for i in range(n)]
    return [r.event for r in store.append(reqs)]


class Harness:
    def __init__(self, store: MemoryLogStore, gap_wait: float = 0.05, **kw: int) -> None:
        self.store = store
        self.out: list[tuple[str, str, int, str | None]] = []
        self.lost: list[str] = []
        self.reads = 0
        self.changed = asyncio.Event()
        self.interested = True
        self.seq: Sequencer[str] = Sequencer(
            self._deliver, self._read, self._head, self.lost.append, lambda ch: self.interested,
            gap_wait=gap_wait, **kw,
        )  # fmt: skip

    def _deliver(self, ev: Event, origin: str | None) -> None:
        self.out.append((ev.channel, ev.epoch, ev.seq, origin))
        self.changed.set()

    async def _read(self, channel: str, epoch: str, after: int, limit: int) -> list[Event]:
        self.reads += 1
        return self.store.read(channel, after, limit, epoch=epoch)

    async def _head(self, channel: str) -> ChannelInfo:
        return self.store.head(channel)

    async def until(self, n: int, wait_s: float = 5.0) -> None:
        """Wait until ``n`` events were released."""
        async with asyncio.timeout(wait_s):
            while len(self.out) < n:
                self.changed.clear()
                await self.changed.wait()

    def seqs(self) -> list[int]:
        return [s for _, _, s, _ in self.out]


def run(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(fn())


def test_in_order_and_reordered_events_are_released_in_seq_order_without_reading() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        evs = _append(store, "/c", 5)
        h = Harness(store, gap_wait=10.0)
        h.seq.offer(evs[0], "a")
        assert h.seqs() == [1]
        for i in (3, 2, 4, 1):  # 4 arrives before 3's predecessor, 2 (seq 2 and 3 are out of order)
            h.seq.offer(evs[i], "b" if i % 2 else None)
        assert h.seqs() == [1, 2, 3, 4, 5] and h.reads == 0
        assert [o for *_, o in h.out] == ["a", "b", None, "b", None]
        h.seq.offer(evs[2])  # a duplicate
        assert h.seqs() == [1, 2, 3, 4, 5] and h.seq.duplicates == 1 and h.seq.buffered == 0
        await h.seq.close()

    run(main)


def test_a_gap_is_filled_from_the_log_after_the_wait() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        evs = _append(store, "/c", 6)
        h = Harness(store)
        for i in (0, 1, 4):
            h.seq.offer(evs[i], f"o{i}")
        assert h.seqs() == [1, 2]
        await h.until(6)
        # 3, 4 and 6 came from the log; 5 from the buffer, with its origin.
        assert h.out[2:] == [("/c", evs[0].epoch, 3, None), ("/c", evs[0].epoch, 4, None),
                             ("/c", evs[0].epoch, 5, "o4"), ("/c", evs[0].epoch, 6, None)]  # fmt: skip
        assert h.seq.gaps == 1 and h.seq.filled == 3 and h.seq.buffered == 0
        h.seq.offer(evs[2])  # arriving late: already delivered
        assert len(h.out) == 6
        await h.seq.close()

    run(main)


def test_seeded_positions_are_history() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        evs = _append(store, "/c", 5)
        h = Harness(store, gap_wait=10.0)
        h.seq.seed([store.head("/c")])
        h.seq.offer(evs[2])
        assert h.out == [] and h.seq.released("/c") == (evs[0].epoch, 5)
        more = _append(store, "/c", 1)
        h.seq.offer(more[0])
        assert h.seqs() == [6]
        await h.seq.close()

    run(main)


def test_a_new_epoch_finishes_the_old_one_from_the_log() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        old = _append(store, "/c", 3)
        store.reset_channel("/c")
        new = _append(store, "/c", 2)
        h = Harness(store)
        h.seq.offer(old[0])
        h.seq.offer(new[1])  # the new epoch's 2 before its 1, and old 2 and 3 never arrive
        h.seq.offer(new[0])
        await h.until(5)
        assert [(e, s) for _, e, s, _ in h.out] == [
            (old[0].epoch, 1), (old[0].epoch, 2), (old[0].epoch, 3), (new[0].epoch, 1), (new[0].epoch, 2),
        ]  # fmt: skip
        h.seq.offer(old[2])  # late, of the retired epoch
        assert len(h.out) == 5 and h.seq.buffered == 0
        await h.seq.close()

    run(main)


def test_events_trimmed_before_a_fill_are_lost_loudly() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        evs = _append(store, "/c", 10)
        store.trim("/c", 5)
        h = Harness(store)
        h.seq.offer(evs[7])
        await h.until(5)
        assert h.seqs() == [6, 7, 8, 9, 10] and h.lost == ["/c"] and h.seq.lost == 5
        await h.seq.close()

    run(main)


def test_catch_up_fills_at_once_and_uninterested_channels_read_nothing() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        h = Harness(store, gap_wait=10.0)
        h.seq.seed([])
        evs = _append(store, "/c", 4)
        got = await h.seq.catch_up("/c", evs[0].epoch, 4, 5.0)
        assert got == (evs[0].epoch, 4) and h.seqs() == [1, 2, 3, 4]
        h.interested = False
        other = _append(store, "/quiet", 50)
        reads = h.reads
        assert h.seq.sync_all([store.head("/c"), store.head("/quiet")]) == 1
        assert await h.seq.catch_up("/quiet", other[0].epoch, 50, 5.0) == (other[0].epoch, 50)
        assert h.reads == reads and h.seq.skipped == 50 and len(h.out) == 4
        await h.seq.close()

    run(main)


def test_a_gap_in_a_channel_nobody_reads_is_skipped_without_reading_what_is_buffered() -> None:
    """Another writer's commits racing this node's own on a channel no local subscription matches: the fill
    moves the position past the gap and drops the buffered events up to the log's head, reading nothing;
    events after it are released in order again."""

    async def main() -> None:
        store = MemoryLogStore()
        h = Harness(store, gap_wait=10.0)
        h.seq.seed([])
        h.interested = False
        evs = _append(store, "/quiet", 30)
        for ev in evs[10:]:  # 1-10 still in flight from another writer
            h.seq.offer(ev, "mine")
        assert h.seq.buffered == 20 and h.out == []
        assert await h.seq.catch_up("/quiet", evs[0].epoch, 30, 5.0) == (evs[0].epoch, 30)
        assert h.reads == 0 and h.seq.buffered == 0 and h.seq.skipped == 30 and h.out == []
        h.interested = True
        later = _append(store, "/quiet", 3)
        for ev in later:
            h.seq.offer(ev, "mine")
        assert h.seqs() == [31, 32, 33]
        await h.seq.close()

    run(main)


def test_a_fill_takes_every_buffered_event_between_its_holes() -> None:
    """A fill over a range with many holes between buffered runs releases every seq once, in order, the
    buffered ones with their origins and the holes read from the log."""

    async def main() -> None:
        store = MemoryLogStore()
        h = Harness(store, gap_wait=0.01)
        h.seq.seed([])
        evs = _append(store, "/c", 200)
        mine = [ev for ev in evs[1:] if (ev.seq // 7) % 2 == 0]  # runs of 7 with holes of 7 between them
        for ev in mine:
            h.seq.offer(ev, "mine")
        await h.until(200)
        assert h.seqs() == list(range(1, 201))
        assert {s for _, _, s, o in h.out if o == "mine"} == {ev.seq for ev in mine}
        assert h.seq.buffered == 0 and h.seq.duplicates == 0
        await h.seq.close()

    run(main)


def test_a_full_buffer_is_dropped_and_filled_from_the_log() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        evs = _append(store, "/c", 8)
        h = Harness(store, gap_wait=10.0, max_pending=3)
        for e in evs[1:]:  # seq 1 never arrives; the fourth buffered event overflows
            h.seq.offer(e)
        await h.until(8)
        assert h.seqs() == list(range(1, 9)) and h.seq.buffered == 0
        await h.seq.close()

    run(main)


def test_committed_up_to_fills_what_was_never_published() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        h = Harness(store, gap_wait=10.0)
        h.seq.seed([])
        evs = _append(store, "/c", 3)
        h.seq.committed_up_to("/c", evs[0].epoch, 3)
        await h.until(3)
        assert h.seqs() == [1, 2, 3]
        h.seq.committed_up_to("/c", evs[0].epoch, 2)  # behind: nothing to do
        await h.seq.close()
        assert h.seqs() == [1, 2, 3]

    run(main)


def test_offer_all_releases_what_offering_each_event_releases() -> None:
    """The run fast path (``offer_all``) against :meth:`Sequencer.offer` one event at a time, on the same
    shuffled stream of two channels with duplicates: the same releases, in the same order, with origins."""

    async def main() -> None:
        import random

        store = MemoryLogStore()
        evs = _append(store, "/a", 60) + _append(store, "/b", 40)
        rng = random.Random(7)
        stream = [(f"o{ev.seq}", ev) for ev in evs]
        for _ in range(30):  # local swaps: gaps a few events wide, and duplicates
            i = rng.randrange(len(stream) - 3)
            stream[i], stream[i + 2] = stream[i + 2], stream[i]
        stream += rng.sample(stream, 10)
        one, many = Harness(store, gap_wait=10.0), Harness(store, gap_wait=10.0)
        for h in (one, many):
            h.seq.seed([])
        for origin, ev in stream:
            one.seq.offer(ev, origin)
        many.seq.offer_all(stream)
        assert many.out == one.out and len(one.out) == 100
        assert [s for ch, _, s, _ in one.out if ch == "/a"] == list(range(1, 61))
        assert many.seq.duplicates == one.seq.duplicates and many.seq.buffered == one.seq.buffered == 0
        for h in (one, many):
            await h.seq.close()

    run(main)
