"""A burst of native WebSocket messages decoded at once (:func:`decode_messages`): the common publishes in
runs, everything else as the codec decodes each message alone, in order, up to the first fatal error."""

from __future__ import annotations

import json
from typing import Any

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


def one_by_one(codec: nc.NativeCodec, messages: list[bytes | str]) -> list[Any]:
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
    assert [len(x) for x in items] == [nc.RUN_MAX, nc.RUN_MAX, 3]  # type: ignore[arg-type]
    assert [rid for x in items for rid, _ in x.replies] == list(range(n))  # type: ignore[union-attr]


def test_a_msgpack_text_frame_is_refused_as_one_alone() -> None:
    codec = nc.NativeCodec("msgpack")
    items = nc.decode_messages(codec, ['{"op":"ping"}', msgpack.packb({"op": "ping"})])
    assert expand(items) == [("BadFrame", 4000, None)]
