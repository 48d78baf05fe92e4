"""MQTT persistent sessions (CleanSession 0; docs/dialects/mqtt.md "Sessions") on the durable consumers
(docs/consumers.md).

A persistent session's filters and their granted QoS are kept by client id in the log's state map
``mqtt.sessions`` (:class:`SessionStore`, :mod:`~.mqtt_store`), which every worker of a node and every node
of a cluster share: the client may come back to any of them. Each filter is a durable consumer of the log
(``mqtt-<hash of the client id>-<hash of the filter>``, native pattern syntax), which journals every event
its pattern matches from the SUBSCRIBE on, connected or not, across restarts. While the client is connected,
:class:`DurableSession` holds one opener per filter: a batch's events go out as PUBLISH packets at
``min(granted, the event's QoS)`` (QoS 1 and 2 with identifiers of the connection's window; with DUP set
when the event may have gone out before, :meth:`~hubbub.core.Batch.maybe_sent`: given back by this process,
or pending when this process took the consumer up, which an earlier process may have sent), and the batch
is acknowledged to the consumer once the client has acknowledged each of its packets (PUBACK, PUBCOMP; QoS 0
at once). A connection that ends gives its unacknowledged batches back: the next connection of the session
gets them again, on this process or another (a consumer is served by one process at a time: a connection
that finds one still held by the process of the session's previous connection, which is giving it back,
waits for it, at most :data:`HOLD_WAIT_S`).

A CONNECT with CleanSession 1 discards the client id's persistent session (its consumers are deleted)
[MQTT-3.1.2-6]; 3.1.1 has no expiry, so a persistent session lasts until then.

Deliveries wait in a bounded backlog while the window is full (one batch of at most ``batch_max`` items per
filter); a client that acknowledges nothing stops getting batches, it is not closed.

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final

from hubbub.core.api import Batch, ConsumerService, Core, Opener, Session
from hubbub.dialects import mqtt as mq
from hubbub.errors import AuthError, ConsumerBusy, HubbubError
from hubbub.log.consumers import ConsumerSpec

from .mqtt_store import SESSIONS

__all__ = ["DurableSession", "SessionStore", "consumer_name"]

log = logging.getLogger("hubbub.mqtt")

DIALECT: Final = "mqtt"
#: The most items of one batch (per filter) a connection holds unacknowledged.
BATCH_MAX: Final = 64
#: How long a consumer collects a batch: MQTT delivers as messages come.
BATCH_WAIT_MS: Final = 1
#: Seconds a connection waits for a consumer of its session that another process still holds.
HOLD_WAIT_S: Final = 5.0
#: Seconds between two tries meanwhile.
HOLD_RETRY_S: Final = 0.05


def consumer_name(client_id: str, topic_filter: str) -> str:
    """The durable consumer of one filter of a persistent session (consumer names are short and plain)."""
    h = hashlib.sha256
    return f"mqtt-{h(client_id.encode()).hexdigest()[:20]}-{h(topic_filter.encode()).hexdigest()[:20]}"


class SessionStore:
    """Client id → its persistent session's filters and granted QoS, in the log's ``mqtt.sessions`` map; see
    the module docstring. ``count`` is the number of sessions as last counted (:meth:`recount`)."""

    def __init__(self, node: Core) -> None:
        self.node = node
        self.count = 0

    async def filters(self, client_id: str) -> dict[str, int] | None:
        """The session's filters, or None when the client id has no persistent session."""
        got = await self.node.state_get(SESSIONS, client_id)
        if got is None or got[0] is None:
            return None
        try:
            return {str(f): int(q) for f, q in json.loads(got[0]).items()}
        except (ValueError, TypeError, AttributeError):
            log.warning("mqtt: the session of %r does not decode: taken as empty", client_id)
            return {}

    async def save(self, client_id: str, filters: dict[str, int] | None) -> None:
        value = None if filters is None else json.dumps(filters, separators=(",", ":"))
        await self.node.state_set(SESSIONS, client_id, value, None)

    async def recount(self) -> None:
        self.count = len(await self.node.state_list(SESSIONS, ""))


@dataclass(slots=True)
class _Pending:
    """A batch handed to this connection: its packets not yet acknowledged to the end."""

    opener: Opener
    number: int
    left: int


