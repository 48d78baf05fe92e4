"""The TCP stream decoder's fast path: :meth:`NativeStreamDecoder.feed_runs` gathers a read's publishes of
the common shape in :class:`PublishRun`\\ s, shares codecs, and decodes everything else as before."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import msgpack
import orjson
import pytest

from hubbub.dialects import native as nc
from hubbub.errors import BadFrame, BadRequest, HubbubError
from hubbub.server import GC_THRESHOLDS, tune_gc


def mp(obj: Any) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


def js(obj: Any) -> bytes:
    return orjson.dumps(obj) + b"\n"


def pub(i: int, channel: str = "/a", **extra: Any) -> dict[str, Any]:
    return {"op": "publish", "id": i, "channel": channel, "payload": b"p%d" % i, **extra}


def shape(items: list[nc.RunItem]) -> list[Any]:
    """Items as comparable values: a run by its publishes' ids, an error by code and request id."""
    out: list[Any] = []
    for x in items:
        if isinstance(x, nc.PublishRun):
            out.append(("run", [rid for rid, _ in x.replies]))
        elif isinstance(x, HubbubError):
            out.append(("error", x.code, x.request_id))
        else:
            out.append((type(x).__name__, getattr(x, "id", None)))
    return out


def test_a_read_of_common_publishes_is_one_run() -> None:
    dec = nc.NativeStreamDecoder()
    dec.feed(mp(pub(1)))  # the first publish to a channel canonicalizes it on the general path
    items = dec.feed_runs(b"".join(mp(pub(i, ack=i % 2 == 0)) for i in range(2, 7)))
    assert shape(items) == [("run", [2, 3, 4, 5, 6])]
    run = items[0]
    assert isinstance(run, nc.PublishRun) and len(run) == 5
    assert run.channels == ["/a"] * 5
    assert run.payloads == [b"p2", b"p3", b"p4", b"p5", b"p6"]
    assert run.content_types == ["application/octet-stream"] * 5
    assert run.replies == [(2, True), (3, False), (4, True), (5, False), (6, True)]


@pytest.mark.parametrize("encoding", ["msgpack", "json"])
def test_a_burst_is_cut_into_runs_of_at_most_run_max(encoding: str) -> None:
    enc = mp if encoding == "msgpack" else js

    def frame(i: int) -> bytes:
        return enc(
            pub(i) if encoding == "msgpack" else {"op": "publish", "id": i, "channel": "/a", "text": "t"}
        )

    dec = nc.NativeStreamDecoder()
    dec.feed(frame(0))  # the channel is canonical from now on
    n = 2 * nc.RUN_MAX + 5
    items = dec.feed_runs(b"".join(frame(i) for i in range(1, n + 1)))
    assert [len(x) for x in items if isinstance(x, nc.PublishRun)] == [nc.RUN_MAX, nc.RUN_MAX, 5]
    assert [rid for x in items if isinstance(x, nc.PublishRun) for rid, _ in x.replies] == list(
        range(1, n + 1)
    )


def test_runs_hold_the_same_publishes_as_the_general_path() -> None:
    codec = nc.NativeCodec("msgpack")
    frames = [pub(1), pub(2, "/a/", ack=True), pub(3, "/%61"), pub(4)]
    dec = nc.NativeStreamDecoder()
    dec.feed(b"".join(mp({**f, "id": 0}) for f in frames))  # every channel text seen once
    items = dec.feed_runs(b"".join(map(mp, frames)))
    assert len(items) == 1 and isinstance(items[0], nc.PublishRun)
    expected = [codec.decode(mp(f)[4:]) for f in frames]
    assert items[0].commands() == expected
    assert items[0].commands(2) == expected[2:]
    assert [p.channel for p in expected if isinstance(p, nc.Publish)] == [
        "/a",
        "/a/",
        "/a",
        "/a",
    ]  # canonical


