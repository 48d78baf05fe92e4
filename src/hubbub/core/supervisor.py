"""Supervised background work: the tasks a long-lived component (retention, the store's health probe, the
cluster broker and sequencer, presence, durable consumers, federation links) runs besides connections.

A component owns its tasks through one :class:`Supervisor`, an async context manager (``async with`` or
:meth:`~Supervisor.open` / :meth:`~Supervisor.aclose`, for a component whose own ``start``/``close`` bracket
it); leaving it cancels the tasks and waits for them, so nothing outlives its component. Two kinds of task:

* :meth:`Supervisor.run`: a **loop** that should run as long as its component does (a heartbeat, a receive
  loop), given as a factory so that it can be started again. When it raises, its **policy** decides:
  :attr:`Policy.RESTART` starts it again after a backoff (0.1 s, doubling to 30 s; back to 0.1 s after a run
  that lasted a minute), :attr:`Policy.STOP` asks the node to stop (:attr:`Supervision.stop_requested`: the
  server shuts down cleanly, as on SIGTERM, and exits non-zero).
* :meth:`Supervisor.spawn`: a **one-shot** task (a gap fill, a settle write); when it raises, the failure is
  reported and the component's own logic (a retry timer, the next poll) takes it from there.

Every failure, of either kind, is logged at error with its component and task and its traceback, and counted
in :attr:`Supervision.failures` (``hubbub_component_failures_total{component=...}`` on ``/metrics``): never a
"Task exception was never retrieved", never a silent ``suppress(Exception)``.

Unlike a connection's :class:`~hubbub.transports.lifetime.Lifetime`, a failed task does not end its owner:
the component lives on, its task restarted or the node stopped by the policy.

Concurrency contract: used from the event loop thread only. :meth:`Supervision.failed` and
:meth:`Supervision.stop` are loop-thread calls too (a thread reports through ``call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, final

__all__ = ["COMPONENTS", "Backoff", "Policy", "Supervision", "Supervisor"]

log = logging.getLogger("hubbub.supervisor")

#: The components that report failures, shown on ``/metrics`` even at zero.
COMPONENTS: Final = (
    "broker",
    "connectors",
    "consumers",
    "dashboard",
    "federation",
    "health",
    "presence",
    "retention",
    "sequencer",
    "wearscript_link",
    "writer",
)


class Policy(enum.Enum):
    """What a loop's failure leads to (:meth:`Supervisor.run`)."""

    #: Start the loop again after a backoff: the component recovers on its own.
    RESTART = "restart"
    #: Stop the node: without this loop it cannot keep its promises (nothing more could be committed).
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class Backoff:
    """The wait before a failed loop starts again: ``first_s``, doubled at each failure up to ``max_s``;
    a run that lasted ``reset_after_s`` starts over from ``first_s``."""

    first_s: float = 0.1
    max_s: float = 30.0
    reset_after_s: float = 60.0


@final
class Supervision:
    """One node's record of its components' failures, and its stop request. See the module docstring."""

    __slots__ = ("failures", "stop_reason", "stop_requested")

    def __init__(self) -> None:
        #: Failures per component, since start (``hubbub_component_failures_total``).
        self.failures: dict[str, int] = {}
        #: Set when a component whose loop has :attr:`Policy.STOP` failed: the server stops.
        self.stop_requested = asyncio.Event()
        #: ``"<component>: <task>"`` of the failure that asked the node to stop.
        self.stop_reason: str | None = None

    def failed(self, component: str, task: str, exc: BaseException, action: str) -> None:
        """Log ``exc`` (with its traceback) as ``component``'s task ``task`` failing, and count it; ``action``
        says what follows (restart, stop, none)."""
        self.failures[component] = self.failures.get(component, 0) + 1
        log.error(
            "%s: %s failed (%s): %s: %s",
            component,
            task,
            action,
            type(exc).__name__,
            exc,
            exc_info=(type(exc), exc, exc.__traceback__),
            extra={"component": component, "task": task},
        )

    def note(self, component: str, task: str, exc: BaseException, action: str) -> None:
        """A failure the component expects and recovers from by itself (its store or Redis away: it tries
        again at the next interval): counted, and logged at warning in one line, without a traceback."""
        self.failures[component] = self.failures.get(component, 0) + 1
        log.warning(
            "%s: %s failed (%s): %s: %s",
            component,
            task,
            action,
            type(exc).__name__,
            exc,
            extra={"component": component, "task": task},
        )

    def stopper(self, component: str, task: str) -> Callable[[BaseException], None]:
        """:meth:`stop` for ``component``'s ``task``, as a callback (a thread's, called on the loop)."""
        return lambda exc: self.stop(component, task, exc)

    def stop(self, component: str, task: str, exc: BaseException) -> None:
        """Report the failure, then ask the node to stop (the first reason is kept)."""
        self.failed(component, task, exc, "stopping the node")
        if self.stop_reason is None:
            self.stop_reason = f"{component}: {task}"
        self.stop_requested.set()


