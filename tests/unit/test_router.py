from __future__ import annotations

import gc
import random
import weakref
from collections.abc import Collection

import pytest

from hubbub.channels import Pattern, parse_pattern
from hubbub.router import DEFAULT_CACHE_SIZE, Router

P = parse_pattern


@pytest.fixture(params=[0, 64], ids=["nocache", "cache64"])
def router(request: pytest.FixtureRequest) -> Router[str]:
    size: int = request.param
    return Router(cache_size=size)


def match(r: Router[str], channel: str, tags: Collection[str] = ()) -> tuple[str, ...]:
    """Match twice: the second call is served from the cache when it is on, and must agree."""
    first = r.match(channel, tags)
    again = r.match(channel, tags)
    assert first == again
    assert type(first) is tuple
    return first


# native.md §4, plus the root rules of mapping.md §2.1 as documented in hubbub.channels.
TABLE = [
    ("/chat", ["/chat"], ["/chat/a", "/", "/chatroom", "/chat/"]),
    ("/chat/*", ["/chat/a", "/chat/", "/chat/*"], ["/chat", "/chat/a/b", "/"]),
    ("/chat/**", ["/chat", "/chat/a", "/chat/a/b", "/chat/"], ["/chatroom", "/", "/x/chat"]),
    ("/**", ["/", "/chat", "/chat/a/b", "//", "/*"], []),
    ("/*/x", ["/a/x", "//x", "/*/x"], ["/a/b/x", "/x", "/a/x/y"]),
    ("/", ["/"], ["/a", "//"]),
    ("/*", ["/", "/a", "/*"], ["/a/b", "//"]),
    ("//**", ["/", "//", "//a/b"], ["/a"]),
    ("/a/*/**", ["/a/b", "/a/", "/a/b/c/d"], ["/a", "/b/c"]),
    ("/a/%2A", ["/a/*"], ["/a/b", "/a/"]),
    ("/%2A/**", ["/*", "/*/a"], ["/a", "/a/b"]),
    ("/a%2Fb/c", ["/a%2Fb/c"], ["/a/b/c"]),
]


@pytest.mark.parametrize(("pattern", "yes", "no"), TABLE, ids=[t[0] for t in TABLE])
def test_pattern_table(router: Router[str], pattern: str, yes: list[str], no: list[str]) -> None:
    pat = P(pattern)
    router.add(pat, "k")
    for ch in yes:
        assert pat.matches(ch), ch  # the table agrees with the reference matcher
        assert match(router, ch) == ("k",), ch
    for ch in no:
        assert not pat.matches(ch), ch
        assert match(router, ch) == (), ch


def test_whole_table_at_once(router: Router[str]) -> None:
    for pattern, _, _ in TABLE:
        router.add(P(pattern), pattern)
    channels = {ch for _, yes, no in TABLE for ch in yes + no}
    for ch in sorted(channels):
        expected = tuple(p for p, _, _ in TABLE if P(p).matches(ch))
        assert match(router, ch) == expected, ch


def test_literal_star_is_not_the_slot(router: Router[str]) -> None:
    router.add(P("/a/%2A"), "literal")
    router.add(P("/a/*"), "slot")
    assert P("/a/%2A").parts == ("a", "*")
    assert P("/a/*").parts == ("a", None)
    assert match(router, "/a/*") == ("literal", "slot")
    assert match(router, "/a/b") == ("slot",)
    assert match(router, "/a/%2A") == ("slot",)  # not canonical for "*", but a plain segment if given
    assert router.remove(P("/a/*"), "slot")
    assert match(router, "/a/b") == ()
    assert match(router, "/a/*") == ("literal",)


def test_tags_are_a_subset_filter(router: Router[str]) -> None:
    router.add(P("/c"), "none")
    router.add(P("/c"), "a", frozenset({"a"}))
    router.add(P("/c"), "ab", frozenset({"a", "b"}))
    router.add(P("/**"), "b-all", frozenset({"b"}))
    assert match(router, "/c") == ("none",)
    assert match(router, "/c", ("a",)) == ("none", "a")
    assert match(router, "/c", ("b",)) == ("none", "b-all")
    assert match(router, "/c", ("a", "b")) == ("none", "a", "ab", "b-all")
    assert match(router, "/c", ("a", "b", "z")) == ("none", "a", "ab", "b-all")
    assert match(router, "/d", ("a", "b")) == ("b-all",)
    assert match(router, "/d", ("a",)) == ()


@pytest.mark.parametrize(
    "tags",
    [("a", "b"), ("b", "a"), ["b", "a", "a"], {"a", "b"}, frozenset({"a", "b"}), ("a", "b", "a")],
    ids=["tuple", "tuple-rev", "list-dup", "set", "frozenset", "tuple-dup"],
)
def test_tags_any_collection(router: Router[str], tags: Collection[str]) -> None:
    router.add(P("/c"), "ab", frozenset({"a", "b"}))
    router.add(P("/c"), "ac", frozenset({"a", "c"}))
    router.add(P("/c"), "plain")
    assert match(router, "/c", tags) == ("ab", "plain")
    assert match(router, "/c", ("a",)) == ("plain",)


