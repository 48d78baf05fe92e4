"""The native codec (protocols/native.md): decoding every command in both encodings, every error path with
its request id, and the exact bytes of replies, pushes, events and HTTP renderings.

Expected objects are copied from protocols/vectors/native.json (placeholders filled in), so the test does
not depend on the shared tree being present.
"""

from __future__ import annotations

import base64
from typing import Any

import msgpack
import orjson
import pytest

from hubbub.channels import parse_pattern
from hubbub.dialects import native as nc
from hubbub.dialects.native_common import compact_json, is_json_type
from hubbub.errors import (
    CODES,
    BadChannel,
    BadFrame,
    BadRequest,
    FrameTooLarge,
    HubbubError,
    LimitExceeded,
    UnknownOp,
)
from hubbub.events import Event, Position, Publisher

JSON = nc.NativeCodec("json")
MP = nc.NativeCodec("msgpack")
SID = "a1b2c3d4e5f60718"
EPOCH = "k3j2a9x1"
T = 1795313749574424198


def jdec(obj: dict[str, Any]) -> nc.Command:
    return JSON.decode(orjson.dumps(obj))


def mdec(obj: dict[str, Any]) -> nc.Command:
    return MP.decode(msgpack.packb(obj, use_bin_type=True))


def both(obj: dict[str, Any]) -> nc.Command:
    """Decode through JSON and msgpack; both must agree."""
    a, b = jdec(obj), mdec(obj)
    assert a == b
    return a


def raises(codec: nc.NativeCodec, frame: bytes | str, exc: type[HubbubError], rid: int | None) -> HubbubError:
    with pytest.raises(exc) as info:
        codec.decode(frame)
    err = info.value
    assert err.code in CODES
    assert err.request_id == rid
    return err


def event(
    payload: bytes = b"hi 5%",
    content_type: str = "text/plain; charset=utf-8",
    headers: dict[str, str] | None = None,
    tags: tuple[str, ...] = (),
    **kw: Any,
) -> Event:
    base: dict[str, Any] = {
        "channel": "/chat/room",
        "seq": 7,
        "epoch": EPOCH,
        "time_ns": T,
        "publisher": Publisher("native", "", SID, ""),
    }
    base.update(kw)
    return Event(payload=payload, content_type=content_type, headers=headers or {}, tags=tags, **base)


def keys(frame: bytes) -> list[str]:
    return list(orjson.loads(frame))


# -- decoding: commands -----------------------------------------------------------------------------------


def test_hello_minimal_and_full() -> None:
    assert both({"op": "hello", "id": 1, "v": 1}) == nc.Hello(1, 1, None, "", True, False)
    full = {"op": "hello", "id": 1, "v": 1, "token": "t", "client": "myapp/1.0", "echo": False, "batch": True}
    assert both(full) == nc.Hello(1, 1, "t", "myapp/1.0", False, True)
    # Unknown fields are ignored; null optional fields count as absent.
    assert both({"op": "hello", "id": 1, "v": 1, "x": [1], "token": None}) == nc.Hello(1, 1)


def test_hello_other_version_is_returned_for_4006() -> None:
    # The connection answers 4006; other fields of another version are not validated by v1 rules.
    assert both({"op": "hello", "id": 3, "v": 2, "echo": "whatever"}) == nc.Hello(3, 2)


@pytest.mark.parametrize(
    "frame",
    [
        {"op": "hello", "id": 1},
        {"op": "hello", "id": 1, "v": True},
        {"op": "hello", "id": 1, "v": "1"},
        {"op": "hello", "id": 1, "v": 1, "echo": "yes"},
        {"op": "hello", "id": 1, "v": 1, "batch": 1},
        {"op": "hello", "id": 1, "v": 1, "token": 5},
        {"op": "hello", "id": 1, "v": 1, "client": []},
    ],
)
def test_hello_invalid_fields(frame: dict[str, Any]) -> None:
    raises(JSON, orjson.dumps(frame), BadRequest, 1)


def test_subscribe_exact_with_since() -> None:
    cmd = both(
        {"op": "subscribe", "id": 2, "sub": "s1", "pattern": "/h", "since": {"seq": 1, "epoch": EPOCH}}
    )
    assert cmd == nc.Subscribe(2, "s1", parse_pattern("/h"), frozenset(), Position(1, EPOCH), None, None)
    zero = both({"op": "subscribe", "id": 2, "sub": "s1", "pattern": "/z", "since": {"seq": 0, "epoch": ""}})
    assert isinstance(zero, nc.Subscribe) and zero.since == Position(0, "")


