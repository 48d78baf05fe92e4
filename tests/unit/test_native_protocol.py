"""The native connection state machine (dialects/native_protocol.py), sans-I/O: phases, pipelining."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hubbub.dialects import native as nc
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, StorageError
from hubbub.events import Event, Position, Publisher


class Wire:
    """What the machine emitted and how it ended."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.ended: list[Disconnect] = []
        self.rooms = 0

    def proto(self, max_inflight: int = 4) -> nc.NativeProtocol:
        return nc.NativeProtocol(
            nc.NativeCodec("json"),
            emit=lambda f: self.frames.append(json.loads(f)),
            end=self.ended.append,
            room=self.room,
            max_frame=1 << 20,
            max_subscriptions=16,
            max_inflight=max_inflight,
            ping_interval=25.0,
        )

    def room(self) -> None:
        self.rooms += 1


codec = nc.NativeCodec("json")


def cmd(obj: dict[str, Any]) -> nc.Command:
    return codec.decode(json.dumps(obj))


HELLO = {"op": "hello", "id": 1, "v": 1}


def test_hello_opens_and_replies() -> None:
    w = Wire()
    p = w.proto()
    hello = cmd(HELLO)
    assert p.admit(hello) is nc.Admit.HELLO and not p.open
    assert isinstance(hello, nc.Hello)
    p.opened(hello, "0123456789abcdef", "alice")
    assert p.open and w.frames[0]["op"] == "reply" and w.frames[0]["id"] == 1 and not w.ended


def test_anything_but_hello_first_is_refused_with_4005_except_pong() -> None:
    w = Wire()
    p = w.proto()
    assert p.admit(cmd({"op": "pong"})) is nc.Admit.IGNORE and not w.frames
    assert p.admit(cmd({"op": "ping", "id": 3})) is nc.Admit.REFUSED
    assert w.frames == [
        {"op": "error", "id": 3, "code": 4005, "message": "hello required", "temporary": False}
    ]
    assert w.ended == [Disconnect.HELLO_REQUIRED]
    # Closing: nothing more is answered.
    assert p.admit(cmd(HELLO)) is nc.Admit.IGNORE and len(w.frames) == 1


def test_another_version_is_refused_with_4006_and_the_supported_list() -> None:
    w = Wire()
    p = w.proto()
    assert p.admit(cmd({"op": "hello", "id": 1, "v": 2})) is nc.Admit.REFUSED
    assert w.frames[0]["code"] == 4006 and w.frames[0]["supported"] == [1]
    assert w.ended == [Disconnect.UNSUPPORTED_VERSION]


def test_a_second_hello_is_fatal() -> None:
    w = Wire()
    p = w.proto()
    hello = cmd(HELLO)
    p.admit(hello)
    assert isinstance(hello, nc.Hello)
    p.opened(hello, "s", "")
    assert p.admit(cmd({"op": "hello", "id": 2, "v": 1})) is nc.Admit.REFUSED
    assert w.frames[-1]["code"] == 4005 and w.ended == [Disconnect.HELLO_REQUIRED]


def test_a_fatal_core_error_closes_a_non_fatal_one_does_not() -> None:
    w = Wire()
    p = w.proto()
    p.failed(AuthError("no", code=4102), 7)
    assert w.frames[-1]["code"] == 4102 and not w.ended
    p.failed(AuthError("expired", code=4103), 8)
    assert w.ended == [Disconnect.TOKEN_EXPIRED]


def event(seq: int) -> Event:
    return Event("/a", seq, "e", seq, Publisher("native"), b"x", "text/plain", {}, ())


class Result:
    def __init__(self, seq: int) -> None:
        self.event = event(seq)
        self.duplicate = False


@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 8))
def test_replies_follow_the_publishes_in_order(acks: list[bool], batch: int) -> None:
    w = Wire()
    p = w.proto(max_inflight=64)
    ids = list(range(100, 100 + len(acks)))
    i = 0
    while i < len(acks):
        k = min(batch, len(acks) - i)
        if k == 1:
            p.submitted(ids[i], acks[i])
        else:
            p.submitted_many(zip(ids[i : i + k], acks[i : i + k], strict=True), k)
        i += k
    assert p.inflight == len(acks)
    done = 0
    while done < len(acks):
        k = min(batch, len(acks) - done)
        if k == 1:
            p.committed(Result(done + 1))
        else:
            for f in p.committed_many([Result(done + j + 1) for j in range(k)]):
                w.frames.append(json.loads(f))
        done += k
    assert p.inflight == 0
    assert [f["id"] for f in w.frames] == [rid for rid, a in zip(ids, acks, strict=True) if a]


def test_a_failed_commit_answers_its_request_with_the_error() -> None:
    w = Wire()
    p = w.proto(max_inflight=2)
    p.submitted(5, False)
    p.committed(StorageError())
    assert w.frames == [{"op": "error", "id": 5, "code": 4301, "message": "unavailable", "temporary": True}]
    assert w.rooms == 1  # below half of max_inflight: reading resumes


def test_subscription_notices() -> None:
    w = Wire()
    p = w.proto()

    class Gap:
        channel = "/a"
        since = Position(3, "old")
        position = Position(0, "new")
        reason = "epoch"

    p.subscribed(4, "s1", Position(9, "new"), None, [Gap()])
    p.recovered("s1", 2, Position(9, "new"))
    assert [f["op"] for f in w.frames] == ["reply", "gap", "recovered"]
    assert w.frames[1]["reason"] == "epoch" and w.frames[2]["replayed"] == 2
