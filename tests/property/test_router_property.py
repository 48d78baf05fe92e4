"""The router's trie and cache against a naive matcher built on :meth:`Pattern.matches` and a subset test."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hubbub.channels import Pattern, parse_pattern
from hubbub.router import Router
from tests.hypothesis_budget import examples

# Small alphabets so that patterns and channels collide often. "*" as a channel segment is the literal star
# (canonical for "%2A"); in a pattern it is written "%2A", and "*" there is the one-segment slot.
CHANNEL_SEGMENTS = ["", "a", "b", "*"]
PATTERN_PARTS: list[str | None] = ["", "a", "b", "*", None]
TAGS = ["x", "y", "z"]
CACHE_SIZES = (0, 3, 64)  # off, tiny (constant eviction), roomy

channels = st.lists(st.sampled_from(CHANNEL_SEGMENTS), min_size=1, max_size=4).map("/".join).map("/".__add__)
event_tags = st.one_of(
    st.lists(st.sampled_from(TAGS), max_size=4),  # duplicates and any order
    st.lists(st.sampled_from(TAGS), max_size=3, unique=True).map(lambda t: tuple(sorted(t))),
    st.frozensets(st.sampled_from(TAGS)),
)
sub_tags = st.one_of(st.just(frozenset[str]()), st.frozensets(st.sampled_from(TAGS), max_size=2))


def _text(parts: Sequence[str | None], subtree: bool) -> str:
    body = "/".join("*" if p is None else "%2A" if p == "*" else p for p in parts)
    if subtree:
        return "/" + body + "/**" if parts else "/**"
    return "/" + body


@st.composite
def patterns(draw: st.DrawFn) -> Pattern:
    subtree = draw(st.booleans())
    parts = draw(st.lists(st.sampled_from(PATTERN_PARTS), min_size=0 if subtree else 1, max_size=4))
    pat = parse_pattern(_text(parts, subtree))
    assert pat.parts == tuple(parts)
    assert pat.subtree == subtree
    return pat


Subs = dict[int, tuple[Pattern, frozenset[str]]]


def naive(subs: Subs, channel: str, tags: Collection[str]) -> tuple[int, ...]:
    have = set(tags)
    return tuple(k for k, (pat, want) in subs.items() if pat.matches(channel) and want <= have)


def expected_nodes(subs: Subs) -> int:
    """Root plus one node per distinct pattern prefix: what a fully pruned trie holds."""
    prefixes = {pat.parts[:i] for pat, _ in subs.values() for i in range(1, len(pat.parts) + 1)}
    return 1 + len(prefixes)


class RouterMachine(RuleBasedStateMachine):
    """Random add/remove/match sequences on routers with the cache off, tiny and roomy, all at once."""

    def __init__(self) -> None:
        super().__init__()
        self.routers: list[Router[int]] = [Router(cache_size=n) for n in CACHE_SIZES]
        # The naive model: key -> (pattern, tags), in insertion order (dicts keep it).
        self.subs: Subs = {}
        self.next_key = 0

    @initialize()
    def start(self) -> None:
        for r in self.routers:
            assert r.statistics()["nodes"] == 1

    @rule(pattern=patterns(), tags=sub_tags)
    def add(self, pattern: Pattern, tags: frozenset[str]) -> None:
        key = self.next_key
        self.next_key += 1
        for r in self.routers:
            r.add(pattern, key, tags)
        self.subs[key] = (pattern, tags)

    @precondition(lambda self: bool(self.subs))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.subs)))
        pattern, tags = self.subs.pop(key)
        for r in self.routers:
            assert r.remove(pattern, key, tags)
            assert not r.remove(pattern, key, tags)

    @rule(pattern=patterns(), tags=sub_tags, key=st.integers(-5, 40))
    def remove_wrong(self, pattern: Pattern, tags: frozenset[str], key: int) -> None:
        entry = self.subs.get(key)
        if entry == (pattern, tags):
            return
        for r in self.routers:
            assert not r.remove(pattern, key, tags)

    @rule(channel=channels, tags=event_tags)
    def match(self, channel: str, tags: Collection[str]) -> None:
        want = naive(self.subs, channel, tags)
        for r in self.routers:
            assert r.match(channel, tags) == want
            assert r.match(channel, tags) == want  # again, from the cache when it is on

    @invariant()
    def consistent(self) -> None:
        nodes = expected_nodes(self.subs)
        for r in self.routers:
            stats = r.statistics()
            assert stats["subscriptions"] == len(self.subs)
            assert stats["tagged_subscriptions"] == sum(1 for _, t in self.subs.values() if t)
            assert stats["nodes"] == nodes
            assert stats["cache_size"] <= stats["cache_capacity"]


TestRouterMachine = RouterMachine.TestCase
TestRouterMachine.settings = settings(max_examples=examples(200), stateful_step_count=40, deadline=None)


@pytest.mark.parametrize("cache_size", [0, 64])
@settings(max_examples=examples(200), deadline=None)
@given(
    subs=st.lists(st.tuples(patterns(), sub_tags), max_size=25),
    probes=st.lists(st.tuples(channels, event_tags), min_size=1, max_size=25),
)
def test_trie_equals_naive(
    cache_size: int,
    subs: list[tuple[Pattern, frozenset[str]]],
    probes: list[tuple[str, Collection[str]]],
) -> None:
    r: Router[int] = Router(cache_size=cache_size)
    model: Subs = {}
    for key, (pat, tags) in enumerate(subs):
        r.add(pat, key, tags)
        model[key] = (pat, tags)
    for channel, event in probes * 2:  # twice: cold, then (with the cache on) warm
        assert r.match(channel, event) == naive(model, channel, event)
    # Remove every other subscription and check again, then empty it and expect a bare root.
    for key in list(model)[::2]:
        pat, tags = model.pop(key)
        assert r.remove(pat, key, tags)
    for channel, event in probes:
        assert r.match(channel, event) == naive(model, channel, event)
    for key, (pat, tags) in model.items():
        assert r.remove(pat, key, tags)
    assert r.statistics()["nodes"] == 1