def test_order_is_insertion_order_across_buckets(router: Router[str]) -> None:
    # Each key lands in a different bucket (and tag group); the result interleaves them by creation.
    adds = [
        ("/a/b", "1", frozenset[str]()),
        ("/**", "2", frozenset()),
        ("/a/*", "3", frozenset({"t"})),
        ("/a/b", "4", frozenset()),
        ("/a/**", "5", frozenset()),
        ("/*/b", "6", frozenset({"t"})),
        ("/**", "7", frozenset({"t"})),
        ("/a/b", "8", frozenset({"u"})),
        ("/a/b/**", "9", frozenset()),
    ]
    for pattern, key, tags in adds:
        router.add(P(pattern), key, tags)
    assert match(router, "/a/b", ("t", "u")) == tuple("123456789")
    assert match(router, "/a/b") == ("1", "2", "4", "5", "9")
    assert match(router, "/a/b", ["t"]) == ("1", "2", "3", "4", "5", "6", "7", "9")
    # Re-adding after a remove puts the subscription last: it is a new subscription.
    assert router.remove(P("/a/b"), "1")
    router.add(P("/a/b"), "1")
    assert match(router, "/a/b") == ("2", "4", "5", "9", "1")


def test_each_key_once(router: Router[str]) -> None:
    router.add(P("/a/**"), "k")
    with pytest.raises(ValueError, match="already"):
        router.add(P("/a/b"), "k")
    with pytest.raises(ValueError, match="already"):
        router.add(P("/a/**"), "k")
    router.add(P("/a/**"), "k2")
    # Several patterns that all match are separate keys, each listed once.
    router.add(P("/**"), "k3")
    router.add(P("/a/*"), "k4")
    assert match(router, "/a/b") == ("k", "k2", "k3", "k4")
    assert len(router) == 4
    assert "k" in router
    assert "zz" not in router


def test_remove(router: Router[str]) -> None:
    router.add(P("/a/*"), "k", frozenset({"t"}))
    router.add(P("/a/*"), "j")
    assert not router.remove(P("/a/*"), "missing")
    assert not router.remove(P("/a/b"), "k", frozenset({"t"}))  # wrong pattern
    assert not router.remove(P("/a/*"), "k")  # wrong tags
    assert match(router, "/a/x", ("t",)) == ("k", "j")
    gen = router.generation
    assert router.remove(P("/a/*"), "k", frozenset({"t"}))
    assert router.generation == gen + 1
    assert not router.remove(P("/a/*"), "k", frozenset({"t"}))
    assert router.generation == gen + 1  # a failed remove changes nothing
    assert match(router, "/a/x", ("t",)) == ("j",)
    assert router.remove(P("/a/*"), "j")
    assert match(router, "/a/x", ("t",)) == ()
    assert len(router) == 0


def test_pruning_removes_empty_nodes(router: Router[str]) -> None:
    assert router.statistics()["nodes"] == 1
    router.add(P("/a/b/c"), "1")
    router.add(P("/a/b/**"), "2")
    router.add(P("/a/*/c"), "3")
    router.add(P("/**"), "4")
    # root, a, a/b, a/b/c, a/*, a/*/c
    assert router.statistics()["nodes"] == 6
    assert router.remove(P("/a/b/c"), "1")
    assert router.statistics()["nodes"] == 5  # a/b still holds "/a/b/**"
    assert router.remove(P("/a/b/**"), "2")
    assert router.statistics()["nodes"] == 4
    assert router.remove(P("/a/*/c"), "3")
    assert router.statistics()["nodes"] == 1
    assert router.remove(P("/**"), "4")
    assert router.statistics()["nodes"] == 1
    assert router.statistics()["subscriptions"] == 0


def test_no_growth_under_churn(router: Router[str]) -> None:
    rng = random.Random(1)
    words = ["", "a", "b", "*", "%2A", "c"]
    live: dict[str, Pattern] = {}
    for i in range(3000):
        if live and rng.random() < 0.5:
            key = rng.choice(sorted(live))
            assert router.remove(live.pop(key), key)
        else:
            text = "/" + "/".join(rng.choice(words) for _ in range(rng.randrange(1, 5)))
            if rng.random() < 0.3:
                text += "/**"
            live[str(i)] = P(text)
            router.add(live[str(i)], str(i))
        if i % 100 == 0:
            router.match("/a/b", ())
    for key, pat in live.items():
        assert router.remove(pat, key)
    stats = router.statistics()
    assert stats["nodes"] == 1
    assert stats["subscriptions"] == 0
    assert stats["tagged_subscriptions"] == 0
    assert match(router, "/a/b") == ()


