"""Time- and size-based retention of the whole log, applied every ``retention_interval_s`` (docs/operations.md
"Retention").

:class:`RetentionTask` owns one task: every interval it hands ``LogStore.apply_retention`` to the log writer
(``control``), in order with the appends, and logs what was trimmed. The task belongs to the component's
:class:`~hubbub.core.supervisor.Supervisor` (component ``retention``): a failure, of the store or of the loop
itself, is logged with its traceback, counted (``hubbub_component_failures_total{component="retention"}``),
and the loop starts again after a backoff, its next pass an interval later. The per-channel limits
(``max_events``, ``max_bytes``) are the store's own (it has the policy from its opening) and need no task:
:meth:`RetentionTask.start` starts one only for ``max_age_s`` or ``max_total_bytes``.

Concurrency contract: :meth:`start` and :meth:`close` (or ``async with``) are called from the event loop
thread, once each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, final

from hubbub.log.base import LogStore, RetentionPolicy

from .supervisor import Backoff, Supervision, Supervisor

__all__ = ["RetentionTask"]

log = logging.getLogger("hubbub.node")


@final
class RetentionTask:
    """See the module docstring. ``control(fn)`` runs ``fn(store)`` on the log writer (``WriteBatcher``)."""

    def __init__(
        self,
        control: Callable[[Callable[[LogStore], Any]], Awaitable[Any]],
        policy: RetentionPolicy,
        interval_s: float,
        supervision: Supervision | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self._control = control
        self.policy = policy
        self.interval_s = interval_s
        self._tasks = Supervisor("retention", supervision, backoff)

    async def __aenter__(self) -> RetentionTask:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        self._tasks.open()
        if self.policy.max_age_s or self.policy.max_total_bytes:
            self._tasks.run("retention", self._run)

    async def close(self) -> None:
        await self._tasks.aclose()

    async def _run(self) -> None:
        pol = self.policy
        while True:
            await asyncio.sleep(self.interval_s)
            n = await self._control(lambda st: st.apply_retention(pol, time.time_ns()))
            if n:
                log.info("retention trimmed %d events", n)
