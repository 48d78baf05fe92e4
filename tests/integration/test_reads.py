"""The node's typed reads of the log (core/reads.py) against real stores: bounds, epochs, listing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from hubbub.channels import parse_pattern
from hubbub.core import Node, NodeSettings
from hubbub.core.reads import READ_LIMIT
from hubbub.events import Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, RetentionPolicy

Run = Callable[[Callable[[Node], Awaitable[None]]], None]


@pytest.fixture(params=["memory", "sqlite"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Run:
    def runner(body: Callable[[Node], Awaitable[None]]) -> None:
        async def main() -> None:
            store = open_store(request.param, str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
            async with Node(store, NodeSettings()) as node:
                await body(node)

        asyncio.run(main())

    return runner


async def publish(node: Node, channel: str, n: int) -> None:
    for i in range(n):
        await node.publish(AppendRequest(channel, Publisher("native"), f"{i}".encode(), "text/plain"))


def test_read_channel_is_bounded_and_names_the_position(run: Run) -> None:
    async def body(node: Node) -> None:
        await publish(node, "/r/a", 5)
        page = await node.read_channel("/r/a", since=1, limit=2)
        assert [e.seq for e in page.events] == [2, 3]
        assert page.info.top == 5 and page.epoch_matches
        assert (await node.read_channel("/r/a", limit=-3)).events == []
        # Asking for more than the bound gives at most the bound (here: all five).
        assert len((await node.read_channel("/r/a", limit=READ_LIMIT * 10)).events) == 5

    run(body)


def test_read_channel_with_another_epoch_reads_no_events(run: Run) -> None:
    async def body(node: Node) -> None:
        await publish(node, "/r/e", 2)
        page = await node.read_channel("/r/e", epoch="not-this-one")
        assert not page.epoch_matches and page.events == []
        assert page.info.top == 2
        same = await node.read_channel("/r/e", epoch=page.info.epoch)
        assert same.epoch_matches and [e.seq for e in same.events] == [1, 2]

    run(body)


def test_list_channels_after_limit_and_pattern(run: Run) -> None:
    async def body(node: Node) -> None:
        for ch in ("/l/a", "/l/b", "/l/c", "/other"):
            await publish(node, ch, 1)
        pattern = parse_pattern("/l/*")
        assert [c.channel for c in await node.list_channels(pattern)] == ["/l/a", "/l/b", "/l/c"]
        assert [c.channel for c in await node.list_channels(pattern, after="/l/a", limit=1)] == ["/l/b"]
        assert await node.top_time() > 0

    run(body)
