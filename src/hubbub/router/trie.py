"""The subscription router: a path trie with wildcard slots, a tag index and a bounded match cache.

Concurrency contract: a :class:`Router` is **not thread-safe**. It is called from the event loop only (the
core adds and removes subscriptions and matches published events on the loop thread). It never does I/O and
never awaits.

Structure (after nats-server's sublist, STYLE.md item 7):

* The trie is keyed by *encoded* segments (:func:`hubbub.channels.segments`), so a literal ``*`` segment
  (written ``%2A`` in a pattern, ``*`` in a canonical channel) lives in the literal-children dict and never
  collides with the ``*`` slot. Every node has a literal-children dict, a ``*`` slot (one segment, empty
  included) and two buckets: ``exact`` for patterns that end at this node, ``subtree`` for patterns that
  end in ``**`` here. ``/chat/**`` is stored in the ``subtree`` bucket of the node for ``/chat`` and so
  matches ``/chat`` itself and everything below. ``/**`` is the root's ``subtree`` bucket and matches every
  channel, the root ``/`` (segments ``[""]``) included.
* A bucket splits its keys into untagged keys (the common case: copied out wholesale, no per-key work) and
  a :class:`~hubbub.router.tags.TagIndex`: a trie over sorted tag sets that finds the sets contained in the
  event's tags without testing the others (true subset semantics, mist.md §5), and is not looked at when
  the event has no tags. Every dialect's tagged subscriptions (mist's ``/**`` plus a tag set, native
  ``tags``) share it.
* Results are tuples in subscription insertion order. Every key gets a sequence number when it is added;
  each bucket is an insertion-ordered dict, so a result drawn from one bucket is already in order, and a
  result drawn from several is a concatenation of sorted runs, which ``list.sort`` (timsort) merges in
  O(n log runs).
* The match cache maps ``channel`` (or ``(channel, tags)`` when tags can change the answer) to the result
  tuple. ``add`` and ``remove`` bump a generation counter; the next ``match`` sees the generation moved
  and clears the cache, so a burst of subscription changes costs one clear and a cached result is never
  stale. ``remove`` also clears a non-empty cache at once, so cached tuples never keep removed keys alive.
  The cache is bounded: when full, the older half of its entries is evicted (FIFO in batches). A plain
  dict keeps insertion order, and evicting in batches keeps the cost per miss O(1) amortised, where
  popping the oldest entry on every miss is quadratic for a dict and about 3x dearer with an OrderedDict.
* ``remove`` prunes trie nodes left empty, so add/remove churn never grows the trie.
* A key may be added with a ``visible`` predicate over channels (a subscription whose token may read only
  some of the channels its pattern matches): a matching channel is kept for that key only where the
  predicate holds. The predicate runs on a cache miss only, so its answer is cached with the result; it
  must therefore be fixed for as long as the key is indexed (re-add the key to change it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from itertools import islice
from typing import Generic, TypeVar

from hubbub.channels import Pattern

from .tags import TagIndex

__all__ = ["DEFAULT_CACHE_SIZE", "Router"]

DEFAULT_CACHE_SIZE = 4096

K = TypeVar("K", bound=Hashable)

_EMPTY: tuple[()] = ()


class _Bucket(Generic[K]):
    """Keys of the subscriptions whose pattern ends at one trie position.

    ``plain`` holds untagged keys, a dict used as an insertion-ordered set (values unused); ``tagged``
    indexes the keys filtered by a tag set (:class:`TagIndex`), created on first use.
    """

    __slots__ = ("plain", "tagged")

    def __init__(self) -> None:
        self.plain: dict[K, None] = {}
        self.tagged: TagIndex[K] | None = None

    def add(self, key: K, tags: frozenset[str]) -> None:
        if tags:
            index = self.tagged
            if index is None:
                index = self.tagged = TagIndex()
            index.add(key, tags)
        else:
            self.plain[key] = None

    def discard(self, key: K, tags: frozenset[str]) -> None:
        if tags:
            index = self.tagged
            assert index is not None
            index.discard(key, tags)
            if not index:
                self.tagged = None
        else:
            del self.plain[key]

    def __bool__(self) -> bool:
        return bool(self.plain) or bool(self.tagged)


def _sorted_distinct(tags: Collection[str]) -> tuple[str, ...]:
    """``tags`` as a sorted tuple without duplicates. Events already carry one, which is returned as it is
    after one pass to check it."""
    if type(tags) is tuple:
        n = len(tags)
        if n < 2:
            return tags
        prev = tags[0]
        for t in tags[1:]:
            if t <= prev:
                break
            prev = t
        else:
            return tags
    return tuple(sorted(set(tags)))


class _Node(Generic[K]):
    """One trie position. Buckets are created on demand: most nodes are interior and hold none."""

    __slots__ = ("children", "exact", "star", "subtree")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K]] = {}
        self.star: _Node[K] | None = None
        self.exact: _Bucket[K] | None = None
        self.subtree: _Bucket[K] | None = None

    def is_empty(self) -> bool:
        return not self.children and self.star is None and self.exact is None and self.subtree is None


class Router(Generic[K]):
    """Subscription index: which keys match a published event's channel and tags.

    ``K`` is any hashable subscription key; one key is one subscription (it may be added once, under one
    pattern and one tag set). A key matches an event when its pattern matches the canonical channel
    (exactly as :meth:`hubbub.channels.Pattern.matches`) and its tag set is a subset of the event's tags: a
    key without tags matches every event, a key with tags ``{a, b}`` only events carrying both.

    :meth:`match` returns a tuple (cheapest to build and iterate, safe to cache and share) in subscription
    insertion order. ``cache_size`` bounds the match cache; 0 turns it off.

    Not thread-safe; called from the event loop only. Pure and synchronous.
    """

    __slots__ = (
        "_cache",
        "_cache_gen",
        "_cache_size",
        "_generation",
        "_hits",
        "_misses",
        "_next_seq",
        "_nodes",
        "_root",
        "_seq",
        "_subs",
        "_tagged",
        "_visible",
    )

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self._root: _Node[K] = _Node()
        self._nodes = 1  # the root counts; it is never pruned
        # key -> (pattern, tags) as added, for remove() and statistics
        self._subs: dict[K, tuple[Pattern, frozenset[str]]] = {}
        # key -> insertion number: the sort key that restores creation order across buckets
        self._seq: dict[K, int] = {}
        self._next_seq = 0
        self._tagged = 0  # how many subscriptions have a non-empty tag set
        # key -> channel predicate, for the keys added with one (see the module docstring)
        self._visible: dict[K, Callable[[str], bool]] = {}
        self._generation = 0
        self._cache_size = cache_size
        # channel | (channel, tags) -> result, oldest first.
        self._cache: dict[object, tuple[K, ...]] | None = {} if cache_size else None
        self._cache_gen = 0
        self._hits = 0
        self._misses = 0

    # -- changes ----------------------------------------------------------------------------------------

    def add(
        self,
        pattern: Pattern,
        key: K,
        tags: frozenset[str] = frozenset(),
        visible: Callable[[str], bool] | None = None,
    ) -> None:
        """Index ``key`` under ``pattern`` and ``tags``; with ``visible``, only for the channels it accepts.

        Raises :class:`ValueError` if ``key`` is already indexed (one key is one subscription).
        """
        if key in self._subs:
            raise ValueError("key is already subscribed")
        tags = frozenset(tags)
        node = self._root
        for part in pattern.parts:
            if part is None:
                nxt = node.star
                if nxt is None:
                    nxt = node.star = _Node()
                    self._nodes += 1
            else:
                nxt = node.children.get(part)
                if nxt is None:
                    nxt = node.children[part] = _Node()
                    self._nodes += 1
            node = nxt
        if pattern.subtree:
            bucket = node.subtree
            if bucket is None:
                bucket = node.subtree = _Bucket()
        else:
            bucket = node.exact
            if bucket is None:
                bucket = node.exact = _Bucket()
        bucket.add(key, tags)
        if visible is not None:
            self._visible[key] = visible
        self._subs[key] = (pattern, tags)
        self._seq[key] = self._next_seq
        self._next_seq += 1
        if tags:
            self._tagged += 1
        self._generation += 1

    def remove(self, pattern: Pattern, key: K, tags: frozenset[str] = frozenset()) -> bool:
        """Forget ``key``. Returns False (and changes nothing) if ``key`` is not indexed under exactly this
        pattern and tag set. Trie nodes left empty are pruned.
        """
        entry = self._subs.get(key)
        if entry is None or entry[0] != pattern or entry[1] != tags:
            return False
        tags = entry[1]
        # Walk down, remembering how each node hangs off its parent, so empty nodes can be unlinked.
        path: list[tuple[_Node[K], str | None]] = []
        node = self._root
        for part in pattern.parts:
            path.append((node, part))
            nxt = node.star if part is None else node.children[part]
            assert nxt is not None  # the key is indexed, so its path exists
            node = nxt
        if pattern.subtree:
            bucket = node.subtree
            assert bucket is not None
            bucket.discard(key, tags)
            if not bucket:
                node.subtree = None
        else:
            bucket = node.exact
            assert bucket is not None
            bucket.discard(key, tags)
            if not bucket:
                node.exact = None
        while path and node.is_empty():
            parent, part = path.pop()
            if part is None:
                parent.star = None
            else:
                del parent.children[part]
            self._nodes -= 1
            node = parent
        del self._subs[key]
        del self._seq[key]
        self._visible.pop(key, None)
        if tags:
            self._tagged -= 1
        self._generation += 1
        if self._cache:
            # Drop cached results now rather than at the next match, so the cache never keeps a removed
            # key (a closed session's subscription) alive on a quiet node. Clearing an empty dict is O(1).
            self._cache.clear()
            self._cache_gen = self._generation
        return True

    # -- matching ---------------------------------------------------------------------------------------

    def match(self, channel: str, tags: Collection[str] = ()) -> tuple[K, ...]:
        """Every key whose pattern matches the canonical ``channel`` and whose tags are all in ``tags``.

        ``tags`` is a collection of tag strings (not one string): events pass their sorted tuple, which is
        used as a cache key as it is; other collections are frozen first. Returns a tuple in subscription
        insertion order, the empty tuple when nothing matches. The same tuple may be returned again from
        the cache, which is safe because tuples are immutable.
        """
        cache = self._cache
        if cache is None:
            return self._lookup(channel, tags)
        if self._cache_gen != self._generation:
            # Lazy invalidation: add/remove only bump the generation; one clear covers any burst of them.
            cache.clear()
            self._cache_gen = self._generation
        ck: object
        if not tags or not self._tagged:
            # Tags cannot change the answer: key the cache by channel alone (better hit rate, no allocation).
            ck = channel
        elif type(tags) is tuple or type(tags) is frozenset:
            # Equal tuples name equal sets, so a tuple is a correct key as it is (events carry sorted tuples).
            ck = (channel, tags)
        else:
            ck = (channel, frozenset(tags))
        hit = cache.get(ck)
        if hit is not None:
            self._hits += 1
            return hit
        self._misses += 1
        result = self._lookup(channel, tags)
        if len(cache) >= self._cache_size:
            for old in list(islice(cache, (self._cache_size + 1) // 2)):
                del cache[old]
        cache[ck] = result
        return result

    def _lookup(self, channel: str, tags: Collection[str]) -> tuple[K, ...]:
        """The uncached match: walk the trie, then read the buckets found."""
        found: list[_Bucket[K]] = []
        nodes: list[_Node[K]] = [self._root]
        for seg in channel[1:].split("/"):
            if len(nodes) == 1:
                # Single-path walk (no branching so far): the common case, no list per level.
                node = nodes[0]
                if node.subtree is not None:
                    found.append(node.subtree)
                child = node.children.get(seg)
                star = node.star
                if child is None:
                    if star is None:
                        break
                    nodes[0] = star
                elif star is None:
                    nodes[0] = child
                else:
                    nodes = [child, star]
            else:
                nxt: list[_Node[K]] = []
                for node in nodes:
                    if node.subtree is not None:
                        found.append(node.subtree)
                    child = node.children.get(seg)
                    if child is not None:
                        nxt.append(child)
                    if node.star is not None:
                        nxt.append(node.star)
                if not nxt:
                    break
                nodes = nxt
        else:
            # Every segment consumed: patterns ending here match, and ``**`` here matches zero segments.
            for node in nodes:
                if node.subtree is not None:
                    found.append(node.subtree)
                if node.exact is not None:
                    found.append(node.exact)
        if not found:
            return _EMPTY
        if len(found) == 1 and not found[0].tagged:
            if self._visible:
                return self._only_visible(tuple(found[0].plain), channel)
            return tuple(found[0].plain)
        keys: list[K] = []
        runs = 0
        sorted_tags: tuple[str, ...] | None = None
        for bucket in found:
            if bucket.plain:
                keys.extend(bucket.plain)
                runs += 1
            if bucket.tagged is not None and tags:
                if sorted_tags is None:
                    sorted_tags = _sorted_distinct(tags)
                runs += bucket.tagged.collect(sorted_tags, keys)
        if runs > 1:
            # Concatenated sorted runs: timsort merges them in about linear time.
            keys.sort(key=self._seq.__getitem__)
        if self._visible:
            return self._only_visible(tuple(keys), channel)
        return tuple(keys)

    def _only_visible(self, keys: tuple[K, ...], channel: str) -> tuple[K, ...]:
        visible = self._visible
        if not any(k in visible for k in keys):
            return keys
        return tuple(k for k in keys if (v := visible.get(k)) is None or v(channel))

    # -- introspection ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._subs)

    def __contains__(self, key: object) -> bool:
        return key in self._subs

    @property
    def generation(self) -> int:
        """Bumped by every successful add and remove."""
        return self._generation

    def statistics(self) -> dict[str, int]:
        """Counters for metrics: subscriptions, tagged subscriptions, trie nodes (root included), cache."""
        cache = self._cache
        return {
            "subscriptions": len(self._subs),
            "tagged_subscriptions": self._tagged,
            "nodes": self._nodes,
            "cache_hits": self._hits,
            "cache_misses": self._misses,
            # Entries from an older generation are dead (cleared at the next match): do not count them.
            "cache_size": len(cache) if cache is not None and self._cache_gen == self._generation else 0,
            "cache_capacity": self._cache_size,
            "generation": self._generation,
        }
