"""The contract every dialect codec passes (STYLE.md item 3): parsing does not depend on chunking, reads
are bounded, and bad input is rejected with a documented error without desynchronising the stream.

Two registries, one entry per codec:

* :data:`STREAM_CASES`: byte-stream decoders (raw TCP). Each test feeds the same bytes whole, one byte at a
  time, in random chunks, with trailing partial data, and over the limit, and expects the same items.
* :data:`MESSAGE_CASES`: message codecs (one WebSocket message at a time).

A new dialect codec adds one :class:`StreamCase` and/or :class:`MessageCase` below; every test here then
runs against it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack
import orjson
import pytest

from hubbub.dialects import guble as gc
from hubbub.dialects import ivy, mist
from hubbub.dialects import native as nc
from hubbub.errors import CODES, HubbubError


class StreamDecoder(Protocol):
    """What a stream case's decoder offers: ``feed`` returns decoded items and errors in order."""

    @property
    def failed(self) -> bool: ...

    @property
    def buffered(self) -> int: ...

    def feed(self, data: bytes) -> Sequence[object]: ...


@dataclass(frozen=True)
class StreamCase:
    """One stream codec under contract.

    ``messages`` are encoded messages (valid ones, and invalid ones whose error is *not* fatal), each
    framed by every function in ``framers``. ``sized(n)`` builds a valid message of exactly ``n`` bytes.
    ``oversized(max_frame)`` starts a frame that exceeds ``max_frame`` (it need not be complete).
    ``bad_start`` is input that must be refused before any framing is known, if the codec has such.
    """

    name: str
    make: Callable[[int], StreamDecoder]
    framers: Sequence[Callable[[bytes], bytes]]
    messages: Sequence[bytes]
    sized: Callable[[int], bytes]
    oversized: Callable[[int], bytes]
    too_large_code: int
    bad_start: bytes | None = None
    #: Items as comparable values (errors by code and request id).
    normalise: Callable[[object], object] = field(default=lambda x: x)
    #: Messages end by their own syntax (a JSON object at its closing brace), not at the framer's
    #: separator: a partial frame is then cut inside the message itself.
    self_delimiting: bool = False


@dataclass(frozen=True)
class MessageCase:
    name: str
    decode: Callable[[bytes], object]
    messages: Sequence[bytes]
    oversized: Callable[[int], bytes]
    make: Callable[[int], Callable[[bytes], object]]
    too_large_code: int


def _norm_native(item: object) -> object:
    if isinstance(item, HubbubError):
        return ("error", item.code, item.request_id)
    return item


# -- native -----------------------------------------------------------------------------------------------

_NATIVE_OBJECTS: list[dict[str, Any]] = [
    {"op": "hello", "id": 1, "v": 1, "client": "contract/1"},
    {"op": "subscribe", "id": 2, "sub": "s1", "pattern": "/chat/**", "tags": ["b", "a"], "last": 3},
    {"op": "frobnicate", "id": 3},  # 4002, not fatal
    {"op": "publish", "id": 4, "channel": "/chat/room", "text": "hi\nthere é", "ack": True},
    {"op": "publish", "id": 5, "channel": "nope", "text": "x"},  # 4004, not fatal
    {"op": "publish", "id": 6, "channel": "/a", "text": "x", "headers": {":p": "x"}},  # 4001
    {"op": "ping", "id": 7},
    {"op": "unsubscribe", "id": 8, "sub": "s1"},
    {"op": "pong"},
]


def _native_json_messages() -> list[bytes]:
    out = [orjson.dumps(o) for o in _NATIVE_OBJECTS]
    out.insert(3, orjson.dumps({"op": "publish", "id": 9, "channel": "/j", "json": {"a": [1, {"b": None}]}}))
    return out


def _native_mp_messages() -> list[bytes]:
    out = [msgpack.packb(o, use_bin_type=True) for o in _NATIVE_OBJECTS]
    out.insert(3, msgpack.packb({"op": "publish", "id": 9, "channel": "/m", "payload": b"\x00\n\xff"}))
    return out


