"""The event values: ``fast_init`` keeps the frozen dataclass contract while building faster; ``hot_value``
classes are plain slotted dataclasses that type-check as frozen."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import msgpack
import orjson
import pytest

from hubbub.dialects.native_common import event_body_json, event_body_msgpack, payload_field
from hubbub.events import Event, Publisher, fast_init
from hubbub.log.base import AppendRequest, AppendResult
from hubbub.log.consumers import JournalItem


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
        Sample()  # type: ignore[call-arg]  # a missing argument, refused
    with pytest.raises(TypeError):
        Sample(1, "b", {}, 4)  # type: ignore[call-arg]  # one too many, refused


def test_fast_init_instances_stay_frozen_and_hashable() -> None:
    p = Publisher("native", "u", "s", "m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.user = "x"  # type: ignore[misc]  # frozen: refused
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


def test_hot_values_build_compare_and_stay_unhashable() -> None:
    p = Publisher("native", "u", "s", "m")
    ev = Event("/a", 1, "e", 5, p, b"x", "text/plain")
    assert ev.headers == {} and ev.tags == ()
    assert Event("/a", 1, "e", 5, p, b"x", "text/plain").headers is not ev.headers  # a fresh dict each
    assert ev == Event("/a", 1, "e", 5, p, b"x", "text/plain", {}, ())
    assert ev != dataclasses.replace(ev, seq=2)
    assert not hasattr(ev, "__dict__")  # slotted
    for value in (
        ev,
        AppendRequest("/a", p, b"x", "text/plain"),
        AppendResult(ev),
        JournalItem(1, ev),
    ):
        with pytest.raises(TypeError):
            hash(value)  # as before: the frozen versions hashed a dict field
    assert AppendResult(ev) == AppendResult(ev, False, ())
    assert JournalItem(3, ev) == JournalItem(3, ev, 0, 0)


def test_hot_values_pickle_and_copy_at_every_protocol() -> None:
    ev = Event("/a", 1, "e", 5, Publisher("native", "u"), b"x", "text/plain", {"h": "v"}, ("t",))
    for value in (
        ev,
        AppendRequest("/a", Publisher("native"), b"x", "text/plain", {"h": "v"}, ("t",), "k"),
        AppendResult(ev, False, ((1, 2),)),
        JournalItem(3, ev, 1, 2),
    ):
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            assert pickle.loads(pickle.dumps(value, protocol)) == value
        assert copy.deepcopy(value) == value
        assert copy.copy(value) == value


def test_hot_values_are_frozen_to_mypy(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    src = tmp_path / "assign.py"
    src.write_text(
        "from hubbub.events import Event, Publisher\n"
        "from hubbub.log.consumers import JournalItem\n"
        'ev = Event("/a", 1, "e", 1, Publisher("n"), b"x", "t")\n'
        "ev.seq = 2\n"
        "JournalItem(1, ev).attempts = 3\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(src)],
        capture_output=True,
        text=True,
        env={"MYPYPATH": str(root / "src"), "PATH": ""},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.count("read-only") == 2, proc.stdout
