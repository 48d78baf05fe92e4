"""The native protocol's durable-consumer ops (docs/native.md "Durable consumers"), sans-I/O: every op in
JSON and msgpack, whole, one byte at a time and with trailing data over the TCP framing; every bad field with
its documented error and request id; the ``deliver`` frame in both encodings; the connection's table."""

from __future__ import annotations

from typing import Any

import msgpack
import orjson
import pytest

from hubbub.channels import parse_pattern
from hubbub.dialects import native as nc
from hubbub.errors import BadChannel, BadRequest, ConsumerBusy, HubbubError, LimitExceeded
from hubbub.events import Event, Publisher
from hubbub.log.consumers import JournalItem

JSON = nc.NativeCodec("json")
MP = nc.NativeCodec("msgpack")

GOOD: list[tuple[dict[str, Any], nc.Command]] = [
    (
        {"op": "consumer_create", "id": 1, "consumer": "jobs", "pattern": "/jobs/**"},
        nc.ConsumerCreate(1, "jobs", parse_pattern("/jobs/**")),
    ),
    (
        {
            "op": "consumer_create",
            "id": 2,
            "consumer": "a.b-c_9",
            "pattern": "/x/*",
            "tags": ["b", "a", "b"],
            "shared": True,
            "batch_wait_ms": 0,
            "batch_bytes": 10,
        },
        nc.ConsumerCreate(2, "a.b-c_9", parse_pattern("/x/*"), ("a", "b"), True, 0, 10),
    ),
    (
        {"op": "consume", "id": 3, "consumer": "jobs", "pattern": "/jobs/**", "max": 100, "shared": True},
        nc.Consume(3, "jobs", parse_pattern("/jobs/**"), shared=True, max=100),
    ),
    (
        {"op": "consume", "id": 4, "consumer": "jobs", "create": False, "reuse": True},
        nc.Consume(4, "jobs", None, create=False),
    ),
    ({"op": "ack", "id": 5, "consumer": "jobs", "batch": 7}, nc.Ack(5, "jobs", 7)),
    ({"op": "nack", "id": 6, "consumer": "jobs", "batch": 1}, nc.Nack(6, "jobs", 1)),
    ({"op": "unconsume", "id": 7, "consumer": "jobs"}, nc.Unconsume(7, "jobs")),
    ({"op": "consumer_delete", "id": 8, "consumer": "jobs"}, nc.ConsumerDelete(8, "jobs")),
]


def jframe(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj)


def mframe(obj: dict[str, Any]) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


@pytest.mark.parametrize(("obj", "cmd"), GOOD, ids=[f"{o['op']}-{o['id']}" for o, _ in GOOD])
def test_every_op_decodes_in_both_encodings(obj: dict[str, Any], cmd: nc.Command) -> None:
    assert JSON.decode(jframe(obj)) == cmd
    assert MP.decode(mframe(obj)) == cmd


def _stream(encoding: str) -> tuple[bytes, list[nc.Command]]:
    if encoding == "json":
        data = b"".join(jframe(o) + b"\n" for o, _ in GOOD)
    else:
        data = b"".join(len(f).to_bytes(4, "big") + f for f in (mframe(o) for o, _ in GOOD))
    return data, [c for _, c in GOOD]


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_the_stream_decoder_does_not_depend_on_chunking(encoding: str) -> None:
    data, expected = _stream(encoding)
    whole = nc.NativeStreamDecoder().feed(data)
    assert whole == expected
    dec = nc.NativeStreamDecoder()
    got: list[Any] = []
    for i in range(len(data)):
        got += dec.feed(data[i : i + 1])
    assert got == expected
    # Trailing data: half a frame more is held, not answered.
    dec = nc.NativeStreamDecoder()
    assert dec.feed(data + data[:7]) == expected


