"""The qpubs dialect's topics, values, qrpc state machine and HTTP helpers (protocols/qpubs.md)."""

from __future__ import annotations

from typing import Any

import msgpack
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubbub.channels import from_separated
from hubbub.dialects import qpubs as qp
from hubbub.events import Event, Publisher

# -- §1 topics: the engine's own tables ---------------------------------------------------------------------

TABLES = [
    ("foo.bar", ["foo.bar", "foo.bar"], [True, True]),
    (
        "foo.*",
        ["foo", "foo.bar", "bar", "bar.foo", "bar.foo.foo", "foo.bar.baz", "foo."],
        [False, True, False, False, False, True, True],
    ),
    (
        "*.bar",
        ["foo", "bar", "foo.bar", "bar.foo", "foo.bar.zed", "baz.foo.bar", ".bar"],
        [False, False, True, False, False, True, True],
    ),
    ("foo.", ["foo", "foo.", "foo.bar"], [False, True, False]),
    (".foo..", [".foo..", "foo..", ".foo...", "..foo..", ".foo."], [True, False, False, False, False]),
    ("*.foo.bar", [".foo.bar"], [True]),
    ("foo.bar.*", ["foo.bar."], [True]),
    ("a.*.c", ["a.*.c", "a.b.c"], [True, False]),
    ("a*", ["a", "ab", "a.b"], [False, False, False]),
    ("*a", ["a", "ba", "b.a"], [False, False, False]),
]


@pytest.mark.parametrize(("listen", "emits", "expected"), TABLES)
def test_the_engine_tables(listen: str, emits: list[str], expected: list[bool]) -> None:
    topic = qp.parse_topic(listen)
    assert [topic.matches(e) for e in emits] == expected
    pattern = topic.pattern()
    for e, want in zip(emits, expected, strict=True):
        channel = from_separated(e, ".")
        # The core's pattern selects at least what matches, and exactly that except for tail topics.
        if want:
            assert pattern is not None and pattern.matches(channel), (listen, e)
        elif pattern is not None and not topic.filtered:
            assert not pattern.matches(channel), (listen, e)


names = st.text(alphabet="ab.*", max_size=7)


@given(names, names)
def test_patterns_agree_with_the_names(listen: str, emit: str) -> None:
    try:
        topic = qp.parse_topic(listen)
    except qp.QpubsError:
        assert listen.startswith("*") and listen.endswith("*")
        return
    pattern = topic.pattern()
    channel = qp.emit_channel(emit)
    assert qp.topic_name(channel) == emit
    if topic.filtered:
        assert pattern is not None and pattern.matches(channel)
    elif pattern is None:
        assert not topic.matches(emit)
    else:
        assert pattern.matches(channel) is topic.matches(emit), (listen, emit, pattern.text)


@pytest.mark.parametrize("sep", ["::", "-", "ab"])
@given(data=st.data())
def test_multi_character_separators(sep: str, data: st.DataObject) -> None:
    alphabet = sorted(set("xy" + sep))
    emit = data.draw(st.text(alphabet=alphabet, max_size=8))
    head = data.draw(st.text(alphabet=alphabet, max_size=4)) + sep + "*"
    topic = qp.parse_topic(head, sep)
    pattern = topic.pattern()
    assert pattern is not None
    channel = qp.emit_channel(emit, sep)
    if topic.matches(emit):
        assert pattern.matches(channel), (head, emit, pattern.text)
    elif not topic.filtered:
        assert not pattern.matches(channel), (head, emit, pattern.text)


def test_overlapping_separators_are_filtered() -> None:
    topic = qp.parse_topic(":::*", "::")
    assert topic.filtered and not qp.parse_topic("a::*", "::").filtered
    pattern = topic.pattern()
    assert pattern is not None and pattern.matches(qp.emit_channel(":::x", "::"))
    assert not topic.matches("::") and pattern.matches(qp.emit_channel("::", "::"))  # the filter decides


def test_double_wildcards_and_non_strings_are_refused() -> None:
    for bad in ("*", "*.*", "*.x.*", "**"):
        with pytest.raises(qp.QpubsError, match="cannot wildcard both head and tail"):
            qp.parse_topic(bad)
    with pytest.raises(qp.QpubsError, match="bad topic, expected string") as caught:
        qp.parse_topic(5)
    assert caught.value.code == "EBADTOPIC"


