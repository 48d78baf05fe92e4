"""``FrameParser`` (RFC 6455 on the server's side): the same messages and control frames however the stream is
cut (whole, a byte at a time, split at every offset), fragments reassembled, and each broken rule failed with
its close code, found from the frame's header before its payload is held."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubbub.ws_frames import (
    BINARY,
    CLOSE,
    PING,
    PONG,
    TEXT,
    FrameError,
    FrameParser,
    close_payload,
    unmask,
)

#: A fixed masking key: the same frames (and test ids) in every run and worker.
KEY = b"\x5a\xa5\x0f\xf0"


def frame(
    payload: bytes, opcode: int = TEXT, *, fin: bool = True, masked: bool = True, rsv: int = 0
) -> bytes:
    """One frame in any of the three length forms, masked unless ``masked`` is false."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | rsv << 4 | opcode])
    bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if not masked:
        return head + payload
    return head + KEY + unmask(KEY, payload)


def parse(stream: bytes, cuts: list[int] | None = None, limit: int = 1 << 20) -> list[object]:
    """The items of ``stream`` fed in pieces cut at ``cuts``, and the close code it failed with, if any."""
    parser = FrameParser(limit)
    out: list[object] = []
    bounds = [0, *(cuts or []), len(stream)]
    try:
        for a, b in itertools.pairwise(bounds):
            parser.feed(stream[a:b])
            while (item := parser.next()) is not None:
                out.append(item)
    except FrameError as e:
        out.append(int(e.code))
    return out


MIXED = (
    frame(b"hello")
    + frame(b"\x00\x01" * 100, BINARY)
    + frame(b"p", PING)
    + frame("é".encode() * 40000)  # a 64-bit length
    + frame(b"frag", TEXT, fin=False)
    + frame(b"", PONG)
    + frame(b"ment", 0, fin=False)
    + frame(b"ed", 0)
    + frame(close_payload(1000, "bye"), CLOSE)
)
EXPECTED = [
    (TEXT, "hello"),
    (BINARY, b"\x00\x01" * 100),
    (PING, b"p"),
    (TEXT, "é" * 40000),
    (PONG, b""),
    (TEXT, "fragmented"),
    (CLOSE, struct.pack("!H", 1000) + b"bye"),
]


def test_whole_and_a_byte_at_a_time() -> None:
    assert parse(MIXED) == EXPECTED
    assert parse(MIXED, list(range(1, len(MIXED)))) == EXPECTED


def test_split_at_every_offset() -> None:
    small = frame(b"ab") + frame(b"c" * 130, BINARY) + frame(b"x", PING)
    want = parse(small)
    assert want == [(TEXT, "ab"), (BINARY, b"c" * 130), (PING, b"x")]
    for at in range(1, len(small)):
        assert parse(small, [at]) == want, at


def test_nothing_is_held_once_the_input_is_used() -> None:
    parser = FrameParser(1 << 20)
    parser.feed(frame(b"x" * 1000))
    assert parser.next() == (TEXT, "x" * 1000)
    assert parser.next() is None and parser.buffered == 0


@pytest.mark.parametrize(
    ("stream", "code"),
    [
        (frame(b"x", masked=False), 1002),
        (frame(b"x", rsv=1), 1002),
        (frame(b"x", rsv=4), 1002),
        (frame(b"x", 0x3), 1002),
        (frame(b"x", 0xB), 1002),
        (frame(b"x", PING, fin=False), 1002),
        (frame(b"x" * 126, PING), 1002),
        (frame(b"x", 0), 1002),
        (frame(b"a", TEXT, fin=False) + frame(b"b", TEXT), 1002),
        (frame(b"\xc3\x28"), 1007),
        (frame(b"\xc3", TEXT, fin=False) + frame(b"\x28", 0), 1007),
        (frame(b"\x03", CLOSE), 1002),
        (frame(struct.pack("!H", 1005), CLOSE), 1002),
        (frame(struct.pack("!H", 999), CLOSE), 1002),
        (frame(struct.pack("!H", 5000), CLOSE), 1002),
        (frame(struct.pack("!H", 1000) + b"\xff", CLOSE), 1007),
    ],
)
def test_a_broken_rule_fails_with_its_code(stream: bytes, code: int) -> None:
    assert parse(stream)[-1] == code
    assert parse(stream, list(range(1, len(stream))))[-1] == code


