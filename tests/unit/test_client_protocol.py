"""The sans-I/O native client protocol (hubbub.client.protocol) without sockets: the server's side of a
connection fed whole, one byte at a time and with trailing data, in each framing (JSON lines, length-prefixed
msgpack, WebSocket frames) and as whole messages."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import orjson
import pytest

from hubbub.client import Gap
from hubbub.client.framing import Framing, FramingKind
from hubbub.client.positions import SubscriptionPositions
from hubbub.client.protocol import (
    TRANSITIONS,
    BadInput,
    ClientProtocol,
    ConsumerFrame,
    Delivered,
    GapNotice,
    HelloRefused,
    Recovered,
    Refused,
    Replies,
    ServerError,
    Welcome,
)
from hubbub.errors import BadFrame, BadRequest, FrameTooLarge
from hubbub.events import Position
from hubbub.ws_frames import FrameParser

KINDS: list[FramingKind] = ["lines", "length", "ws"]


def _frame(kind: FramingKind, obj: dict[str, Any]) -> bytes:
    """A server frame (not masked) in ``kind``'s framing."""
    if kind == "lines":
        return orjson.dumps(obj) + b"\n"
    body: bytes = msgpack.packb(obj)
    if kind == "length":
        return struct.pack(">I", len(body)) + body
    n = len(body)
    head = bytes([0x82, n]) if n < 126 else bytes([0x82, 126]) + struct.pack(">H", n)
    return head + body


def _event(seq: int, subs: list[str], channel: str = "/a/b") -> dict[str, Any]:
    return {
        "op": "event",
        "subs": subs,
        "channel": channel,
        "seq": seq,
        "epoch": "E",
        "time": 1000 + seq,
        "publisher": {"dialect": "native", "user": "", "app": "", "msg_id": ""},
        "text": f"p{seq}",
        "content_type": "text/plain",
        "headers": {},
        "tags": [],
    }


def _opened(kind: FramingKind) -> tuple[ClientProtocol[str], SubscriptionPositions]:
    proto: ClientProtocol[str] = ClientProtocol(
        "json" if kind == "lines" else "msgpack", Framing(kind, 1 << 16), client="t"
    )
    hello = proto.hello()
    assert kind == "ws" or b"hello" in hello  # a WebSocket frame is masked
    (welcome,) = proto.receive_data(
        _frame(
            kind, {"op": "reply", "id": 1, "session": "S", "ping_interval": 7, "limits": {"max_frame": 4096}}
        )
    )
    assert isinstance(welcome, Welcome) and welcome.session == "S" and welcome.max_frame == 4096
    assert proto.state == "open" and proto.max_frame == 4096 and proto.ping_interval == 7.0
    positions = SubscriptionPositions(last=5)
    proto.subscribe("s1", "/a/**", ["t"], positions, "sub")
    proto.request({"op": "publish", "channel": "/a/b", "text": "x", "ack": True}, "pub")
    proto.request({"op": "ping"}, "ping")
    return proto, positions


def _server_side(kind: FramingKind) -> bytes:
    """What the server answers to :func:`_opened`'s requests, and pushes, in one stream."""
    frames = [
        {"op": "reply", "id": 2, "top_time": 900},  # the subscribe
        _event(1, ["s1"]),
        _event(1, ["s1"]),  # again: a duplicate, dropped
        {
            "op": "gap",
            "sub": "s1",
            "channel": "/a/c",
            "since": {"seq": 1, "epoch": "E"},
            "position": {"seq": 9, "epoch": "E"},
            "reason": "trimmed",
        },
        {"op": "recovered", "sub": "s1", "replayed": 1},
        {"op": "batch", "frames": [{"op": "error", "id": 3, "code": 4001}, {"op": "pong", "id": 4}]},
        _event(2, ["s1", "other"]),
        {"op": "deliver", "consumer": "c", "batch": 1, "items": []},
        {"op": "ping", "id": 77},
        {"op": "error", "code": 4302, "temporary": True},
        {"op": "future-op"},
    ]
    return b"".join(_frame(kind, f) for f in frames)


def _check(events: list[Any], proto: ClientProtocol[str], positions: SubscriptionPositions) -> None:
    kinds = [type(e) for e in events]
    assert kinds == [
        Replies,
        Delivered,
        GapNotice,
        Recovered,
        Refused,
        Replies,
        Delivered,
        ConsumerFrame,
        ServerError,
    ]
    sub_reply, ev1, gap, _, refused, pong, ev2, consumer, err = events
    assert [t for t, _ in sub_reply.answers] == ["sub"] and [t for t, _ in pong.answers] == ["ping"]
    assert [ev1.event.seq, ev2.event.seq] == [1, 2] and ev1.sub == ev2.sub == "s1"
    assert gap.gap == Gap("/a/c", Position(1, "E"), Position(9, "E"), "trimmed")
    assert refused.token == "pub" and isinstance(refused.error, BadRequest)
    assert consumer.consumer == "c"
    assert err.error.code == 4302 and err.error.fatal and err.request_id is None
    assert proto.pending == {}
    assert positions.positions == {"/a/b": Position(2, "E"), "/a/c": Position(9, "E")}
    assert positions.dups == 1 and positions.gaps == 1 and positions.replayed == 1
    (pong_out,) = proto.take_outgoing()
    assert proto.framing is not None and not proto.take_outgoing()
    if proto.framing.kind == "ws":  # a client's frame, masked: the server's parser reads it
        server_side = FrameParser(1 << 16, decode_text=False)
        server_side.feed(pong_out)
        item = server_side.next()
        assert item is not None and isinstance(item[1], bytes)
        body = item[1]
    else:
        (body,) = Framing(proto.framing.kind, 1 << 16).feed(pong_out)
    assert (orjson.loads(body) if proto.codec == "json" else msgpack.unpackb(body)) == {
        "op": "pong",
        "id": 77,
    }


