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
from hubbub.client._wire import (
    ClientClosed,
    ClientConnectionError,
    ConnectionLost,
    Gap,
    SubscriptionStatistics,
)
from hubbub.client.positions import SubscriptionPositions
from hubbub.client.protocol import ClientProtocol
from hubbub.errors import HubbubError
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
            await self._start()
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
                    await self._unsubscribe()

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

    # -- on the client's connections -------------------------------------------------------------------

    async def _start(self) -> None:
        client = self._client
        try:
            client._check_open()
            client._subs[self.id] = self
            conn = await client._wait_connected()
        except HubbubError as exc:
            self._end(exc)
            raise
        await self._subscribe_on(conn)

    async def _subscribe_on(self, conn: _Conn) -> None:
        """Send the subscribe request on ``conn`` (with the replay fields of the positions reached) unless
        that was done already. A lost connection is not an error here: the next one subscribes again."""
        if self._conn is conn or self._closed:
            return
        self._conn = conn
        self._active = False
        client = self._client

        def build(proto: ClientProtocol[Any], entry: Any) -> bytes:
            return proto.subscribe(self.id, self.pattern, self.tags, self._positions, entry)

        def on_reply(reply: dict[str, Any]) -> None:
            # Runs in the reader, before any later frame (gaps, replay) is dispatched.
            self._active = True

        try:
            if conn is not client._conn:
                raise ConnectionLost("connection replaced")
            await client._requests.call(conn, None, build=build, on_reply=on_reply)
        except ClientConnectionError:
            if client._final is not None:
                self._end(client._final)
            return
        except HubbubError as exc:
            self._end(exc)
            return
        if self._closed:
            # Unsubscribed while the request was in flight.
            with contextlib.suppress(HubbubError):
                await client._request({"op": "unsubscribe", "sub": self.id}, conn=conn)
            return
        self._set_ready()

    async def _unsubscribe(self) -> None:
        conn = self._client._conn
        if conn is None or self._conn is not conn or not self._ready.done():
            return
        # 4201 (already gone on the server) and a lost connection both mean it is gone.
        with contextlib.suppress(HubbubError):
            await self._client._request({"op": "unsubscribe", "sub": self.id}, conn=conn)

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
        # Dropped, with what its connection still sends for it.
        self._client._subs.pop(self.id, None)
        if self._conn is not None:
            self._conn.proto.forget(self.id)
