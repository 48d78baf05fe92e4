"""A page of a channel listing (``Node.list_channels``, which ``/api/v1/channels``, ivy's log globs and the
admin API use) reads the log from its cursor only as far as its page, in store pages that start at its own
size: the same cost whatever the log's number of channels."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hubbub.channels import parse_pattern
from hubbub.core import Node
from hubbub.events import Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, ChannelInfo, RetentionPolicy

CHANNELS = 5000


def _store_with_channels(tmp_path: Path) -> Any:
    store = open_store("memory", str(tmp_path), "none", RetentionPolicy(), 0)
    store.append(
        [AppendRequest(f"/c/{i:05d}", Publisher("native"), b"x", "text/plain") for i in range(CHANNELS)]
    )
    return store


def _count_rows(store: Any) -> list[int]:
    """Counts the rows each ``store.channels`` call returns (the listing's reads of the log)."""
    reads: list[int] = []
    inner: Callable[..., list[ChannelInfo]] = store.channels

    def channels(*args: Any, **kw: Any) -> list[ChannelInfo]:
        page = inner(*args, **kw)
        reads.append(len(page))
        return page

    store.channels = channels
    return reads


def test_a_channel_page_reads_the_log_from_its_cursor_to_its_page_only(tmp_path: Path) -> None:
    """A page of 10 channels after a cursor in the middle of 5,000 reads one page of the log (at most 1,000
    rows) from the cursor on, not every channel: the listing costs the same whatever the log's size."""

    async def main() -> None:
        store = _store_with_channels(tmp_path)
        reads = _count_rows(store)
        async with Node(store) as node:
            page = await node.list_channels(parse_pattern("/**"), after="/c/02500", limit=10)
            assert [ci.channel for ci in page] == [f"/c/{i:05d}" for i in range(2501, 2511)]
            assert reads == [10]
            reads.clear()
            # One channel after a cursor (the channel tree's step): one row read.
            page = await node.list_channels(parse_pattern("/**"), after="/c/04000", limit=1)
            assert [ci.channel for ci in page] == ["/c/04001"] and reads == [1]
            reads.clear()
            page = await node.list_channels(parse_pattern("/c/*"), limit=3)
            assert [ci.channel for ci in page] == ["/c/00000", "/c/00001", "/c/00002"]
            assert reads == [3]
            reads.clear()
            # A pattern that keeps few of what it reads goes on reading, in growing pages, to the end.
            page = await node.list_channels(parse_pattern("/*/04999"), limit=5)
            assert [ci.channel for ci in page] == ["/c/04999"]
            assert reads[:4] == [5, 10, 20, 40] and max(reads) == 1000 and sum(reads) == CHANNELS
            reads.clear()
            # And the whole listing, page by page, gives each channel once, in order.
            seen: list[str] = []
            after = ""
            while True:
                got = await node.list_channels(parse_pattern("/**"), after=after, limit=1200)
                seen += [ci.channel for ci in got]
                if len(got) < 1200:
                    break
                after = got[-1].channel
            assert seen == [f"/c/{i:05d}" for i in range(CHANNELS)]

    asyncio.run(main())
