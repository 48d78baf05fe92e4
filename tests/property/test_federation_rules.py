"""The federation rules (hubbub.federation) in random DAGs of nodes, without I/O.

Each node has upstreams among the nodes before it (so the graph is acyclic) and local subscriptions. Events
are published at random nodes and travel as the links carry them (transports/federation_link.py): up to
every upstream when :func:`forwards_up` allows it, down to a downstream when the downstream's cover of its
interest (its subscriptions and its own downstreams') matches and :func:`forwards_to` allows it; the
receiving node applies :func:`accepts`, stores :func:`arrived` headers, and turns away a repeated
:func:`idempotency_key`. Messages are delivered in a random order, and every message may be delivered twice
(a resend after a reconnect). Properties:

* it terminates: no event loops (the number of messages is bounded by the graph, whatever the order);
* no node stores an event twice, and no stored path repeats a node;
* each node stores exactly the events the graph says it should: every ancestor of the publisher, and every
  node whose interest matches and that can be reached down from one of those.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.channels import parse_pattern
from hubbub.federation import (
    accepts,
    arrived,
    forwards_to,
    forwards_up,
    hops_of,
    idempotency_key,
    minimal_cover,
    origin_of,
    stamp,
)
from tests.hypothesis_budget import examples

PATTERNS = ["/a", "/a/*", "/a/**", "/**", "/*/b", "/b/**", "/a/b", "/c/*/d"]
CHANNELS = ["/a", "/a/b", "/a/c", "/b", "/b/c", "/c/x/d", "/d"]


@dataclass
class Node:
    name: str
    ups: list[str]
    local: list[str]
    downs: list[str] = field(default_factory=list)
    stored: dict[str, dict[str, str]] = field(default_factory=dict)  # idempotency key -> stored headers
    seq: int = 0


def effective(nodes: dict[str, Node], name: str) -> set[str]:
    """What a node listens to: its subscriptions and, through their links, its downstreams'."""
    out = set(nodes[name].local)
    for d in nodes[name].downs:
        out |= effective(nodes, d)
    return out


def below(nodes: dict[str, Node], name: str) -> set[str]:
    """The nodes below a node (what it learns from its links' handshakes and the paths of what comes up)."""
    out: set[str] = set()
    for d in nodes[name].downs:
        out |= {d} | below(nodes, d)
    return out


def cover_matches(patterns: set[str], channel: str) -> bool:
    return any(p.matches(channel) for p in minimal_cover(parse_pattern(t) for t in patterns))


@st.composite
def meshes(draw: st.DrawFn) -> tuple[dict[str, Node], list[tuple[str, str]], int]:
    n = draw(st.integers(2, 6))
    names = [f"n{i}" for i in range(n)]
    nodes: dict[str, Node] = {}
    for i, name in enumerate(names):
        ups = draw(st.lists(st.sampled_from(names[:i]), unique=True, max_size=3)) if i else []
        local = draw(st.lists(st.sampled_from(PATTERNS), max_size=3))
        nodes[name] = Node(name, ups, local)
    for node in nodes.values():
        for u in node.ups:
            nodes[u].downs.append(node.name)
    pubs = draw(
        st.lists(st.tuples(st.sampled_from(names), st.sampled_from(CHANNELS)), min_size=1, max_size=8)
    )
    return nodes, pubs, draw(st.integers(0, 2**32))


def expected(nodes: dict[str, Node], publisher: str, channel: str) -> set[str]:
    """Graph reachability alone: up to every ancestor, then down wherever the interest matches."""
    have = {publisher}
    todo = [publisher]
    while todo:  # up
        for u in nodes[todo.pop()].ups:
            if u not in have:
                have.add(u)
                todo.append(u)
    todo = list(have)
    while todo:  # down
        for d in nodes[todo.pop()].downs:
            if d not in have and cover_matches(effective(nodes, d), channel):
                have.add(d)
                todo.append(d)
    return have


@settings(max_examples=examples(300), deadline=None)
@given(meshes())
def test_events_reach_exactly_where_they_should_once_and_never_loop(
    mesh: tuple[dict[str, Node], list[tuple[str, str]], int],
) -> None:
    nodes, pubs, seed = mesh
    rng = random.Random(seed)
    # (to, from upstream?, channel, headers as sent)
    queue: list[tuple[str, bool, str, dict[str, str]]] = []

    def send_from(name: str, channel: str, headers: dict[str, str], seq: int) -> None:
        node = nodes[name]
        for u in node.ups:
            if forwards_up(u, headers, below(nodes, name)):
                sent, _ = stamp(name, headers, "e", seq)
                queue.append((u, False, channel, sent))
        for d in node.downs:
            if cover_matches(effective(nodes, d), channel) and forwards_to(d, headers):
                sent, _ = stamp(name, headers, "e", seq)
                queue.append((d, True, channel, sent))

    def store(name: str, channel: str, headers: dict[str, str]) -> None:
        node = nodes[name]
        origin = origin_of(headers)
        key = idempotency_key(origin) if origin is not None else f"fed:{name}:e:{node.seq + 1}"
        if key in node.stored:
            return  # the idempotency key turns it away: not stored, not delivered, not forwarded
        node.seq += 1
        node.stored[key] = headers
        send_from(name, channel, headers, node.seq)

    published = []
    for name, channel in pubs:
        store(name, channel, {})
        published.append((name, channel, f"fed:{name}:e:{nodes[name].seq}"))
    steps = 0
    bound = 4 * len(pubs) * len(nodes) ** 3 + 10
    while queue:
        steps += 1
        assert steps <= bound, "events loop"
        to, from_up, channel, headers = queue.pop(rng.randrange(len(queue)))
        if rng.random() < 0.2:
            queue.append((to, from_up, channel, headers))  # delivered again later (a resend)
        if not accepts(to, headers):
            continue
        store(to, channel, {**arrived(to, headers, from_up)})

    for node in nodes.values():
        for stored in node.stored.values():
            path = hops_of(stored)
            assert len(path) == len(set(path)), f"{node.name}: a path repeats a node: {path}"
    for publisher, channel, key in published:
        holders = {n.name for n in nodes.values() if key in n.stored}
        assert holders == expected(nodes, publisher, channel), (publisher, channel)


@given(st.lists(st.sampled_from(PATTERNS), max_size=6), st.sampled_from(CHANNELS))
def test_the_minimal_cover_matches_what_its_patterns_match(patterns: list[str], channel: str) -> None:
    ps = [parse_pattern(p) for p in patterns]
    cover = minimal_cover(ps)
    assert any(p.matches(channel) for p in ps) == any(p.matches(channel) for p in cover)
    assert len({p.text for p in cover}) == len(cover) <= len(set(patterns))
