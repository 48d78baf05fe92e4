"""MQTT 3.1.1 (OASIS standard; docs/dialects/mqtt.md): the connection's state machine, sans-I/O.

:class:`MqttConnection` is fed the bytes of one connection (TCP, TLS, or the binary frames of the ``/mqtt``
WebSocket, which carry the same stream) and returns actions (:mod:`hubbub.dialects.actions` and this
module's own), carried out in order by its binding in ``hubbub.transports``. The packets are
:mod:`~hubbub.dialects.mqtt_codec`'s, the topic mapping :mod:`~hubbub.dialects.mqtt_topics`', the outbound
packet identifiers :mod:`~hubbub.dialects.mqtt_inflight`'s.

Legal transitions (any packet a state does not list closes the connection [MQTT-4.8.0-1], as does a
malformed one, a protocol violation or a packet over ``max_packet``)::

    state          input                                next state     outputs
    -----          -----                                ----------     -------
    AWAIT_CONNECT  CONNECT, protocol MQTT level 4       CONNECTING     ConnectRequest
    AWAIT_CONNECT  CONNECT, MQTT (or MQIsdp) other lvl  CLOSED         CONNACK 1, Close
    AWAIT_CONNECT  CONNECT, empty id, CleanSession 0    CLOSED         CONNACK 2, Close
    AWAIT_CONNECT  CONNECT, another protocol name       CLOSED         Close (no CONNACK [MQTT-3.1.2-1])
    CONNECTING     accept(session_present)              CONNECTED      CONNACK 0, then the packets that waited
    CONNECTING     refuse(code)                         CLOSED         CONNACK code, Close
    CONNECTED      PUBLISH                              CONNECTED      MqttPublish (QoS 2: once per id)
    CONNECTED      PUBREL                               CONNECTED      PUBCOMP
    CONNECTED      PUBACK / PUBREC / PUBCOMP            CONNECTED      PUBREL to PUBREC; Delivered at the end
    CONNECTED      SUBSCRIBE                            CONNECTED      MqttSubscribe (SUBACK by subscribed())
    CONNECTED      UNSUBSCRIBE                          CONNECTED      Unsubscribe per filter held, UNSUBACK
    CONNECTED      PINGREQ                              CONNECTED      PINGRESP
    CONNECTED      DISCONNECT                           CLOSED         Close (the will is dropped)

Invariants:

* Reading pauses from CONNECT until the binding has checked it (credentials, the session): packets the
  client pipelined behind it wait in the reader, at most ``max_packet`` bytes past what the CONNECT's read
  brought, and are handled after the CONNACK, whatever way the bytes were cut.
* A QoS 1 or 2 PUBLISH is acknowledged (PUBACK, PUBREC) only by :meth:`MqttConnection.published`, which the
  binding calls once the event is committed (or refused by permission: dropped, still acknowledged, as
  3.1.1 has no negative acknowledgement). A QoS 2 identifier stays in use from PUBLISH to PUBREL, and a
  PUBLISH again with it is not published again [MQTT-4.3.3-2].
* ``subscriptions`` holds each filter the core holds for this connection, by its text (the core
  subscription's id), with its granted QoS; a SUBSCRIBE of a filter held already replaces its QoS
  [MQTT-3.8.4-3].
* ``will`` is the CONNECT's will until a DISCONNECT drops it [MQTT-3.1.2-10]: the binding publishes what is
  left when the connection ends.

Concurrency contract: a connection object belongs to one connection and is called from one thread.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

from hubbub.channels import MAX_CHANNEL_BYTES, Pattern
from hubbub.config import Config, ConfigError, DialectSection, listen_field, parse_listen
from hubbub.disconnect import Disconnect
from hubbub.errors import BadChannel, FrameTooLarge, HubbubError
from hubbub.events import Event

from .actions import Close, Send, Unsubscribe
from .mqtt_codec import (
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Ack,
    Connect,
    Empty,
    Packet,
    PacketReader,
    PublishPacket,
    SubscribePacket,
    UnsubscribePacket,
    Will,
    encode_ack,
    encode_connack,
    encode_publish,
    encode_suback,
    publish_head,
)
from .mqtt_inflight import DEFAULT_MAX_INFLIGHT, Outbound
from .mqtt_topics import (
    channel_topic,
    filter_applies,
    filter_pattern,
    topic_channel,
    valid_filter,
    valid_topic_name,
)
from .spec import DialectSpec

__all__ = [
    "ACCEPTED",
    "BAD_CREDENTIALS",
    "CONTENT_TYPE",
    "IDENTIFIER_REJECTED",
    "NOT_AUTHORIZED",
    "QOS_HEADER",
    "RETAIN_HEADER",
    "SERVER_UNAVAILABLE",
    "SPEC",
    "UNACCEPTABLE_PROTOCOL",
    "ConnectRequest",
    "Delivered",
    "FilterRequest",
    "MqttConfig",
    "MqttConnection",
    "MqttPublish",
    "MqttSubscribe",
    "Outbound",
    "State",
    "Will",
    "channel_topic",
    "encode_publish",
    "event_qos",
    "filter_applies",
    "filter_pattern",
    "publish_head",
    "render_event",
    "topic_channel",
    "valid_filter",
    "valid_topic_name",
]

# CONNACK return codes (§3.2.2.3).
ACCEPTED: Final = 0
UNACCEPTABLE_PROTOCOL: Final = 1
IDENTIFIER_REJECTED: Final = 2
SERVER_UNAVAILABLE: Final = 3
BAD_CREDENTIALS: Final = 4
NOT_AUTHORIZED: Final = 5
#: SUBACK's failure return code.
SUBACK_FAILURE: Final = 0x80

#: MQTT payloads have no type (3.1.1): stored as bytes.
CONTENT_TYPE: Final = "application/octet-stream"
#: The pseudo-header (mapping.md §6) of an MQTT publish's QoS ("0", "1" or "2"; absent: another dialect's).
QOS_HEADER: Final = ":mqtt.qos"
#: The pseudo-header of a retained publish ("1").
RETAIN_HEADER: Final = ":mqtt.retain"
#: The QoS an event of another dialect is delivered at, at most (hubbub commits it before delivery, as an
#: MQTT server does a QoS 1 message).
FOREIGN_QOS: Final = 1


def event_qos(headers: Mapping[str, str]) -> int:
    """The QoS of an event for delivery: its MQTT publish's, or :data:`FOREIGN_QOS` for another dialect's."""
    q = headers.get(QOS_HEADER)
    if q is None:
        return FOREIGN_QOS
    return 2 if q == "2" else 1 if q == "1" else 0


class State(enum.Enum):
    AWAIT_CONNECT = "await_connect"
    CONNECTING = "connecting"
    CONNECTED = "connected"
    CLOSED = "closed"


#: The packet types a client may send in each state (see the module docstring's table).
ACCEPTS: Final[dict[State, frozenset[int]]] = {
    State.AWAIT_CONNECT: frozenset({CONNECT}),
    State.CONNECTING: frozenset(),  # reading is paused until the CONNECT is answered
    State.CONNECTED: frozenset(
        {PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT}
    ),
    State.CLOSED: frozenset(),
}


# -- this dialect's actions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """A well-formed CONNECT for the binding to check: credentials (``password`` is the token; a user
    name alone is one too), the client id (empty: the binding assigns one), the session. Answered with
    :meth:`MqttConnection.accept` or :meth:`MqttConnection.refuse`."""

    client_id: str
    clean_session: bool
    keepalive: int
    username: str | None
    password: bytes | None
    will: Will | None


@dataclass(frozen=True, slots=True)
class MqttPublish:
    """Store a PUBLISH on ``channel``; once committed, :meth:`MqttConnection.published` acknowledges it."""

    channel: str
    payload: bytes
    qos: int
    retain: bool
    packet_id: int


@dataclass(frozen=True, slots=True)
class Delivered:
    """The client acknowledged the delivery ``packet_id`` to the end (PUBACK, or PUBCOMP at QoS 2)."""

    packet_id: int


@dataclass(frozen=True, slots=True)
class FilterRequest:
    """One filter of a SUBSCRIBE: its text (the core subscription's id), its pattern (None past the channel
    length limit: refused), the QoS granted."""

    topic_filter: str
    pattern: Pattern | None
    qos: int


@dataclass(frozen=True, slots=True)
class MqttSubscribe:
    """Subscribe to each filter not held yet, then answer :meth:`MqttConnection.subscribed`."""

    packet_id: int
    filters: tuple[FilterRequest, ...]


def _kind(p: Packet) -> int:
    if isinstance(p, PublishPacket):
        return PUBLISH
    if isinstance(p, Ack | Empty):
        return p.kind
    if isinstance(p, Connect):
        return CONNECT
    if isinstance(p, SubscribePacket):
        return SUBSCRIBE
    if isinstance(p, UnsubscribePacket):
        return UNSUBSCRIBE
    return 0  # a server's packet (CONNACK, SUBACK): never accepted from a client


class MqttConnection:
    """One MQTT connection; see the module docstring.

    ``max_packet`` bounds a packet's remaining length (``limits.max_frame``); ``max_qos`` is the highest QoS
    granted to a subscription; ``max_channel_bytes`` bounds a topic's channel; ``max_inflight`` the
    deliveries awaiting the client's acknowledgement (``outbound``)."""

    def __init__(
        self,
        *,
        max_packet: int = 1 << 20,
        max_qos: int = 2,
        max_channel_bytes: int = MAX_CHANNEL_BYTES,
        max_inflight: int = DEFAULT_MAX_INFLIGHT,
    ) -> None:
        self._reader = PacketReader(max_packet)
        self.max_packet = max_packet
        self.max_qos = max_qos
        self.max_channel_bytes = max_channel_bytes
        self.state = State.AWAIT_CONNECT
        #: Complete packets received (the listener's first-message deadline ends at the first).
        self.messages = 0
        #: The CONNECT's keepalive in seconds (0: none); the binding closes after 1.5 times it in silence.
        self.keepalive = 0
        self.client_id = ""
        self.clean_session = True
        self.will: Will | None = None
        #: Filters held, by text, with their granted QoS.
        self.subscriptions: dict[str, int] = {}
        #: Filters of SUBSCRIBEs not yet answered (:meth:`subscribed`), by text: how many requests each, and
        #: how many of those an UNSUBSCRIBE read since then cancels (a client may pipeline both; the binding
        #: carries out the subscribe, then the unsubscribe, so the filter must not be kept once answered).
        self._asked: dict[str, int] = {}
        self._cancelled: dict[str, int] = {}
        #: QoS 2 identifiers from PUBLISH to PUBREL, each True once committed (its PUBREC sent).
        self.qos2_in: dict[int, bool] = {}
        #: Copies of a QoS 2 PUBLISH read before the original was committed, per identifier: each is owed
        #: a PUBREC, sent with the original's (so the replies do not depend on how the reads were cut).
        self._qos2_owed: dict[int, int] = {}
        self.outbound = Outbound(max_inflight)
        #: While a SUBSCRIBE reads its retained messages the second time: channel → ``(epoch, seq)`` of the
        #: last event rendered for this connection since its filters were registered (the binding notes
        #: them, live or from a persistent session's consumers); else None.
        self.rendered: dict[str, tuple[str, int]] | None = None
        self._pause_limit = 0
        #: Why the connection closed, for the server's log.
        self.close_reason = ""

    # -- input ----------------------------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        return self._reader.buffered

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[object]:
        """Bytes from the peer; the actions of every packet they complete, in order (none past a CONNECT
        until :meth:`accept`)."""
        if self.state is State.CLOSED:
            return []
        self._reader.feed(data)
        if self.state is State.CONNECTING:
            if self._reader.buffered > self._pause_limit:
                return self._fail(Disconnect.FRAME_TOO_LARGE, "pipelined past a pending CONNECT")
            return []
        return self._run()

    def receive_frame(self, frame: bytes | str, binary: bool = False) -> list[object]:
        """A WebSocket frame: binary, part of the byte stream (a text frame closes [MQTT-6.0.0-1])."""
        if isinstance(frame, str) or not binary:
            return self._fail(Disconnect.UNSUPPORTED_DATA, "text frame")
        return self.receive_data(frame)

    def _run(self) -> list[object]:
        out: list[object] = []
        reader = self._reader
        while self.state is State.CONNECTED or self.state is State.AWAIT_CONNECT:
            try:
                packet = reader.next()
            except FrameTooLarge as exc:
                return out + self._fail(Disconnect.FRAME_TOO_LARGE, str(exc))
            except HubbubError as exc:
                return out + self._fail(Disconnect.PROTOCOL_ERROR, str(exc))
            if packet is None:
                break
            self.messages += 1
            kind = _kind(packet)
            if kind not in ACCEPTS[self.state]:
                return out + self._fail(
                    Disconnect.PROTOCOL_ERROR, f"packet type {kind} in {self.state.value}"
                )
            out += self._handle(packet)
        return out

    def _fail(self, code: Disconnect, why: str) -> list[object]:
        self.state = State.CLOSED
        self.close_reason = why
        return [Close(code, why)]

    def _handle(self, p: Packet) -> list[object]:
        if isinstance(p, PublishPacket):
            return self._publish(p)
        if isinstance(p, Ack):
            if p.kind == PUBREL:
                self.qos2_in.pop(p.packet_id, None)
                self._qos2_owed.pop(p.packet_id, None)
                return [Send(encode_ack(PUBCOMP, p.packet_id))]
            rel, done = self.outbound.acked(p.kind, p.packet_id)
            out: list[object] = [Send(rel)] if rel is not None else []
            if done:
                out.append(Delivered(p.packet_id))
            return out
        if isinstance(p, SubscribePacket):
            return self._subscribe(p)
        if isinstance(p, UnsubscribePacket):
            return self._unsubscribe(p)
        if isinstance(p, Connect):
            return self._connect(p)
        assert isinstance(p, Empty)
        if p.kind == PINGREQ:
            return [Send(bytes((PINGRESP << 4, 0)))]
        self.will = None  # DISCONNECT: a clean end, no will [MQTT-3.14.4-3]
        return self._fail(Disconnect.NORMAL, "DISCONNECT")

    def _connect(self, p: Connect) -> list[object]:
        if p.protocol not in ("MQTT", "MQIsdp"):
            return self._fail(Disconnect.PROTOCOL_ERROR, "not the MQTT protocol")
        if p.protocol != "MQTT" or p.level != 4:
            refusal = Send(encode_connack(False, UNACCEPTABLE_PROTOCOL))
            return [refusal, *self._fail(Disconnect.UNSUPPORTED_VERSION, f"protocol level {p.level}")]
        if not p.client_id and not p.clean_session:
            refusal = Send(encode_connack(False, IDENTIFIER_REJECTED))
            return [refusal, *self._fail(Disconnect.POLICY_VIOLATION, "empty client id, no clean session")]
        if p.will is not None:
            if not valid_topic_name(p.will.topic):
                return self._fail(Disconnect.PROTOCOL_ERROR, "bad will topic")
            try:
                topic_channel(p.will.topic, self.max_channel_bytes)
            except BadChannel:
                return self._fail(Disconnect.PROTOCOL_ERROR, "will topic too long")
        self.state = State.CONNECTING
        self._pause_limit = self._reader.buffered + self.max_packet
        self.client_id = p.client_id
        self.clean_session = p.clean_session
        self.keepalive = p.keepalive
        self.will = p.will
        return [ConnectRequest(p.client_id, p.clean_session, p.keepalive, p.username, p.password, p.will)]

    def accept(self, session_present: bool = False, client_id: str | None = None) -> list[object]:
        """The binding accepted the CONNECT (``client_id``: the one it assigned to an empty id): the CONNACK,
        then the actions of the packets that waited."""
        if self.state is not State.CONNECTING:
            return []
        if client_id is not None:
            self.client_id = client_id
        self.state = State.CONNECTED
        return [Send(encode_connack(session_present, ACCEPTED)), *self._run()]

    def refuse(self, code: int) -> list[object]:
        """The binding refused the CONNECT with return ``code`` (2-5): the CONNACK, and the close."""
        if self.state is not State.CONNECTING:
            return []
        self.will = None
        why = Disconnect.POLICY_VIOLATION if code != SERVER_UNAVAILABLE else Disconnect.TRY_AGAIN_LATER
        return [Send(encode_connack(False, code)), *self._fail(why, f"CONNECT refused ({code})")]

    def _publish(self, p: PublishPacket) -> list[object]:
        if not valid_topic_name(p.topic):
            return self._fail(Disconnect.PROTOCOL_ERROR, "bad topic name")
        try:
            channel = topic_channel(p.topic, self.max_channel_bytes)
        except BadChannel:
            return self._fail(Disconnect.PROTOCOL_ERROR, "topic name too long")
        if p.qos == 2:
            committed = self.qos2_in.get(p.packet_id)
            if committed is not None:  # a duplicate: published once [MQTT-4.3.3-2]
                if committed:
                    return [Send(encode_ack(PUBREC, p.packet_id))]
                self._qos2_owed[p.packet_id] = self._qos2_owed.get(p.packet_id, 0) + 1
                return []
            self.qos2_in[p.packet_id] = False
        return [MqttPublish(channel, p.payload, p.qos, p.retain, p.packet_id)]

    def published(self, cmd: MqttPublish) -> list[object]:
        """``cmd`` is committed (or dropped by permission): its acknowledgement (also once the connection is
        closing: its binding drops what comes after the close)."""
        if cmd.qos == 1:
            return [Send(encode_ack(PUBACK, cmd.packet_id))]
        if cmd.qos == 2 and cmd.packet_id in self.qos2_in:
            self.qos2_in[cmd.packet_id] = True
            return [Send(encode_ack(PUBREC, cmd.packet_id))] * (1 + self._qos2_owed.pop(cmd.packet_id, 0))
        return []

    def _subscribe(self, p: SubscribePacket) -> list[object]:
        reqs: list[FilterRequest] = []
        for text, qos in p.filters:
            if not valid_filter(text):
                return self._fail(Disconnect.PROTOCOL_ERROR, "bad topic filter")
            try:
                pattern: Pattern | None = filter_pattern(text, self.max_channel_bytes)
            except BadChannel:
                pattern = None
            reqs.append(FilterRequest(text, pattern, min(qos, self.max_qos)))
        for req in reqs:
            self._asked[req.topic_filter] = self._asked.get(req.topic_filter, 0) + 1
        return [MqttSubscribe(p.packet_id, tuple(reqs))]

    def subscribed(self, cmd: MqttSubscribe, held: Sequence[bool]) -> list[object]:
        """The core holds each filter of ``cmd`` whose ``held`` is true (refused otherwise): the SUBACK."""
        codes: list[int] = []
        asked, cancelled = self._asked, self._cancelled
        for req, ok in zip(cmd.filters, held, strict=True):
            f = req.topic_filter
            if asked.get(f, 0) > 1:
                asked[f] -= 1
            else:
                asked.pop(f, None)
            if cancelled.get(f):
                # Unsubscribed after this request, before its answer: granted, then dropped (the binding
                # has carried out the UNSUBSCRIBE's Unsubscribe after this subscribe).
                cancelled[f] -= 1
                if not cancelled[f]:
                    del cancelled[f]
                codes.append(req.qos if ok else SUBACK_FAILURE)
                continue
            if ok:
                self.subscriptions[f] = req.qos
                codes.append(req.qos)
            else:
                codes.append(SUBACK_FAILURE)
        return [Send(encode_suback(cmd.packet_id, codes))]

    def _unsubscribe(self, p: UnsubscribePacket) -> list[object]:
        out: list[object] = []
        for text in p.filters:
            if not valid_filter(text):
                return self._fail(Disconnect.PROTOCOL_ERROR, "bad topic filter")
            held = self.subscriptions.pop(text, None) is not None
            # A SUBSCRIBE of this filter still unanswered comes before this UNSUBSCRIBE: cancel it too.
            pending = self._asked.get(text, 0)
            if pending:
                self._cancelled[text] = pending
            if held or pending:
                out.append(Unsubscribe(text))
        out.append(Send(encode_ack(UNSUBACK, p.packet_id)))
        return out

    # -- deliveries -----------------------------------------------------------------------------------------

    def delivery_qos(self, channel: str, subs: Sequence[str]) -> int | None:
        """The QoS of a delivery on ``channel`` matched by the subscriptions ``subs``: the highest granted of
        those that apply (one delivery for overlapping filters, §3.3.5), None when none does."""
        best: int | None = None
        granted = self.subscriptions
        for f in subs:
            q = granted.get(f)
            if q is not None and (best is None or q > best) and filter_applies(f, channel):
                best = q
        return best


