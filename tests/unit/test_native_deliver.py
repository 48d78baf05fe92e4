"""``deliver_frame`` (the durable consumers' ``deliver`` push, dialects/native_deliver.py) is byte for byte
the rule it replaced: ``pos`` and ``attempts``, then the event body of an ``event`` frame, item by item, in
both encodings; over generated batches whose items switch between shapes (channels, headers in either order,
tags, content types, publishers equal, distinct or the same object) across consecutive calls, which the
encoder's kept template must never confuse."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import native as nc
from hubbub.dialects.native_common import MSGPACK_BODY_PAIRS, event_body_json, event_body_msgpack
from hubbub.dialects.native_deliver import deliver_frame
from hubbub.events import Event, Publisher
from hubbub.log.consumers import JournalItem
from tests.hypothesis_budget import examples

_MP_ITEM_HEAD = bytes([0x80 | (MSGPACK_BODY_PAIRS + 2)]) + msgpack.packb("pos")
_MP_ATTEMPTS = msgpack.packb("attempts")
_MP_DELIVER = b"\x84" + b"".join(msgpack.packb(x) for x in ("op", "deliver", "consumer"))


def reference(encoding: str, consumer: str, batch: int, items: Sequence[Any]) -> bytes:
    """The rule before the templates (docs/native.md "Durable consumers"): each item's ``pos`` and
    ``attempts``, then the event body the ``event`` frames use."""
    if encoding == "json":
        parts = [b'{"op":"deliver","consumer":', orjson.dumps(consumer), b',"batch":%d,"items":[' % batch]
        for i, it in enumerate(items):
            parts.append(b'%s{"pos":%d,"attempts":%d' % (b"," if i else b"", it.pos, it.attempts))
            parts.append(event_body_json(it.event))
            parts.append(b"}")
        parts.append(b"]}")
        return b"".join(parts)
    pack = msgpack.Packer(use_bin_type=True)
    out = [_MP_DELIVER, pack.pack(consumer), pack.pack("batch"), pack.pack(batch), pack.pack("items")]
    out.append(pack.pack_array_header(len(items)))
    for it in items:
        out += [_MP_ITEM_HEAD, pack.pack(it.pos), _MP_ATTEMPTS, pack.pack(it.attempts)]
        out.append(event_body_msgpack(it.event))
    return b"".join(out)


text = st.text(st.characters(exclude_categories=["Cs"]), max_size=10)
payloads = st.one_of(
    st.binary(max_size=300),
    text.map(str.encode),
    st.sampled_from(
        [b'{"a": [1, 2.50, "%s"]}', b"[1,2]", b" 7 ", b"\xff\xfe", b"%b%d%%", b"", b"x" * 255, b"y" * 256]
    ),
    st.sampled_from([b"z" * 65535, b"w" * 65536]),
)
ints = st.one_of(
    st.integers(0, (1 << 64) - 1),
    st.sampled_from([0, 1, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32]),
)
HEADERS = [{}, {"a": "1", "b": "%s"}, {"b": "%s", "a": "1"}, {":guble.header": "x"}, {"é": "", "a": "1"}]
PUBLISHERS = [Publisher("native"), Publisher("native", "u", "s1"), Publisher("guble", "u", "s1", "m%d")]


@st.composite
def publishers(draw: st.DrawFn) -> Publisher:
    kind = draw(st.integers(0, 2))
    if kind == 0:  # one shared object
        return draw(st.sampled_from(PUBLISHERS))
    if kind == 1:  # an equal copy (what a store read gives each event)
        p = draw(st.sampled_from(PUBLISHERS))
        return Publisher(p.dialect, p.user, p.app, p.msg_id)
    return Publisher(draw(st.sampled_from(["native", "guble"])), draw(text), draw(text), draw(text))


@st.composite
def items(draw: st.DrawFn) -> JournalItem:
    ev = Event(
        channel="/" + draw(st.sampled_from(["a", "b/%s", "c/é", 'q"s', '"seq":0,"epoch":'])),
        seq=draw(ints),
        epoch=draw(st.sampled_from(["abcd1234", "0000zzzz", "%b"])),
        time_ns=draw(st.one_of(st.integers(0, (1 << 63) - 1), st.sampled_from([0, 127, 128, 1 << 32]))),
        publisher=draw(publishers()),
        payload=draw(payloads),
        content_type=draw(
            st.sampled_from(["application/octet-stream", "application/json", "x/y+json", "%s", "text/plain"])
        ),
        headers=dict(draw(st.sampled_from(HEADERS))),
        tags=draw(st.sampled_from([(), ("a",), ("a", "é"), ("%s",)])),
    )
    return JournalItem(draw(ints), ev, draw(st.integers(0, 1000)))


batches = st.tuples(
    st.sampled_from(["jobs", "c%s", "é"]),
    st.integers(1, (1 << 64) - 1),
    st.lists(items(), max_size=8),
)


@settings(max_examples=examples(400), deadline=None)
@given(calls=st.lists(batches, min_size=1, max_size=4))
def test_deliver_frames_equal_the_per_item_rule(calls: list[tuple[str, int, list[JournalItem]]]) -> None:
    """Each generated sequence of calls in each encoding, on a codec of its own: one generation serves both
    (it is most of the test's time), so each encoding is checked on as many sequences as when each had a
    run."""
    encodings: tuple[nc.Encoding, ...] = ("json", "msgpack")
    for encoding in encodings:
        codec = nc.NativeCodec(encoding)
        for consumer, batch, its in calls:
            want = reference(encoding, consumer, batch, its)
            assert deliver_frame(encoding, consumer, batch, its) == want, encoding
            assert codec.encode_deliver(consumer, batch, tuple(its)) == want, encoding


def test_a_reordered_header_map_is_not_taken_for_the_same_shape() -> None:
    pub = Publisher("native")
    first = Event("/a", 1, "e", 5, pub, b"p", "text/plain", {"a": "1", "b": "2"})
    second = Event("/a", 2, "e", 6, pub, b"q", "text/plain", {"b": "2", "a": "1"})
    its = [JournalItem(1, first), JournalItem(2, second, 1)]
    for encoding in ("json", "msgpack"):
        assert deliver_frame(encoding, "c", 3, its) == reference(encoding, "c", 3, its)
    assert orjson.loads(deliver_frame("json", "c", 3, its))["items"][1]["headers"] == {"b": "2", "a": "1"}


def test_msgpack_items_equal_packing_whole_maps() -> None:
    pub = Publisher("guble", "u", "app", "m1")
    ev = Event("/x", 300, "ep", 1 << 40, pub, b"\x00" * 70000, "application/octet-stream", {"h": "v"}, ("t",))
    frame = deliver_frame("msgpack", "q", 9, [JournalItem(7, ev, 2)])
    item = {
        "pos": 7,
        "attempts": 2,
        "channel": "/x",
        "seq": 300,
        "epoch": "ep",
        "time": 1 << 40,
        "publisher": {"dialect": "guble", "user": "u", "app": "app", "msg_id": "m1"},
        "headers": {"h": "v"},
        "tags": ["t"],
        "content_type": "application/octet-stream",
        "payload": b"\x00" * 70000,
    }
    whole = {"op": "deliver", "consumer": "q", "batch": 9, "items": [item]}
    assert frame == msgpack.packb(whole, use_bin_type=True)