def _json_sized(n: int) -> bytes:
    base = orjson.dumps({"op": "publish", "id": 1, "channel": "/a", "text": ""})
    pad = n - len(base)
    assert pad >= 0
    return orjson.dumps({"op": "publish", "id": 1, "channel": "/a", "text": "x" * pad})


def _mp_sized(n: int) -> bytes:
    # Grow the text until the packed size hits n exactly (str headers change size at 32/256/65536).
    for k in range(max(0, n - 64), n + 1):
        data: bytes = msgpack.packb({"op": "publish", "id": 1, "channel": "/a", "payload": "x" * k})
        if len(data) == n:
            return data
    raise AssertionError(f"cannot build a msgpack message of {n} bytes")


def _lf(m: bytes) -> bytes:
    return m + b"\n"


def _crlf(m: bytes) -> bytes:
    return m + b"\r\n"


def _len32(m: bytes) -> bytes:
    return len(m).to_bytes(4, "big") + m


STREAM_CASES: list[StreamCase] = [
    StreamCase(
        name="native-jsonl",
        make=nc.NativeStreamDecoder,
        framers=(_lf, _crlf),
        messages=_native_json_messages(),
        sized=_json_sized,
        oversized=lambda max_frame: (
            b'{"op":"publish","id":1,"channel":"/a","text":"' + b"x" * (max_frame + 10)
        ),
        too_large_code=4003,
        bad_start=b'  {"op":"ping"}\n',
        normalise=_norm_native,
    ),
    StreamCase(
        name="native-msgpack",
        make=nc.NativeStreamDecoder,
        framers=(_len32,),
        messages=_native_mp_messages(),
        sized=_mp_sized,
        oversized=lambda max_frame: (max_frame + 1).to_bytes(4, "big") + b"\x85",
        too_large_code=4003,
        bad_start=b"\x01\x00\x00\x05hello",
        normalise=_norm_native,
    ),
]

MESSAGE_CASES: list[MessageCase] = [
    MessageCase(
        name="native-json",
        decode=nc.NativeCodec("json").decode,
        messages=_native_json_messages(),
        oversized=lambda max_frame: _json_sized(max_frame + 1),
        make=lambda max_frame: nc.NativeCodec("json", max_frame=max_frame).decode,
        too_large_code=4003,
    ),
    MessageCase(
        name="native-msgpack",
        decode=nc.NativeCodec("msgpack").decode,
        messages=_native_mp_messages(),
        oversized=lambda max_frame: _mp_sized(max_frame + 1),
        make=lambda max_frame: nc.NativeCodec("msgpack", max_frame=max_frame).decode,
        too_large_code=4003,
    ),
]

# -- ivy: one command per WebSocket text frame (given as its UTF-8 bytes) -----------------------------------

_IVY_MESSAGES: list[bytes] = [
    b"+/chat",
    b"#k2#+/chat/room",
    b":/chat:a:b:c\n\xc3\xa9",
    b"-/chat",
    b"@",
    b"#k1#@",
    b"+/Upper",  # invalid path: close 1002
    b"x",  # unknown command: close 1002
]

MESSAGE_CASES.append(
    MessageCase(
        name="ivy",
        decode=ivy.IvyCodec().decode,
        messages=_IVY_MESSAGES,
        oversized=lambda max_frame: b":/a:" + b"x" * (max_frame - 3),
        make=lambda max_frame: ivy.IvyCodec(max_frame=max_frame).decode,
        too_large_code=4003,
    )
)

# -- guble (one WebSocket message at a time) -----------------------------------------------------------

_GUBLE_MESSAGES: list[bytes] = [
    b'> /foo\n{"k": "v"}\nhello world',
    b"> /foo/bar 42\n\nsub body",
    b"> /foo",
    b"+ /foo",
    b"+ /foo -5,5",
    b"+ /foo 0 3\n",
    b"- /foo\n",
    b"+ /foo abc",
    b"> foo",
    b"XXXX",
    b"> /caf\xc3\xa9\n\n\x00\xff",
]

