"""The ivy codec (hubbub.dialects.ivy): commands, path rules, renderings, log-read parsing, ranges."""

from __future__ import annotations

import pytest

from hubbub.dialects import actions, ivy
from hubbub.disconnect import Disconnect
from hubbub.errors import (
    CODES,
    AuthError,
    BadChannel,
    BadFrame,
    BadRequest,
    FrameTooLarge,
    HubbubError,
    LimitExceeded,
    ShuttingDown,
    UnknownOp,
)
from hubbub.events import Event, Publisher

T = 1795313746_904471829


def _ev(channel: str = "/chat", payload: bytes = b"hi", time_ns: int = T) -> Event:
    return Event(channel, 1, "e0000000", time_ns, Publisher("native"), payload, "text/plain")


# -- commands ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "cmd"),
    [
        ("+/chat", ivy.Subscribe("/chat")),
        ("+chat", ivy.Subscribe("/chat")),
        ("+ /chat ", ivy.Subscribe("/chat")),
        ("+\t/chat\r\n", ivy.Subscribe("/chat")),
        ("+/chat/", ivy.Subscribe("/chat")),  # one trailing / dropped (upstream dropped two characters)
        ("+/chat//", ivy.Subscribe("/chat/")),
        ("+/", ivy.Subscribe("/")),
        ("+/a.b/c-d/0", ivy.Subscribe("/a.b/c-d/0")),
        ("-/chat/room", ivy.Unsubscribe("/chat/room")),
        ("#k2#+/chat/room", ivy.Subscribe("/chat/room", "k2")),
        (":/chat:top", ivy.Publish("/chat", b"top")),
        (":/chat:a:b:c", ivy.Publish("/chat", b"a:b:c")),
        (":/chat:", ivy.Publish("/chat", b"")),
        (":chat:x\ny", ivy.Publish("/chat", b"x\ny")),
        (":/chat:caf\u00e9", ivy.Publish("/chat", "caf\u00e9".encode())),
        ("#k3#:/chat:x", ivy.Publish("/chat", b"x", "k3")),
        ("@", ivy.TimeRequest()),
        ("@ignored text", ivy.TimeRequest()),
        ("#k1#@", ivy.TimeRequest("k1")),
        ("##@", ivy.TimeRequest("")),
    ],
)
def test_decode(frame: str, cmd: ivy.Command) -> None:
    codec = ivy.IvyCodec()
    assert codec.decode(frame) == cmd
    assert codec.decode(frame.encode()) == cmd  # the UTF-8 bytes of the frame decode the same


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        ("", BadFrame),
        ("#unterminated", BadFrame),
        ("#k#", BadFrame),
        ("x", UnknownOp),
        ("+", BadChannel),
        ("+   ", BadChannel),
        ("+/Upper", BadChannel),
        ("+/a b", BadChannel),
        ("+/a_b", BadChannel),
        ("+/caf\u00e9", BadChannel),
        ("+/a%2Fb", BadChannel),
        (":/nocolon", BadFrame),
        (":/Bad:x", BadChannel),
        ("-", BadChannel),
    ],
)
def test_decode_invalid(frame: str, error: type[HubbubError]) -> None:
    with pytest.raises(error) as info:
        ivy.IvyCodec().decode(frame)
    assert info.value.code in CODES


def test_decode_bytes_must_be_utf8() -> None:
    with pytest.raises(BadFrame):
        ivy.IvyCodec().decode(b":/a:\xff")


def test_frame_limit_counts_utf8_bytes() -> None:
    codec = ivy.IvyCodec(max_frame=16)
    assert codec.decode(":/a:" + "x" * 12) == ivy.Publish("/a", b"x" * 12)  # exactly 16 bytes
    with pytest.raises(FrameTooLarge):
        codec.decode(":/a:" + "x" * 13)
    with pytest.raises(FrameTooLarge):
        codec.decode(":/a:" + "\u00e9" * 7)  # 11 code points, 18 bytes
    with pytest.raises(FrameTooLarge):
        codec.decode(b":/a:" + b"x" * 13)


def test_channel_limit() -> None:
    codec = ivy.IvyCodec(max_channel_bytes=8)
    assert codec.decode("+/abcdefg") == ivy.Subscribe("/abcdefg")
    with pytest.raises(BadChannel):
        codec.decode("+/abcdefgh")


def test_subscription_pattern_is_segment_based() -> None:
    p = ivy.subscription_pattern("/chat")
    assert p.matches("/chat") and p.matches("/chat/room/x")
    assert not p.matches("/chatroom") and not p.matches("/")
    root = ivy.subscription_pattern("/")
    assert all(root.matches(c) for c in ("/", "/a", "/Foo/b", "//x"))
    trailing = ivy.subscription_pattern("/chat/")
    assert trailing.matches("/chat/") and trailing.matches("/chat//x") and not trailing.matches("/chat")


# -- renderings -------------------------------------------------------------------------------------------


