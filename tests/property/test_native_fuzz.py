"""The native fuzz properties (fuzz/fuzz_native.py) at a modest number of examples, plus stream properties
that need more than "accepted or documented error": chunking does not change the result, the buffer stays
bounded, and the runs of a TCP read decode as the message codec decodes each frame."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import msgpack
from hypothesis import HealthCheck, given, settings

from hubbub.dialects import native as nc
from hubbub.errors import HubbubError
from tests.hypothesis_budget import examples


def _load_fuzz() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "fuzz" / "fuzz_native.py"
    spec = importlib.util.spec_from_file_location("fuzz_native", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_native", mod)
    spec.loader.exec_module(mod)
    return mod


fz = _load_fuzz()

CFG = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: A shaped stream is hundreds of frames drawn one by one (some 0.2 s an example in a CI run): fewer of them,
#: as long each; ``python fuzz/fuzz_native.py --seconds N`` searches the same streams for as long as asked.
SHAPED = settings(CFG, max_examples=examples(60))
JSON = fz.CODECS["json"]
JSON_SMALL = fz.CODECS["json-small"]
MP = fz.CODECS["msgpack"]
MP_SMALL = fz.CODECS["msgpack-small"]


@CFG
@given(fz.raw_bytes)
def test_raw_bytes(data: bytes) -> None:
    for codec in fz.CODECS.values():
        fz.check_decode(codec, data)


@CFG
@given(fz.json_frames())
def test_json_frames(data: bytes) -> None:
    fz.check_decode(JSON, data)
    fz.check_decode(JSON_SMALL, data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return
    fz.check_decode(JSON, text)


@CFG
@given(fz.msgpack_frames())
def test_msgpack_frames(data: bytes) -> None:
    fz.check_decode(MP, data)
    fz.check_decode(MP_SMALL, data)


@CFG
@given(fz.stream_inputs())
def test_stream(inp: tuple[list[bytes], int]) -> None:
    fz.check_stream(*inp)


def _norm(items: Sequence[object]) -> list[object]:
    return [("error", x.code, x.request_id) if isinstance(x, HubbubError) else x for x in items]


@CFG
@given(fz.stream_inputs())
def test_stream_chunking_does_not_matter(inp: tuple[list[bytes], int]) -> None:
    chunks, max_frame = inp
    whole = nc.NativeStreamDecoder(max_frame)
    expected = _norm(whole.feed(b"".join(chunks)))
    split = nc.NativeStreamDecoder(max_frame)
    got: list[object] = []
    peak = 0
    for c in chunks:
        got.extend(_norm(split.feed(c)))
        peak = max(peak, split.buffered)
    assert got == expected
    assert split.failed == whole.failed
    assert peak <= max_frame + 4  # after a feed, at most one incomplete frame (+ CR or length prefix) is held


@CFG
@given(fz.stream_inputs() | fz.publish_streams())
def test_stream_runs_match_the_message_codec(inp: tuple[list[bytes], int]) -> None:
    """The fast path of a TCP read (runs of common publishes) decodes exactly as the general path does."""
    fz.check_stream_runs(*inp)


@SHAPED
@given(fz.shaped_streams())
def test_shaped_streams_read_as_each_frame_alone(inp: tuple[list[bytes], int]) -> None:
    """The learned byte layout of a client's publishes (native_shapes) reads a burst exactly as msgpack's
    decode of each frame alone does, whatever breaks the layout among them."""
    fz.check_stream_runs(*inp)


def _shaped(n: int, odd: dict[int, bytes]) -> bytes:
    frames = []
    for i in range(n):
        body = odd.get(i) or msgpack.packb(
            {"op": "publish", "id": 120 + i, "channel": "/a/b", "payload": bytes([i % 256]) * 3, "ack": True}
        )
        frames.append(len(body).to_bytes(4, "big") + body)
    return b"".join(frames)


def test_shaped_stream_split_at_every_point() -> None:
    """A stream whose layout changes (ids past one byte, a ping, a channel and a payload length of their
    own, a bad frame's error) read in two pieces cut at every byte gives what each frame alone gives."""
    odd = {
        20: msgpack.packb({"op": "ping", "id": 7}),
        25: msgpack.packb({"op": "publish", "id": 1, "channel": "/a/c", "payload": b"xyz", "ack": True}),
        26: msgpack.packb({"op": "publish", "id": 2, "channel": "/a/\xe9", "payload": b"xyz", "ack": True}),
        30: msgpack.packb({"op": "publish", "id": 3, "channel": "/a/b", "payload": b"xy", "ack": True}),
        31: msgpack.packb({"op": "publish", "id": -3, "channel": "/a/b", "payload": b"xyz", "ack": True}),
    }
    data = _shaped(40, odd)
    expected = [fz._norm(x) for x in fz.reference_items(data, 1 << 20)]
    assert sum(1 for x in expected if isinstance(x, tuple)) == 1  # the id -3's error
    for cut in range(len(data) + 1):
        fz.check_stream_runs([data[:cut], data[cut:]], 1 << 20)


def test_shaped_bursts_take_the_layout() -> None:
    """A burst of one layout is read with it (not frame by frame), into runs of at most RUN_MAX."""
    dec = nc.NativeStreamDecoder(1 << 20)
    data = _shaped(600, {})
    items = dec.feed_runs(data[:100]) + dec.feed_runs(data[100:])
    # The first publish to a channel the codec has not read yet takes the general path (it canonicalizes it).
    assert isinstance(items[0], nc.Publish)
    assert [len(r) for r in items[1:] if isinstance(r, nc.PublishRun)] == [256, 256, 87]
    assert dec._hits >= 590
    got = [items[0], *(p for r in items[1:] if isinstance(r, nc.PublishRun) for p in r.commands())]
    assert got == fz.reference_items(data, 1 << 20)


def test_a_stream_of_changing_payload_sizes_learns_no_layout() -> None:
    """A client whose payload sizes change from frame to frame (a mixed-size stream) is read frame by frame
    without learning a layout for each size (a compile or a walk of a frame each, for a layout that would fit
    one frame), and reads exactly as decoded alone; a steady stream after it is learned again."""
    frames = [
        msgpack.packb({"op": "publish", "id": i, "channel": "/a/b", "payload": b"x" * (10 + i % 7)})
        for i in range(700)
    ]
    steady = [msgpack.packb({"op": "publish", "id": 5, "channel": "/a/b", "payload": b"y" * 9})] * 300
    data = b"".join(len(f).to_bytes(4, "big") + f for f in frames + steady)
    dec = nc.NativeStreamDecoder(1 << 20)
    mixed_end = sum(4 + len(f) for f in frames)
    items = dec.feed_runs(data[:mixed_end])
    assert dec._shape is None and dec._hits == 0
    items += dec.feed_runs(data[mixed_end:])
    assert dec._shape is not None and dec._hits >= 250
    got = [x for r in items for x in (r.commands() if isinstance(r, nc.PublishRun) else [r])]
    assert got == fz.reference_items(data, 1 << 20)
