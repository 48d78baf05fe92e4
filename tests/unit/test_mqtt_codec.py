"""MQTT 3.1.1: the packet codec, the topic mapping and the connection's state machine (dialects/mqtt*.py).

Every stream is fed whole, one byte at a time and with trailing data (STYLE item 3): the same actions."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubbub.dialects import mqtt as mq
from hubbub.dialects import mqtt_codec as c
from hubbub.dialects.actions import Close, Send, Unsubscribe
from hubbub.disconnect import Disconnect
from hubbub.errors import BadFrame, BadRequest, FrameTooLarge

CONNECT = c.encode_connect("cid", keepalive=30)


def read_all(data: bytes, max_packet: int = 1 << 20) -> list[c.Packet]:
    r = c.PacketReader(max_packet)
    r.feed(data)
    out: list[c.Packet] = []
    while (p := r.next()) is not None:
        out.append(p)
    assert r.buffered == 0
    return out


def sent(actions: list[object]) -> list[c.Packet]:
    """The packets of the Send actions, decoded."""
    return read_all(b"".join(a.data for a in actions if isinstance(a, Send)))


def feeds(data: bytes) -> list[Callable[[mq.MqttConnection], list[object]]]:
    def whole(conn: mq.MqttConnection) -> list[object]:
        return conn.receive_data(data)

    def bytewise(conn: mq.MqttConnection) -> list[object]:
        out: list[object] = []
        for i in range(len(data)):
            out += conn.receive_data(data[i : i + 1])
        return out

    return [whole, bytewise]


def connected(**kw: int) -> mq.MqttConnection:
    conn = mq.MqttConnection(**kw)
    (req,) = conn.receive_data(CONNECT)
    assert isinstance(req, mq.ConnectRequest)
    assert sent(conn.accept()) == [c.Connack(False, 0)]
    return conn


# -- the codec ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "packet",
    [
        c.Connect("MQTT", 4, "id", True, 60),
        c.Connect("MQTT", 4, "", False, 0, c.Will("w/t", b"bye", 2, True), "u", b"p\x00w"),
        c.PublishPacket("a/b", b"x" * 300, 1, True, True, 7),
        c.PublishPacket("a", b"", 0),
        c.Ack(c.PUBACK, 1),
        c.Ack(c.PUBREL, 65535),
        c.SubscribePacket(3, (("a/+", 1), ("#", 2))),
        c.Suback(3, (0, 1, 0x80)),
        c.UnsubscribePacket(4, ("a/#",)),
        c.Connack(True, 0),
        c.Empty(c.PINGREQ),
    ],
)
def test_round_trip(packet: c.Packet) -> None:
    if isinstance(packet, c.Connect):
        data = c.encode_connect(
            packet.client_id,
            clean_session=packet.clean_session,
            keepalive=packet.keepalive,
            will=packet.will,
            username=packet.username,
            password=packet.password,
        )
    elif isinstance(packet, c.PublishPacket):
        data = c.encode_publish(
            packet.topic, packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id
        )
    elif isinstance(packet, c.Ack):
        data = c.encode_ack(packet.kind, packet.packet_id)
    elif isinstance(packet, c.SubscribePacket):
        data = c.encode_subscribe(packet.packet_id, packet.filters)
    elif isinstance(packet, c.Suback):
        data = c.encode_suback(packet.packet_id, packet.codes)
    elif isinstance(packet, c.UnsubscribePacket):
        data = c.encode_unsubscribe(packet.packet_id, packet.filters)
    elif isinstance(packet, c.Connack):
        data = c.encode_connack(packet.session_present, packet.code)
    else:
        data = bytes((packet.kind << 4, 0))
    assert read_all(data) == [packet]
    assert read_all(data + data) == [packet, packet]
    r = c.PacketReader()
    got = []
    for i in range(len(data)):
        r.feed(data[i : i + 1])
        if (p := r.next()) is not None:
            got.append(p)
    assert got == [packet]


@pytest.mark.parametrize("n", [0, 127, 128, 16383, 16384, 2_097_151, 2_097_152, c.MAX_REMAINING])
def test_remaining_length(n: int) -> None:
    enc = c.remaining_length(n)
    assert len(enc) == 1 + (n > 127) + (n > 16383) + (n > 2_097_151)
    r = c.PacketReader(c.MAX_REMAINING)
    r.feed(bytes((c.PINGRESP << 4,)) + enc)
    assert r.next() is None or n == 0


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"\x00\x00", BadFrame),  # reserved type 0
        (b"\xf0\x00", BadFrame),  # reserved type 15
        (b"\xc1\x00", BadFrame),  # PINGREQ with flags
        (b"\x60\x02\x00\x01", BadFrame),  # PUBREL without its 0010 flags
        (b"\x80\x05\x00\x01\x00\x01a", BadFrame),  # SUBSCRIBE without its flags
        (b"\x36\x05\x00\x01a\x00\x01", BadFrame),  # PUBLISH QoS 3
        (b"\x38\x03\x00\x01a", BadRequest),  # DUP on QoS 0
        (b"\x32\x05\x00\x01a\x00\x00", BadRequest),  # packet id 0
        (b"\xc0\xff\xff\xff\xff\x01", BadFrame),  # five length bytes
        (b"\xc0\x01\x00", BadFrame),  # PINGREQ with a body
        (b"\x82\x02\x00\x01", BadRequest),  # SUBSCRIBE without filters
        (b"\x82\x06\x00\x01\x00\x01a\x03", BadFrame),  # requested QoS 3
        (b"\x82\x06\x00\x01\x00\x01a\x40", BadFrame),  # reserved bits of the requested QoS
        (b"\xa2\x02\x00\x01", BadRequest),  # UNSUBSCRIBE without filters
        (b"\x30\x04\x00\x02\xff\xfe", BadFrame),  # topic not UTF-8
        (b"\x30\x04\x00\x02a\x00", BadFrame),  # topic with U+0000
        (b"\x30\x05\x00\x03\xed\xa0\x80", BadFrame),  # a surrogate, not UTF-8
        (b"\x40\x03\x00\x01\x00", BadFrame),  # PUBACK with a byte too many
        (b"\x30\x01\x00", BadFrame),  # string length cut short
        (c.encode_connect("x")[:9] + b"\x03" + c.encode_connect("x")[10:], BadFrame),  # reserved CONNECT flag
        (c.encode_connect("x")[:9] + b"\x0a" + c.encode_connect("x")[10:], BadFrame),  # will QoS, no will
        (c.encode_connect("x")[:9] + b"\x42" + c.encode_connect("x")[10:], BadFrame),  # password, no user
    ],
)
def test_malformed(data: bytes, error: type[Exception]) -> None:
    r = c.PacketReader()
    r.feed(data)
    with pytest.raises(error):
        r.next()


def test_over_max_packet_is_refused_before_its_body() -> None:
    r = c.PacketReader(max_packet=100)
    r.feed(b"\x30" + c.remaining_length(101))
    with pytest.raises(FrameTooLarge):
        r.next()


# -- topics -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "channel"),
    [
        ("a/b/c", "/a/b/c"),
        ("/a", "//a"),
        ("a/", "/a/"),
        ("a%b", "/a%25b"),
        ("a/*", "/a/*"),
        ("$SYS/x", "/$SYS/x"),
    ],
)
def test_topic_channels(topic: str, channel: str) -> None:
    assert mq.topic_channel(topic) == channel
    assert mq.channel_topic(channel) == topic


def test_the_root_and_u0000_have_no_topic() -> None:
    assert mq.channel_topic("/") is None
    assert mq.channel_topic("/a%00b") is None  # MQTT strings may not hold U+0000
    assert mq.channel_topic("/a%2500") == "a%00"  # a literal %00 is fine


def mqtt_matches(topic_filter: str, topic: str) -> bool:
    """A transcription of the standard's matching rules (§4.7), the reference."""
    if topic_filter[0] in "+#" and topic.startswith("$"):
        return False
    fl, tl = topic_filter.split("/"), topic.split("/")
    for i, f in enumerate(fl):
        if f == "#":
            return True
        if i >= len(tl):
            return False
        if f != "+" and f != tl[i]:
            return False
    return len(fl) == len(tl)


