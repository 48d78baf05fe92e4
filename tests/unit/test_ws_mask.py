"""``MaskCheck`` (RFC 6455 §5.1 on the server's side): the first unmasked client frame is found at its header,
however the stream is cut into reads: whole, one byte at a time, in random pieces, with data after it."""

from __future__ import annotations

import os
import struct

from hypothesis import given
from hypothesis import strategies as st

from hubbub.disconnect import Disconnect
from hubbub.transports.ws_mask import CLOSE_PROTOCOL_ERROR, MaskCheck


def frame(payload: bytes, *, masked: bool = True, opcode: int = 0x1, fin: bool = True) -> bytes:
    """One client frame: the three length forms (7 bits, 16 bits, 64 bits), with a mask key when masked (the
    payload is left as it is: the check never reads it)."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    return head + (os.urandom(4) if masked else b"") + payload


def naive(stream: bytes) -> int:
    """The offset of the first unmasked frame's header in the whole stream, or -1 (frames parsed whole)."""
    i = 0
    while i + 2 <= len(stream):
        second = stream[i + 1]
        if not second & 0x80:
            return i
        n = second & 0x7F
        head = 2
        if n == 126:
            n, head = struct.unpack("!H", stream[i + 2 : i + 4])[0], 4
        elif n == 127:
            n, head = struct.unpack("!Q", stream[i + 2 : i + 10])[0], 10
        i += head + 4 + n
    return -1


def run(stream: bytes, cuts: list[int]) -> int:
    """Feed ``stream`` cut at ``cuts``; the offset in the whole stream where the check stopped it, or -1.
    Checks the contract on the way: once found, nothing after it was handed on."""
    check = MaskCheck()
    start = 0
    for end in [*sorted(set(cuts)), len(stream)]:
        if end <= start:
            continue
        at = check.feed(stream[start:end])
        if at >= 0:
            assert at < end - start
            return start + at
        start = end
    return -1


def right(stream: bytes, found: int) -> bool:
    """Whether ``found`` is right: the naive offset, or one byte past it when the header's first byte ended
    an earlier read (that byte went on with it; the reader keeps a lone header byte and does nothing)."""
    expected = naive(stream)
    return found == expected or (expected >= 0 and found == expected + 1)


MESSAGES = [b"", b"x", b"a" * 125, b"b" * 126, b"c" * 300, b"d" * 65535, b"e" * 65536, b"f" * 70000]


def test_masked_frames_of_every_length_pass_whole_and_byte_by_byte() -> None:
    stream = b"".join(frame(m) for m in MESSAGES) + frame(b"", opcode=0x9) + frame(b"bye", opcode=0x8)
    assert naive(stream) == -1
    assert run(stream, []) == -1
    assert run(stream, list(range(1, 400))) == -1  # the first headers and payloads a byte at a time
    # Each frame's header a byte at a time, wherever it is.
    cuts: list[int] = []
    pos = 0
    for m in MESSAGES:
        f = frame(m)
        cuts += range(pos, pos + 15)
        pos += len(f)
    assert run(stream, cuts) == -1


def test_an_unmasked_frame_is_found_at_its_header_however_cut() -> None:
    before = frame(b"a" * 200) + frame(b"b" * 70000) + frame(b"", opcode=0xA)
    for bad in (frame(b"hello", masked=False), frame(b"z" * 300, masked=False), frame(b"", masked=False)):
        stream = before + bad + frame(b"after")
        at = len(before)
        assert run(stream, []) == at
        assert run(stream, [at]) == at  # the header starts a read
        # Cut between its two first bytes: found at the start of the next read (its first byte went on).
        assert run(stream, [at + 1]) == at + 1
        assert run(stream, [at, at + 1]) == at + 1
        assert run(stream, list(range(at - 20, at + 20))) == at + 1  # byte by byte
        assert run(stream, [at - 1, at + 2]) == at  # trailing data in the same read


def test_unmasked_first_frame_and_control_frames() -> None:
    assert MaskCheck().feed(frame(b"{}", masked=False)) == 0
    assert MaskCheck().feed(frame(b"", opcode=0x9, masked=False)) == 0  # an unmasked ping
    check = MaskCheck()
    assert check.feed(frame(b"x")) == -1
    assert check.feed(frame(b"", opcode=0x8, masked=False)) == 0  # an unmasked close


def test_the_close_frame_is_1002_with_its_reason() -> None:
    reason = Disconnect.PROTOCOL_ERROR.reason.encode()
    assert b"\x88" + bytes([2 + len(reason)]) + b"\x03\xea" + reason == CLOSE_PROTOCOL_ERROR


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    sizes = st.sampled_from([0, 1, 5, 125, 126, 127, 300, 65535, 65536]) | st.integers(0, 600)
    masked = st.sampled_from([True, True, True, False])
    frames = draw(st.lists(st.tuples(sizes, masked), max_size=6))
    stream = b"".join(frame(b"p" * n, masked=masked) for n, masked in frames)
    if draw(st.booleans()):
        stream += draw(st.binary(max_size=40))  # trailing garbage: a header or part of one
    cuts = draw(st.lists(st.integers(0, max(len(stream), 1)), max_size=12))
    return stream, cuts


@given(streams())
def test_chunking_does_not_change_the_answer(case: tuple[bytes, list[int]]) -> None:
    stream, cuts = case
    assert run(stream, []) == naive(stream)
    assert right(stream, run(stream, cuts))