MESSAGE_CASES.append(
    MessageCase(
        name="guble",
        decode=gc.GubleCodec().decode,
        messages=_GUBLE_MESSAGES,
        oversized=lambda max_frame: b"> /foo\n\n" + b"x" * max_frame,
        make=lambda max_frame: gc.GubleCodec(max_frame=max_frame).decode,
        too_large_code=4003,
    )
)

# -- mist (both generations): connection state machines, adapted to the decoder shape above ----------------


class _MistStream:
    """A mist TCP connection as a :class:`StreamDecoder`: its outputs are the items, except that a fatal
    error's reply and the close after it are one item, ``("error", code, None)``."""

    def __init__(self, conn: mist.Mist2015Connection | mist.Mist1Connection) -> None:
        self.conn = conn

    @property
    def failed(self) -> bool:
        return self.conn.failed

    @property
    def buffered(self) -> int:
        return self.conn.buffered

    def feed(self, data: bytes) -> list[object]:
        items: list[object] = []
        for out in self.conn.receive_data(data):
            if isinstance(out, mist.Close):
                assert self.conn.error is not None
                if items and isinstance(items[-1], mist.Send):
                    items.pop()  # the error's own reply
                items.append(("error", self.conn.error.code, None))
            else:
                items.append(out)
        return items


def _mist_ws_decoder(make: Callable[[], Any]) -> Callable[[bytes], object]:
    """A mist WebSocket connection as a message decoder: a fresh connection per message; a fatal error
    (over ``max_frame``) is raised, everything else is returned as the outputs."""

    def decode(message: bytes) -> object:
        conn = make()
        out = conn.receive_frame(message)
        if conn.failed:
            raise conn.error
        return out

    return decode


_MANY_TAGS = b",".join(b"t%d" % i for i in range(65))

_MIST2015_LINES: list[bytes] = [
    b"ping",
    b"subscribe b,a",
    b"publish a,b some data  with spaces",
    b"pong",
    b"",
    b"ping extra",
    b"publish a",
    b"subscribe a b",
    b"ping\r",
    b"tags tok",
    b"register t1,t2 tok",
    b"set t3 tok",
    b"unset t1 tok",
    b"unregister tok",
    b"subscribe " + _MANY_TAGS,
    b"publish \xff data",
    b"publish caf\xc3\xa9 \x00\xff\r",
]

_MIST1_JSON = [
    b'{"command":"ping"}',
    b'{"command":"subscribe","tags":["b","a"]}',
    b'{"command":"publish","tags":["a","b","a"],"data":"hi\\nthere \xc3\xa9"}',
    b'{"command":"nope","tags":["x"],"data":"d"}',
    b"[1]",
    b'"a string"',
    b'{"command":5}',
    b'{"command":"publish","tags":"a"}',
    b'{"command":"listall","tags":["q"]}',
    b'{"command":"who"}',
    b'{"command":"register","tags":["a"],"data":"t"}',
    b'{"command":"subscribe","tags":[' + b",".join(b'"t%d"' % i for i in range(65)) + b"]}",
    b'{"command":"ping","x":{"nested":[1,-2.5e3,true,null,{"a":"}]\\""}]}}',
]


def _space(m: bytes) -> bytes:
    return m + b" "


def _nothing(m: bytes) -> bytes:
    return m


def _mist2015_sized(n: int) -> bytes:
    return b"publish a " + b"x" * (n - 10)


def _mist1_sized(n: int) -> bytes:
    base = b'{"command":"publish","tags":["a"],"data":""}'
    return base[:-2] + b"x" * (n - len(base)) + base[-2:]


STREAM_CASES += [
    StreamCase(
        name="mist2015-tcp",
        make=lambda max_frame: _MistStream(mist.Mist2015Connection(max_frame=max_frame)),
        framers=(_lf,),
        messages=_MIST2015_LINES,
        sized=_mist2015_sized,
        oversized=lambda max_frame: b"publish a " + b"x" * max_frame,
        too_large_code=4003,
    ),
    StreamCase(
        name="mist1-tcp",
        make=lambda max_frame: _MistStream(mist.Mist1Connection(max_frame=max_frame)),
        framers=(_lf, _crlf, _space, _nothing),
        messages=_MIST1_JSON,
        sized=_mist1_sized,
        oversized=lambda max_frame: b'{"command":"publish","tags":["a"],"data":"' + b"x" * max_frame,
        too_large_code=4003,
        bad_start=b'{"command":"ping"]',
        self_delimiting=True,
    ),
]