def test_other_frames_split_runs_and_keep_their_place() -> None:
    dec = nc.NativeStreamDecoder()
    dec.feed(mp(pub(0)) + mp(pub(0, "/b")))
    data = b"".join(
        [
            mp(pub(1)),
            mp(pub(2, headers={"k": "v"})),  # headers: the general path, a Publish
            mp(pub(3)),
            mp(pub(4, "/b")),
            mp({"op": "ping", "id": 5}),
            mp({"op": "publish", "id": 6, "channel": "/a"}),  # no payload: 4001
            mp(pub(7, content_type="text/plain")),
            mp(pub(8, idem="k")),
            mp(pub(9, tags=["t"])),
            mp(pub(10, extra=1)),  # an unknown field: accepted, on the general path
            mp(pub(11, "/c")),  # a channel not seen yet
            mp(pub(12, "/c")),
            mp({**pub(13), "payload": "text"}),  # a str payload: the general path
            mp(pub(14, ack=None)),
            mp(pub(15)),
        ]
    )
    items = dec.feed_runs(data)
    assert shape(items) == [
        ("run", [1]),
        ("Publish", 2),
        ("run", [3, 4]),
        ("Ping", 5),
        ("error", 4001, 6),
        ("Publish", 7),
        ("Publish", 8),
        ("Publish", 9),
        ("Publish", 10),
        ("Publish", 11),
        ("run", [12]),
        ("Publish", 13),
        ("Publish", 14),
        ("run", [15]),
    ]
    # feed() gives the very same commands, runs expanded.
    again = nc.NativeStreamDecoder()
    again.feed(mp(pub(0)) + mp(pub(0, "/b")))
    flat = again.feed(data)
    expanded: list[Any] = []
    for x in items:
        expanded += x.commands() if isinstance(x, nc.PublishRun) else [x]
    assert [(type(x), getattr(x, "id", None)) for x in flat] == [
        (type(x), getattr(x, "id", None)) for x in expanded
    ]
    assert [x for x in flat if isinstance(x, nc.Publish)] == [
        x for x in expanded if isinstance(x, nc.Publish)
    ]


@pytest.mark.parametrize(
    "frame",
    [
        {"op": "publish", "id": -1, "channel": "/a", "payload": b""},
        {"op": "publish", "id": 1 << 31, "channel": "/a", "payload": b""},
        {"op": "publish", "id": True, "channel": "/a", "payload": b""},
        {"op": "publish", "channel": "/a", "payload": b""},
        {"op": "publish", "id": 1, "channel": "/a", "payload": b"", "ack": 1},
        {"op": "publish", "id": 1, "channel": "/a", "payload": 5},
        {"op": "publish", "id": 1, "channel": ["/a"], "payload": b""},
    ],
)
def test_invalid_publishes_get_the_general_path_errors(frame: dict[str, Any]) -> None:
    codec = nc.NativeCodec("msgpack")
    with pytest.raises(BadRequest) as want:
        codec.decode(msgpack.packb(frame, use_bin_type=True))
    dec = nc.NativeStreamDecoder()
    dec.feed(mp(pub(0)))
    items = dec.feed_runs(mp(pub(1)) + mp(frame) + mp(pub(2)))
    assert shape(items) == [("run", [1]), ("error", 4001, want.value.request_id), ("run", [2])]


def test_json_runs_read_text_json_and_b64() -> None:
    dec = nc.NativeStreamDecoder()
    dec.feed(js({"op": "publish", "id": 0, "channel": "/a", "text": ""}))
    data = b"".join(
        [
            js({"op": "publish", "id": 1, "channel": "/a", "text": "hé"}),
            js({"op": "publish", "id": 2, "channel": "/a", "json": {"k": [1, 2]}, "ack": True}),
            js({"op": "publish", "id": 3, "channel": "/a", "b64": "aGk="}),
            js({"op": "publish", "id": 4, "channel": "/a", "text": "a", "b64": "aGk="}),  # two: 4001
            js({"op": "publish", "id": 5, "channel": "/a", "b64": "@@"}),  # bad base64: 4001
            js({"op": "publish", "id": 6, "channel": "/a", "payload": "x"}),  # no JSON payload field: 4001
            js({"op": "publish", "id": 7, "channel": "/a", "text": "z"}),
        ]
    )
    items = dec.feed_runs(data)
    assert shape(items) == [
        ("run", [1, 2, 3]),
        ("error", 4001, 4),
        ("error", 4001, 5),
        ("error", 4001, 6),
        ("run", [7]),
    ]
    run = items[0]
    assert isinstance(run, nc.PublishRun)
    codec = nc.NativeCodec("json")
    assert run.commands() == [codec.decode(line) for line in data.split(b"\n")[:3]]
    assert run.payloads == ["hé".encode(), b'{"k":[1,2]}', b"hi"]
    assert run.content_types == ["text/plain; charset=utf-8", "application/json", "application/octet-stream"]


