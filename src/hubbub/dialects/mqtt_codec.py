"""MQTT 3.1.1 control packets (OASIS MQTT Version 3.1.1, chapters 2 and 3): values, a bounded incremental
reader and the encoders.

A packet is a frozen, slotted dataclass (:class:`Connect`, :class:`PublishPacket`, ...). The
:class:`PacketReader` is fed bytes cut anywhere and hands back whole packets; every rule of the standard's
packet formats is checked here, so what it returns is well formed:

* the fixed header: a reserved packet type (0, 15) is malformed; the flags of every type but PUBLISH are
  fixed (PUBREL, SUBSCRIBE and UNSUBSCRIBE ``0010``, the rest ``0000``, [MQTT-2.2.2-1/2]); a PUBLISH with
  QoS 3 is malformed [MQTT-3.3.1-4], a QoS 0 PUBLISH with DUP set a protocol violation [MQTT-3.3.1-2];
* the remaining length: at most four bytes [MQTT-2.2.3], its value at most ``max_packet`` (a bound of the
  reader, checked before the body is buffered: :class:`~hubbub.errors.FrameTooLarge`), and each packet's
  fields must fill it exactly;
* UTF-8 strings: valid UTF-8 without U+0000 [MQTT-1.5.3-1/2] (surrogates are not valid UTF-8);
* packet identifiers are non-zero where present [MQTT-2.3.1-1];
* CONNECT's flags: the reserved bit is 0 [MQTT-3.1.2-3]; without a will its QoS and retain bits are 0
  [MQTT-3.1.2-11/13/15], a will QoS is 0-2 [MQTT-3.1.2-14]; a password needs a user name [MQTT-3.1.2-22];
* SUBSCRIBE carries at least one filter [MQTT-3.8.3-3], each requested QoS byte 0-2 with its reserved bits
  0 [MQTT-3-8.3-4]; UNSUBSCRIBE at least one filter [MQTT-3.10.3-2].

A malformed packet raises :class:`~hubbub.errors.BadFrame`, a protocol violation
:class:`~hubbub.errors.BadRequest`, a packet over ``max_packet`` :class:`~hubbub.errors.FrameTooLarge`: the
connection closes on each ([MQTT-4.8.0-1]). What a packet means in the connection's state (CONNECT first and
once, topic names and filters, the protocol name and level) is the connection's to judge
(:mod:`hubbub.dialects.mqtt`).

Concurrency contract: a :class:`PacketReader` belongs to one connection and is called from one thread; the
encoders and packet values are pure and thread-safe.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final, TypeAlias

from hubbub.errors import BadFrame, BadRequest, FrameTooLarge

__all__ = [
    "CONNACK",
    "CONNECT",
    "DISCONNECT",
    "MAX_REMAINING",
    "PINGREQ",
    "PINGRESP",
    "PUBACK",
    "PUBCOMP",
    "PUBLISH",
    "PUBREC",
    "PUBREL",
    "SUBACK",
    "SUBSCRIBE",
    "UNSUBACK",
    "UNSUBSCRIBE",
    "Ack",
    "Connack",
    "Connect",
    "Empty",
    "Packet",
    "PacketReader",
    "PublishPacket",
    "Suback",
    "SubscribePacket",
    "UnsubscribePacket",
    "Will",
    "encode_ack",
    "encode_connack",
    "encode_connect",
    "encode_publish",
    "encode_suback",
    "encode_subscribe",
    "encode_unsubscribe",
    "publish_head",
    "remaining_length",
]

# Control packet types (§2.2.1).
CONNECT: Final = 1
CONNACK: Final = 2
PUBLISH: Final = 3
PUBACK: Final = 4
PUBREC: Final = 5
PUBREL: Final = 6
PUBCOMP: Final = 7
SUBSCRIBE: Final = 8
SUBACK: Final = 9
UNSUBSCRIBE: Final = 10
UNSUBACK: Final = 11
PINGREQ: Final = 12
PINGRESP: Final = 13
DISCONNECT: Final = 14

#: The largest remaining length four bytes can say (§2.2.3).
MAX_REMAINING: Final = 268_435_455

#: The fixed flags of every type but PUBLISH (§2.2.2, table 2.2).
_FLAGS: Final[dict[int, int]] = {
    CONNECT: 0, CONNACK: 0, PUBACK: 0, PUBREC: 0, PUBREL: 2, PUBCOMP: 0, SUBSCRIBE: 2, SUBACK: 0,
    UNSUBSCRIBE: 2, UNSUBACK: 0, PINGREQ: 0, PINGRESP: 0, DISCONNECT: 0,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Will:
    """A CONNECT's will message: published for the client when its connection ends abnormally (§3.1.2.5)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT (§3.1). ``protocol`` and ``level`` as sent (the connection checks them: ``MQTT``, 4)."""

    protocol: str
    level: int
    client_id: str
    clean_session: bool
    keepalive: int
    will: Will | None = None
    username: str | None = None
    password: bytes | None = None


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK (§3.2): the session-present flag and the return code (0 accepted, 1-5 refused)."""

    session_present: bool
    code: int


@dataclass(frozen=True, slots=True)
class PublishPacket:
    """PUBLISH (§3.3). ``packet_id`` is 0 at QoS 0 (no identifier on the wire)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int = 0


