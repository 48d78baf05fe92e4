"""Live fan-out encodes a run of events for one connection as :class:`EventRun` pieces
(``hubbub.core.fanout._run_frames``): the frames must be exactly those of encoding each event alone, however
the run splits into pieces."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.channels import parse_pattern
from hubbub.core.fanout import _RUN_ENCODE_MIN, FanOut, _run_frames
from hubbub.core.faults import Faults
from hubbub.core.node import Subscription
from hubbub.core.session import RUN_ENTRY_MIN, FrameRun, Session
from hubbub.dialects import native as nc
from hubbub.events import Event, Publisher
from hubbub.log.base import runs_of
from hubbub.router import Router
from hubbub.transports.native import NativeEncoder
from tests.hypothesis_budget import examples

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
@settings(max_examples=examples(200), deadline=None)
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


class _OwnEncoder(_PlainEncoder):
    """An encoder that records what its own connection gets (``Encoder.per_connection``), as guble's does."""

    per_connection = True

    def __init__(self) -> None:
        self.seen: list[int] = []

    def encode_event(self, event: Event, subs: object, replay: bool, cache: dict[object, object]) -> bytes:
        self.seen.append(event.seq)
        return super().encode_event(event, subs, replay, cache)


@pytest.mark.parametrize("n", [1, _RUN_ENCODE_MIN, 3 * _RUN_ENCODE_MIN])
def test_a_run_is_shared_between_connections_unless_their_encoder_is_per_connection(n: int) -> None:
    """Connections with the same encoding and subscription ids share one encoded run; a per-connection
    encoder is called for its own connection all the same, and each connection gets every frame once."""
    router: Router[Subscription] = Router()
    fan = FanOut(router, set(), {}, Faults())
    own = [_OwnEncoder() for _ in range(3)]
    plain = _PlainEncoder()
    sessions = [Session("own", e, max_items=1000, max_bytes=1 << 20) for e in own]
    sessions += [Session("plain", plain, max_items=1000, max_bytes=1 << 20) for _ in range(2)]
    for s in sessions:
        router.add(parse_pattern("/a"), Subscription(s, "g1", parse_pattern("/a"), frozenset()))
    pub = PUBLISHERS[0]
    events = [Event("/a", s, "e", s, pub, b"p%d" % s, "x/y", {}, ()) for s in range(1, n + 1)]
    fan.fan_out_run(router.match("/a"), events, None)
    assert [e.seen for e in own] == [list(range(1, n + 1))] * 3
    want = [b"%d:p%d" % (s, s) for s in range(1, n + 1)]
    for s in sessions:
        assert asyncio.run(s.next_frames()) == want
    assert fan.deliveries == {"own": 3 * n, "plain": 2 * n}


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
@settings(max_examples=examples(200), deadline=None)
@given(events=fan_out_runs(), limit=st.sampled_from([300, 4096, 1 << 20]))
def test_a_batching_connection_alone_gets_a_run_as_the_batches_of_its_frames(
    encoding: nc.Encoding, events: list[Event], limit: int
) -> None:
    """A run fanned out to one batching connection is queued as its batch frames, built without the single
    frames: byte for byte what the writer packs from the single frames of each of the run's pieces, counted
    as the run's events."""
    codec = nc.NativeCodec(encoding)
    router: Router[Subscription] = Router()
    fan = FanOut(router, set(), {}, Faults())
    sess = Session("native", NativeEncoder(codec), max_items=1000, max_bytes=1 << 24)
    sess.batch_limit = limit
    router.add(parse_pattern("/room/*"), Subscription(sess, "s", parse_pattern("/room/*"), frozenset()))
    fan.fan_out_run(router.match("/room/a"), events, None)
    singles = [codec.encode_event(e, ("s",), False) for e in events]
    assert sess.queued == len(events)
    entries = sess.take_entries()
    if len(events) < RUN_ENTRY_MIN:
        assert entries == singles
        return
    want: list[bytes] = []
    done = 0
    for r in runs_of(events):
        want += nc.pack_batches(encoding, singles[done : done + len(r.rows)], limit)
        done += len(r.rows)
    (run,) = entries
    assert isinstance(run, FrameRun) and run.frames is None and run.count == len(events)
    assert run.single() == want
    assert run.nbytes == sum(map(len, want))


@pytest.mark.parametrize("batching", [False, True])
def test_a_run_that_would_overflow_a_connection_closes_it_as_slow(batching: bool) -> None:
    """A run the queue cannot take whole closes its connection as a slow consumer, batching (the run packed)
    or not (the run frame by frame: those that fit queued, then the close, which clears them)."""
    codec = nc.NativeCodec("msgpack")
    router: Router[Subscription] = Router()
    fan = FanOut(router, set(), {}, Faults())
    sess = Session("native", NativeEncoder(codec), max_items=10, max_bytes=1 << 20)
    sess.batch_limit = (1 << 20) if batching else 0
    router.add(parse_pattern("/a"), Subscription(sess, "s", parse_pattern("/a"), frozenset()))
    pub = PUBLISHERS[0]
    events = [Event("/a", s, "e", s, pub, b"p", "x/y", {}, ()) for s in range(1, 3 * RUN_ENTRY_MIN)]
    fan.fan_out_run(router.match("/a"), events, None)
    assert sess.kicked == sess.slow_close_code
    assert sess.queued == 0 and sess.take_entries() == []


def test_batching_connections_share_one_packed_run_and_the_others_get_frames() -> None:
    """Of the connections a run reaches, those batching alike share one packed-only run, those batching
    with another size one of their own, and one that does not batch gets the single frames: the same events,
    byte for byte, each way."""
    codec = nc.NativeCodec("msgpack")
    router: Router[Subscription] = Router()
    fan = FanOut(router, set(), {}, Faults())
    limits = [4096, 4096, 300, 0]
    sessions = [Session("native", NativeEncoder(codec), max_items=1000, max_bytes=1 << 24) for _ in limits]
    for sess, limit in zip(sessions, limits, strict=True):
        sess.batch_limit = limit
        router.add(parse_pattern("/a"), Subscription(sess, "s", parse_pattern("/a"), frozenset()))
    pub = PUBLISHERS[0]
    events = [Event("/a", s, "e", s, pub, b"p%d" % s, "x/y", {}, ()) for s in range(1, 3 * RUN_ENTRY_MIN)]
    fan.fan_out_run(router.match("/a"), events, None)
    singles = [codec.encode_event(e, ("s",), False) for e in events]
    runs = [s.take_entries() for s in sessions]
    assert runs[0][0] is runs[1][0]  # one run, shared
    for (run,), limit in zip(runs[:3], limits[:3], strict=True):
        assert isinstance(run, FrameRun) and run.frames is None and run.count == len(events)
        assert run.single() == nc.pack_batches("msgpack", singles, limit)
    (plain,) = runs[3]
    assert isinstance(plain, FrameRun) and plain.frames == singles
    assert fan.deliveries == {"native": 4 * len(events)}
