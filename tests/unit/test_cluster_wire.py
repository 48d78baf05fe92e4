"""hubbub.cluster.wire: events and tops round-trip; anything else is refused with BadMessage, never a
crash."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hubbub.cluster import wire
from hubbub.events import Event, Publisher

text = st.text(max_size=12)
events = st.builds(
    Event,
    st.text(min_size=1, max_size=20).map(lambda s: "/" + s),
    st.integers(1, 2**40),
    text,
    st.integers(0, 2**62),
    st.builds(Publisher, text, text, text, text),
    st.binary(max_size=64),
    text,
    st.dictionaries(text, text, max_size=3),
    st.lists(text, max_size=3).map(tuple),
)


@given(st.lists(events, max_size=20), text)
def test_events_round_trip_in_order(evs: list[Event], node: str) -> None:
    msgs = [wire.decode(m) for m in wire.encode_events(node, evs)]
    assert all(m.node == node and not m.tops for m in msgs)
    assert [e for m in msgs for e in m.events] == evs


def test_large_batches_are_cut_into_messages() -> None:
    evs = [Event("/c", i, "e", i, Publisher("native"), b"x" * 100_000, "text/plain") for i in range(1, 11)]
    msgs = list(wire.encode_events("n", evs))
    assert 3 <= len(msgs) <= 6 and all(len(m) <= wire.MAX_MESSAGE_BYTES + 100_100 for m in msgs)
    assert [e.seq for m in msgs for e in wire.decode(m).events] == list(range(1, 11))


def test_tops_round_trip() -> None:
    m = wire.decode(wire.encode_tops("n1", [("/a", "e1", 5), ("/b", "e2", 0)]))
    assert m == wire.Message("n1", [], [("/a", "e1", 5), ("/b", "e2", 0)])


def test_notices_round_trip() -> None:
    m = wire.decode(wire.encode_notices("n1", [("mqtt.takeover", b"\x93"), ("t", b"")]))
    assert m == wire.Message("n1", [], [], [("mqtt.takeover", b"\x93"), ("t", b"")])


@pytest.mark.parametrize(
    "obj",
    [
        [2, "n", "e", []],
        [1, "n", "n", [["topic", "text"]]],
        [1, "n", "n", [[5, b""]]],
        [1, "n", "n", [["topic"]]],
        [1, "n", "x", []],
        [1, 5, "e", []],
        [1, "n", "e", [["/a", 0, "e", 1, "d", "", "", "", b"", "t", {}, []]]],
        [1, "n", "e", [["a", 1, "e", 1, "d", "", "", "", b"", "t", {}, []]]],
        [1, "n", "e", [["/a", 1, "e", -1, "d", "", "", "", b"", "t", {}, []]]],
        [1, "n", "e", [["/a", 1, "e", 1, "d", "", "", "", "text", "t", {}, []]]],
        [1, "n", "e", [["/a", 1, "e", 1, "d", "", "", "", b"", "t", {"k": 1}, []]]],
        [1, "n", "t", [["/a", "e"]]],
        {"v": 1},
    ],
)
def test_bad_messages_are_refused(obj: object) -> None:
    with pytest.raises(wire.BadMessage):
        wire.decode(msgpack.packb(obj, use_bin_type=True))


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_refused(data: bytes) -> None:
    try:
        m = wire.decode(data)
    except wire.BadMessage:
        return
    assert isinstance(m, wire.Message)
