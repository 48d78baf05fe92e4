"""The guble codec (hubbub.dialects.guble) against guble.md and mapping.md §5.2/§6, without sockets."""

from __future__ import annotations

import re

import orjson
import pytest

from hubbub.dialects import guble as gc
from hubbub.errors import BadChannel, BadRequest, FrameTooLarge, HubbubError, StorageError, UnknownOp
from hubbub.events import Event, Publisher

CODEC = gc.GubleCodec()


def _err(data: bytes | str, codec: gc.GubleCodec = CODEC) -> str:
    with pytest.raises(HubbubError) as info:
        codec.decode(data)
    return gc.error_text(info.value).decode()


# -- errors: the exact texts of guble.md §3 ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "reply"),
    [
        ("", "!error-bad-request error parsing command. empty command"),
        ("XXXX", "!error-bad-request unknown command XXXX"),
        ("send /foo", "!error-bad-request unknown command send"),
        (">/foo", "!error-bad-request unknown command >/foo"),
        (">", "!error-bad-request send command requires a path argument, but none given"),
        ("> ", "!error-bad-request send command requires a path argument, but none given"),
        ("> foo", "!error-bad-request invalid path foo"),
        ("> /a%FF", "!error-bad-request invalid path /a%FF"),
        ("+", "!error-bad-request command requires at least a path argument, but non given"),
        ("+ foo", "!error-bad-request command requires at least a path argument, but non given"),
        ("-", "!error-bad-request - command requires a path argument, but none given"),
        ("- foo", "!error-bad-request invalid path foo"),
        (
            "+ /foo abc",
            '!error-bad-request startid has to be empty or int, but was "abc": '
            'strconv.ParseInt: parsing "abc": invalid syntax',
        ),
        (
            "+ /foo 99999999999999999999",
            '!error-bad-request startid has to be empty or int, but was "99999999999999999999": '
            'strconv.ParseInt: parsing "99999999999999999999": value out of range',
        ),
        (
            "+ /foo ",
            '!error-bad-request startid has to be empty or int, but was "": '
            'strconv.ParseInt: parsing "": invalid syntax',
        ),
        (
            "+ /foo 1 x",
            '!error-bad-request maxCount has to be empty or int, but was "x": '
            'strconv.Atoi: parsing "x": invalid syntax',
        ),
        ("+ /foo 1 -2", '!error-bad-request maxCount must not be negative, but was "-2"'),
        (
            "+ /foo 0,",
            '!error-bad-request maxCount has to be empty or int, but was "": '
            'strconv.Atoi: parsing "": invalid syntax',
        ),
    ],
)
def test_error_texts(frame: str, reply: str) -> None:
    assert _err(frame) == reply
    assert _err(frame.encode()) == reply  # binary frames parse the same


def test_error_classes() -> None:
    for frame, cls in (("", BadRequest), ("x", UnknownOp), ("> foo", BadChannel), ("+ /a b", BadRequest)):
        with pytest.raises(cls):
            CODEC.decode(frame)


def test_path_over_limit_is_invalid() -> None:
    long = "/" + "a" * 1024
    assert _err("> " + long) == f"!error-bad-request invalid path {long}"
    small = gc.GubleCodec(max_channel_bytes=8)
    assert _err("+ /123456789", small) == "!error-bad-request invalid path /123456789"
    assert isinstance(small.decode("+ /1234567"), gc.Receive)


def test_frame_over_max_frame() -> None:
    codec = gc.GubleCodec(max_frame=16)
    assert isinstance(codec.decode(b"> /foo\n\n" + b"x" * 8), gc.Send)
    with pytest.raises(FrameTooLarge):
        codec.decode(b"> /foo\n\n" + b"x" * 9)


def test_server_errors_are_internal_without_details() -> None:
    assert gc.error_text(StorageError("disk /var/x failed")) == b"!error-server-internal unavailable"


