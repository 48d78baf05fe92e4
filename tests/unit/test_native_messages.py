"""A burst of native WebSocket messages decoded at once (:func:`decode_messages`): the common publishes in
runs, everything else as the codec decodes each message alone, in order, up to the first fatal error."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any, cast

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import native as nc
from hubbub.errors import HubbubError
from tests.hypothesis_budget import examples


def expand(items: list[nc.RunItem]) -> list[Any]:
    """Items as comparable values, a run as its publishes, an error by class, code and request id."""
    out: list[Any] = []
    for x in items:
        if isinstance(x, nc.PublishRun):
            assert 0 < len(x) <= nc.RUN_MAX
            out += x.commands()
        elif isinstance(x, HubbubError):
            out.append((type(x).__name__, x.code, x.request_id))
        else:
            out.append(x)
    return out


def one_by_one(codec: nc.NativeCodec, messages: Sequence[bytes | str]) -> list[Any]:
    out: list[Any] = []
    for m in messages:
        try:
            out.append(codec.decode(m))
        except HubbubError as exc:
            out.append((type(exc).__name__, exc.code, exc.request_id))
            if exc.fatal:
                break
    return out


def _publish(i: int, channel: str, encoding: str, payload: str, ack: bool | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"op": "publish", "id": i, "channel": channel}
    if encoding == "json":
        obj["text"] = payload
    else:
        obj["payload"] = payload.encode()
    if ack is not None:
        obj["ack"] = ack
    return obj


#: Messages other than the common publish: other commands, publishes of other shapes, bad ones.
_OTHERS: list[dict[str, Any] | str] = [
    {"op": "ping", "id": 5},
    {"op": "subscribe", "id": 6, "sub": "s", "pattern": "/a/*"},
    {"op": "publish", "id": 7, "channel": "/a", "text": "x", "tags": ["t"]},
    {"op": "publish", "id": 8, "channel": "/a", "json": {"big": 123456789012345678901234567890}},
    {"op": "publish", "id": 9, "channel": "/a", "b64": "eA=="},
    {"op": "publish", "id": 10, "channel": "bad channel", "text": "x"},
    {"op": "publish", "id": -1, "channel": "/a", "text": "x"},
    {"op": "publish", "id": 11, "channel": "/a", "text": "x", "ack": "yes"},
    {"op": "nope", "id": 12},
    {"op": "publish", "id": 1 << 70, "channel": "/a", "text": "x"},
    "not json {",  # fatal: 4000
    "[1, 2]",  # fatal: not an object
]


def _encode(obj: dict[str, Any] | str, encoding: str, as_str: bool) -> bytes | str:
    """One message: JSON text (as ``str`` when ``as_str``: aiohttp's text frames) or msgpack bytes (an
    object msgpack cannot hold, an integer past 64 bits, becomes a byte that no msgpack value begins with)."""
    if isinstance(obj, str):
        return obj if as_str else obj.encode()
    if encoding == "json":
        raw = json.dumps(obj, separators=(",", ":"))  # integers beyond 64 bits keep their digits
        return raw if as_str else raw.encode()
    if "text" in obj:  # msgpack's publish carries its payload as bin
        obj = {("payload" if k == "text" else k): (v.encode() if k == "text" else v) for k, v in obj.items()}
    try:
        body: bytes = msgpack.packb(obj, use_bin_type=True)
    except OverflowError:
        return b"\xc1"
    return body


#: A common publish (id, channel, payload, ack), built in the test's encoding, or one of :data:`_OTHERS`.
message = st.one_of(
    st.tuples(
        st.integers(0, 1000),
        st.sampled_from(["/a", "/b/c", "//a", "/new/%d"]),
        st.sampled_from(["", "x", "é☃", "p" * 40]),
        st.sampled_from([None, True, False]),
    ),
    st.sampled_from(_OTHERS),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(message, max_size=40),
    st.sampled_from(["json", "msgpack"]),
    st.booleans(),
    st.integers(0, 3),
)
def test_a_burst_decodes_as_its_messages_one_by_one(
    drawn: list[tuple[int, str, str, bool | None] | dict[str, Any] | str],
    encoding: nc.Encoding,
    as_str: bool,
    warm: int,
) -> None:
    objs = [_publish(x[0], x[1], encoding, x[2], x[3]) if isinstance(x, tuple) else x for x in drawn]
    codec = nc.NativeCodec(encoding)
    # Some channels known to the codec already (the general path canonicalizes a channel's first publish).
    for ch in ("/a", "/b/c", "//a")[:warm]:
        codec.decode(_encode(_publish(0, ch, encoding, "", None), encoding, as_str))
    messages = [_encode(o, encoding, as_str and encoding == "json") for o in objs]
    # The reference decodes with a codec that knows the same channels (its cache changes no result).
    ref = nc.NativeCodec(encoding)
    for ch in ("/a", "/b/c", "//a")[:warm]:
        ref.decode(_encode(_publish(0, ch, encoding, "", None), encoding, as_str))
    want = one_by_one(ref, messages)
    assert expand(nc.decode_messages(codec, messages)) == want


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_a_burst_of_common_publishes_is_cut_into_runs(encoding: nc.Encoding) -> None:
    codec = nc.NativeCodec(encoding)
    codec.decode(_encode(_publish(0, "/a", encoding, "", None), encoding, False))
    n = 2 * nc.RUN_MAX + 3
    items = nc.decode_messages(
        codec, [_encode(_publish(i, "/a", encoding, "x", True), encoding, False) for i in range(n)]
    )
    assert [type(x) for x in items] == [nc.PublishRun] * 3
    runs = cast(list[nc.PublishRun], items)  # as just asserted
    assert [len(x) for x in runs] == [nc.RUN_MAX, nc.RUN_MAX, 3]
    assert [rid for x in runs for rid, _ in x.replies] == list(range(n))


def test_a_msgpack_text_frame_is_refused_as_one_alone() -> None:
    codec = nc.NativeCodec("msgpack")
    items = nc.decode_messages(codec, ['{"op":"ping"}', msgpack.packb({"op": "ping"})])
    assert expand(items) == [("BadFrame", 4000, None)]


# -- learned JSON layouts ---------------------------------------------------------------------------------

#: Values of a JSON publish's fields as raw JSON text: the first of each is the usual one, the others keep
#: or break the layout (an id with a leading zero, a sign, a fraction, past MAX_ID; a channel or a text with
#: an escape, a control character or a NUL, the messages' separator).
_IDS = ["7", "0", "2147483647", "2147483648", "12345678901", "01", "-1", "3.0", "3e2", '"5"', "1000000000"]
_CHANNELS = ['"/a"', '"/b/c"', '"/new"', '"bad channel"', '"/a\\u0041"', '"/\u00e9"', '"/a\\/"', "7"]
_TEXTS = [
    '"hello"',
    '""',
    '"\u00e9\u2603 x"',
    '"a\\"b"',
    '"a\\\\b"',
    '"a\\u0000b"',
    '"a\x00b"',
    '"a\x01b"',
    '"\\ud800"',
    '"a\\nb"',
    "null",
    '"\x7f"',
]
_ACKS = ["true", "false", '"yes"', "null", "1"]


@st.composite
def json_layout_messages(draw: st.DrawFn) -> list[str]:
    """Messages of one JSON publish layout (one key order and spacing), with fields that keep or break it."""
    keys = draw(st.permutations(["op", "id", "channel", "text", "ack"]))
    if draw(st.booleans()):
        keys = [k for k in keys if k != "ack"]
    space = draw(st.sampled_from(["", " ", "\n", " \t"]))
    out: list[str] = []
    for _ in range(draw(st.integers(0, 60))):
        # One field at a time of another form (so that the rest of the message keeps the layout).
        odd = (
            draw(st.sampled_from(["op", "id", "channel", "text", "ack", "key"]))
            if draw(st.integers(0, 3)) == 0
            else ""
        )
        values = {
            "op": draw(st.sampled_from(['"ping"', '"publis"'])) if odd == "op" else '"publish"',
            "id": draw(st.sampled_from(_IDS)) if odd == "id" else str(draw(st.integers(0, 99999))),
            "channel": draw(st.sampled_from(_CHANNELS)) if odd == "channel" else '"/a"',
            "text": draw(st.sampled_from(_TEXTS))
            if odd == "text"
            else json.dumps(draw(st.text(max_size=6)), ensure_ascii=False),
            "ack": draw(st.sampled_from(_ACKS)) if odd == "ack" else "true",
        }
        order = list(keys)
        if odd == "key":
            order.append(draw(st.sampled_from(["id", "text", "tags", "json"])))  # a duplicate or another key
            values.setdefault("tags", '["t"]')
            values.setdefault("json", "1")
        body = ("," + space).join(f'"{k}"{space}:{space}{values[k]}' for k in order)
        out.append(space + "{" + body + "}" + space)
    return out


@settings(max_examples=examples(300), deadline=None)
@given(json_layout_messages(), st.lists(st.integers(0, 60), max_size=5))
def test_bursts_read_with_a_learned_layout_decode_as_their_messages_one_by_one(
    messages: list[str], cuts: list[int]
) -> None:
    """A connection's learned JSON layout (JsonLayouts, kept across its bursts) reads exactly what orjson
    and the codec read of each message alone."""
    codec, ref = nc.NativeCodec("json"), nc.NativeCodec("json")
    for c in (codec, ref):
        c.decode('{"op":"publish","id":0,"channel":"/a","text":""}')
    layouts = nc.JsonLayouts()
    bounds = sorted({min(c, len(messages)) for c in cuts} | {0, len(messages)})
    got: list[Any] = []
    for a, b in itertools.pairwise(bounds):
        items = nc.decode_messages(codec, list(messages[a:b]), layouts)
        got += expand(items)
        if items and isinstance(items[-1], HubbubError) and items[-1].fatal:
            break
    assert got == one_by_one(ref, list(messages))


def test_a_learned_layout_reads_a_burst_at_once() -> None:
    codec = nc.NativeCodec("json")
    codec.decode('{"op":"publish","id":0,"channel":"/a","text":""}')
    layouts = nc.JsonLayouts()
    messages = [f'{{"op": "publish", "id": {i}, "channel": "/a", "text": "m{i}"}}' for i in range(600)]
    items = nc.decode_messages(codec, messages, layouts)
    assert [len(x) for x in items] == [256, 256, 88]  # type: ignore[arg-type]  # runs: a TypeError if not
    assert layouts.hits == 599  # the first message was read alone, and taught the layout
    assert expand(items) == one_by_one(nc.NativeCodec("json"), messages)


def test_a_layout_reads_no_message_longer_than_its_limit() -> None:
    """Past TAKE_MAX_CHARS the expression's scan costs more than orjson's reading: such messages are read
    alone (and teach nothing), shorter ones of the same layout with it; every message reads as alone."""
    codec = nc.NativeCodec("json")
    codec.decode('{"op":"publish","id":0,"channel":"/a","text":""}')
    head = len('{"op":"publish","id":1,"channel":"/a","text":""}')

    def message(i: int, size: int) -> str:
        return f'{{"op":"publish","id":{i},"channel":"/a","text":"{"x" * (size - head)}"}}'

    limit = nc.TAKE_MAX_CHARS
    long_first = nc.JsonLayouts()
    messages = [message(i % 10, limit + 1) for i in range(300)]
    items = nc.decode_messages(codec, messages, long_first)
    assert long_first.shape is None and long_first.hits == 0
    assert expand(items) == one_by_one(nc.NativeCodec("json"), messages)

    layouts = nc.JsonLayouts()
    at_limit = [message(i % 10, limit) for i in range(300)]
    mixed = [message(i % 10, limit + 1 if i % 2 else 60) for i in range(300)]
    items = nc.decode_messages(codec, at_limit, layouts)
    assert layouts.hits == 299
    items += nc.decode_messages(codec, mixed, layouts)
    assert layouts.hits <= 299 + 150  # none of the long ones
    assert expand(items) == one_by_one(nc.NativeCodec("json"), at_limit + mixed)


class _Unlearning(nc.JsonLayouts):
    """A connection's layouts that never learn one: every line is read alone (the reference)."""

    __slots__ = ()

    def learn(self, m: str) -> bool:
        self.learn_in = 256
        return False


