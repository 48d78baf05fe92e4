"""One subscription of the native asyncio client: an async iterator of events and gaps.

:class:`Subscription` keeps the bounded queue (see the backpressure policy in :mod:`hubbub.client.aio`) and
the resume state, a :class:`~hubbub.client.positions.SubscriptionPositions` (the last position delivered per
channel, from which the client resubscribes after a reconnect) that the connection's protocol keeps up to
date. It belongs to its :class:`~hubbub.client.aio.AsyncClient`'s event loop and is used from that loop
only; :meth:`Subscription._put` is called by the client's reader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Generator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from hubbub.client._transport import _Conn
from hubbub.client._wire import ClientClosed, Gap, SubscriptionStatistics
from hubbub.client.positions import SubscriptionPositions
from hubbub.events import Event, Position

if TYPE_CHECKING:
    from hubbub.client.aio import AsyncClient

__all__ = ["UNSUBSCRIBE_WAIT_S", "Subscription"]

#: How long leaving a subscription waits for the server's answer to ``unsubscribe``, in seconds.
UNSUBSCRIBE_WAIT_S = 2.0


class Subscription:
    """One subscription: an async iterator of :class:`~hubbub.events.Event` and :class:`Gap` values.

    Created by :meth:`AsyncClient.subscribe`. ``await sub`` (or ``async with sub``, or the first iteration)
    sends the subscribe request and returns once the server confirmed it: events committed after that are
    delivered. Iteration yields what is queued, then ends (``StopAsyncIteration``) after :meth:`unsubscribe`
    or :meth:`AsyncClient.close`, or raises the error that ended the subscription (for example a failed
    resubscription after a reconnect, or :class:`ConnectionLost` when reconnecting is off).

    ``positions`` is the last position delivered per channel. After a reconnect the subscription resumes
    from it; events at or before it are dropped if the server sends them again.
    """

    def __init__(
        self,
        client: AsyncClient,
        sub_id: str,
        *,
        pattern: str,
        tags: tuple[str, ...],
        since: Position | Mapping[str, Position] | None,
        last: int | None,
        from_time: int | None,
        max_queue: int,
    ) -> None:
        self._client = client
        self.id = sub_id
        self.pattern = pattern
        self.tags = tags
        self.max_queue = max_queue
        self._queue: deque[Event | Gap] = deque()
        self._not_empty = asyncio.Event()
        self._not_full = asyncio.Event()
        self._not_full.set()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._started = False
        self._closed = False
        self._error: BaseException | None = None
        self._conn: _Conn | None = None  # the connection this subscription was (or is being) sent on
        self._active = False
        self._positions = SubscriptionPositions(since, last, from_time)

    # -- public -----------------------------------------------------------------------------------------

    @property
    def positions(self) -> dict[str, Position]:
        """The last delivered position per channel (a copy)."""
        return dict(self._positions.positions)

    @property
    def position(self) -> Position | None:
        """For an exact channel: the position the stream has reached (None before the first reply)."""
        return self._positions.position

    @property
    def active(self) -> bool:
        return self._active and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    async def start(self) -> Subscription:
        """Send the subscribe request (once) and wait for the server to confirm it."""
        if not self._started:
            self._started = True
            await self._client._start_subscription(self)
        await asyncio.shield(self._ready)
        return self

    def __await__(self) -> Generator[Any, None, Subscription]:
        return self.start().__await__()

    async def __aenter__(self) -> Subscription:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.unsubscribe()

    def __aiter__(self) -> AsyncIterator[Event | Gap]:
        return self

    async def __anext__(self) -> Event | Gap:
        if not self._closed and (not self._started or not self._ready.done()):
            await self.start()
        while True:
            if self._queue:
                item = self._queue.popleft()
                self._not_full.set()
                if not self._queue:
                    self._not_empty.clear()
                return item
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            await self._not_empty.wait()

    async def get(self, timeout: float | None = None) -> Event | Gap | None:  # noqa: ASYNC109 - a convenience
        """The next item, waiting at most ``timeout`` seconds (``TimeoutError``); None once ended normally."""
        try:
            async with asyncio.timeout(timeout):
                return await self.__anext__()
        except StopAsyncIteration:
            return None

    async def unsubscribe(self) -> None:
        """Stop the subscription: queued items are discarded and iteration ends. Idempotent. Waits for the
        server's answer at most :data:`UNSUBSCRIBE_WAIT_S`."""
        if self._closed:
            return
        was_active = self._active
        self._queue.clear()
        self._end(None)
        if was_active:
            # It has ended here already (what the server still sends for it is dropped): a server that does
            # not answer must not hold up leaving it, Ctrl-C in ``hubbub sub`` included, until the
            # connection is found dead.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(UNSUBSCRIBE_WAIT_S):
                    await self._client._unsubscribe(self)

    aclose = unsubscribe

    def statistics(self) -> SubscriptionStatistics:
        p = self._positions
        return SubscriptionStatistics(
            id=self.id,
            pattern=self.pattern,
            active=self.active,
            queued=len(self._queue),
            max_queue=self.max_queue,
            received=p.received,
            duplicates_dropped=p.dups,
            gaps=p.gaps,
            replayed=p.replayed,
            subscribes=p.subscribes,
        )

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.pattern!r} active={self.active}>"

    # -- client side (called from the client's reader, on the event loop) ------------------------------

    async def _put(self, item: Event | Gap) -> None:
        # Backpressure: wait for the consumer (the reader stops reading the socket meanwhile).
        while len(self._queue) >= self.max_queue and not self._closed:
            self._not_full.clear()
            await self._not_full.wait()
        if self._closed:
            return
        self._queue.append(item)
        self._not_empty.set()

    def _set_ready(self) -> None:
        if not self._ready.done():
            self._ready.set_result(None)

    def _end(self, error: BaseException | None) -> None:
        """Terminal: iteration drains the queue, then stops (or raises ``error``)."""
        if self._closed:
            return
        self._closed = True
        self._active = False
        self._error = error
        if not self._ready.done():
            if error is not None:
                self._ready.set_exception(error)
                # Retrieved here so an unobserved failure is not reported as "never retrieved".
                self._ready.exception()
            else:
                self._ready.set_exception(ClientClosed("subscription closed"))
                self._ready.exception()
        self._not_empty.set()
        self._not_full.set()
        self._client._forget(self)