def test_subscribe_pattern_tags_last_from_time() -> None:
    cmd = both(
        {"op": "subscribe", "id": 2, "sub": "s1", "pattern": "/**", "tags": ["b", "a", "a"], "last": 5}
    )
    assert isinstance(cmd, nc.Subscribe)
    assert cmd.pattern.subtree and cmd.tags == frozenset({"a", "b"}) and cmd.last == 5
    # from_time: an integer, or a decimal string in JSON (ns exceed 2^53).
    s = jdec({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/a/*", "from_time": str(T)})
    assert isinstance(s, nc.Subscribe) and s.from_time == T
    s = both({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/a/*", "from_time": T})
    assert isinstance(s, nc.Subscribe) and s.from_time == T


def test_subscribe_since_map_is_canonicalised_and_may_carry_from_time() -> None:
    cmd = both(
        {
            "op": "subscribe",
            "id": 4,
            "sub": "s1",
            "pattern": "/chat/**",
            "since": {"/chat/caf%C3%A9": {"seq": 3, "epoch": EPOCH}, "/chat/a%41": {"seq": 0, "epoch": ""}},
            "from_time": 10,
        }
    )
    assert isinstance(cmd, nc.Subscribe)
    assert cmd.since == {"/chat/café": Position(3, EPOCH), "/chat/aA": Position(0, "")}
    assert cmd.from_time == 10


def test_subscribe_sub_id_length() -> None:
    ok = both({"op": "subscribe", "id": 1, "sub": "é" * 64, "pattern": "/a"})
    assert isinstance(ok, nc.Subscribe) and len(ok.sub) == 64
    for sub in ("", "x" * 65, 5, None):
        raises(JSON, orjson.dumps({"op": "subscribe", "id": 1, "sub": sub, "pattern": "/a"}), BadRequest, 1)


@pytest.mark.parametrize(
    ("extra", "exc"),
    [
        ({"since": {"seq": 1, "epoch": "e"}, "last": 2}, BadRequest),
        ({"last": 2, "from_time": 1}, BadRequest),
        ({"since": {"seq": 1, "epoch": "e"}, "from_time": 1}, BadRequest),  # only a since *map* may
        ({"last": 0}, BadRequest),
        ({"last": True}, BadRequest),
        ({"from_time": -1}, BadRequest),
        ({"from_time": "12a"}, BadRequest),
        ({"from_time": 1.5}, BadRequest),
        ({"since": {"seq": -1, "epoch": ""}}, BadRequest),
        ({"since": {"seq": 1}}, BadRequest),
        ({"since": {"/a": {"seq": 1, "epoch": "e"}}}, BadRequest),  # a map for an exact channel
        ({"since": [1]}, BadRequest),
        ({"tags": "a"}, BadRequest),
        ({"tags": [1]}, BadRequest),
        ({"tags": [str(i) for i in range(65)]}, LimitExceeded),
        ({"tags": ["x" * 257]}, LimitExceeded),
    ],
)
def test_subscribe_invalid_exact(extra: dict[str, Any], exc: type[HubbubError]) -> None:
    frame = {"op": "subscribe", "id": 9, "sub": "s", "pattern": "/a", **extra}
    raises(JSON, orjson.dumps(frame), exc, 9)
    raises(MP, msgpack.packb(frame, use_bin_type=True), exc, 9)


@pytest.mark.parametrize(
    ("extra", "exc"),
    [
        ({"since": {"seq": 1, "epoch": "e"}}, BadRequest),  # {seq, epoch} for a pattern
        ({"since": {"/b/x": {"seq": 1, "epoch": "e"}}}, BadRequest),  # not matched by the pattern
        ({"since": {"/a/%FF": {"seq": 1, "epoch": "e"}}}, BadChannel),
        ({"since": {"/a/x": {"seq": 1, "epoch": "e"}}, "last": 1}, BadRequest),
    ],
)
def test_subscribe_invalid_pattern(extra: dict[str, Any], exc: type[HubbubError]) -> None:
    frame = {"op": "subscribe", "id": 9, "sub": "s", "pattern": "/a/*", **extra}
    raises(JSON, orjson.dumps(frame), exc, 9)


@pytest.mark.parametrize("pattern", ["a", "/a/**/b", "/**/a", "/a/**/**", "/a%FF", 7, None])
def test_subscribe_bad_pattern(pattern: object) -> None:
    frame = {"op": "subscribe", "id": 2, "sub": "s1", "pattern": pattern}
    exc = BadChannel if isinstance(pattern, str) else BadRequest
    raises(JSON, orjson.dumps(frame), exc, 2)


def test_pattern_over_channel_limit() -> None:
    codec = nc.NativeCodec("json", max_channel_bytes=16)
    raises(
        codec, orjson.dumps({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/" + "é" * 8}), BadChannel, 2
    )
    assert isinstance(
        codec.decode(orjson.dumps({"op": "subscribe", "id": 2, "sub": "s", "pattern": "/" + "é" * 7})),
        nc.Subscribe,
    )


def test_unsubscribe_ping_pong_auth() -> None:
    assert both({"op": "unsubscribe", "id": 3, "sub": "s1"}) == nc.Unsubscribe(3, "s1")
    assert both({"op": "ping", "id": 9}) == nc.Ping(9)
    assert both({"op": "ping"}) == nc.Ping(None)
    assert both({"op": "pong"}) == nc.Pong()
    assert both({"op": "pong", "id": "anything"}) == nc.Pong()
    assert both({"op": "auth", "id": 4, "token": "tok"}) == nc.Auth(4, "tok")
    raises(JSON, b'{"op":"auth","id":4}', BadRequest, 4)
    raises(JSON, b'{"op":"unsubscribe","id":4}', BadRequest, 4)
    raises(JSON, b'{"op":"ping","id":"x"}', BadRequest, None)


def test_publish_text_json_b64_defaults() -> None:
    text = jdec({"op": "publish", "id": 2, "channel": "/chat/room", "text": "hi é", "ack": True})
    assert text == nc.Publish(2, "/chat/room", "hi é".encode(), "text/plain; charset=utf-8", {}, (), "", True)
    js = jdec({"op": "publish", "id": 2, "channel": "/j", "json": {"a": [1, True]}})
    assert isinstance(js, nc.Publish)
    assert (js.payload, js.content_type, js.ack) == (b'{"a":[1,true]}', "application/json", False)
    null = jdec({"op": "publish", "id": 2, "channel": "/j", "json": None})
    assert isinstance(null, nc.Publish) and null.payload == b"null"
    b64 = jdec({"op": "publish", "id": 2, "channel": "/bin", "b64": "/w=="})
    assert isinstance(b64, nc.Publish)
    assert (b64.payload, b64.content_type) == (b"\xff", "application/octet-stream")


def test_publish_json_payload_is_compact_utf8() -> None:
    cmd = JSON.decode(
        '{"op":"publish","id":1,"channel":"/j","json": { "k" : "é\\u0001\\/" , "n": [1.5, 1e2] } }'
    )
    assert isinstance(cmd, nc.Publish)
    assert cmd.payload == '{"k":"é\\u0001/","n":[1.5,100.0]}'.encode()


def test_publish_deeply_nested_json_payload() -> None:
    deep = "[" * 400 + "]" * 400  # deeper than orjson writes, within what it reads
    cmd = JSON.decode('{"op":"publish","id":1,"channel":"/j","json":' + deep + "}")
    assert isinstance(cmd, nc.Publish) and cmd.payload == deep.encode()


def test_publish_all_fields() -> None:
    frame = {
        "op": "publish",
        "id": 5,
        "channel": "/a%41/*",
        "text": "x",
        "content_type": "text/x-custom",
        "headers": {"k": "v", "trace": "abc"},
        "tags": ["b", "a", "b"],
        "idem": "i" * 128,
        "ack": True,
    }
    cmd = jdec(frame)
    # Channels are canonicalised; "*" is literal in a publish.
    assert cmd == nc.Publish(
        5, "/aA/*", b"x", "text/x-custom", {"k": "v", "trace": "abc"}, ("a", "b"), "i" * 128, True
    )


def test_publish_msgpack_payload_bin_or_str() -> None:
    cmd = mdec({"op": "publish", "id": 3, "channel": "/m", "payload": b"\x00\xff", "ack": True})
    assert cmd == nc.Publish(3, "/m", b"\x00\xff", "application/octet-stream", {}, (), "", True)
    cmd = mdec({"op": "publish", "id": 3, "channel": "/m", "payload": "é"})
    assert isinstance(cmd, nc.Publish) and cmd.payload == "é".encode()
    # The JSON transport's payload fields are not msgpack's, and vice versa.
    raises(MP, msgpack.packb({"op": "publish", "id": 3, "channel": "/m", "text": "x"}), BadRequest, 3)
    raises(JSON, orjson.dumps({"op": "publish", "id": 3, "channel": "/m", "payload": "x"}), BadRequest, 3)


@pytest.mark.parametrize(
    ("extra", "exc"),
    [
        ({}, BadRequest),  # no payload field
        ({"text": "a", "b64": "YQ=="}, BadRequest),  # two payload fields
        ({"text": "a", "json": 1}, BadRequest),
        ({"text": 5}, BadRequest),
        ({"b64": "@@@"}, BadRequest),
        ({"b64": "YQ"}, BadRequest),  # padding required
        ({"b64": "é"}, BadRequest),
        ({"text": "a", "headers": {":guble.header": "x"}}, BadRequest),  # pseudo-header
        ({"text": "a", "headers": {"": "x"}}, BadRequest),
        ({"text": "a", "headers": {"k": 1}}, BadRequest),
        ({"text": "a", "headers": ["k"]}, BadRequest),
        ({"text": "a", "headers": {str(i): "v" for i in range(65)}}, LimitExceeded),
        ({"text": "a", "headers": {"k": "v" * 8192}}, LimitExceeded),
        ({"text": "a", "tags": [str(i) for i in range(65)]}, LimitExceeded),
        ({"text": "a", "tags": ["é" * 129]}, LimitExceeded),  # 258 bytes
        ({"text": "a", "idem": "i" * 129}, BadRequest),
        ({"text": "a", "idem": 5}, BadRequest),
        ({"text": "a", "ack": "true"}, BadRequest),
        ({"text": "a", "content_type": ""}, BadRequest),
        ({"text": "a", "content_type": "text/plain\r\nX: y"}, BadRequest),
        ({"text": "a", "content_type": 5}, BadRequest),
    ],
)
def test_publish_invalid(extra: dict[str, Any], exc: type[HubbubError]) -> None:
    raises(JSON, orjson.dumps({"op": "publish", "id": 8, "channel": "/a", **extra}), exc, 8)


def test_publish_content_types_are_checked_whatever_came_before() -> None:
    """A codec remembers the content types it accepted (publishers repeat theirs): what it refused stays
    refused however often it comes, and what is not a string is refused, not a crash."""
    codec = nc.NativeCodec("msgpack")
    for _ in range(3):
        for ct in ("text/plain", "a/b; q=1"):
            pub = codec.decode(
                packb({"op": "publish", "id": 1, "channel": "/a", "payload": b"", "content_type": ct})
            )
            assert isinstance(pub, nc.Publish) and pub.content_type == ct
        for bad in ("", "text/plain\nX: y", 5, ["text/plain"], {"a": 1}):
            frame = packb({"op": "publish", "id": 2, "channel": "/a", "payload": b"", "content_type": bad})
            raises(codec, frame, BadRequest, 2)


def test_publish_headers_text_with_no_utf8_form_is_4001_before_the_counts() -> None:
    from hubbub.dialects.native_common import Limits, check_headers

    lim = Limits(max_headers=1, max_header_bytes=4)
    lone = "\ud800"  # what an HTTP server's surrogateescape makes of invalid bytes
    # Over both limits, and a name with no UTF-8 form: the text is what is wrong (4001), as it always was.
    with pytest.raises(BadRequest):
        check_headers([("a", "bbbbbbb"), (lone, "c")], lim)
    with pytest.raises(LimitExceeded):
        check_headers([("a", "b"), ("c", "d")], lim)
    with pytest.raises(LimitExceeded):
        check_headers([("ab", "cde")], lim)
    with pytest.raises(LimitExceeded):  # a repeated name's bytes count each time it is given
        check_headers([("a", "b"), ("a", "c"), ("a", "d")], Limits(max_headers=1, max_header_bytes=5))
    assert check_headers([("ab", "cd")], lim) == {"ab": "cd"}
    assert check_headers([("é", "é")], lim) == {"é": "é"}


def packb(obj: dict[str, Any]) -> bytes:
    out: bytes = msgpack.packb(obj, use_bin_type=True)
    return out


@pytest.mark.parametrize("channel", ["nope", "", "/a%FF", "/" + "x" * 1024])
def test_publish_bad_channel(channel: str) -> None:
    raises(JSON, orjson.dumps({"op": "publish", "id": 2, "channel": channel, "text": "x"}), BadChannel, 2)


def test_publish_tags_and_headers_at_the_limits() -> None:
    codec = nc.NativeCodec("json", max_tags=2, max_tag_bytes=4, max_headers=1, max_header_bytes=4)
    ok = codec.decode(
        orjson.dumps(
            {
                "op": "publish",
                "id": 1,
                "channel": "/a",
                "text": "",
                "tags": ["ab", "éé", "ab"],
                "headers": {"ab": "cd"},
            }
        )
    )
    assert isinstance(ok, nc.Publish) and ok.tags == ("ab", "éé")
    raises(
        codec,
        orjson.dumps({"op": "publish", "id": 1, "channel": "/a", "text": "", "tags": ["a", "b", "c"]}),
        LimitExceeded,
        1,
    )
    raises(
        codec,
        orjson.dumps({"op": "publish", "id": 1, "channel": "/a", "text": "", "headers": {"ab": "cde"}}),
        LimitExceeded,
        1,
    )


# -- decoding: frame-level errors and request ids ---------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "exc", "rid"),
    [
        (b"", BadFrame, None),
        (b"not json", BadFrame, None),
        (b"[1,2]", BadFrame, None),
        (b'"op"', BadFrame, None),
        (b'{"op":"ping"} {}', BadFrame, None),
        (b'{"op":"hello","id":1,"v":1', BadFrame, None),
        (b"\xff", BadFrame, None),
        (b'{"op":"frobnicate","id":5}', UnknownOp, 5),
        (b'{"op":"frobnicate"}', UnknownOp, None),
        (b'{"id":5}', BadRequest, 5),
        (b'{"op":5,"id":5}', BadRequest, 5),
        (b'{"op":"unsubscribe","sub":"s"}', BadRequest, None),
        (b'{"op":"unsubscribe","id":"5","sub":"s"}', BadRequest, None),
        (b'{"op":"unsubscribe","id":5.0,"sub":"s"}', BadRequest, None),
        (b'{"op":"unsubscribe","id":true,"sub":"s"}', BadRequest, None),
        # Out of range but readable: echoed so the client can correlate.
        (b'{"op":"unsubscribe","id":-1,"sub":"s"}', BadRequest, -1),
        (b'{"op":"unsubscribe","id":2147483648,"sub":"s"}', BadRequest, 2147483648),
        (b'{"op":"publish","id":2,"channel":"nope","text":"x"}', BadChannel, 2),
        # As far as both encodings carry an integer (-2^63 .. 2^64-1); past that, no id to echo.
        (b'{"op":"unsubscribe","id":18446744073709551615,"sub":"s"}', BadRequest, 2**64 - 1),
        (b'{"op":"unsubscribe","id":-9223372036854775808,"sub":"s"}', BadRequest, -(2**63)),
        (b'{"op":"unsubscribe","id":18446744073709551616,"sub":"s"}', BadRequest, None),
        (b'{"op":"unsubscribe","id":-9223372036854775809,"sub":"s"}', BadRequest, None),
        (b'{"op":"ping","id":1180591620717411303424}', BadRequest, None),
        (b'{"op":"publish","id":1180591620717411303424,"channel":"/a","text":"x"}', BadRequest, None),
        (
            b'{"op":"publish_batch","id":1180591620717411303424,"channels":["/a"],"texts":["x"]}',
            BadRequest,
            None,
        ),
        (b'{"op":"frobnicate","id":1180591620717411303424}', UnknownOp, None),
    ],
)
def test_json_frame_errors(frame: bytes, exc: type[HubbubError], rid: int | None) -> None:
    raises(JSON, frame, exc, rid)


def test_id_bounds() -> None:
    assert both({"op": "unsubscribe", "id": 0, "sub": "s"}) == nc.Unsubscribe(0, "s")
    assert both({"op": "unsubscribe", "id": 2**31 - 1, "sub": "s"}) == nc.Unsubscribe(2**31 - 1, "s")


@pytest.mark.parametrize(
    "frame",
    [
        b"",
        b"\xc1",
        b"\x93\x01",
        b"\x92\x01\x02",
        b"\x01",
        b"\x80\x80",
        b"\xa2\xff\xfe",
        b"\x81\x91\x01\x02",
        b"\x91" * 5000,
    ],
)
def test_msgpack_frame_errors(frame: bytes) -> None:
    raises(MP, frame, BadFrame, None)


def test_msgpack_text_message_is_bad_frame() -> None:
    raises(MP, '{"op":"ping"}', BadFrame, None)


def test_json_codec_accepts_str_and_bytes() -> None:
    assert JSON.decode('{"op":"ping","id":1}') == JSON.decode(b'{"op":"ping","id":1}') == nc.Ping(1)


def test_frame_too_large() -> None:
    codec = nc.NativeCodec("json", max_frame=32)
    frame = orjson.dumps({"op": "publish", "id": 1, "channel": "/a", "text": "x" * 40})
    raises(codec, frame, FrameTooLarge, None)
    raises(codec, frame.decode(), FrameTooLarge, None)
    # Size is counted in UTF-8 bytes, also for str messages.
    raises(codec, '{"op":"ping","t":"' + "é" * 8 + '"}', FrameTooLarge, None)
    assert codec.decode('{"op":"ping","t":"' + "é" * 5 + '"}') == nc.Ping()
    exact = b'{"op":"ping","t":"' + b"x" * 12 + b'"}'
    assert len(exact) == 32 and codec.decode(exact) == nc.Ping()
    mp = nc.NativeCodec("msgpack", max_frame=8)
    raises(mp, msgpack.packb({"op": "ping", "x": "y" * 10}), FrameTooLarge, None)


def test_every_error_is_fatal_or_not_as_documented() -> None:
    assert BadFrame().fatal and FrameTooLarge().fatal
    assert not BadRequest().fatal and not UnknownOp().fatal and not BadChannel().fatal
    assert not LimitExceeded().fatal


# -- encoding: replies, errors, pushes --------------------------------------------------------------------


def test_hello_reply_exact() -> None:
    out = JSON.encode_hello_reply(1, SID, "", 25, 1048576, 1024, False)
    assert out == (
        b'{"op":"reply","id":1,"v":1,"session":"a1b2c3d4e5f60718","user":"","ping_interval":25,'
        b'"limits":{"max_frame":1048576,"max_subscriptions":1024}}'
    )
    assert JSON.encode_hello_reply(1, SID, "", 25.0, 256, 1024) == out.replace(b"1048576", b"256")
    batched = JSON.encode_hello_reply(1, SID, "u", 2.5, 1048576, 1024, True)
    assert keys(batched)[-1] == "batch" and orjson.loads(batched)["ping_interval"] == 2.5
    mp = msgpack.unpackb(MP.encode_hello_reply(1, SID, "", 25, 1048576, 1024, False))
    assert mp == orjson.loads(out)


def test_publish_reply_exact() -> None:
    ev = event()
    assert JSON.encode_publish_reply(2, ev, False) == (
        b'{"op":"reply","id":2,"channel":"/chat/room","seq":7,"epoch":"k3j2a9x1","time":"1795313749574424198"}'
    )
    dup = JSON.encode_publish_reply(2, ev, True)
    assert dup.endswith(b',"duplicate":true}')
    assert msgpack.unpackb(MP.encode_publish_reply(3, ev)) == {
        "op": "reply",
        "id": 3,
        "channel": "/chat/room",
        "seq": 7,
        "epoch": EPOCH,
        "time": T,  # an integer in msgpack
    }


def test_subscribe_reply() -> None:
    assert JSON.encode_subscribe_reply(2, "s1", Position(0, ""), None) == (
        b'{"op":"reply","id":2,"sub":"s1","position":{"seq":0,"epoch":""}}'
    )
    assert JSON.encode_subscribe_reply(2, "s1", None, T) == (
        b'{"op":"reply","id":2,"sub":"s1","top_time":"1795313749574424198"}'
    )
    assert JSON.encode_subscribe_reply(2, "s1", None, None).endswith(b'"top_time":"0"}')
    assert msgpack.unpackb(MP.encode_subscribe_reply(2, "s1", None, T))["top_time"] == T


@pytest.mark.parametrize("rid", [2**64, 2**70, -(2**63) - 1, 10**40])
@pytest.mark.parametrize("codec", [JSON, MP], ids=["json", "msgpack"])
def test_error_frame_leaves_out_an_id_no_encoding_carries(codec: nc.NativeCodec, rid: int) -> None:
    frame = codec.encode_error(4001, rid)
    obj = orjson.loads(frame) if codec is JSON else msgpack.unpackb(frame)
    assert obj == {"op": "error", "code": 4001, "message": "bad request", "temporary": False}


def test_error_frames_match_vectors() -> None:
    # native.hello-required (an id-less request still gets the id of the frame that caused it)
    out = JSON.encode_error(4005, 1)
    assert orjson.loads(out) == {
        "op": "error",
        "code": 4005,
        "message": "hello required",
        "temporary": False,
        "id": 1,
    }
    # native.md §3.1 gives the key order: op, id, code, message, temporary.
    assert keys(out) == ["op", "id", "code", "message", "temporary"]
    # native.unsupported-version
    assert JSON.encode_error(4006, 1, supported=[1]) == (
        b'{"op":"error","id":1,"code":4006,"message":"unsupported version","temporary":false,"supported":[1]}'
    )
    # A push without a request id, temporary code, and an optional detail.
    assert JSON.encode_error(4302) == b'{"op":"error","code":4302,"message":"slow consumer","temporary":true}'
    # detail stays off the wire unless asked for (the vectors compare error frames exactly).
    assert JSON.encode_error(4201, 4, "not subscribed") == (
        b'{"op":"error","id":4,"code":4201,"message":"not subscribed","temporary":false}'
    )
    verbose = nc.NativeCodec("json", send_detail=True)
    assert keys(verbose.encode_error(4001, 3, "sub must be a string", x=1)) == [
        "op",
        "id",
        "code",
        "message",
        "temporary",
        "detail",
        "x",
    ]
    for code, (name, temporary, _, _) in CODES.items():
        obj = msgpack.unpackb(MP.encode_error(code, 7))
        assert obj == {
            "op": "error",
            "id": 7,
            "code": code,
            "message": name.replace("_", " "),
            "temporary": temporary,
        }


def test_plain_replies() -> None:
    assert JSON.encode_reply(3, {}) == b'{"op":"reply","id":3}'
    assert JSON.encode_reply(4, {"user": "u"}) == b'{"op":"reply","id":4,"user":"u"}'
    assert JSON.encode_reply(4, user="u") == b'{"op":"reply","id":4,"user":"u"}'
    assert msgpack.unpackb(MP.encode_reply(3)) == {"op": "reply", "id": 3}


def test_pushes() -> None:
    assert JSON.encode_push("ping") == b'{"op":"ping"}'
    assert JSON.encode_push("pong", id=9) == b'{"op":"pong","id":9}'
    assert JSON.encode_push("pong") == b'{"op":"pong"}'
    # Fields come out in the spec's order whatever order they were given in.
    assert JSON.encode_push("recovered", position=Position(3, EPOCH), replayed=2, sub="s1") == (
        b'{"op":"recovered","sub":"s1","replayed":2,"position":{"seq":3,"epoch":"k3j2a9x1"}}'
    )
    assert (
        JSON.encode_push("recovered", sub="s1", replayed=0) == b'{"op":"recovered","sub":"s1","replayed":0}'
    )
    gap = (
        b'{"op":"gap","sub":"s1","channel":"/a","since":{"seq":10,"epoch":"old"},'
        b'"position":{"seq":42,"epoch":"new"},"reason":"epoch"}'
    )
    pushed = JSON.encode_push(
        "gap", sub="s1", channel="/a", since=Position(10, "old"), position=Position(42, "new"), reason="epoch"
    )
    assert pushed == gap
    given_as_maps = JSON.encode_push(
        "gap",
        reason="epoch",
        position={"seq": 42, "epoch": "new"},
        since={"seq": 10, "epoch": "old"},
        channel="/a",
        sub="s1",
    )
    assert given_as_maps == gap
    assert msgpack.unpackb(
        MP.encode_push(
            "gap",
            sub="s1",
            channel="/a",
            since=Position(10, "old"),
            position=Position(42, "new"),
            reason="epoch",
        )
    ) == orjson.loads(gap)


# -- encoding: events -------------------------------------------------------------------------------------

VECTOR_EVENT = {
    "op": "event",
    "subs": ["s1", "s2"],
    "channel": "/chat/room",
    "seq": 7,
    "epoch": EPOCH,
    "time": str(T),
    "publisher": {"dialect": "native", "user": "", "app": SID, "msg_id": ""},
    "headers": {"k": "v"},
    "tags": ["a", "b"],
    "content_type": "text/plain; charset=utf-8",
    "text": "hi 5%",
}


def test_event_matches_spec_example_bytes_and_key_order() -> None:
    ev = event(headers={"k": "v"}, tags=("a", "b"))
    out = JSON.encode_event(ev, ["s1", "s2"])
    # native.md §3.5, byte for byte.
    assert out == orjson.dumps(VECTOR_EVENT)
    assert keys(out) == list(VECTOR_EVENT)
    replay = JSON.encode_event(ev, ["s1", "s2"], replay=True)
    assert orjson.loads(replay) == {**VECTOR_EVENT, "replay": True} and keys(replay)[-1] == "replay"


def test_event_vector_subscribe_publish_ack() -> None:
    ev = event(payload=b"hi", channel="/chat/room", seq=1)
    assert orjson.loads(JSON.encode_event(ev, ["s1"])) == {
        "op": "event",
        "subs": ["s1"],
        "channel": "/chat/room",
        "seq": 1,
        "epoch": EPOCH,
        "time": str(T),
        "publisher": {"dialect": "native", "user": "", "app": SID, "msg_id": ""},
        "headers": {},
        "tags": [],
        "content_type": "text/plain; charset=utf-8",
        "text": "hi",
    }


def test_event_hides_pseudo_headers_and_sorts_tags() -> None:
    ev = event(headers={":guble.header": "raw", "k": "v", ":filter.user_id": "u"}, tags=("b", "a", "é", "Z"))
    obj = orjson.loads(JSON.encode_event(ev, ["s"]))
    assert obj["headers"] == {"k": "v"}
    assert obj["tags"] == ["Z", "a", "b", "é"]
    mp = msgpack.unpackb(MP.encode_event(ev, ["s"]))
    assert mp["headers"] == {"k": "v"} and mp["tags"] == ["Z", "a", "b", "é"]


@pytest.mark.parametrize(
    ("payload", "ctype", "field", "value"),
    [
        (b'{"a":[1,true]}', "application/json", "json", {"a": [1, True]}),  # native.payload-json
        (b'{"x":1}', "application/json", "json", {"x": 1}),  # native.cross-qpubs-json
        (b'{"x":1}', "application/ld+json; charset=utf-8", "json", {"x": 1}),
        (b'{"x":1}', "Application/JSON", "json", {"x": 1}),
        (b"[1, 2]", "application/json", "json", [1, 2]),
        (b"not json", "application/json", "text", "not json"),
        (b'{"x":1}', "text/plain", "text", '{"x":1}'),
        (b"\xff", "application/octet-stream", "b64", "/w=="),  # native.payload-b64
        (b"\xff", "application/json", "b64", "/w=="),
        (b"", "text/plain", "text", ""),
        (b"\xed\xa0\x80", "text/plain", "b64", base64.b64encode(b"\xed\xa0\x80").decode()),  # a surrogate
    ],
)
def test_event_payload_field(payload: bytes, ctype: str, field: str, value: Any) -> None:
    obj = orjson.loads(JSON.encode_event(event(payload=payload, content_type=ctype), ["s1"]))
    assert obj["content_type"] == ctype
    assert obj[field] == value
    assert not ({"json", "text", "b64", "payload"} - {field}) & set(obj)
    mp = msgpack.unpackb(MP.encode_event(event(payload=payload, content_type=ctype), ["s1"]))
    assert mp["payload"] == payload and isinstance(mp["payload"], bytes)


def test_event_json_payload_embedded_verbatim_but_compact() -> None:
    # Whitespace outside strings goes; digits and escapes inside strings stay exactly as stored.
    raw = b' {"big": 123456789012345678901234567890, "f": 1.50, "s": "a b\\u00e9"}\n'
    out = JSON.encode_event(event(payload=raw, content_type="application/json"), ["s"])
    assert out.endswith(b',"json":{"big":123456789012345678901234567890,"f":1.50,"s":"a b\\u00e9"}}')
    compact = b'{"s":"keep  these  spaces"}'
    assert JSON.encode_event(event(payload=compact, content_type="application/json"), ["s"]).endswith(
        b',"json":' + compact + b"}"
    )


def test_compact_json_helper() -> None:
    assert compact_json(b"nope") is None
    assert compact_json(b"NaN") is None
    assert compact_json(b'{"a":1}') == b'{"a":1}'
    assert compact_json(b'[ "\\" x" , 1e400 ]') == b'["\\" x",1e400]'
    assert compact_json(b"\xef\xbb\xbf{}") is None  # a BOM is not JSON
    assert is_json_type("application/problem+json") and not is_json_type("text/json")


def test_json_output_is_utf8_with_only_required_escapes() -> None:
    ev = event(payload='é\x00\x1f\x7f/\u2028"\\\n'.encode(), channel="/caf\u00e9", tags=("ü",))
    out = JSON.encode_event(ev, ["s\u00e9"])
    assert "é".encode() in out and b"\\u00e9" not in out
    assert b'"text":"\xc3\xa9\\u0000\\u001f\x7f/\xe2\x80\xa8\\"\\\\\\n"' in out
    assert b" " not in out.replace(b"; ", b"")  # compact (the only space is inside the content type)


def test_event_subs_splicing_with_shared_cache_matches_uncached() -> None:
    ev = event(headers={"k": "v", ":p": "x"}, tags=("a", "b"))
    other = event(payload=b"\x00\x01", content_type="application/octet-stream", seq=8)
    for codec in (JSON, MP):
        cache: dict[Any, Any] = {}
        second = nc.NativeCodec(codec.encoding)  # another connection, same encoding, same fan-out cache
        for subs, replay in ((["s1"], False), (["s1", "s2"], True), (("x",), False), ([], False)):
            fresh = nc.NativeCodec(codec.encoding).encode_event(ev, subs, replay)
            assert codec.encode_event(ev, subs, replay, cache) == fresh
            assert second.encode_event(ev, subs, replay, cache) == fresh
        # One dict reused across events (a replay loop does this) must never serve a stale body.
        assert codec.encode_event(other, ["s1"], True, cache) == nc.NativeCodec(codec.encoding).encode_event(
            other, ["s1"], True
        )
    # A cache shared by both encodings stays correct: entries are keyed by encoding.
    shared: dict[Any, Any] = {}
    assert JSON.encode_event(ev, ["s"], False, shared) == JSON.encode_event(ev, ["s"])
    assert MP.encode_event(ev, ["s"], False, shared) == MP.encode_event(ev, ["s"])


def test_event_cache_encodes_body_once() -> None:
    ev = event()
    cache: dict[Any, Any] = {}
    JSON.encode_event(ev, ["a"], False, cache)
    (key,) = cache
    body = cache[key][1]
    JSON.encode_event(ev, ["b"], True, cache)
    assert cache[key][1] is body


def test_msgpack_event_vector() -> None:
    # native.msgpack-subprotocol
    ev = event(payload=b"\x00\xff", content_type="application/octet-stream", channel="/m", seq=1)
    obj = msgpack.unpackb(MP.encode_event(ev, ["s1"]))
    assert obj == {
        "op": "event",
        "subs": ["s1"],
        "channel": "/m",
        "seq": 1,
        "epoch": EPOCH,
        "time": T,
        "publisher": {"dialect": "native", "user": "", "app": SID, "msg_id": ""},
        "headers": {},
        "tags": [],
        "content_type": "application/octet-stream",
        "payload": b"\x00\xff",
    }
    assert list(obj) == [k for k in VECTOR_EVENT if k != "text"] + ["payload"]
    replay = msgpack.unpackb(MP.encode_event(ev, ["s1"], True))
    assert list(replay)[-1] == "replay" and replay["replay"] is True
    # Many subscriptions (array16 header) still splice correctly.
    many = [f"s{i}" for i in range(40)]
    assert msgpack.unpackb(MP.encode_event(ev, many))["subs"] == many


def test_batch() -> None:
    frames = [JSON.encode_push("ping"), JSON.encode_event(event(), ["s1"]), JSON.encode_reply(3)]
    out = JSON.encode_batch(frames)
    assert out == b'{"op":"batch","frames":[' + b",".join(frames) + b"]}"
    assert orjson.loads(out) == {"op": "batch", "frames": [orjson.loads(f) for f in frames]}
    for n in (0, 1, 3, 20):
        mframes = [MP.encode_push("pong", id=i) for i in range(n)]
        assert msgpack.unpackb(MP.encode_batch(mframes)) == {
            "op": "batch",
            "frames": [{"op": "pong", "id": i} for i in range(n)],
        }


def test_frame_for_stream() -> None:
    assert JSON.frame_for_stream(b'{"op":"ping"}') == b'{"op":"ping"}\n'
    data = MP.encode_push("ping")
    assert MP.frame_for_stream(data) == len(data).to_bytes(4, "big") + data
    assert MP.frame_for_stream(data)[0] == 0
    for codec, frame in ((JSON, b'{"op":"ping"}'), (MP, data)):
        parts = codec.stream_parts(frame)
        assert b"".join(parts) == codec.frame_for_stream(frame)
        assert any(p is frame for p in parts)  # the frame itself, not a copy


def test_round_trip_through_stream_decoder() -> None:
    for codec in (JSON, MP):
        raw = codec.frame_for_stream(
            orjson.dumps({"op": "ping", "id": 1})
            if codec.encoding == "json"
            else msgpack.packb({"op": "ping", "id": 1})
        )
        dec = nc.NativeStreamDecoder()
        assert dec.feed(raw) == [nc.Ping(1)] and dec.encoding == codec.encoding


# -- HTTP renderings --------------------------------------------------------------------------------------


def test_render_http_error() -> None:
    assert nc.render_http_error(4004) == (
        400,
        b'{"error":{"code":4004,"message":"bad channel","temporary":false}}\n',
    )
    assert nc.render_http_error(4003)[0] == 413
    assert nc.render_http_error(4301)[0] == 503
    assert nc.render_http_error(4004, "channel must start with /")[1] == nc.render_http_error(4004)[1]
    status, body = nc.render_http_error(4202, "epoch differs", send_detail=True, position=Position(5, EPOCH))
    assert status == 409
    assert orjson.loads(body) == {
        "error": {
            "code": 4202,
            "message": "epoch mismatch",
            "temporary": False,
            "detail": "epoch differs",
            "position": {"seq": 5, "epoch": EPOCH},
        }
    }


def test_render_log_json_jsonl_msgpack() -> None:
    evs = [
        event(payload=b"hello", seq=1, channel="/logs/x", headers={"trace": "abc"}, tags=("t1",)),
        event(payload=b"\xff", seq=2, channel="/logs/x"),
    ]
    body, ctype, extra = nc.render_log("/logs/x", EPOCH, 1, 2, False, evs, "json")
    assert ctype == "application/json" and extra == {} and body.endswith(b"\n") and body.count(b"\n") == 1
    obj = orjson.loads(body)
    assert list(obj) == ["channel", "epoch", "first", "top", "trimmed", "events"]
    assert obj["events"][0] == {
        "channel": "/logs/x",
        "seq": 1,
        "epoch": EPOCH,
        "time": str(T),
        "publisher": {"dialect": "native", "user": "", "app": SID, "msg_id": ""},
        "headers": {"trace": "abc"},
        "tags": ["t1"],
        "content_type": "text/plain; charset=utf-8",
        "text": "hello",
    }
    assert obj["events"][1]["b64"] == "/w=="
    assert obj["events"] == [nc.event_object(e) for e in evs]

    body, ctype, extra = nc.render_log("/logs/x", EPOCH, 1, 2, True, evs, "jsonl")
    assert ctype == "application/x-ndjson"
    assert extra == {"Hubbub-Epoch": EPOCH, "Hubbub-First": "1", "Hubbub-Top": "2", "Hubbub-Trimmed": "true"}
    lines = body.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert lines[0].startswith(b'{"channel":"/logs/x",') and lines[0].endswith(b'"text":"hello"}')

    body, ctype, _ = nc.render_log("/logs/x", EPOCH, 1, 2, False, evs, "msgpack")
    assert ctype == "application/msgpack"
    mp = msgpack.unpackb(body)
    assert mp["top"] == 2 and mp["events"][1]["payload"] == b"\xff" and mp["events"][0]["time"] == T
    assert mp["events"] == [nc.event_object(e, encoding="msgpack") for e in evs]

    empty, _, _ = nc.render_log("/never", "", 0, 0, False, [], "json")
    assert empty == b'{"channel":"/never","epoch":"","first":0,"top":0,"trimmed":false,"events":[]}\n'
    assert nc.render_log("/never", "", 0, 0, False, [], "jsonl")[0] == b""
    many = nc.render_log("/a", EPOCH, 1, 20, False, [event(seq=i) for i in range(20)], "msgpack")[0]
    assert len(msgpack.unpackb(many)["events"]) == 20
    with pytest.raises(BadRequest):
        nc.render_log("/a", "", 0, 0, False, [], "xml")


def test_sse_event_and_last_event_id() -> None:
    ev = event(payload=b"v", channel="/st/x", seq=1)
    out = nc.render_sse_event(ev, False)
    head, data = out.split(b"\n", 1)
    assert head == f"id: {T}:{EPOCH}:1:/st/x".encode()
    assert data.startswith(b"data: ") and data.endswith(b"\n\n") and data.count(b"\n") == 2
    assert orjson.loads(data[6:]) == nc.event_object(ev)
    replay = nc.render_sse_event(ev, True)
    assert orjson.loads(replay.split(b"data: ", 1)[1])["replay"] is True
    cache: dict[Any, Any] = {}
    assert nc.render_sse_event(ev, True, cache) == replay == nc.render_sse_event(ev, True, cache)
    other = event(payload=b"w", channel="/st/x", seq=2)
    assert nc.render_sse_event(other, True, cache) == nc.render_sse_event(other, True)

    assert nc.parse_sse_last_event_id(f"{T}:{EPOCH}:1:/st/x") == (T, EPOCH, 1, "/st/x")
    assert nc.parse_sse_last_event_id("5::0:/a:b/c%41") == (5, "", 0, "/a:b/cA")  # channels may hold ':'
    for bad in (
        "",
        "1:e:2",
        "x:e:1:/a",
        "1:E:1:/a",
        "1:e:-1:/a",
        "1:e:1:a",
        "1:e:1:/a%FF",
        f"{2**64}:e:1:/a",
    ):
        with pytest.raises(BadRequest):
            nc.parse_sse_last_event_id(bad)


def test_sse_gap_and_recovered() -> None:
    gap = nc.render_sse_gap("/a", "epoch", Position(1, "old"), Position(3, "new"))
    expected = (
        b'event: gap\ndata: {"channel":"/a","reason":"epoch","since":{"seq":1,"epoch":"old"},'
        b'"position":{"seq":3,"epoch":"new"}}\n\n'
    )
    assert gap == expected
    assert nc.render_sse_recovered(2) == b'event: recovered\ndata: {"replayed":2}\n\n'


def test_http_publish_fields() -> None:
    headers = [
        ("Content-Type", "text/plain"),
        ("Hubbub-Header-Trace", "abc"),
        ("HUBBUB-HEADER-X-Y", "1"),
        ("hubbub-header-x-y", "2"),
    ]
    assert nc.http_publish_fields("text/plain; charset=utf-8", ["t2", "t1", "t2"], headers, "key") == (
        "text/plain; charset=utf-8",
        {"trace": "abc", "x-y": "1, 2"},
        ("t1", "t2"),
        "key",
    )
    assert nc.http_publish_fields(None, [], [], None) == ("application/octet-stream", {}, (), "")
    assert nc.http_publish_fields("", [], [], "")[0] == "application/octet-stream"
    limits = {
        "max_channel_bytes": 1024,
        "max_tags": 1,
        "max_tag_bytes": 3,
        "max_headers": 1,
        "max_header_bytes": 5,
    }
    with pytest.raises(LimitExceeded):
        nc.http_publish_fields(None, ["a", "b"], [], None, **limits)
    with pytest.raises(LimitExceeded):
        nc.http_publish_fields(None, ["abcd"], [], None, **limits)
    with pytest.raises(LimitExceeded):
        nc.http_publish_fields(None, [], [("Hubbub-Header-a", "1"), ("Hubbub-Header-b", "2")], None, **limits)
    with pytest.raises(LimitExceeded):
        nc.http_publish_fields(None, [], [("Hubbub-Header-abc", "def")], None, **limits)
    with pytest.raises(BadRequest):
        nc.http_publish_fields(None, [], [("Hubbub-Header-", "x")], None)
    with pytest.raises(BadRequest):
        nc.http_publish_fields(None, [], [], "k" * 129)
    # Invalid UTF-8 that an HTTP server decoded with surrogateescape can never be rendered: refused.
    bad = b"\xff".decode("utf-8", "surrogateescape")
    cases: list[tuple[str | None, list[str], list[tuple[str, str]], str | None]] = [
        (None, [bad], [], None),
        (None, [], [("Hubbub-Header-k", bad)], None),
        (None, [], [], bad),
        ("text/" + bad, [], [], None),
    ]
    for args in cases:
        with pytest.raises(BadRequest):
            nc.http_publish_fields(*args)


def test_event_object_forms() -> None:
    ev = event(payload=b'{"x": 1}', content_type="application/json", headers={":p": "1"})
    obj = nc.event_object(ev, replay=True)
    assert obj["json"] == {"x": 1} and obj["headers"] == {} and list(obj)[-1] == "replay"
    mp = nc.event_object(ev, encoding="msgpack")
    assert mp["payload"] == b'{"x": 1}' and mp["time"] == T and "replay" not in mp


def test_json_payload_keeps_integers_beyond_64_bits() -> None:
    codec = nc.NativeCodec("json")
    frame = '{"op":"publish","id":2,"channel":"/a","json":{"big":123456789012345678901234567890,"n":-1}}'
    for message in (frame, frame.encode()):
        cmd = codec.decode(message)
        assert isinstance(cmd, nc.Publish)
        assert cmd.payload == b'{"big":123456789012345678901234567890,"n":-1}'
    with pytest.raises(HubbubError) as info:
        codec.decode('{"op":"publish","id":2,"channel":"/a","json":NaN,"x":12345678901234567890}')
    assert info.value.code == 4000
