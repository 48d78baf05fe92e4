"""LogWriter: group commits, and the switch interval while a writer thread runs for a store off the loop."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hubbub.core.writer import SWITCH_INTERVAL_S, LogWriter
from hubbub.errors import HubbubError
from hubbub.events import Publisher
from hubbub.log import AppendRequest, AppendResult, MemoryLogStore, SqliteLogStore
from hubbub.log.appended import Committed


@pytest.fixture
def default_interval() -> Iterator[float]:
    """A switch interval above the writer's, put back after the test whatever happens."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        yield 0.005
    finally:
        sys.setswitchinterval(before)


def test_a_sqlite_writer_lowers_the_switch_interval_until_the_last_one_stops(
    tmp_path: Path, default_interval: float
) -> None:
    loop = asyncio.new_event_loop()
    stores = [SqliteLogStore(tmp_path / "a.db"), SqliteLogStore(tmp_path / "b.db")]
    try:
        a, b = (LogWriter(st, loop, lambda items, result: None) for st in stores)
        a.start()
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S
        b.start()
        a.stop()
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S  # b still runs
        b.stop()
        assert sys.getswitchinterval() == default_interval
        b.stop()  # a second stop changes nothing
        assert sys.getswitchinterval() == default_interval
    finally:
        for st in stores:
            st.close()
        loop.close()


def test_an_interval_changed_meanwhile_is_left_alone(tmp_path: Path, default_interval: float) -> None:
    loop = asyncio.new_event_loop()
    store = SqliteLogStore(tmp_path / "a.db")
    try:
        w = LogWriter(store, loop, lambda items, result: None)
        w.start()
        sys.setswitchinterval(0.002)
        w.stop()
        assert sys.getswitchinterval() == 0.002
    finally:
        store.close()
        loop.close()


def test_an_inline_store_leaves_the_switch_interval_alone(default_interval: float) -> None:
    loop = asyncio.new_event_loop()
    try:
        w = LogWriter(MemoryLogStore(), loop, lambda items, result: None)
        w.start()
        assert sys.getswitchinterval() == default_interval
        w.stop()
        assert sys.getswitchinterval() == default_interval
    finally:
        loop.close()


def test_commits_complete_in_order_with_the_lower_interval(tmp_path: Path, default_interval: float) -> None:
    """Group commits through the writer thread still complete every submission, in order."""
    store = SqliteLogStore(tmp_path / "a.db")
    pub = Publisher("native", "u", "app", "")
    got: list[tuple[int, int]] = []

    async def main() -> None:
        done = asyncio.Event()

        def committed(items: list[int], result: list[Committed] | HubbubError) -> None:
            assert not isinstance(result, HubbubError)
            for i, r in zip(items, result, strict=True):
                assert isinstance(r, AppendResult)  # appends, not runs: one result each
                got.append((i, r.event.seq))
            if len(got) == 3000:
                done.set()

        w = LogWriter(store, asyncio.get_running_loop(), committed)
        w.start()
        for k in range(30):
            w.submit(list(range(k * 100, k * 100 + 100)), [AppendRequest("/c", pub, b"x", "t")] * 100)
            await asyncio.sleep(0)  # one loop step between submits, so commits interleave with them
        await asyncio.wait_for(done.wait(), 30)
        await asyncio.get_running_loop().run_in_executor(None, w.stop)

    try:
        asyncio.run(main())
    finally:
        store.close()
    assert got == [(i, i + 1) for i in range(3000)]
    assert sys.getswitchinterval() == default_interval
