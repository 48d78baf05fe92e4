"""A connection's lifetime: the tasks a connection starts end with it.

:class:`Lifetime` is :class:`asyncio.TaskGroup` with the same rules, sized for a server that holds one per
open connection: it keeps its state in slots and its tasks in a list made with the first one, and is itself
its tasks' done callback, where a ``TaskGroup`` has an instance dictionary, a set, a list of errors and a
bound method per task. Holding one task, it takes some 0.4 KiB less than a ``TaskGroup`` (tracemalloc,
CPython 3.11).

The rules, as ``TaskGroup``'s:

* ``async with Lifetime() as life:`` then ``life.create_task(coro)`` starts a task that belongs to the block.
* Leaving the block normally waits for the tasks still running. Leaving it with an exception (cancellation
  included) cancels them first, then waits for them: no task outlives its connection.
* A task that fails (any exception but cancellation) cancels the others and the task running the block, so the
  connection ends; the block then raises a :class:`BaseExceptionGroup` of the failures (``SystemExit`` and
  ``KeyboardInterrupt`` are raised as they are). A cancellation the block did not ask for propagates.

Concurrency contract: used from the event loop thread only, by one task (the one that enters the block).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar, final

__all__ = ["Lifetime"]

T = TypeVar("T")


@final
class Lifetime:
    """See the module docstring."""

    __slots__ = (
        "_aborting",
        "_base_error",
        "_cancel_requested",
        "_done",
        "_errors",
        "_exiting",
        "_parent",
        "_tasks",
    )

    def __init__(self) -> None:
        self._parent: asyncio.Task[Any] | None = None
        self._tasks: list[asyncio.Task[Any]] | None = None
        self._errors: list[BaseException] | None = None
        self._base_error: BaseException | None = None
        self._done: asyncio.Future[None] | None = None
        self._aborting = False
        self._exiting = False
        #: The block's task was cancelled by this lifetime (a task failed): ``uncancel`` it on the way out.
        self._cancel_requested = False

    async def __aenter__(self) -> Lifetime:
        if self._parent is not None:
            raise RuntimeError("a Lifetime is entered once")
        parent = asyncio.current_task()
        if parent is None:
            raise RuntimeError("a Lifetime is entered from a task")
        self._parent = parent
        return self

    def create_task(self, coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
        """Start ``coro`` as a task of this lifetime."""
        if self._parent is None:
            coro.close()
            raise RuntimeError("the Lifetime has not been entered")
        if self._aborting or (self._exiting and not self._tasks):
            coro.close()
            raise RuntimeError("the Lifetime is ending")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        if self._tasks is None:
            self._tasks = [task]
        else:
            self._tasks.append(task)
        task.add_done_callback(self)
        return task

    def __call__(self, task: asyncio.Task[Any]) -> None:
        """A task of this lifetime is done (its done callback)."""
        tasks = self._tasks
        assert tasks is not None
        tasks.remove(task)
        if not tasks and self._done is not None and not self._done.done():
            self._done.set_result(None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        if self._errors is None:
            self._errors = [exc]
        else:
            self._errors.append(exc)
        if isinstance(exc, SystemExit | KeyboardInterrupt) and self._base_error is None:
            self._base_error = exc
        parent = self._parent
        assert parent is not None
        if parent.done():
            task.get_loop().call_exception_handler(
                {
                    "message": f"task {task!r} of a Lifetime failed after it ended",
                    "exception": exc,
                    "task": task,
                }
            )
            return
        if not self._aborting and not self._cancel_requested:
            # Stop what the block is doing (the connection's read loop): the connection ends.
            self._abort()
            self._cancel_requested = True
            parent.cancel()

    def _abort(self) -> None:
        self._aborting = True
        for t in self._tasks or ():
            if not t.done():
                t.cancel()

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exiting = True
        parent = self._parent
        assert parent is not None
        if exc is not None and isinstance(exc, SystemExit | KeyboardInterrupt) and self._base_error is None:
            self._base_error = exc
        propagate: BaseException | None = exc if et is asyncio.CancelledError else None
        if self._cancel_requested and parent.uncancel() == 0:
            propagate = None  # the only cancellation was this lifetime's own
        if et is not None and not self._aborting:
            self._abort()  # the block failed or was cancelled: its tasks go with it
        while self._tasks:
            self._done = asyncio.get_running_loop().create_future()
            try:
                await self._done
            except asyncio.CancelledError as again:
                if not self._aborting:
                    propagate = again
                    self._abort()
            self._done = None
        if self._base_error is not None:
            raise self._base_error
        errors = self._errors
        if propagate is not None and not errors:
            raise propagate
        if et is not None and et is not asyncio.CancelledError and exc is not None:
            errors = [*(errors or ()), exc]
        if errors:
            self._errors = None
            raise BaseExceptionGroup("unhandled errors in a connection's tasks", errors) from None