def _stream_decoders() -> tuple[nc.NativeStreamDecoder, nc.NativeStreamDecoder]:
    """A TCP stream decoder and its reference (no layouts), both past a first publish on ``/a``."""
    got, ref = nc.NativeStreamDecoder(), nc.NativeStreamDecoder()
    ref._layouts = _Unlearning()
    first = b'{"op":"publish","id":0,"channel":"/a","text":""}\n'
    assert expand(got.feed_runs(first)) == expand(ref.feed_runs(first))
    return got, ref


@settings(max_examples=examples(300), deadline=None)
@given(
    json_layout_messages().filter(lambda ms: not any("\n" in m for m in ms)),
    st.lists(st.integers(0, 4000), max_size=6),
    st.sampled_from([b"\n", b"\r\n"]),
    st.lists(st.integers(0, 60), max_size=2),
)
def test_json_lines_read_with_a_learned_layout_decode_as_each_line_alone(
    messages: list[str], cuts: list[int], newline: bytes, blanks: list[int]
) -> None:
    """JSON lines over TCP: a connection's learned layout reads bursts of lines (``_take_lines``), in any
    cut of the stream into reads, CRLF lines and blank lines among them, exactly as each line read alone."""
    lines = [m.encode("utf-8") for m in messages]
    for at in blanks:
        lines.insert(min(at, len(lines)), b"")
    stream = b"".join(line + newline for line in lines)
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    got, ref = _stream_decoders()
    out: list[Any] = []
    want: list[Any] = []
    for a, b in itertools.pairwise(bounds):
        out += expand(got.feed_runs(stream[a:b]))
        want += expand(ref.feed_runs(stream[a:b]))
    assert out == want
    assert got.failed == ref.failed


def test_json_lines_of_one_layout_are_read_a_burst_at_once() -> None:
    got, ref = _stream_decoders()
    line = b'{"op": "publish", "id": %d, "channel": "/a", "text": "m\xc3\xa9%d"}\n'
    lines = b"".join(line % (i, i) for i in range(1, 601))
    items = got.feed_runs(lines)
    assert [len(x) for x in items] == [256, 256, 88]  # type: ignore[arg-type]  # runs: a TypeError if not
    layouts = got._layouts
    assert layouts is not None and layouts.hits == 599  # the first line was read alone, and taught the layout
    assert expand(items) == expand(ref.feed_runs(lines))
    # A line cut by the read is read once whole, with the layout.
    other = b'{"op": "publish", "id": %d, "channel": "/a", "text": "x"}\n'
    more = b"".join(other % i for i in range(601, 611))
    assert expand(got.feed_runs(more[:30]) + got.feed_runs(more[30:])) == expand(ref.feed_runs(more))
    assert layouts.hits == 609
