"""The tag index: which subscription tag sets are subsets of an event's tags, without scanning them all.

Concurrency contract: not thread-safe; owned by one :class:`~hubbub.router.trie.Router` bucket and called
from the event loop only. Pure and synchronous.

Structure: a trie over **canonical sorted tag sets**. A subscription's tag set ``{c, a, b}`` is stored at the
node reached by the path ``a → b → c`` (its tags sorted ascending, UTF-8 byte order, which is code point
order). A node's ``keys`` are the subscriptions whose tag set ends there; its children are keyed by the next,
strictly greater, tag.

Matching an event with the sorted distinct tags ``m[0] < … < m[n-1]`` walks only nodes whose path is itself
a subset of the event's tags: from a node reached through ``m[i-1]`` the candidates for the next step are
``m[i:]``. At each node the walk takes the cheaper side, looking up each remaining event tag among the
children, or testing each child against the event's tags (a dict from tag to its index), so one node costs
``min(children, remaining event tags)`` dict probes. The cost of a match thus depends on the event's tags and
on the tag sets that share prefixes with them, never on the number of unrelated subscriptions: 10 000 tag
sets that the event does not touch cost the same as none.

Invariants:

* Every node except the root holds keys or has children (``discard`` prunes the nodes it empties).
* ``groups`` maps each indexed tag set to its node, so ``add``/``discard`` reach a group in one lookup and the
  trie walk is only needed to create or prune nodes.
* Within a node, ``keys`` is an insertion-ordered dict (values unused), so one node's keys come out in
  subscription order; the router merges the runs of several nodes by insertion number.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["TagIndex"]

K = TypeVar("K", bound=Hashable)


class _TagNode(Generic[K]):
    __slots__ = ("children", "keys")

    def __init__(self) -> None:
        self.children: dict[str, _TagNode[K]] = {}
        self.keys: dict[K, None] = {}


class TagIndex(Generic[K]):
    """Keys indexed by non-empty tag sets; :meth:`collect` finds the keys whose set ⊆ an event's tags."""

    __slots__ = ("_root", "groups")

    def __init__(self) -> None:
        self._root: _TagNode[K] = _TagNode()
        #: tag set -> the node holding its keys.
        self.groups: dict[frozenset[str], _TagNode[K]] = {}

    def __bool__(self) -> bool:
        return bool(self.groups)

    def __len__(self) -> int:
        """Distinct tag sets indexed."""
        return len(self.groups)

    def add(self, key: K, tags: frozenset[str]) -> None:
        """Index ``key`` under the non-empty ``tags``. The caller guarantees ``key`` is not indexed yet."""
        node = self.groups.get(tags)
        if node is None:
            node = self._root
            for t in sorted(tags):
                nxt = node.children.get(t)
                if nxt is None:
                    nxt = node.children[t] = _TagNode()
                node = nxt
            self.groups[tags] = node
        node.keys[key] = None

    def discard(self, key: K, tags: frozenset[str]) -> None:
        """Forget ``key`` (indexed under ``tags``); prune the nodes left empty. ``KeyError`` if absent."""
        node = self.groups[tags]
        del node.keys[key]
        if node.keys:
            return
        del self.groups[tags]
        if node.children:
            return
        # Walk down again, then unlink empty nodes from the bottom up.
        path: list[tuple[_TagNode[K], str]] = []
        cur = self._root
        for t in sorted(tags):
            path.append((cur, t))
            cur = cur.children[t]
        while path:
            parent, t = path.pop()
            child = parent.children[t]
            if child.keys or child.children:
                break
            del parent.children[t]

    def collect(self, tags: tuple[str, ...], out: list[K]) -> int:
        """Append to ``out`` the keys whose tag set is a subset of ``tags``; return how many nodes (runs, each
        in insertion order) were appended.

        ``tags`` must be sorted ascending without duplicates (what :class:`~hubbub.events.Event` carries;
        the router normalises anything else).
        """
        root = self._root
        n = len(tags)
        runs = 0
        if n == 1:
            # One event tag: only a one-tag set can match, and it hangs off the root.
            child = root.children.get(tags[0])
            if child is not None and child.keys:
                out.extend(child.keys)
                return 1
            return 0
        pos: dict[str, int] | None = None
        stack: list[tuple[_TagNode[K], int]] = [(root, 0)]
        pop = stack.pop
        push = stack.append
        while stack:
            node, i = pop()
            children = node.children
            if len(children) < n - i:
                # Fewer children than remaining event tags: test each child against the event's tags.
                if pos is None:
                    pos = {t: j for j, t in enumerate(tags)}
                for t, child in children.items():
                    j = pos.get(t)
                    if j is None:
                        continue
                    if child.keys:
                        out.extend(child.keys)
                        runs += 1
                    if child.children and j + 1 < n:
                        push((child, j + 1))
            else:
                for j in range(i, n):
                    child = children.get(tags[j])
                    if child is None:
                        continue
                    if child.keys:
                        out.extend(child.keys)
                        runs += 1
                    if child.children and j + 1 < n:
                        push((child, j + 1))
        return runs

    def nodes(self) -> int:
        """Trie nodes below the root (for tests: a pruned index holds exactly the distinct set prefixes)."""
        count = 0
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += len(node.children)
            stack.extend(node.children.values())
        return count
