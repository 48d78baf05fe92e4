"""The publish reply is built from a template cached per channel and epoch
(``NativeCodec.encode_publish_reply``, and per commit ``encode_publish_replies``): it must be byte for byte
the packed map (msgpack) or the compact object (JSON) of native.md §3.4, for every integer width and any
channel."""

from __future__ import annotations

from collections.abc import Sequence

import msgpack
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import native as nc
from hubbub.dialects.native_replies import REPLY_SHAPES_MAX
from hubbub.events import Event, Publisher
from hubbub.log.appended import RunAppended
from hubbub.log.base import EventRun
from tests.hypothesis_budget import examples

widths = st.sampled_from([0, 1, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 63) - 1])
ints = st.one_of(widths, st.integers(0, (1 << 63) - 1))


def event(channel: str, seq: int, epoch: str, time_ns: int) -> Event:
    return Event(channel, seq, epoch, time_ns, Publisher("native", "u", "s", ""), b"p", "x/y", {}, ())


@settings(max_examples=examples(300), deadline=None)
@given(
    rid=ints,
    seq=ints,
    time_ns=ints,
    channel=st.sampled_from(["/a", "/chat/é", "/" + "x" * 40, "/" + "y" * 300]),
    epoch=st.sampled_from(["abcd1234", "e" * 40]),
    duplicate=st.booleans(),
)
def test_reply_is_the_packed_map(
    rid: int, seq: int, time_ns: int, channel: str, epoch: str, duplicate: bool
) -> None:
    codec = nc.NativeCodec("msgpack")
    want = {"op": "reply", "id": rid, "channel": channel, "seq": seq, "epoch": epoch, "time": time_ns}
    if duplicate:
        want["duplicate"] = True
    ev = event(channel, seq, epoch, time_ns)
    for _ in range(2):  # the second reply comes from the cached pieces
        got = codec.encode_publish_reply(rid, ev, duplicate)
        assert got == msgpack.packb(want, use_bin_type=True)
        assert list(msgpack.unpackb(got).items()) == list(want.items())


@settings(max_examples=examples(300), deadline=None)
@given(
    rid=ints,
    seq=ints,
    time_ns=ints,
    channel=st.sampled_from(["/a", "/chat/é", '/q"uo\\te', "/p%d%s%%", "/" + "y" * 300]),
    epoch=st.sampled_from(["abcd1234", "e%d" * 5]),
    duplicate=st.booleans(),
)
def test_json_reply_is_the_compact_object(
    rid: int, seq: int, time_ns: int, channel: str, epoch: str, duplicate: bool
) -> None:
    codec = nc.NativeCodec("json")
    want: dict[str, object] = {
        "op": "reply",
        "id": rid,
        "channel": channel,
        "seq": seq,
        "epoch": epoch,
        "time": str(time_ns),
    }
    if duplicate:
        want["duplicate"] = True
    ev = event(channel, seq, epoch, time_ns)
    for _ in range(2):  # the second reply comes from the cached template
        got = codec.encode_publish_reply(rid, ev, duplicate)
        assert got == orjson.dumps(want)
        assert list(orjson.loads(got).items()) == list(want.items())


def assert_reply_7(got: bytes) -> None:
    """The reply to request 7 for ``/c/0`` seq 9 of epoch ``e`` at time 5, after the caches were filled past
    their bound and cleared."""
    want = {"op": "reply", "id": 7, "channel": "/c/0", "seq": 9, "epoch": "e", "time": 5}
    assert msgpack.unpackb(got) == want


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_reply_pieces_are_bounded_and_stay_right_after_clearing(encoding: nc.Encoding) -> None:
    codec = nc.NativeCodec(encoding)
    for i in range(REPLY_SHAPES_MAX + 10):
        codec.encode_publish_reply(1, event(f"/c/{i}", 1, "e", 1))
    assert len(codec.publish_replies) <= REPLY_SHAPES_MAX
    got = codec.encode_publish_reply(7, event("/c/0", 9, "e", 5))
    assert_reply_7(got if encoding == "msgpack" else msgpack.packb(_json_reply(got)))


class _Result:
    def __init__(self, ev: Event, duplicate: bool = False) -> None:
        self.event = ev
        self.duplicate = duplicate