def test_ts() -> None:
    assert ivy.ts(T) == "1795313746.904471829"
    assert ivy.ts(5) == "0000000000.000000005"
    assert ivy.ts(1_000_000_000) == "0000000001.000000000"


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        (b"hello: world % 50%\nnext", "hello: world %25 50%25%0Anext"),
        (b"a\nb%", "a%0Ab%25"),
        ("caf\u00e9 \u2603".encode(), "caf\u00e9 \u2603"),
        (b"\x93\xa1a\xc0", "%93%A1a%C0"),  # a msgpack array: invalid bytes become %XX
        (b"\xe2\x82", "%E2%82"),  # a truncated sequence
        (b"\xed\xa0\x80", "%ED%A0%80"),  # an encoded surrogate is not UTF-8
        (b"x\r\ty\x00", "x\r\ty\x00"),  # nothing else is escaped
        (b"", ""),
    ],
)
def test_ivyesc(payload: bytes, text: str) -> None:
    assert ivy.ivyesc(payload) == text


def test_render_event_full_and_large() -> None:
    assert ivy.render_event(_ev("/chat/room", b"hi 5%")) == "@1795313746.904471829:/chat/room:hi 5%25"
    # A channel with ":" (another dialect's) is rendered with %3A so the line stays parseable.
    assert ivy.render_event(_ev("/a:b", b"x")) == "@1795313746.904471829:/a%3Ab:x"
    big = _ev("/chat/big", b"x" * 10)
    assert ivy.render_event(big, 10) == "@1795313746.904471829:/chat/big."
    assert ivy.render_event(big, 11) == "@1795313746.904471829:/chat/big:" + "x" * 10
    assert ivy.render_log_line(big) == "@1795313746.904471829:/chat/big:" + "x" * 10


def test_codec_outputs_and_cache() -> None:
    codec = ivy.IvyCodec(large_event_bytes=4)
    assert codec.encode_intro("3c71a1333712d603", T) == b"@1795313746.904471829:~/sid:3c71a1333712d603"
    assert codec.encode_time(None, T) == b"##@1795313746.904471829"
    assert codec.encode_time("k1", T) == b"#k1#@1795313746.904471829"
    cache: dict[object, object] = {}
    first = codec.encode_event(_ev(payload=b"abcd"), cache)
    assert first == b"@1795313746.904471829:/chat."
    # The cache is per event and per threshold: a codec with another threshold renders its own form.
    assert ivy.IvyCodec(large_event_bytes=5).encode_event(_ev(payload=b"abcd"), cache).endswith(b":abcd")
    assert codec.encode_event(_ev(payload=b"other"), cache) is first


# -- HTTP side --------------------------------------------------------------------------------------------


def test_publish_path() -> None:
    assert ivy.publish_path("chat/http") == "/chat/http"
    assert ivy.publish_path("chat%2Fhttp") == "/chat/http"  # decoded as a whole, then the path rules
    assert ivy.publish_path("chat/") == "/chat"
    for bad in ("", "Upper", "a%20b", "%FF", "a%3Ab"):
        with pytest.raises(BadChannel):
            ivy.publish_path(bad)


def test_parse_log_path() -> None:
    assert ivy.parse_log_path("logs/a/x") == ivy.LogPath("/logs/a/x")
    assert ivy.parse_log_path("Foo") == ivy.LogPath("/Foo")  # no ivy regex: other dialects' channels
    assert ivy.parse_log_path("a%2fb") == ivy.LogPath("/a%2Fb")
    g = ivy.parse_log_path("logs/*/x")
    assert g.pattern is not None and g.channel == "/logs/*/x"
    assert g.pattern.matches("/logs/a/x") and not g.pattern.matches("/logs/a/b/x")
    assert not g.pattern.matches("/logs/a/x/y")
    lit = ivy.parse_log_path("a/%2A")  # an escaped * is a literal segment, not a wildcard
    assert lit.pattern is None and lit.channel == "/a/*"
    for bad in ("", "logs/a*", "**", "a/**", "a/", "a/*/", "*x", "%FF", "a" * 1100):
        with pytest.raises(BadRequest):
            ivy.parse_log_path(bad)


@pytest.mark.parametrize(("value", "n"), [(None, None), ("1", 1), ("2", 2), ("007", 7)])
def test_parse_count(value: str | None, n: int | None) -> None:
    assert ivy.parse_count(value) == n


@pytest.mark.parametrize("value", ["0", "", "-1", "+1", "1.5", "x", " 1", "\u0661", "9" * 30])
def test_parse_count_invalid(value: str) -> None:
    with pytest.raises(BadRequest):
        ivy.parse_count(value)


def test_at_range() -> None:
    lo, hi = ivy.at_range("1795313746.904471829") or (0, 0)
    assert (lo, hi) == (T, T + 1)
    lo, hi = ivy.at_range("1795313764") or (0, 0)
    assert (lo, hi) == (1795313764_000000000, 1795313765_000000000)
    lo, hi = ivy.at_range("1795313764.") or (0, 0)
    assert (lo, hi) == (1795313764_000000000, 1795313765_000000000)
    lo, hi = ivy.at_range("17953137") or (0, 0)
    assert (lo, hi) == (1795313700_000000000, 1795313800_000000000)
    assert ivy.at_range("") == (0, 10**19)
    for bad in ("x", "1795313764x", "17953137641", "1795313746.904471829000", "1795313746,9"):
        assert ivy.at_range(bad) is None