def test_invalid_utf8_in_tokens_is_shown_replaced() -> None:
    assert _err(b"\xff\xfe") == "!error-bad-request unknown command \ufffd\ufffd"
    assert _err(b"+ /foo \xff") == (
        '!error-bad-request startid has to be empty or int, but was "\\xff": '
        'strconv.ParseInt: parsing "\\xff": invalid syntax'
    )
    assert _err(b"> /\xff").startswith("!error-bad-request invalid path /")


# -- commands -----------------------------------------------------------------------------------------------


def test_send_parts() -> None:
    assert CODEC.decode('> /foo\n{"k": "v"}\nhello world') == gc.Send(
        "/foo", "", '{"k": "v"}', b"hello world"
    )
    assert CODEC.decode("> /foo/bar 42\n\nsub body") == gc.Send("/foo/bar", "42", "", b"sub body")
    assert CODEC.decode("> /foo") == gc.Send("/foo", "", "", b"")
    assert CODEC.decode("> /foo\n{}") == gc.Send("/foo", "", "{}", b"")
    assert CODEC.decode(b"> /foo\n\nline1\nline2\n") == gc.Send("/foo", "", "", b"line1\nline2\n")
    # The message id is the rest of the argument; paths are canonicalised.
    assert CODEC.decode("> /a%41 id with spaces") == gc.Send("/aA", "id with spaces", "", b"")


def test_guble_cli_lines_with_trailing_newline() -> None:
    # guble-cli sends each line with its newline: the command line ends at it, header and body are empty.
    assert CODEC.decode("+ /foo\n") == gc.Receive("/foo")
    assert CODEC.decode("- /foo\n") == gc.Cancel("/foo")
    assert CODEC.decode("+ /foo -3\n") == gc.Receive("/foo", -3)
    assert CODEC.decode('> /foo\n{"x":1}\nbody') == gc.Send("/foo", "", '{"x":1}', b"body")


def test_binary_body_is_kept() -> None:
    assert CODEC.decode(b"> /foo\n\n\x00\xff\n") == gc.Send("/foo", "", "", b"\x00\xff\n")
    with pytest.raises(BadRequest):
        CODEC.decode(b"> /foo\n\xff\nx")  # the header line becomes a header value: it must be UTF-8


@pytest.mark.parametrize(
    ("frame", "cmd"),
    [
        ("+ /foo", gc.Receive("/foo")),
        ("+ /foo 0", gc.Receive("/foo", 0)),
        ("+ /foo -5", gc.Receive("/foo", -5)),
        ("+ /foo +7", gc.Receive("/foo", 7)),
        ("+ /foo 0 3", gc.Receive("/foo", 0, 3)),
        ("+ /foo 0,20", gc.Receive("/foo", 0, 20)),
        ("+ /foo -5,5", gc.Receive("/foo", -5, 5)),
        ("+ /foo 1 0", gc.Receive("/foo", 1, 0)),
        ("+ /", gc.Receive("/")),
        ("+ /foo/", gc.Receive("/foo/")),
        ("+ /a%2fb", gc.Receive("/a%2Fb")),
    ],
)
def test_receive(frame: str, cmd: gc.Receive) -> None:
    assert CODEC.decode(frame) == cmd


def test_receive_three_tokens_at_most() -> None:
    assert _err("+ /foo 1 2 3") == (
        '!error-bad-request maxCount has to be empty or int, but was "2 3": '
        'strconv.Atoi: parsing "2 3": invalid syntax'
    )


def test_receive_flags() -> None:
    assert gc.Receive("/a").subscribes and not gc.Receive("/a").fetches
    assert gc.Receive("/a", 0).subscribes and gc.Receive("/a", 0).fetches
    assert not gc.Receive("/a", 0, 0).subscribes


# -- Go compatibility helpers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "value"),
    [
        ("0", 0),
        ("-1", -1),
        ("+12", 12),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
    ],
)
def test_parse_go_int(token: str, value: int) -> None:
    assert gc.parse_go_int(token, "ParseInt") == value


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("9223372036854775808", "value out of range"),
        ("-9223372036854775809", "value out of range"),
        ("99999999999999999999x", "value out of range"),  # Go sees the overflow before the x
        ("1x99999999999999999999", "invalid syntax"),
        ("", "invalid syntax"),
        ("-", "invalid syntax"),
        ("1_000", "invalid syntax"),
        (" 1", "invalid syntax"),
        ("٣", "invalid syntax"),  # only ASCII digits
    ],
)
def test_parse_go_int_errors(token: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"strconv.Atoi: parsing {gc.go_quote(token)}: {why}")):
        gc.parse_go_int(token, "Atoi")


