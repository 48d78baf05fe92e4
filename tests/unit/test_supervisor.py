"""hubbub.core.supervisor: a component's background tasks, their failures logged with context and counted,
restarted or stopping the node by the declared policy; and the components that own their tasks through it
(retention, the cluster sequencer's fills)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from hubbub.cluster.sequencer import Sequencer
from hubbub.core.retention import RetentionTask
from hubbub.core.supervisor import Backoff, Policy, Supervision, Supervisor
from hubbub.errors import StorageError
from hubbub.events import Event, Publisher
from hubbub.log import AppendRequest, ChannelInfo, MemoryLogStore
from hubbub.log.base import LogStore, RetentionPolicy

FAST = Backoff(first_s=0.01, max_s=0.02)
WAIT = 5.0


async def until(check: Callable[[], bool]) -> None:
    """Wait (polling the components' own state, in-process) until ``check()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


def failures_logged(caplog: pytest.LogCaptureFixture, component: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "component", None) == component]


def test_a_failing_loop_is_logged_counted_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    runs: list[int] = []

    async def loop() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError(f"bug {len(runs)}")
        await asyncio.Event().wait()

    async def main() -> None:
        sup = Supervision()
        async with Supervisor("broker", sup, FAST) as tasks:
            tasks.run("receive", loop)
            await until(lambda: len(runs) == 3)
            assert sup.failures == {"broker": 2}
            assert tasks.tasks == 1
        assert tasks.tasks == 0  # cancelled and ended with the block
        assert not sup.stop_requested.is_set()

    asyncio.run(main())
    records = failures_logged(caplog, "broker")
    # ``task``: the records' extra field, which LogRecord's type does not know.
    assert [(r.levelno, r.task, r.exc_info is not None) for r in records] == [  # type: ignore[attr-defined]
        (logging.ERROR, "receive", True),
        (logging.ERROR, "receive", True),
    ]
    assert "bug 1" in records[0].getMessage() and "restarting" in records[0].getMessage()


def test_a_failing_loop_whose_policy_is_stop_asks_the_node_to_stop(caplog: pytest.LogCaptureFixture) -> None:
    async def loop() -> None:
        raise RuntimeError("cannot go on")

    async def main() -> None:
        sup = Supervision()
        async with Supervisor("writer", sup) as tasks:
            tasks.run("log-writer", loop, Policy.STOP)
            async with asyncio.timeout(WAIT):
                await sup.stop_requested.wait()
        assert sup.stop_reason == "writer: log-writer"
        assert sup.failures == {"writer": 1}

    asyncio.run(main())
    assert "stopping the node" in failures_logged(caplog, "writer")[0].getMessage()


def test_one_shot_failures_are_reported_and_finishing_tasks_are_awaited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        sup = Supervision()
        written: list[str] = []
        gate = asyncio.Event()

        async def fails() -> None:
            raise ValueError("fill broke")

        async def write() -> None:
            await gate.wait()
            written.append("settle")

        async def forever() -> None:
            await asyncio.Event().wait()

        async with Supervisor("consumers", sup) as tasks:
            tasks.spawn(fails(), "fill")
            tasks.spawn(write(), "settle", finish=True)
            endless = tasks.spawn(forever(), "other")
            await until(lambda: sup.failures.get("consumers") == 1)
            asyncio.get_running_loop().call_soon(gate.set)
        assert written == ["settle"]  # waited for, not cancelled
        assert endless.cancelled()
        with pytest.raises(RuntimeError):
            tasks.spawn(forever(), "late")

    asyncio.run(main())
    (record,) = failures_logged(caplog, "consumers")
    # ``task``: the record's extra field, which LogRecord's type does not know.
    assert record.task == "fill" and "fill broke" in record.getMessage()  # type: ignore[attr-defined]


def test_a_retention_loop_whose_store_raises_is_logged_counted_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    async def control(fn: Callable[[LogStore], Any]) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("retention bug")  # not a HubbubError: before, the loop died unseen
        if len(calls) == 2:
            raise StorageError("log away")
        return 0

    async def main() -> None:
        sup = Supervision()
        task = RetentionTask(control, RetentionPolicy(max_age_s=60), 0.01, sup, FAST)
        async with task:
            await until(lambda: len(calls) >= 3)
        assert sup.failures == {"retention": 2}

    asyncio.run(main())
    records = failures_logged(caplog, "retention")
    assert len(records) == 2
    assert all(r.levelno == logging.ERROR and r.exc_info for r in records)
    assert "retention bug" in records[0].getMessage() and "log away" in records[1].getMessage()


def test_a_failed_gap_fill_is_logged_counted_and_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryLogStore()
    reqs = [AppendRequest("/a", Publisher("native"), b"%d" % i, "text/plain") for i in range(3)]
    events = [r.event for r in store.append(reqs)]
    out: list[int] = []
    reads: list[int] = []

    async def read(channel: str, epoch: str, after: int, limit: int) -> list[Event]:
        reads.append(after)
        if len(reads) == 1:
            raise RuntimeError("reader bug")
        return store.read(channel, after, limit, epoch=epoch)

    async def head(channel: str) -> ChannelInfo:
        return store.head(channel)

    async def main() -> None:
        sup = Supervision()
        seq: Sequencer[str] = Sequencer(
            lambda ev, origin: out.append(ev.seq), read, head, lambda ch: None, gap_wait=0.01
        )
        seq.supervise(sup)
        seq.seed([ChannelInfo("/a", events[0].epoch, 1, 0, 0)])
        seq.offer(events[2])  # 1 and 2 missing: a gap, filled from the log
        await until(lambda: out == [1, 2, 3])
        await seq.close()
        assert sup.failures == {"sequencer": 1}

    asyncio.run(main())
    (record,) = failures_logged(caplog, "sequencer")
    # ``task``: the record's extra field, which LogRecord's type does not know.
    assert "filling /a from the log" in record.task and "reader bug" in record.getMessage()  # type: ignore[attr-defined]
