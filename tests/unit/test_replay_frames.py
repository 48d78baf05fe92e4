"""``event_frames``: a run of replayed events encodes to exactly the frames of its events, one by one; and
``event_batches``: packed into batch frames, exactly those frames packed by ``pack_batches``."""

from __future__ import annotations

import json
from dataclasses import replace

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import native as nc
from hubbub.dialects import native_columns
from hubbub.dialects.native_columns import (
    UNIFORM_FRAME_MAX,
    _msgpack_heads,
    event_batches,
    mp_uint_form,
    run_batches,
    run_frames,
    uniform_batches,
)
from hubbub.dialects.native_common import event_frames, pack_batches
from hubbub.events import Event, Publisher
from hubbub.log.base import EventRun
from hubbub.run_columns import STAMP, RunColumns
from tests.hypothesis_budget import examples

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
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


#: The encodings every property test below checks each generated case in: one generation serves both (it is
#: most of a test's time), so each encoding is checked on the test's full budget of cases.
ENCODINGS: tuple[nc.Encoding, ...] = ("msgpack", "json")


@settings(max_examples=examples(300), deadline=None)
@given(
    run=runs(),
    subs=st.lists(st.sampled_from(["s", "%d", "é", "sub-2"]), min_size=1, max_size=3, unique=True),
    replay=st.booleans(),
)
def test_run_frames_equal_single_event_frames(
    run: tuple[Event, list[tuple[int, bytes]]], subs: list[str], replay: bool
) -> None:
    proto, rows = run
    events = EventRun(proto, rows).events()
    assert [e.seq for e in events] == list(range(proto.seq, proto.seq + len(rows)))
    for encoding in ENCODINGS:
        codec = nc.NativeCodec(encoding)
        want = [codec.encode_event(e, subs, replay) for e in events]
        assert event_frames(encoding, proto, rows, subs, replay) == want, encoding
        # The tuple form of subs (the node's) gives the same frames.
        assert event_frames(encoding, proto, rows, tuple(subs), replay) == want, encoding


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


# -- batch frames of runs ---------------------------------------------------------------------------------


def greedy_batches(encoding: nc.Encoding, frames: list[bytes], limit: int) -> list[bytes]:
    """The packing rule spelled out frame by frame: the longest group that fits the limit with its batch
    overhead; a group of one frame goes out as that frame."""
    codec = nc.NativeCodec(encoding)

    def size(group: list[bytes]) -> int:
        return len(codec.encode_batch(group))

    out: list[list[bytes]] = []
    for f in frames:
        if out and size([*out[-1], f]) <= limit:
            out[-1].append(f)
        else:
            out.append([f])
    return [g[0] if len(g) == 1 else codec.encode_batch(g) for g in out]


limits = st.one_of(st.integers(1, 4000), st.just(1 << 20))


@settings(max_examples=examples(200), deadline=None)
@given(frames=st.lists(st.binary(min_size=1, max_size=300), max_size=40), limit=limits)
def test_pack_batches_is_greedy_within_the_limit(frames: list[bytes], limit: int) -> None:
    for encoding in ENCODINGS:
        got = pack_batches(encoding, frames, limit)
        assert got == greedy_batches(encoding, frames, limit), encoding
        codec = nc.NativeCodec(encoding)
        assert codec.encode_batches(frames, limit) == got, encoding
        for b in got:
            assert len(b) <= limit or b in frames  # only a frame that fits no batch goes over, alone


@st.composite
def uniform_runs(draw: st.DrawFn) -> tuple[Event, list[tuple[int, bytes]]]:
    """Runs whose times and payload sizes share one msgpack form each (the usual replay page): the batches
    are built without single frames. The seqs may cross a boundary of msgpack's integer forms."""
    seq = draw(st.sampled_from([1, 100, 120, 250, 65530, (1 << 32) - 5, 1 << 40]))
    base = draw(st.sampled_from([0, 200, 70000, 1 << 33, 1_700_000_000_000_000_000]))
    size = draw(st.sampled_from([0, 3, 16, 255, 256, 300, 65536]))
    n = draw(st.integers(1, 30))
    rows = [(base + draw(st.integers(0, 40)), bytes([i % 256]) * size) for i in range(n)]
    headers = draw(st.sampled_from([{}, {"k": "v", ":filter.user_id": "u"}]))
    proto = Event(
        "/r/%s", seq, "abcd1234", rows[0][0], Publisher("native", "u", "a", ""), rows[0][1],
        "application/octet-stream", headers, ("t",),
    )  # fmt: skip
    return proto, rows


@settings(max_examples=examples(200), deadline=None)
@given(run=st.one_of(runs(), uniform_runs()), replay=st.booleans(), limit=limits)
def test_run_batches_equal_packed_single_event_frames(
    run: tuple[Event, list[tuple[int, bytes]]], replay: bool, limit: int
) -> None:
    proto, rows = run
    for encoding in ENCODINGS:
        want = pack_batches(encoding, event_frames(encoding, proto, rows, ["s", "%d"], replay), limit)
        assert event_batches(encoding, proto, rows, ("s", "%d"), replay, limit) == want, encoding


