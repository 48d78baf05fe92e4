"""Fuzz target for the native codec (STYLE.md item 3).

The main assertion: every input is accepted (a command), or rejected with a documented
:class:`hubbub.errors.HubbubError` whose code is in :data:`hubbub.errors.CODES`. Any other exception is a bug.
A differential one checks the stream decoder's fast path: the items of :meth:`NativeStreamDecoder.feed_runs`
(runs of common publishes expanded) equal those of each frame decoded alone by :meth:`NativeCodec.decode`.

Inputs: arbitrary bytes; arbitrary JSON-ish and msgpack-ish values; command-shaped objects with plausible
and implausible field values; byte-level mutations of valid frames; and all of these framed as a raw TCP
stream (JSON lines or length-prefixed msgpack) split into arbitrary chunks.

    python fuzz/fuzz_native.py --seconds 60

``tests/property/test_native_fuzz.py`` runs the same properties at a modest ``max_examples``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    import hubbub  # noqa: F401
except ImportError:  # run from a checkout without installing: python fuzz/fuzz_native.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import msgpack

from hubbub.dialects import native as nc
from hubbub.errors import CODES, BadFrame, FrameTooLarge, HubbubError

__all__ = [
    "check_decode",
    "check_stream",
    "check_stream_runs",
    "json_frames",
    "msgpack_frames",
    "publish_streams",
    "raw_bytes",
    "reference_items",
    "shaped_streams",
    "stream_inputs",
]

SMALL_FRAME = 512
CODECS = {
    "json": nc.NativeCodec("json"),
    "msgpack": nc.NativeCodec("msgpack"),
    "json-small": nc.NativeCodec(
        "json", max_frame=SMALL_FRAME, max_tags=3, max_headers=2, max_header_bytes=32
    ),
    "msgpack-small": nc.NativeCodec("msgpack", max_frame=SMALL_FRAME, max_tags=3, max_tag_bytes=4),
}


# -- the property -----------------------------------------------------------------------------------------


def _ok(item: object) -> None:
    if isinstance(item, HubbubError):
        assert item.code in CODES, f"undocumented error code {item.code}: {item!r}"
    else:
        assert isinstance(
            item,
            nc.Hello
            | nc.Subscribe
            | nc.Unsubscribe
            | nc.Publish
            | nc.PublishBatch
            | nc.Ping
            | nc.Pong
            | nc.Auth
            | nc.ConsumerCreate
            | nc.Consume
            | nc.Unconsume
            | nc.ConsumerDelete
            | nc.Ack
            | nc.Nack,
        ), item


def check_decode(codec: nc.NativeCodec, data: bytes | str) -> None:
    """Accepted, or rejected with a documented error."""
    try:
        cmd = codec.decode(data)
    except HubbubError as exc:
        _ok(exc)
    else:
        _ok(cmd)


def check_stream(chunks: list[bytes], max_frame: int) -> None:
    """Every item of a stream, however it is chunked, is a command or a documented error."""
    dec = nc.NativeStreamDecoder(max_frame)
    for c in chunks:
        for item in dec.feed(c):
            _ok(item)


def reference_items(data: bytes, max_frame: int) -> list[object]:
    """The items of a whole stream, each frame decoded alone by :meth:`NativeCodec.decode` (the message
    codec's general path), with the stream framing of native.md §1: the oracle for the stream decoder."""
    if not data:
        return []
    if data[0] not in (0x7B, 0x00):
        return [BadFrame("first byte")]
    codec = nc.NativeCodec("json" if data[0] == 0x7B else "msgpack", max_frame=max_frame)
    out: list[object] = []

    def one(frame: bytes) -> bool:
        try:
            out.append(codec.decode(frame))
        except HubbubError as exc:
            out.append(exc)
            return not exc.fatal
        return True

    if codec.encoding == "json":
        *lines, rest = data.split(b"\n")
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if len(line) > max_frame:
                out.append(FrameTooLarge("line"))
                return out
            if line and not one(line):
                return out
        if len(rest) > max_frame + 1:
            out.append(FrameTooLarge("line"))
        return out
    limit = min(max_frame, nc.MAX_STREAM_FRAME - 1)
    pos = 0
    while len(data) - pos >= 4:
        n = int.from_bytes(data[pos : pos + 4], "big")
        if n > limit:
            out.append(FrameTooLarge("frame"))
            return out
        if len(data) - pos - 4 < n or not one(data[pos + 4 : pos + 4 + n]):
            return out
        pos += 4 + n
    return out


def _norm(item: object) -> object:
    return ("error", item.code, item.request_id) if isinstance(item, HubbubError) else item


def check_stream_runs(chunks: list[bytes], max_frame: int) -> None:
    """:meth:`NativeStreamDecoder.feed_runs`, runs expanded, gives :func:`reference_items`; a run holds
    only publishes of the common shape, at least one."""
    dec = nc.NativeStreamDecoder(max_frame)
    got: list[object] = []
    for c in chunks:
        for item in dec.feed_runs(c):
            if isinstance(item, nc.PublishRun):
                cmds = item.commands()
                assert cmds, "an empty run"
                assert all(not p.headers and not p.tags and not p.idem for p in cmds), cmds
                got.extend(cmds)
            else:
                got.append(_norm(item))
    assert got == [_norm(x) for x in reference_items(b"".join(chunks), max_frame)]


# -- strategies -------------------------------------------------------------------------------------------

OPS = [
    "hello", "subscribe", "unsubscribe", "publish", "publish_batch", "ping", "pong", "auth", "frobnicate", "",
    "consumer_create", "consumer_delete", "consume", "unconsume", "ack", "nack",
]  # fmt: skip
FIELDS = [
    "op", "id", "v", "token", "client", "echo", "batch", "sub", "pattern", "tags", "since", "last",
    "from_time", "channel", "json", "text", "b64", "payload", "content_type", "headers", "idem", "ack",
    "consumer", "create", "reuse", "shared", "max", "batch_wait_ms", "batch_bytes",
    "channels", "payloads", "texts", "b64s", "content_types", "idems",
]  # fmt: skip

raw_bytes = st.binary(max_size=600)

_segment = st.sampled_from(
    ["", "a", "chat", "*", "**", "%2A", "%", "%FF", "%c3%a9", "é", "a:b", "\x00", "x" * 40]
)
paths = st.builds(lambda segs: "/" + "/".join(segs), st.lists(_segment, max_size=5)) | st.text(max_size=20)

# Past 64 bits too: JSON carries any integer (msgpack frames of such values are not made: it cannot).
_ints = st.sampled_from(
    [0, 1, -1, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**64 - 1, 2**64, -(2**63) - 1, 2**70]
) | st.integers(-(2**63), 2**64 - 1)
_scalars = st.none() | st.booleans() | _ints | st.floats(allow_nan=False) | st.text(max_size=12)


def _json_values(leaves: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=4)
        ),
        max_leaves=12,
    )