@final
class Supervisor:
    """The tasks of one component. See the module docstring."""

    __slots__ = ("_backoff", "_finish", "_open", "_tasks", "component", "supervision")

    def __init__(
        self, component: str, supervision: Supervision | None = None, backoff: Backoff | None = None
    ) -> None:
        self.component = component
        #: Where failures are reported (the node's; a component tested on its own gets one of its own).
        self.supervision = supervision if supervision is not None else Supervision()
        self._backoff = backoff or Backoff()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: One-shot tasks :meth:`aclose` waits for instead of cancelling.
        self._finish: set[asyncio.Task[Any]] = set()
        self._open = False

    async def __aenter__(self) -> Supervisor:
        self.open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def open(self) -> None:
        """Accept tasks (what ``async with`` does on entry)."""
        self._open = True

    @property
    def closed(self) -> bool:
        """Whether tasks are refused (before :meth:`open`, and from :meth:`aclose` on)."""
        return not self._open

    @property
    def tasks(self) -> int:
        """Tasks running now."""
        return len(self._tasks)

    def run(
        self,
        name: str,
        factory: Callable[[], Coroutine[Any, Any, None]],
        policy: Policy = Policy.RESTART,
    ) -> asyncio.Task[None]:
        """Run the loop ``factory()`` until it returns or the supervisor closes; a failure is reported and
        handled by ``policy``. ``name`` names the task (``asyncio.Task.get_name``) and the failures."""
        return self._start(self._supervise(name, factory, policy), name, finish=False)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *, finish: bool = False) -> asyncio.Task[Any]:
        """Run ``coro`` once; a failure is reported (no restart). ``finish``: :meth:`aclose` waits for it
        rather than cancelling it (a write that must land)."""
        return self._start(coro, name, finish=finish)

    def _start(self, coro: Coroutine[Any, Any, Any], name: str, *, finish: bool) -> asyncio.Task[Any]:
        if not self._open:
            coro.close()
            raise RuntimeError(f"{self.component}: the supervisor is not open")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        if finish:
            self._finish.add(task)
        task.add_done_callback(functools.partial(self._done, name))
        return task

    def _done(self, name: str, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._finish.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here: never "Task exception was never retrieved"
        if exc is not None:
            self.supervision.failed(self.component, name, exc, "not restarted")

    async def _supervise(
        self, name: str, factory: Callable[[], Coroutine[Any, Any, None]], policy: Policy
    ) -> None:
        loop = asyncio.get_running_loop()
        b = self._backoff
        delay = b.first_s
        while True:
            began = loop.time()
            try:
                await factory()
                return
            except Exception as exc:
                if policy is Policy.STOP:
                    self.supervision.stop(self.component, name, exc)
                    return
                if loop.time() - began >= b.reset_after_s:
                    delay = b.first_s
                self.supervision.failed(self.component, name, exc, f"restarting in {delay:g} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, b.max_s)

    async def aclose(self) -> None:
        """Wait for the ``finish`` tasks, then stop taking tasks, cancel the others, and wait until all have
        ended (their failures reported)."""
        while self._finish:  # still open meanwhile: what they start (a settle's next fill) is theirs
            await asyncio.wait(set(self._finish))
        self._open = False
        for t in list(self._tasks):
            t.cancel()
        while self._tasks:
            await asyncio.wait(set(self._tasks))