def test_cache_sees_adds_and_removes(router: Router[str]) -> None:
    router.add(P("/a/b"), "1")
    assert match(router, "/a/b") == ("1",)
    router.add(P("/a/*"), "2")
    assert match(router, "/a/b") == ("1", "2")
    router.add(P("/a/b"), "3", frozenset({"t"}))
    # A tagged subscription appeared: an event with tags must not get the tag-less cached answer.
    assert match(router, "/a/b", ("t",)) == ("1", "2", "3")
    assert match(router, "/a/b") == ("1", "2")
    assert router.remove(P("/a/b"), "1")
    assert match(router, "/a/b", ("t",)) == ("2", "3")
    assert router.remove(P("/a/b"), "3", frozenset({"t"}))
    assert match(router, "/a/b", ("t",)) == ("2",)
    assert router.remove(P("/a/*"), "2")
    assert match(router, "/a/b", ("t",)) == ()


def test_cache_counts_and_invalidation() -> None:
    r: Router[str] = Router(cache_size=64)
    r.add(P("/a"), "1")
    assert r.match("/a") == ("1",)
    assert r.match("/a") == ("1",)
    assert r.match("/b") == ()
    stats = r.statistics()
    assert (stats["cache_hits"], stats["cache_misses"], stats["cache_size"]) == (1, 2, 2)
    assert stats["cache_capacity"] == 64
    r.add(P("/b"), "2")
    assert r.statistics()["cache_size"] == 0  # the old generation's entries are dead
    assert r.match("/b") == ("2",)
    stats = r.statistics()
    assert (stats["cache_hits"], stats["cache_misses"], stats["cache_size"]) == (1, 3, 1)
    assert stats["generation"] == 2
    assert r.remove(P("/b"), "2")
    assert r.statistics()["cache_size"] == 0


def test_remove_releases_cached_keys() -> None:
    class Key:
        pass

    r: Router[Key] = Router(cache_size=64)
    key = Key()
    ref = weakref.ref(key)
    r.add(P("/a"), key)
    assert r.match("/a") == (key,)
    assert r.remove(P("/a"), key)
    del key
    gc.collect()
    assert ref() is None  # no match call needed for the cache to let go


def test_cache_is_bounded(router: Router[str]) -> None:
    router.add(P("/c/*"), "k")
    for i in range(1000):
        assert router.match(f"/c/{i}") == ("k",)
        assert router.statistics()["cache_size"] <= 64
    # Recent entries are still served from the cache; the oldest were evicted.
    hits = router.statistics()["cache_hits"]
    assert router.match("/c/999") == ("k",)
    assert router.match("/c/0") == ("k",)
    stats = router.statistics()
    if stats["cache_capacity"]:
        assert stats["cache_hits"] == hits + 1
        assert 0 < stats["cache_size"] <= 64
    else:
        assert stats["cache_hits"] == stats["cache_size"] == 0


def test_cache_evicts_oldest_half() -> None:
    r: Router[str] = Router(cache_size=8)
    r.add(P("/**"), "k")
    for i in range(8):
        r.match(f"/{i}")
    assert r.statistics()["cache_size"] == 8
    r.match("/8")  # full: the 4 oldest entries go, then /8 comes in
    assert r.statistics()["cache_size"] == 5
    misses = r.statistics()["cache_misses"]
    for i in range(4, 9):
        r.match(f"/{i}")
    assert r.statistics()["cache_misses"] == misses
    r.match("/0")
    assert r.statistics()["cache_misses"] == misses + 1


def test_tags_in_cache_key() -> None:
    r: Router[str] = Router(cache_size=8)
    r.add(P("/c"), "ab", frozenset({"a", "b"}))
    assert r.match("/c", ("a",)) == ()
    assert r.match("/c", ("a", "b")) == ("ab",)
    assert r.match("/c", ["a", "b"]) == ("ab",)
    assert r.match("/c", ("b", "a")) == ("ab",)
    assert r.match("/c", ()) == ()
    assert r.match("/c", ("a",)) == ()
    assert r.statistics()["cache_hits"] == 1


def test_statistics_and_defaults() -> None:
    r: Router[int] = Router()
    stats = r.statistics()
    assert stats == {
        "subscriptions": 0,
        "tagged_subscriptions": 0,
        "nodes": 1,
        "cache_hits": 0,
        "cache_misses": 0,
        "cache_size": 0,
        "cache_capacity": DEFAULT_CACHE_SIZE,
        "generation": 0,
    }
    assert DEFAULT_CACHE_SIZE == 4096
    r.add(P("/x"), 1, frozenset({"t"}))
    assert r.statistics()["tagged_subscriptions"] == 1
    with pytest.raises(ValueError, match="cache_size"):
        Router(cache_size=-1)


def test_empty_result_is_the_empty_tuple(router: Router[str]) -> None:
    assert match(router, "/") == ()
    router.add(P("/a"), "k", frozenset({"t"}))
    assert match(router, "/a") == ()
    assert match(router, "/b", ("t",)) == ()
