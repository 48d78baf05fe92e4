"""Reading a JSON frame: orjson's reading is taken as it is for an object of plain values (no float, no nested
container), and every other frame is read as before, with the standard library wherever a digit run of 19 or
more might be an integer beyond 64 bits (which orjson reads as a float). The result must be what the old
reading (a digit-run search of every frame first) gives, value and type, for any frame: the reference below
is that reading, kept here."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import native as nc
from hubbub.errors import BadFrame, HubbubError
from tests.hypothesis_budget import examples

_LONG = re.compile(r"[0-9]{19,}")


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def reference(text: str) -> Any:
    """The reading before: the standard library for a frame with a long digit run, orjson otherwise."""
    try:
        if _LONG.search(text) is None:
            return orjson.loads(text)
        obj = json.loads(text, parse_constant=_no_constant)
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
        return obj
    except (ValueError, RecursionError):
        raise BadFrame("not JSON") from None


def typed(value: Any) -> Any:
    """``value`` with the type of every number kept, so that ``1`` and ``1.0`` differ."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return (type(value).__name__, value)


numbers = st.one_of(
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([(1 << 64) - 1, 1 << 64, -(1 << 63), -(1 << 63) - 1, 10**19, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
)
texts = st.one_of(st.text(max_size=8), st.sampled_from(["1234567890123456789012", "\\ud800", "x"]))
scalars = st.one_of(numbers, texts, st.booleans(), st.none())
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


def _frame(obj: dict[str, Any]) -> str:
    # Integers are written as their digits (json.dumps keeps big ints exact); "\\ud800" stays an escape.
    return json.dumps(obj).replace("\\\\ud800", "\\ud800")


@settings(max_examples=examples(400), deadline=None)
@given(st.dictionaries(texts, values, max_size=5), st.sampled_from(["publish", "subscribe", None]))
def test_reading_is_the_old_reading(obj: dict[str, Any], op: str | None) -> None:
    if op is not None:
        obj = {"op": op, **obj}
    text = _frame(obj)
    codec = nc.NativeCodec("json")
    try:
        want = typed(reference(text))
    except BadFrame:
        want = BadFrame
    for message in (text, text.encode()):
        if want is BadFrame:
            with pytest.raises(BadFrame):
                codec._load(message)
        else:
            assert typed(codec._load(message)) == want


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.dictionaries(texts, values, max_size=4), min_size=1, max_size=4))
def test_a_stream_reads_each_line_as_the_codec_does(objs: list[dict[str, Any]]) -> None:
    """JSON lines over TCP: each line's command or error is the one the codec gives for it alone."""
    lines = [
        _frame({"op": "publish", "id": i + 1, "channel": "/a", "text": "t", **o}) for i, o in enumerate(objs)
    ]
    codec = nc.NativeCodec("json")
    want: list[Any] = []
    for line in lines:
        try:
            want.append(codec.decode(line))
        except HubbubError as exc:
            want.append(("error", exc.code, exc.request_id))
            if exc.fatal:
                break
    dec = nc.NativeStreamDecoder()
    got = [
        ("error", x.code, x.request_id) if isinstance(x, HubbubError) else x
        for x in dec.feed(("\n".join(lines) + "\n").encode())
    ]
    assert got == want


def test_the_common_publish_is_read_without_the_standard_library(monkeypatch: Any) -> None:
    """A frame of plain values, even with long digit runs in its strings and 64-bit integers, never takes the
    standard library's (slower) path."""

    def refuse(*args: Any, **kw: Any) -> Any:
        raise AssertionError("read by the standard library")

    monkeypatch.setattr(json, "loads", refuse)
    codec = nc.NativeCodec("json")
    frame = '{"op":"publish","id":18446744073709551615,"channel":"/a","text":"12345678901234567890123"}'
    assert codec._load(frame) == orjson.loads(frame)
    cmd = codec.decode('{"op":"publish","id":7,"channel":"/a","ack":true,"text":"12345678901234567890123"}')
    assert isinstance(cmd, nc.Publish) and cmd.payload == b"12345678901234567890123"


@pytest.mark.parametrize("value", ["123456789012345678901234567890", "[1, -18446744073709551616]", "1.50"])
def test_a_json_payload_keeps_its_digits_in_a_run_and_in_a_burst(value: str) -> None:
    """A common publish whose ``json`` payload holds an integer beyond 64 bits (or any float) is taken from
    the exact reading, in a stream's run and in a WebSocket burst alike."""
    frame = '{"op":"publish","id":%d,"channel":"/a","json":' + value + "}"
    want = json.dumps(json.loads(value), separators=(",", ":")).encode()
    codec = nc.NativeCodec("json")
    first = codec.decode(frame % 1)  # the channel is known to the codec from here on
    assert isinstance(first, nc.Publish) and first.payload == want
    dec = nc.NativeStreamDecoder(codecs={"json": codec, "msgpack": nc.NativeCodec("msgpack")})
    lines = "".join(frame % i + "\n" for i in range(2, 6)).encode()
    burst = nc.decode_messages(codec, [frame % i for i in range(2, 6)])
    for items in (
        dec.feed(lines),
        [c for x in burst for c in (x.commands() if isinstance(x, nc.PublishRun) else [x])],
    ):
        assert [c.payload for c in items if isinstance(c, nc.Publish)] == [want] * 4
