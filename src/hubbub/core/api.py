"""The core API: the one thing transports (route modules and dialect drivers) see of the node.

:class:`Core` is a typed protocol; :class:`~hubbub.core.node.Node` is its implementation, built by the
composition root (``server.py``). A transport holds a ``Core`` and never names the node's parts (the write
batcher, the writer, the subscription registry and fan-out, the replay service, the reader threads, the
store): an import-linter contract and ``tests/test_static.py`` keep it so. Besides this module, transports
import the core's typed seams: ``core/session.py`` (a connection as the core sees it), ``core/flag.py`` and
``core/flushes.py`` (the writes a commit holds to its end).

What the API offers, by concern:

* **publish**: :attr:`Core.submit` / :attr:`Core.submit_many` / :attr:`Core.submit_run` (with completions),
  :attr:`Core.publish` (awaitable), :attr:`Core.writable` / :attr:`Core.has_room` (back-pressure). These are
  the parts' own bound methods on the node: the facade costs no call per publish.
* **sessions**: ``attach`` / ``detach``, ``authenticate`` / ``login``, ``session_by_id``, ``sessions``.
* **subscriptions**: ``subscribe(session, id, pattern, tags, selection)`` with a replay selection
  (``hubbub/selection.py``: data, never a function over the store) / ``unsubscribe``, ``subscriptions``,
  ``matching`` (who would get an event now), ``watch_subscriptions``; guble's ``fetch`` / ``send_fetched``.
* **reads**: ``read_channel``, ``head``, ``list_channels``, ``top_time``, ``oldest_time`` (bounded, on the
  reader threads).
* **control**: ``trim``, ``reset_channel`` (on the writer thread, in order with appends).
* **state maps**: ``state_get`` / ``state_list`` / ``state_set``: small maps in the log's own storage, one
  for every process of the log (``StateMaps``: MQTT's retained index and persistent sessions); ``notices``,
  short messages to those other processes (``core/notices.py``).
* **durable consumers**: ``consumers`` (the service while it runs, ``None`` otherwise).
* **connectors' routes**: ``routes`` (``core/routes.py``: kept with the log, shared by every process of it).
* **presence**: ``presence`` (rosters, local or cluster-wide).
* **authorization**: ``access`` (authentication, permissions, the audit log: the one enforcement point) and
  ``limiter`` (connection and rate limits).
* **observation**: ``metrics`` (every counter), ``health_checks``, ``relay`` (a cluster's relay, read
  only), ``closing``; ``supervision``, where the supervisors of long-lived components (links, stream
  writers) report failures.

Concurrency contract: every member is used from the event loop thread (see :class:`~hubbub.core.node.Node`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol

from hubbub.auth import Identity
from hubbub.channels import Pattern
from hubbub.disconnect import Disconnect
from hubbub.log.base import ChannelInfo
from hubbub.selection import Selection, SubtreeFetch

from .access import Access
from .batcher import Publish, Submit, SubmitMany, SubmitRun
from .consumer_metrics import LABELLED_MAX, OPENERS_FAMILY, SUMMED_TOTALS, TOTALS_FAMILY
from .consumers import Batch, ConsumerService, GroupMember, Opener
from .limits import LIMIT_NAMES, Limiter
from .log_control import StateGet, StateList, StateSet
from .node import Trimmed
from .notices import Notices
from .presence import Presence
from .reads import LIST_LIMIT, ChannelPage
from .relay import Relay
from .replay import Gap, ReplayPlan
from .routes import RouteBook, RouteRecord
from .session import Encoder, Overflow, Session, new_session_id
from .stats import Figures, Histogram, NodeMetrics, labels_of
from .subscriptions import Subscription
from .supervisor import COMPONENTS, Policy, Supervision, Supervisor

__all__ = [
    "COMPONENTS",
    "LABELLED_MAX",
    "LIMIT_NAMES",
    "LIST_LIMIT",
    "OPENERS_FAMILY",
    "SUMMED_TOTALS",
    "TOTALS_FAMILY",
    "Access",
    "Batch",
    "ChannelPage",
    "ConsumerService",
    "Core",
    "Disconnect",
    "Encoder",
    "Figures",
    "Gap",
    "GroupMember",
    "Histogram",
    "Limiter",
    "NodeMetrics",
    "Notices",
    "Opener",
    "Overflow",
    "Policy",
    "Presence",
    "ReplayPlan",
    "RouteBook",
    "RouteRecord",
    "Session",
    "Subscription",
    "Supervision",
    "Supervisor",
    "Trimmed",
    "labels_of",
    "new_session_id",
]


class Core(Protocol):
    """See the module docstring; each member is documented on :class:`~hubbub.core.node.Node` (or on the
    part whose bound method it is)."""

    # -- publish (the parts' bound methods: no call of the facade on the hot path) ----------------------
    submit: Submit
    submit_many: SubmitMany
    submit_run: SubmitRun
    publish: Publish
    writable: Callable[[], Awaitable[None]]

    @property
    def has_room(self) -> bool: ...

    # -- sessions -------------------------------------------------------------------------------------------
    attach: Callable[[Session], None]
    detach: Callable[[Session], None]
    session_by_id: Callable[[str], Session | None]

    @property
    def sessions(self) -> frozenset[Session]: ...

    def authenticate(self, token: str | None, dialect: str, peer: str = "") -> Identity: ...

    def login(self, session: Session, token: str | None, peer: str = "") -> Identity: ...

    # -- subscriptions --------------------------------------------------------------------------------------
    unsubscribe: Callable[[Session, str], None]
    subscriptions: Callable[[Session], list[Subscription]]
    watch_subscriptions: Callable[[Callable[[Subscription, bool], None]], Callable[[], None]]
    send_fetched: Callable[[Session, Pattern, ReplayPlan], Awaitable[int]]

    async def subscribe(
        self,
        session: Session,
        sub_id: str,
        pattern: Pattern,
        tags: frozenset[str] = ...,
        selection: Selection = ...,
        *,
        on_snapshot: Callable[[ReplayPlan], None],
        on_replayed: Callable[[ReplayPlan], None] | None = None,
        on_gap: Callable[[Gap], None] | None = None,
    ) -> Subscription: ...

    def matching(self, channel: str, tags: Collection[str] = ()) -> tuple[Subscription, ...]: ...

    fetch: Callable[[Session, Pattern, SubtreeFetch], Awaitable[ReplayPlan]]

    # -- reads ----------------------------------------------------------------------------------------------
    async def read_channel(
        self,
        channel: str,
        *,
        since: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        epoch: str | None = None,
    ) -> ChannelPage: ...

    head: Callable[[str], Awaitable[ChannelInfo]]

    async def list_channels(
        self,
        pattern: Pattern,
        *,
        readable_by: Identity | None = None,
        after: str = "",
        limit: int = 1000,
        include_empty: bool = False,
    ) -> list[ChannelInfo]: ...

    top_time: Callable[[], Awaitable[int]]
    oldest_time: Callable[[], Awaitable[int]]

    # -- control --------------------------------------------------------------------------------------------
    trim: Callable[[str, str, int], Awaitable[Trimmed]]
    reset_channel: Callable[[str], Awaitable[Any]]

    # -- state maps (``core/log_control.py``) and notices ------------------------------------------------
    state_get: StateGet
    state_list: StateList
    state_set: StateSet
    notices: Notices

    # -- consumers, connectors' routes, presence, authorization, observation ---------------------------------
    consumers: ConsumerService | None
    routes: RouteBook
    presence: Presence
    access: Access
    limiter: Limiter
    metrics: NodeMetrics
    #: Where a component's background tasks (a transport's :class:`Supervisor`) report their failures.
    supervision: Supervision

    def health_checks(self) -> dict[str, str]: ...

    @property
    def relay(self) -> Relay | None: ...

    @property
    def closing(self) -> bool: ...


if TYPE_CHECKING:
    from .node import Node

    def _node_is_a_core(node: Node) -> Core:
        return node  # mypy checks that the node implements every member of the API