class DurableSession:
    """One connection's persistent session: an opener per filter, the packets of their batches, and the
    acknowledgements that end each batch (run by ``spawn``: a task of the service, which outlives the
    connection so that an acknowledged batch is stored as acknowledged)."""

    def __init__(
        self,
        conn: mq.MqttConnection,
        session: Session,
        consumers: ConsumerService,
        store: SessionStore,
        client_id: str,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
    ) -> None:
        self._spawn = spawn
        self.conn = conn
        self.session = session
        self.consumers = consumers
        self.store = store
        self.client_id = client_id
        self.openers: dict[str, Opener] = {}
        #: Packet identifier → its batch.
        self._by_pid: dict[int, _Pending] = {}
        #: Packets waiting for room in the window: (head, payload, qos, dup, batch).
        self._backlog: collections.deque[tuple[bytes, bytes, int, bool, _Pending]] = collections.deque()
        self.closed = False
        #: Openers whose batch's acknowledgement is being stored (closed after it, when the connection ended).
        self._acking: set[Opener] = set()
        self._settled: Callable[[], None] = _nothing

    # -- the session ----------------------------------------------------------------------------------------

    @staticmethod
    async def discard(
        consumers: ConsumerService, store: SessionStore, client_id: str, session: Session
    ) -> None:
        """Forget the client id's persistent session (a clean CONNECT): its consumers are deleted."""
        filters = await store.filters(client_id)
        if filters is None:
            return
        for f in filters:
            await consumers.delete(consumer_name(client_id, f), identity=session.identity, dialect=DIALECT)
        await store.save(client_id, None)

    async def resume(self, filters: dict[str, int] | None) -> None:
        """Open the consumers of the session's ``filters`` (as read before the CONNACK; None: it is new)."""
        if filters is None:
            await self.store.save(self.client_id, {})
            return
        for f, qos in filters.items():
            pattern = mq.filter_pattern(f)
            try:
                await self._open(f, pattern.text)
            except HubbubError as exc:  # permissions changed meanwhile: the filter is gone from the session
                log.info("mqtt session filter dropped: %s", exc, extra={"session": self.session.id})
                self.conn.subscriptions.pop(f, None)
                continue
            self.conn.subscriptions[f] = qos

    async def subscribe(self, reqs: Sequence[mq.FilterRequest]) -> list[bool]:
        """Each filter (granted by the caller's permission check) as a consumer of the session."""
        held: list[bool] = []
        for req in reqs:
            assert req.pattern is not None
            try:
                if req.topic_filter not in self.openers:
                    await self._open(req.topic_filter, req.pattern.text)
            except (AuthError, HubbubError) as exc:
                log.info("mqtt durable subscribe refused: %s", exc, extra={"session": self.session.id})
                held.append(False)
                continue
            self.conn.subscriptions[req.topic_filter] = req.qos
            held.append(True)
        await self._save()
        return held

    async def unsubscribe(self, topic_filter: str) -> None:
        opener = self.openers.pop(topic_filter, None)
        if opener is not None:
            opener.close()
        name = consumer_name(self.client_id, topic_filter)
        await self.consumers.delete(name, identity=self.session.identity, dialect=DIALECT)
        await self._save()

    async def _save(self) -> None:
        if not self.closed:
            await self.store.save(self.client_id, dict(self.conn.subscriptions))

    async def _open(self, topic_filter: str, pattern: str) -> None:
        name = consumer_name(self.client_id, topic_filter)
        spec = ConsumerSpec(name=name, pattern=pattern, batch_wait_ms=BATCH_WAIT_MS)

        def on_batch(batch: Batch) -> None:
            self._batch(topic_filter, batch)

        def on_close(reason: str) -> None:
            self.openers.pop(topic_filter, None)

        deadline = time.monotonic() + HOLD_WAIT_S
        while True:
            try:
                opener = await self.consumers.open(
                    name,
                    on_batch,
                    on_close,
                    spec=spec,
                    batch_max=BATCH_MAX,
                    identity=self.session.identity,
                    # No ``session``: the consumer service would close the opener when the session
                    # detaches, while an acknowledgement of its batch may still be being stored; close()
                    # ends it after that.
                    dialect=DIALECT,
                )
                break
            except ConsumerBusy:
                # Held by the process of the session's previous connection (another worker or node), which
                # gives it back once that connection's acknowledgements are stored.
                if self.closed or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(HOLD_RETRY_S)
        if self.closed:
            opener.close()
            return
        self.openers[topic_filter] = opener

    def close(self, settled: Callable[[], None]) -> None:
        """The connection ended: every outstanding batch goes back to its consumer, but one whose
        acknowledgement is being stored, which completes first; ``settled`` runs once no opener is left (a
        takeover waits for it: the consumers are free again)."""
        self.closed = True
        self._settled = settled
        for opener in list(self.openers.values()):
            if opener not in self._acking:
                opener.close()
        self.openers.clear()
        self._backlog.clear()
        self._by_pid.clear()
        if not self._acking:
            settled()

    # -- deliveries -----------------------------------------------------------------------------------------

    def _batch(self, topic_filter: str, batch: Batch) -> None:
        opener = self.openers.get(topic_filter)
        granted = self.conn.subscriptions.get(topic_filter)
        if opener is None or granted is None or self.closed:
            return
        pending = _Pending(opener, batch.number, 1)  # one held until the loop below is done
        rendered = self.conn.rendered
        for item in batch.items:
            ev = item.event
            topic = mq.channel_topic(ev.channel)
            if topic is None or not mq.filter_applies(topic_filter, ev.channel):
                continue
            if rendered is not None:
                rendered[ev.channel] = (ev.epoch, ev.seq)
            q = min(granted, mq.event_qos(ev.headers))
            head = mq.publish_head(topic)
            if q == 0:
                self.session.push(mq.encode_publish(head, ev.payload), is_event=True)
                continue
            pending.left += 1
            self._backlog.append((head, ev.payload, q, batch.maybe_sent(item), pending))
        self._drain()
        self._done(pending)

    def _drain(self) -> None:
        window, backlog = self.conn.outbound, self._backlog
        while backlog and not window.full:
            head, payload, q, dup, pending = backlog.popleft()
            pid = window.next_id
            packet = window.add(head, payload, q, False, dup)
            assert packet is not None
            self._by_pid[pid] = pending
            self.session.push(packet, is_event=True)

    def delivered(self, packet_id: int) -> None:
        """The client acknowledged ``packet_id`` to the end."""
        pending = self._by_pid.pop(packet_id, None)
        if pending is not None:
            self._done(pending)
        self._drain()

    def _done(self, pending: _Pending) -> None:
        pending.left -= 1
        if pending.left == 0 and not self.closed:
            self._ack(pending.opener, pending.number)

    def _ack(self, opener: Opener, number: int) -> None:
        async def ack() -> None:
            try:
                await opener.ack(number)
            except HubbubError as exc:  # the store failed: delivered again
                log.info("mqtt session batch not acknowledged: %s", exc, extra={"session": self.session.id})
            finally:
                self._acking.discard(opener)
                if self.closed:
                    opener.close()
                    if not self._acking:
                        self._settled()

        self._acking.add(opener)
        self._spawn(ack())


def _nothing() -> None:
    pass
