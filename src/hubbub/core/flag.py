"""A small waitable flag, for per-connection state that exists once per idle connection.

:class:`Flag` has the interface of :class:`asyncio.Event` that sessions and transports use (``set``,
``clear``, ``is_set``, ``wait``) at a fraction of its size: an ``asyncio.Event`` carries an instance dict
and a deque of waiters from the start (about 850 bytes), which at ten thousand idle connections with three
events each is some 25 MB. A flag is two slots; the list of waiters exists only while someone waits.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

import asyncio
from typing import Literal

__all__ = ["Flag"]


class Flag:
    """Set, clear, and wait until set. Like :class:`asyncio.Event`, but allocated lazily."""

    __slots__ = ("_value", "_waiters")

    def __init__(self) -> None:
        self._value = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        """Set the flag and wake every waiter. Setting a flag that is set does nothing."""
        if self._value:
            return
        self._value = True
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def clear(self) -> None:
        self._value = False

    async def wait(self) -> Literal[True]:
        """Return once the flag is set (at once if it is set already)."""
        if self._value:
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
        return f"<Flag {'set' if self._value else 'unset'}, {n} waiting>"
