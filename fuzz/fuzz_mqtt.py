"""The MQTT connection's fuzz properties (docs/dialects/mqtt.md), shared by the atheris target ``mqtt``
(fuzz/atheris_targets.py) and the hypothesis test (tests/property/test_mqtt_stream.py).

:func:`stream_from_bytes` turns arbitrary bytes into a byte stream a client could send: a CONNECT (or not),
then packets of every type with fields picked by the bytes (good and bad topics and filters, every QoS,
packet identifiers 0 and not, fixed-header flags right and wrong, remaining lengths cut short or too long)
and raw garbage. :func:`check_stream` feeds it to a :class:`~hubbub.dialects.mqtt.MqttConnection` whole,
in 7-byte pieces and one byte at a time, answering the connection as a binding does, and asserts:

* parsing does not depend on chunking: the same actions every way (STYLE item 3);
* every ``Send`` is whole server packets (CONNACK, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK,
  PINGRESP) that the codec reads back;
* a ``Close`` is the last action, and nothing is read after it;
* the buffer stays within ``max_packet`` plus a fixed header past what waits.

:func:`check_reader` feeds raw bytes to the :class:`~hubbub.dialects.mqtt_codec.PacketReader`: packets, or a
documented error.
"""

from __future__ import annotations

from hubbub.dialects import mqtt as mq
from hubbub.dialects import mqtt_codec as c
from hubbub.dialects.actions import Close, Send, Unsubscribe
from hubbub.errors import CODES, HubbubError

__all__ = ["check_reader", "check_stream", "stream_from_bytes"]

TOPICS = ("a/b", "a", "/a", "a/", "$SYS/x", "a/+", "#", "a/#", "", "a\x00", "é/ü", "x" * 70, "a//b")
FILTERS = ("a/+", "#", "+", "a/#", "a/#/b", "a#", "+a", "", "$SYS/#", "/", "x" * 70)
MAX_PACKET = 96
SERVER_TYPES = {c.CONNACK, c.PUBACK, c.PUBREC, c.PUBREL, c.PUBCOMP, c.SUBACK, c.UNSUBACK, c.PINGRESP}


def _packet(a: int, b: int, c_: int, rest: bytes) -> bytes:
    kind = a % 12
    pid = (b % 4) * 300 if c_ % 2 else b % 3
    if kind == 0:
        return rest[: c_ % 24]
    if kind == 1:
        will = c.Will(TOPICS[b % len(TOPICS)], b"w", c_ % 3, bool(b & 1)) if a & 16 else None
        return c.encode_connect(
            ("", "id", "x" * 30)[b % 3],
            clean_session=bool(c_ & 1),
            keepalive=c_,
            will=will,
            username="u" if a & 32 else None,
            password=b"p" if a & 32 and b & 2 else None,
            level=4 if c_ % 7 else 3,
        )
    if kind in (2, 3):
        qos = b % 3
        dup = bool(a & 32) and qos > 0
        return c.encode_publish(TOPICS[c_ % len(TOPICS)], rest[: b % 8], qos, bool(a & 16), dup, pid)
    if kind == 4:
        return c.encode_ack((c.PUBACK, c.PUBREC, c.PUBREL, c.PUBCOMP)[b % 4], max(pid, 1))
    if kind == 5:
        filters = [(FILTERS[(c_ + i) % len(FILTERS)], (b + i) % 3) for i in range(1 + b % 3)]
        return c.encode_subscribe(max(pid, 1), filters)
    if kind == 6:
        return c.encode_unsubscribe(max(pid, 1), [FILTERS[c_ % len(FILTERS)]])
    if kind == 7:
        return bytes(((c.PINGREQ, c.DISCONNECT, c.PINGRESP, c.CONNACK)[b % 4] << 4, 0))
    if kind == 8:  # a fixed header with any flags and a remaining length cut short or past the limit
        return bytes((b,)) + c.remaining_length(c_ * (3 if a & 16 else 1))
    if kind == 9:  # a packet over the limit
        return c.encode_publish("a", b"x" * (MAX_PACKET + c_))
    if kind == 10:  # a second CONNECT
        return c.encode_connect("again")
    return bytes((b, c_ % 5)) + rest[: c_ % 5]


def stream_from_bytes(data: bytes) -> bytes:
    """An MQTT stream built from ``data``: a CONNECT unless the first byte says not, then a packet per three
    bytes."""
    out: list[bytes] = []
    if data and data[0] % 4:
        out.append(c.encode_connect(f"c{data[0] % 3}", keepalive=data[0]))
    i = 1
    while i + 3 <= len(data):
        out.append(_packet(data[i], data[i + 1], data[i + 2], data[i + 3 :]))
        i += 3
    return b"".join(out)


def _answer(conn: mq.MqttConnection, actions: list[object]) -> list[object]:
    """Carry out what a binding would: accept a CONNECT (refuse one with a user name but no password),
    commit every publish, hold every filter that has a pattern."""
    out: list[object] = []
    todo = list(actions)
    while todo:
        act = todo.pop(0)
        out.append(act)
        if isinstance(act, mq.ConnectRequest):
            more = conn.refuse(mq.BAD_CREDENTIALS) if act.username and act.password is None else conn.accept()
            todo = more + todo
        elif isinstance(act, mq.MqttPublish):
            assert act.channel.startswith("/") and act.qos in (0, 1, 2)
            todo = conn.published(act) + todo
        elif isinstance(act, mq.MqttSubscribe):
            todo = conn.subscribed(act, [f.pattern is not None for f in act.filters]) + todo
    return out


def _run(stream: bytes, step: int) -> tuple[list[object], mq.MqttConnection]:
    conn = mq.MqttConnection(max_packet=MAX_PACKET)
    out: list[object] = []
    for i in range(0, len(stream), step):
        out += _answer(conn, conn.receive_data(stream[i : i + step]))
        assert conn.buffered <= 2 * MAX_PACKET + 5 + step, conn.buffered
    return out, conn


def check_stream(stream: bytes) -> None:
    whole, conn = _run(stream, max(len(stream), 1))
    assert _run(stream, 7)[0] == whole, "chunking matters"
    assert _run(stream, 1)[0] == whole, "chunking matters"
    for i, act in enumerate(whole):
        if isinstance(act, Send):
            r = c.PacketReader()
            r.feed(act.data)
            while (p := r.next()) is not None:
                kind = (
                    c.CONNACK if isinstance(p, c.Connack) else c.SUBACK if isinstance(p, c.Suback) else None
                )
                kind = kind or getattr(p, "kind", None)
                assert kind in SERVER_TYPES, p
            assert r.buffered == 0
        elif isinstance(act, Close):
            assert i == len(whole) - 1 and conn.closed, whole
        else:
            assert isinstance(
                act, mq.ConnectRequest | mq.MqttPublish | mq.MqttSubscribe | Unsubscribe | mq.Delivered
            ), act
    assert len(conn.subscriptions) <= len(stream)


def check_reader(data: bytes) -> None:
    r = c.PacketReader(max_packet=MAX_PACKET)
    r.feed(data)
    try:
        while r.next() is not None:
            pass
    except HubbubError as exc:
        assert exc.code in CODES, exc