@settings(max_examples=examples(100), deadline=None)
@given(run=uniform_runs(), replay=st.booleans())
def test_uniform_msgpack_runs_take_the_struct_path(
    run: tuple[Event, list[tuple[int, bytes]]], replay: bool
) -> None:
    proto, rows = run
    got = _msgpack_heads(proto, rows, ("s",), replay, b"")
    assert got is not None
    heads, sizes = got
    frames = event_frames("msgpack", proto, rows, ("s",), replay)
    suffix = b"\xa6replay\xc3" if replay else b""
    assert [h + p + suffix for h, (_, p) in zip(heads, rows, strict=True)] == frames
    assert sizes == [len(p) for _, p in rows]


def test_a_replay_page_splits_into_batches_within_max_frame() -> None:
    proto = Event("/r", 1, "abcd1234", 1 << 60, Publisher("native"), b"x" * 100, "text/plain")
    rows = [((1 << 60) + i, b"x" * 100) for i in range(500)]
    batches = event_batches("msgpack", proto, rows, ("s",), True, 4096)
    assert len(batches) > 10 and all(len(b) <= 4096 for b in batches)
    got = [f for b in batches for f in msgpack.unpackb(b)["frames"]]
    assert [(g["seq"], g["time"], g["replay"]) for g in got] == [
        (1 + i, (1 << 60) + i, True) for i in range(500)
    ]


# -- the column path (uniform runs) -----------------------------------------------------------------------


@st.composite
def same_size_runs(draw: st.DrawFn) -> tuple[Event, list[tuple[int, bytes]]]:
    """Runs whose payloads all have one size (the column path's runs, and its edges: a seq or time crossing
    a boundary of msgpack's integer forms, frames past ``UNIFORM_FRAME_MAX``), with any headers and tags."""
    proto, _ = draw(runs())
    seq = draw(seqs)
    size = draw(st.sampled_from([0, 1, 16, 100, 255, 256, 400, 600]))
    n = draw(st.integers(1, 40))
    base = draw(times)
    rows = [
        (min(base + draw(st.integers(0, 300)), (1 << 63) - 1), draw(st.binary(min_size=size, max_size=size)))
        for _ in range(n)
    ]
    proto = Event(
        proto.channel, seq, proto.epoch, rows[0][0], proto.publisher, rows[0][1], proto.content_type,
        proto.headers, proto.tags,
    )  # fmt: skip
    return proto, rows


@settings(max_examples=examples(300), deadline=None)
@given(
    run=st.one_of(same_size_runs(), uniform_runs(), runs()),
    subs=st.lists(st.sampled_from(["s", "%d", "é"]), min_size=1, max_size=2, unique=True),
    replay=st.booleans(),
    limit=limits,
)
def test_column_batches_equal_packed_single_event_frames(
    run: tuple[Event, list[tuple[int, bytes]]], subs: list[str], replay: bool, limit: int
) -> None:
    proto, rows = run
    want = pack_batches("msgpack", event_frames("msgpack", proto, rows, subs, replay), limit)
    assert run_batches("msgpack", proto, rows, tuple(subs), replay, limit) == want
    got = uniform_batches(proto, rows, tuple(subs), replay, limit)
    assert got is None or got == want


@settings(max_examples=examples(300), deadline=None)
@given(
    run=same_size_runs(),
    wide=st.integers(1 << 32, (1 << 63) - 400),
    subs=st.lists(st.sampled_from(["s", "%d", "é"]), min_size=1, max_size=2, unique=True),
    replay=st.booleans(),
    limit=limits,
)
def test_rows_read_as_columns_encode_as_the_rows(
    run: tuple[Event, list[tuple[int, bytes]]], wide: int, subs: list[str], replay: bool, limit: int
) -> None:
    """A run whose rows come as columns (:class:`RunColumns`, SQLite's replay page: one payload size,
    ``uint 64`` times) encodes to the bytes of the same rows as a list, by every path of both encodings:
    the strided batch path (small payloads), the joined one, and the per-event ones."""
    proto, rows = run
    rows = [(wide + i * 7 + (t & 3), p) for i, (t, p) in enumerate(rows)]
    proto = replace(proto, time_ns=rows[0][0])
    size = len(rows[0][1])
    cols = RunColumns(b"".join(STAMP.pack(t) for t, _ in rows), b"".join(p for _, p in rows), size, wide=True)
    want = pack_batches("msgpack", event_frames("msgpack", proto, rows, subs, replay), limit)
    assert run_batches("msgpack", proto, cols, tuple(subs), replay, limit) == want
    got = uniform_batches(proto, cols, tuple(subs), replay, limit)
    assert got is None or got == want
    frames = event_frames("msgpack", proto, rows, subs, replay)
    one_form = mp_uint_form(proto.seq) == mp_uint_form(proto.seq + len(rows) - 1)
    assert got is not None or not one_form or len(frames[0]) > UNIFORM_FRAME_MAX
    for encoding in ENCODINGS:
        assert run_frames(encoding, proto, cols, tuple(subs), replay) == event_frames(
            encoding, proto, rows, subs, replay
        ), encoding
        assert event_batches(encoding, proto, cols, tuple(subs), replay, limit) == pack_batches(
            encoding, event_frames(encoding, proto, rows, subs, replay), limit
        ), encoding