def test_the_limit_applies_to_the_whole_message_from_the_headers() -> None:
    assert parse(frame(b"x" * 100), limit=100) == [(TEXT, "x" * 100)]
    assert parse(frame(b"x" * 101), limit=100) == [1009]
    # A header over the limit fails before its payload arrives.
    parser = FrameParser(100)
    parser.feed(frame(b"x" * 70_000)[:20])
    with pytest.raises(FrameError) as e:
        parser.next()
    assert e.value.code == 1009
    parts = frame(b"x" * 60, TEXT, fin=False) + frame(b"p", PING) + frame(b"y" * 41, 0)
    assert parse(parts, limit=100) == [(PING, b"p"), 1009]
    assert parse(parts, limit=101) == [(PING, b"p"), (TEXT, "x" * 60 + "y" * 41)]


def test_close_codes_a_peer_may_send() -> None:
    for code in (1000, 1001, 1003, 1011, 3000, 4999):
        assert parse(frame(struct.pack("!H", code), CLOSE)) == [(CLOSE, struct.pack("!H", code))]
    assert parse(frame(b"", CLOSE)) == [(CLOSE, b"")]


def test_a_client_parser_wants_unmasked_frames() -> None:
    parser = FrameParser(100, server=False, decode_text=False)
    parser.feed(frame(b"hi", masked=False) + frame(b"hi"))
    assert parser.next() == (TEXT, b"hi")
    with pytest.raises(FrameError):
        parser.next()


