from __future__ import annotations

import pytest

from hubbub.channels import (
    canonical,
    dec,
    enc,
    from_separated,
    is_canonical,
    parse_pattern,
    separated_matcher,
    to_separated,
)
from hubbub.errors import BadChannel


@pytest.mark.parametrize(
    ("raw", "canon"),
    [
        ("/chat/room", "/chat/room"),
        ("/", "/"),
        ("/foo/", "/foo/"),
        ("//a", "//a"),
        ("/a%2fb", "/a%2Fb"),
        ("/50%", "/50%25"),
        ("/a%41", "/aA"),
        ("/caf%C3%A9", "/café"),
        ("/a%0a", "/a%0A"),
        ("/x%", "/x%25"),
        ("/x%4", "/x%254"),
    ],
)
def test_canonical_table(raw: str, canon: str) -> None:
    assert canonical(raw) == canon
    assert canonical(canon) == canon
    assert is_canonical(canon)


@pytest.mark.parametrize("bad", ["/a%FF", "chat", "", "/\udc80"])
def test_invalid_channels(bad: str) -> None:
    with pytest.raises(BadChannel) as info:
        canonical(bad)
    assert info.value.code == 4004


def test_length_limit_counts_utf8_bytes() -> None:
    assert canonical("/" + "é" * 511) == "/" + "é" * 511  # 1023 bytes
    with pytest.raises(BadChannel):
        canonical("/" + "é" * 512)
    with pytest.raises(BadChannel):
        canonical("/" + "a" * 20, max_bytes=10)


def test_enc_dec() -> None:
    assert enc("a/b%c\x00\x7f") == "a%2Fb%25c%00%7F"
    assert dec("a%2Fb") == "a/b"


@pytest.mark.parametrize(
    ("name", "sep", "canon"),
    [
        ("a:b:c", ":", "/a/b/c"),
        ("", ":", "/"),
        ("a:", ":", "/a/"),
        (":a", ":", "//a"),
        ("img/jpeg:x", ":", "/img%2Fjpeg/x"),
        ("a.b.c", ".", "/a/b/c"),
        ("foo.", ".", "/foo/"),
        (".foo..", ".", "//foo//"),
        ("a::b", "::", "/a/b"),
    ],
)
def test_separated_names(name: str, sep: str, canon: str) -> None:
    assert from_separated(name, sep) == canon
    assert to_separated(canon, sep) == name


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("/chat", ["/chat"], ["/chat/a"]),
        ("/chat/*", ["/chat/a", "/chat/"], ["/chat", "/chat/a/b"]),
        ("/chat/**", ["/chat", "/chat/a", "/chat/a/b"], ["/chatroom"]),
        ("/**", ["/", "/a", "/a/b"], []),
        ("/*/x", ["/a/x", "//x"], ["/a/b/x"]),
        ("/a/%2A", ["/a/*"], ["/a/b"]),
    ],
)
def test_pattern_table(pattern: str, yes: list[str], no: list[str]) -> None:
    p = parse_pattern(pattern)
    for ch in yes:
        assert p.matches(ch), (pattern, ch)
    for ch in no:
        assert not p.matches(ch), (pattern, ch)


@pytest.mark.parametrize("bad", ["/a/**/b", "/**/x", "a/*", "/a/**/**"])
def test_bad_patterns(bad: str) -> None:
    with pytest.raises(BadChannel):
        parse_pattern(bad)


def test_pattern_text_and_exactness() -> None:
    assert parse_pattern("/a/%2A/*/**").text == "/a/%2A/*/**"
    assert parse_pattern("/a/b").is_exact
    assert not parse_pattern("/a/*").is_exact
    assert not parse_pattern("/a/**").is_exact
    assert parse_pattern("/**").text == "/**"


#: Topics written with ``.`` for the separator (replaced by each separator tested).
SEPARATED_TOPICS = ["foo.*", "*.bar", "foo.", "foo", "a*", "*a", "", ".", "m.*.x", "*", "*.*"]
SEPARATED_CHANNELS = ["/", "/foo", "/foo/bar", "/foo/", "/foo.x", "/bar", "//bar", "/baz/foo/bar", "/a::b/c"]


@pytest.mark.parametrize("sep", [".", "::", "/"])
def test_separated_matcher_is_a_live_qpubs_listen(sep: str) -> None:
    """A durable consumer's separated name matches what a live qpubs ``listen`` of the same topic gets."""
    from hubbub.dialects.qpubs import parse_topic

    for written in SEPARATED_TOPICS:
        topic = written.replace(".", sep)
        if topic.startswith("*") and topic.endswith("*"):
            with pytest.raises(BadChannel):
                separated_matcher(topic, sep)
            continue
        live = parse_topic(topic, sep)
        matches = separated_matcher(topic, sep)
        for ch in SEPARATED_CHANNELS:
            assert matches(ch) is live.matches(to_separated(ch, sep)), (topic, sep, ch)