@dataclass(frozen=True, slots=True)
class Ack:
    """PUBACK, PUBREC, PUBREL, PUBCOMP or UNSUBACK: a type and a packet identifier."""

    kind: int
    packet_id: int


@dataclass(frozen=True, slots=True)
class SubscribePacket:
    """SUBSCRIBE (§3.8): the filters, each with its requested QoS, in order."""

    packet_id: int
    filters: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Suback:
    """SUBACK (§3.9): a return code per filter (0-2 the granted QoS, 0x80 failure)."""

    packet_id: int
    codes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UnsubscribePacket:
    """UNSUBSCRIBE (§3.10)."""

    packet_id: int
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Empty:
    """PINGREQ, PINGRESP or DISCONNECT: a type and nothing else."""

    kind: int


Packet: TypeAlias = (
    Connect | Connack | PublishPacket | Ack | SubscribePacket | Suback | UnsubscribePacket | Empty
)


# -- reading ------------------------------------------------------------------------------------------------


class _Body:
    """A cursor over one packet's variable header and payload; every read is checked against its end."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int) -> bytes:
        if n > self.left:
            raise BadFrame("packet shorter than its fields")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        hi, lo = self.take(2)
        return hi << 8 | lo

    def binary(self) -> bytes:
        return self.take(self.u16())

    def text(self) -> str:
        raw = self.binary()
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadFrame("string is not valid UTF-8") from None
        if "\x00" in s:
            raise BadFrame("string contains U+0000")
        return s

    def packet_id(self) -> int:
        pid = self.u16()
        if pid == 0:
            raise BadRequest("packet identifier 0")
        return pid

    def end(self) -> None:
        if self.left:
            raise BadFrame("bytes after the packet's fields")


def _connect(b: _Body) -> Connect:
    protocol = b.text()
    level = b.byte()
    flags = b.byte()
    keepalive = b.u16()
    if flags & 0x01:
        raise BadFrame("CONNECT reserved flag set")
    will_flag, will_qos, will_retain = bool(flags & 0x04), (flags >> 3) & 3, bool(flags & 0x20)
    has_user, has_password = bool(flags & 0x80), bool(flags & 0x40)
    if will_qos == 3:
        raise BadFrame("will QoS 3")
    if not will_flag and (will_qos or will_retain):
        raise BadFrame("will QoS or retain without a will")
    if has_password and not has_user:
        raise BadFrame("password without a user name")
    client_id = b.text()
    will = Will(b.text(), b.binary(), will_qos, will_retain) if will_flag else None
    username = b.text() if has_user else None
    password = b.binary() if has_password else None
    b.end()
    return Connect(protocol, level, client_id, bool(flags & 0x02), keepalive, will, username, password)


def _publish(flags: int, b: _Body) -> PublishPacket:
    qos = (flags >> 1) & 3
    if qos == 3:
        raise BadFrame("PUBLISH QoS 3")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise BadRequest("DUP set on a QoS 0 PUBLISH")
    topic = b.text()
    pid = b.packet_id() if qos else 0
    return PublishPacket(topic, b.take(b.left), qos, bool(flags & 0x01), dup, pid)


def _subscribe(b: _Body) -> SubscribePacket:
    pid = b.packet_id()
    filters: list[tuple[str, int]] = []
    while b.left:
        f = b.text()
        q = b.byte()
        if q > 2:
            raise BadFrame("requested QoS over 2 or reserved bits set")
        filters.append((f, q))
    if not filters:
        raise BadRequest("SUBSCRIBE without a topic filter")
    return SubscribePacket(pid, tuple(filters))


def _unsubscribe(b: _Body) -> UnsubscribePacket:
    pid = b.packet_id()
    filters: list[str] = []
    while b.left:
        filters.append(b.text())
    if not filters:
        raise BadRequest("UNSUBSCRIBE without a topic filter")
    return UnsubscribePacket(pid, tuple(filters))


def _decode(kind: int, flags: int, body: bytes) -> Packet:
    """One packet from its type, flags and body (fixed flags already checked)."""
    b = _Body(body)
    if kind == PUBLISH:
        return _publish(flags, b)
    out: Packet
    if kind == CONNECT:
        return _connect(b)
    if kind in (PUBACK, PUBREC, PUBREL, PUBCOMP, UNSUBACK):
        out = Ack(kind, b.packet_id())
    elif kind == SUBSCRIBE:
        return _subscribe(b)
    elif kind == UNSUBSCRIBE:
        return _unsubscribe(b)
    elif kind == CONNACK:
        ack_flags = b.byte()
        if ack_flags & 0xFE:
            raise BadFrame("CONNACK reserved flags set")
        out = Connack(bool(ack_flags), b.byte())
    elif kind == SUBACK:
        pid = b.packet_id()
        codes = tuple(b.take(b.left))
        if not codes or any(c not in (0, 1, 2, 0x80) for c in codes):
            raise BadFrame("bad SUBACK return codes")
        out = Suback(pid, codes)
    else:  # PINGREQ, PINGRESP, DISCONNECT
        out = Empty(kind)
    b.end()
    return out


class PacketReader:
    """Whole packets from a byte stream cut anywhere; at most ``max_packet`` bytes of remaining length per
    packet (so at most ``max_packet + 5`` bytes wait in the buffer). After an error the reader is spent: the
    connection closes."""

    __slots__ = ("_buf", "max_packet")

    def __init__(self, max_packet: int = 1 << 20) -> None:
        self.max_packet = max_packet
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def next(self) -> Packet | None:
        """The next whole packet, or None while its bytes have not all come. Raises ``BadFrame``,
        ``BadRequest`` or ``FrameTooLarge`` (see the module docstring)."""
        buf = self._buf
        if not buf:
            return None
        first = buf[0]
        kind, flags = first >> 4, first & 0x0F
        if kind in (0, 15):
            raise BadFrame("reserved packet type")
        if kind != PUBLISH and flags != _FLAGS[kind]:
            raise BadFrame("bad fixed header flags")
        length, mult, i = 0, 1, 1
        while True:
            if i >= len(buf):
                return None
            if i == 5:
                raise BadFrame("remaining length over four bytes")
            digit = buf[i]
            length += (digit & 0x7F) * mult
            mult <<= 7
            i += 1
            if not digit & 0x80:
                break
        if length > self.max_packet:
            raise FrameTooLarge(f"packet over {self.max_packet} bytes")
        if len(buf) < i + length:
            return None
        body = bytes(buf[i : i + length])
        del buf[: i + length]
        return _decode(kind, flags, body)


# -- writing ------------------------------------------------------------------------------------------------


def remaining_length(n: int) -> bytes:
    """The variable-length encoding of ``n`` (§2.2.3)."""
    if not 0 <= n <= MAX_REMAINING:
        raise ValueError("remaining length out of range")
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | 0x80 if n else digit)
        if not n:
            return bytes(out)


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def _str(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack(">H", len(raw)) + raw


def _bin(b: bytes) -> bytes:
    return struct.pack(">H", len(b)) + b


def encode_connack(session_present: bool, code: int) -> bytes:
    return bytes((CONNACK << 4, 2, 1 if session_present else 0, code))


def encode_ack(kind: int, packet_id: int) -> bytes:
    """PUBACK, PUBREC, PUBREL (its flags ``0010``), PUBCOMP or UNSUBACK."""
    return bytes((kind << 4 | _FLAGS[kind], 2, packet_id >> 8, packet_id & 0xFF))


def encode_suback(packet_id: int, codes: tuple[int, ...] | list[int]) -> bytes:
    return _packet(SUBACK << 4, struct.pack(">H", packet_id) + bytes(codes))


def publish_head(topic: str) -> bytes:
    """A PUBLISH's topic field, encoded once per event and shared by every delivery of it."""
    return _str(topic)


