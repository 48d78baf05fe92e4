"""The core API (core/api.py): what the node shows transports, and that it costs nothing on the hot path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hubbub.core.api import Core
from hubbub.core.batcher import WriteBatcher
from hubbub.core.node import Node
from hubbub.core.subscriptions import SubscriptionRegistry
from hubbub.log import open_store
from hubbub.log.base import RetentionPolicy

#: Public names of the node that are not the transports' API: the composition root's and the cluster's.
COMPOSITION = {"close", "fan_out", "fan_out_many", "settings", "statistics"}


@pytest.fixture
def node() -> Iterator[Node]:
    store = open_store("memory", "", "none", RetentionPolicy(), 600)
    try:
        yield Node(store)
    finally:
        store.close()


def core_members() -> set[str]:
    return {k for k in vars(Core) if not k.startswith("_")} | set(Core.__annotations__)


def test_the_node_shows_the_core_api_and_nothing_of_its_parts(node: Node) -> None:
    public = {k for k in dir(node) if not k.startswith("_")}
    assert public - COMPOSITION == core_members()


def test_every_counter_is_behind_the_metrics_object(node: Node) -> None:
    """No mutable statistics on the node itself: a transport reads and counts through ``metrics``."""
    mutable = {
        k: type(v).__name__
        for k in dir(node)
        if not k.startswith("_") and isinstance(v := getattr(node, k), dict | list | set)
    }
    assert mutable == {}
    m = node.metrics
    m.count_bad_input("ivy")
    m.count_slow_close("ivy")
    m.count_io_error("mist1")
    m.count_write_timeout("qpubs")
    assert (m.bad_input, m.slow_closes, m.io_errors, m.write_timeouts) == (
        {"ivy": 1},
        {"ivy": 1},
        {"mist1": 1},
        {"qpubs": 1},
    )
    assert m.connections() == {} and m.subscriptions() == 0 and m.log().events == 0


def test_the_hot_path_methods_are_the_parts_own_bound_methods(node: Node) -> None:
    """The facade costs no call per publish or session operation: each is the part's bound method."""
    for name, part in (
        ("submit", WriteBatcher),
        ("submit_many", WriteBatcher),
        ("submit_run", WriteBatcher),
        ("publish", WriteBatcher),
        ("writable", WriteBatcher),
        ("attach", SubscriptionRegistry),
        ("detach", SubscriptionRegistry),
        ("unsubscribe", SubscriptionRegistry),
    ):
        method = getattr(node, name)
        assert isinstance(method.__self__, part), name
        assert method.__func__ is getattr(part, name), name
    # The counters the hot path increments are the parts' own dicts, held by reference.
    assert node.metrics.published is node._registry.published
    assert node.metrics.deliveries is node._registry.deliveries