def test_emits_are_literal() -> None:
    assert qp.emit_channel("foo.*") == "/foo/*"
    assert qp.parse_topic("foo.*").pattern() is not None
    exact = qp.parse_topic("a.*.c").pattern()
    assert exact is not None and exact.is_exact and exact.matches("/a/*/c") and not exact.matches("/a/b/c")


# -- §2 values -----------------------------------------------------------------------------------------------


def event(payload: bytes, content_type: str, channel: str = "/chat/x") -> Event:
    return Event(channel, 1, "e0000000", 1, Publisher("ivy"), payload, content_type)


@pytest.mark.parametrize(
    ("payload", "ctype", "value"),
    [
        (b'{"a":[1,2.5,null]}', "application/json", {"a": [1, 2.5, None]}),
        (b"[1", "application/json", "[1"),
        (b'"x"', "application/vnd.x+json; charset=utf-8", "x"),
        (b"hi \xff", "text/plain", "hi \ufffd"),
        (
            msgpack.packb({"k": b"\x00\x01", 1: float("nan"), "s": "t"}),
            "application/msgpack",
            {"k": "AAE=", "1": None, "s": "t"},
        ),
        (
            msgpack.packb([msgpack.ExtType(1, b"x"), b"\xff"], use_bin_type=False),
            "application/msgpack",
            [None, "\ufffd"],
        ),
        (b"\xc1", "application/msgpack", "\ufffd"),
        # Map keys msgpack allows and a dict cannot hold (an array, a map), JSON-encoded like other keys.
        (b"\x81\x91\x01\x02", "application/msgpack", {"[1]": 2}),
        (b"\x92\x81\x80\xc0\x81\xc4\x01a\x01", "application/msgpack", [{"{}": None}, {'"YQ=="': 1}]),
    ],
)
def test_jsonval(payload: bytes, ctype: str, value: Any) -> None:
    assert qp.jsonval(event(payload, ctype)) == value


def test_items_name_the_topic() -> None:
    assert qp.render_item(event(b"hi", "text/plain", "/chat/room")) == {"topic": "chat.room", "value": "hi"}
    assert qp.encode_value({"b": 1, "a": [True]}) == b'{"b":1,"a":[true]}'


# -- §4 qrpc -------------------------------------------------------------------------------------------------


def line(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj) + b"\n"


def sent(outs: list[Any]) -> list[str]:
    return [o.data.decode() for o in outs if isinstance(o, qp.Send)]


def test_rendering_keeps_qrpc_key_order() -> None:
    assert qp.render_result("1", {"ok": True, "delivered": 0}) == (
        b'{"v":1,"id":"1","e":null,"s":"end","m":{"ok":true,"delivered":0}}\n'
    )
    assert qp.render_error("2", qp.QpubsError("nope: no handler", "ENOHANDLER")) == (
        b'{"v":1,"id":"2","e":{"name":"Error","message":"nope: no handler","code":"ENOHANDLER",'
        b'"_isError__":1},"s":"end"}\n'
    )
    assert qp.render_stream_item("L", {"topic": "a.b", "value": "x"}) == (
        b'{"v":1,"id":"L","s":"ok","m":{"topic":"a.b","value":"x"}}\n'
    )
    assert qp.render_end("L") == b'{"v":1,"id":"L","s":"end"}\n'


def test_calls_become_commands() -> None:
    c = qp.QrpcConnection()
    outs = c.feed(line({"v": 1, "id": 7, "n": "emit", "m": {"topic": "t.u", "value": [1]}}))
    assert outs == [qp.Emit("7", "t.u", "/t/u", b"[1]")]
    outs = c.feed(line({"v": 1, "id": "L", "n": "listen", "m": {"topic": "a.*"}})[:10])
    assert outs == []  # half a line waits for the rest
    outs = c.feed(line({"v": 1, "id": "L", "n": "listen", "m": {"topic": "a.*"}})[10:])
    assert outs == [qp.Listen("L", qp.parse_topic("a.*"))]
    assert c.open_calls() == {"L": "listen"}