def render_event(event: Event, granted: int = 2, packet_id: int = 1, retain: bool = False) -> bytes:
    """An event as one PUBLISH (at ``min(granted, its QoS)``, with ``packet_id`` at QoS 1 or 2), or ``b""``
    for the root, which has no topic name. (Deliveries render through the connection's window; this is the
    same packet, for tests and fuzzing.)"""
    topic = channel_topic(event.channel)
    if topic is None:
        return b""
    q = min(granted, event_qos(event.headers))
    return encode_publish(topic, event.payload, q, retain, False, packet_id if q else 0)


def _close_code(reason: Disconnect) -> Disconnect:
    """What a WebSocket peer sees: MQTT has no close codes of its own, so bad input is a protocol error and
    everything else a normal close or the standard code."""
    if reason >= 4000:
        return Disconnect.PROTOCOL_ERROR if not reason.temporary else Disconnect.TRY_AGAIN_LATER
    return reason


@dataclass(frozen=True, slots=True)
class MqttConfig(DialectSection):
    """MQTT's configuration section (docs/dialects/mqtt.md)."""

    SECTION: ClassVar[str] = "mqtt"
    HELP: ClassVar[Mapping[str, str]] = {
        "enabled": "serve MQTT 3.1.1: the TCP listener and WebSocket /mqtt (true/false)",
        "tcp_listen": "HOST:PORT of the MQTT listener (TLS with tls.cert and tls.key, as every listener)",
        "max_qos": "the highest QoS granted an MQTT subscription (0, 1 or 2)",
        "max_inflight": "unacknowledged QoS 1/2 deliveries per MQTT connection before it is a slow consumer",
        "auth": "auth for MQTT (TCP and WebSocket; the password is the token); empty means auth.mode",
    }
    enabled: bool = True
    tcp_listen: str = listen_field("127.0.0.1:1883")  # IANA's MQTT port
    max_qos: int = 2
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    auth: str = ""  # "" means auth.mode

    def validate(self, config: Config) -> None:
        DialectSection.validate(self, config)
        parse_listen(self.tcp_listen, "mqtt.tcp_listen")
        if self.max_qos not in (0, 1, 2):
            raise ConfigError("mqtt.max_qos: must be 0, 1 or 2")
        if not 1 <= self.max_inflight <= 65_535:
            raise ConfigError("mqtt.max_inflight: must be 1 to 65535")


SPEC: Final = DialectSpec(
    name="mqtt",
    section="mqtt",
    config=MqttConfig,
    ws_routes=("/mqtt",),
    stream_listeners=("mqtt.tcp_listen",),
    overflow="disconnect",  # a QoS 1/2 delivery has an identifier from the moment it is queued
    close_code=_close_code,
    text=False,
    keepalive=False,  # MQTT's own keepalive (PINGREQ) is the binding's
    binding="hubbub.transports.mqtt:mount",
)
