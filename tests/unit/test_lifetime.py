"""Lifetime keeps asyncio.TaskGroup's rules: each case runs with both and must come out the same."""

from __future__ import annotations

import asyncio
import functools
import types
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from hubbub.transports.lifetime import Lifetime


def run(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The async test run on a fresh event loop."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


KINDS: list[Callable[[], Any]] = [asyncio.TaskGroup, Lifetime]


async def until_cancelled(started: asyncio.Event, cancelled: asyncio.Event) -> None:
    """A task that runs until it is cancelled, saying when it started and when it was cancelled."""
    started.set()
    try:
        await asyncio.Future()
    except asyncio.CancelledError:
        cancelled.set()
        raise


@pytest.fixture(params=KINDS, ids=["TaskGroup", "Lifetime"])
def kind(request: pytest.FixtureRequest) -> Callable[[], Any]:
    made: Callable[[], Any] = request.param
    return made


@run
async def test_leaving_normally_waits_for_the_tasks(kind: Callable[[], Any]) -> None:
    release = asyncio.Event()
    done: list[str] = []

    async def child(name: str) -> None:
        await release.wait()
        done.append(name)

    async with kind() as group:
        group.create_task(child("a"))
        group.create_task(child("b"))
        asyncio.get_running_loop().call_soon(release.set)
    assert sorted(done) == ["a", "b"]


@run
async def test_an_exception_in_the_block_cancels_the_tasks_and_is_raised_in_a_group(
    kind: Callable[[], Any],
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    with pytest.raises(BaseExceptionGroup) as info:
        async with kind() as group:
            task = group.create_task(until_cancelled(started, cancelled))
            await started.wait()
            raise ValueError("block failed")
    assert cancelled.is_set() and task.cancelled()
    assert [type(e) for e in info.value.exceptions] == [ValueError]


@run
async def test_a_failing_task_ends_the_block_and_the_tasks_and_leaves_the_caller_uncancelled(
    kind: Callable[[], Any],
) -> None:
    other_cancelled = asyncio.Event()
    reached_after_block: list[bool] = []

    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("task failed")

    async def handler() -> int:
        try:
            async with kind() as group:
                group.create_task(until_cancelled(asyncio.Event(), other_cancelled))
                group.create_task(fails())
                await asyncio.Future()  # the read loop: cancelled by the failure
        except* KeyError:
            pass
        await asyncio.sleep(0)  # not cancelled again: the lifetime's own cancellation is withdrawn
        reached_after_block.append(True)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    assert await asyncio.wait_for(handler(), 5) == 0
    assert other_cancelled.is_set() and reached_after_block == [True]


@run
async def test_cancelling_the_caller_cancels_the_tasks_and_propagates(kind: Callable[[], Any]) -> None:
    inside = asyncio.Event()
    child_cancelled = asyncio.Event()

    async def handler() -> None:
        async with kind() as group:
            group.create_task(until_cancelled(asyncio.Event(), child_cancelled))
            inside.set()
            await asyncio.Future()

    task = asyncio.create_task(handler())
    await inside.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert child_cancelled.is_set()


@run
async def test_cancelling_the_caller_waiting_on_exit_cancels_the_tasks(
    kind: Callable[[], Any],
) -> None:
    waiting = asyncio.Event()
    child_cancelled = asyncio.Event()

    async def handler() -> None:
        async with kind() as group:
            # The block ends at once: the exit waits for the task.
            group.create_task(until_cancelled(waiting, child_cancelled))

    task = asyncio.create_task(handler())
    await waiting.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert child_cancelled.is_set()


@run
async def test_tasks_that_end_cleanly_or_cancelled_raise_nothing(kind: Callable[[], Any]) -> None:
    async with kind() as group:
        quick = group.create_task(asyncio.sleep(0, result=7))
        slow = group.create_task(asyncio.Event().wait())
        await quick
        slow.cancel()
    assert quick.result() == 7 and slow.cancelled()


@run
async def test_no_task_after_the_lifetime_ended(kind: Callable[[], Any]) -> None:
    async with kind() as group:
        pass
    coro = asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        group.create_task(coro)
    if isinstance(group, Lifetime):
        assert isinstance(coro, types.CoroutineType)  # an async def's, with cr_frame
        assert coro.cr_frame is None  # closed, not left to warn "never awaited"
    else:
        coro.close()  # TaskGroup leaves that to the caller


@run
async def test_a_lifetime_is_entered_once() -> None:
    life = Lifetime()
    async with life:
        with pytest.raises(RuntimeError):
            await life.__aenter__()