@pytest.mark.parametrize("size", [0, 1, 16, 32])
def test_a_page_read_as_columns_is_written_in_blocks(size: int) -> None:
    """A replay page as SQLite reads it (2,048 rows as columns) spans several of the blocks a batch is
    written in, and batches of any limit cut those blocks anywhere: the same bytes as frame by frame, and
    the same frames one by one."""
    rows = [((1 << 60) + 1000 * i + i % 7, bytes([(i + k) % 256 for k in range(size)])) for i in range(2048)]
    proto = Event("/r", 1000, "abcd1234", rows[0][0], Publisher("native"), rows[0][1], "text/plain")
    cols = RunColumns(b"".join(STAMP.pack(t) for t, _ in rows), b"".join(p for _, p in rows), size, wide=True)
    frames = event_frames("msgpack", proto, rows, ("s",), True)
    for limit in (1 << 20, 100_000, 5000):
        assert uniform_batches(proto, cols, ("s",), True, limit) == pack_batches("msgpack", frames, limit)
    # A connection without batch frames (WebSocket: a message per frame) gets them cut from those blocks.
    assert run_frames("msgpack", proto, cols, ("s",), True) == frames


def test_plain_text_rows_read_as_columns_take_the_json_column_path(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [((1 << 60) + i, b"t %04d" % i) for i in range(300)]
    proto = Event("/r", 7, "abcd1234", rows[0][0], Publisher("native"), rows[0][1], "text/plain")
    cols = RunColumns(b"".join(STAMP.pack(t) for t, _ in rows), b"".join(p for _, p in rows), 6, wide=True)
    want = event_frames("json", proto, rows, ("s",), True)
    monkeypatch.setattr(native_columns, "event_frames", None)  # the fallback is never called
    assert run_frames("json", proto, cols, ("s",), True) == want


def test_a_page_of_small_events_takes_the_column_path() -> None:
    proto = Event("/r", 1000, "abcd1234", 1 << 60, Publisher("native"), b"x" * 16, "text/plain")
    rows = [((1 << 60) + 1000 * i, bytes([i % 256]) * 16) for i in range(2048)]
    got = uniform_batches(proto, rows, ("s",), True, 1 << 20)
    assert got is not None and len(got) == 1
    frames = msgpack.unpackb(got[0])["frames"]
    assert [(f["seq"], f["time"], f["payload"], f["replay"]) for f in frames] == [
        (1000 + i, (1 << 60) + 1000 * i, bytes([i % 256]) * 16, True) for i in range(2048)
    ]
    # A run whose seqs cross a boundary of msgpack's integer forms (127 → 128), or whose payloads differ in
    # size, takes the other path.
    assert uniform_batches(replace(proto, seq=120), rows[:10], ("s",), True, 1 << 20) is None
    assert uniform_batches(proto, [*rows[:3], (1, b"")], ("s",), True, 1 << 20) is None


@settings(max_examples=examples(600), deadline=None)
@given(
    run=st.one_of(runs(), same_size_runs()),
    plain=st.lists(st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=20), max_size=5),
    replay=st.booleans(),
)
def test_run_frames_equal_event_frames(
    run: tuple[Event, list[tuple[int, bytes]]], plain: list[str], replay: bool
) -> None:
    """Any run, and runs of ASCII payloads (mostly plain text JSON leaves alone: the JSON column path), in
    both encodings (each generated case checked in both, as the tests above: 600 cases, 300 per encoding
    before)."""
    proto, rows = run
    for r in (rows, [(t, p.encode()) for (t, _), p in zip(rows, plain, strict=False)]):
        if r:
            head = replace(proto, time_ns=r[0][0], payload=r[0][1])
            for encoding in ENCODINGS:
                assert run_frames(encoding, head, r, ("s",), replay) == event_frames(
                    encoding, head, r, ("s",), replay
                ), encoding


def test_plain_text_payloads_take_the_json_column_path(monkeypatch: pytest.MonkeyPatch) -> None:
    proto = Event("/r", 5, "abcd1234", 7, Publisher("native"), b"a b", "text/plain")
    rows = [(7, b"a b"), (8, b""), (9, b"x/y<z>&")]
    want = event_frames("json", proto, rows, ("s",), True)
    monkeypatch.setattr(native_columns, "event_frames", None)  # the fallback is never called
    assert run_frames("json", proto, rows, ("s",), True) == want
    assert [json.loads(f)["text"] for f in want] == ["a b", "", "x/y<z>&"]