@pytest.mark.parametrize("kind", KINDS)
def test_whole_byte_at_a_time_and_with_trailing_data(kind: FramingKind) -> None:
    data = _server_side(kind)
    proto, positions = _opened(kind)
    _check(proto.receive_data(data), proto, positions)

    proto, positions = _opened(kind)
    events: list[Any] = []
    for i in range(len(data)):
        events += proto.receive_data(data[i : i + 1])
    _check(events, proto, positions)

    # Trailing data: the start of a next frame is kept for the next read, not lost or misread.
    trailing = _frame(kind, _event(3, ["s1"]))
    proto, positions = _opened(kind)
    _check(proto.receive_data(data + trailing[:5]), proto, positions)
    (more,) = proto.receive_data(trailing[5:])
    assert isinstance(more, Delivered) and more.event.seq == 3


def test_whole_messages_without_framing() -> None:
    proto: ClientProtocol[str] = ClientProtocol("json")
    proto.hello()
    assert isinstance(proto.receive('{"op":"reply","id":1,"session":"S"}')[0], Welcome)
    proto.request({"op": "ping"}, "p")
    assert proto.receive('{"op":"batch","frames":[{"op":"pong","id":2},7]}') == [
        Replies([("p", {"op": "pong", "id": 2})])
    ]
    with pytest.raises(BadFrame):
        proto.receive("not json")


def test_resume_asks_for_what_was_not_delivered() -> None:
    proto, positions = _opened("lines")
    proto.receive_data(_server_side("lines"))
    again: ClientProtocol[str] = ClientProtocol("json")  # the next connection
    again.hello()
    again.receive('{"op":"reply","id":1}')
    data = again.subscribe("s1", "/a/**", (), positions, "sub")
    frame = orjson.loads(data)
    assert frame["since"] == {"/a/b": {"seq": 2, "epoch": "E"}, "/a/c": {"seq": 9, "epoch": "E"}}
    assert frame["from_time"] == 1003  # after the newest event seen (1002) and the snapshot's (900)
    assert "last" not in frame and positions.subscribes == 2


def test_hello_refused_and_nothing_after_abandon() -> None:
    proto: ClientProtocol[str] = ClientProtocol("json")
    proto.hello()
    assert proto.receive('{"op":"event","subs":["s"],"channel":"/a"}') == []  # before the welcome: ignored
    (refused,) = proto.receive('{"op":"error","code":4101,"message":"bad token"}')
    assert isinstance(refused, HelloRefused) and refused.error.code == 4101 and proto.state == "closed"
    proto, _ = _opened("length")
    assert proto.abandon() == ["sub", "pub", "ping"] and proto.state == "closed"
    assert proto.receive_data(_server_side("length")) == []
    assert ("closed", "abandon") in TRANSITIONS and ("open", "welcome") not in TRANSITIONS


def test_bounds_and_malformed_frames() -> None:
    proto, _ = _opened("length")
    with pytest.raises(FrameTooLarge):
        proto.request({"op": "publish", "channel": "/a", "text": "x" * 5000}, "big")  # over the server's 4096
    assert "big" not in proto.pending.values()
    with pytest.raises(FrameTooLarge):
        proto.receive_data(struct.pack(">I", 1 << 20))  # over the client's own bound
    proto, _ = _opened("lines")
    (bad,) = proto.receive_data(b'{"op":"event","subs":["s1"],"channel":"/a","seq":"x"}\n')
    assert isinstance(bad, BadInput)
    with pytest.raises(BadFrame):
        proto.receive_data(b"{not json\n")


def test_packed_requests_carry_their_id() -> None:
    proto, _ = _opened("length")
    out = bytearray()
    body = msgpack.packb({"op": "publish", "channel": "/a", "payload": b"x", "ack": True})
    rid = proto.request_packed(body, "packed", out)
    frame = msgpack.unpackb(bytes(out[4:]))
    assert struct.unpack(">I", out[:4])[0] == len(out) - 4
    assert frame == {"op": "publish", "channel": "/a", "payload": b"x", "ack": True, "id": rid}
    (replied,) = proto.receive_data(_frame("length", {"op": "reply", "id": rid, "seq": 1}))
    assert replied == Replies([("packed", {"op": "reply", "id": rid, "seq": 1})])
