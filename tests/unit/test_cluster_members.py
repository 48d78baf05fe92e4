"""A cluster member's id and its node's (``hubbub.config``): a worker of a multi-process cluster node
is ``<node>/w<i>``, and ``GET /api/v1/cluster`` groups the members by node with :func:`member_node`."""

from __future__ import annotations

import pytest

from hubbub.config import member_node, worker_member_id


@pytest.mark.parametrize("node", ["a", "node1", "host-123-abcdef", "n/w", "x/w1y"])
@pytest.mark.parametrize("index", [0, 1, 15])
def test_a_workers_member_id_names_its_node(node: str, index: int) -> None:
    member = worker_member_id(node, index)
    assert member == f"{node}/w{index}" and member_node(member) == node


@pytest.mark.parametrize("member", ["a", "host-123-abcdef", "a/w", "a/wx", "a/w1x", "/w1", "a/x1"])
def test_a_member_of_one_process_is_its_own_node(member: str) -> None:
    assert member_node(member) == member