def encode_publish(
    topic: str | bytes,
    payload: bytes,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int = 0,
) -> bytes:
    """A PUBLISH; ``topic`` may be the :func:`publish_head` of an event, encoded already."""
    head = publish_head(topic) if isinstance(topic, str) else topic
    pid = struct.pack(">H", packet_id) if qos else b""
    first = PUBLISH << 4 | (0x08 if dup else 0) | qos << 1 | (1 if retain else 0)
    return bytes((first,)) + remaining_length(len(head) + len(pid) + len(payload)) + head + pid + payload


def encode_connect(
    client_id: str,
    *,
    clean_session: bool = True,
    keepalive: int = 60,
    will: Will | None = None,
    username: str | None = None,
    password: bytes | None = None,
    protocol: str = "MQTT",
    level: int = 4,
) -> bytes:
    """A CONNECT, as a client sends it (tests, fuzzing)."""
    flags = (0x02 if clean_session else 0) | (0x80 if username is not None else 0)
    flags |= 0x40 if password is not None else 0
    body = _str(protocol) + bytes((level,))
    tail = _str(client_id)
    if will is not None:
        flags |= 0x04 | will.qos << 3 | (0x20 if will.retain else 0)
        tail += _str(will.topic) + _bin(will.payload)
    if username is not None:
        tail += _str(username)
    if password is not None:
        tail += _bin(password)
    return _packet(CONNECT << 4, body + bytes((flags,)) + struct.pack(">H", keepalive) + tail)


def encode_subscribe(packet_id: int, filters: list[tuple[str, int]] | tuple[tuple[str, int], ...]) -> bytes:
    body = struct.pack(">H", packet_id) + b"".join(_str(f) + bytes((q,)) for f, q in filters)
    return _packet(SUBSCRIBE << 4 | 2, body)


def encode_unsubscribe(packet_id: int, filters: list[str] | tuple[str, ...]) -> bytes:
    return _packet(UNSUBSCRIBE << 4 | 2, struct.pack(">H", packet_id) + b"".join(_str(f) for f in filters))
