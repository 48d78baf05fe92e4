"""MQTT 3.1.1 (docs/dialects/mqtt.md): the TCP (or TLS) listener on ``mqtt.tcp_listen`` and the ``/mqtt``
WebSocket (subprotocol ``mqtt``, binary frames), both on :class:`MqttWire`.

The protocol logic is the sans-I/O :class:`~hubbub.dialects.mqtt.MqttConnection`; :class:`MqttWire` carries
its actions out on a :class:`~hubbub.transports.wire.DialectWire`, in arrival order:

* ``ConnectRequest``: the credentials (the password is a hubbub token or JWT; a user name alone is taken as
  one) through ``Node.login``, the client id (an empty one gets ``hubbub-<session id>``), the takeover of a
  connection with the same id, in this process or another (:mod:`~hubbub.transports.mqtt_clients`), the
  session (CleanSession 0: a persistent session on durable consumers,
  :mod:`~hubbub.transports.mqtt_sessions`; 1: a persistent one of the id discarded), then the CONNACK, the
  session's deliveries and the packets pipelined behind it;
* ``MqttPublish``: stored through the write batcher with its QoS (and retain flag) as pseudo-headers, and
  acknowledged (PUBACK, PUBREC) once committed (a retained one once its entry is in the retained index too),
  in publish order (:mod:`~hubbub.transports.mqtt_acks`); a publish the token may not make is dropped,
  counted, and acknowledged all the same (3.1.1 has no refusal);
* ``MqttSubscribe`` / ``Unsubscribe``: :class:`~hubbub.transports.mqtt_filters.MqttFilters` (the filters
  the token may read whole, as live core subscriptions or the session's consumers; the SUBACK, 0x80 for a
  refusal; the retained messages after it, :mod:`~hubbub.transports.mqtt_retained`);
* ``Delivered``: a persistent session's delivery acknowledged to the end.

:class:`MqttEncoder` renders an event for one connection: once per connection whatever its matching
filters (at the highest QoS granted among those that apply, capped by the event's), QoS 0 packets shared
between connections, QoS 1 and 2 with a packet identifier from the connection's window; while the window is
full they wait, in order, for the client's acknowledgements (past ``limits.send_queue`` waiting the client is
a slow consumer).

The keepalive: a connection silent for 1.5 times its CONNECT's keepalive is closed [MQTT-3.1.2-24]. The
will is published when a connection that was accepted ends without DISCONNECT.

Concurrency contract: everything runs on the event loop thread; one task reads each connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hubbub.core.api import ConsumerService, Core, Session
from hubbub.dialects import actions as a
from hubbub.dialects import mqtt as mq
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, HubbubError, LimitExceeded, ShuttingDown
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult

from .binding import Mounted, Wiring
from .cross_site import cross_site_upgrade
from .http import HttpSettings
from .lifetime import Lifetime
from .mqtt_acks import AckOrder
from .mqtt_clients import ClientTable, Stamp
from .mqtt_filters import MqttFilters
from .mqtt_retained import RetainedIndex
from .mqtt_sessions import DurableSession, SessionStore
from .mqtt_store import migrate
from .stream_driver import WRITE_TIMEOUT_S, ServiceStreams, listen_streams
from .stream_listener import Accepted, StreamListener
from .wire import DialectWire
from .ws_driver import detach, run_websocket, upgradable
from .ws_socket import take_over

__all__ = [
    "MqttCollector",
    "MqttEncoder",
    "MqttMounted",
    "MqttService",
    "MqttSettings",
    "MqttWire",
    "mount",
    "serve_mqtt",
]

log = logging.getLogger("hubbub.mqtt")

DIALECT: Final = "mqtt"
READ_CHUNK: Final = 256 * 1024
#: Seconds a closing connection may take to flush.
CLOSE_WAIT_S: Final = 5.0
#: A connection silent this many times its keepalive is closed (§3.1.2.10).
KEEPALIVE_GRACE: Final = 1.5
#: Seconds a takeover waits for the connection it replaces to end.
TAKEOVER_WAIT_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """``auth``: connections must present a token; ``max_qos``: the highest QoS granted a subscription;
    ``max_inflight``: unacknowledged QoS 1/2 deliveries per connection."""

    auth: bool = False
    max_qos: int = 2
    max_inflight: int = 1024


class MqttService:
    """The node's MQTT side: settings, the live connection of each client id, every connection's task, and
    the counters of ``/metrics``."""

    def __init__(
        self, node: Core, consumers: ConsumerService, settings: MqttSettings, http: HttpSettings
    ) -> None:
        self.node = node
        self.consumers = consumers
        self.settings = settings
        self.http = http
        #: Where each channel's retained event is in the log (a state map of the log: every process's).
        self.retained = RetainedIndex(node)
        #: The persistent sessions' filters (their messages are in durable consumers), a state map too.
        self.sessions = SessionStore(node)
        #: Tasks that outlive their connection (a persistent session's acknowledgements being stored).
        self.tasks: set[asyncio.Task[None]] = set()
        self.connections: set[asyncio.Task[None]] = set()
        #: The accepted connection of each client id, and the takeovers from other processes.
        self.clients = ClientTable(node.notices)
        #: Publishes dropped because the token may not publish there.
        self.dropped = 0

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task of the service (the server waits for it when it stops)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def inflight(self) -> int:
        """Unacknowledged QoS 1/2 deliveries, over every connection."""
        return sum(len(w.conn.outbound) for w in self.clients.local.values())

    async def recount(self) -> None:
        """Count the retained messages and persistent sessions in the log (before a ``/metrics`` scrape)."""
        await self.retained.recount()
        await self.sessions.recount()

    def install(self, app: web.Application, node: Core, settings: HttpSettings) -> None:
        """The :data:`~hubbub.transports.http.RouteInstaller` of ``/mqtt``."""
        app.router.add_get("/mqtt", self.websocket)

    async def websocket(self, request: web.Request) -> web.StreamResponse:
        """``GET /mqtt``: MQTT over WebSocket (binary frames carry the byte stream, §6)."""
        ws = upgradable(request, self.http.max_frame + 5, protocols=("mqtt",))
        if ws is None:
            return web.Response(status=400, text="expected a WebSocket upgrade\n")
        if forbidden := cross_site_upgrade(request, anonymous=not self.settings.auth):
            return forbidden
        sock, resp = await take_over(request, ws, self.http.max_frame + 5)

        async def send(data: bytes) -> None:
            await sock.send_bytes(data)

        async def close(code: Disconnect) -> None:
            await sock.close(code=mq.SPEC.close_code(code))

        peer = request.remote or ""
        w = MqttWire(self, send=send, close=close, peer=peer)
        detach(request, run_websocket(sock, w.wire, w.conn, None, finishing=w.finishing))
        return resp


class MqttEncoder:
    """Renders an event for one connection (it knows the connection's filters and packet identifiers)."""

    per_connection = True
    key = "mqtt"

    def __init__(self, conn: mq.MqttConnection, qos_packet: Callable[[bytes, bytes, int], bytes]) -> None:
        self.conn = conn
        self._qos_packet = qos_packet

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        conn = self.conn
        q = conn.delivery_qos(event.channel, subs)
        if q is None:
            return b""
        if conn.rendered is not None:
            conn.rendered[event.channel] = (event.epoch, event.seq)
        head = cache.get("mqtt.head")
        if head is None:
            topic = mq.channel_topic(event.channel)
            head = cache["mqtt.head"] = b"" if topic is None else mq.publish_head(topic)
        if not head:
            return b""  # the root has no topic name
        q = min(q, mq.event_qos(event.headers))
        if q == 0:
            packet = cache.get("mqtt.q0")
            if packet is None:
                packet = cache["mqtt.q0"] = mq.encode_publish(head, event.payload)
            return bytes(packet)
        return self._qos_packet(head, event.payload, q)


class MqttWire:
    """One MQTT connection's binding: the dialect's state machine on a
    :class:`~hubbub.transports.wire.DialectWire`; the byte-stream driver's
    :class:`~hubbub.transports.stream_driver.StreamWire`."""

    def __init__(
        self,
        service: MqttService,
        *,
        send: Callable[[bytes], Awaitable[object]],
        close: Callable[[Disconnect], Awaitable[object]],
        send_many: Callable[[list[bytes]], Awaitable[object]] | None = None,
        peer: str = "",
    ) -> None:
        self.service = service
        node = self.node = service.node
        s, h = service.settings, service.http
        self.conn = mq.MqttConnection(
            max_packet=h.max_frame,
            max_qos=s.max_qos,
            max_channel_bytes=h.max_channel_bytes,
            max_inflight=s.max_inflight,
        )
        self.wire = DialectWire(
            node,
            mq.SPEC,
            dialect=DIALECT,
            encoder=MqttEncoder(self.conn, self.qos_packet),
            send_queue=h.send_queue,
            send_queue_bytes=h.send_queue_bytes,
            max_frame=h.max_frame + 5,
            send=send,  # an event this connection must not get renders empty: not sent
            send_many=send_many,
            close=close,
            refused=self._refused,
            echo=True,  # 3.1.1 delivers a client's own publishes to its matching filters
            pace=True,  # a read may hold thousands of packets, each answered
            close_wait_s=CLOSE_WAIT_S,
        )
        self.session: Session = self.wire.session
        self.peer = peer
        #: Set once the connection has left ``service.clients`` (a takeover waits for it).
        self.ended = asyncio.Event()
        self._registered = False
        #: The CONNECT's place in the order of every process's (the newest of a client id wins).
        self.stamp: Stamp = (0, "")
        #: Acknowledgements in publish order.
        self._acks = AckOrder()
        #: Live QoS 1/2 deliveries waiting for room in the window, in order.
        self._waiting: collections.deque[tuple[bytes, bytes, int, bool]] = collections.deque()
        #: The persistent session (CleanSession 0), while connected.
        self.durable: DurableSession | None = None
        self.filters = MqttFilters(self)
        self.wire.handle(
            {
                mq.ConnectRequest: self._connect,
                mq.MqttPublish: self._publish,
                mq.MqttSubscribe: self.filters.subscribe,
                a.Unsubscribe: self.filters.unsubscribe,
                mq.Delivered: self._delivered,
            }
        )

    # -- the byte-stream driver's side --

    @property
    def done(self) -> bool:
        return self.wire.done

    @property
    def messages(self) -> int:
        return self.conn.messages

    def start(self, group: Lifetime) -> None:
        self.wire.start(group, None)

    async def feed(self, data: bytes) -> None:
        self.wire.last_recv = time.monotonic()
        await self.wire.run(self.conn.receive_data(data))

    async def finish(self) -> None:
        self.finishing()
        await self.wire.finish()

    def finishing(self) -> None:
        """The reader is done: publish the will of an abnormal end, leave the client table (once a persistent
        session's acknowledgements being stored are, so that its next connection finds its consumers free)."""
        will = self.conn.will
        if will is not None and self._registered:
            self.conn.will = None
            self._publish_will(will)
        registered, self._registered = self._registered, False
        clients, client_id = self.service.clients.local, self.conn.client_id

        def settled() -> None:
            # Only now may another connection of the client id take the session's consumers: until then it
            # finds this one in the table and waits for ``ended`` (a takeover).
            if registered and clients.get(client_id) is self:
                del clients[client_id]
            self.ended.set()

        if self.durable is not None:  # unacknowledged batches go back to the consumers, for the next one
            self.durable.close(settled)
        else:
            settled()

    # -- actions --

    def emit(self, actions: Sequence[object]) -> None:
        """Replies the connection gives synchronously (acknowledgements): queued, or the close."""
        for act in actions:
            if isinstance(act, a.Send):
                self.session.push(act.data)
            elif isinstance(act, a.Close):
                self.wire.close(act.code, act.reason)

    async def _connect(self, req: mq.ConnectRequest) -> None:
        node, conn = self.node, self.conn
        token = req.password.decode("utf-8", "replace") if req.password is not None else req.username
        required = self.service.settings.auth
        if token is not None or required:
            try:
                node.login(self.session, token, self.peer)
            except AuthError:
                if required:
                    code = mq.NOT_AUTHORIZED if token is None else mq.BAD_CREDENTIALS
                    await self.wire.run(conn.refuse(code))
                    return
                # Auth off for MQTT: credentials that are no token (a plain user name) are ignored.
        client_id = req.client_id or f"hubbub-{self.session.id}"
        self.stamp = self.service.clients.stamp()
        if not await self._take_over(client_id):
            if not self.done:  # a newer CONNECT of the id came first, here or on another process
                self.session.end(Disconnect.NORMAL)
            return
        self._registered = True
        svc = self.service
        filters: dict[str, int] | None = None
        if req.clean_session:  # a clean session ends a persistent one [MQTT-3.1.2-6]
            await DurableSession.discard(svc.consumers, svc.sessions, client_id, self.session)
        else:
            self.durable = DurableSession(
                conn, self.session, svc.consumers, svc.sessions, client_id, svc.spawn
            )
            filters = await svc.sessions.filters(client_id)
        if self.done:
            return
        if conn.keepalive:
            self.wire.spawn(self._keepalive(conn.keepalive * KEEPALIVE_GRACE))
        connack, *pipelined = conn.accept(filters is not None, client_id)
        await self.wire.run([connack])
        if self.durable is not None:
            # Its consumers' batches after the CONNACK, as the packets behind it.
            await self.durable.resume(filters)
        await self.wire.run(pipelined)

    async def _take_over(self, client_id: str) -> bool:
        """Make this connection the one of ``client_id`` [MQTT-3.1.4-2]: an older one in this process is
        closed first (and waited for, so that its persistent session's consumers are free), the other
        processes are told (``mqtt_clients``). False when a newer CONNECT of the id came first."""
        table = self.service.clients
        while (old := table.local.get(client_id)) is not None and old is not self:
            if old.stamp > self.stamp:
                return False
            old.session.end(Disconnect.NORMAL)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(old.ended.wait(), TAKEOVER_WAIT_S)
            if self.done:
                return False
            if table.local.get(client_id) is old:
                break  # it did not end in time: replaced all the same
        if table.superseded(client_id, self.stamp):
            return False
        table.register(client_id, self, self.stamp)
        return True

    async def _keepalive(self, limit: float) -> None:
        """Close the connection after ``limit`` seconds without a packet [MQTT-3.1.2-24]."""
        wire = self.wire
        while not wire.done:
            left = wire.last_recv + limit - time.monotonic()
            if left <= 0:
                log.debug("mqtt keepalive expired", extra={"session": self.session.id})
                self.session.end(Disconnect.TIMEOUT)
                return
            await asyncio.sleep(left)

    def _request(self, channel: str, payload: bytes, qos: int, retain: bool) -> AppendRequest:
        sess = self.session
        headers = {mq.QOS_HEADER: str(qos)}
        if retain:
            headers[mq.RETAIN_HEADER] = "1"
        return AppendRequest(
            channel=channel,
            publisher=Publisher(DIALECT, sess.user, sess.id, ""),
            payload=payload,
            content_type=mq.CONTENT_TYPE,
            headers=headers,
        )

    async def _publish(self, cmd: mq.MqttPublish) -> None:
        req = self._request(cmd.channel, cmd.payload, cmd.qos, cmd.retain)
        acks = self._acks

        def done(r: AppendResult | HubbubError) -> None:
            if isinstance(r, HubbubError):
                acks.answer(slot, functools.partial(self.wire.refuse, cmd, r))
            elif cmd.retain:
                # A task of the service: the entry is written even if the connection ends meanwhile.
                self.service.spawn(self._retain_then_ack(cmd, r, slot))
            else:
                acks.answer(slot, lambda: self.emit(self.conn.published(cmd)))

        await self.node.writable()
        slot = acks.take()
        try:
            self.node.submit(req, self.session, done)
        except (AuthError, LimitExceeded) as exc:
            acks.answer(slot, functools.partial(self.wire.refuse, cmd, exc))
        except ShuttingDown:
            acks.answer(slot, lambda: self.session.end(Disconnect.GOING_AWAY))

    async def _retain_then_ack(self, cmd: mq.MqttPublish, r: AppendResult, slot: int) -> None:
        """A retained publish is acknowledged once its channel's entry is in the retained index: a
        SUBSCRIBE on any node after the acknowledgement finds it. An entry that cannot be written closes
        the connection unacknowledged (the client sends it again)."""
        try:
            await self.service.retained.retain(r.event)
        except HubbubError as exc:
            log.info("mqtt retained entry not stored: %s", exc, extra={"session": self.session.id})
            self._acks.answer(slot, functools.partial(self.wire.refuse, cmd, exc))
            return
        self._acks.answer(slot, lambda: self.emit(self.conn.published(cmd)))

    def _refused(self, cmd: object, exc: HubbubError) -> Sequence[object]:
        """The core refused ``cmd`` (a publish): a permission drops it, acknowledged; anything else closes the
        connection unacknowledged (the client sends it again)."""
        if isinstance(cmd, mq.MqttPublish):
            if isinstance(exc, AuthError) and exc.code == Disconnect.FORBIDDEN:
                self.service.dropped += 1
                return self.conn.published(cmd)
            if isinstance(exc, LimitExceeded):
                return [a.Close(Disconnect.TRY_AGAIN_LATER, "publish refused")]
        return [a.Close(Disconnect.of(exc.code), "publish failed")]

    def _publish_will(self, will: mq.Will) -> None:
        retained = self.service.retained

        def done(r: AppendResult | HubbubError) -> None:
            if isinstance(r, AppendResult) and will.retain:
                self.service.spawn(_logged(retained.retain(r.event), self.session.id))

        try:
            channel = mq.topic_channel(will.topic, self.service.http.max_channel_bytes)
            self.node.submit(self._request(channel, will.payload, will.qos, will.retain), self.session, done)
        except (AuthError, LimitExceeded, ShuttingDown) as exc:
            log.info("mqtt will not published: %s", exc, extra={"session": self.session.id})

    async def _delivered(self, out: mq.Delivered) -> None:
        if self.durable is not None:
            self.durable.delivered(out.packet_id)
        window, waiting = self.conn.outbound, self._waiting
        while waiting and not window.full:
            head, payload, q, retain = waiting.popleft()
            packet = window.add(head, payload, q, retain)
            assert packet is not None
            self.session.push(packet, is_event=True)

    def qos_packet(self, head: bytes, payload: bytes, qos: int, retain: bool = False) -> bytes:
        """A QoS 1 or 2 delivery's PUBLISH, or ``b""`` when it waits, in order, for room in the window
        (``mqtt.max_inflight``); past ``limits.send_queue`` waiting, the client is a slow consumer."""
        if not self._waiting:
            packet = self.conn.outbound.add(head, payload, qos, retain)
            if packet is not None:
                return packet
        if len(self._waiting) >= self.service.http.send_queue:
            self.session.end(Disconnect.SLOW_CONSUMER)
            return b""
        self._waiting.append((head, payload, qos, retain))
        return b""


class MqttCollector:
    """MQTT on ``/metrics``: ``hubbub_mqtt_sessions`` (accepted connections), ``hubbub_mqtt_inflight``
    (unacknowledged QoS 1/2 deliveries), ``hubbub_mqtt_retained`` (channels with a retained message),
    ``hubbub_mqtt_persistent_sessions``, ``hubbub_mqtt_publishes_dropped`` (publishes the token may not
    make, acknowledged and dropped). Connections, deliveries and bad input are in the per-dialect series
    with the other dialects'."""

    def __init__(self, service: MqttService) -> None:
        self.service = service

    def collect(self) -> Iterator[Any]:
        svc = self.service
        sessions = GaugeMetricFamily("hubbub_mqtt_sessions", "MQTT connections accepted (CONNACK 0)")
        sessions.add_metric([], len(svc.clients.local))
        yield sessions
        inflight = GaugeMetricFamily("hubbub_mqtt_inflight", "MQTT QoS 1/2 deliveries awaiting the client")
        inflight.add_metric([], svc.inflight())
        yield inflight
        retained = GaugeMetricFamily("hubbub_mqtt_retained", "Channels with a retained MQTT message")
        retained.add_metric([], svc.retained.count)
        yield retained
        persistent = GaugeMetricFamily(
            "hubbub_mqtt_persistent_sessions", "MQTT client ids with a persistent session (CleanSession 0)"
        )
        persistent.add_metric([], svc.sessions.count)
        yield persistent
        dropped = CounterMetricFamily(
            "hubbub_mqtt_publishes_dropped", "MQTT publishes refused by permission (acknowledged, not stored)"
        )
        dropped.add_metric([], svc.dropped)
        yield dropped


class _MqttStreams(ServiceStreams[MqttService]):
    """MQTT's side of the byte-stream driver: a connection opens at accept."""

    __slots__ = ()

    dialect = DIALECT
    read_chunk = READ_CHUNK

    def open(self, first: bytes, acc: Accepted) -> MqttWire:
        io = self.io(acc)
        return MqttWire(self.service, send=io.send, send_many=io.send_many, close=io.close, peer=acc.ip)


async def serve_mqtt(
    host: str,
    port: int,
    service: MqttService,
    *,
    first_message_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
    write_timeout: float = WRITE_TIMEOUT_S,
) -> StreamListener:
    """Start the MQTT listener (TLS with ``ssl_context``). Admission and the first-message timeout (the
    CONNECT) are the stream listener's; after it, the keepalive is the connection's."""
    streams = _MqttStreams(service, write_timeout)

    def track(task: asyncio.Task[None]) -> None:
        service.connections.add(task)
        task.add_done_callback(service.connections.discard)

    return await listen_streams(
        service.node,
        DIALECT,
        streams,
        host,
        port,
        track,
        first_message_timeout_s=first_message_timeout_s,
        ssl_context=ssl_context,
    )


class MqttMounted(Mounted):
    """MQTT on a node: the ``/mqtt`` WebSocket route, and the TCP listener (``mqtt.tcp_listen``) once the
    HTTP listener is up."""

    def __init__(self, service: MqttService) -> None:
        super().__init__(mq.SPEC, service.install)
        self.service = service

    async def started(self, wiring: Wiring, metrics: CollectorRegistry) -> None:
        cfg, service = wiring.config, self.service
        metrics.register(MqttCollector(service))
        wiring.node.metrics.before_scrape.append(service.recount)

        async def start(host: str, port: int) -> StreamListener:
            return await serve_mqtt(
                host,
                port,
                service,
                first_message_timeout_s=cfg.tcp.first_message_timeout_s,
                ssl_context=wiring.ssl_context,
                write_timeout=cfg.limits.write_timeout_s,
            )

        await self.listen("mqtt", "mqtt.tcp_listen", wiring, start)

    def connections(self) -> Iterable[asyncio.Task[None]]:
        return [*self.service.connections, *self.service.tasks]

    def close(self) -> None:
        self.service.clients.close()


async def mount(w: Wiring) -> Mounted:
    """MQTT's binding (``mqtt.SPEC``): its settings from the ``mqtt`` section; the retained index and the
    persistent sessions of earlier versions' files moved into the log (``mqtt_store.migrate``)."""
    cfg = w.config.section(mq.MqttConfig)
    settings = MqttSettings(auth=w.auth("mqtt"), max_qos=cfg.max_qos, max_inflight=cfg.max_inflight)
    await migrate(w.node, w.config.storage.data_dir)
    service = MqttService(w.node, w.consumers, settings, w.http)
    await service.recount()
    return MqttMounted(service)


async def _logged(coro: Awaitable[None], session: str) -> None:
    """A retained will's entry: a failure is logged (the connection is gone: nobody to tell)."""
    try:
        await coro
    except HubbubError as exc:
        log.info("mqtt retained will entry not stored: %s", exc, extra={"session": session})