def test_a_fatal_frame_ends_the_run_and_the_read() -> None:
    dec = nc.NativeStreamDecoder()
    dec.feed(mp(pub(0)))
    items = dec.feed_runs(mp(pub(1)) + mp(pub(2)) + (3).to_bytes(4, "big") + b"\xc1\xc1\xc1" + mp(pub(3)))
    assert shape(items) == [("run", [1, 2]), ("error", 4000, None)]
    assert dec.failed and dec.buffered == 0
    assert dec.feed_runs(mp(pub(4))) == []


def test_decoders_share_the_codecs_they_are_given() -> None:
    codecs: dict[nc.Encoding, nc.NativeCodec] = {
        "json": nc.NativeCodec("json"),
        "msgpack": nc.NativeCodec("msgpack"),
    }
    a = nc.NativeStreamDecoder(codecs=codecs)
    b = nc.NativeStreamDecoder(codecs=codecs)
    c = nc.NativeStreamDecoder(codecs=codecs)
    a.feed(mp(pub(1)))
    assert a.codec is codecs["msgpack"]
    # The channel a canonicalized is known to b at once: b's first read is one run.
    assert shape(b.feed_runs(mp(pub(2)) + mp(pub(3)))) == [("run", [2, 3])]
    assert b.codec is codecs["msgpack"]
    c.feed(b'{"op":"ping"}\n')
    assert c.codec is codecs["json"]


def test_own_codecs_are_not_shared() -> None:
    a, b = nc.NativeStreamDecoder(), nc.NativeStreamDecoder()
    a.feed(mp(pub(1)))
    b.feed(mp(pub(1)))
    assert a.codec is not b.codec


@pytest.mark.parametrize(
    "line",
    [
        b'{"op":"publish","id":1,"channel":"/a","text":"\\ud800","n":12345678901234567890}',
        b'{"op":"publish","id":1,"channel":"/a\\udfff","text":"x","n":12345678901234567890}',
        b'{"op":"subscribe","id":1,"sub":"\\ud800","pattern":"/a","n":12345678901234567890}',
    ],
)
def test_lone_surrogates_are_refused_on_the_long_integer_path(line: bytes) -> None:
    """JSON with a 19+ digit run is read by the standard library, which accepts escaped lone surrogates:
    they are refused as orjson refuses them, with 4000, never an exception of another kind."""
    with pytest.raises(BadFrame):
        nc.NativeCodec("json").decode(line)
    dec = nc.NativeStreamDecoder()
    assert shape(dec.feed_runs(line + b"\n")) == [("error", 4000, None)]
    # A valid surrogate pair on the same path is fine.
    pair = b'{"op":"publish","id":1,"channel":"/a","text":"\\ud83d\\ude00","n":12345678901234567890}'
    cmd = nc.NativeCodec("json").decode(pair)
    assert isinstance(cmd, nc.Publish) and cmd.payload == "😀".encode()


# -- the server process's collector settings -----------------------------------------------------------


class _Cyclic:
    def __init__(self) -> None:
        self.me = self


def test_tune_gc_freezes_startup_and_still_collects_cycles() -> None:
    old = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
        # Garbage cycles are still collected without an explicit gc.collect(), within a threshold's worth of
        # allocations.
        first = weakref.ref(_Cyclic())
        keep = [weakref.ref(_Cyclic()) for _ in range(2 * GC_THRESHOLDS[0])]
        assert first() is None
        assert sum(r() is None for r in keep) > GC_THRESHOLDS[0] // 2
    finally:
        gc.unfreeze()
        gc.set_threshold(*old)
