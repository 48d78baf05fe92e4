"""The write batcher: publishes of one loop tick go to the log writer together, and come back acknowledged.

A publish is authorized and rate-checked here (through :class:`~hubbub.core.access.Access`, the one
enforcement point), queued with the others of the same loop tick, and handed to the
:class:`~hubbub.core.writer.LogWriter` in one submission (group commit). When the commit returns, the
publishers' ``done`` callbacks run, in submission order, and only then is the committed batch handed on for
fan-out (``on_committed``): a publisher that also subscribes sees its reply before its own copy.

Each link of that chain is isolated from the others: a ``done`` callback that raises closes its publisher's
connection (:class:`~hubbub.core.faults.Faults`) and the other publishers still get their answers; a
``commit_hook`` or fan-out that raises is logged with the batch's context and the rest of the chain runs
(the fan-out isolates each connection itself, ``core/fanout.py``). Nothing that one connection's code does
can cost another its acknowledgement, the durable consumers their journal, or the relay its events.

Each publish is owed to its connection (``Session.owed``) from submission to completion: transports stop
reading a connection whose queued frames and owed replies reach its queue's bound (``Session.has_room``,
``Session.wait_room``), which is how every dialect slows a pipelining publisher instead of closing it.

Concurrency contract: every method is called from the event loop thread; the writer completes commits on the
loop (``call_soon_threadsafe``), or right inside :meth:`WriteBatcher.flush` for an engine that appends inline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar, final

from hubbub.auth import Identity
from hubbub.errors import HubbubError, RateLimited, ShuttingDown
from hubbub.events import Event
from hubbub.log.appended import Committed, RunAppended
from hubbub.log.base import AppendRequest, AppendResult, AppendRun, LogStore

from . import flushes
from .access import Access
from .faults import Faults
from .flag import Flag
from .session import Session
from .stats import Histogram
from .writer import LogWriter

__all__ = [
    "ACK_BUCKETS",
    "Done",
    "DoneMany",
    "Pending",
    "Publish",
    "Submit",
    "SubmitMany",
    "SubmitRun",
    "WriteBatcher",
    "run_length",
]

log = logging.getLogger("hubbub.node")

T = TypeVar("T")

Done = Callable[["AppendResult | HubbubError"], None]
#: Completes a run of one connection's committed publishes, in order (:meth:`WriteBatcher.submit_many`).
DoneMany = Callable[["Sequence[AppendResult]"], None]


class Submit(Protocol):
    """:meth:`WriteBatcher.submit`'s signature (the core API's ``submit``)."""

    def __call__(
        self,
        request: AppendRequest,
        origin: Session | None = None,
        done: Done | None = None,
        identity: Identity | None = None,
    ) -> None: ...


class SubmitMany(Protocol):
    """:meth:`WriteBatcher.submit_many`'s signature (the core API's ``submit_many``)."""

    def __call__(
        self, requests: list[AppendRequest], origin: Session, done: Done, done_many: DoneMany | None = None
    ) -> None: ...


class SubmitRun(Protocol):
    """:meth:`WriteBatcher.submit_run`'s signature (the core API's ``submit_run``)."""

    def __call__(self, run: AppendRun, origin: Session, done: Done, done_many: DoneMany) -> None: ...


class Publish(Protocol):
    """:meth:`WriteBatcher.publish`'s signature (the core API's ``publish``)."""

    def __call__(
        self, request: AppendRequest, origin: Session | None = None, identity: Identity | None = None
    ) -> Awaitable[AppendResult]: ...


ACK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@final
class _Completion:
    """The completion of one :meth:`WriteBatcher.submit_many` call with ``done_many``: its ``count``
    publishes are consecutive in a commit batch (the writer never splits a submission), so a commit completes
    them with one ``many`` call; a failed commit calls ``one`` per publish, as for any other submission.
    ``run``: they are one :meth:`WriteBatcher.submit_run` (see :func:`run_length`)."""

    __slots__ = ("count", "many", "one", "run")

    def __init__(self, one: Done, many: DoneMany, count: int, run: bool = False) -> None:
        self.one = one
        self.many = many
        self.count = count
        self.run = run

    def __call__(self, r: AppendResult | HubbubError) -> None:
        self.one(r)


#: A submitted publish waiting for its commit: (origin session, done callback, submit tick's perf_counter).
Pending = tuple[Session | None, Done | _Completion | None, float]


def run_length(item: Pending) -> int:
    """How many publishes of a committed batch, from ``item`` on, are one :meth:`WriteBatcher.submit_run`
    (0 when ``item`` does not start one). Their results are then new events of one channel with consecutive
    seqs of one epoch, one publisher, content type and origin, and no headers or tags: one
    :class:`~hubbub.log.base.EventRun`, which the fan-out takes as it is."""
    done = item[1]
    return done.count if type(done) is _Completion and done.run else 0


@final
class WriteBatcher:
    """See the module docstring. ``on_committed(items, results)`` gets each committed batch after its acks."""

    def __init__(
        self,
        store: LogStore,
        access: Access,
        on_committed: Callable[[list[Pending], list[Committed]], None],
        *,
        max_pending: int,
        commit_batch: int,
        faults: Faults,
    ) -> None:
        self.store = store
        #: Where a publisher whose ``done`` callback raised is closed and counted.
        self.faults = faults
        self.access = access
        self.max_pending = max_pending
        self.commit_batch = commit_batch
        #: Called with each committed batch after its acks (the node swaps it for a cluster relay).
        self.on_committed = on_committed
        #: Runs on the loop with the results of every successful commit, after the publishers' acks and
        #: before live fan-out: the durable-consumer service (core/consumers.py) takes its journal items here.
        self.commit_hook: Callable[[list[Committed]], None] | None = None
        #: Set once the node closes: every submission then raises :class:`ShuttingDown`.
        self.closing = False
        self.writer: LogWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = 0
        #: Set while a publish may be submitted without waiting (:meth:`writable`); read-only outside.
        self.room = Flag()
        self.room.set()
        # Publishes of the current loop tick, handed to the writer together (see flush).
        # ``_batch_items`` has one item per event, ``_batch_reqs`` one entry per request or run (runs only for
        # a store that ``takes_runs``).
        self._batch_items: list[Pending] = []
        self._batch_reqs: list[AppendRequest | AppendRun] = []
        self._runs = store.takes_runs
        self._batch_t0 = 0.0
        self._inline = store.inline_append
        self._inline_max = store.inline_append_max
        self._inline_max_bytes = store.inline_append_max_bytes
        self.ack_latency = Histogram(ACK_BUCKETS)

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self, on_crash: Callable[[BaseException], None] | None = None) -> None:
        """Start the writer thread (on the running loop); ``on_crash(exc)`` runs on the loop if it dies."""
        self._loop = asyncio.get_running_loop()
        self.writer = LogWriter(self.store, self._loop, self._on_committed, self.commit_batch, on_crash)
        self.writer.start()

    async def stop(self) -> None:
        """Commit everything queued and stop the writer thread (``closing`` is set by then)."""
        self.closing = True
        if self.writer is not None:
            self.flush()
            await asyncio.get_running_loop().run_in_executor(None, self.writer.stop)
            # Let the final completions (acks) scheduled by the writer run before we return.
            await asyncio.sleep(0)

    def control(self, fn: Callable[[LogStore], T]) -> Awaitable[T]:
        """Run ``fn(store)`` on the writer thread, in order with the appends (trim, reset, retention)."""
        if self.writer is None:
            raise ShuttingDown()
        return self.writer.submit_control(fn)

    # -- publish ----------------------------------------------------------------------------------------

    def submit(
        self,
        request: AppendRequest,
        origin: Session | None = None,
        done: Done | None = None,
        identity: Identity | None = None,
    ) -> None:
        """Queue a publish. ``done`` is called on the loop with the result once committed (or failed).

        The publisher is ``identity`` when given (an HTTP request), else ``origin``'s identity.
        Raises :class:`ShuttingDown` while the node closes, ``AuthError`` (4102) when publishing is not
        allowed, and :class:`RateLimited` (4008) when the connection is over its publish rate.
        Callers that publish in a loop should ``await writable()`` to respect back-pressure.

        ``done`` callbacks run in submission order (the writer commits in order, and a failed commit fails
        its whole batch in order), so a connection may keep its own FIFO of request ids instead of a
        closure per publish.
        """
        if self.closing or self.writer is None:
            raise ShuttingDown()
        if origin is not None:
            if identity is None:  # an HTTP publish naming a connection (ivy sid) keeps its own identity
                identity = origin.identity
            bucket = origin.bucket
            if bucket is not None and not bucket.take(1):
                self._rate_limited(origin)
        if self.access.authorizer.enabled:
            self.access.check_publish(identity, request.channel, request.publisher.dialect)
        if origin is not None:
            origin.owed += 1  # its reply is owed until the completion (Session.owed, back-pressure)
        self._pending += 1
        if self._pending >= self.max_pending:
            self.room.clear()
        if not self._batch_reqs:
            self._batch_t0 = time.perf_counter()
            assert self._loop is not None
            self._loop.call_soon(self.flush)
        self._batch_items.append((origin, done, self._batch_t0))
        self._batch_reqs.append(request)

    def submit_many(
        self,
        requests: list[AppendRequest],
        origin: Session,
        done: Done,
        done_many: DoneMany | None = None,
    ) -> None:
        """Queue several publishes of one connection at once, as :meth:`submit` would one by one.

        Every request is authorized before any is queued: on :class:`ShuttingDown` or ``AuthError`` nothing
        was queued (the caller then submits them one by one to answer each). ``done`` runs once per request,
        in order; with ``done_many``, a commit instead completes all of them with one ``done_many(results)``
        call (the results in request order), at the point where ``done`` would have run for the first, and
        ``done`` runs only for a failed commit, once per request. The batch form saves the per-publish call
        and checks of a read full of publishes.
        """
        if self.closing or self.writer is None:
            raise ShuttingDown()
        if self.access.authorizer.enabled:
            identity = origin.identity
            check = self.access.check_publish
            checked = None
            for req in requests:
                # A read usually publishes to one channel: the permission depends only on (identity, channel).
                if req.channel != checked:
                    check(identity, req.channel, origin.dialect)
                    checked = req.channel
        bucket = origin.bucket
        if bucket is not None and not bucket.take(len(requests)):
            # All or nothing: the caller submits them one by one, and each beyond the bucket is refused.
            self._rate_limited(origin)
        origin.owed += len(requests)
        self._pending += len(requests)
        if self._pending >= self.max_pending:
            self.room.clear()
        if not self._batch_reqs:
            self._batch_t0 = time.perf_counter()
            assert self._loop is not None
            self._loop.call_soon(self.flush)
        # One item tuple serves the whole batch: they share origin, callback and submit time.
        cb: Done | _Completion = done if done_many is None else _Completion(done, done_many, len(requests))
        self._batch_items += [(origin, cb, self._batch_t0)] * len(requests)
        self._batch_reqs += requests

    def submit_run(self, run: AppendRun, origin: Session, done: Done, done_many: DoneMany) -> None:
        """Queue a run of one connection's publishes to one channel (``run.payloads``, never empty), as
        :meth:`submit_many` would their requests with ``done_many``: one permission check, one bucket take,
        and, for a store that ``takes_runs``, one entry in the commit instead of a request per event.
        Raises as :meth:`submit_many` before anything is queued."""
        if self.closing or self.writer is None:
            raise ShuttingDown()
        if self.access.authorizer.enabled:
            self.access.check_publish(origin.identity, run.channel, origin.dialect)
        n = len(run.payloads)
        bucket = origin.bucket
        if bucket is not None and not bucket.take(n):
            self._rate_limited(origin)
        origin.owed += n
        self._pending += n
        if self._pending >= self.max_pending:
            self.room.clear()
        if not self._batch_reqs:
            self._batch_t0 = time.perf_counter()
            assert self._loop is not None
            self._loop.call_soon(self.flush)
        self._batch_items += [(origin, _Completion(done, done_many, n, True), self._batch_t0)] * n
        if self._runs:
            self._batch_reqs.append(run)
        else:
            self._batch_reqs += run.requests()

    def _rate_limited(self, origin: Session) -> None:
        self.access.limiter.refused("publish_rate", origin.dialect)
        raise RateLimited("publish rate exceeded")

    def flush(self) -> None:
        """Commit this loop tick's publishes in one go.

        An engine with ``inline_append`` (memory) is appended to right here, on the loop, when the writer
        thread is idle (nothing of it can be overtaken): the acks and the fan-out then happen in this same
        callback, without the two thread hand-offs, whose GIL waits dominated both the cost and the latency
        of such a commit. So is a tick's batch of at most ``inline_append_max`` events (SQLite without
        fsync): a publisher whose frames arrive a few at a time otherwise got a commit, two hand-offs and a
        reply write per read, about a quarter of a millisecond of server CPU each (bench/consumer_wire.py:
        1,500-3,300 commits per 60,000 events, 24-33 µs of CPU per event; inline, 260-350 commits, since
        what arrives while a commit runs on the loop goes into the next one), unless their payloads add up to
        more than ``inline_append_max_bytes`` (a few large events would hold the loop for their commit).
        Anything else goes to the writer thread.
        """
        items, reqs = self._batch_items, self._batch_reqs
        writer = self.writer
        if reqs and writer is not None:
            self._batch_items, self._batch_reqs = [], []
            if writer.idle and (self._inline or (len(items) <= self._inline_max and self._small(reqs))):
                self._on_committed(items, writer.append_inline(reqs, len(items)))
            else:
                writer.submit(items, reqs)

    def _small(self, reqs: list[AppendRequest | AppendRun]) -> bool:
        """Whether the payloads of ``reqs`` (at most ``inline_append_max`` events) are within
        ``inline_append_max_bytes``."""
        left = self._inline_max_bytes
        for r in reqs:
            left -= sum(map(len, r.payloads)) if isinstance(r, AppendRun) else len(r.payload)
            if left < 0:
                return False
        return True

    async def publish(
        self, request: AppendRequest, origin: Session | None = None, identity: Identity | None = None
    ) -> AppendResult:
        """Publish and wait for the acknowledgement (``identity`` as for :meth:`submit`)."""
        await self.writable()
        fut: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()

        def done(r: AppendResult | HubbubError) -> None:
            if fut.done():
                return
            if isinstance(r, HubbubError):
                fut.set_exception(r)
            else:
                fut.set_result(r)

        self.submit(request, origin, done, identity)
        return await fut

    @property
    def has_room(self) -> bool:
        """Whether a publish may be submitted without waiting (see :meth:`writable`)."""
        return self.room.value

    async def writable(self) -> None:
        """Wait until the writer has room (back-pressure for publishers)."""
        if not self.room.value:
            await self.room.wait()

    @property
    def pending(self) -> int:
        """Publishes submitted and not committed yet."""
        return self._pending

    def _on_committed(self, items: list[Pending], result: list[Committed] | HubbubError) -> None:
        """A commit's results, on the loop (inline from :meth:`flush`, or handed back by the writer thread):
        acks and fan-out, their writes held to the end (:mod:`~hubbub.core.flushes`), when each connection's
        frames go out in one write."""
        started = flushes.hold()
        try:
            self._pending -= len(items)
            if self._pending < self.max_pending // 2 and not self.room.value:
                self.room.set()
            if isinstance(result, HubbubError):
                _fail_all(items, result, self._done_failed)
                return
            if len(items) != len(result):
                raise RuntimeError("the log store returned a result count that differs from the batch's")
            _complete(items, result, self.ack_latency.observe, self._done_failed)
            hook = self.commit_hook
            if hook is not None:
                try:
                    hook(result)
                except Exception:
                    log.exception("the durable consumers' commit hook failed", extra=_batch_context(result))
            try:
                self.on_committed(items, result)
            except Exception:
                log.exception("fan-out of a committed batch failed", extra=_batch_context(result))
        finally:
            if started:
                flushes.release()

    def _done_failed(self, origin: Session | None, r: Committed | None, exc: Exception, k: int) -> None:
        """A publisher's ``done`` callback raised for ``k`` of its publishes: its connection is closed (its
        replies would be out of step) and they are settled, or, for a publish of no connection, the failure
        is logged."""
        ev = _first_event(r) if r is not None else None
        channel, seq = (ev.channel, ev.seq) if ev is not None else ("", 0)
        if origin is not None:
            self.faults.close(origin, channel, seq, exc, stage="publish completion")
            origin.settled(k)
        else:
            log.error(
                "publish completion failed",
                extra={"channel": channel, "seq": seq, "error": type(exc).__name__},
            )

    def statistics(self) -> dict[str, Any]:
        return {"pending": self._pending, "writer": self.writer.statistics() if self.writer else {}}


#: :meth:`WriteBatcher._done_failed`: a publisher's ``done`` raised for ``k`` of its publishes.
_Failed = Callable[[Session | None, "Committed | None", Exception, int], None]


def _fail_all(items: list[Pending], err: HubbubError, failed: _Failed) -> None:
    """A failed commit: ``err`` to each publish's ``done``, in submission order, each settled; a ``done``
    that raises goes to ``failed`` and the rest still run."""
    todo = iter(items)
    while True:
        try:
            for item in todo:
                done = item[1]
                if done is not None:
                    done(err)
                if item[0] is not None:
                    item[0].settled(1)
            return
        except Exception as exc:  # one publisher's failure: see the module docstring
            failed(item[0], None, exc, 1)


def _complete(
    items: list[Pending], result: list[Committed], observe: Callable[[float, int], None], failed: _Failed
) -> None:
    """A committed batch's completions, in submission order: each publish's ``done`` (a ``_Completion`` once
    for its publishes), each settled, and the ack latency observed per submit tick; a ``done`` that raises
    goes to ``failed`` and the rest still run."""
    now = time.perf_counter()
    # Items of one submit tick share their t0: one histogram update per tick, not per event.
    t_run, n_run = items[0][2], 0
    i, end = 0, len(items)
    while True:
        try:
            while i < end:
                origin, done, t0 = items[i]
                if t0 != t_run:
                    observe(now - t_run, n_run)
                    t_run, n_run = t0, 0
                # ``i`` moves past the publishes before their callback runs: one that raises is passed
                # over when the loop resumes.
                if type(done) is _Completion:
                    k = done.count
                    n_run += k
                    i += k
                    # A run answered as one (``hubbub.log.appended``) is the sequence of its results.
                    first = result[i - k]
                    done.many(first if type(first) is RunAppended else _results(result[i - k : i]))
                    if origin is not None:  # always, for submit_many
                        origin.settled(k)
                    continue
                n_run += 1
                i += 1
                if done is not None:
                    done(result[i - 1])  # type: ignore[arg-type]  # (only a _Completion has runs)
                if origin is not None:
                    origin.settled(1)
            break
        except Exception as exc:  # one publisher's failure: see the module docstring
            failed(origin, result[i - 1], exc, done.count if type(done) is _Completion else 1)
    observe(now - t_run, n_run)


def _batch_context(result: list[Committed]) -> dict[str, Any]:
    """A committed batch's context for a log line: its size and first event's place (never a payload)."""
    first = _first_event(result[0]) if result else None
    return {
        "events": len(result),
        "channel": first.channel if first is not None else "",
        "seq": first.seq if first is not None else 0,
    }


def _first_event(r: Committed) -> Event:
    """The event of a result, or the first of a run's (a log line's context)."""
    return r.run.proto if isinstance(r, RunAppended) else r.event


def _results(results: list[Committed]) -> list[AppendResult]:
    """Results of a submission that is no run answered as one: each an ``AppendResult``."""
    return results  # type: ignore[return-value]
