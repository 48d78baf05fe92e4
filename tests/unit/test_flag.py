"""Flag: asyncio.Event's set / clear / wait semantics, with waiters allocated only while someone waits."""

from __future__ import annotations

import asyncio
import sys

import pytest

from hubbub.core.flag import Flag


def test_wait_returns_at_once_when_set_and_blocks_after_clear() -> None:
    async def main() -> None:
        f = Flag()
        assert not f.is_set()
        f.set()
        assert f.is_set()
        assert await asyncio.wait_for(f.wait(), 1) is True
        f.clear()
        waiter = asyncio.ensure_future(f.wait())
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)
        assert not waiter.done()
        f.set()
        assert await asyncio.wait_for(waiter, 1) is True

    asyncio.run(main())


def test_set_wakes_every_waiter_once_and_a_second_set_is_a_no_op() -> None:
    async def main() -> None:
        f = Flag()
        woken: list[int] = []

        async def wait(i: int) -> None:
            await f.wait()
            woken.append(i)

        tasks = [asyncio.ensure_future(wait(i)) for i in range(3)]
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)
        assert woken == [] and "3 waiting" in repr(f)
        f.set()
        f.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 1)
        assert sorted(woken) == [0, 1, 2]
        assert "0 waiting" in repr(f) and "set" in repr(f)

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_and_others_still_wake() -> None:
    async def main() -> None:
        f = Flag()
        a = asyncio.ensure_future(f.wait())
        b = asyncio.ensure_future(f.wait())
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        assert "1 waiting" in repr(f)
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        assert f._waiters is None  # nothing is kept for an idle flag
        c = asyncio.ensure_future(f.wait())
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)
        f.set()
        assert await asyncio.wait_for(c, 1) is True

    asyncio.run(main())


def test_a_waiter_woken_then_cancelled_does_not_break_the_flag() -> None:
    async def main() -> None:
        f = Flag()
        w = asyncio.ensure_future(f.wait())
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)
        f.set()
        w.cancel()  # its future is resolved already; the task sees the cancellation
        with pytest.raises(asyncio.CancelledError):
            await w
        f.clear()
        again = asyncio.ensure_future(f.wait())
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)
        f.set()
        assert await asyncio.wait_for(again, 1) is True

    asyncio.run(main())


def test_an_idle_flag_is_far_smaller_than_an_event() -> None:
    f = Flag()
    assert not hasattr(f, "__dict__")
    assert sys.getsizeof(f) < 100


def test_a_callback_is_called_once_on_set_in_order_with_waiters_and_can_be_taken_back() -> None:
    async def main() -> None:
        f = Flag()
        calls: list[str] = []
        f.call_when_set(lambda: calls.append("a"))
        w = asyncio.ensure_future(f.wait())
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)

        def b() -> None:
            calls.append("b")

        f.call_when_set(b)
        f.discard(b)
        f.discard(b)  # idempotent
        assert calls == []
        f.set()
        assert calls == ["a"]  # in set() itself, not on a later loop step
        assert await asyncio.wait_for(w, 1) is True
        f.clear()
        f.set()
        assert calls == ["a"]  # once
        f.call_when_set(lambda: calls.append("c"))  # set already: at once
        assert calls == ["a", "c"]
        f.clear()
        f.call_when_set(b)
        f.discard(b)
        assert repr(f) == "<Flag unset, 0 waiting>"  # the list of waiters is gone with its last one

    asyncio.run(main())
