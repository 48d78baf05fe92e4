"""Durable consumers on PostgreSQL with two nodes sharing the log (two stores, two nodes, two consumer
services in one process): a consumer created on one node journals the events committed by the other (the
journal is written in every node's commit); the node serving it must also hand them out, in journal order.

Both fail today (strict xfail, so the fix shows): the service takes its own node's commit notifications as
the journal's next items, so (1) an item journaled by another node before one of this node's moves
``loaded_to`` past it and it is skipped until a restart, and (2) nothing tells an open consumer of another
node's commits. The fix belongs in the consumer service: on a shared log, notifications are hints to read
the journal, and the cluster relay's delivery of other nodes' events is one too."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hubbub.core import ConsumerService, Node, NodeSettings
from hubbub.log import open_store
from hubbub.log.base import RetentionPolicy

from .test_consumers import Recv, payloads, pending, publish, spec

pytestmark = pytest.mark.slow


async def _two_nodes(url: str, tmp: Path) -> tuple[Node, Node]:
    a = Node(open_store(url, str(tmp / "a"), "commit", RetentionPolicy(), 600), NodeSettings())
    b = Node(open_store(url, str(tmp / "b"), "commit", RetentionPolicy(), 600), NodeSettings())
    return a, b


@pytest.mark.xfail(
    strict=True,
    reason="a notification of this node's commit moves loaded_to past items another node journaled before it",
)
def test_events_committed_by_another_node_are_journaled_for_a_consumer(tmp_path: Path, pg_url: str) -> None:
    async def main() -> None:
        a, b = await _two_nodes(pg_url, tmp_path)
        async with a, b, ConsumerService(a) as svc_a, ConsumerService(b):
            await svc_a.create(spec())
            await publish(b, "/jobs/x", "from-b-1", "from-b-2")
            await publish(a, "/jobs/x", "from-a")
            # In the shared journal, in commit order, whichever node committed them.
            assert len(await pending(a, "c")) == 3
            assert len(await pending(b, "c")) == 3
            r = Recv()
            o = await svc_a.open("c", r.on_batch, r.on_close, batch_max=100)
            got: list[str] = []
            while len(got) < 3:
                try:
                    bt = await r.next()
                except TimeoutError:
                    raise AssertionError(f"got {got}, closed {r.closed}") from None
                got += payloads(bt)
                await o.ack(bt.number)
            assert got == ["from-b-1", "from-b-2", "from-a"]
            assert await pending(b, "c") == []  # acknowledged for every node

    asyncio.run(main())


@pytest.mark.xfail(
    strict=True,
    reason="a consumer's service learns of new journal items from its own node's commits only: items "
    "another node journals while the consumer is open wait for a restart (docs/cluster.md)",
)
def test_an_open_consumer_gets_what_another_node_commits(tmp_path: Path, pg_url: str) -> None:
    async def main() -> None:
        a, b = await _two_nodes(pg_url, tmp_path)
        async with a, b, ConsumerService(a) as svc_a, ConsumerService(b):
            await svc_a.create(spec())
            r = Recv()
            o = await svc_a.open("c", r.on_batch, r.on_close, batch_max=100)
            await publish(a, "/jobs/x", "from-a")
            bt = await r.next()
            assert payloads(bt) == ["from-a"]
            await o.ack(bt.number)
            await publish(b, "/jobs/x", "from-b")
            bt = await asyncio.wait_for(r.q.get(), 5.0)
            assert payloads(bt) == ["from-b"]

    asyncio.run(main())
