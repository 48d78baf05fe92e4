"""Reads of the log for transports and the node: typed, bounded, and off the event loop.

:class:`LogReads` owns the node's reader threads. Each method runs one store call (or a short series of them,
from one thread hop) on a reader thread and returns plain values: a transport never hands the core a
function over the store. Bounds: :meth:`LogReads.read_channel` returns at most :data:`READ_LIMIT` events per
call and :meth:`LogReads.list_channels` at most :data:`LIST_LIMIT` channels, whatever is asked.

Concurrency contract: the coroutines are called from the event loop thread; the store calls they make run
on the reader threads (``EventLog`` reads are thread-safe, ARCHITECTURE §2). :meth:`LogReads.submit` is the
one non-coroutine entry: the node's paged replay starts the reads of the next pages with it
(:class:`ReadAhead`) while the loop sends the previous one.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, final

from hubbub.channels import Pattern
from hubbub.events import Event
from hubbub.log.base import ChannelInfo, ConsumerJournal, EventLog, LogStore, StateMaps

from .replay import list_channels

__all__ = ["LIST_LIMIT", "READ_LIMIT", "ChannelPage", "LogReads", "ReadAhead", "drop"]

T = TypeVar("T")
P = ParamSpec("P")

#: The most events one :meth:`LogReads.read_channel` returns.
READ_LIMIT = 10_000
#: The most channels one :meth:`LogReads.list_channels` returns.
LIST_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class ChannelPage:
    """One bounded read of a channel: its position when read (``info``) and the events read. ``events`` is
    empty when the read named an epoch other than the current one (``epoch_matches`` is then false)."""

    info: ChannelInfo
    events: list[Event]
    epoch_matches: bool = True


@final
class LogReads:
    """The node's reader threads and the typed reads run on them. See the module docstring.

    ``store``: the log as the node reads it (a cluster node's view caps its heads at what the node delivered,
    ``hubbub.cluster.view``); ``journal``: the consumers' journals and the state maps (the store
    itself)."""

    def __init__(self, store: EventLog, threads: int, journal: LogStore) -> None:
        self.store = store
        self.journal = journal
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="hubbub-log-reader")

    async def close(self) -> None:
        """Wait for the reads running, off the loop (joining the threads blocks)."""
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Start ``fn(*args)`` on a reader thread (core only: the paged replay's read-ahead)."""
        return asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def call(self, fn: Callable[Concatenate[EventLog, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(store, *args, **kwargs)`` on a reader thread (core only: replay planning)."""
        call = functools.partial(fn, self.store, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    async def call_journal(
        self, fn: Callable[Concatenate[ConsumerJournal, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(journal, *args, **kwargs)`` on a reader thread (core only: the durable consumers)."""
        call = functools.partial(fn, self.journal, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    async def call_state(
        self, fn: Callable[Concatenate[StateMaps, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``fn(maps, *args, **kwargs)`` on a reader thread, over the store's state maps (core only:
        ``core/routes.py``)."""
        call = functools.partial(fn, self.journal, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    async def read_channel(
        self,
        channel: str,
        *,
        since: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        epoch: str | None = None,
    ) -> ChannelPage:
        """The channel's position and its events with ``seq > since`` (and ``from_time <= time_ns <=
        to_time`` where given), oldest first, at most ``min(limit, READ_LIMIT)``. With ``epoch``, the events
        only when it is the channel's current epoch (the position is read first, in the same thread hop)."""
        n = max(0, min(limit, READ_LIMIT))

        def read(store: EventLog) -> ChannelPage:
            info = store.head(channel)
            if epoch is not None and epoch != info.epoch:
                return ChannelPage(info, [], epoch_matches=False)
            return ChannelPage(info, store.read(channel, since, n, from_time, to_time) if n else [])

        return await self.call(read)

    async def head(self, channel: str) -> ChannelInfo:
        """The channel's position (``EventLog.head``)."""
        return await self.call(lambda st: st.head(channel))

    async def list_channels(
        self,
        pattern: Pattern,
        *,
        after: str = "",
        limit: int = 1000,
        include_empty: bool = False,
        keep: Callable[[str], bool] | None = None,
    ) -> list[ChannelInfo]:
        """The channels matching ``pattern`` with retained events (``include_empty``: every channel with a
        current epoch), in byte order of their path, strictly after ``after``, that ``keep`` accepts (on the
        reader thread: it must be thread-safe), at most ``min(limit, LIST_LIMIT)``."""
        n = max(0, min(limit, LIST_LIMIT))

        def read(store: EventLog) -> list[ChannelInfo]:
            return list_channels(store, pattern, include_empty=include_empty, after=after, limit=n, keep=keep)

        return await self.call(read)

    async def top_time(self) -> int:
        """``time_ns`` of the newest committed event of the whole log (``EventLog.top_time``); also the
        store's health probe."""
        return await self.call(lambda st: st.top_time())

    async def oldest_time(self) -> int:
        """``time_ns`` of the oldest retained event of the channels' current epochs (the first in commit
        order: one row read), 0 when there is none."""

        def read(store: EventLog) -> int:
            page = store.read_log(0, store.log_mark(), 1)
            return page.events[0].time_ns if page.events else 0

        return await self.call(read)


@final
class ReadAhead(Generic[T]):
    """The pages of a paged read (an exact channel's replay) read ahead on the reader threads: while the loop
    sends one page, the next ``depth`` are read at once, on as many threads (so on as many cores: SQLite
    works without the GIL).

    ``read(start)`` reads the page after position ``start``; a page read whole ends ``page`` positions
    later, so the pages ahead are started where the page before them would end, up to ``top``. A page that
    ends sooner (a byte budget, a trim) shows that the pages ahead start elsewhere: :meth:`take` of the
    position it did end at drops them and reads from there. Memory: ``depth + 1`` pages at most.

    Concurrency contract: the event loop thread only (the reads run on the reader threads)."""

    __slots__ = ("_ahead", "_depth", "_page", "_read", "_submit", "_top")

    def __init__(
        self,
        reads: LogReads,
        read: Callable[[int], T],
        top: int,
        page: int,
        depth: int,
    ) -> None:
        self._submit = reads.submit
        self._read = read
        self._top = top
        self._page = page
        self._depth = depth
        self._ahead: deque[tuple[int, asyncio.Future[T]]] = deque()

    def take(self, start: int) -> asyncio.Future[T]:
        """The read of the page after ``start`` (started now unless it was read ahead), with the pages after
        it started in turn."""
        ahead = self._ahead
        if ahead and ahead[0][0] == start:
            pending = ahead.popleft()[1]
        else:
            self.close()
            pending = self._submit(self._read, start)
        nxt = ahead[-1][0] if ahead else start
        while len(ahead) < self._depth - 1 and (nxt := min(nxt + self._page, self._top)) < self._top:
            ahead.append((nxt, self._submit(self._read, nxt)))
        return pending

    def close(self) -> None:
        """Drop the pages read ahead (a read running ends on its thread, unused)."""
        for _start, pending in self._ahead:
            drop(pending)
        self._ahead.clear()


def drop(pending: asyncio.Future[Any]) -> None:
    """Cancel a read that is not needed any more; one that failed unawaited is not worth a log line."""
    if not pending.cancel() and not pending.cancelled():
        pending.exception()