@pytest.mark.parametrize(
    ("msg", "message", "code"),
    [
        ({"v": 1, "id": "2", "n": "nope", "m": {}}, "nope: no handler", "ENOHANDLER"),
        ({"v": 1, "id": "1", "n": "listen", "m": {"topic": 5}}, "bad topic, expected string", "EBADTOPIC"),
        (
            {"v": 1, "id": "2", "n": "listen", "m": {"topic": "*.x.*"}},
            "cannot wildcard both head and tail",
            "EBADTOPIC",
        ),
        ({"v": 2, "id": "3", "n": "emit", "m": {}}, "unsupported version", "EVERSION"),
        ({"v": 1, "id": "4", "n": "emit", "m": []}, "bad request", "EBADREQ"),
        ({"v": 1, "id": "5", "n": "emit", "m": {"topic": "t"}}, "bad request", "EBADREQ"),
        ({"v": 1, "id": "6", "n": "emit", "b": "x", "m": {}}, "bad request", "EBADREQ"),
        ({"v": 1, "id": "7", "n": "ack", "m": {"subId": "a b", "batch": 1}}, "bad subId", "EBADREQ"),
        ({"v": 1, "id": "8", "n": "ack", "m": {"subId": "s", "batch": "1"}}, "bad request", "EBADREQ"),
        (
            {"v": 1, "id": "9", "n": "openSubscription", "m": {"subId": "s", "topic": "t", "shared": 1}},
            "bad request",
            "EBADREQ",
        ),
    ],
)
def test_refused_calls(msg: dict[str, Any], message: str, code: str) -> None:
    out = qp.QrpcConnection().feed(line(msg))
    assert sent(out) == [qp.render_error(str(msg["id"]), qp.QpubsError(message, code)).decode()]


def test_lines_without_json_or_an_id_are_skipped() -> None:
    c = qp.QrpcConnection()
    assert c.feed(b"not json\n\n[1]\n" + line({"n": "emit", "m": {}}) + line({"id": True, "n": "emit"})) == []


def test_an_over_long_line_closes() -> None:
    c = qp.QrpcConnection(max_line=32)
    assert isinstance(c.feed(b"x" * 40)[-1], qp.Close)
    assert c.feed(line({"id": "1", "n": "emit", "m": {"topic": "t", "value": 1}})) == []
    c = qp.QrpcConnection(max_line=32)
    assert isinstance(c.feed(b"y" * 33 + b"\n")[-1], qp.Close)


def test_ignore_closes_the_oldest_matching_listen() -> None:
    c = qp.QrpcConnection()
    for cid in ("a", "b"):
        c.feed(line({"id": cid, "n": "listen", "m": {"topic": "x.*"}}))
    c.feed(line({"id": "o", "n": "openSubscription", "m": {"subId": "s", "topic": "x.*"}}))
    assert c.feed(line({"id": "i1", "n": "ignore", "m": {"topic": "x.*"}})) == [qp.Ignore("i1", "a")]
    assert c.feed(line({"id": "i2", "n": "ignore", "m": {"topic": "y"}})) == [qp.Ignore("i2", None)]
    assert c.open_calls() == {"b": "listen", "o": "openSubscription"}
    outs = c.feed(line({"id": "c", "n": "closeSubscription", "m": {"subId": "s"}}))
    assert outs == [qp.CloseSubscription("c", "s", ("o",), False)]
    assert c.open_calls() == {"b": "listen"}


def test_auth_gates_every_call() -> None:
    c = qp.QrpcConnection(auth_required=True)
    out = c.feed(line({"id": "1", "n": "emit", "m": {"topic": "t", "value": 1}}))
    assert sent(out) == [qp.render_error("1", qp.QpubsError("unauthorized", "EAUTH")).decode()]
    assert c.feed(line({"id": "2", "n": "auth", "m": {"token": "k"}})) == [qp.Auth("2", "k")]
    c.authenticated()
    assert c.resume() == []
    assert c.feed(line({"id": "3", "n": "emit", "m": {"topic": "t", "value": 1}})) == [
        qp.Emit("3", "t", "/t", b"1")
    ]


def test_calls_pipelined_behind_auth_wait_for_its_answer() -> None:
    """A client that sends a call right behind ``auth`` (one read) has it judged with the token's answer."""
    emit = line({"id": "3", "n": "emit", "m": {"topic": "t", "value": 1}})
    c = qp.QrpcConnection(auth_required=True)
    assert c.feed(line({"id": "2", "n": "auth", "m": {"token": "k"}}) + emit) == [qp.Auth("2", "k")]
    assert c.paused and c.feed(emit) == []  # later reads wait too
    c.authenticated()
    assert c.resume() == [qp.Emit("3", "t", "/t", b"1"), qp.Emit("3", "t", "/t", b"1")]
    refused = qp.QrpcConnection(auth_required=True)
    assert refused.feed(line({"id": "2", "n": "auth", "m": {"token": "x"}}) + emit) == [qp.Auth("2", "x")]
    out = refused.resume()  # the token was refused: the call behind it is refused as unauthorized
    assert sent(out) == [qp.render_error("3", qp.QpubsError("unauthorized", "EAUTH")).decode()]