def test_go_quote() -> None:
    assert gc.go_quote("abc") == '"abc"'
    assert gc.go_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert gc.go_quote("\n\t\x00\x7f") == '"\\n\\t\\x00\\x7f"'
    assert gc.go_quote("café ☃") == '"café ☃"'
    assert gc.go_quote("\u200b") == '"\\u200b"'
    assert gc.go_quote("\U000e0001") == '"\\U000e0001"'


# -- rendering ---------------------------------------------------------------------------------------------


def _event(
    channel: str = "/foo",
    seq: int = 1,
    user: str = "bob",
    app: str = "dc14v6j8di113qo2urv0",
    payload: bytes = b"",
    headers: dict[str, str] | None = None,
    time_ns: int = 1795313569_123456789,
) -> Event:
    return Event(
        channel, seq, "abcdefgh", time_ns, Publisher("guble", user, app), payload, "x", headers or {}
    )


def test_render_examples_of_guble_md_6() -> None:
    e = _event(payload=b"hello world", headers={gc.GUBLE_HEADER: '{"k": "v"}', "k": "v"})
    assert CODEC.encode_event(e) == b'/foo,1,bob,dc14v6j8di113qo2urv0,,1795313569,0\n{"k": "v"}\nhello world'
    e = _event("/foo/bar", payload=b"sub body")
    assert CODEC.encode_event(e) == b"/foo/bar,1,bob,dc14v6j8di113qo2urv0,,1795313569,0\n\nsub body"
    assert CODEC.encode_event(_event(seq=2)) == b"/foo,2,bob,dc14v6j8di113qo2urv0,,1795313569,0"
    e = _event(seq=3, headers={gc.GUBLE_HEADER: "{}"})
    assert CODEC.encode_event(e) == b"/foo,3,bob,dc14v6j8di113qo2urv0,,1795313569,0\n{}"
    rest = gc.rest_publish_headers([("X-Guble-Key", "Value")], [("userId", "marvin")])
    e = _event("/rest", user="marvin", payload=b"Hello", headers=rest)
    assert (
        CODEC.encode_event(e) == b'/rest,1,marvin,dc14v6j8di113qo2urv0,,1795313569,0\n{"Key":"Value"}\nHello'
    )
    rest = gc.rest_publish_headers([], [("filterUserId", "carol")])
    e = _event("/rest", seq=3, user="", payload=b"x", headers=rest)
    assert CODEC.encode_event(e) == (b'/rest,3,,dc14v6j8di113qo2urv0,{"user_id":"carol"},1795313569,0\n{}\nx')


def test_render_mapping_worked_example() -> None:
    e = Event(
        "/chat/room",
        7,
        "abcdefgh",
        1795313749574424198,
        Publisher("native", "", "a1b2c3d4e5f60718"),
        b"hi 5%",
        "text/plain",
        {"k": "v"},
        ("a", "b"),
    )
    assert CODEC.encode_event(e) == b'/chat/room,7,,a1b2c3d4e5f60718,,1795313749,0\n{"k":"v"}\nhi 5%'


def test_render_escapes_metadata_fields_and_sorts() -> None:
    e = _event("/a,b", user="x,y\nz\r", app="p,q", payload=b"!", headers={"b": "2", "a": "1"})
    e2 = _event(headers={":filter.z": "1", ":filter.application_id": "a,b"})
    node = gc.GubleCodec(node_id=7)
    assert node.encode_event(e) == b'/a%2Cb,1,x%2Cy%0Az%0D,p%2Cq,,1795313569,7\n{"a":"1","b":"2"}\n!'
    assert (
        node.encode_event(e2)
        == b'/foo,1,bob,dc14v6j8di113qo2urv0,{"application_id":"a,b","z":"1"},1795313569,7'
    )
    assert gc.render_path("/a,b,c") == "/a%2Cb%2Cc"