values = _json_values(_scalars)
positions = st.fixed_dictionaries(
    {"seq": _ints, "epoch": st.sampled_from(["", "k3j2a9x1"]) | st.text(max_size=9)}
)
since = positions | st.dictionaries(paths, positions | values, max_size=3) | values
tags = st.lists(st.text(max_size=6) | _scalars, max_size=6) | values
headers = st.dictionaries(
    st.sampled_from([":p", "", "k", "trace"]) | st.text(max_size=6),
    st.text(max_size=8) | _scalars,
    max_size=4,
)

_FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "id": _ints | values,
    "v": st.sampled_from([1, 2, 0, True, "1"]),
    "token": st.text(max_size=8) | _scalars,
    "client": st.text(max_size=8) | _scalars,
    "echo": st.booleans() | _scalars,
    "batch": st.booleans() | _scalars,
    "sub": st.text(max_size=70) | _scalars,
    "pattern": paths | _scalars,
    "tags": tags,
    "since": since,
    "last": _ints | _scalars,
    "from_time": _ints | st.from_regex(r"-?[0-9]{0,22}", fullmatch=True) | _scalars,
    "channel": paths | _scalars,
    "json": values,
    "text": st.text(max_size=20) | _scalars,
    "b64": st.sampled_from(["", "/w==", "YQ", "@@", "aGk="]) | st.text(max_size=8) | _scalars,
    "payload": st.binary(max_size=20) | st.text(max_size=8) | _scalars,
    "content_type": st.sampled_from(["application/json", "text/plain", "", "a\nb"]) | _scalars,
    "headers": headers | values,
    "idem": st.text(max_size=130) | _scalars,
    "ack": st.booleans() | _scalars,
    "consumer": st.sampled_from(["jobs", "a.b-c_9", "", "a/b", "x" * 129]) | st.text(max_size=10) | _scalars,
    "create": st.booleans() | _scalars,
    "reuse": st.booleans() | _scalars,
    "shared": st.booleans() | _scalars,
    "max": _ints | _scalars,
    "batch_wait_ms": _ints | _scalars,
    "batch_bytes": _ints | _scalars,
    # publish_batch's columns: mostly lists of plausible values, with the odd wrong one.
    "channels": st.lists(paths | _scalars, max_size=4) | _scalars,
    "payloads": st.lists(st.binary(max_size=8) | st.text(max_size=4) | _scalars, max_size=4) | _scalars,
    "texts": st.lists(st.text(max_size=6) | _scalars, max_size=4) | _scalars,
    "b64s": st.lists(st.sampled_from(["", "/w==", "YQ", "@@", "aGk="]) | _scalars, max_size=4) | _scalars,
    "content_types": st.lists(st.sampled_from(["text/plain", "", "a\nb"]) | _scalars, max_size=4) | _scalars,
    "idems": st.lists(st.text(max_size=130) | _scalars, max_size=4) | _scalars,
}


