"""The event values: ``fast_init`` keeps the frozen dataclass contract while building faster."""

from __future__ import annotations

import dataclasses

import msgpack
import orjson
import pytest

from hubbub.dialects.native_common import event_body_json, event_body_msgpack, payload_field
from hubbub.events import Event, Publisher, fast_init
from hubbub.log.base import AppendRequest


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    a: int
    b: str = "b"
    c: dict[str, int] = dataclasses.field(default_factory=dict)


def test_fast_init_keeps_signature_defaults_and_factories() -> None:
    s = Sample(1)
    assert (s.a, s.b, s.c) == (1, "b", {})
    assert Sample(1).c is not Sample(1).c  # a fresh dict per instance, as with the dataclass __init__
    assert Sample(2, c={"x": 1}, b="q") == Sample(2, "q", {"x": 1})
    with pytest.raises(TypeError):
        Sample()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Sample(1, "b", {}, 4)  # type: ignore[call-arg]


def test_fast_init_instances_stay_frozen_and_hashable() -> None:
    p = Publisher("native", "u", "s", "m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.user = "x"  # type: ignore[misc]
    assert hash(p) == hash(Publisher("native", "u", "s", "m"))
    assert dataclasses.replace(p, user="v") == Publisher("native", "v", "s", "m")
    req = AppendRequest("/a", p, b"x", "text/plain")
    assert req.headers == {} and req.tags == () and req.idem == ""


def test_fast_init_refuses_post_init() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class WithPost:
        a: int

        def __post_init__(self) -> None:
            pass

    with pytest.raises(TypeError):
        fast_init(WithPost)


EVENTS = [
    Event("/b/c", 12345, "abcdefgh", 1763798400123456789, Publisher("native", "u", "s"), b"x" * 16, "a/b"),
    Event(
        "/b/c",
        1,
        "abcdefgh",
        5,
        Publisher("ivy"),
        b'{"a": 1}',
        "application/json",
        {"x": "y", ":filter.user_id": "z"},
        ("a", "b"),
    ),
    Event("/ü/c", 2**40, "abcdefgh", 5, Publisher("native", "u"), b"\xff\x00", "text/plain", {}, ("t",)),
]


@pytest.mark.parametrize("event", EVENTS)
def test_spliced_event_bodies_equal_whole_object_encoding(event: Event) -> None:
    """The bodies are spliced from fragments; they must equal encoding the whole map at once."""
    pub = event.publisher
    fields = {
        "channel": event.channel,
        "seq": event.seq,
        "epoch": event.epoch,
        "time": event.time_ns,
        "publisher": {"dialect": pub.dialect, "user": pub.user, "app": pub.app, "msg_id": pub.msg_id},
        "headers": {k: v for k, v in event.headers.items() if not k.startswith(":")},
        "tags": list(event.tags),
        "content_type": event.content_type,
    }
    whole = msgpack.packb({**fields, "payload": event.payload}, use_bin_type=True)
    for _ in range(2):  # the second round hits the publisher fragment cache
        assert event_body_msgpack(event) == whole[1:]
        name, value = payload_field(event)
        text = orjson.dumps({**fields, "time": str(event.time_ns)})
        assert event_body_json(event) == b"," + text[1:-1] + b',"' + name.encode() + b'":' + value


def test_size_counts_payload_header_and_tag_bytes() -> None:
    pub = Publisher("native")
    assert Event("/a", 1, "e", 1, pub, b"xyz", "text/plain").size == 3
    ev = Event("/a", 1, "e", 1, pub, b"xyz", "text/plain", {"ü": "vv"}, ("t", "ä"))
    assert ev.size == 3 + 2 + 2 + 1 + 2
