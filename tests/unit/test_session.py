from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from hubbub.core.session import FrameRun, Overflow, Session
from hubbub.disconnect import Disconnect
from hubbub.events import Event, Publisher
from hubbub.log.base import EventRun


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
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)
        assert not waiter.done()
        s.push(b"a")
        assert await asyncio.wait_for(waiter, 1) == [b"a"]
        s.push(b"b")
        s.end(Disconnect.NORMAL)
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


def test_push_replies_queues_in_order_with_the_same_hard_cap_as_push() -> None:
    s = Session("native", Enc(), max_items=2, max_bytes=1 << 20)
    assert s.push_replies([])
    assert s.push(b"r0")
    assert s.push_replies([b"r1", b"r2", b"r3"])  # over the bound, under the cap: kept
    assert asyncio.run(s.next_frames()) == [b"r0", b"r1", b"r2", b"r3"]
    assert s.push_replies([b"x"] * 8)  # exactly the cap of 4 x max_items, as 8 push() calls would allow
    assert not s.kicked
    assert not s.push_replies([b"one too many"])
    assert s.kicked == 4302
    assert not s.push_replies([b"after the kick"])


def test_wait_room_wakes_when_drained() -> None:
    async def main() -> None:
        s = Session("native", Enc(), max_items=4, max_bytes=1 << 20)
        for _ in range(4):
            s.push(b"r")
        waiter = asyncio.ensure_future(s.wait_room())
        await asyncio.sleep(0)  # one loop step: the new task runs up to its wait (no timing involved)
        assert not waiter.done()
        await s.next_frames()
        await asyncio.wait_for(waiter, 1)

    asyncio.run(main())


# -- runs of event frames (FrameRun) ----------------------------------------------------------------------


def frames_of(n: int, tag: str = "f", size: int = 10) -> list[bytes]:
    return [f"{tag}{i}".encode().ljust(size, b".") for i in range(n)]


def run_of(frames: list[bytes]) -> FrameRun:
    return FrameRun(frames, sum(map(len, frames)))


def test_a_run_is_one_entry_counted_frame_by_frame() -> None:
    s = Session("native", Enc(), max_items=30, max_bytes=1 << 20)
    fs = frames_of(20)
    assert s.push(b"reply")
    assert s.deliver_run(run_of(fs)) == 20
    assert s.queued == 21 and s.statistics()["queued_frames"] == 21
    assert s.statistics()["queued_bytes"] == 5 + 200 and s.stats.delivered == 20
    assert len(s._frames) == 2  # one entry for the whole run
    # Over max_items: frame by frame, as single events, until the policy kicks the session.
    assert s.deliver_run(run_of(frames_of(10, "g"))) == 9
    assert s.kicked == 4302
    assert s.queued == 0


def test_next_frames_takes_runs_in_order_and_splits_them_at_the_byte_limit() -> None:
    async def main() -> None:
        s = Session("native", Enc(), max_items=100, max_bytes=1 << 20)
        a, b = frames_of(10, "a"), frames_of(10, "b")
        s.push(b"r1")
        s.deliver_run(run_of(a))
        s.push(b"r2")
        s.deliver_run(run_of(b))
        got: list[bytes] = []
        while s.queued:
            part = await s.next_frames(limit_bytes=35)
            assert part and (len(part) == 1 or sum(map(len, part)) <= 35)
            got += part
        assert got == [b"r1", *a, b"r2", *b]
        assert s.statistics()["queued_bytes"] == 0
        s.deliver_run(run_of(a))
        s.deliver_run(run_of(b))
        assert await s.next_frames() == a + b  # all at once when it all fits

    asyncio.run(main())


def test_a_run_s_last_frame_taken_alone_over_the_limit_leaves_nothing_of_the_run() -> None:
    """A run split by the byte limit whose last frame alone is over it: that take ends the run, and what is
    queued after it comes next (an empty run was left in its place, for the next take to hand out)."""

    async def main() -> None:
        s = Session("native", Enc(), max_items=100, max_bytes=1 << 20)
        a = frames_of(10, "a")  # frames of the same length, a run long enough to be queued as one
        s.deliver_run(run_of(a))
        s.push(b"r1")
        n = len(a[0])
        assert await s.next_frames(limit_bytes=9 * n) == a[:9]
        assert await s.next_frames(limit_bytes=n - 1) == [a[9]]
        assert s.queued == 1 and s.statistics()["queued_bytes"] == 2
        assert await s.next_entries(limit_bytes=1) == [b"r1"]
        assert s.queued == 0 and s.statistics()["queued_bytes"] == 0

    asyncio.run(main())


