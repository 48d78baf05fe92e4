"""The messages between a multi-worker node's log owner and its workers (``workers/frames.py``): values
survive the trip as plain tuples, a new event's result is rebuilt from its request, a duplicate's is the
original, errors come back with their own attributes, and a message is read whatever the chunking."""

from __future__ import annotations

import pickle
import socket
import threading
from typing import Any

import pytest

from hubbub.errors import EpochMismatch, TrimOutOfRange
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult, ChannelInfo
from hubbub.workers.frames import (
    MAX_FRAME,
    FrameBuffer,
    FrameReader,
    Publishers,
    encode,
    error_state,
    pack_events,
    pack_requests,
    pack_results,
    rebuild_error,
    send,
    unpack_events,
    unpack_requests,
    unpack_results,
)

PUB = Publisher("native", "alice", "app", "m1")


def _roundtrip(obj: object) -> Any:
    return pickle.loads(encode(obj)[4:])


def test_requests_and_events_survive_the_trip() -> None:
    reqs = [
        AppendRequest("/a", PUB, b"x", "text/plain", {"h": "1"}, ("t1", "t2"), "idem-1"),
        AppendRequest("/b", Publisher("mist"), b"", "application/octet-stream"),
    ]
    pubs = Publishers()
    back = unpack_requests(_roundtrip(pack_requests(reqs)), pubs)
    assert back == reqs
    events = [
        Event("/a", 3, "ep", 42, PUB, b"p", "text/plain", {"k": "v"}, ("t",)),
        Event("/b", 1, "e2", 43, PUB, b"", "x"),
    ]
    again = unpack_events(_roundtrip(pack_events(events)), pubs)
    assert again == events
    assert again[0].publisher is again[1].publisher  # one Publisher per publisher, not per event


def test_results_of_new_events_are_rebuilt_from_their_requests_and_duplicates_travel_whole() -> None:
    reqs = [
        AppendRequest("/a", PUB, b"new", "text/plain", {"h": "1"}, ("t",)),
        AppendRequest("/a", PUB, b"again", "text/plain", {}, (), "k"),
    ]
    original = Event("/a", 1, "ep", 10, Publisher("native", "alice", "app", "m0"), b"first", "text/plain")
    results = [
        AppendResult(
            Event("/a", 2, "ep", 11, PUB, b"new", "text/plain", {"h": "1"}, ("t",)), False, ((7, 3),)
        ),
        AppendResult(original, True),
    ]
    packed = _roundtrip(pack_results(results))
    assert len(packed[0]) == 4  # position, time and journal only
    back = unpack_results(packed, reqs, Publishers())
    assert back == results
    assert back[1].event.payload == b"first"  # the original's, not the request's


def test_errors_come_back_with_their_attributes() -> None:
    head = ChannelInfo("/a", "ep", 1, 5, 9)
    for exc in (TrimOutOfRange(9, 5), EpochMismatch(head), ValueError("plain")):
        back = rebuild_error(_roundtrip(error_state(exc)))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert getattr(back, "__dict__", {}) == getattr(exc, "__dict__", {})
    back = rebuild_error(error_state(TrimOutOfRange(9, 5)))
    assert isinstance(back, TrimOutOfRange) and (back.seq, back.top, back.code) == (9, 5, 4001)


@pytest.mark.parametrize("chunk", [1, 7, 1 << 16])
def test_a_message_is_read_whole_whatever_the_chunking(chunk: int) -> None:
    a, b = socket.socketpair()
    msgs: list[tuple[Any, ...]] = [
        ("ret", 1, list(range(100))),
        ("events", [(0, [])]),
        ("ret", 2, "x" * 70_000),
    ]
    data = b"".join(encode(m) for m in msgs)

    def write() -> None:
        for i in range(0, len(data), chunk):
            send(a, threading.Lock(), data[i : i + chunk])
        a.close()

    t = threading.Thread(target=write)
    t.start()
    reader = FrameReader(b)
    assert [reader.read() for _ in msgs] == msgs
    assert reader.read() is None  # the end of the stream
    t.join()
    b.close()


@pytest.mark.parametrize("chunk", [1, 3, 7, 4096])
def test_a_frame_buffer_gives_whole_messages_whatever_the_chunking(chunk: int) -> None:
    msgs: list[Any] = [
        ("append", 1, [("/a", b"x" * 300)]),
        ("call", 2, "head", ("/a",), {}),
        ("ret", 3, None),
    ]
    data = b"".join(encode(m) for m in msgs)
    buf = FrameBuffer()
    got: list[Any] = []
    for i in range(0, len(data), chunk):
        got += buf.feed(data[i : i + chunk])
    assert got == msgs
    assert buf.feed(b"") == []


def test_a_frame_buffer_refuses_a_message_over_the_limit_and_a_malformed_one() -> None:
    with pytest.raises(ValueError, match="a message of"):
        FrameBuffer().feed((MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(Exception):  # noqa: B017 - whatever unpickling raises: the link is dropped
        FrameBuffer().feed(b"\x00\x00\x00\x03abc")


def test_a_connections_publishes_travel_as_one_run_and_results_must_answer_every_request() -> None:
    reqs = [AppendRequest("/a", PUB, b"%d" % i, "text/plain") for i in range(100)]
    assert len(pack_requests(reqs)) == 1
    events = [Event("/a", 5 + i, "ep", 1000 + i, PUB, b"%d" % i, "text/plain") for i in range(100)]
    assert len(pack_events(events)) == 1
    results = [AppendResult(ev) for ev in events]
    packed = pack_results(results)
    assert len(packed) == 1
    assert unpack_results(_roundtrip(packed), reqs, Publishers()) == [
        AppendResult(Event("/a", 5 + i, "ep", 1000 + i, PUB, b"%d" % i, "text/plain")) for i in range(100)
    ]
    with pytest.raises(ValueError, match="100 results for 101 requests"):
        unpack_results(packed, [*reqs, reqs[0]], Publishers())
    with pytest.raises(ValueError, match="100 results for 99 requests"):
        unpack_results(packed, reqs[:99], Publishers())
