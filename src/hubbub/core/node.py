"""The core node: publish (authorize, persist, fan out) and subscribe (live, replay, recover).

Concurrency contract: every public method is called from the event loop thread. Store writes run on the
:class:`~hubbub.core.writer.LogWriter` thread; store reads run on a small reader thread pool. The node never
knows a wire format: sessions carry an :class:`~hubbub.core.session.Encoder` supplied by the transport.

Ordering guarantees:

* A publish is acknowledged (its ``done`` callback runs) only after the commit returned, and before the
  event is fanned out, so a publisher that also subscribes sees its reply before its own copy.
* Fan-out follows commit order. Each session gets a live event at most once, with the ids of every
  subscription of that session that matches it.
* A subscription with a replay is registered *holding*: live events that match it are held while the snapshot
  and replay are read, then the ones newer than the snapshot are released right after the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, final

from hubbub.auth import Authenticator, Authorizer, Identity
from hubbub.channels import Pattern
from hubbub.errors import (
    EpochMismatch,
    HubbubError,
    LimitExceeded,
    RateLimited,
    ShuttingDown,
    SubscriptionError,
)
from hubbub.events import Event, Position
from hubbub.log.base import (
    AppendRequest,
    AppendResult,
    ChannelInfo,
    EventRun,
    LogStore,
    RetentionPolicy,
)
from hubbub.router import Router

from .access import Access, only_visible
from .fanout import FanOut
from .filters import FILTER_PREFIX, delivery_filters, passes, withheld
from .limits import Limiter, LimitSettings
from .replay import Gap, ReplayPlan, ReplaySpan, ReplaySpec, plan_replay
from .session import FrameRun, Session
from .stats import Histogram
from .writer import LogWriter

__all__ = ["EpochMismatch", "Histogram", "Node", "NodeSettings", "Subscription", "Trimmed"]

log = logging.getLogger("hubbub.node")

T = TypeVar("T")

Done = Callable[["AppendResult | HubbubError"], None]
#: Completes a run of one connection's committed publishes, in order (:meth:`Node.submit_many`).
DoneMany = Callable[["list[AppendResult]"], None]

ACK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class NodeSettings:
    max_subscriptions: int = 1024
    max_recovery: int = 10000
    max_pending: int = 65536
    commit_batch: int = 4096
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    retention_interval_s: float = 30.0
    reader_threads: int = 4


@dataclass(frozen=True, slots=True)
class Trimmed:
    """What :meth:`Node.trim` did: ``info`` is the trimmed epoch's position afterwards (its ``epoch`` the one
    named; ``first`` is ``top + 1`` once it holds no events), ``current`` whether that epoch is the channel's
    current one. A retired epoch left without events is gone from the store (docs/log.md "Epochs")."""

    info: ChannelInfo
    current: bool


@dataclass(eq=False, slots=True)
class Subscription:
    """One subscription of one session. Identity-hashed: the router uses it as its key."""

    session: Session
    sub_id: str
    pattern: Pattern
    tags: frozenset[str]
    holding: list[Event] | None = None
    #: The channels of the pattern the session's identity may read, when not all (``Access.visibility``).
    visible: Callable[[str], bool] | None = None

    def matches(self, event: Event) -> bool:
        return (
            self.pattern.matches(event.channel)
            and self.tags.issubset(event.tags)
            and (self.visible is None or self.visible(event.channel))
        )


#: Events per page of an exact channel's replay (Node._replay_span): large enough that the per-page costs
#: (statements, a reader-thread hand-off, one queue step) vanish per event, small enough to hold two pages.
REPLAY_PAGE = 2048


@final
class _Completion:
    """The completion of one :meth:`Node.submit_many` call with ``done_many``: its ``count`` publishes are
    consecutive in a commit batch (the writer never splits a submission), so a commit completes them with one
    ``many`` call; a failed commit calls ``one`` per publish, as for any other submission."""

    __slots__ = ("count", "many", "one")

    def __init__(self, one: Done, many: DoneMany, count: int) -> None:
        self.one = one
        self.many = many
        self.count = count

    def __call__(self, r: AppendResult | HubbubError) -> None:
        self.one(r)


#: A submitted publish waiting for its commit: (origin session, done callback, submit tick's perf_counter).
_Pending = tuple[Session | None, Done | _Completion | None, float]


class Node:
    """See the module docstring. Use as ``async with Node(store, settings) as node``."""

    def __init__(
        self,
        store: LogStore,
        settings: NodeSettings | None = None,
        authorizer: Authorizer | None = None,
        *,
        new_epochs: bool = False,
        authenticator: Authenticator | None = None,
        limits: LimitSettings | None = None,
    ) -> None:
        self.store = store
        self.settings = settings or NodeSettings()
        #: Authentication, permission checks, token expiry and the audit log: the one enforcement point.
        # Transports call it directly for log reads (check_read), admin operations (check_admin) and
        # connection admission (limiter.admit / limiter.release).
        self.access = Access(authorizer, authenticator, Limiter(limits))
        self.authorizer: Authorizer = self.access.authorizer
        self.limiter = self.access.limiter
        self.router: Router[Subscription] = Router()
        self._new_epochs = new_epochs
        self._subs: dict[Session, dict[str, Subscription]] = {}
        #: Subscriptions whose replay is still being read: live events for them are held (see subscribe).
        self._holding: set[Subscription] = set()
        self._sessions: set[Session] = set()
        self._by_id: dict[str, Session] = {}
        self._pending = 0
        self._room = asyncio.Event()
        self._room.set()
        self._closing = False
        self._writer: LogWriter | None = None
        # Publishes of the current loop tick, handed to the writer together (see _flush).
        self._batch_items: list[_Pending] = []
        self._batch_reqs: list[AppendRequest] = []
        self._batch_t0 = 0.0
        self._inline = store.inline_append
        self._readers = ThreadPoolExecutor(
            self.settings.reader_threads, thread_name_prefix="hubbub-log-reader"
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        # statistics, per dialect
        self.published: dict[str, int] = {}
        self.deliveries: dict[str, int] = {}
        self.bad_input: dict[str, int] = {}
        self.slow_closes: dict[str, int] = {}
        self.ack_latency = Histogram(ACK_BUCKETS)
        # Live delivery: reads the router and the holding set, counts into ``deliveries``.
        self._fanout = FanOut(self.router, self._holding, self.deliveries)
        #: Runs on the loop with the results of every successful commit, after the publishers' acks and
        #: before live fan-out: the durable-consumer service (core/consumers.py) takes its journal items here.
        self.commit_hook: Callable[[list[AppendResult]], None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------------

    async def __aenter__(self) -> Node:
        self._loop = asyncio.get_running_loop()
        self._writer = LogWriter(self.store, self._loop, self._on_committed, self.settings.commit_batch)
        self._writer.start()
        if self._new_epochs:
            await self._writer.submit_control(lambda st: st.new_epochs_on_open())
        pol = self.settings.retention
        if pol.max_age_s or pol.max_total_bytes:
            self._spawn(self._retention_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop accepting publishes, commit everything queued, then release the store."""
        if self._closing:
            return
        self._closing = True
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self._writer is not None:
            self._flush()
            await asyncio.get_running_loop().run_in_executor(None, self._writer.stop)
            # Let the final completions (acks) scheduled by the writer run before we return.
            await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        # Both block (reader threads finishing, the store's final checkpoint): keep them off the loop.
        await loop.run_in_executor(None, self._readers.shutdown, True)
        await loop.run_in_executor(None, self.store.close)

    @property
    def closing(self) -> bool:
        return self._closing

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _retention_loop(self) -> None:
        assert self._writer is not None
        pol = self.settings.retention
        while True:
            await asyncio.sleep(self.settings.retention_interval_s)
            try:
                n = await self._writer.submit_control(lambda st: st.apply_retention(pol, time.time_ns()))
                if n:
                    log.info("retention trimmed %d events", n)
            except HubbubError as exc:
                log.warning("retention failed: %s", exc)

    # -- sessions ---------------------------------------------------------------------------------------

    def attach(self, session: Session) -> None:
        if session.bucket is None:
            session.bucket = self.limiter.bucket()
        self._sessions.add(session)
        self._by_id[session.id] = session
        self._subs[session] = {}
        session.on_slow = self._on_slow

    def detach(self, session: Session) -> None:
        """Forget a session and all its subscriptions. Idempotent."""
        subs = self._subs.pop(session, None)
        if subs:
            for s in subs.values():
                self.router.remove(s.pattern, s, s.tags)
                self._holding.discard(s)
            self._fanout.clear_plans()
        self._sessions.discard(session)
        self.access.unbind(session)
        if self._by_id.get(session.id) is session:
            del self._by_id[session.id]
        session.close()

    # -- authentication ---------------------------------------------------------------------------------

    def authenticate(self, token: str | None, dialect: str, peer: str = "") -> Identity:
        """The identity ``token`` gives (one HTTP request), or ``AuthError`` 4100/4101/4103 (audited).
        With ``auth.mode = off`` every token, or none, gives :data:`~hubbub.auth.ANONYMOUS`."""
        return self.access.authenticate(token, dialect, peer)

    def login(self, session: Session, token: str | None, peer: str = "") -> Identity:
        """Authenticate a connection (or refresh its token): the identity becomes the session's, its
        expiry timer is armed (4103 when it fires), and existing subscriptions follow the new permissions.
        Raises ``AuthError`` (4100, 4101, 4103) and leaves the session as it was."""
        ident = self.access.authenticate(token, session.dialect, peer)
        self.access.bind(session, ident)
        subs = self._subs.get(session)
        if subs:
            for s in subs.values():
                self.router.remove(s.pattern, s, s.tags)
                s.visible = self.access.visibility(ident, s.pattern)
                self.router.add(s.pattern, s, s.tags, s.visible)
            self._fanout.clear_plans()
        return ident

    def session_by_id(self, session_id: str) -> Session | None:
        """The attached session with this id (ivy's HTTP ``sid`` names the connection to exclude)."""
        return self._by_id.get(session_id)

    @property
    def sessions(self) -> frozenset[Session]:
        return frozenset(self._sessions)

    def count_bad_input(self, dialect: str) -> None:
        self.bad_input[dialect] = self.bad_input.get(dialect, 0) + 1

    def count_slow_close(self, dialect: str) -> None:
        self.slow_closes[dialect] = self.slow_closes.get(dialect, 0) + 1

    def _on_slow(self, sess: Session) -> None:
        log.info("closing slow consumer", extra={"dialect": sess.dialect, "session": sess.id})
        self.count_slow_close(sess.dialect)

    # -- publish ----------------------------------------------------------------------------------------

    def submit(
        self,
        request: AppendRequest,
        origin: Session | None = None,
        done: Done | None = None,
        identity: Identity | None = None,
    ) -> None:
        """Queue a publish. ``done`` is called on the loop with the result once committed (or failed).

        The publisher is ``origin``'s identity, or ``identity`` for a publish without a connection (HTTP).
        Raises :class:`ShuttingDown` while the node closes, ``AuthError`` (4102) when publishing is not
        allowed, and :class:`RateLimited` (4008) when the connection is over its publish rate.
        Callers that publish in a loop should ``await node.writable()`` to respect back-pressure.

        ``done`` callbacks run in submission order (the writer commits in order, and a failed commit fails
        its whole batch in order), so a connection may keep its own FIFO of request ids instead of a
        closure per publish.
        """
        if self._closing or self._writer is None:
            raise ShuttingDown()
        if origin is not None:
            identity = origin.identity
            bucket = origin.bucket
            if bucket is not None and not bucket.take(1):
                self._rate_limited(origin)
        if self.authorizer.enabled:
            self.access.check_publish(identity, request.channel, request.publisher.dialect)
        self._pending += 1
        if self._pending >= self.settings.max_pending:
            self._room.clear()
        if not self._batch_reqs:
            self._batch_t0 = time.perf_counter()
            assert self._loop is not None
            self._loop.call_soon(self._flush)
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
        if self._closing or self._writer is None:
            raise ShuttingDown()
        if self.authorizer.enabled:
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
        self._pending += len(requests)
        if self._pending >= self.settings.max_pending:
            self._room.clear()
        if not self._batch_reqs:
            self._batch_t0 = time.perf_counter()
            assert self._loop is not None
            self._loop.call_soon(self._flush)
        # One item tuple serves the whole batch: they share origin, callback and submit time.
        cb: Done | _Completion = done if done_many is None else _Completion(done, done_many, len(requests))
        self._batch_items += [(origin, cb, self._batch_t0)] * len(requests)
        self._batch_reqs += requests

    def _rate_limited(self, origin: Session) -> None:
        self.limiter.refused("publish_rate", origin.dialect)
        raise RateLimited("publish rate exceeded")

    def _flush(self) -> None:
        """Commit this loop tick's publishes in one go.

        An engine with ``inline_append`` (memory) is appended to right here, on the loop, when the writer
        thread is idle (nothing of it can be overtaken): the acks and the fan-out then happen in this same
        callback, without the two thread hand-offs, whose GIL waits dominated both the cost and the latency
        of such a commit. Anything else goes to the writer thread.
        """
        items, reqs = self._batch_items, self._batch_reqs
        writer = self._writer
        if reqs and writer is not None:
            self._batch_items, self._batch_reqs = [], []
            if self._inline and writer.idle:
                self._on_committed(items, writer.append_inline(reqs))
            else:
                writer.submit(items, reqs)

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
        return self._room.is_set()

    async def writable(self) -> None:
        """Wait until the writer has room (back-pressure for publishers)."""
        if not self._room.is_set():
            await self._room.wait()

    def _on_committed(self, items: list[_Pending], result: list[AppendResult] | HubbubError) -> None:
        self._pending -= len(items)
        if self._pending < self.settings.max_pending // 2:
            self._room.set()
        if isinstance(result, HubbubError):
            for _origin, done, _t0 in items:
                if done is not None:
                    done(result)
            return
        now = time.perf_counter()
        obs = self.ack_latency.observe
        # Items of one submit tick share their t0: one histogram update per tick, not per event.
        if len(items) != len(result):
            raise RuntimeError("the log store returned a result count that differs from the batch's")
        t_run, n_run = items[0][2], 0
        i, end = 0, len(items)
        while i < end:
            _origin, done, t0 = items[i]
            if t0 != t_run:
                obs(now - t_run, n_run)
                t_run, n_run = t0, 0
            if type(done) is _Completion:
                k = done.count
                done.many(result[i : i + k])
                n_run += k
                i += k
                continue
            n_run += 1
            if done is not None:
                done(result[i])
            i += 1
        obs(now - t_run, n_run)
        if self.commit_hook is not None:
            self.commit_hook(result)
        published = self.published
        fan_out, fan_out_run = self._fanout.fan_out, self._fanout.fan_out_run
        match = self.router.match
        # Consecutive events with the same subscribers and origin (one publisher's burst on one channel)
        # fan out as a run: each connection then takes the run's frames in one step (see FanOut.fan_out_run).
        run: list[Event] = []
        run_subs: tuple[Subscription, ...] = ()
        run_origin: Session | None = None
        for (origin, _done, _t0), r in zip(items, result, strict=True):
            if r.duplicate:
                continue
            ev = r.event
            d = ev.publisher.dialect
            published[d] = published.get(d, 0) + 1
            subs = match(ev.channel, ev.tags)
            if not subs:
                continue
            if not self._holding and not (
                ev.headers and any(k.startswith(FILTER_PREFIX) for k in ev.headers)
            ):
                if subs is run_subs and origin is run_origin:
                    run.append(ev)
                    continue
                if run:
                    fan_out_run(run_subs, run, run_origin)
                run, run_subs, run_origin = [ev], subs, origin
                continue
            if run:
                fan_out_run(run_subs, run, run_origin)
                run, run_subs = [], ()
            fan_out(ev, origin)
        if run:
            fan_out_run(run_subs, run, run_origin)

    # -- subscribe --------------------------------------------------------------------------------------

    async def subscribe(
        self,
        session: Session,
        sub_id: str,
        pattern: Pattern,
        tags: frozenset[str] = frozenset(),
        replay: ReplaySpec | None = None,
        *,
        on_snapshot: Callable[[ReplayPlan], None],
        on_replayed: Callable[[ReplayPlan], None] | None = None,
        planner: Callable[[LogStore], ReplayPlan] | None = None,
    ) -> Subscription:
        """Create a subscription, with a replay if ``replay`` asks for one.

        ``on_snapshot(plan)`` runs on the loop once the snapshot is read: the transport queues its reply and
        any gap notices. The replayed events are then queued (pacing on the session's queue), and
        ``on_replayed(plan)`` queues the end-of-replay notice; right after it, held live events newer than the
        snapshot are released, all in one loop step. The replay, like live delivery, skips events whose
        delivery filters do not match the session (README §3); ``plan.sent`` counts what was queued. Raises
        :class:`SubscriptionError` (4200, 4203), :class:`LimitExceeded` (4007) or ``BadRequest``; then no
        subscription exists.

        ``planner``, when given, replaces the native replay planning (``replay`` is then ignored): it runs on
        a reader thread and returns the events to replay and the snapshot's ``tops``; held live events at or
        below their channel's top are not released (an empty ``tops`` releases every held event). Used for
        guble's fetch selection.
        """
        if self._closing:
            raise ShuttingDown()
        subs = self._subs.get(session)
        if subs is None:
            raise ShuttingDown("session is closed")
        if sub_id in subs:
            raise SubscriptionError("sub id in use", code=4200)
        if len(subs) >= self.settings.max_subscriptions:
            self.limiter.refused("max_subscriptions", session.dialect)
            raise LimitExceeded("too many subscriptions")
        spec = replay or ReplaySpec()
        visible = self.access.visibility(session.identity, pattern)
        sub = Subscription(session, sub_id, pattern, tags, holding=[], visible=visible)
        self._holding.add(sub)
        subs[sub_id] = sub
        self.router.add(pattern, sub, tags, visible)
        self._fanout.clear_plans()
        try:
            if planner is not None:
                plan = await self.read(planner)
            else:
                plan = await self.read(plan_replay, pattern, spec, self.settings.max_recovery)
            if visible is not None:
                only_visible(plan, pattern, visible)
            for ch in plan.ahead:
                epoch = next(g.position.epoch for g in plan.gaps if g.channel == ch)
                info = await self._new_epoch_if_lost(ch, epoch)
                if info is None:
                    continue  # the client's error: the channel keeps its epoch, the gap says so
                pos = Position(info.top, info.epoch)
                plan.tops[ch] = 0
                plan.gaps = [g if g.channel != ch else Gap(ch, g.since, pos, g.reason) for g in plan.gaps]
                if pattern.is_exact:
                    plan.position = pos
        except BaseException:
            self._drop(sub)
            raise
        if subs.get(sub_id) is not sub:  # unsubscribed or detached meanwhile
            raise SubscriptionError("subscription was cancelled", code=4201)
        on_snapshot(plan)
        cache: dict[Any, Any] = {}
        sent = 0
        for ev in plan.events:
            if session.closed or session.kicked:
                break
            if ev.headers and withheld(session, ev):
                continue  # not this connection's, as in live fan-out (README §3)
            if session.queued >= session.max_items - 1:
                await session.wait_room()
            sent += session.deliver(ev, [sub_id], cache, replay=True)
        span_last = 0
        if plan.span is not None and not (session.closed or session.kicked):
            n, span_last = await self._replay_span(session, sub_id, plan.span)
            sent += n
        plan.sent = sent
        if on_replayed is not None and plan.replayed:
            on_replayed(plan)
        self._release(sub, plan, span_last)
        return sub

    async def _replay_span(self, session: Session, sub_id: str, span: ReplaySpan) -> tuple[int, int]:
        """Queue an exact channel's replay page by page: each page is read (:meth:`LogStore.read_runs`) and,
        when the session's encoder is a :class:`~hubbub.core.session.RunEncoder`, encoded on a reader thread
        while the loop queues and writes the previous one; the queue paces the reading, so the replay holds at
        most two pages whatever its length. Runs whose delivery filters withhold them from the session are
        passed over (neither encoded nor queued). Returns (events queued, last seq replayed: queued or passed
        over).

        The reader thread also cuts each run into the chunks the queue takes (``Session.replay_chunks``); for
        a batching session they come as batch frames already (``Session.replay_run_chunks``), built without
        the single event frames, so the loop only queues them and the writer sends them as they are.

        The snapshot promised every event of the span. If a page does not continue it exactly (the events were
        trimmed or the channel reset meanwhile, which a slow replay invites), the session is closed as a slow
        consumer rather than leave a silent gap: the client resumes with ``since`` and gets an explicit gap.
        A failed read closes the session with the error's code (the subscription's reply went out already).
        """
        loop = asyncio.get_running_loop()
        read_runs = self.store.read_runs
        channel, top = span.channel, span.top
        subs = (sub_id,)
        encode_run = getattr(session.encoder, "encode_run", None)
        chunks = session.replay_chunks
        packed_chunks = session.replay_run_chunks

        def read_page(after: int) -> tuple[list[EventRun], list[list[FrameRun] | None] | None]:
            runs = read_runs(channel, after, top, REPLAY_PAGE)
            if encode_run is None:
                return runs, None
            # A run's events share their headers, so one filter check covers the run; a withheld run
            # (None) is not encoded at all.
            return runs, [
                None
                if r.proto.headers and withheld(session, r.proto)
                else packed_chunks(r, subs) or chunks(encode_run(r.proto, r.rows, subs, True))
                for r in runs
            ]

        cache: dict[Any, Any] = {}
        after = span.after
        sent = 0
        pending = loop.run_in_executor(self._readers, read_page, after)
        try:
            while after < top:
                try:
                    runs, encoded = await pending
                except HubbubError as exc:
                    log.warning("replay read failed: %s", exc, extra={"session": session.id})
                    session.kick(exc.code)
                    break
                end = runs[-1].last_seq if runs else after
                if runs and end < top:
                    pending = loop.run_in_executor(self._readers, read_page, end)
                for i, run in enumerate(runs):
                    if run.proto.seq != after + 1 or run.proto.epoch != span.epoch:
                        break
                    chunked: list[FrameRun] | None
                    if encoded is not None:
                        chunked = encoded[i]
                    elif run.proto.headers and withheld(session, run.proto):
                        chunked = None
                    else:
                        chunked = session.replay_chunks(session.encode_run(run, subs, cache))
                    if chunked is None:
                        # Withheld by its delivery filters: passed over, but the replay's position moves
                        # past it, so the continuity check and the live junction see no gap.
                        if session.closed or session.kicked or session.ending:
                            return sent, after
                        after += len(run.rows)
                        continue
                    n = await session.replay_runs(chunked)
                    sent += n
                    after += n
                    if n < len(run.rows):
                        return sent, after
                if after != end or not runs:
                    if after < top and not (session.closed or session.kicked or session.ending):
                        log.info(
                            "replay lost its snapshot (trimmed or reset meanwhile)",
                            extra={"dialect": session.dialect, "session": session.id},
                        )
                        session.kick(session.slow_close_code)
                    break
        finally:
            # A read still running is not needed any more; one that failed unawaited is not worth a log line.
            if not pending.cancel() and not pending.cancelled():
                pending.exception()
        return sent, after

    def _release(self, sub: Subscription, plan: ReplayPlan, span_last: int = 0) -> None:
        held = sub.holding or []
        sub.holding = None
        self._holding.discard(sub)
        if not held:
            return
        tops = plan.tops
        sess = sub.session
        subs = self._subs.get(sess, {})
        caches: dict[str, dict[Any, Any]] = {}
        replayed = {(e.channel, e.seq) for e in plan.events} if plan.events else set()
        span = plan.span
        for ev in held:
            if ev.headers and not passes(sess, delivery_filters(ev)):
                continue
            top = tops.get(ev.channel)
            in_snapshot = top is not None and ev.seq <= top
            if in_snapshot and (
                (ev.channel, ev.seq) in replayed
                or (span is not None and ev.channel == span.channel and span.after < ev.seq <= span_last)
            ):
                continue  # the replay sent it already: once per connection
            # An event inside the snapshot is not the new subscription's (its stream starts after the
            # snapshot), but the connection's other live subscriptions still get it.
            ids = [
                s.sub_id
                for s in subs.values()
                if s.holding is None and not (in_snapshot and s is sub) and s.matches(ev)
            ]
            if ids:
                self._fanout.deliver(sess, ev, ids, caches)

    def unsubscribe(self, session: Session, sub_id: str) -> None:
        subs = self._subs.get(session)
        sub = subs.get(sub_id) if subs else None
        if sub is None:
            raise SubscriptionError("not subscribed", code=4201)
        self._drop(sub)

    def _drop(self, sub: Subscription) -> None:
        self._holding.discard(sub)
        subs = self._subs.get(sub.session)
        if subs is not None and subs.get(sub.sub_id) is sub:
            del subs[sub.sub_id]
        self.router.remove(sub.pattern, sub, sub.tags)
        self._fanout.clear_plans()

    def subscriptions(self, session: Session) -> list[Subscription]:
        return list(self._subs.get(session, {}).values())

    # -- reads and control ------------------------------------------------------------------------------

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(store, *args)`` on a reader thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, fn, self.store, *args)

    async def write(self, fn: Callable[[LogStore], T]) -> T:
        """Run ``fn(store)`` on the writer thread, in order with appends (store writer methods)."""
        if self._writer is None:
            raise ShuttingDown()
        done: T = await self._writer.submit_control(fn)
        return done

    async def reset_channel(self, channel: str) -> Any:
        """Start a new epoch for a channel (on the writer thread, in order with appends)."""
        assert self._writer is not None
        return await self._writer.submit_control(lambda st: st.reset_channel(channel))

    async def _new_epoch_if_lost(self, channel: str, epoch: str) -> ChannelInfo | None:
        """A client saw commits beyond the top of the channel's epoch ``epoch`` (a ``since`` ahead). Where the
        store says commits of that epoch may have been lost (the previous server stopped without closing the
        log, and did not sync every commit), continuity is broken: start a new epoch (the old one's events
        stay in the store) and return its head, as native.md §6 asks. Anywhere else the claim cannot be true
        (nothing was lost: ``fsync``, a clean stop, an epoch begun since) and would only let a client cut
        every other client's recovery short, so nothing changes and this returns ``None``.

        On the writer thread: the check and the reset are one step, so of several clients claiming the same
        lost commits only the first starts a new epoch (the others find a newer one)."""
        assert self._writer is not None

        def new_epoch(st: LogStore) -> ChannelInfo | None:
            return st.reset_channel(channel) if st.commits_may_be_lost(channel, epoch) else None

        info: ChannelInfo | None = await self._writer.submit_control(new_epoch)
        return info

    async def trim(self, channel: str, epoch: str, up_to_seq: int) -> Trimmed:
        """Trim the events with ``seq <= up_to_seq`` of the channel's epoch ``epoch``: its current epoch, or a
        retired one still holding events (docs/log.md "Epochs"; the current epoch is untouched then). On the
        writer thread, in order with appends; the epoch is looked up in the same call, so a reset cannot slip
        in between (a reset just before makes the named epoch a retired one, which is trimmed all the same).
        Raises :class:`~hubbub.errors.TrimEpochGone` (an :class:`EpochMismatch`) with the current head
        (``epoch`` is neither: never used, or a retired epoch already gone with its last event) or
        :class:`~hubbub.errors.TrimOutOfRange` (``up_to_seq`` negative or beyond that epoch's top): the
        store's own typed errors (``LogStore.trim``)."""
        if self._closing or self._writer is None:
            raise ShuttingDown()

        def trim(st: LogStore) -> Trimmed:
            info = st.trim(channel, up_to_seq, epoch=epoch)
            return Trimmed(info, current=st.head(channel).epoch == epoch)

        done: Trimmed = await self._writer.submit_control(trim)
        return done

    def statistics(self) -> dict[str, Any]:
        return {
            "sessions": len(self._sessions),
            "pending": self._pending,
            "router": self.router.statistics(),
            "writer": self._writer.statistics() if self._writer else {},
        }
