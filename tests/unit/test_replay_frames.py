"""``event_frames``: a run of replayed events encodes to exactly the frames of its events, one by one."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import native as nc
from hubbub.dialects.native_common import event_frames
from hubbub.events import Event, Publisher
from hubbub.log.base import EventRun

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
payloads = st.one_of(
    st.binary(max_size=300),
    text.map(str.encode),
    st.sampled_from([b'{"a": [1, 2.50, "%s"]}', b"[1,2]", b" 7 ", b"\xff\xfe", b"%b%d%%", b""]),
)
seqs = st.one_of(
    st.integers(1, 1 << 40),
    st.sampled_from([1, 126, 127, 128, 254, 255, 256, 65534, 65535, 65536, (1 << 32) - 2, (1 << 32) - 1]),
)
times = st.one_of(st.integers(0, (1 << 63) - 1), st.sampled_from([0, 127, 128, 255, 256, 65535, 1 << 32]))


@st.composite
def runs(draw: st.DrawFn) -> tuple[Event, list[tuple[int, bytes]]]:
    headers = draw(
        st.dictionaries(st.sampled_from(["a", "%s", ":guble.header", ":filter.user_id", "é"]), text)
    )
    proto = Event(
        channel="/" + draw(st.sampled_from(["a", "b/%s", "c/é", 'q"s'])),
        seq=draw(seqs),
        epoch=draw(st.sampled_from(["abcd1234", "0000zzzz"])),
        time_ns=0,
        publisher=Publisher(draw(st.sampled_from(["native", "guble"])), draw(text), draw(text), draw(text)),
        payload=b"",
        content_type=draw(
            st.sampled_from(["application/octet-stream", "application/json", "x/y+json", "%s"])
        ),
        headers=headers,
        tags=tuple(sorted(set(draw(st.lists(text, max_size=3))))),
    )
    rows = draw(st.lists(st.tuples(times, payloads), min_size=1, max_size=5))
    proto = Event(
        proto.channel,
        proto.seq,
        proto.epoch,
        rows[0][0],
        proto.publisher,
        rows[0][1],
        proto.content_type,
        proto.headers,
        proto.tags,
    )
    return proto, rows


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
@settings(max_examples=300, deadline=None)
@given(
    run=runs(),
    subs=st.lists(st.sampled_from(["s", "%d", "é", "sub-2"]), min_size=1, max_size=3, unique=True),
    replay=st.booleans(),
)
def test_run_frames_equal_single_event_frames(
    encoding: nc.Encoding, run: tuple[Event, list[tuple[int, bytes]]], subs: list[str], replay: bool
) -> None:
    proto, rows = run
    codec = nc.NativeCodec(encoding)
    events = EventRun(proto, rows).events()
    assert [e.seq for e in events] == list(range(proto.seq, proto.seq + len(rows)))
    want = [codec.encode_event(e, subs, replay) for e in events]
    assert event_frames(encoding, proto, rows, subs, replay) == want
    # The tuple form of subs (the node's) gives the same frames.
    assert event_frames(encoding, proto, rows, tuple(subs), replay) == want


def test_frames_decode_to_the_events() -> None:
    proto = Event("/r", 127, "abcd1234", 5, Publisher("native", "u", "a", ""), b"p0", "application/json", {})
    rows = [(5, b"p0"), (1 << 40, b'{"x": 1}'), (7, b"\xff")]
    frames = event_frames("msgpack", proto, rows, ("s",), True)
    got = [msgpack.unpackb(f) for f in frames]
    assert [(g["seq"], g["time"], g["payload"], g["replay"]) for g in got] == [
        (127, 5, b"p0", True),
        (128, 1 << 40, b'{"x": 1}', True),
        (129, 7, b"\xff", True),
    ]
    jframes = [json.loads(f) for f in event_frames("json", proto, rows, ("s",), False)]
    assert [(g["seq"], g["time"], "replay" in g) for g in jframes] == [
        (127, "5", False),
        (128, str(1 << 40), False),
        (129, "7", False),
    ]
    assert [next(k for k in ("json", "text", "b64") if k in g) for g in jframes] == ["text", "json", "b64"]