BAD: list[tuple[dict[str, Any], type[HubbubError]]] = [
    ({"op": "ack", "id": 1, "consumer": "", "batch": 1}, BadRequest),
    ({"op": "ack", "id": 1, "consumer": "a/b", "batch": 1}, BadRequest),
    ({"op": "ack", "id": 1, "consumer": "x" * 129, "batch": 1}, BadRequest),
    ({"op": "ack", "id": 1, "consumer": "j", "batch": 0}, BadRequest),
    ({"op": "ack", "id": 1, "consumer": "j", "batch": True}, BadRequest),
    ({"op": "ack", "id": 1, "consumer": "j", "batch": "1"}, BadRequest),
    ({"op": "ack", "id": 1, "consumer": "j", "batch": 1.5}, BadRequest),
    ({"op": "nack", "id": 1, "consumer": "j"}, BadRequest),
    ({"op": "consume", "id": 1, "consumer": "j"}, BadRequest),  # create needs a pattern
    ({"op": "consume", "id": 1, "consumer": "j", "pattern": "no-slash"}, BadChannel),
    ({"op": "consume", "id": 1, "consumer": "j", "pattern": "/a", "max": -1}, BadRequest),
    ({"op": "consume", "id": 1, "consumer": "j", "pattern": "/a", "max": 10**7}, BadRequest),
    ({"op": "consume", "id": 1, "consumer": "j", "pattern": "/a", "shared": 1}, BadRequest),
    ({"op": "consume", "id": 1, "consumer": "j", "pattern": "/a", "create": "yes"}, BadRequest),
    ({"op": "consumer_create", "id": 1, "consumer": "j", "pattern": "/a", "batch_bytes": 0}, BadRequest),
    ({"op": "consumer_create", "id": 1, "consumer": "j", "pattern": "/a", "batch_wait_ms": -1}, BadRequest),
    ({"op": "consumer_create", "id": 1, "consumer": "j", "pattern": "/a", "tags": "t"}, BadRequest),
    (
        {
            "op": "consumer_create",
            "id": 1,
            "consumer": "j",
            "pattern": "/a",
            "tags": [f"t{i}" for i in range(65)],
        },
        LimitExceeded,
    ),
    ({"op": "consumer_delete", "id": 1}, BadRequest),
    ({"op": "unconsume", "consumer": "j"}, BadRequest),  # no id
]


@pytest.mark.parametrize(("obj", "exc"), BAD)
def test_bad_fields_are_refused_with_the_request_id(obj: dict[str, Any], exc: type[HubbubError]) -> None:
    for codec, frame in ((JSON, jframe(obj)), (MP, mframe(obj))):
        with pytest.raises(exc) as info:
            codec.decode(frame)
        assert info.value.request_id == obj.get("id")


EV = Event(
    channel="/jobs/a",
    seq=3,
    epoch="k3j2a9x1",
    time_ns=1795313749574424198,
    publisher=Publisher("native", "u", "s", ""),
    content_type="text/plain; charset=utf-8",
    headers={},
    tags=("t",),
    payload=b"hi",
)


def test_deliver_frames_in_both_encodings() -> None:
    items = [JournalItem(4, EV), JournalItem(9, EV, 2)]
    j = orjson.loads(JSON.encode_deliver("jobs", 12, items))
    event = orjson.loads(JSON.encode_event(EV, ["s"]))
    del event["op"], event["subs"]
    assert j == {
        "op": "deliver",
        "consumer": "jobs",
        "batch": 12,
        "items": [{"pos": 4, "attempts": 0, **event}, {"pos": 9, "attempts": 2, **event}],
    }
    assert list(j["items"][0])[:3] == ["pos", "attempts", "channel"]
    m = msgpack.unpackb(MP.encode_deliver("jobs", 12, items), raw=False)
    mevent = msgpack.unpackb(MP.encode_event(EV, ["s"]), raw=False)
    del mevent["op"], mevent["subs"]
    assert m == {
        "op": "deliver",
        "consumer": "jobs",
        "batch": 12,
        "items": [{"pos": 4, "attempts": 0, **mevent}, {"pos": 9, "attempts": 2, **mevent}],
    }
    assert m["items"][0]["payload"] == b"hi" and isinstance(m["items"][0]["time"], int)
    assert msgpack.unpackb(MP.encode_deliver("e", 1, []), raw=False)["items"] == []


def test_consumer_closed_push() -> None:
    assert orjson.loads(JSON.encode_push("consumer_closed", reason="deleted", consumer="j")) == {
        "op": "consumer_closed",
        "consumer": "j",
        "reason": "deleted",
    }
    assert list(orjson.loads(JSON.encode_push("consumer_closed", reason="x", consumer="j"))) == [
        "op",
        "consumer",
        "reason",
    ]


def test_the_connection_table() -> None:
    t: nc.ConsumerTable[str] = nc.ConsumerTable(2)
    t.check_open("a")
    t.opened("a", "A")
    with pytest.raises(ConsumerBusy):
        t.check_open("a")
    t.opened("b", "B")
    with pytest.raises(LimitExceeded):
        t.check_open("c")
    assert t.drop("a", "other") is None and t.get("a") == "A"
    assert t.drop("a") == "A" and t.get("a") is None
    assert t.drop("a") is None
    assert sorted(t) == ["b"] and len(t) == 1
    assert t.drain() == ["B"] and len(t) == 0