@st.composite
def commands(draw: st.DrawFn) -> dict[str, Any]:
    """Command-shaped objects: a (mostly) known op and a random subset of fields with edgy values."""
    obj: dict[str, Any] = {"op": draw(st.sampled_from(OPS) | _scalars)}
    for name in draw(st.lists(st.sampled_from(FIELDS[1:]), max_size=8, unique=True)):
        obj[name] = draw(_FIELD_VALUES[name])
    return obj


objects = commands() | values


def _dump_json(value: Any, ensure_ascii: bool) -> bytes | None:
    try:
        return json.dumps(value, ensure_ascii=ensure_ascii, default=lambda b: b.hex()).encode(
            "utf-8", "surrogatepass"
        )
    except (ValueError, TypeError, RecursionError):
        return None


def _dump_msgpack(value: Any, bin_type: bool) -> bytes | None:
    try:
        out: bytes = msgpack.packb(value, use_bin_type=bin_type)
    except (ValueError, TypeError, OverflowError):
        return None
    return out


@st.composite
def _mutated(draw: st.DrawFn, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, max(0, len(data))))
        if op == "flip" and data:
            data[min(i, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and data:
            del data[min(i, len(data) - 1)]
        elif op == "truncate":
            del data[i:]
    return bytes(data)


@st.composite
def json_frames(draw: st.DrawFn) -> bytes:
    """A JSON frame: encoded objects, possibly mutated, or plain garbage."""
    kind = draw(st.sampled_from(["object", "mutated", "raw"]))
    if kind == "raw":
        return draw(raw_bytes)
    frame = _dump_json(draw(objects), draw(st.booleans())) or b"{}"
    return draw(_mutated(frame)) if kind == "mutated" else frame


@st.composite
def msgpack_frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["object", "mutated", "raw"]))
    if kind == "raw":
        return draw(raw_bytes)
    frame = _dump_msgpack(draw(objects), draw(st.booleans())) or b"\x80"
    return draw(_mutated(frame)) if kind == "mutated" else frame


@st.composite
def stream_inputs(draw: st.DrawFn) -> tuple[list[bytes], int]:
    """A TCP stream (framed JSON lines or msgpack frames, with junk mixed in) and a chunking of it."""
    max_frame = draw(st.sampled_from([64, SMALL_FRAME, 1 << 20]))
    mode = draw(st.sampled_from(["jsonl", "msgpack", "raw"]))
    if mode == "raw":
        data = draw(raw_bytes)
    elif mode == "jsonl":
        lines = draw(st.lists(json_frames(), max_size=5))
        sep = draw(st.sampled_from([b"\n", b"\r\n"]))
        data = b"{" + b"".join(line.replace(b"\n", b" ") + sep for line in lines)
        data = data if draw(st.booleans()) else draw(_mutated(data))
    else:
        frames = draw(st.lists(msgpack_frames(), max_size=5))
        data = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
        data = data if draw(st.booleans()) else draw(_mutated(data))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return chunks, max_frame


