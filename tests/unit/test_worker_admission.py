"""The workers' shared connection counts (workers/admission.py): two workers' views of one shared memory
file admit together no more than the node's limits, in all and per address; a place given back, or a dead
worker's region cleared, is free for either; a worker's address table is rebuilt past its bound."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from hubbub.core.limits import Limiter, LimitSettings
from hubbub.workers import admission
from hubbub.workers.admission import SLOTS, SharedAdmission


@pytest.fixture
def fd() -> Iterator[int]:
    f = admission.create(2)
    yield f
    os.close(f)


def _pair(fd: int, total: int, per_ip: int) -> tuple[SharedAdmission, SharedAdmission]:
    return SharedAdmission(fd, 2, 0, total, per_ip), SharedAdmission(fd, 2, 1, total, per_ip)


def test_the_total_is_the_nodes(fd: int) -> None:
    w0, w1 = _pair(fd, 3, 0)
    assert [w0.admit("a"), w1.admit("b"), w0.admit("c")] == [None, None, None]
    assert w1.admit("d") == "max_connections" and w0.admit("d") == "max_connections"
    w0.release("a")
    assert w1.admit("d") is None and w0.node_connections() == 3
    admission.clear_region(fd, 1)  # worker 1 died: its two places are free
    assert w0.node_connections() == 1
    assert [w0.admit("e"), w0.admit("f"), w0.admit("g")] == [None, None, "max_connections"]


def test_per_address_across_workers(fd: int) -> None:
    w0, w1 = _pair(fd, 0, 2)
    assert [w0.admit("10.0.0.1"), w1.admit("10.0.0.1")] == [None, None]
    assert w0.admit("10.0.0.1") == "max_connections_per_ip" == w1.admit("10.0.0.1")
    assert w1.admit("10.0.0.2") is None  # another address
    w1.release("10.0.0.1")
    assert w0.admit("10.0.0.1") is None


def test_many_addresses_rebuild_the_table(fd: int) -> None:
    w0, w1 = _pair(fd, 0, 1)
    n = SLOTS  # more keys over time than the table holds at once: freed ones are dropped at a rebuild
    for i in range(n):
        ip = f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"
        assert w0.admit(ip) is None
        assert w1.admit(ip) == "max_connections_per_ip"
        w0.release(ip)
    assert w1.admit("10.0.0.0") is None and w0.admit("10.0.0.0") == "max_connections_per_ip"


def test_the_limiter_asks_the_shared_counts(fd: int) -> None:
    w0, w1 = _pair(fd, 1, 0)
    l0, l1 = Limiter(LimitSettings(max_connections=1)), Limiter(LimitSettings(max_connections=1))
    l0.shared, l1.shared = w0, w1
    assert l0.admit("a", "native") is None
    assert l1.admit("b", "native") == "max_connections" and l1.refusals == {("max_connections", "native"): 1}
    l0.release("a")
    l0.release("a")  # once only
    assert l1.admit("b", "native") is None and l1.connections == 1 and w0.node_connections() == 1
