"""Federation rules: origin and hops, interest covers, cursors, backoff, topology (hubbub.federation)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubbub.channels import parse_pattern
from hubbub.federation import (
    HOPS_HEADER,
    ORIGIN_HEADER,
    Backoff,
    Cursor,
    Origin,
    accepts,
    covers,
    cycle_reason,
    forwards_to,
    idempotency_key,
    minimal_cover,
    origin_of,
    stamp,
    valid_node_id,
)

# -- origin and hops -----------------------------------------------------------------------------------------


def test_an_event_published_here_gets_this_node_as_origin() -> None:
    headers, origin = stamp("c", {"k": "v"}, "e1", 7)
    assert origin == Origin("c", "e1", 7)
    assert headers == {"k": "v", ORIGIN_HEADER: "c e1 7", HOPS_HEADER: "c"}


def test_a_path_through_three_nodes() -> None:
    # C publishes; B takes it and stores it with itself added; A takes it from B.
    at_c, origin = stamp("c", {}, "ec", 3)
    assert accepts("b", at_c) and forwards_to("b", at_c)
    stored_at_b = {**at_c, HOPS_HEADER: at_c[HOPS_HEADER] + ",b"}
    at_b, again = stamp("b", stored_at_b, "eb", 40)  # B's own epoch and seq do not matter
    assert again == origin and at_b[HOPS_HEADER] == "c,b"
    assert accepts("a", at_b)
    # Neither goes back down the way it came, nor to its origin.
    assert not forwards_to("c", at_b) and not forwards_to("b", at_b)
    assert not accepts("c", at_b) and not accepts("b", at_b)
    assert idempotency_key(origin) == idempotency_key(origin_of(at_b) or Origin("", "", 0)) == "fed:c:ec:3"


def test_malformed_or_missing_origins() -> None:
    assert origin_of({}) is None
    for bad in ("c e1", "c e1 x", "c e1 -1", "bad id e 1", "c e1 1 2", " e 1"):
        assert origin_of({ORIGIN_HEADER: bad}) is None, bad
    assert not accepts("a", {HOPS_HEADER: "c"})  # over a link, an event without an origin is refused
    long_path = {ORIGIN_HEADER: "n0 e 1", HOPS_HEADER: ",".join(f"n{i}" for i in range(40))}
    assert not accepts("z", long_path)


def test_node_ids() -> None:
    assert valid_node_id("node-1.eu_west")
    for bad in ("", "a b", "a,b", "x" * 65, "é"):
        assert not valid_node_id(bad)


# -- interest ------------------------------------------------------------------------------------------------

SEGS = ("a", "b", "")
pattern_texts = st.lists(st.sampled_from(["a", "b", "*", ""]), max_size=3).flatmap(
    lambda parts: st.sampled_from(["/" + "/".join(parts), "/" + "/".join([*parts, "**"]) if parts else "/**"])
)
UNIVERSE = ["/" + "/".join(c) for n in range(1, 5) for c in itertools.product(("a", "b", "c", ""), repeat=n)]


@given(pattern_texts, pattern_texts)
def test_covers_is_containment(q_text: str, p_text: str) -> None:
    q, p = parse_pattern(q_text), parse_pattern(p_text)
    contained = all(q.matches(c) for c in UNIVERSE if p.matches(c))
    assert covers(q, p) is contained, (q_text, p_text)


@given(st.lists(pattern_texts, max_size=6))
def test_the_minimal_cover_matches_the_same_channels_once(texts: list[str]) -> None:
    pats = [parse_pattern(t) for t in texts]
    cover = minimal_cover(pats)
    for c in UNIVERSE:
        assert any(p.matches(c) for p in pats) is any(k.matches(c) for k in cover)
    for a, b in itertools.permutations(cover, 2):
        assert not covers(a, b)


def test_minimal_cover_examples() -> None:
    got = minimal_cover(parse_pattern(t) for t in ["/a/b", "/a/**", "/c/*", "/c/d", "/a/*/x", "/c/*"])
    assert [p.text for p in got] == ["/a/**", "/c/*"]
    assert [p.text for p in minimal_cover([parse_pattern("/**"), parse_pattern("/x")])] == ["/**"]
    # Found by the property test: every channel has a first segment, so these two are the same set.
    assert covers(parse_pattern("/*/**"), parse_pattern("/**")) and covers(
        parse_pattern("/**"), parse_pattern("/*/**")
    )
    assert [p.text for p in minimal_cover([parse_pattern("/*/**"), parse_pattern("/**")])] == ["/**"]


# -- recovery ------------------------------------------------------------------------------------------------


def test_a_cursor_drops_what_it_has_and_resumes_where_it_was() -> None:
    cur = Cursor()
    assert cur.advance("/a/1", "e", 1, 10) and cur.advance("/a/1", "e", 2, 11)
    assert not cur.advance("/a/1", "e", 2, 11)  # a duplicate
    assert cur.advance("/a/1", "f", 1, 12)  # a new epoch starts over
    assert cur.advance("/b", "e", 5, 9)
    assert cur.since(parse_pattern("/a/**")) == {"/a/1": {"epoch": "f", "seq": 1}}
    assert cur.last_time == 12
    again = Cursor.from_json(cur.to_json())
    assert again == cur


@pytest.mark.parametrize(
    "bad",
    [
        {"positions": []},
        {"positions": {"/a": ["e"]}},
        {"positions": {"/a": [1, 2]}},
        {"last_time": "1"},
        {"patterns": ["/a"]},
        {"patterns": {"a": 1}},
        {"patterns": {"/a": "1"}},
    ],
)
def test_a_bad_cursor_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Cursor.from_json(bad)


# -- backoff and topology ------------------------------------------------------------------------------------


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    b = Backoff(0.1, 2.0, random.Random(7))
    delays = [b.next_delay() for _ in range(12)]
    ceilings = [min(2.0, 0.1 * 2**n) for n in range(12)]
    assert all(0 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered
    assert max(delays[6:]) > 0.5  # grown
    b.reset()
    assert b.next_delay() <= 0.1
    with pytest.raises(ValueError):
        Backoff(0, 1)


def test_cycles_that_can_be_seen_are_refused() -> None:
    assert cycle_reason("b", "a", []) is None
    assert cycle_reason("b", "a", ["root"]) is None
    assert cycle_reason("a", "a", []) is not None
    assert "cycle" in (cycle_reason("a", "c", ["b", "a"]) or "")
