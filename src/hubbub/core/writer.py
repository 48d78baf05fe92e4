"""The log writer: one dedicated thread that owns every write to the store, with group commit.

Publishers on the event loop call :meth:`LogWriter.submit`; the thread takes everything waiting (up to
``max_batch``) and appends it in one transaction, then hands the results back to the loop with one
``call_soon_threadsafe``. Acknowledgements and fan-out therefore happen only after the commit returned.

An engine whose append is cheap and never waits on I/O (``LogStore.inline_append``, the memory store), or
an append of at most ``LogStore.inline_append_max`` events and ``inline_append_max_bytes`` of payload
(SQLite without fsync), may instead be appended to on the loop itself through
:meth:`LogWriter.append_inline`, but only while the writer is :attr:`~LogWriter.idle`: nothing queued or
running on the thread and every completion delivered. Writer methods then still never run concurrently, and
run in the order they were asked for.

Concurrency contract: ``submit``/``submit_control``/``append_inline``/``idle`` are called from the event loop
thread; the completion callback runs on the event loop thread; the store's write methods run on the writer
thread only, except ``append`` through ``append_inline`` as above.

GIL hand-offs: an append releases the GIL for every SQL statement it runs (a dozen or so per group commit)
and must take it back each time from the event loop thread, which under load is busy in Python and lets go
of it only at I/O or when asked to after the interpreter's switch interval (5 ms by default). The writer
waited for the GIL about four times as long as it ran (core_path, SQLite, commit, ack: 16-20 µs of wall
time per event appended for 3.5 µs of CPU), and commits, not CPU, set the pace. While a writer thread runs
for a store that is not appended inline, the switch interval is therefore :data:`SWITCH_INTERVAL_S`
(process-wide: restored when the last such writer stops); measured the same way: 9-10 µs of wall time per
event, 25-50 % more events/s, no more CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from hubbub.errors import HubbubError, StorageError
from hubbub.log.appended import Committed, answers_runs
from hubbub.log.base import AppendRequest, AppendRun, LogStore

__all__ = ["SWITCH_INTERVAL_S", "LogWriter"]

log = logging.getLogger("hubbub.writer")

_STOP = object()

#: The interpreter's switch interval (seconds) while a writer thread runs (see the module docstring).
SWITCH_INTERVAL_S: Final = 0.0005

# Writers that lowered the switch interval and the interval they found before the first of them.
_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


def _lower_switch_interval() -> None:
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            if _switch_saved > SWITCH_INTERVAL_S:
                sys.setswitchinterval(SWITCH_INTERVAL_S)
        _switch_users += 1


def _restore_switch_interval() -> None:
    global _switch_users
    with _switch_lock:
        _switch_users -= 1
        # Restore only what this module set: someone may have changed it since.
        if _switch_users == 0 and sys.getswitchinterval() == SWITCH_INTERVAL_S:
            sys.setswitchinterval(_switch_saved)


class LogWriter:
    """Group-commit writer thread for one :class:`LogStore`."""

    def __init__(
        self,
        store: LogStore,
        loop: asyncio.AbstractEventLoop,
        on_committed: Callable[[list[Any], list[Committed] | HubbubError], None],
        max_batch: int = 4096,
        on_crash: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._store = store
        #: A store that answers runs as runs (``hubbub.log.appended``) is asked to: the batcher takes them.
        self._runs = answers_runs(store)
        self._loop = loop
        self._on_committed = on_committed
        #: Called on the loop if the thread dies of a failure outside any one append or control (a bug):
        #: nothing more can be committed, so the node is stopped (``core/supervisor.py``, ``Policy.STOP``).
        self._on_crash = on_crash
        self._max_batch = max_batch
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="hubbub-log-writer", daemon=True)
        #: Submissions (append lists and control functions) whose completion has not run on the loop yet.
        #: Only the loop thread touches it: incremented on submit, decremented as the completion runs.
        self._outstanding = 0
        self.batches = 0
        self.events = 0
        self.inline_batches = 0
        self.inline_controls = 0
        #: ``time.monotonic()`` of the last append that committed and of the last that failed for the store's
        #: sake (``StorageError``), 0.0 before the first: the node's health check reads them (core/health.py).
        self.last_commit = 0.0
        self.last_failure = 0.0
        self._switching = False

    def start(self) -> None:
        if not self._store.inline_append:
            _lower_switch_interval()
            self._switching = True
        self._thread.start()

    def submit(self, items: list[Any], requests: list[AppendRequest | AppendRun]) -> None:
        """Queue appends (one loop tick's worth): ``requests`` may hold runs (for a store that
        ``takes_runs``), ``items`` has one item per event. Each item is returned with its result to
        ``on_committed``.

        Handing over whole lists, not single events, keeps the cross-thread traffic (and the GIL hand-offs
        it causes) to one per event-loop tick however many events the tick published.
        """
        self._outstanding += 1
        self._inbox.put((items, requests))

    @property
    def idle(self) -> bool:
        """Whether the thread has nothing queued or running and every completion has run on the loop, so an
        append made now on the loop comes after all earlier writes and their completions (loop thread)."""
        return self._outstanding == 0

    def append_inline(
        self, requests: list[AppendRequest | AppendRun], events: int
    ) -> list[Committed] | HubbubError:
        """Append on the calling (loop) thread and return the results, or the error that fails them all.

        Only for engines with ``inline_append`` (or batches within ``inline_append_max``) and only while
        :attr:`idle`: the caller checks both. It saves
        the two thread hand-offs of a commit, which cost more than such an engine's whole append.
        """
        result = self._append(requests, events)
        if not isinstance(result, HubbubError):
            self.inline_batches += 1
        return result

    def control_inline(self, fn: Callable[[LogStore], Any]) -> Any:
        """Run ``fn(store)`` on the calling (loop) thread and return its result. Only while :attr:`idle`,
        and only for a method the store allows there (``inline_settle``): the caller checks both."""
        self.inline_controls += 1
        return fn(self._store)

    def submit_control(self, fn: Callable[[LogStore], Any]) -> asyncio.Future[Any]:
        """Run ``fn(store)`` on the writer thread, in order with appends; the future gets its result."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._outstanding += 1
        self._inbox.put((fut, fn))
        return fut

    def stop(self) -> None:
        """Drain everything queued, then stop the thread (blocking: call it off-loop or at shutdown)."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join()
        if self._switching:
            self._switching = False
            _restore_switch_interval()

    def _run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            # What was waiting fails at once; what was in hand when it died stays unanswered until the
            # node's shutdown closes its connections.
            err = StorageError("storage failure")
            while True:
                try:
                    left = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if left is _STOP:
                    continue
                first, second = left
                if isinstance(second, list):
                    with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
                        self._loop.call_soon_threadsafe(self._committed, 1, first, err)
                else:
                    self._resolve(first, None, err)
            if self._on_crash is None:
                raise
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._on_crash, exc)

    def _serve(self) -> None:
        inbox = self._inbox
        stop = False
        while not stop:
            first = inbox.get()
            if first is _STOP:
                break
            pending = [first]
            # Events (an append's items), not requests: a run is one request of many events.
            size = len(first[0]) if isinstance(first[1], list) else 1
            while size < self._max_batch:
                try:
                    nxt = inbox.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                pending.append(nxt)
                size += len(nxt[0]) if isinstance(nxt[1], list) else 1
            self._process(pending)

    def _process(self, pending: list[Any]) -> None:
        items: list[Any] = []
        requests: list[AppendRequest | AppendRun] = []
        merged = 0  # submissions whose appends are merged into ``requests``
        for first, second in pending:
            if isinstance(second, list):
                items.extend(first)
                requests.extend(second)
                merged += 1
                continue
            # A control function: flush the appends before it so ordering is preserved.
            self._flush(merged, items, requests)
            items, requests, merged = [], [], 0
            self._control(first, second)
        self._flush(merged, items, requests)

    def _flush(self, merged: int, items: list[Any], requests: list[AppendRequest | AppendRun]) -> None:
        if not merged:
            return
        # An empty submission still completes (and counts down ``_outstanding``); it appends nothing.
        result = self._append(requests, len(items)) if requests else []
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
            self._loop.call_soon_threadsafe(self._committed, merged, items, result)

    def _append(
        self, requests: list[AppendRequest | AppendRun], events: int
    ) -> list[Committed] | HubbubError:
        """One ``store.append`` of ``events`` events; any failure becomes the error every request of the
        batch gets."""
        try:
            # Runs only reach a store that ``takes_runs`` (``WriteBatcher.submit_run``), whose ``append``
            # declares them: a RunAppender (no typing.cast, a call on the per-commit path).
            store: Any = self._store
            result: list[Committed] = store.append_runs(requests) if self._runs else store.append(requests)
        except HubbubError as exc:
            log.error("log append failed: %s", exc)
            if isinstance(exc, StorageError):
                self.last_failure = time.monotonic()
            return exc
        except Exception:
            log.exception("log append failed")
            self.last_failure = time.monotonic()
            return StorageError("storage failure")
        self.last_commit = time.monotonic()
        self.batches += 1
        self.events += events
        return result

    def _committed(self, merged: int, items: list[Any], result: list[Committed] | HubbubError) -> None:
        # On the loop: the submissions count as completed before the callback runs, so that it (and what it
        # wakes) already sees the writer idle when nothing else is queued.
        self._outstanding -= merged
        if items:
            self._on_committed(items, result)

    def _control(self, fut: asyncio.Future[Any], fn: Callable[[LogStore], Any]) -> None:
        try:
            value = fn(self._store)
        except Exception as exc:
            if not isinstance(exc, HubbubError):
                log.exception("log control operation failed")
                exc = StorageError("storage failure")
            err = exc
            self._resolve(fut, None, err)
            return
        self._resolve(fut, value, None)

    def _resolve(self, fut: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
        def done() -> None:
            self._outstanding -= 1
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)

        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(done)

    def statistics(self) -> dict[str, int]:
        return {
            "batches": self.batches,
            "inline_batches": self.inline_batches,
            "inline_controls": self.inline_controls,
            "events": self.events,
            "queued": self._inbox.qsize(),
        }
