"""Live fan-out encodes a run of events for one connection as :class:`EventRun` pieces
(``hubbub.core.fanout._run_frames``): the frames must be exactly those of encoding each event alone, however
the run splits into pieces."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.core.fanout import _RUN_ENCODE_MIN, _run_frames
from hubbub.dialects import native as nc
from hubbub.events import Event, Publisher
from hubbub.transports.native import NativeEncoder

PUBLISHERS = [
    Publisher("native", "u", "a", ""),
    Publisher("native", "u", "a", "m1"),
    Publisher("guble", "", "", ""),
]


@st.composite
def fan_out_runs(draw: st.DrawFn) -> list[Event]:
    """Events of one channel in seq order, as one commit batch hands them to fan-out: mostly consecutive
    and alike, with breaks in seq (a duplicate was skipped), publisher, content type, headers or tags."""
    n = draw(st.integers(0, 3 * _RUN_ENCODE_MIN))
    seq = draw(st.sampled_from([1, 127, 128, 65535, 1 << 32]))
    t = draw(st.integers(0, 1 << 62))
    out: list[Event] = []
    for _ in range(n):
        seq += draw(st.sampled_from([1, 1, 1, 1, 2]))
        t += draw(st.integers(1, 1 << 20))
        out.append(
            Event(
                "/room/a",
                seq,
                "abcd1234",
                t,
                draw(st.sampled_from(PUBLISHERS[:1] * 4 + PUBLISHERS)),
                draw(st.sampled_from([b"x" * 16, b'{"v": 1}', b"", b"\xff" * 300, b"t"])),
                draw(st.sampled_from(["application/octet-stream"] * 4 + ["application/json"])),
                draw(st.sampled_from([{}, {}, {}, {"k": "v"}])),
                draw(st.sampled_from([(), (), (), ("t1",)])),
            )
        )
    return out


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
@settings(max_examples=200, deadline=None)
@given(events=fan_out_runs(), ids=st.sampled_from([("s",), ("s", "t2")]))
def test_run_frames_are_the_single_event_frames(
    encoding: nc.Encoding, events: list[Event], ids: tuple[str, ...]
) -> None:
    codec = nc.NativeCodec(encoding)
    want = [codec.encode_event(e, ids, False) for e in events]
    assert _run_frames(NativeEncoder(codec), events, ids, None) == want


class _PlainEncoder:
    """An encoder without ``encode_run`` (as the guble and ivy transports'): encoded event by event."""

    key = "plain"

    def encode_event(self, event: Event, subs: object, replay: bool, cache: dict[object, object]) -> bytes:
        return b"%d:%b" % (event.seq, event.payload)


def test_encoders_without_encode_run_get_events_one_by_one() -> None:
    pub = PUBLISHERS[0]
    events = [Event("/a", s, "e", s, pub, b"p%d" % s, "x/y", {}, ()) for s in range(1, 2 * _RUN_ENCODE_MIN)]
    assert _run_frames(_PlainEncoder(), events, ("s",), None) == [
        b"%d:p%d" % (s, s) for s in range(1, 2 * _RUN_ENCODE_MIN)
    ]