def test_a_paused_connection_bounds_what_waits() -> None:
    c = qp.QrpcConnection(auth_required=True, max_line=64)
    assert c.feed(line({"id": "2", "n": "auth", "m": {"token": "k"}})) == [qp.Auth("2", "k")]
    out = c.feed(b"x" * 65)
    assert isinstance(out[-1], qp.Close) and c.closed


def test_open_calls_are_limited() -> None:
    c = qp.QrpcConnection(max_calls=2)
    c.feed(line({"id": "1", "n": "listen", "m": {"topic": "a"}}))
    c.feed(line({"id": "2", "n": "once", "m": {"topic": "a"}}))
    out = c.feed(line({"id": "3", "n": "listenExclusive", "m": {"topic": "a", "group": "g"}}))
    assert sent(out) == [qp.render_error("3", qp.QpubsError("too many listeners", "ELIMIT")).decode()]
    c.ended("2")
    assert c.feed(line({"id": "3", "n": "listenExclusive", "m": {"topic": "a", "group": "g"}})) == [
        qp.Listen("3", qp.parse_topic("a"), group="g")
    ]


def test_subscription_calls() -> None:
    c = qp.QrpcConnection()
    t = qp.parse_topic("jobs.*")
    assert c.feed(line({"id": "1", "n": "createSubscription", "m": {"topic": "jobs.*", "subId": "w"}})) == [
        qp.CreateSubscription("1", "w", t)
    ]
    outs = c.feed(
        line({"id": "2", "n": "openSubscription", "m": {"topic": "jobs.*", "subId": "w", "shared": True}})
    )
    assert outs == [qp.OpenSubscription("2", "w", t, shared=True)]
    assert c.feed(line({"id": "3", "n": "ack", "m": {"subId": "w", "batch": 4}})) == [qp.Ack("3", "w", 4)]
    assert c.feed(line({"id": "4", "n": "ack", "m": {"subId": "w", "batch": 5, "error": "x"}})) == [
        qp.Ack("4", "w", 5, "x", nack=True)
    ]
    assert c.feed(line({"id": "5", "n": "deleteSubscription", "m": {"subId": "w"}})) == [
        qp.DeleteSubscription("5", "w")
    ]
    outs = c.feed(line({"id": "6", "n": "openSubscription", "m": {"subId": "w", "delete": True}}))
    assert isinstance(outs[0], qp.OpenSubscription) and outs[0].delete
    assert "6" not in c.open_calls()


@given(st.binary(max_size=300))
def test_any_bytes_give_outputs_or_nothing(data: bytes) -> None:
    c = qp.QrpcConnection(max_line=128)
    for piece in (data[:7], data[7:]):
        for out in c.feed(piece):
            assert isinstance(out, qp.Send | qp.Close) or hasattr(out, "call_id")
            if isinstance(out, qp.Send):
                assert out.data.endswith(b"\n") and orjson.loads(out.data)["s"] == "end"


# -- §3 HTTP aliases -----------------------------------------------------------------------------------------


def test_alias_queries() -> None:
    assert qp.alias_topic("a.b%2Ac+d") == "a.b*c+d"
    assert qp.alias_topic("x%FF\udcff") == "x\ufffd\ufffd"  # found by fuzzing: raw bytes as surrogates
    assert qp.alias_emit("t,%7B%22a%22%3A1%7D") == ("t", {"a": 1})
    assert qp.alias_emit("t,not json,really") == ("t", "not json,really")
    with pytest.raises(qp.QpubsError, match="missing value"):
        qp.alias_emit("t")


@pytest.mark.parametrize(
    ("text", "want"), [(None, 0), ("", 0), ("0", 0), ("100", 100), ("007", 7), ("2147483647", 2**31 - 1)]
)
def test_once_timeout_ms_accepted(text: str | None, want: int) -> None:
    assert qp.parse_timeout_ms(text) == want


@pytest.mark.parametrize(
    "text",
    # "\u0665" is an Arabic-Indic five, which int() would take.
    ["-5", "+5", "1e20", "100000000000000000000", "2147483648", "1.5", " 5", "5 ", "5_000", "0x10", "\u0665"],
)
def test_once_timeout_ms_refused(text: str) -> None:
    with pytest.raises(qp.QpubsError) as info:
        qp.parse_timeout_ms(text)
    assert (info.value.status, info.value.code) == (400, "EBADREQ")
    assert info.value.message == "bad timeout_ms, expected an integer from 0 to 2147483647"