_MIST2015_WS = [
    b'{"command":"ping"}',
    b'{"command":"list"}',
    b'{"command":"subscribe","tags":["b","a"]}',
    b'{"command":"unsubscribe","tags":["a","b"]}',
    b'{"command":"subscribe","tags":"a"}',
    b'{"command":"publish","tags":["a"],"data":"x"}',
    b"not json",
    b"[]",
    b'{"command":1}',
    b"\xff",
    b'{"command":"subscribe","tags":[' + b",".join(b'"t%d"' % i for i in range(65)) + b"]}",
]

MESSAGE_CASES += [
    MessageCase(
        name="mist2015-ws",
        decode=_mist_ws_decoder(mist.Mist2015WsConnection),
        messages=_MIST2015_WS,
        oversized=lambda max_frame: b'{"command":"ping","x":"' + b"x" * max_frame + b'"}',
        make=lambda max_frame: _mist_ws_decoder(lambda: mist.Mist2015WsConnection(max_frame=max_frame)),
        too_large_code=4003,
    ),
    MessageCase(
        name="mist1-ws",
        decode=_mist_ws_decoder(mist.Mist1WsConnection),
        messages=[*_MIST1_JSON, b"{garbage", b'{"command":"ping"} {"command":"ping"}'],
        oversized=lambda max_frame: b'{"command":"ping","x":"' + b"x" * max_frame + b'"}',
        make=lambda max_frame: _mist_ws_decoder(lambda: mist.Mist1WsConnection(max_frame=max_frame)),
        too_large_code=4003,
    ),
]


_MIST_ITEM_TYPES = (
    mist.Send,
    mist.Publish,
    mist.Subscribe,
    mist.ListAll,
    mist.Who,
    mist.Register,
    mist.Unregister,
    mist.SetTags,
    mist.UnsetTags,
    mist.TokenTags,
)


def test_mist_stream_items_are_outputs() -> None:
    """Every mist line/value gives exactly one output here, of a documented kind."""
    for case in STREAM_CASES:
        if case.name.startswith("mist"):
            for item in _expected(case):
                assert isinstance(item, _MIST_ITEM_TYPES), item


MAX_FRAME = 4096


def _ids(cases: Sequence[StreamCase] | Sequence[MessageCase]) -> list[str]:
    return [c.name for c in cases]


def _framed(case: StreamCase) -> list[tuple[str, bytes]]:
    return [(f.__name__, b"".join(f(m) for m in case.messages)) for f in case.framers]


def _feed_all(case: StreamCase, chunks: Sequence[bytes], max_frame: int = MAX_FRAME) -> list[object]:
    dec = case.make(max_frame)
    out: list[object] = []
    for c in chunks:
        out.extend(case.normalise(x) for x in dec.feed(c))
    return out


def _expected(case: StreamCase) -> list[object]:
    """Each message decoded on its own, by a fresh decoder: the ground truth for any chunking."""
    out: list[object] = []
    for m in case.messages:
        out.extend(_feed_all(case, [case.framers[0](m)]))
    return out


def _random_chunks(data: bytes, rng: random.Random) -> list[bytes]:
    chunks = []
    i = 0
    while i < len(data):
        n = rng.choice((1, 2, 3, 5, 8, 13, 64, 500))
        chunks.append(data[i : i + n])
        i += n
    return chunks


