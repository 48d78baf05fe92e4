"""The blocking client: :class:`AsyncClient` on a private event loop in a background thread.

::

    with Client.connect("ws://127.0.0.1:8080") as client:
        client.publish("/chat/room", "hi")
        with client.subscribe("/chat/**", last=10) as sub:
            for item in sub:
                print(item)

Concurrency contract: a :class:`Client` may be used from any thread; every call is handed to the client's
own loop thread and waits for its result. Methods accept ``timeout`` (seconds, ``TimeoutError``) where a
call could wait indefinitely. Interrupting a blocking call (Ctrl-C) cancels the operation on the loop.
Backpressure works as in :mod:`hubbub.client.aio`: a subscription nobody iterates stops the reader once its
queue is full, which also holds back publish acknowledgements on the same client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

from hubbub.client._transport import DEFAULT_CLIENT_NAME
from hubbub.client.aio import (
    AsyncClient,
    ClientClosed,
    ClientStatistics,
    Gap,
    PublishAck,
    Subscription,
    SubscriptionStatistics,
)
from hubbub.client.consumer import Consumer, ConsumerBatch, ConsumerItem
from hubbub.client.emitter import Emitter, Handler, Listener
from hubbub.events import Event, Position

__all__ = ["Client", "SyncBatch", "SyncConsumer", "SyncEmitter", "SyncSubscription"]

T = TypeVar("T")


class _LoopThread:
    """A private event loop running in a daemon thread until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self._started.wait()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._started.set)
        try:
            loop.run_forever()
        finally:
            try:
                tasks = asyncio.all_tasks(loop)
                for t in tasks:
                    t.cancel()
                if tasks:
                    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self.loop.is_closed() or not self.thread.is_alive():
            coro.close()
            raise ClientClosed("client closed")
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking hubbub Client cannot be called from its own event loop")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"no result within {timeout}s") from None
        except BaseException:
            fut.cancel()  # Ctrl-C: stop the operation on the loop too
            raise

    def stop(self) -> None:
        if self.thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()


class SyncSubscription:
    """A blocking iterator over a subscription's :class:`Event` and :class:`Gap` values."""

    def __init__(self, client: Client, sub: Subscription) -> None:
        self._client = client
        self._sub = sub

    @property
    def id(self) -> str:
        return self._sub.id

    @property
    def pattern(self) -> str:
        return self._sub.pattern

    @property
    def positions(self) -> dict[str, Position]:
        """The last delivered position per channel (read on the loop thread)."""
        return self._client._read(lambda: self._sub.positions)

    @property
    def position(self) -> Position | None:
        return self._client._read(lambda: self._sub.position)

    @property
    def active(self) -> bool:
        return self._sub.active

    @property
    def closed(self) -> bool:
        return self._sub.closed

    def __iter__(self) -> Iterator[Event | Gap]:
        return self

    def __next__(self) -> Event | Gap:
        item = self._client._thread.call(self._sub.get())
        if item is None:
            raise StopIteration
        return item

    def get(self, timeout: float | None = None) -> Event | Gap | None:
        """The next item; ``TimeoutError`` after ``timeout`` seconds; None once the subscription ended."""
        return self._client._thread.call(self._sub.get(timeout))

    def unsubscribe(self, timeout: float | None = None) -> None:
        if self._sub.closed:
            return
        with contextlib.suppress(ClientClosed):
            self._client._thread.call(self._sub.unsubscribe(), timeout)

    close = unsubscribe

    def statistics(self) -> SubscriptionStatistics:
        return self._client._read(self._sub.statistics)

    def __enter__(self) -> SyncSubscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.unsubscribe()

    def __repr__(self) -> str:
        return f"<SyncSubscription {self._sub.id} {self._sub.pattern!r}>"


class SyncBatch:
    """A blocking view of a :class:`ConsumerBatch`: iterate its items, then :meth:`ack` or :meth:`nack`."""

    def __init__(self, client: Client, batch: ConsumerBatch) -> None:
        self._client = client
        self._batch = batch
        self.number = batch.number
        self.items = batch.items

    @property
    def events(self) -> list[Event]:
        return self._batch.events

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[ConsumerItem]:
        return iter(self.items)

    def ack(self, timeout: float | None = None) -> None:
        """See :meth:`ConsumerBatch.ack`: durable once this returns."""
        self._client._thread.call(self._batch.ack(), timeout)

    def nack(self, timeout: float | None = None) -> None:
        self._client._thread.call(self._batch.nack(), timeout)

    def __repr__(self) -> str:
        return repr(self._batch).replace("ConsumerBatch", "SyncBatch")


class SyncConsumer:
    """A blocking iterator over a durable consumer's batches (:class:`Consumer`)."""

    def __init__(self, client: Client, consumer: Consumer) -> None:
        self._client = client
        self._consumer = consumer

    @property
    def name(self) -> str:
        return self._consumer.name

    @property
    def info(self) -> dict[str, Any]:
        return self._consumer.info

    @property
    def closed(self) -> bool:
        return self._consumer.closed

    def __iter__(self) -> Iterator[SyncBatch]:
        return self

    def __next__(self) -> SyncBatch:
        batch = self.get()
        if batch is None:
            raise StopIteration
        return batch

    def get(self, timeout: float | None = None) -> SyncBatch | None:
        """The next batch; ``TimeoutError`` after ``timeout`` seconds; None once the consumer ended."""

        async def next_batch() -> ConsumerBatch | None:
            try:
                return await self._consumer.__anext__()
            except StopAsyncIteration:
                return None

        batch = self._client._thread.call(next_batch(), timeout)
        return None if batch is None else SyncBatch(self._client, batch)

    def close(self, timeout: float | None = None) -> None:
        """Stop consuming; a batch not acknowledged is delivered again. Idempotent."""
        if self._consumer.closed:
            return
        with contextlib.suppress(ClientClosed):
            self._client._thread.call(self._consumer.close(), timeout)

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SyncConsumer {self.name}>"


