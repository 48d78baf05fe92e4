"""The mist state machines alone (protocols/mist.md): exact replies of both generations, fed whole, one byte
at a time and with trailing data; auth flows; event renderings. Random input is in
``tests/property/test_mist_codecs.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hubbub.dialects import mist as md
from hubbub.errors import AuthError, LimitExceeded
from hubbub.events import Event, Publisher


def feed(conn: Any, data: bytes, *, bytewise: bool = False) -> list[Any]:
    pieces = [data[i : i + 1] for i in range(len(data))] if bytewise else [data]
    out: list[Any] = []
    for p in pieces:
        out += conn.receive_data(p)
    return out


def sends(outs: list[Any]) -> list[bytes]:
    return [o.data for o in outs if isinstance(o, md.Send)]


@pytest.mark.parametrize("bytewise", [False, True])
def test_2015_lines(bytewise: bool) -> None:
    conn = md.Mist2015Connection()
    data = (
        b"ping\nping extra\npong\n\nping\r\nsubscribe x\nsubscribe y\nunsubscribe x\nlist\n"
        b"publish b,a data with spaces\nsubscribe b,a\nsubscribe a,b\nlist\nsubscribe\ntrailing"
    )
    outs = feed(conn, data, bytewise=bytewise)
    assert sends(outs) == [
        b"pong\n",
        b"error Incorrect number of arguments for '[ping extra]'\n",
        b"error Unknown command '[pong]'\n",
        b"error Unknown command '[]'\n",
        b"error Unknown command '[ping\r]'\n",
        b"list y\n",  # upstream panicked here (mist.md §10)
        b"list y b,a\n",
        b"error Incorrect number of arguments for '[subscribe]'\n",
    ]
    commands = [o for o in outs if not isinstance(o, md.Send)]
    assert commands == [
        md.Subscribe(frozenset("x")),
        md.Subscribe(frozenset("y")),
        md.Unsubscribe(frozenset("x")),
        md.Publish("/mist", ("a", "b"), b"data with spaces"),
        md.Subscribe(frozenset("ab")),  # once: the second is a reference
    ]
    assert conn.buffered == len(b"trailing")


def test_2015_registry_replies_and_errors() -> None:
    conn = md.Mist2015Connection()
    [reg] = feed(conn, b"register t2,t1 tok\n")
    assert reg == md.Register("tok", frozenset({"t1", "t2"}))
    assert conn.reply_registry(reg, False) == b"error already exists\n"
    [tags] = feed(conn, b"tags tok\n")
    assert conn.reply_registry(tags, frozenset({"t2", "t1"})) == b"tags tok t1,t2\n"
    assert conn.reply_registry(tags, frozenset()) == b"tags tok \n"
    assert conn.reply_registry(tags, None) == b"error Token not found\n"
    pub = md.Publish("/mist", ("a",), b"x")
    assert conn.reply_error(pub, AuthError("no", code=4102)) == [md.Send(b"error Access denied\n")]
    assert conn.reply_error(md.Subscribe(frozenset("a")), LimitExceeded("x")) == [
        md.Send(b"error Too many subscriptions\n")
    ]


def test_2015_auth_first_line() -> None:
    conn = md.Mist2015Connection(auth_required=True)
    outs = feed(conn, b"auth tok\nping\n")
    assert outs == [md.Authenticate("tok")] and conn.awaiting_auth
    assert conn.auth_result(md.MistGrant("u")) == [md.Send(b"pong\n")]
    refused = md.Mist2015Connection(auth_required=True)
    assert feed(refused, b"ping\n") == [md.Send(b"error Unauthorized\n"), md.Close()]
    assert refused.failed and feed(refused, b"ping\n") == []


def test_2015_line_too_long_closes() -> None:
    conn = md.Mist2015Connection(max_frame=10)
    assert feed(conn, b"ping\n" + b"x" * 11) == [
        md.Send(b"pong\n"),
        md.Send(b"error Line too long\n"),
        md.Close(),
    ]


def test_2015_websocket() -> None:
    conn = md.Mist2015WsConnection(grant=md.MistGrant("", frozenset({"red"})))
    assert conn.receive_frame('{"command":"subscribe","tags":["green"]}') == [
        md.Send(b'{"success":false,"command":"subscribe"}')
    ]
    outs = conn.receive_frame('{"command":"subscribe","tags":["red","green"]}')
    assert outs == [
        md.Subscribe(frozenset({"red", "green"})),
        md.Send(b'{"success":true,"command":"subscribe"}'),
    ]
    assert conn.receive_frame('{"command":"list"}') == [
        md.Send(b'{"subscriptions":[["red","green"]],"command":"list","success":true}')
    ]
    assert conn.receive_frame(b"x", binary=True) == [
        md.Send(b'{"success":false,"error":"I don\'t understand binary messages"}')
    ]


@pytest.mark.parametrize("bytewise", [False, True])
def test_1x_stream(bytewise: bool) -> None:
    conn = md.Mist1Connection()
    data = (
        b'{"command":"ping"} {"command":"subscribe","tags":["b","a"]}{"command":"subscribe","tags":["c"]}\n'
        b'{"command":"list"}{"command":"nope","tags":["x"],"data":"d"}{"command":5}\n'
        b'{"command":"who","tags":["q"]}{"command":"register","tags":["a"],"data":"t"}{"command":"pub'
    )
    outs = feed(conn, data, bytewise=bytewise)
    assert outs == [
        md.Send(b'{"command":"ping","data":"pong"}\n'),
        md.Subscribe(frozenset("ab")),
        md.Subscribe(frozenset("c")),
        md.Send(b'{"command":"list","data":"a,b c"}\n'),
        md.Send(b'{"command":"nope","tags":["x"],"data":"d","error":"Unknown Command"}\n'),
        md.Send(b'{"command":"","error":"Invalid message"}\n'),
        md.Who(("q",)),
        md.Send(b'{"command":"register","tags":["a"],"data":"t","error":"Unknown Command"}\n'),
    ]
    assert conn.reply_who(md.Who(("q",)), 7, 2) == (
        b'{"command":"who","tags":["q"],"data":"Lifetime  connections: 7\\nSubscribers connected: 2"}\n'
    )
    assert feed(conn, b'lish"} {x') == [
        md.Send(b'{"command":"","error":"Invalid JSON"}\n'),
        md.Close(),
    ]


def test_1x_auth_first_message_and_registry() -> None:
    conn = md.Mist1Connection(auth_required=True)
    assert feed(conn, b'{"command":"auth","data":"tok"}{"command":"tags","data":"t"}') == [
        md.Authenticate("tok")
    ]
    outs = conn.auth_result(md.MistGrant())
    assert outs == [md.TokenTags("t")]
    assert isinstance(outs[0], md.TokenTags)
    assert conn.reply_registry(outs[0], frozenset({"b", "a"})) == b'{"command":"tags","tags":["a","b"]}\n'
    assert conn.reply_error(md.Register("t", frozenset()), AuthError("no", code=4102)) == [
        md.Send(b'{"command":"register","error":"Access denied"}\n')
    ]
    refused = md.Mist1Connection(auth_required=True)
    feed(refused, b'{"command":"auth","data":"bad"}')
    assert refused.auth_result(None) == [md.Close()]


def test_generation_detection() -> None:
    assert md.detect_generation(b"") is None
    assert md.detect_generation(b"{") == "mist1"
    assert md.detect_generation(b" {") == "mist2015"
    assert isinstance(md.tcp_connection(b'{"command":"ping"}'), md.Mist1Connection)
    assert isinstance(md.tcp_connection(b"ping\n"), md.Mist2015Connection)


def test_event_renderings() -> None:
    ev = Event("/x", 1, "e", 1, Publisher("native"), b"two\nlines \xff", "text/plain", {}, ("a", "b\nc"))
    assert md.render_event_tcp(ev) == b"publish a,b\\nc two\\nlines \xff\n"
    assert json.loads(md.render_event_ws(ev)) == {"tags": ["a", "b\nc"], "data": "two\nlines \ufffd"}
    assert md.render_event(ev).endswith(b"\n")
    empty = Event("/x", 1, "e", 1, Publisher("native"), b"", "text/plain", {}, ("a",))
    assert md.render_event(empty) == b'{"command":"publish","tags":["a"]}\n'  # data left out when empty


@pytest.mark.parametrize("tag", ["y z", "a,b", ",", " ", "trailing ", ",lead"])
def test_a_tag_no_2015_line_can_carry_renders_nothing_for_2015_tcp(tag: str) -> None:
    ev = Event("/x", 1, "e", 1, Publisher("mist1"), b"space tag", "text/plain", {}, tuple(sorted({"x", tag})))
    assert md.render_event_tcp(ev) == b""
    assert json.loads(md.render_event_ws(ev)) == {"tags": sorted({"x", tag}), "data": "space tag"}
    assert json.loads(md.render_event(ev))["tags"] == sorted({"x", tag})


def test_tags_a_2015_line_carries_render_as_before() -> None:
    ev = Event("/x", 1, "e", 1, Publisher("mist1"), b"d a t a", "text/plain", {}, ("", "\r", "a\tb", "x"))
    assert md.render_event_tcp(ev) == b"publish ,\r,a\tb,x d a t a\n"