def encode_replies(codec: nc.NativeCodec, replies: Sequence[tuple[int, _Result]]) -> list[bytes]:
    """The replies of one commit of publishes that each want one."""
    return codec.encode_publish_replies([(rid, True) for rid, _ in replies], [r for _, r in replies])


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(ints, st.sampled_from(["s", None])),  # ids of any JSON type are echoed
            ints,
            ints,
            st.sampled_from(["/a", "/b%s", "/chat/é", "/" + "y" * 300]),
            st.sampled_from(["abcd1234", "e%d" * 5]),
            st.booleans(),
            st.booleans(),
        ),
        max_size=30,
    ),
    st.sampled_from(["msgpack", "json"]),
)
def test_replies_of_a_commit_are_each_reply(
    rows: list[tuple[object, int, int, str, str, bool, bool]], encoding: nc.Encoding
) -> None:
    """The replies of one commit: one for each publish that asked for one (``ack``), in order."""
    codec = nc.NativeCodec(encoding)
    publishes = [(rid, ack) for rid, _, _, _, _, _, ack in rows]
    results = [_Result(event(ch, seq, ep, t), dup) for _, seq, t, ch, ep, dup, _ in rows]
    for _ in range(2):  # the second time from the kept templates
        got = codec.encode_publish_replies(publishes, results)
        want = [
            nc.NativeCodec(encoding).encode_publish_reply(rid, r.event, r.duplicate)
            for (rid, ack), r in zip(publishes, results, strict=True)
            if ack
        ]
        assert got == want
        # One write's bytes: each frame as frame_for_stream frames it, in order.
        assert codec.frames_for_stream(got) == b"".join(map(codec.frame_for_stream, got))


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_reply_formats_are_bounded(encoding: nc.Encoding) -> None:
    codec = nc.NativeCodec(encoding)
    for i in range(REPLY_SHAPES_MAX + 10):
        encode_replies(codec, [(1, _Result(event(f"/c/{i}", 1, "e", 1)))])
    assert len(codec.publish_replies) <= REPLY_SHAPES_MAX
    (got,) = encode_replies(codec, [(7, _Result(event("/c/0", 9, "e", 5)))])
    assert_reply_7(got if encoding == "msgpack" else msgpack.packb(_json_reply(got)))


def _json_reply(frame: bytes) -> dict[str, object]:
    """A JSON reply's object with ``time`` as the integer msgpack carries."""
    obj: dict[str, object] = orjson.loads(frame)
    obj["time"] = int(str(obj["time"]))
    return obj


# Every msgpack integer encoding's bounds (fixint, uint 8/16/32/64, negative fixint, int 8/16/32/64) and the
# JSON ones (digit counts), each with its neighbours: a run crossing them changes the reply's shape.
_WIDTHS = (0, 127, 255, 65535, (1 << 32) - 1, -1, -32, -128, -32768, -(1 << 31), 9, 99, 999_999, 10**18 - 1)
_BOUNDS = [b + d for b in _WIDTHS for d in (-1, 0, 1)] + [
    (1 << 64) - 2,
    (1 << 64) - 1,
    -(1 << 63),
    -(1 << 63) + 1,
]


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_a_run_across_every_integer_width_is_each_packed_reply(encoding: nc.Encoding) -> None:
    """One commit's run of a channel whose ids, seqs and times step across every width boundary, forwards
    and backwards (each step may change the reply's shape, or fall back to a previous one): every reply is
    the whole object's encoding."""
    codec = nc.NativeCodec(encoding)
    values = sorted(_BOUNDS)
    steps = values + values[::-1] + values[::3]
    replies: list[tuple[int, _Result]] = []
    for i, v in enumerate(steps):
        rid = steps[(i * 7) % len(steps)]
        t = steps[(i * 5) % len(steps)]
        ch = "/run" if i % 11 else "/other"
        replies.append((rid, _Result(event(ch, v, "ep", t))))
    for _ in range(2):  # the second time from the kept shapes
        got = encode_replies(codec, replies)
        assert len(got) == len(replies)
        for frame, (rid, r) in zip(got, replies, strict=True):
            ev = r.event
            want = {"op": "reply", "id": rid, "channel": ev.channel, "seq": ev.seq, "epoch": "ep"}
            if encoding == "msgpack":
                want["time"] = ev.time_ns
                assert frame == msgpack.packb(want, use_bin_type=True)
            else:
                want["time"] = str(ev.time_ns)
                assert frame == orjson.dumps(want)
        assert got == [codec.encode_publish_reply(rid, r.event) for rid, r in replies]


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(st.one_of(ints, st.sampled_from(["s", None])), st.booleans()), min_size=1, max_size=40
    ),
    st.sampled_from([1, 127, 255, 65530, (1 << 32) - 3, (1 << 63) - 50]),
    st.lists(st.integers(0, (1 << 63) - 1), min_size=40, max_size=40),
    st.sampled_from(["msgpack", "json"]),
)
def test_the_replies_of_a_run_are_those_of_its_results(
    publishes: list[tuple[object, bool]], seq0: int, times: list[int], encoding: nc.Encoding
) -> None:
    """A run answered as one (``RunAppended``) is encoded from its rows: the same replies as from the
    results it stands for, across the widths of seqs, ids and times (and ids of other types)."""
    codec = nc.NativeCodec(encoding)
    proto = event("/run", seq0, "ep", times[0])
    rows = [(t, b"p") for t in sorted(times)[: len(publishes)]]
    run = EventRun(Event(proto.channel, seq0, "ep", rows[0][0], proto.publisher, b"p", "x/y", {}, ()), rows)
    for _ in range(2):  # the second time from the kept templates
        got = codec.publish_replies.encode_run(publishes, run.proto, run.rows)
        want = codec.encode_publish_replies(publishes, RunAppended(run).results())
        assert got == want