@st.composite
def _publish(draw: st.DrawFn, json_kind: bool) -> dict[str, Any]:
    """A publish, mostly of the common shape (few channels, so they repeat); each field is sometimes of a
    wrong type, and some fields are dropped or added."""

    def odd() -> bool:
        return draw(st.integers(0, 5)) == 0

    obj: dict[str, Any] = {"op": "publish"}
    obj["id"] = draw(_FIELD_VALUES["id"] if odd() else st.integers(0, 9))
    obj["channel"] = draw(
        _FIELD_VALUES["channel"] if odd() else st.sampled_from(["/a", "/b/c", "/a/", "/%41", "/a//b"])
    )
    if json_kind:
        kind = draw(st.sampled_from(["text", "json", "b64"]))
        obj[kind] = draw(
            _FIELD_VALUES[kind] if odd() else st.just("aGk=") if kind == "b64" else st.text(max_size=4)
        )
    else:
        obj["payload"] = draw(_FIELD_VALUES["payload"] if odd() else st.binary(max_size=8))
    if draw(st.booleans()):
        obj["ack"] = draw(_FIELD_VALUES["ack"] if odd() else st.booleans())
    if odd():
        for name in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=2, unique=True)):
            if draw(st.booleans()):
                obj.pop(name, None)
            else:
                obj[name] = draw(_FIELD_VALUES.get(name, values))
    return obj


@st.composite
def publish_streams(draw: st.DrawFn) -> tuple[list[bytes], int]:
    """A TCP stream of mostly publishes, a few other frames among them, and a chunking of it."""
    max_frame = draw(st.sampled_from([64, SMALL_FRAME, 1 << 20]))
    use_json = draw(st.booleans())
    frames: list[bytes] = []
    for _ in range(draw(st.integers(0, 12))):
        obj = draw(_publish(use_json) if draw(st.integers(0, 5)) else objects)
        if use_json:
            frames.append((_dump_json(obj, draw(st.booleans())) or b"{}").replace(b"\n", b" ") + b"\n")
        else:
            body = _dump_msgpack(obj, True) or b"\x80"
            frames.append(len(body).to_bytes(4, "big") + body)
    data = b"".join(frames)
    if use_json and not data.startswith(b"{"):
        data = b"{}\n" + data  # a JSON stream starts with '{'
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return chunks, max_frame


def _mp_str(text: bytes, wide: bool) -> bytes:
    """A msgpack str of ``text`` (any bytes: invalid UTF-8 too), as fixstr or (``wide``) str8."""
    if wide or len(text) > 31:
        return b"\xd9" + bytes([len(text)]) + text
    return bytes([0xA0 | len(text)]) + text


def _mp_uint(value: int, width: int) -> bytes:
    """A msgpack unsigned integer of ``width`` bytes after its type byte (0: a positive fixint, when it fits),
    as any encoder may send it (msgpack allows the wider forms of a small value)."""
    if width == 0 and value < 0x80:
        return bytes([value])
    width = width or 1
    code = {1: 0xCC, 2: 0xCD, 4: 0xCE, 8: 0xCF}[width]
    return bytes([code]) + (value % (1 << (8 * width))).to_bytes(width, "big")