def test_at_range_agrees_with_ts_prefixes() -> None:
    times = [0, 5, 999_999_999, 1_000_000_000, T - 1, T, T + 1, 1795313746_000000000, 1795313747_000000000]
    for p in ("1795313746", "1795313746.9", "179531374", "0000000000.", "1795313746.904471829", "00"):
        rng = ivy.at_range(p)
        assert rng is not None
        for t in times:
            assert (rng[0] <= t < rng[1]) == ivy.ts(t).startswith(p), (p, t)


def test_immutable_at() -> None:
    assert ivy.immutable_at((10, 20), 20)  # every time in [10, 20) is below the newest commit
    assert ivy.immutable_at((10, 20), 25)
    assert not ivy.immutable_at((10, 20), 19)
    assert ivy.immutable_at(None, 0)  # an impossible prefix can never match


@pytest.mark.parametrize(
    ("header", "total", "result"),
    [
        ("bytes=0-10", 100, (0, 10)),
        ("bytes=0-10", 5, (0, 4)),
        ("bytes=90-", 100, (90, 99)),
        ("bytes=-10", 100, (90, 99)),
        ("bytes=-200", 100, (0, 99)),
        ("bytes=100-", 100, False),
        ("bytes=-0", 100, False),
        ("bytes=0-1,5-6", 100, None),
        ("items=0-1", 100, None),
        ("bytes=5-1", 100, None),
        ("bytes=a-b", 100, None),
        ("bytes", 100, None),
        ("bytes=\u0661-2", 100, None),
    ],
)
def test_parse_range(header: str, total: int, result: object) -> None:
    assert ivy.parse_range(header, total) == result


def test_close_reasons_by_error_kind() -> None:
    from hubbub.disconnect import Disconnect
    from hubbub.errors import AuthError, BadFrame, LimitExceeded, ShuttingDown, StorageError

    assert ivy.close_reason(FrameTooLarge()) is Disconnect.MESSAGE_TOO_BIG
    assert ivy.close_reason(BadFrame()) is Disconnect.PROTOCOL_ERROR
    assert ivy.close_reason(AuthError(code=4102)) is Disconnect.POLICY_VIOLATION
    assert ivy.close_reason(LimitExceeded()) is Disconnect.POLICY_VIOLATION
    assert ivy.close_reason(ShuttingDown()) is Disconnect.GOING_AWAY
    assert ivy.close_reason(StorageError()) is Disconnect.INTERNAL_ERROR


# -- the connection (sans-I/O) ------------------------------------------------------------------------------


def test_connection_turns_frames_into_shared_actions() -> None:
    conn = ivy.IvyConnection(ivy.IvyCodec(), clock=lambda: T)
    assert conn.greeting("s1") == [actions.Send(b"@1795313746.904471829:~/sid:s1")]
    assert conn.receive_frame("#k#@") == [actions.Send(b"#k#@1795313746.904471829")]
    assert conn.receive_frame(":/chat:hi") == [actions.Publish("/chat", b"hi", ivy.CONTENT_TYPE)]
    assert conn.receive_frame("+/chat") == [actions.Subscribe("/chat", ivy.subscription_pattern("/chat"))]
    assert conn.receive_frame("-/chat") == [actions.Unsubscribe("/chat")]
    assert conn.receive_frame(b"\x00", binary=True) == [
        actions.Close(Disconnect.UNSUPPORTED_DATA, "binary frame")
    ]
    (close,) = conn.receive_frame("?")
    assert isinstance(close, actions.Close) and close.code == Disconnect.PROTOCOL_ERROR
    (close,) = ivy.IvyConnection(ivy.IvyCodec(max_frame=4)).receive_frame(":/chat:toolong")
    assert isinstance(close, actions.Close) and close.code == Disconnect.MESSAGE_TOO_BIG
    assert conn.failed  # every close ivy asks for is bad input


@pytest.mark.parametrize(
    ("cmd", "exc", "close"),
    [
        (
            actions.Subscribe("/a", "/a"),
            LimitExceeded("x"),
            actions.Close(Disconnect.POLICY_VIOLATION, "too many subscriptions"),
        ),
        (
            actions.Publish("/a", b"", ""),
            LimitExceeded("x"),
            actions.Close(Disconnect.POLICY_VIOLATION, "publish rate exceeded"),
        ),
        (
            actions.Publish("/a", b"", ""),
            AuthError("no"),
            actions.Close(Disconnect.POLICY_VIOLATION, "publish not allowed"),
        ),
    ],
)
def test_connection_refusals_close(cmd: object, exc: HubbubError, close: actions.Close) -> None:
    assert ivy.IvyConnection.refused(cmd, exc) == [close]
    (end,) = ivy.IvyConnection.refused(cmd, ShuttingDown())
    assert isinstance(end, actions.Close) and end.code == Disconnect.GOING_AWAY