# -- stream contract --------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_every_item_is_a_command_or_documented_error(case: StreamCase) -> None:
    expected = _expected(case)
    assert len(expected) == len(case.messages)
    for item in expected:
        if isinstance(item, tuple):
            assert item[1] in CODES


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_whole_input(case: StreamCase) -> None:
    for _, data in _framed(case):
        assert _feed_all(case, [data]) == _expected(case)


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_one_byte_at_a_time(case: StreamCase) -> None:
    for _, data in _framed(case):
        assert _feed_all(case, [data[i : i + 1] for i in range(len(data))]) == _expected(case)


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_random_chunks(case: StreamCase) -> None:
    rng = random.Random(1234)
    for _, data in _framed(case):
        for _ in range(20):
            assert _feed_all(case, _random_chunks(data, rng)) == _expected(case)


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_two_frames_in_one_chunk(case: StreamCase) -> None:
    for framer in case.framers:
        first, second = case.messages[0], case.messages[1]
        got = _feed_all(case, [framer(first) + framer(second)])
        assert got == _feed_all(case, [framer(first)]) + _feed_all(case, [framer(second)])
        assert len(got) == 2


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_trailing_partial_data(case: StreamCase) -> None:
    for framer in case.framers:
        whole = framer(case.messages[0])
        nxt = framer(case.messages[1])
        n = len(case.messages[1]) if case.self_delimiting else len(nxt)
        for cut in (1, n // 2, n - 1):
            dec = case.make(MAX_FRAME)
            got = [case.normalise(x) for x in dec.feed(whole + nxt[:cut])]
            assert got == _feed_all(case, [whole])
            assert dec.buffered == cut  # only the incomplete frame is held
            got = [case.normalise(x) for x in dec.feed(nxt[cut:])]
            assert got == _feed_all(case, [nxt])
            assert dec.buffered == 0


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_exactly_max_frame_is_accepted(case: StreamCase) -> None:
    for framer in case.framers:
        for max_frame in (200, 1000):
            msg = case.sized(max_frame)
            assert len(msg) == max_frame
            got = _feed_all(case, [framer(msg) + framer(case.messages[0])], max_frame)
            assert not isinstance(got[0], tuple), got[0]
            assert len(got) == 2


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_over_limit_is_rejected_without_unbounded_buffering(case: StreamCase) -> None:
    max_frame = 1000
    chunk = 100
    for framer in case.framers:
        prefix = framer(case.messages[0])
        data = prefix + case.oversized(max_frame) + b"x" * (10 * max_frame)
        dec = case.make(max_frame)
        items: list[object] = []
        peak = 0
        for i in range(0, len(data), chunk):
            items.extend(case.normalise(x) for x in dec.feed(data[i : i + chunk]))
            peak = max(peak, dec.buffered)
        assert peak <= max_frame + chunk + 8  # one frame, one chunk, a length prefix or CR
        assert items[0] == _feed_all(case, [prefix])[0]
        assert isinstance(items[-1], tuple) and items[-1][1] == case.too_large_code
        assert len(items) == 2
        assert dec.failed and dec.buffered == 0
        assert dec.feed(prefix) == []  # nothing more is read after a fatal error


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_over_limit_in_one_chunk(case: StreamCase) -> None:
    max_frame = 1000
    for framer in case.framers:
        data = framer(case.messages[0]) + case.oversized(max_frame) + b"\n" + framer(case.messages[0])
        items = _feed_all(case, [data], max_frame)
        assert len(items) == 2 and isinstance(items[1], tuple) and items[1][1] == case.too_large_code


@pytest.mark.parametrize(
    "case", [c for c in STREAM_CASES if c.bad_start], ids=_ids([c for c in STREAM_CASES if c.bad_start])
)
def test_stream_bad_start_is_fatal(case: StreamCase) -> None:
    assert case.bad_start is not None
    dec = case.make(MAX_FRAME)
    items = [case.normalise(x) for x in dec.feed(case.bad_start)]
    assert len(items) == 1 and isinstance(items[0], tuple) and items[0][1] in CODES
    assert dec.failed
    assert dec.feed(case.framers[0](case.messages[0])) == []


@pytest.mark.parametrize("case", STREAM_CASES, ids=_ids(STREAM_CASES))
def test_stream_empty_feeds_are_harmless(case: StreamCase) -> None:
    data = _framed(case)[0][1]
    chunks = [b""] + [x for i in range(0, len(data), 7) for x in (data[i : i + 7], b"")]
    assert _feed_all(case, chunks) == _expected(case)


# -- native-specific framing details ----------------------------------------------------------------------


def test_native_jsonl_blank_lines_and_bare_cr_are_skipped() -> None:
    dec = nc.NativeStreamDecoder()
    assert dec.feed(b'{"op":"ping","id":1}\n\n\r\n{"op":"ping","id":2}\r\n') == [nc.Ping(1), nc.Ping(2)]
    assert dec.encoding == "json"


def test_native_jsonl_crlf_line_of_exactly_max_frame() -> None:
    msg = _json_sized(300)
    dec = nc.NativeStreamDecoder(300)
    # Deliver the line up to and including its CR: that is max_frame + 1 bytes, which must be held.
    assert dec.feed(msg + b"\r") == [] and dec.buffered == 301 and not dec.failed
    assert len(dec.feed(b"\n")) == 1 and dec.buffered == 0


def test_native_jsonl_non_object_line_is_fatal() -> None:
    dec = nc.NativeStreamDecoder()
    items = dec.feed(b'{"op":"ping","id":1}\n[1]\n{"op":"ping","id":2}\n')
    assert items[0] == nc.Ping(1)
    assert isinstance(items[1], HubbubError) and items[1].code == 4000 and len(items) == 2
    assert dec.failed and dec.error is items[1]


def test_native_msgpack_length_at_or_over_2_24_is_too_large() -> None:
    dec = nc.NativeStreamDecoder(max_frame=1 << 30)
    assert dec.feed(_len32(msgpack.packb({"op": "ping"}))) == [nc.Ping()]
    # A frame of 2^24 - 1 bytes is within the framing (its first byte is still 0x00)...
    dec = nc.NativeStreamDecoder(max_frame=1 << 30)
    assert dec.feed(((1 << 24) - 1).to_bytes(4, "big")) == [] and not dec.failed
    # ...and a later length of 2^24 or more is refused, whatever max_frame says.
    dec = nc.NativeStreamDecoder(max_frame=1 << 30)
    dec.feed(_len32(msgpack.packb({"op": "ping"})))
    items = dec.feed((1 << 24).to_bytes(4, "big"))
    assert len(items) == 1 and isinstance(items[0], HubbubError) and items[0].code == 4003


def test_native_msgpack_empty_frame_is_bad_frame() -> None:
    dec = nc.NativeStreamDecoder()
    items = dec.feed(b"\x00\x00\x00\x00")
    assert len(items) == 1 and isinstance(items[0], HubbubError) and items[0].code == 4000


def test_native_detected_codec_answers_in_the_same_encoding() -> None:
    for first, enc in ((b"{", "json"), (b"\x00", "msgpack")):
        dec = nc.NativeStreamDecoder(max_frame=512, max_tags=2)
        with pytest.raises(RuntimeError):
            _ = dec.codec
        dec.feed(first)
        assert dec.encoding == enc and dec.codec.encoding == enc
        assert dec.codec.max_frame == 512 and dec.codec.limits.max_tags == 2


# -- message contract -------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", MESSAGE_CASES, ids=_ids(MESSAGE_CASES))
def test_message_accepted_or_documented_error(case: MessageCase) -> None:
    for m in case.messages:
        try:
            case.decode(m)
        except HubbubError as exc:
            assert exc.code in CODES


@pytest.mark.parametrize("case", MESSAGE_CASES, ids=_ids(MESSAGE_CASES))
def test_message_over_limit(case: MessageCase) -> None:
    decode = case.make(300)
    with pytest.raises(HubbubError) as info:
        decode(case.oversized(300))
    assert info.value.code == case.too_large_code


@pytest.mark.parametrize("case", MESSAGE_CASES, ids=_ids(MESSAGE_CASES))
def test_message_truncations_are_rejected_cleanly(case: MessageCase) -> None:
    for m in case.messages:
        for cut in range(len(m)):
            try:
                case.decode(m[:cut])
            except HubbubError as exc:
                assert exc.code in CODES
