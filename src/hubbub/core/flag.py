"""A small waitable flag, for per-connection state that exists once per idle connection.

:class:`Flag` has the interface of :class:`asyncio.Event` that sessions and transports use (``set``,
``clear``, ``is_set``, ``wait``) at a fraction of its size: an ``asyncio.Event`` carries an instance dict
and a deque of waiters from the start (about 850 bytes), which at ten thousand idle connections with three
events each is some 25 MB. A flag is two slots; the list of waiters exists only while someone waits.

Beside coroutines that ``wait``, a flag calls plain callbacks once when set (:meth:`Flag.call_when_set`): a
connection's write loop parks there while its queue is empty, and costs no task while it is idle.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

__all__ = ["Flag"]


class Flag:
    """Set, clear, and wait until set. Like :class:`asyncio.Event`, but allocated lazily."""

    __slots__ = ("_waiters", "value")

    def __init__(self) -> None:
        #: Whether the flag is set: read it (a hot path's check costs no call), never write it (``set``
        #: wakes the waiters, ``clear`` unsets).
        self.value = False
        # Futures of coroutines in wait(), and callbacks of call_when_set(): both go once the flag is set.
        self._waiters: list[asyncio.Future[None] | Callable[[], None]] | None = None

    def is_set(self) -> bool:
        return self.value

    def set(self) -> None:
        """Set the flag, wake every waiter and call every callback (in the order they came). Setting a flag
        that is set does nothing. A callback runs in the caller of ``set``: it must not raise."""
        if self.value:
            return
        self.value = True
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for w in waiters:
                if not isinstance(w, asyncio.Future):
                    w()
                elif not w.done():
                    w.set_result(None)

    def call_when_set(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, in :meth:`set` (at once if the flag is set already): a waiter that needs
        no coroutine. :meth:`discard` takes it back."""
        if self.value:
            callback()
        elif self._waiters is None:
            self._waiters = [callback]
        else:
            self._waiters.append(callback)

    def call_when_next_set(self, callback: Callable[[], None]) -> None:
        """Clear the flag and call ``callback`` once, when it is next set: :meth:`clear` then
        :meth:`call_when_set`, in one call (a write loop parks so after every write)."""
        self.value = False
        if self._waiters is None:
            self._waiters = [callback]
        else:
            self._waiters.append(callback)

    def discard(self, callback: Callable[[], None]) -> None:
        """Take back a callback of :meth:`call_when_set` that was not called yet. Idempotent."""
        waiters = self._waiters
        if waiters is not None and callback in waiters:
            waiters.remove(callback)
            if not waiters:
                self._waiters = None

    def clear(self) -> None:
        self.value = False

    async def wait(self) -> Literal[True]:
        """Return once the flag is set (at once if it is set already)."""
        if self.value:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = [fut]
        else:
            waiters.append(fut)
        try:
            await fut
        finally:
            # A cancelled waiter leaves the list; after set() the list is gone already.
            if self._waiters is waiters and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    self._waiters = None
        return True

    def __repr__(self) -> str:
        n = len(self._waiters) if self._waiters else 0
        return f"<Flag {'set' if self.value else 'unset'}, {n} waiting>"
