"""A byte-stream connection's reads, handled as they come: the protocol of every admitted TCP socket (native,
mist of both generations, qrpc, MQTT; plain or TLS).

The connection's task (:func:`~hubbub.transports.stream_driver.serve_stream`) asks :meth:`StreamReads.next`
for what to do next, giving a *handler*. While the task waits there and nothing is buffered, a read is not
queued for it: ``data_received`` hands it to the handler at once, which feeds it to the connection's wire
(:func:`run_eagerly`, the wire's ``feed`` run up to its end or its first wait). A read whose feed ends
there costs no task step, no future and no loop iteration of its own: at light load a good part of an
event's path through the server (bench/latency_floor.py: a protocol against a stream reader's task). Its
publishes are committed at the end of the same loop iteration (``WriteBatcher.flush``), whose acks and
fan-out write at the end of the commit (:mod:`hubbub.core.flushes`). A feed that must
wait (the session's room, an awaited reply) is handed to the task as the rest to await; reads that come
while the task runs are buffered (up to ``limit`` bytes, then the socket is paused) and fed by the task in
order. Nothing is fed out of turn: one feed at a time, reads in order.

The write side is a :class:`asyncio.StreamWriter`'s protocol: ``drain`` waits while the transport's buffer
is over its high-water mark, ``wait_closed`` until the transport is lost.

An idle connection holds this protocol (slots), its task's frame and one future: no buffer, no deque.

Concurrency contract: the loop thread only; one task per connection calls :meth:`StreamReads.next`.
"""

from __future__ import annotations

import asyncio
from asyncio.tasks import _enter_task, _leave_task
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, Final, final

__all__ = ["FINISHED", "Handler", "StreamReads", "run_eagerly"]

#: A read's handler (:meth:`StreamReads.next`): None when the read was handled whole, else what the task
#: awaits next (the rest of the read's feed, or :data:`FINISHED`).
Handler = Callable[[bytes], "Awaitable[None] | None"]


class _Finished:
    """An awaitable that is done already: a handler's answer for a read that was handled whole and ended
    the connection (the task wakes to see it)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


FINISHED: Final = _Finished()


@final
class _Raise:
    """An awaitable that raises ``error``: a handler's failure, raised in the connection's task."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __await__(self) -> Generator[Any, None, None]:
        raise self.error
        yield  # pragma: no cover - makes this a generator


@final
class _Rest:
    """The rest of a coroutine that :func:`run_eagerly` started: awaited by a task, it goes on from the wait
    the coroutine stopped at, the task waiting on what the coroutine waits on (and cancelling it, when the
    task is cancelled, as if it awaited the coroutine itself)."""

    __slots__ = ("_coro", "_throw", "_waits")

    def __init__(self, coro: Coroutine[Any, Any, None], waits: Any) -> None:
        self._coro: Coroutine[Any, Any, None] | None = coro
        self._waits = waits
        self._throw: BaseException | None = None

    def throwing(self, exc: BaseException) -> _Rest:
        """This rest, to go on with ``exc`` thrown in where the coroutine waits: a cancellation of the task
        that came before the task could await the rest (the coroutine sees it, as it would have in a task
        of its own)."""
        self._throw = exc
        return self

    def __await__(self) -> Generator[Any, Any, None]:
        coro, waits, exc = self._coro, self._waits, self._throw
        assert coro is not None, "the rest of a coroutine is awaited once"
        self._coro = self._waits = self._throw = None
        if exc is None and getattr(waits, "_asyncio_future_blocking", None) is False:
            # Handed to the task now, as the coroutine's own await hands it (run_eagerly took it meanwhile).
            waits._asyncio_future_blocking = True
        if exc is not None:
            try:
                waits = coro.throw(exc)
            except StopIteration:
                return
        while True:
            try:
                value = yield waits
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task (its cancellation): the coroutine's to see
                try:
                    waits = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waits = coro.send(value)
                except StopIteration:
                    return

    def close(self) -> None:
        """Drop a rest that will not be awaited: the coroutine is closed (its ``finally`` clauses run)."""
        coro = self._coro
        if coro is not None:
            self._coro = self._waits = None
            coro.close()