def test_next_entries_hands_out_shared_runs_whole() -> None:
    async def main() -> None:
        s = Session("native", Enc(), max_items=100, max_bytes=1 << 20)
        run = run_of(frames_of(10))
        s.push(b"r1")
        s.deliver_run(run)
        s.push(b"r2")
        assert await s.next_entries(limit_bytes=40) == [b"r1"]
        assert await s.next_entries(limit_bytes=40) == [run]  # whole, over the limit: the writer packs it
        assert s.queued == 1
        assert await s.next_entries() == [b"r2"]
        s.deliver_run(run_of(frames_of(3)))  # a short run is queued frame by frame
        assert await s.next_entries() == frames_of(3)

    asyncio.run(main())


def test_a_shared_run_is_packed_once() -> None:
    calls: list[int] = []

    def pack(frames: Sequence[bytes], limit: int) -> list[bytes]:
        calls.append(limit)
        return [b"|".join(frames)]

    run = run_of(frames_of(10))
    a = Session("native", Enc(), max_items=100, max_bytes=1 << 20)
    b = Session("native", Enc(), max_items=100, max_bytes=1 << 20)
    a.deliver_run(run)
    b.deliver_run(run)
    got_a = asyncio.run(a.next_entries())
    got_b = asyncio.run(b.next_entries())
    assert got_a == got_b == [run]
    first = run.batches(pack, 1000)
    assert run.batches(pack, 1000) is first
    assert calls == [1000]
    run.batches(pack, 500)  # another limit: packed again
    assert calls == [1000, 500]
    assert run.frames == frames_of(10)  # never changed by a session


def test_drop_oldest_drops_single_frames_of_queued_runs() -> None:
    s = Session("mist1", Enc(), max_items=10, max_bytes=1 << 20, overflow=Overflow.DROP_OLDEST)
    s.push(b"reply")
    s.deliver_run(run_of(frames_of(9)))
    assert s.deliver(ev(1), ["s"], {})  # drops the run's first frame
    assert s.stats.dropped == 1 and s.queued == 10
    assert asyncio.run(s.next_frames()) == [b"reply", *frames_of(9)[1:], b"s:x"]


def test_catch_up_drops_queued_runs() -> None:
    called: list[int] = []
    s = Session("guble", Enc(), max_items=10, max_bytes=1 << 20, overflow=Overflow.CATCH_UP)
    s.on_catch_up = lambda: called.append(1)
    s.push(b"status")
    s.deliver_run(run_of(frames_of(9)))
    assert not s.deliver(ev(1), ["s"], {})
    assert called == [1] and s.stats.dropped == 9 and s.queued == 1
    assert asyncio.run(s.next_frames()) == [b"status"]


def test_a_run_that_overflows_into_a_catch_up_stops_there() -> None:
    """The catch-up replays from the log every event from the dropped ones on: the rest of the run too, so
    none of it is queued after the switch (it would arrive twice, and ahead of the replay)."""
    called: list[int] = []
    s = Session("guble", Enc(), max_items=4, max_bytes=1 << 20, overflow=Overflow.CATCH_UP)
    s.on_catch_up = lambda: called.append(s.queued)
    s.push(b"status")
    assert s.deliver_run(run_of(frames_of(6))) == 3
    assert called == [1] and s.stats.dropped == 3 and s.queued == 1
    assert asyncio.run(s.next_frames()) == [b"status"]


def test_a_run_that_overflows_drop_oldest_keeps_its_newest_frames() -> None:
    s = Session("mist1", Enc(), max_items=4, max_bytes=1 << 20, overflow=Overflow.DROP_OLDEST)
    assert s.deliver_run(run_of(frames_of(6))) == 6
    assert s.stats.dropped == 2
    assert asyncio.run(s.next_frames()) == frames_of(6)[2:]


