"""A session's outbound queue against a plain model: whatever mix of replies, events and shared runs goes in,
the writer takes it out in order, each take within its byte limit (or a single frame), and with
``DROP_OLDEST`` exactly the oldest events go when it is full, replies never."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.core.session import FrameRun, Overflow, Session
from tests.hypothesis_budget import examples


class Enc:
    key = "test"

    def encode_event(self, event: Any, subs: Any, replay: bool, cache: Any) -> bytes:
        raise AssertionError("not used")


# ("reply" | "event", size) pushes a frame; ("run", sizes) delivers a run; ("take" | "entries", limit) takes.
OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["reply", "event"]), st.integers(1, 40)),
        st.tuples(st.just("run"), st.lists(st.integers(1, 30), min_size=1, max_size=40)),
        st.tuples(st.sampled_from(["take", "entries"]), st.integers(1, 200)),
    ),
    max_size=60,
)


def frame(n: int, size: int) -> bytes:
    """A frame that says which one it is (the order is checked), ``size`` bytes or a little more."""
    tag = b"%d;" % n
    return tag + b"x" * max(0, size - len(tag))


def flatten(entries: Sequence[bytes | FrameRun]) -> list[bytes]:
    out: list[bytes] = []
    for e in entries:
        out += e.single() if isinstance(e, FrameRun) else [e]
    return out


@settings(max_examples=examples(300), deadline=None)
@given(OPS)
def test_frames_come_out_in_order_within_each_take_limit(ops: list[tuple[str, Any]]) -> None:
    s = Session("native", Enc(), max_items=1 << 20, max_bytes=1 << 30, overflow=Overflow.DISCONNECT)
    sent: list[bytes] = []
    got: list[bytes] = []
    n = 0
    for op, arg in ops:
        if op in ("reply", "event"):
            f = frame(n, arg)
            n += 1
            assert s.push(f, is_event=op == "event")
            sent.append(f)
        elif op == "run":
            frames = []
            for size in arg:
                frames.append(frame(n, size))
                n += 1
            assert s.deliver_run(FrameRun(frames, sum(map(len, frames)))) == len(frames)
            sent += frames
        elif s.queued:
            if op == "take":
                part = asyncio.run(s.next_frames(limit_bytes=arg))
            else:
                part = flatten(asyncio.run(s.next_entries(limit_bytes=arg)))
            assert part
            if op == "take":  # next_entries hands a run out whole, whatever its size
                assert sum(map(len, part)) <= arg or len(part) == 1
            got += part
        assert s.queued == len(sent) - len(got)
    if s.queued:
        got += asyncio.run(s.next_frames(limit_bytes=1 << 30))
    assert got == sent
    assert s.queued == 0


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(1, 8), OPS)
def test_drop_oldest_drops_oldest_events_keeps_replies(cap: int, ops: list[tuple[str, Any]]) -> None:
    s = Session("mist1", Enc(), max_items=cap, max_bytes=1 << 30, overflow=Overflow.DROP_OLDEST)
    model: list[tuple[bytes, bool]] = []  # what the queue must hold, oldest first
    got: list[bytes] = []
    dropped = 0
    n = 0

    def push_event(f: bytes) -> None:
        nonlocal dropped
        while len(model) >= cap and any(ev for _, ev in model):
            i = next(i for i, (_, ev) in enumerate(model) if ev)
            del model[i]
            dropped += 1
        if len(model) >= cap:
            dropped += 1  # only replies queued: the new event goes
        else:
            model.append((f, True))

    for op, arg in ops:
        if op == "reply":
            f = frame(n, arg)
            n += 1
            if len(model) < 4 * cap:
                assert s.push(f)
                model.append((f, False))
        elif op == "event":
            f = frame(n, arg)
            n += 1
            s.push(f, is_event=True)
            push_event(f)
        elif op == "run":
            frames = []
            for size in arg:
                frames.append(frame(n, size))
                n += 1
            s.deliver_run(FrameRun(frames, sum(map(len, frames))))
            if len(model) + len(frames) <= cap:
                model += [(f, True) for f in frames]
            else:
                for f in frames:
                    push_event(f)
        elif s.queued:
            take = s.next_frames(limit_bytes=arg) if op == "take" else s.next_entries(limit_bytes=arg)
            part = flatten(asyncio.run(take))
            assert part == [f for f, _ in model[: len(part)]]
            del model[: len(part)]
            got += part
        assert not s.kicked
        assert s.queued == len(model)
        assert s.stats.dropped == dropped
