"""Durable consumers in the native asyncio client (docs/native.md "Durable consumers").

::

    async with client.consume("resize", "/jobs/resize/**", max=100) as consumer:
        async for batch in consumer:
            for item in batch:
                handle(item.event)
            await batch.ack()          # or batch.nack(): delivered again after a backoff

A :class:`Consumer` opens the consumer on the client's connection and yields its :class:`ConsumerBatch`
values, one at a time: the server sends the next batch only once this one is acknowledged or given back.
After a reconnect the client opens the consumer again; a batch that was out when the connection dropped is
redelivered by the server (at least once), and acknowledging it on the old connection raises
:class:`ConnectionLost`. It belongs to its client's event loop; the ``_on_*`` hooks are called by the
client's reader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from hubbub.client._transport import _Conn
from hubbub.client._wire import ClientClosed, ClientConnectionError, ConnectionLost, event_from_dict
from hubbub.errors import HubbubError
from hubbub.events import Event

if TYPE_CHECKING:
    from hubbub.client.aio import AsyncClient

__all__ = ["Consumer", "ConsumerBatch", "ConsumerItem"]

#: ``consumer busy``: open elsewhere (on a cluster, maybe on a node that died a moment ago).
BUSY: Final = 4206
#: How long a consumer reopened after a reconnect retries while it is busy (a lost machine's hold ends
#: within about 25 s on a cluster).
BUSY_RETRY_S: Final = 40.0


@dataclass(frozen=True, slots=True)
class ConsumerItem:
    """One journal item: its position ``pos`` in the consumer's journal, how many earlier deliveries of it
    were given back (``attempts``), and the event."""

    pos: int
    attempts: int
    event: Event


class ConsumerBatch:
    """One batch of a durable consumer: iterate it (or read ``items``/``events``), then :meth:`ack` or
    :meth:`nack` it."""

    __slots__ = ("_conn", "_consumer", "items", "number", "settled")

    def __init__(self, consumer: Consumer, conn: _Conn, number: int, items: tuple[ConsumerItem, ...]) -> None:
        self._consumer = consumer
        self._conn = conn
        self.number = number
        self.items = items
        self.settled = False

    @property
    def consumer(self) -> str:
        return self._consumer.name

    @property
    def events(self) -> list[Event]:
        return [it.event for it in self.items]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[ConsumerItem]:
        return iter(self.items)

    async def ack(self) -> None:
        """Acknowledge the batch: once this returns its items are durably gone from the consumer's journal
        and never delivered again."""
        await self._consumer._settle(self, "ack")

    async def nack(self) -> None:
        """Give the batch back: its items are delivered again after a backoff (100 ms times attempts, at
        most 5 s)."""
        await self._consumer._settle(self, "nack")

    def __repr__(self) -> str:
        return f"<ConsumerBatch {self.consumer} #{self.number} {len(self.items)} items>"


class Consumer:
    """A durable consumer opened by :meth:`AsyncClient.consume`; an async iterator of :class:`ConsumerBatch`.

    ``await consumer`` (or ``async with``, or the first iteration) sends ``consume`` and returns once the
    server confirmed it (``info`` then holds the reply: the definition, ``created``, ``pending``). Iteration
    ends after :meth:`close` or :meth:`AsyncClient.close`, or raises the error that ended the consumer
    (the server refused to open it again after a reconnect, or it was deleted: :class:`ClientClosed` with
    the reason).
    """

    def __init__(self, client: AsyncClient, name: str, fields: dict[str, Any]) -> None:
        self._client = client
        self.name = name
        self._fields = {k: list(v) if k == "tags" else v for k, v in fields.items() if v is not None}
        if "pattern" not in self._fields:
            self._fields.setdefault("create", False)  # no pattern to create it from: open an existing one
        self._queue: deque[ConsumerBatch] = deque()
        self._wake = asyncio.Event()
        self._conn: _Conn | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._started = False
        self._error: HubbubError | None = None
        self.closed = False
        #: The server's reply to the last ``consume``.
        self.info: dict[str, Any] = {}
        self.batches = 0

    # -- opening ----------------------------------------------------------------------------------------

    def __await__(self) -> Generator[Any, None, Consumer]:
        return self._start().__await__()

    async def _start(self) -> Consumer:
        if not self._started:
            self._started = True
            client = self._client
            try:
                client._check_open()
                if client._consumers.setdefault(self.name, self) is not self:
                    raise ValueError(f"consumer {self.name} is open on this client already")
                await self._open_on(await client._wait_connected())
            except HubbubError as exc:
                self._end(exc)
        await asyncio.shield(self._ready)
        return self

    async def _open_on(self, conn: _Conn) -> None:
        """Send ``consume`` on ``conn`` unless that was done; a lost connection is retried by the next one."""
        if self._conn is conn or self.closed:
            return
        self._conn = conn
        frame = {"op": "consume", "consumer": self.name, **self._fields}
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + BUSY_RETRY_S, 0.05
        while True:
            try:
                reply = await self._client._request(dict(frame), conn=conn)
                self.info = {k: v for k, v in reply.items() if k not in ("op", "id")}
                break
            except ClientConnectionError:
                if self._client._final is not None:
                    self._end(self._client._final)
                return
            except HubbubError as exc:
                # Reopened after a reconnect: the server may not have seen the old connection go yet, or, on
                # a cluster, the node that served it may not have let go (it died a moment ago,
                # docs/cluster.md): 4206 for a while, then it opens.
                again = exc.code == BUSY and self._ready.done() and loop.time() < deadline
                if not again or self.closed:
                    self._end(exc)
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            if conn is not self._conn:
                return  # replaced meanwhile: the next connection reopens it
        if not self._ready.done():
            self._ready.set_result(None)

    # -- the reader's hooks -----------------------------------------------------------------------------

    def _on_frame(self, conn: _Conn, frame: dict[str, Any]) -> None:
        if conn is not self._conn or self.closed:
            return
        if frame.get("op") == "consumer_closed":
            self._end(ClientClosed(f"consumer {self.name} closed: {frame.get('reason', '')}"))
            return
        raw = frame.get("items")
        number = frame.get("batch")
        if not isinstance(raw, list) or not isinstance(number, int):
            return
        items = tuple(
            ConsumerItem(int(it.get("pos", 0)), int(it.get("attempts", 0)), event_from_dict(it))
            for it in raw
            if isinstance(it, dict)
        )
        self._queue.append(ConsumerBatch(self, conn, number, items))
        self.batches += 1
        self._wake.set()

    def _end(self, error: HubbubError | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._error = error
        self._client._consumers.pop(self.name, None)
        if not self._ready.done():
            if error is not None:
                self._ready.set_exception(error)
                self._ready.exception()  # retrieved: nobody may await it
            else:
                self._ready.set_result(None)
        self._wake.set()

    # -- settling ---------------------------------------------------------------------------------------

    async def _settle(self, batch: ConsumerBatch, op: str) -> None:
        if batch.settled:
            raise ValueError(f"batch {batch.number} was settled already")
        if batch._conn is not self._client._conn or batch._conn.transport is None:
            raise ConnectionLost("the batch's connection was lost: the server delivers it again")
        frame = {"op": op, "consumer": self.name, "batch": batch.number}
        await self._client._request(frame, conn=batch._conn)
        batch.settled = True

    # -- iterating --------------------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[ConsumerBatch]:
        return self

    async def __anext__(self) -> ConsumerBatch:
        if not self._started:
            await self._start()
        while True:
            if self._queue:
                return self._queue.popleft()
            if self.closed:
                if self._error is not None and not isinstance(self._error, ClientClosed):
                    raise self._error
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()

    async def close(self) -> None:
        """Stop consuming (``unconsume``): a batch not yet acknowledged is delivered again. Idempotent."""
        if self.closed:
            return
        conn = self._conn
        self._end(None)
        if conn is not None and conn is self._client._conn:
            with contextlib.suppress(HubbubError):
                await self._client._request({"op": "unconsume", "consumer": self.name}, conn=conn)

    async def __aenter__(self) -> Consumer:
        return await self._start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<Consumer {self.name} {'closed' if self.closed else 'open'}>"
