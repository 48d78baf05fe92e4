"""Push connectors as durable deliveries (docs/connectors.md): each connector subscription (a webhook, and
later a device subscribed to a topic through guble's FCM, APNs or SMS connectors) is a durable consumer of
the core's :class:`~hubbub.core.api.ConsumerService`, whose items a :class:`Connector` pushes one by one to a
provider (an HTTP endpoint, a push service).

Rules, for every provider:

* **At least once, in order per subscription.** A subscription's consumer is opened unshared, so its batches
  come in journal order; each item is pushed, and retried until it is settled, before the next one, and the
  batch is acknowledged once every item in it is settled. A stop or a crash before the acknowledgement gives
  the batch back, and its items are pushed again (the journal survives ``kill -9``).
* **Retries** (``connector_retry.py``): an outcome :class:`Retry` (a 429, a 5xx, a refused or broken
  connection, a timeout) is tried again after a backoff (:class:`RetryPolicy`: doubling from ``base_s`` up
  to ``max_s``), or after what the provider asked for (``Retry-After``, within ``retry_after_min_s`` and
  ``retry_after_max_s``); past ``max_attempts`` tries or ``max_retry_s`` seconds (a day by default) the
  item goes to the dead-letter channel with its last failure's reason, and the next one goes.
* **Credentials refused** (:class:`Unauthorized`: FCM's or APNs's 401/403, Vonage's bad credentials): the
  whole connector pauses (:class:`~.connector_retry.CredentialPause`): one probe at a time with a backoff,
  nothing dead-lettered, every subscription resumed once a probe is not refused for its credentials.
* **Unregistered** (:class:`Gone`: FCM ``UNREGISTERED``, APNs 410, a webhook's 410): the subscription is
  removed (its consumer deleted) and nothing more is pushed to it.
* **Dead letter** (:class:`Refused`: a permanent refusal, such as a 400): the event is published, with its
  headers and the reason, on ``<dead_letter>/<connector>/<subscription>``, and the next item goes out. An
  event that is itself a dead letter and is refused is dropped (counted), never dead-lettered again.
* **Bounded concurrency**: a connector has ``workers`` slots; every push holds one, so at most ``workers``
  requests of a connector are in flight whatever the number of subscriptions.
* **One node at a time** on a cluster: the consumer's hold (docs/consumers.md, "Limits") lets one node open
  it; the others are refused (``ConsumerBusy``) and try again every ``hold_poll_s``.

Concurrency contract: everything runs on the event loop thread. A :class:`Connector` is an async context
manager that owns one task per subscription; leaving it cancels them, which gives their outstanding batches
back to the consumer service (delivered again at the next start).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from hubbub.auth import Identity
from hubbub.core.api import Batch, ConsumerService, Core
from hubbub.errors import ConsumerBusy, ConsumerNotFound, HubbubError, ShuttingDown
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest
from hubbub.log.consumers import ConsumerSpec

from .connector_retry import CredentialPause, RetryPolicy, parse_retry_after

__all__ = [
    "CONNECTOR_IDENTITY",
    "Connector",
    "ConnectorStats",
    "Gone",
    "Outcome",
    "Provider",
    "Refused",
    "Retry",
    "RetryPolicy",
    "Route",
    "Sent",
    "Unauthorized",
    "dead_letter",
    "parse_retry_after",
]

log = logging.getLogger("hubbub.connectors")

#: Who the connectors are to the core: they create, open and delete their own consumers and publish dead
#: letters whatever ``auth.mode`` is (an operator configured them; no client token is involved).
CONNECTOR_IDENTITY = Identity("hubbub-connectors", admin=True, via="static")
#: The dialect label of what the connectors do (refusals, published dead letters).
DIALECT = "native"
#: The header a dead letter carries its refusal's reason in, and the original event's place.
DEAD_HEADERS = ("x-dead-reason", "x-dead-channel", "x-dead-seq", "x-dead-epoch")


@dataclass(frozen=True, slots=True)
class Sent:
    """The provider took the item. ``target``: the provider named a new target for the route from now on
    (FCM's canonical registration id): the route's target takes these values."""

    target: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """A transient failure (``reason``: a label such as ``http_503``, ``connect``, ``timeout``):
    tried again after ``after_s`` when the provider said (``Retry-After``), else after the backoff."""

    reason: str
    after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Gone:
    """The target no longer exists (an unregistered device, a webhook answering 410): the subscription is
    removed."""

    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """A permanent refusal of this item: it goes to the dead-letter channel."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unauthorized:
    """The provider refuses the connector's own credentials (a key, a certificate): no item's fault, every
    subscription's; the connector pauses (module docstring)."""

    reason: str


Outcome: TypeAlias = Sent | Retry | Gone | Refused | Unauthorized


@dataclass(frozen=True, slots=True)
class Route:
    """One connector subscription: the durable consumer ``consumer`` over ``pattern`` (a native pattern,
    with ``tags``) and what the provider needs to push to its target (a webhook's URL and secret, a device
    token)."""

    name: str
    consumer: str
    pattern: str
    target: Mapping[str, str]
    tags: tuple[str, ...] = ()


class Provider(Protocol):
    """Pushes one event to one route's target. ``send`` never raises for a failure of the target or the
    network: it answers an :class:`Outcome` (an exception is taken as a ``Retry("error")`` and logged)."""

    async def send(self, route: Route, event: Event, attempt: int) -> Outcome: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class ConnectorStats:
    """One connector's counters since start (``/metrics``, ``GET /api/v1/connectors``). ``latency`` is
    from an event's commit to its acceptance by the provider."""

    sent: int = 0
    retries: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    dead_lettered: int = 0
    removed: int = 0
    in_flight: int = 0
    latency_count: int = 0
    latency_sum_s: float = 0.0
    latency_max_s: float = 0.0

    def delivered(self, event: Event) -> None:
        self.sent += 1
        lat = max(0.0, (time.time_ns() - event.time_ns) / 1e9)
        self.latency_count += 1
        self.latency_sum_s += lat
        self.latency_max_s = max(self.latency_max_s, lat)


class _RouteState:
    """What one subscription's task is doing, for the status endpoint."""

    __slots__ = ("attempt", "last_error", "route", "state")

    def __init__(self, route: Route) -> None:
        self.route = route
        self.state = "starting"
        self.last_error = ""
        self.attempt = 0


class Connector:
    """The subscriptions of one connector (``webhook``, ``fcm``, …) and their delivery tasks. See the module
    docstring for the rules. ``routes`` may change while it runs (:meth:`add`, :meth:`remove`)."""

    def __init__(
        self,
        name: str,
        node: Core,
        consumers: ConsumerService,
        provider: Provider,
        *,
        workers: int = 8,
        retry: RetryPolicy | None = None,
        dead_letter: str = "/hubbub/dead-letter",
        batch_max: int = 64,
        hold_poll_s: float = 1.0,
        on_removed: Callable[[Route], Awaitable[None]] | None = None,
        on_retargeted: Callable[[Route], Awaitable[None]] | None = None,
    ) -> None:
        self.name = name
        self._node = node
        self._consumers = consumers
        self.provider = provider
        self.workers = max(1, workers)
        self._slots = asyncio.Semaphore(self.workers)
        self.retry = retry or RetryPolicy()
        self.dead_letter = dead_letter.rstrip("/")
        self._batch_max = batch_max
        self._hold_poll_s = hold_poll_s
        #: Told of a route removed because its target is gone (guble's connectors forget the device).
        self._on_removed = on_removed
        #: Told of a route whose target the provider changed (guble's connectors store the new token).
        self._on_retargeted = on_retargeted
        self.stats = ConnectorStats()
        #: The pause while the provider refuses the connector's credentials.
        self.pause = CredentialPause(name)
        self._routes: dict[str, _RouteState] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Connector:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closing = True
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        await self.provider.aclose()

    async def create(self, route: Route) -> None:
        """Create ``route``'s consumer now, unless it exists: every event committed after this returns is
        journaled for it (a route's task would otherwise create it at its first open, a little later)."""
        await self._consumers.create(self._spec(route), identity=CONNECTOR_IDENTITY, dialect=DIALECT)

    def add(self, route: Route) -> None:
        """Start delivering ``route``, whose consumer :meth:`create` made (here or in another process of the
        log): a route whose consumer is gone (deleted by another process) ends at its first open."""
        if route.name in self._routes:
            raise ValueError(f"{self.name}: {route.name} exists")
        st = self._routes[route.name] = _RouteState(route)
        self._tasks[route.name] = asyncio.get_running_loop().create_task(
            self._run(st), name=f"connector {self.name} {route.name}"
        )

    async def remove(self, name: str, *, delete: bool = True) -> bool:
        """Stop delivering the route ``name`` and (``delete``) delete its consumer and backlog."""
        st = self._routes.pop(name, None)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if st is not None and delete:
            await self._consumers.delete(st.route.consumer, identity=CONNECTOR_IDENTITY, dialect=DIALECT)
        return st is not None

    async def delete_consumer(self, consumer: str) -> None:
        """Delete a route's consumer and its backlog, whether or not this process runs the route (stop it
        first with :meth:`remove`): a route of a log other processes share may run elsewhere only."""
        await self._consumers.delete(consumer, identity=CONNECTOR_IDENTITY, dialect=DIALECT)

    def routes(self) -> list[Route]:
        return [st.route for st in self._routes.values()]

    # -- one subscription -------------------------------------------------------------------------------

    def _forget(self, st: _RouteState) -> None:
        """The route of ``st`` ended by itself: no longer run (a route added since under its name stays)."""
        if self._routes.get(st.route.name) is st:
            del self._routes[st.route.name]
            self._tasks.pop(st.route.name, None)

    def _spec(self, route: Route) -> ConsumerSpec:
        return ConsumerSpec(name=route.consumer, pattern=route.pattern, tags=route.tags, batch_wait_ms=0)

    async def _run(self, st: _RouteState) -> None:
        """The route's task: open its consumer (waiting while another node holds it), push its batches,
        and start again after an unexpected failure (logged, with a backoff)."""
        failures = 0
        while not self._closing:
            try:
                if await self._serve(st):
                    return
                failures = 0
            except asyncio.CancelledError:
                raise
            except ConsumerBusy:
                st.state = "held_elsewhere"  # another node of the cluster delivers it
                await asyncio.sleep(self._hold_poll_s)
            except ConsumerNotFound:
                # Deleted by another process of the log (its route removed there): never created again
                # here, which would journal for a route nobody has.
                self._forget(st)
                return
            except ShuttingDown:
                return
            except Exception as exc:
                failures += 1
                st.state, st.last_error = "failing", f"{type(exc).__name__}: {exc}"
                log.warning(
                    "connector %s: subscription %s failed: %s",
                    self.name,
                    st.route.name,
                    exc,
                    exc_info=not isinstance(exc, HubbubError),
                )
                await asyncio.sleep(self.retry.delay(failures, None))

    async def _serve(self, st: _RouteState) -> bool:
        """Open the consumer and deliver its batches until it is closed; True when the route is over
        (removed as unregistered, or its consumer deleted)."""
        route = st.route
        inbox: asyncio.Queue[Batch | str] = asyncio.Queue()
        opener = await self._consumers.open(
            route.consumer,
            inbox.put_nowait,
            inbox.put_nowait,
            spec=None,
            create=False,
            shared=False,
            batch_max=self._batch_max,
            identity=CONNECTOR_IDENTITY,
            dialect=DIALECT,
        )
        try:
            while True:
                st.state = "idle"
                got = await inbox.get()
                if isinstance(got, str):  # closed by the service: deleted, shutdown, error
                    if got == "deleted":
                        self._forget(st)
                        return True
                    return got == "shutdown"
                st.state = "delivering"
                for item in got.items:
                    if await self._push(st, item.event) is not None:
                        # Unregistered: nothing more goes to this target. The batch is not acknowledged:
                        # the delete below drops the consumer with its journal.
                        opener.close()
                        self.stats.removed += 1
                        self._forget(st)
                        await self._consumers.delete(
                            route.consumer, identity=CONNECTOR_IDENTITY, dialect=DIALECT
                        )
                        if self._on_removed is not None:
                            await self._on_removed(route)
                        return True
                await opener.ack(got.number)
        finally:
            opener.close()

    async def _push(self, st: _RouteState, event: Event) -> Gone | None:
        """Push one event until it is settled: sent, dead-lettered, or its target gone (returned)."""
        attempt = 0
        started = time.monotonic()
        while True:
            st.attempt = attempt
            outcome = await self._send(st.route, event, attempt)
            if isinstance(outcome, Unauthorized):
                self.stats.failed[outcome.reason] += 1
                st.state, st.last_error = "paused", outcome.reason
                self.pause.refused(outcome.reason)
                started = time.monotonic()  # the time paused does not count toward the item's bound
                continue  # tried again as a probe (``_send`` waits its turn)
            if not isinstance(outcome, Retry):
                self.pause.accepted()
            if isinstance(outcome, Sent):
                self.stats.delivered(event)
                if outcome.target:
                    await self._retarget(st, outcome.target)
                return None
            if isinstance(outcome, Gone):
                self.stats.failed[outcome.reason] += 1
                log.info("connector %s: %s is gone (%s): removed", self.name, st.route.name, outcome.reason)
                return outcome
            self.stats.failed[outcome.reason] += 1
            st.last_error = outcome.reason
            attempt += 1
            if isinstance(outcome, Retry):
                delay = self.retry.next_delay(attempt, outcome.after_s, time.monotonic() - started)
                if delay is not None:
                    self.stats.retries += 1
                    st.state = "retrying"
                    await asyncio.sleep(delay)
                    st.state = "delivering"
                    continue
                log.warning(
                    "connector %s: %s: gave up on %s:%d after %d tries over %.1f s (%s): dead-lettered",
                    self.name,
                    st.route.name,
                    event.channel,
                    event.seq,
                    attempt,
                    time.monotonic() - started,
                    outcome.reason,
                )
            await self._dead_letter(st.route, event, outcome.reason, attempt)
            return None

    async def _retarget(self, st: _RouteState, target: Mapping[str, str]) -> None:
        """The provider named a new target: the route's next pushes go there (its consumer stays)."""
        old = st.route
        st.route = dataclasses.replace(old, target={**old.target, **target})
        log.info("connector %s: %s has a new target", self.name, old.name)
        if self._on_retargeted is not None:
            await self._on_retargeted(st.route)

    async def _send(self, route: Route, event: Event, attempt: int) -> Outcome:
        if self.pause.active:  # (a context manager per push otherwise: measurable at a thousand a second)
            async with self.pause.turn():
                return await self._attempt(route, event, attempt)
        return await self._attempt(route, event, attempt)

    async def _attempt(self, route: Route, event: Event, attempt: int) -> Outcome:
        async with self._slots:
            self.stats.in_flight += 1
            try:
                return await self.provider.send(route, event, attempt)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("connector %s: push to %s failed: %s", self.name, route.name, exc, exc_info=True)
                return Retry("error")
            finally:
                self.stats.in_flight -= 1

    async def _dead_letter(self, route: Route, event: Event, reason: str, attempts: int) -> None:
        """Publish ``event`` on the route's dead-letter channel (committed before the next item goes out),
        or drop it when it is a dead letter already (no loop)."""
        request = dead_letter(f"{self.dead_letter}/{self.name}/{route.name}", event, reason, attempts)
        if request is None:
            self.stats.failed["dead_letter_dropped"] += 1
            log.warning("connector %s: %s refused a dead letter (%s): dropped", self.name, route.name, reason)
            return
        await self._node.publish(request, None, CONNECTOR_IDENTITY)
        self.stats.dead_lettered += 1

    # -- status ---------------------------------------------------------------------------------------------

    def status(self, backlogs: Mapping[str, int]) -> dict[str, Any]:
        """This connector's figures and subscriptions, each with its backlog (``backlogs``: the store's
        count of unacknowledged items by consumer name)."""
        s = self.stats
        routes = []
        for st in self._routes.values():
            routes.append(
                {
                    "name": st.route.name,
                    "consumer": st.route.consumer,
                    "pattern": st.route.pattern,
                    "state": st.state,
                    "backlog": backlogs.get(st.route.consumer, 0),
                    "last_error": st.last_error,
                }
            )
        return {
            "name": self.name,
            "paused": self.pause.status(),
            "workers": self.workers,
            "in_flight": s.in_flight,
            "sent": s.sent,
            "retries": s.retries,
            "failed": dict(s.failed),
            "dead_lettered": s.dead_lettered,
            "removed": s.removed,
            "latency_s": {"count": s.latency_count, "sum": s.latency_sum_s, "max": s.latency_max_s},
            "backlog": sum(r["backlog"] for r in routes),
            "subscriptions": routes,
        }


def dead_letter(channel: str, event: Event, reason: str, attempts: int) -> AppendRequest | None:
    """The dead letter of ``event`` on ``channel``: its payload, content type, tags and headers, and the
    refusal's ``reason``, the tries made and the event's place in ``x-dead-*`` headers; None for an event
    that is a dead letter already (never dead-lettered again: no loop)."""
    if DEAD_HEADERS[0] in event.headers:
        return None
    headers = dict(event.user_headers)
    headers.update(zip(DEAD_HEADERS, (reason, event.channel, str(event.seq), event.epoch), strict=True))
    headers["x-dead-attempts"] = str(attempts)
    return AppendRequest(
        channel=channel,
        publisher=Publisher(DIALECT, CONNECTOR_IDENTITY.user),
        payload=event.payload,
        content_type=event.content_type,
        headers=headers,
        tags=event.tags,
    )
