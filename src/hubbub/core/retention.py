"""Time- and size-based retention of the whole log, applied every ``retention_interval_s`` (docs/operations.md
"Retention").

:class:`RetentionTask` owns one task: every interval it hands ``LogStore.apply_retention`` to the log writer
(``control``), in order with the appends, and logs what was trimmed. A failure is logged and tried again at
the next interval. The per-channel limits (``max_events``, ``max_bytes``) are the store's own (it has the
policy from its opening) and need no task: :meth:`RetentionTask.start` starts one only for ``max_age_s`` or
``max_total_bytes``.

Concurrency contract: :meth:`start` and :meth:`close` are called from the event loop thread, once each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, final

from hubbub.errors import HubbubError
from hubbub.log.base import LogStore, RetentionPolicy

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
    ) -> None:
        self._control = control
        self.policy = policy
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.policy.max_age_s or self.policy.max_total_bytes:
            self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # its failures were logged
                await task

    async def _run(self) -> None:
        pol = self.policy
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                n = await self._control(lambda st: st.apply_retention(pol, time.time_ns()))
                if n:
                    log.info("retention trimmed %d events", n)
            except HubbubError as exc:
                log.warning("retention failed: %s", exc)