class SyncEmitter:
    """qpubs' emitter API (:class:`~hubbub.client.Emitter`), blocking. Listener functions run on the client's
    loop thread: keep them short, and do not call the client from them."""

    def __init__(self, client: Client, emitter: Emitter) -> None:
        self._client = client
        self._emitter = emitter

    def emit(self, topic: str, value: Any, timeout: float | None = None) -> PublishAck | None:
        return self._client._thread.call(self._emitter.emit(topic, value), timeout)

    def listen(self, topic: str, fn: Handler, timeout: float | None = None) -> Listener:
        return self._client._thread.call(self._emitter.listen(topic, fn), timeout)

    def once(self, topic: str, timeout: float | None = None) -> Any:
        """The value of the next event on a matching topic (``TimeoutError`` after ``timeout`` s)."""
        return self._client._thread.call(self._emitter.once(topic, timeout=timeout))

    def ignore(self, topic: str, fn: Handler | None = None, timeout: float | None = None) -> int:
        return self._client._thread.call(self._emitter.ignore(topic, fn), timeout)

    def close(self) -> None:
        self._client._thread.call(self._emitter.close())


class Client:
    """The blocking native-protocol client. ``Client(url, ...)`` or ``Client.connect(url, ...)`` connects.

    Arguments are those of :meth:`AsyncClient.connect`, plus ``timeout`` for the first connection.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        client_name: str = DEFAULT_CLIENT_NAME,
        reconnect: bool = True,
        batch: bool = True,
        timeout: float | None = None,
        **options: Any,
    ) -> None:
        self.url = url
        self._thread = _LoopThread(f"hubbub-client {url}")
        self._closed = False

        async def connect() -> AsyncClient:
            return await AsyncClient.connect(
                url, token=token, client_name=client_name, reconnect=reconnect, batch=batch, **options
            )

        try:
            self._aclient = self._thread.call(connect(), timeout)
        except BaseException:
            self._thread.stop()
            raise

    @classmethod
    def connect(cls, url: str, **kwargs: Any) -> Client:
        return cls(url, **kwargs)

    @property
    def aclient(self) -> AsyncClient:
        """The underlying AsyncClient; use it only from coroutines run with :meth:`run`."""
        return self._aclient

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the client's loop and wait for its result."""
        return self._thread.call(coro, timeout)

    @property
    def connected(self) -> bool:
        return self._aclient.connected

    def publish(
        self,
        channel: str,
        data: Any,
        *,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
        tags: Iterable[str] | None = None,
        idem: str | None = None,
        ack: bool = True,
        timeout: float | None = None,
    ) -> PublishAck | None:
        """See :meth:`AsyncClient.publish`."""
        return self._thread.call(
            self._aclient.publish(
                channel, data, content_type=content_type, headers=headers, tags=tags, idem=idem, ack=ack
            ),
            timeout,
        )

    def subscribe(
        self,
        pattern: str,
        *,
        tags: Iterable[str] | None = None,
        since: Position | Mapping[str, Position] | None = None,
        last: int | None = None,
        from_time: int | None = None,
        max_queue: int | None = None,
        timeout: float | None = None,
    ) -> SyncSubscription:
        """Subscribe and wait for the server's confirmation. See :meth:`AsyncClient.subscribe`."""

        async def start() -> Subscription:
            sub = self._aclient.subscribe(
                pattern, tags=tags, since=since, last=last, from_time=from_time, max_queue=max_queue
            )
            try:
                return await sub.start()
            except BaseException:
                await sub.unsubscribe()
                raise

        return SyncSubscription(self, self._thread.call(start(), timeout))

    def consume(
        self, name: str, pattern: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> SyncConsumer:
        """Open a durable consumer and wait for the server's confirmation. See :meth:`AsyncClient.consume`."""

        async def start() -> Consumer:
            consumer = self._aclient.consume(name, pattern, **options)
            try:
                return await consumer
            except BaseException:
                await consumer.close()
                raise

        return SyncConsumer(self, self._thread.call(start(), timeout))

    def emitter(self, separator: str = ".") -> SyncEmitter:
        """qpubs' ``listen``/``emit``/``once``/``ignore`` on this client (:class:`SyncEmitter`)."""
        return SyncEmitter(self, Emitter(self._aclient, separator))

    def ping(self, timeout: float | None = None) -> None:
        self._thread.call(self._aclient.ping(), timeout)

    def statistics(self) -> ClientStatistics:
        return self._read(self._aclient.statistics)

    def _read(self, fn: Callable[[], T]) -> T:
        """Call ``fn`` on the loop thread (state is only consistent there); directly once closed."""
        if self._closed or not self._thread.thread.is_alive():
            return fn()

        async def read() -> T:
            return fn()

        return self._thread.call(read())

    def close(self) -> None:
        """Close the connection and stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            with contextlib.suppress(ClientClosed):
                self._thread.call(self._aclient.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client {self.url} connected={self.connected}>"