@pytest.mark.parametrize(
    ("topic_filter", "topic", "want"),
    [
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/#", "sport", True),
        ("#", "a/b", True),
        ("+", "a", True),
        ("+", "a/b", False),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("sport/+", "sport/", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/+", "$SYS/x", True),
        ("a/*", "a/b", False),
        ("a/*", "a/*", True),
    ],
)
def test_filters(topic_filter: str, topic: str, want: bool) -> None:
    assert mq.valid_filter(topic_filter)
    channel = mq.topic_channel(topic)
    got = mq.filter_pattern(topic_filter).matches(channel) and mq.filter_applies(topic_filter, channel)
    assert got is want is mqtt_matches(topic_filter, topic)


@pytest.mark.parametrize("bad", ["", "a/#/b", "a#", "a/b+", "+a", "##"])
def test_bad_filters(bad: str) -> None:
    assert not mq.valid_filter(bad)


levels = st.sampled_from(["a", "b", "", "$x", "*", "%", "%2A"])


@given(
    st.lists(st.sampled_from(["a", "b", "", "+", "$x", "*"]), min_size=1, max_size=4),
    st.booleans(),
    st.lists(levels, min_size=1, max_size=5),
)
def test_filters_agree_with_the_standard(fl: list[str], hash_end: bool, tl: list[str]) -> None:
    topic_filter = "/".join(fl + (["#"] if hash_end else []))
    topic = "/".join(tl)
    if not topic or not mq.valid_filter(topic_filter):
        return
    channel = mq.topic_channel(topic)
    got = mq.filter_pattern(topic_filter).matches(channel) and mq.filter_applies(topic_filter, channel)
    assert got == mqtt_matches(topic_filter, topic), (topic_filter, topic)


# -- the connection -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("feed", feeds(CONNECT + c.encode_publish("a/b", b"hi", 1, packet_id=5)))
def test_connect_pauses_until_accepted(feed: Callable[[mq.MqttConnection], list[object]]) -> None:
    conn = mq.MqttConnection()
    out = feed(conn)
    assert out == [mq.ConnectRequest("cid", True, 30, None, None, None)]
    assert conn.state is mq.State.CONNECTING
    acts = conn.accept()
    assert sent(acts) == [c.Connack(False, 0)]
    pub = mq.MqttPublish("/a/b", b"hi", 1, False, 5)
    assert acts[1:] == [pub]
    assert sent(conn.published(pub)) == [c.Ack(c.PUBACK, 5)]
    assert conn.keepalive == 30 and conn.messages == 2


@pytest.mark.parametrize(
    ("connect", "code"),
    [
        (c.encode_connect("x", level=3), mq.UNACCEPTABLE_PROTOCOL),
        (c.encode_connect("x", protocol="MQIsdp", level=3), mq.UNACCEPTABLE_PROTOCOL),
        (c.encode_connect("", clean_session=False), mq.IDENTIFIER_REJECTED),
        (c.encode_connect("x", protocol="HTTP"), None),
    ],
)
def test_connect_refused(connect: bytes, code: int | None) -> None:
    conn = mq.MqttConnection()
    out = conn.receive_data(connect + b"trailing")
    assert isinstance(out[-1], Close) and conn.closed
    assert sent(out) == ([] if code is None else [c.Connack(False, code)])
    assert conn.receive_data(CONNECT) == []


def test_refuse_after_checking_credentials() -> None:
    conn = mq.MqttConnection()
    conn.receive_data(c.encode_connect("x", username="u", password=b"bad"))
    out = conn.refuse(mq.BAD_CREDENTIALS)
    assert sent(out) == [c.Connack(False, 4)]
    assert out[-1] == Close(Disconnect.POLICY_VIOLATION, "CONNECT refused (4)")


@pytest.mark.parametrize(
    "data",
    [
        c.encode_publish("a", b""),  # not CONNECT first
        bytes((c.PINGREQ << 4, 0)),
        c.encode_connack(False, 0),
    ],
)
def test_first_packet_must_be_connect(data: bytes) -> None:
    out = mq.MqttConnection().receive_data(data)
    assert isinstance(out[0], Close)
    assert out == [Close(Disconnect.PROTOCOL_ERROR, out[0].reason)]


@pytest.mark.parametrize(
    "data",
    [
        CONNECT,  # a second CONNECT [MQTT-3.1.0-2]
        c.encode_publish("a/+", b""),
        c.encode_publish("a/#", b""),
        c.encode_subscribe(1, [("a/#/b", 0)]),
        c.encode_unsubscribe(1, ["a#"]),
        c.encode_suback(1, [0]),
        b"\x30\x04\x00\x02\xff\xfe",
    ],
)
def test_violations_close(data: bytes) -> None:
    conn = connected()
    out = conn.receive_data(data + bytes((c.PINGREQ << 4, 0)))
    assert len(out) == 1 and isinstance(out[0], Close) and out[0].code == Disconnect.PROTOCOL_ERROR
    assert conn.closed


def test_packet_over_the_limit_closes_as_too_large() -> None:
    conn = connected(max_packet=64)
    (out,) = conn.receive_data(c.encode_publish("a", b"x" * 100))
    assert out == Close(Disconnect.FRAME_TOO_LARGE, "packet over 64 bytes")


def test_pipelined_bytes_past_a_pending_connect_are_bounded() -> None:
    conn = mq.MqttConnection(max_packet=64)
    conn.receive_data(CONNECT)
    assert conn.receive_data(b"\xc0\x00" * 32) == []
    (out,) = conn.receive_data(b"\xc0\x00")
    assert isinstance(out, Close) and out.code == Disconnect.FRAME_TOO_LARGE


def test_qos2_publish_is_published_once_per_identifier() -> None:
    conn = connected()
    pub = c.encode_publish("t", b"x", 2, packet_id=9)
    (cmd,) = conn.receive_data(pub)
    assert cmd == mq.MqttPublish("/t", b"x", 2, False, 9)
    assert conn.receive_data(c.encode_publish("t", b"x", 2, dup=True, packet_id=9)) == []  # before the commit
    # Its PUBREC goes with the original's: the same replies as when the copy is read after the commit, so
    # they do not depend on how the reads were cut (found by tests/property/test_mqtt_stream.py).
    assert sent(conn.published(cmd)) == [c.Ack(c.PUBREC, 9), c.Ack(c.PUBREC, 9)]
    dup = conn.receive_data(c.encode_publish("t", b"x", 2, dup=True, packet_id=9))
    assert sent(dup) == [c.Ack(c.PUBREC, 9)]
    assert sent(conn.receive_data(c.encode_ack(c.PUBREL, 9))) == [c.Ack(c.PUBCOMP, 9)]
    (again,) = conn.receive_data(pub)  # the identifier is free again: a new message
    assert again == cmd


def test_pubrel_of_an_unknown_identifier_is_completed() -> None:
    assert sent(connected().receive_data(c.encode_ack(c.PUBREL, 3))) == [c.Ack(c.PUBCOMP, 3)]


def test_subscribe_and_unsubscribe() -> None:
    conn = connected()
    (cmd,) = conn.receive_data(c.encode_subscribe(2, [("a/+", 2), ("#", 1), ("x/" * 600, 0)]))
    assert isinstance(cmd, mq.MqttSubscribe)
    assert [(f.topic_filter, f.qos, f.pattern is not None) for f in cmd.filters] == [
        ("a/+", 2, True),
        ("#", 1, True),
        ("x/" * 600, 0, False),  # past the channel limit
    ]
    assert sent(conn.subscribed(cmd, [True, True, False])) == [c.Suback(2, (2, 1, 0x80))]
    assert conn.delivery_qos("/a/b", ["a/+", "#"]) == 2
    assert conn.delivery_qos("/$SYS/b", ["#"]) is None
    out = conn.receive_data(c.encode_unsubscribe(3, ["a/+", "nope"]))
    assert out[0] == Unsubscribe("a/+") and sent(out) == [c.Ack(c.UNSUBACK, 3)]
    assert conn.subscriptions == {"#": 1}


def test_an_unsubscribe_read_with_its_subscribe_drops_the_filter_once_answered() -> None:
    """A client may send SUBSCRIBE and UNSUBSCRIBE of a filter in one write, before the SUBACK: the binding
    carries out the subscribe, then the unsubscribe, so the filter must be gone in the end, as when the
    two arrive apart (it was kept: the UNSUBSCRIBE found nothing held yet and asked for no Unsubscribe)."""
    conn = connected()
    out = conn.receive_data(
        c.encode_subscribe(1, [("a/+", 1), ("b", 0)])
        + c.encode_unsubscribe(2, ["a/+"])
        + c.encode_subscribe(3, [("a/+", 0)])
        + c.encode_unsubscribe(4, ["b"])
    )
    first, second = (x for x in out if isinstance(x, mq.MqttSubscribe))
    assert [x for x in out if isinstance(x, Unsubscribe)] == [Unsubscribe("a/+"), Unsubscribe("b")]
    assert sent(out) == [c.Ack(c.UNSUBACK, 2), c.Ack(c.UNSUBACK, 4)]
    assert sent(conn.subscribed(first, [True, True])) == [c.Suback(1, (1, 0))]  # granted, then dropped
    assert conn.subscriptions == {}
    assert sent(conn.subscribed(second, [True])) == [c.Suback(3, (0,))]  # asked after the UNSUBSCRIBE
    assert conn.subscriptions == {"a/+": 0}
    # Nothing pending: an UNSUBSCRIBE of a filter neither held nor asked for asks for nothing.
    assert conn.receive_data(c.encode_unsubscribe(5, ["b"])) == [Send(c.encode_ack(c.UNSUBACK, 5))]


def test_granted_qos_is_capped() -> None:
    conn = connected(max_qos=1)
    (cmd,) = conn.receive_data(c.encode_subscribe(2, [("a", 2)]))
    assert isinstance(cmd, mq.MqttSubscribe)
    assert sent(conn.subscribed(cmd, [True])) == [c.Suback(2, (1,))]


def test_ping_and_disconnect_drop_the_will() -> None:
    conn = mq.MqttConnection()
    conn.receive_data(c.encode_connect("w", will=c.Will("gone", b"x", 1, False)))
    conn.accept()
    assert conn.will == c.Will("gone", b"x", 1, False)
    out = conn.receive_data(bytes((c.PINGREQ << 4, 0)) + bytes((c.DISCONNECT << 4, 0)) + b"junk")
    assert sent(out) == [c.Empty(c.PINGRESP)]
    assert out[-1] == Close(Disconnect.NORMAL, "DISCONNECT") and conn.will is None


def test_outbound_window() -> None:
    conn = connected(max_inflight=2)
    head = c.publish_head("t")
    p1 = conn.outbound.add(head, b"1", 1)
    p2 = conn.outbound.add(head, b"2", 2)
    assert p1 is not None and p2 is not None and conn.outbound.add(head, b"3", 1) is None
    (d1,), (d2,) = read_all(p1), read_all(p2)
    assert isinstance(d1, c.PublishPacket) and isinstance(d2, c.PublishPacket)
    assert (d1.packet_id, d2.packet_id) == (1, 2)
    assert sent(conn.receive_data(c.encode_ack(c.PUBREC, 2))) == [c.Ack(c.PUBREL, 2)]
    again = read_all(b"".join(conn.outbound.resend()))
    assert [p.dup for p in again if isinstance(p, c.PublishPacket)] == [True]
    assert conn.receive_data(c.encode_ack(c.PUBACK, 1)) == [mq.Delivered(1)]
    assert conn.receive_data(c.encode_ack(c.PUBACK, 1)) == []  # not in use: ignored
    assert read_all(b"".join(conn.outbound.resend())) == [c.Ack(c.PUBREL, 2)]
    assert conn.receive_data(c.encode_ack(c.PUBCOMP, 2)) == [mq.Delivered(2)] and len(conn.outbound) == 0
    redelivery = conn.outbound.add(head, b"again", 1, dup=True)
    assert redelivery is not None
    (d3,) = read_all(redelivery)
    assert isinstance(d3, c.PublishPacket) and d3.dup and d3.packet_id == 3


def test_text_websocket_frames_close() -> None:
    (out,) = mq.MqttConnection().receive_frame("hello")
    assert isinstance(out, Close) and out.code == Disconnect.UNSUPPORTED_DATA


def test_event_qos() -> None:
    assert mq.event_qos({}) == 1
    assert mq.event_qos({mq.QOS_HEADER: "0"}) == 0
    assert mq.event_qos({mq.QOS_HEADER: "2"}) == 2
