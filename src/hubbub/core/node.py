"""The core node: publish (authorize, persist, fan out) and subscribe (live, replay, recover).

The node is a thin facade over its parts, each in its own module:

* :class:`~hubbub.core.batcher.WriteBatcher` (``batcher.py``): publishes of a loop tick, authorized and
  rate-checked, go to the :class:`~hubbub.core.writer.LogWriter` thread together (group commit); acks.
* :class:`~hubbub.core.subscriptions.SubscriptionRegistry` (``subscriptions.py``): sessions, subscriptions in
  the router, and live fan-out of committed batches (with :class:`~hubbub.core.fanout.FanOut`).
* :class:`~hubbub.core.replay_service.ReplayService` (``replay_service.py``): snapshot, replay and the
  replay/live junction of a new subscription.
* :class:`~hubbub.core.reads.LogReads` (``reads.py``): the reader threads and the typed, bounded reads.
* :class:`~hubbub.core.access.Access` (``access.py``): authentication, permissions, limits: the one
  enforcement point.
* :class:`~hubbub.core.log_control.LogControl` (``log_control.py``): trims, new epochs and the log's state
  maps, in order with the appends; :class:`~hubbub.core.notices.Notices` (``notices.py``): short messages to
  the other processes of the log, through the relay.

The node implements the core API (:class:`~hubbub.core.api.Core`), the one thing transports see; its parts
are private. The hot publish methods (``submit``, ``submit_many``, ``submit_run``, ``publish``, ``writable``)
and the session methods are the parts' own bound methods, set on the node as attributes: the facade costs no
call per publish. Every counter is behind :attr:`Node.metrics` (:class:`~hubbub.core.stats.NodeMetrics`).

The node works on one log store (``store``), and reads snapshots and replays through ``view`` when given:
the log as this node delivered it, when that differs from the store (a cluster node's
:class:`~hubbub.cluster.view.ClusterView`, an :class:`~hubbub.log.base.EventLog`).

Concurrency contract: every public method is called from the event loop thread. Store writes run on the
:class:`~hubbub.core.writer.LogWriter` thread; store reads run on a small reader thread pool. The node never
knows a wire format: sessions carry an :class:`~hubbub.core.session.Encoder` supplied by the transport.

Ordering guarantees:

* A publish is acknowledged (its ``done`` callback runs) only after the commit returned, and before the
  event is fanned out, so a publisher that also subscribes sees its reply before its own copy.
* Fan-out follows commit order. Each session gets a live event at most once, with the ids of every
  subscription of that session that matches it.
* A subscription with a replay is registered *holding*: live events that match it are held while the snapshot
  and replay are read and queued, then the ones newer than the snapshot are queued right after the replay,
  before any later live event (``core/junction.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from hubbub.auth import Authenticator, Authorizer, Identity
from hubbub.channels import Pattern
from hubbub.errors import EpochMismatch, ShuttingDown
from hubbub.events import Event
from hubbub.log.appended import Committed, expand_runs
from hubbub.log.base import ChannelInfo, EventLog, LogStore, RetentionPolicy
from hubbub.selection import ReplaySpec, Selection, SubtreeFetch

from .access import Access
from .batcher import Pending, Publish, Submit, SubmitMany, SubmitRun, WriteBatcher
from .health import StoreHealth
from .limits import Limiter, LimitSettings
from .log_control import LogControl, StateGet, StateList, StateSet, Trimmed
from .notices import Notices
from .presence import LocalPresence, Presence
from .reads import ChannelPage, LogReads
from .relay import Relay, SubscribeBarrier, committed_events
from .replay import Gap, ReplayPlan
from .replay_service import REPLAY_PAGE, ReplayService
from .retention import RetentionTask
from .routes import RouteBook
from .session import Session
from .stats import Histogram, NodeMetrics, label_key
from .subscriptions import Subscription, SubscriptionRegistry
from .supervisor import Supervision

if TYPE_CHECKING:
    from .consumers import ConsumerService

__all__ = ["REPLAY_PAGE", "EpochMismatch", "Histogram", "Node", "NodeSettings", "Subscription", "Trimmed"]

log = logging.getLogger("hubbub.node")

T = TypeVar("T")

#: No replay, but the snapshot's heads: an exact channel's position, a pattern's ``top_time``.
SNAPSHOT = ReplaySpec()


@dataclass(frozen=True, slots=True)
class NodeSettings:
    max_subscriptions: int = 1024
    max_pending: int = 65536
    commit_batch: int = 4096
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    retention_interval_s: float = 30.0
    reader_threads: int = 4


class Node:
    """See the module docstring. Use as ``async with Node(store, settings) as node``."""

    # The parts' bound methods, set in __init__ (documented on the parts).
    submit: Submit
    submit_many: SubmitMany
    submit_run: SubmitRun
    publish: Publish
    writable: Callable[[], Awaitable[None]]
    attach: Callable[[Session], None]
    detach: Callable[[Session], None]
    session_by_id: Callable[[str], Session | None]
    unsubscribe: Callable[[Session, str], None]
    subscriptions: Callable[[Session], list[Subscription]]
    watch_subscriptions: Callable[[Callable[[Subscription, bool], None]], Callable[[], None]]
    send_fetched: Callable[[Session, Pattern, ReplayPlan], Awaitable[int]]
    fetch: Callable[[Session, Pattern, SubtreeFetch], Awaitable[ReplayPlan]]
    #: Reads of the log's positions and times (:class:`LogReads`' own: the caller checked read permission):
    #: a channel's position now, the log's newest commit time, the time of its oldest retained event.
    head: Callable[[str], Awaitable[ChannelInfo]]
    top_time: Callable[[], Awaitable[int]]
    oldest_time: Callable[[], Awaitable[int]]
    #: A relay's release (``relay``) of committed events, with their origins, to the matching sessions: one,
    #: or several at once, fanned out as runs as a commit is (``LiveFanOut.fan_out_events``).
    fan_out: Callable[[Event, Session | None], None]
    fan_out_many: Callable[[Iterable[tuple[Session | None, Event]]], None]
    #: Trims, new epochs and the log's state maps (``core/log_control.py``).
    trim: Callable[[str, str, int], Awaitable[Trimmed]]
    reset_channel: Callable[[str], Awaitable[Any]]
    state_get: StateGet
    state_list: StateList
    state_set: StateSet

    def __init__(
        self,
        store: LogStore,
        settings: NodeSettings | None = None,
        authorizer: Authorizer | None = None,
        *,
        new_epochs: bool = False,
        authenticator: Authenticator | None = None,
        limits: LimitSettings | None = None,
        view: EventLog | None = None,
    ) -> None:
        self._store = store
        self.settings = settings or NodeSettings()
        #: Authentication, permission checks, token expiry and the audit log: the one enforcement point.
        # Transports call it directly for log reads (check_read), admin operations (check_admin) and
        # connection admission (limiter.admit / limiter.release).
        self.access = Access(authorizer, authenticator, Limiter(limits))
        self.limiter = self.access.limiter
        self._new_epochs = new_epochs
        self._closing = False
        #: Failures of the node's and its components' background tasks, and the request to stop the node
        #: (``core/supervisor.py``): every component of this node reports here.
        self.supervision = Supervision()
        s = self.settings
        #: Sessions, subscriptions, the router and live fan-out.
        self._registry = SubscriptionRegistry(self.access, s.max_subscriptions, self._on_slow)
        #: Publishes: authorization, group commit on the writer thread, acks; then the registry fans out.
        self._batcher = WriteBatcher(
            store,
            self.access,
            self._registry.live.fan_out_committed,
            max_pending=s.max_pending,
            commit_batch=s.commit_batch,
            faults=self._registry.faults,
        )
        #: The reader threads and the typed reads of the log (the one way to read the store from the loop).
        self._reads = LogReads(view or store, s.reader_threads, store)
        self._replays = ReplayService(view or store, self._reads, self._registry, self._batcher.control)
        self.send_fetched = self._replays.send_fetched
        self.fetch = self._replays.fetch  # a fetch's plan read without subscribing (guble's), for a session
        reads = self._reads
        self.head, self.top_time, self.oldest_time = reads.head, reads.top_time, reads.oldest_time
        #: The store's health from a background probe and the writer's outcomes (``health_checks``).
        self._store_health = StoreHealth(store, lambda: self._batcher.writer, supervision=self.supervision)
        #: The log's time- and size-based retention (``max_age_s``, ``max_total_bytes``), on the writer.
        self._retention = RetentionTask(
            self._batcher.control, s.retention, s.retention_interval_s, self.supervision
        )
        b, r = self._batcher, self._registry
        #: Every counter, per dialect (``/metrics``): the parts' own dicts, held by reference.
        self.metrics = NodeMetrics(
            r.published,
            r.deliveries,
            r.faults.closes,
            b.ack_latency,
            self.supervision.failures,
            r.dropped,
            sessions=lambda: r.sessions,
            subscriptions=lambda: r.router.statistics()["subscriptions"],
            log=lambda: reads.submit(store.stats),  # a reader thread: never the loop
        )
        self.submit = b.submit
        self.submit_many = b.submit_many
        self.submit_run = b.submit_run
        self.publish = b.publish
        self.writable = b.writable
        self.attach = r.attach
        self.detach = r.detach
        self.session_by_id = r.session_by_id
        self.unsubscribe = r.unsubscribe
        self.subscriptions = r.subscriptions
        self.watch_subscriptions = r.watch
        self.fan_out = r.fanout.fan_out
        self.fan_out_many = r.live.fan_out_events
        ctl = LogControl(store, self._reads, b, lambda: self._closing)
        self.trim, self.reset_channel = ctl.trim, ctl.reset_channel
        self.state_get, self.state_list, self.state_set = ctl.state_get, ctl.state_list, ctl.state_set
        self._relay: Relay | None = None
        self.consumers: ConsumerService | None = None  # set by the service while it runs (docs/consumers.md)
        #: The push connectors' routes, kept with the log (core/routes.py).
        self.routes = RouteBook(self._batcher.control, self._reads, store.shared)
        self.presence: Presence = LocalPresence()  #: rosters (core/presence.py); a cluster's once installed
        self.notices = Notices()  #: short messages to the log's other processes (core/notices.py)
        self.metrics.share(self.notices)  # /metrics sums every worker's figures
        access = self.access
        self.metrics.add(
            "limit_refusals", lambda: {label_key(n, d): v for (n, d), v in access.limiter.refusals.items()}
        )
        self.metrics.add("auth_refusals", lambda: access.refusals)
        self.metrics.add("token_timers", lambda: {"": access.timers}, gauge=True)

    # -- lifecycle --------------------------------------------------------------------------------------

    async def __aenter__(self) -> Node:
        # A writer thread that dies leaves nothing to commit with: the node is stopped (the server too).
        self._batcher.start(on_crash=self.supervision.stopper("writer", "log-writer"))
        await self._store_health.start()
        if self._new_epochs:
            await self._batcher.control(lambda st: st.new_epochs_on_open())
        self._retention.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop accepting publishes, commit everything queued, then release the store."""
        if self._closing:
            return
        self._closing = True
        self._batcher.closing = True
        await self._retention.close()
        await self._batcher.stop()
        await self._store_health.close()
        # Both block (reader threads finishing, the store's final checkpoint): keep them off the loop.
        await self._reads.close()
        await asyncio.get_running_loop().run_in_executor(None, self._store.close)

    @property
    def closing(self) -> bool:
        return self._closing

    # -- sessions and authentication ----------------------------------------------------------------------

    def authenticate(self, token: str | None, dialect: str, peer: str = "") -> Identity:
        """The identity ``token`` gives (one HTTP request), or ``AuthError`` 4100/4101/4103 (audited).
        With ``auth.mode = off`` every token, or none, gives :data:`~hubbub.auth.ANONYMOUS`."""
        return self.access.authenticate(token, dialect, peer)

    def login(self, session: Session, token: str | None, peer: str = "") -> Identity:
        """Authenticate a connection (or refresh its token): the identity becomes the session's, its
        expiry timer is armed (4103 when it fires), and existing subscriptions and consumer openers follow
        the new permissions. Raises ``AuthError`` (4100, 4101, 4103) and leaves the session as it was."""
        self.access.bind(session, ident := self.access.authenticate(token, session.dialect, peer))
        self._registry.rebind(session, ident)
        return ident

    @property
    def sessions(self) -> frozenset[Session]:
        return self._registry.sessions

    def _on_slow(self, sess: Session) -> None:
        log.info("closing slow consumer", extra={"dialect": sess.dialect, "session": sess.id})
        self.metrics.count_slow_close(sess.dialect)

    @property
    def has_room(self) -> bool:
        """Whether a publish may be submitted without waiting (``WriteBatcher.writable``)."""
        return self._batcher.room.value

    # -- cluster relay ----------------------------------------------------------------------------------

    @property
    def relay(self) -> Relay | None:
        """A cluster relay (``core/relay.py``): committed events go to it, not to the fan-out; it hands them
        back, with other nodes' events, through :meth:`fan_out`."""
        return self._relay

    @relay.setter
    def relay(self, relay: Relay | None) -> None:
        self._relay = relay
        # The batcher calls one of the two per committed batch: no check on the path without a relay.
        live = self._registry.live
        self._batcher.on_committed = live.fan_out_committed if relay is None else self._to_relay
        # A subscription waits for the relay to have every event committed before it (core/relay.py).
        self._replays.barrier = relay.barrier if isinstance(relay, SubscribeBarrier) else None

    def _to_relay(self, items: list[Pending], result: list[Committed]) -> None:
        assert self._relay is not None
        self._relay.committed(committed_events(items, expand_runs(result), self._registry.published))

    def matching(self, channel: str, tags: Collection[str] = ()) -> tuple[Subscription, ...]:
        """The subscriptions a committed event on ``channel`` with ``tags`` matches now, every dialect's (in
        the router; holding ones too). qpubs counts its ``delivered`` with it, wearscript answers
        ``exists``, a cluster node decides whether it needs a channel's events."""
        return self._registry.router.match(channel, tags)

    # -- subscribe --------------------------------------------------------------------------------------

    async def subscribe(
        self,
        session: Session,
        sub_id: str,
        pattern: Pattern,
        tags: frozenset[str] = frozenset(),
        selection: Selection = SNAPSHOT,
        *,
        on_snapshot: Callable[[ReplayPlan], None],
        on_replayed: Callable[[ReplayPlan], None] | None = None,
        on_gap: Callable[[Gap], None] | None = None,
    ) -> Subscription:
        """Create a subscription, with the replay ``selection`` names (``hubbub/selection.py``; by default
        none, but the snapshot's heads for the reply).

        ``on_snapshot(plan)`` runs on the loop once the snapshot is read: the transport queues its reply and
        any gap notices. The replayed events are then queued (pacing on the session's queue), and
        ``on_replayed(plan)`` queues the end-of-replay notice; then held live events newer than the snapshot
        are queued, paced alike, before any later one (``core/junction.py``). Replay and junction skip events
        whose delivery filters do not match the session (README §3); ``plan.sent`` counts what was queued.
        Held live events at or below their channel's top in ``plan.tops`` are not released (an empty ``tops``,
        as :data:`~hubbub.selection.LIVE` gives, releases every held event). Raises :class:`SubscriptionError`
        (4200, 4203), :class:`LimitExceeded` (4007) or ``BadRequest``; then no subscription exists.
        ``on_gap(gap)`` queues the notice of a gap found while the replay runs (a scan with ``trim_gaps``: an
        :class:`~hubbub.selection.EventResume`), just before the first event of its channel.
        """
        if self._closing:
            raise ShuttingDown()
        return await self._replays.subscribe(
            session,
            sub_id,
            pattern,
            tags,
            selection,
            on_snapshot=on_snapshot,
            on_replayed=on_replayed,
            on_gap=on_gap,
        )

    # -- reads and control ------------------------------------------------------------------------------

    async def read_channel(
        self,
        channel: str,
        *,
        since: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        epoch: str | None = None,
    ) -> ChannelPage:
        """A bounded read of one channel's log (:meth:`LogReads.read_channel`). The caller checked read
        permission (``access.check_read``)."""
        return await self._reads.read_channel(
            channel, since=since, limit=limit, from_time=from_time, to_time=to_time, epoch=epoch
        )

    async def list_channels(
        self,
        pattern: Pattern,
        *,
        readable_by: Identity | None = None,
        after: str = "",
        limit: int = 1000,
        include_empty: bool = False,
    ) -> list[ChannelInfo]:
        """The channels matching ``pattern`` (:meth:`LogReads.list_channels`). With ``readable_by``, the ones
        that identity may not read are left out, as if they held no events."""
        keep = None if readable_by is None else self.access.reader(readable_by)
        return await self._reads.list_channels(
            pattern, after=after, limit=limit, include_empty=include_empty, keep=keep
        )

    def health_checks(self) -> dict[str, str]:
        """The failing checks of ``/healthz`` and guble's health check (:meth:`StoreHealth.checks`)."""
        return self._store_health.checks(self._closing)

    def statistics(self) -> dict[str, Any]:
        return {
            "sessions": self._registry.session_count,
            "pending": self._batcher.pending,
            "router": self._registry.router.statistics(),
            "writer": self._batcher.writer.statistics() if self._batcher.writer else {},
        }