@given(
    st.lists(
        st.tuples(st.sampled_from([TEXT, BINARY]), st.text(max_size=300), st.integers(1, 4)), max_size=6
    ),
    st.lists(st.integers(1, 2000), max_size=8),
)
def test_any_messages_however_cut(messages: list[tuple[int, str, int]], cuts: list[int]) -> None:
    stream = b""
    want: list[object] = []
    for op, text, pieces in messages:
        data = text.encode()
        size = max(1, -(-len(data) // pieces))
        chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
        for i, c in enumerate(chunks):
            stream += frame(c, op if i == 0 else 0, fin=i == len(chunks) - 1)
        want.append((op, text if op == TEXT else data))
    at = sorted({c for c in cuts if c < len(stream)})
    assert parse(stream, at) == want


def test_a_burst_is_taken_at_once_up_to_the_next_other_frame() -> None:
    """``take`` gives the common messages that follow in one call, and stops before a ping, a fragment or a
    frame not yet whole, which ``next`` then gives."""
    stream = frame(b"a") + frame(b"b", BINARY) + frame(b"c" * 200) + frame(b"p", PING) + frame(b"d")
    parser = FrameParser(1 << 20)
    parser.feed(stream + frame(b"e", TEXT, fin=False) + frame(b"f", 0) + frame(b"g")[:3])
    assert parser.next() == (TEXT, "a")
    assert parser.take(1) == [b"b"]
    assert parser.take(10) == ["c" * 200]
    assert parser.take(10) == []
    assert parser.next() == (PING, b"p")
    assert parser.take(10) == ["d"]
    assert parser.next() == (TEXT, "ef")
    assert parser.take(10) == [] and parser.next() is None
    parser.feed(frame(b"g")[3:] + frame(b"\xff"))
    assert parser.take(10) == ["g"]  # stops before the broken frame
    with pytest.raises(FrameError):
        parser.next()


def test_the_servers_compiled_unmasking_reads_the_same() -> None:
    """The server's sockets unmask with aiohttp's compiled XOR: the same messages as the pure one."""
    from hubbub.transports import ws_socket

    # The module's own choice of XOR, imported there (not re-exported): what its sockets use.
    parser = FrameParser(1 << 20, unmask=ws_socket._unmask_into)  # type: ignore[attr-defined]
    parser.feed(MIXED)
    got: list[object] = []
    while (item := parser.next()) is not None:
        got.append(item)
        if item[0] in (TEXT, BINARY):
            got += [(TEXT if isinstance(m, str) else BINARY, m) for m in parser.take(10)]
    assert got == EXPECTED


#: Payload sizes at and around each header form's bounds.
_SIZES = [0, 1, 125, 126, 127, 300, 65535, 65536]


@given(st.lists(st.sampled_from(_SIZES), max_size=12), st.sampled_from([0x1, 0x2]), st.booleans())
def test_a_burst_is_framed_as_each_frame_alone(sizes: list[int], opcode: int, uniform: bool) -> None:
    """``ws_write.ws_frames`` gives the bytes of each frame framed alone, which a client's parser reads back
    as the same messages."""
    from hubbub.transports.ws_write import ws_frames

    if uniform and sizes:
        sizes = [sizes[0]] * len(sizes)
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    burst = b"".join(ws_frames(payloads, opcode))
    assert burst == b"".join(frame(p, opcode, masked=False) for p in payloads)
    parser = FrameParser(1 << 20, server=False, decode_text=False)
    parser.feed(burst)
    got = []
    while (item := parser.next()) is not None:
        got.append(item)
    assert got == [(opcode, p) for p in payloads]


def _keyed(payload: bytes, opcode: int, key: bytes) -> bytes:
    """A masked frame with its own key (a client draws one per frame)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    else:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    return head + key + unmask(key, payload)


#: Payloads of a few sizes, some the same size (a client's burst): text, text with many zeros, a byte that
#: is not UTF-8, and the two-byte form of the length.
_PAYLOADS = [
    b'{"op":"publish","id":1}',
    b'{"op":"publish","id":2}',
    b"\x00" * 23,
    b"ab\x00\x00\x00\x00\x00\x00\x00\x00cdefghijklmno",
    b'{"op":"publish","id":\xff}',
    "é".encode() * 11 + b"x",
    b"",
    b"z" * 200,
    b"y" * 200,
]


@st.composite
def bursts(draw: st.DrawFn) -> tuple[bytes, list[int], list[int]]:
    """A client's frames, mostly whole messages of a few sizes (runs alike but for key and payload), with
    pings, fragments and broken frames among them; cuts of the stream; the ``most`` of each take."""
    out = b""
    usual = draw(st.sampled_from(_PAYLOADS))
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.integers(0, 20))
        payload = usual if draw(st.integers(0, 2)) else draw(st.sampled_from(_PAYLOADS))
        key = draw(st.binary(min_size=4, max_size=4))
        if kind < 16:
            out += _keyed(payload, draw(st.sampled_from([TEXT, TEXT, TEXT, BINARY])), key)
        elif kind == 16:
            out += frame(b"p", PING)
        elif kind == 17:
            out += frame(payload[:3], TEXT, fin=False) + frame(payload[3:], 0)
        elif kind == 18:
            out += frame(payload, TEXT, masked=False)  # 1002
        elif kind == 19:
            out += frame(payload, TEXT, rsv=1)  # 1002
        else:
            out += _keyed(b"w" * 300, TEXT, key)  # over the limit below: 1009
    cuts = sorted(draw(st.lists(st.integers(0, len(out)), max_size=4)))
    mosts = draw(st.lists(st.integers(1, 64), min_size=1, max_size=4))
    return out, cuts, mosts


@given(bursts())
def test_take_reads_a_burst_as_next_reads_each_frame(inp: tuple[bytes, list[int], list[int]]) -> None:
    """``take`` (a run of frames alike unmasked and decoded at once) gives what ``next`` gives frame by frame,
    and fails the stream at the same frame with the same code."""
    stream, cuts, mosts = inp
    want = parse(stream, cuts, limit=256)
    parser = FrameParser(256)
    got: list[object] = []
    turn = 0
    try:
        for a, b in itertools.pairwise([0, *cuts, len(stream)]):
            parser.feed(stream[a:b])
            while True:
                turn += 1
                taken = parser.take(mosts[turn % len(mosts)])
                got += [(TEXT if isinstance(m, str) else BINARY, m) for m in taken]
                if taken:
                    continue
                item = parser.next()
                if item is None:
                    break
                got.append(item)
    except FrameError as e:
        got.append(int(e.code))
    assert got == want


def test_a_burst_is_looked_for_only_where_the_next_frame_is_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's column scan (over the rest of the read) is tried only where the next frame's header is the
    frame's own: frames of changing sizes (a mixed-size client) are read one by one without it, and a burst of
    one size still at once."""
    import hubbub.ws_frames as wf

    scans: list[int] = []
    real = wf._unmask_burst

    def counted(*args: Any, **kw: Any) -> Any:  # passes on whatever it is given
        scans.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(wf, "_unmask_burst", counted)
    payloads = [b"m" * (20 + i % 5) + b"-" + str(i).encode() for i in range(300)]
    mixed = b"".join(_keyed(p, TEXT, bytes([i % 256, 1, 2, 3])) for i, p in enumerate(payloads))
    parser = FrameParser(1 << 20)
    parser.feed(mixed)
    got: list[bytes | str] = []
    while batch := parser.take(256):
        got += batch
    assert got == [p.decode() for p in payloads]
    assert scans == []
    same = [b"s%03d" % i for i in range(300)]
    parser.feed(b"".join(_keyed(p, TEXT, bytes([i % 256, 9, 8, 7])) for i, p in enumerate(same)))
    got = []
    while batch := parser.take(256):
        got += batch
    assert got == [p.decode() for p in same]
    assert 1 <= len(scans) <= 3