class BatchEnc(Enc):
    """Packs runs as ``[frame|frame|…]`` groups of at most ``limit`` bytes."""

    def encode_batches(self, frames: Sequence[bytes], limit: int) -> list[bytes]:
        out: list[bytes] = []
        for f in frames:
            if out and len(out[-1]) + len(f) + 1 <= limit:
                out[-1] += b"|" + f
            else:
                out.append(f)
        return out

    def encode_run_batches(
        self, proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool, limit: int
    ) -> list[bytes]:
        frames = [f"{proto.seq + i}:".encode() + p for i, (_, p) in enumerate(rows)]
        return self.encode_batches(frames, limit)


def test_replay_chunks_of_a_batching_session_come_packed() -> None:
    rows = [(i, b"p") for i in range(25)]
    proto = Event("/a", 7, "e0000000", 0, Publisher("native"), b"p", "text/plain")
    s = Session("native", BatchEnc(), max_items=20, max_bytes=1 << 20)
    assert s.replay_run_chunks(EventRun(proto, rows), ("s",)) is None  # not batching
    s.batch_limit = 12
    chunks = s.replay_run_chunks(EventRun(proto, rows), ("s",))
    assert chunks is not None
    assert [c.count for c in chunks] == [10, 10, 5]  # half the queue's bound each
    assert all(c.frames is None and c.packed for c in chunks)
    joined = b"|".join(b for c in chunks for b in c.batches(BatchEnc().encode_batches, 12))
    assert joined.split(b"|") == [f"{7 + i}:p".encode() for i in range(25)]
    assert all(len(b) <= 12 for c in chunks for b in c.single())
    assert chunks[0].nbytes == sum(map(len, chunks[0].single()))
    frames = s.replay_chunks(frames_of(25))
    assert [c.count for c in frames] == [10, 10, 5]
    assert frames[0].packed and frames[1].packed and frames[2].packed is None  # too short to pack ahead
    dropping = Session("x", BatchEnc(), max_items=20, max_bytes=1 << 20, overflow=Overflow.DROP_OLDEST)
    dropping.batch_limit = 12
    assert dropping.replay_run_chunks(EventRun(proto, rows), ("s",)) is None


def test_replay_runs_pace_packed_chunks_through_the_queue() -> None:
    async def main() -> None:
        rows = [(i, b"p") for i in range(100)]
        proto = Event("/a", 1, "e0000000", 0, Publisher("native"), b"p", "text/plain")
        s = Session("native", BatchEnc(), max_items=20, max_bytes=1 << 20, batch_limit=30)
        chunks = s.replay_run_chunks(EventRun(proto, rows), ("s",))
        assert chunks is not None
        replay = asyncio.ensure_future(s.replay_runs(chunks))
        got: list[bytes] = []
        while not replay.done() or s.queued:
            assert s.queued <= 20
            got += await s.next_frames()  # a packed-only run comes as its batch frames
        assert await replay == 100
        assert b"|".join(got).split(b"|") == [f"{1 + i}:p".encode() for i in range(100)]

    asyncio.run(main())


def test_call_when_ready_fires_once_on_the_first_frame_or_the_end_and_can_be_forgotten() -> None:
    calls: list[int] = []

    def ready() -> None:
        calls.append(s.queued)

    s = Session("t", Enc(), max_items=8, max_bytes=1 << 16)
    s.call_when_ready(ready)
    assert calls == []
    s.push(b"a")
    s.push(b"b")
    assert calls == [1]  # in the push that queued the first frame, once
    s.call_when_ready(ready)  # frames queued: at once
    assert calls == [1, 2]
    assert asyncio.run(s.next_frames()) == [b"a", b"b"]
    s.call_when_ready(ready)
    s.forget_ready(ready)
    s.push(b"c")
    assert calls == [1, 2]  # forgotten
    asyncio.run(s.next_frames())
    ends: dict[str, Callable[[Session], None]] = {
        "end": lambda q: q.end(Disconnect.NORMAL),
        "kick": lambda q: q.kick(Disconnect.SLOW_CONSUMER),
        "close": lambda q: q.close(),
    }
    for name, end in ends.items():
        s = Session("t", Enc(), max_items=8, max_bytes=1 << 16)
        calls.clear()
        s.call_when_ready(ready)
        end(s)
        assert calls == [0], name  # the end wakes the writer, with nothing queued
        s.call_when_ready(ready)  # ended already: at once
        assert calls == [0, 0], name