@st.composite
def shaped_streams(draw: st.DrawFn) -> tuple[list[bytes], int]:
    """A msgpack stream of many publishes of one byte layout (one key order, id width, channel length and
    payload length: what the stream decoder learns and then reads a burst at a time), with frames that
    break the layout in every way among them: another width or length, ``ack`` flipped, ids at and past
    MAX_ID, a channel of the same length that is not valid UTF-8 or not canonical, a duplicate key, a byte of
    a frame changed, other commands, a frame cut short; split into arbitrary chunks."""
    max_frame = draw(st.sampled_from([64, SMALL_FRAME, 1 << 20]))
    keys = draw(st.permutations(["op", "id", "channel", "payload", "ack"]))
    with_ack = draw(st.booleans())
    width = draw(st.sampled_from([0, 1, 2, 4, 8]))
    channels = [b"/a/b", b"/a/c", b"/xyz", b"/a//", b"/\xff\xfe\xfd", b"/%41b"]
    size = draw(st.sampled_from([0, 1, 16, 40]))

    def frame(
        rid: int, channel: bytes, payload: bytes, ack: bool, wid: int, wide_str: bool, order: list[str]
    ) -> bytes:
        fields = {
            "op": _mp_str(b"op", False) + _mp_str(b"publish", False),
            "id": _mp_str(b"id", False) + _mp_uint(rid, wid),
            "channel": _mp_str(b"channel", False) + _mp_str(channel, wide_str),
            "payload": _mp_str(b"payload", False) + b"\xc4" + bytes([len(payload)]) + payload,
            "ack": _mp_str(b"ack", False) + (b"\xc3" if ack else b"\xc2"),
        }
        pairs = [fields[k] for k in order if k != "ack" or with_ack]
        body = bytes([0x80 | len(pairs)]) + b"".join(pairs)
        return len(body).to_bytes(4, "big") + body

    ids = st.integers(0, 0x7F) if width == 0 else st.integers(0, (1 << (8 * width)) - 1)
    near_max = st.sampled_from([2**31 - 1, 2**31, 2**32 - 1, 2**63])
    ack0 = draw(st.booleans())
    frames: list[bytes] = []
    for _ in range(draw(st.integers(0, 700))):
        kind = draw(st.integers(0, 40))
        rid = draw(ids)
        channel = channels[0] if kind < 25 else draw(st.sampled_from(channels))
        payload = draw(st.binary(min_size=size, max_size=size))
        if kind <= 30:
            frames.append(frame(rid, channel, payload, ack0, width, False, keys))
        elif kind == 31:
            frames.append(frame(rid, channel, payload, not ack0, width, False, keys))
        elif kind == 32:
            frames.append(
                frame(draw(near_max), channel, payload, ack0, draw(st.sampled_from([4, 8])), False, keys)
            )
        elif kind == 33:
            frames.append(frame(rid, channel, draw(st.binary(max_size=size + 2)), ack0, width, False, keys))
        elif kind == 34:
            frames.append(
                frame(rid, channel, payload, ack0, draw(st.sampled_from([0, 1, 2, 4, 8])), True, keys)
            )
        elif kind == 35:  # a key twice, the map's count kept: the frame's length may equal the layout's
            dup = draw(st.sampled_from(keys))
            order = [dup if k == draw(st.sampled_from(keys)) else k for k in keys]
            frames.append(frame(rid, channel, payload, ack0, width, False, order))
        elif kind == 36:  # one byte of a frame of the layout changed
            raw = bytearray(frame(rid, channel, payload, ack0, width, False, keys))
            at = draw(st.integers(4, len(raw) - 1))
            raw[at] = draw(st.integers(0, 255))
            frames.append(bytes(raw))
        elif kind == 37:
            body = _dump_msgpack(draw(objects), True) or b"\x80"
            frames.append(len(body).to_bytes(4, "big") + body)
        elif kind == 38:
            frames.append(frame(rid, channel, payload, ack0, width, False, draw(st.permutations(keys))))
        else:
            frames.append(frame(rid, channel, payload, ack0, width, False, keys))
    data = b"".join(frames)
    if draw(st.integers(0, 9)) == 0 and data:
        data = data[: draw(st.integers(0, len(data)))]
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    return chunks, max_frame


# -- the fuzz loop ----------------------------------------------------------------------------------------


def _targets(max_examples: int) -> list[Callable[[], None]]:
    cfg = settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    codec_names = st.sampled_from(list(CODECS))

    @cfg
    @given(codec_names, raw_bytes)
    def fuzz_raw(name: str, data: bytes) -> None:
        check_decode(CODECS[name], data)

    @cfg
    @given(st.sampled_from(["json", "json-small"]), json_frames())
    def fuzz_json(name: str, data: bytes) -> None:
        check_decode(CODECS[name], data)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return
        check_decode(CODECS[name], text)

    @cfg
    @given(st.sampled_from(["msgpack", "msgpack-small"]), msgpack_frames())
    def fuzz_msgpack(name: str, data: bytes) -> None:
        check_decode(CODECS[name], data)

    @cfg
    @given(stream_inputs())
    def fuzz_stream(inp: tuple[list[bytes], int]) -> None:
        check_stream(*inp)

    @cfg
    @given(stream_inputs() | publish_streams() | shaped_streams())
    def fuzz_stream_runs(inp: tuple[list[bytes], int]) -> None:
        check_stream_runs(*inp)

    return [fuzz_raw, fuzz_json, fuzz_msgpack, fuzz_stream, fuzz_stream_runs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fuzz the native codec with hypothesis.")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to run (default 60)")
    ap.add_argument("--batch", type=int, default=500, help="examples per target per round")
    args = ap.parse_args(argv)
    targets = _targets(args.batch)
    deadline = time.monotonic() + args.seconds
    rounds = 0
    while True:
        for t in targets:
            t()
        rounds += 1
        if time.monotonic() >= deadline:
            break
    print(f"fuzz_native: {rounds} rounds, about {rounds * args.batch * len(targets)} examples, no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
