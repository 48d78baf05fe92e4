"""The store's health as ``/healthz`` (and guble's health check) report it: from what the node already knows.

A health check must answer at once, from state, never by waiting on the store itself: a probe that waits for
an unreachable PostgreSQL takes as long as the store's own connection timeout (5 s), and one that waits
behind the node's busy reader threads takes as long as their queue. :class:`StoreHealth` keeps the state:

* a **background probe** (``LogStore.top_time``, one small read) every :data:`PROBE_INTERVAL_S`, on a thread
  of its own so that it never queues behind the node's reads;
* the **writer's outcomes**: every commit and every failed append (``LogWriter.last_commit``,
  ``last_failure``), so a failing store shows as soon as a publish meets it, and a store that commits is
  healthy even while the probe waits for a pooled connection under load.

The store is failing when the latest outcome of either is a failure, or when a probe has been waiting for
more than :data:`STALL_S` with nothing succeeding meanwhile (a store that hangs rather than refuses). Every
failure is reported as ``StorageError`` (docs/cluster.md "Load balancer"); the cause is logged.

The probing loop belongs to a :class:`~hubbub.core.supervisor.Supervisor` (component ``health``): should it
fail other than by the store's failure (which it records), it is logged, counted and started again.

Concurrency contract: :meth:`start`, :meth:`close` and :meth:`failure` are called from the event loop
thread; the probe runs on its own thread. :meth:`close` returns once the probe's last read has ended (the
store may be closed after it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, final

from hubbub.errors import StorageError
from hubbub.log.base import LogStore

from .supervisor import Supervision, Supervisor
from .writer import LogWriter

__all__ = ["FAILURE", "PROBE_INTERVAL_S", "STALL_S", "StoreHealth"]

log = logging.getLogger("hubbub.health")

#: Seconds between two probes of the store.
PROBE_INTERVAL_S: Final = 0.5
#: A probe waiting longer than this, with no commit succeeding meanwhile, makes the store count as failing.
STALL_S: Final = 2.0
#: The name a failing store is reported with (docs/cluster.md, docs/operations.md "Monitoring").
FAILURE: Final = StorageError.__name__


@final
class StoreHealth:
    """See the module docstring. ``writer`` returns the node's log writer (``None`` before it starts)."""

    def __init__(
        self,
        store: LogStore,
        writer: Callable[[], LogWriter | None],
        *,
        interval_s: float = PROBE_INTERVAL_S,
        stall_s: float = STALL_S,
        supervision: Supervision | None = None,
    ) -> None:
        self._store = store
        self._writer = writer
        self.interval_s = interval_s
        self.stall_s = stall_s
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="hubbub-store-probe")
        self._tasks = Supervisor("health", supervision)
        self._probe_ok = 0.0  # monotonic time of the last probe that answered
        self._probe_failed = 0.0  # and of the last that failed
        self._probing_since: float | None = None  # the probe in flight, if any
        self.probes = 0
        self.probe_failures = 0

    async def start(self) -> None:
        """Probe once (so that the first check knows), then every ``interval_s`` in the background."""
        await self._probe()
        self._tasks.open()
        self._tasks.run("store-probe", self._run)

    async def close(self) -> None:
        """Stop probing; wait for a probe in flight to end (off the loop)."""
        await self._tasks.aclose()
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown, True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._probe()

    async def _probe(self) -> None:
        self._probing_since = time.monotonic()
        self.probes += 1
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._store.top_time)
        except Exception as exc:  # any failure of the read is the store's: reported, its cause logged
            if not self._failed_now():
                log.warning("the log store does not answer: %s", exc)
            self.probe_failures += 1
            self._probe_failed = time.monotonic()
        else:
            if self._failed_now():
                log.info("the log store answers again")
            self._probe_ok = time.monotonic()
        finally:
            self._probing_since = None

    def _failed_now(self) -> bool:
        return self.failure() is not None

    def checks(self, closing: bool) -> dict[str, str]:
        """The failing checks of ``/healthz`` and guble's health check (``Node.health_checks``), from state
        kept here (never waits): ``{"node": "shutting down"}`` while the node ``closing``, ``{"store":
        "StorageError"}``, or ``{}`` when healthy."""
        if closing:
            return {"node": "shutting down"}
        failure = self.failure()
        return {"store": failure} if failure is not None else {}

    def failure(self) -> str | None:
        """``None`` while the store is healthy, else :data:`FAILURE`. Reads state only: never waits."""
        w = self._writer()
        ok = max(self._probe_ok, w.last_commit if w is not None else 0.0)
        failed = max(self._probe_failed, w.last_failure if w is not None else 0.0)
        if failed > ok:
            return FAILURE
        since = self._probing_since
        if since is not None and ok < since and time.monotonic() - since > self.stall_s:
            return FAILURE
        return None
