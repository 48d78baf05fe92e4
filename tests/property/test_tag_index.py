"""The tag index (router/tags.py), alone and inside the router, against a naive subset matcher.

Subscriptions are added and removed at random; every match must equal "each subscription whose tag set is a
subset of the event's tags", in insertion order, with the router's match cache off, tiny and roomy. The
trie must stay pruned: after any sequence it holds exactly one node per distinct prefix of the indexed
sorted tag sets.
"""

from __future__ import annotations

from collections.abc import Collection

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hubbub.channels import Pattern, parse_pattern
from hubbub.router import Router
from hubbub.router.tags import TagIndex
from tests.hypothesis_budget import examples

# A small alphabet makes subsets frequent; "é" and "" check byte order and the empty tag.
TAGS = ["a", "b", "c", "d", "e", "é", ""]
CACHE_SIZES = (0, 2, 64)
ALL = parse_pattern("/**")

sub_tags = st.frozensets(st.sampled_from(TAGS), min_size=1, max_size=4)
event_tags = st.one_of(
    st.lists(st.sampled_from(TAGS), max_size=7),  # duplicates, any order
    st.lists(st.sampled_from(TAGS), max_size=7, unique=True).map(lambda t: tuple(sorted(t))),
    st.lists(st.sampled_from(TAGS), max_size=7, unique=True).map(tuple),  # unsorted tuples
    st.frozensets(st.sampled_from(TAGS)),
)
channels = st.sampled_from(["/mist", "/a", "/a/b", "/"])
patterns = st.sampled_from(["/**", "/a/**", "/a", "/*", "/a/b"]).map(parse_pattern)


def prefixes(sets: Collection[frozenset[str]]) -> int:
    return len({tuple(sorted(s))[:i] for s in sets for i in range(1, len(s) + 1)})


class TagIndexMachine(RuleBasedStateMachine):
    """One TagIndex and three routers (mist-style ``/**`` plus other patterns) against a dict model."""

    def __init__(self) -> None:
        super().__init__()
        self.index: TagIndex[int] = TagIndex()
        self.routers: list[Router[int]] = [Router(cache_size=n) for n in CACHE_SIZES]
        self.model: dict[int, tuple[str, frozenset[str]]] = {}  # key -> (pattern text, tags)
        self.next_key = 0

    @rule(tags=sub_tags, pattern=patterns)
    def add(self, tags: frozenset[str], pattern: Pattern) -> None:
        key = self.next_key
        self.next_key += 1
        pat = pattern
        if pat.text == "/**":
            self.index.add(key, tags)
        for r in self.routers:
            r.add(pat, key, tags)
        self.model[key] = (pat.text, tags)

    @rule(tags=st.frozensets(st.sampled_from(TAGS), max_size=2))
    def add_untagged_or_small(self, tags: frozenset[str]) -> None:
        key = self.next_key
        self.next_key += 1
        if tags:
            self.index.add(key, tags)
        for r in self.routers:
            r.add(ALL, key, tags)
        self.model[key] = ("/**", tags)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        text, tags = self.model.pop(key)
        if text == "/**" and tags:
            self.index.discard(key, tags)
        for r in self.routers:
            assert r.remove(parse_pattern(text), key, tags)

    @rule(channel=channels, tags=event_tags)
    def match(self, channel: str, tags: Collection[str]) -> None:
        have = set(tags)
        want = tuple(
            k for k, (text, t) in self.model.items() if parse_pattern(text).matches(channel) and t <= have
        )
        for r in self.routers:
            assert r.match(channel, tags) == want
            assert r.match(channel, tags) == want  # again: from the cache when it is on
        got: list[int] = []
        self.index.collect(tuple(sorted(have)), got)
        index_want = {k for k, (text, t) in self.model.items() if text == "/**" and t and t <= have}
        assert sorted(got) == sorted(index_want)
        assert len(got) == len(index_want)  # each key once

    @invariant()
    def pruned(self) -> None:
        sets = {t for text, t in self.model.values() if text == "/**" and t}
        assert len(self.index) == len(sets)
        assert self.index.nodes() == prefixes(sets)


TestTagIndexMachine = TagIndexMachine.TestCase
TestTagIndexMachine.settings = settings(max_examples=examples(200), stateful_step_count=50, deadline=None)


@settings(max_examples=examples(300), deadline=None)
@given(
    subs=st.lists(sub_tags, max_size=40),
    probes=st.lists(event_tags, min_size=1, max_size=20),
)
def test_collect_equals_naive(subs: list[frozenset[str]], probes: list[Collection[str]]) -> None:
    index: TagIndex[int] = TagIndex()
    for key, tags in enumerate(subs):
        index.add(key, tags)
    for probe in probes:
        have = set(probe)
        got: list[int] = []
        runs = index.collect(tuple(sorted(have)), got)
        assert sorted(got) == [k for k, t in enumerate(subs) if t <= have]
        assert runs == len({t for t in subs if t <= have})
    for key, tags in enumerate(subs):
        index.discard(key, tags)
    assert not index and index.nodes() == 0