def run_eagerly(coro: Coroutine[Any, Any, None]) -> _Rest | None:
    """Run ``coro`` here, not as a task's step, until it ends (None) or first waits (its rest, for a task to
    await: an object whose ``close`` drops it). Raises what the coroutine raised."""
    try:
        waits = coro.send(None)
    except StopIteration:
        return None
    if getattr(waits, "_asyncio_future_blocking", None):
        # Taken, as a task takes what its coroutine's await yields: until the rest is awaited, another
        # coroutine may await the same future (a tick's shared settle), which a future still marked as
        # being handed over refuses ("await wasn't used with future").
        waits._asyncio_future_blocking = False
    return _Rest(coro, waits)


@final
class StreamReads(asyncio.Protocol):
    """One admitted stream socket's protocol (the module docstring): its reads, to the connection's task or
    its handler; the flow control of its writer."""

    __slots__ = (
        "_buffer",
        "_closed",
        "_drains",
        "_eof",
        "_error",
        "_handler",
        "_job",
        "_limit",
        "_lingering",
        "_loop",
        "_over_tls",
        "_paused",
        "_size",
        "_task",
        "_waiter",
        "_write_paused",
        "transport",
    )

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        self._limit = limit
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self._over_tls = False
        #: Reads the task has not taken yet (while it runs a feed, or before it first asks).
        self._buffer: list[bytes] | None = None
        self._size = 0
        self._eof = False
        self._error: BaseException | None = None
        self._paused = False  # reading paused: the buffer is over its limit
        #: The task's handler while it waits in :meth:`next`, the future it waits on, the task, and what the
        #: handler left it to do (the rest of a feed, its failure, or :data:`FINISHED`).
        self._handler: Handler | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._job: Awaitable[None] | None = None
        self._write_paused = False
        self._drains: list[asyncio.Future[None]] | None = None
        self._closed: asyncio.Future[None] | None = None
        #: Set by :meth:`linger` (the connection reads no more: reads are dropped), done at the end of the
        #: peer's stream.
        self._lingering: asyncio.Future[None] | None = None

    # -- reading ------------------------------------------------------------------------------------------

    async def next(self, handler: Handler | None, most: int) -> bytes | Awaitable[None]:
        """What the connection does next: the bytes read since it last asked (whole reads, as many as make
        ``most`` bytes or more; ``b""`` at the end of the stream), or the rest of a read that ``handler``
        began and must wait for (see the module docstring). Raises the connection's error (a reset), or what
        a feed begun by ``handler`` raised. Without a ``handler`` every read is returned as bytes."""
        while True:
            if self._buffer is not None:
                return self._take(most)
            if self._error is not None:
                raise self._error
            if self._eof or self._lingering is not None:
                return b""
            waiter = self._waiter = self._loop.create_future()
            self._handler = handler
            if handler is not None and self._task is None:
                self._task = asyncio.current_task()
            if self._paused:
                self._resume()
            try:
                await waiter
            except asyncio.CancelledError as exc:
                job, self._job = self._job, None
                if isinstance(job, _Rest):  # cancelled before it could await a feed's rest: the feed's to see
                    return job.throwing(exc)
                raise
            finally:
                self._waiter = self._handler = None
            job, self._job = self._job, None
            if job is not None:
                return job

    def _take(self, most: int) -> bytes:
        buffer = self._buffer
        assert buffer is not None
        if len(buffer) == 1 or self._size <= most:
            self._buffer, self._size = None, 0
            return buffer[0] if len(buffer) == 1 else b"".join(buffer)
        k = n = 0
        while n < most:
            n += len(buffer[k])
            k += 1
        out = b"".join(buffer[:k])
        del buffer[:k]
        self._size -= n
        if not buffer:  # the last read made up ``most``: none is left (an empty list would read as the end)
            self._buffer = None
        return out

    def data_received(self, data: bytes) -> None:
        handler, waiter, task = self._handler, self._waiter, self._task
        eager = handler is not None and waiter is not None and task is not None and not waiter.done()
        if eager and self._feed_now(data, handler, waiter, task):  # type: ignore[arg-type]  # (checked)
            return
        if self._lingering is not None:
            return
        if self._buffer is None:
            self._buffer = [data]
        else:
            self._buffer.append(data)
        self._size += len(data)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        elif self._size > self._limit:
            self._pause()

    @property
    def lingering(self) -> asyncio.Future[None] | None:
        """Done at the end of the peer's stream or the connection's loss, once :meth:`linger` was called;
        else None."""
        return self._lingering

    def linger(self) -> asyncio.Future[None]:
        """The connection reads no more (:func:`~hubbub.transports.stream_driver.linger`): what is buffered
        and what comes from now on is dropped, reading goes on (resumed if paused), the connection's task
        reads the end of the stream, and the future returned (:attr:`lingering`) is done at the end of the
        peer's stream or the connection's loss."""
        self._buffer, self._size = None, 0
        ended = self._lingering = self._loop.create_future()
        if self._eof or self._error is not None or self.transport is None:
            ended.set_result(None)
        elif self._paused:
            self._resume()
        self._wake()  # the connection's task, if it waits for a read: there is none (next)
        return ended

    def _feed_now(
        self, data: bytes, handler: Handler, waiter: asyncio.Future[None], task: asyncio.Task[Any]
    ) -> bool:
        """Hand ``data`` to ``handler`` now, as the connection's task (``asyncio.current_task()`` is that
        task, parked on ``waiter`` meanwhile, as code under a feed may ask: a timeout, a task group); False
        when it cannot be (called inside another task's step, never by the loop: the task feeds it)."""
        loop = self._loop
        try:
            _enter_task(loop, task)
        except RuntimeError:
            self._handler = None
            return False
        try:
            job = handler(data)
        except (Exception, asyncio.CancelledError) as exc:
            job = _Raise(exc)
        finally:
            _leave_task(loop, task)
        if job is not None:
            # The task takes it from here; reads that come meanwhile are buffered (up to the limit).
            self._handler = None
            self._job = job
            if not waiter.done():  # (a feed may have cancelled its own task, and so the waiter)
                waiter.set_result(None)
        return True

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        # Keep a plain socket open for what the connection still writes (its close does it); TLS cannot.
        return not self._over_tls

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        lingering = self._lingering
        if lingering is not None and not lingering.done() and (self._eof or self._error is not None):
            lingering.set_result(None)

    def _pause(self) -> None:
        transport = self.transport
        if not self._paused and transport is not None and not transport.is_closing():
            self._paused = True
            transport.pause_reading()

    def _resume(self) -> None:
        self._paused = False
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    # -- the connection -----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio's and uvloop's stream transports
        self._over_tls = transport.get_extra_info("sslcontext") is not None

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._eof = True
        else:
            self._error = exc
        self._wake()
        drains, self._drains = self._drains, None
        for fut in drains or ():
            if not fut.done():
                if exc is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(exc)
        closed = self._closed
        if closed is None:
            self._closed = closed = self._loop.create_future()
        if not closed.done():
            closed.set_result(None)
        self.transport = None

    # -- the writer's flow control (asyncio.StreamWriter calls these) -------------------------------------

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drains, self._drains = self._drains, None
        for fut in drains or ():
            if not fut.done():
                fut.set_result(None)

    async def _drain_helper(self) -> None:
        closed = self._closed
        if closed is not None and closed.done():  # the transport is lost
            raise ConnectionResetError("Connection lost")
        if not self._write_paused:
            return
        fut = self._loop.create_future()
        if self._drains is None:
            self._drains = [fut]
        else:
            self._drains.append(fut)
        await fut

    def _get_close_waiter(self, stream: object) -> asyncio.Future[None]:
        closed = self._closed
        if closed is None:
            self._closed = closed = self._loop.create_future()
        return closed