def test_render_cache_is_checked_by_identity() -> None:
    cache: dict[object, object] = {}
    a, b = _event(payload=b"a"), _event(payload=b"b")
    assert CODEC.encode_event(a, cache).endswith(b"\na")
    assert CODEC.encode_event(a, cache) is CODEC.encode_event(a, cache)
    assert CODEC.encode_event(b, cache).endswith(b"\nb")


def test_notices_and_connected() -> None:
    assert CODEC.encode_notice("send") == b"#send"
    assert CODEC.encode_notice("fetch-start", "/foo 3") == b"#fetch-start /foo 3"
    frame = gc.GubleCodec.encode_connected("dc14v6j8di113qo2urug", 'al"ice\n', now=1795313562.9)
    assert frame == (
        b"#connected You are connected to the server.\n"
        b'{"ApplicationId": "dc14v6j8di113qo2urug", "UserId": "al\\"ice\\n", "Time": "2026-11-22T02:12:42Z"}'
    )
    body = frame.split(b"\n", 1)[1]
    assert orjson.loads(body)["UserId"] == 'al"ice\n'


def test_xid() -> None:
    ids = {gc.new_xid() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-v]{20}", x) for x in ids)


def test_user_id_from_path() -> None:
    assert gc.user_id_from_path("/stream/user/alice") == "alice"
    assert gc.user_id_from_path("/stream/user/alice?token=x") == "alice"
    assert gc.user_id_from_path("/stream/user/a%20b/c") == "a%20b/c"
    assert gc.user_id_from_path("/stream/") == ""
    assert gc.user_id_from_path("/stream/user/") == ""


# -- headers and filters ----------------------------------------------------------------------------------


def test_header_line_headers() -> None:
    assert gc.header_line_headers('{"k": "v", "n": 1, "o": {"a": [1, true]}}') == {
        "k": "v",
        "n": "1",
        "o": '{"a":[1,true]}',
    }
    assert gc.header_line_headers("not json") == {}
    assert gc.header_line_headers("[1]") == {}
    assert gc.header_line_headers('{":filter.user_id": "x"}') == {}  # no pseudo-headers from clients
    assert gc.header_line_headers('{"a": "1", "b": "2"}', max_headers=1) == {}
    send = gc.Send("/a", "", '{"k": "v"}', b"")
    assert gc.headers_for_send(send) == {"k": "v", gc.GUBLE_HEADER: '{"k": "v"}'}
    assert gc.headers_for_send(gc.Send("/a", "", "", b"")) == {}


def test_rest_headers_and_filters() -> None:
    h = gc.rest_publish_headers(
        [("x-Guble-Key", "Value"), ("X-Guble-foo-bar", "baz"), ("X-GUBLE-KEY", "second"), ("Other", "o")],
        [("filterUserId", "carol"), ("filterApplicationId", "a"), ("userId", "u"), ("filterUserId", "x")],
    )
    assert h == {
        "Key": "Value",
        "Foo-Bar": "baz",
        gc.GUBLE_HEADER: '{"Foo-Bar":"baz","Key":"Value"}',
        ":filter.user_id": "carol",
        ":filter.application_id": "a",
    }
    assert gc.rest_publish_headers([], []) == {gc.GUBLE_HEADER: "{}"}
    with pytest.raises(BadRequest):
        gc.rest_publish_headers([("X-Guble-A", "1"), ("X-Guble-B", "2")], [], max_headers=1)


def test_name_helpers() -> None:
    assert gc.canonical_mime_key("x-guble-foo-bar") == "X-Guble-Foo-Bar"
    assert gc.canonical_mime_key("bad key") == "bad key"
    assert gc.filter_name("UserId") == "user_id"
    assert gc.filter_name("ApplicationId") == "application_id"
    assert gc.filter_name("x") == "x"
