"""``ReadAhead`` (core/reads.py): the pages of a paged replay read ahead on the reader threads, each page once
when they are whole, and read again from where a shorter page ended."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from hubbub.core.reads import LogReads, ReadAhead
from hubbub.log import open_store
from hubbub.log.base import RetentionPolicy


def reads() -> LogReads:
    store = open_store("memory", "", "none", RetentionPolicy(), 600)
    return LogReads(store, 4, store)


class Pages:
    """A paged read whose page after ``start`` ends at ``end(start)``; it records where each read started
    (on the reader threads)."""

    def __init__(self, end: Callable[[int], int]) -> None:
        self.started: list[int] = []
        self._lock = threading.Lock()
        self._end = end

    def __call__(self, start: int) -> tuple[int, int]:
        with self._lock:
            self.started.append(start)
        return start, self._end(start)


def test_whole_pages_are_each_read_once_and_the_next_ones_at_once() -> None:
    async def main() -> None:
        lr = reads()
        read = Pages(lambda start: min(start + 10, 55))
        ahead = ReadAhead(lr, read, 55, 10, 2)
        pos = 0
        pages = []
        pending = ahead.take(pos)
        while True:
            # While this page is awaited (and then sent), the read of the next one is under way already.
            assert [s for s, _f in ahead._ahead] == ([pos + 10] if pos + 10 < 55 else [])
            start, end = await pending
            pages.append((start, end))
            if end >= 55:
                break
            pos = end
            pending = ahead.take(pos)
        ahead.close()
        await lr.close()
        assert pages == [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50), (50, 55)]
        assert sorted(read.started) == [0, 10, 20, 30, 40, 50]

    asyncio.run(main())


def test_a_shorter_page_drops_the_pages_read_ahead_and_reads_on_from_its_end() -> None:
    async def main() -> None:
        lr = reads()
        read = Pages(lambda start: start + (5 if start == 10 else 10))  # the page after 10 is cut short
        ahead = ReadAhead(lr, read, 40, 10, 3)
        got = []
        pending = ahead.take(0)
        while True:
            start, end = await pending
            got.append((start, end))
            if end >= 40:
                break
            pending = ahead.take(end)
        ahead.close()
        await lr.close()
        # Every page continues the one before it, whatever was read ahead.
        assert got == [(0, 10), (10, 15), (15, 25), (25, 35), (35, 45)]
        assert {0, 10, 15, 25, 35} <= set(read.started)

    asyncio.run(main())


def test_close_drops_the_reads_ahead() -> None:
    async def main() -> None:
        lr = reads()
        gate = threading.Event()

        def read(start: int) -> int:
            gate.wait(10)
            return start

        ahead = ReadAhead(lr, read, 100, 10, 3)
        pending = ahead.take(0)
        dropped = list(ahead._ahead)
        assert [s for s, _ in dropped] == [10, 20]
        ahead.close()
        assert all(f.cancelled() for _, f in dropped) and not ahead._ahead
        gate.set()
        assert await pending == 0
        await lr.close()

    asyncio.run(main())
