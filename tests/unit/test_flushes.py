"""Writes held to the end of a commit (hubbub.core.flushes): what is held runs at the release, in order,
once, unless taken back; outside a hold a write is the loop's ``call_soon``."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from hubbub.core import flushes


def run(fn: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """The async test run on a fresh event loop."""

    @functools.wraps(fn)
    def wrapper() -> None:
        asyncio.run(fn())

    return wrapper


@run
async def test_outside_a_hold_a_write_runs_at_the_end_of_the_loop_step() -> None:
    ran: list[str] = []
    flushes.call_soon(lambda: ran.append("write"))
    ran.append("step")
    assert ran == ["step"]
    await asyncio.sleep(0)
    assert ran == ["step", "write"]


@run
async def test_held_writes_run_at_the_release_in_order_with_those_they_add_and_not_taken_back() -> None:
    ran: list[str] = []

    def b_then_add() -> None:
        ran.append("b")
        flushes.call_soon(lambda: ran.append("added"))

    assert flushes.hold()
    try:
        flushes.call_soon(lambda: ran.append("a"))
        gone = flushes.call_soon(lambda: ran.append("cancelled"))
        flushes.call_soon(b_then_add)
        assert not flushes.hold()  # nested: the outer hold keeps them all
        flushes.call_soon(lambda: ran.append("c"))
        gone.cancel()
        assert ran == []
    finally:
        flushes.release()
    assert ran == ["a", "b", "c", "added"]
    await asyncio.sleep(0)  # nothing was left scheduled
    assert ran == ["a", "b", "c", "added"]
    flushes.call_soon(lambda: ran.append("later"))  # the hold is over: back to call_soon
    assert ran[-1] == "added"
    await asyncio.sleep(0)
    assert ran[-1] == "later"


@run
async def test_a_failing_write_is_reported_to_the_loop_and_the_others_still_run() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
    ran: list[str] = []

    def boom() -> None:
        raise RuntimeError("broken socket")

    try:
        flushes.hold()
        flushes.call_soon(boom)
        flushes.call_soon(lambda: ran.append("next"))
        flushes.release()  # does not raise: the failure is one connection's, not the commit's
    finally:
        loop.set_exception_handler(None)
    assert ran == ["next"]
    assert len(reported) == 1 and isinstance(reported[0]["exception"], RuntimeError)


@run
async def test_a_base_exception_leaves_the_rest_to_the_loop_step_not_lost() -> None:
    ran: list[str] = []

    def stop() -> None:
        raise KeyboardInterrupt

    flushes.hold()
    flushes.call_soon(stop)
    flushes.call_soon(lambda: ran.append("rest"))
    try:
        flushes.release()
    except KeyboardInterrupt:
        pass
    else:  # pragma: no cover - the interrupt must come through
        raise AssertionError("the KeyboardInterrupt was swallowed")
    assert ran == []
    await asyncio.sleep(0)
    assert ran == ["rest"]
    assert flushes.hold()  # the hold ended
    flushes.release()


@run
async def test_each_thread_has_its_own_hold() -> None:
    flushes.hold()
    try:
        seen: list[bool] = []

        def other() -> None:
            async def run() -> None:
                ran: list[int] = []
                flushes.call_soon(lambda: ran.append(1))  # this thread holds nothing: its loop's call_soon
                await asyncio.sleep(0)
                seen.append(ran == [1])

            asyncio.run(run())

        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        assert seen == [True]
    finally:
        flushes.release()
