from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hubbub.core.session import Overflow, Session
from hubbub.events import Event, Publisher


class Enc:
    key = "test"

    def __init__(self) -> None:
        self.calls = 0

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        body = cache.get("body")
        if body is None:
            self.calls += 1
            body = cache["body"] = event.payload
        return ",".join(subs).encode() + b":" + body


def ev(seq: int, payload: bytes = b"x") -> Event:
    return Event("/a", seq, "e0000000", seq, Publisher("native"), payload, "text/plain")


def test_disconnect_policy_kicks_and_stops_queueing() -> None:
    s = Session("native", Enc(), max_items=3, max_bytes=1 << 20, overflow=Overflow.DISCONNECT)
    for i in range(3):
        assert s.deliver(ev(i), ["s"], {})
    assert not s.deliver(ev(3), ["s"], {})
    assert s.kicked == 4302
    assert s.queued == 0  # queued frames are dropped: the client recovers with since
    assert not s.push(b"late")


def test_drop_oldest_keeps_control_frames_and_counts() -> None:
    s = Session("mist1", Enc(), max_items=3, max_bytes=1 << 20, overflow=Overflow.DROP_OLDEST)
    assert s.push(b"reply")
    assert s.deliver(ev(1), ["s"], {})
    assert s.deliver(ev(2), ["s"], {})
    assert s.deliver(ev(3), ["s"], {})  # drops event 1
    assert s.stats.dropped == 1
    frames = asyncio.run(s.next_frames())
    assert frames == [b"reply", b"s:x", b"s:x"]
    assert not s.kicked


def test_byte_bound_applies() -> None:
    s = Session("native", Enc(), max_items=100, max_bytes=10, overflow=Overflow.DISCONNECT)
    assert s.push(b"12345")
    assert not s.push(b"123456", is_event=True)
    assert s.kicked


def test_catch_up_drops_live_events_and_calls_back() -> None:
    called: list[int] = []
    s = Session("guble", Enc(), max_items=2, max_bytes=1 << 20, overflow=Overflow.CATCH_UP)
    s.on_catch_up = lambda: called.append(1)
    s.deliver(ev(1), ["s"], {})
    s.push(b"status")
    assert not s.deliver(ev(2), ["s"], {})
    assert called == [1]
    assert asyncio.run(s.next_frames()) == [b"status"]


def test_shared_cache_encodes_once() -> None:
    enc = Enc()
    a = Session("native", enc, max_items=10, max_bytes=1000)
    b = Session("native", enc, max_items=10, max_bytes=1000)
    cache: dict[Any, Any] = {}
    e = ev(1, b"payload")
    a.deliver(e, ["s1"], cache)
    b.deliver(e, ["s1", "s2"], cache)
    assert enc.calls == 1
    assert asyncio.run(b.next_frames()) == [b"s1,s2:payload"]


def test_next_frames_waits_and_ends() -> None:
    async def main() -> None:
        s = Session("native", Enc(), max_items=10, max_bytes=1000)
        waiter = asyncio.ensure_future(s.next_frames())
        await asyncio.sleep(0)
        assert not waiter.done()
        s.push(b"a")
        assert await asyncio.wait_for(waiter, 1) == [b"a"]
        s.push(b"b")
        s.end(1000)
        assert await s.next_frames() == [b"b"]
        assert await s.next_frames() == []
        assert s.ending == 1000

    asyncio.run(main())


def test_next_frames_respects_byte_limit() -> None:
    s = Session("native", Enc(), max_items=10, max_bytes=1000)
    for _ in range(5):
        s.push(b"x" * 100)
    assert len(asyncio.run(s.next_frames(limit_bytes=250))) == 2
    assert len(asyncio.run(s.next_frames(limit_bytes=50))) == 1  # always at least one


def test_replies_are_throttled_not_dropped_up_to_a_hard_cap() -> None:
    s = Session("native", Enc(), max_items=2, max_bytes=1 << 20)
    for _ in range(8):
        assert s.push(b"reply")  # over the bound: the reader is throttled, the reply is kept
    assert not s.kicked
    assert not s.push(b"one too many")
    assert s.kicked == 4302


def test_wait_room_wakes_when_drained() -> None:
    async def main() -> None:
        s = Session("native", Enc(), max_items=4, max_bytes=1 << 20)
        for _ in range(4):
            s.push(b"r")
        waiter = asyncio.ensure_future(s.wait_room())
        await asyncio.sleep(0)
        assert not waiter.done()
        await s.next_frames()
        await asyncio.wait_for(waiter, 1)

    asyncio.run(main())
