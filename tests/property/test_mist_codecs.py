"""Hypothesis over the mist state machines (protocols/mist.md; STYLE.md item 3): parsing does not depend on
chunking, any input is accepted or answered with a documented reply, and the subscription tables follow a
model (2015 reference counts, 1.x sets) through random command sequences."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import mist as md
from hubbub.disconnect import Disconnect
from tests.hypothesis_budget import examples

TAG = st.text(alphabet="abcxyz,é \n", min_size=0, max_size=4)
TAGS = st.lists(st.text(alphabet="abcd", min_size=1, max_size=2), min_size=1, max_size=4)
NAMES = st.sampled_from(
    ["ping", "subscribe", "unsubscribe", "publish", "list", "enable-replication", "register", "unregister",
     "set", "unset", "tags", "auth", "pong", ""]
)  # fmt: skip


COMMANDS_1X = st.sampled_from(
    ["ping", "subscribe", "unsubscribe", "publish", "list", "listall", "who", "auth", "x"]
)


@st.composite
def lines_2015(draw: st.DrawFn) -> bytes:
    out = []
    for _ in range(draw(st.integers(0, 8))):
        fields = [draw(NAMES), *draw(st.lists(TAG, max_size=3))]
        out.append(" ".join(fields).encode() + draw(st.sampled_from([b"\n", b"\r\n", b"\n"])))
    return b"".join(out) + draw(st.binary(max_size=20))


@st.composite
def stream_1x(draw: st.DrawFn) -> bytes:
    out = []
    for _ in range(draw(st.integers(0, 6))):
        msg: dict[str, Any] = {"command": draw(COMMANDS_1X)}
        if draw(st.booleans()):
            msg["tags"] = draw(st.one_of(TAGS, st.just([]), st.just([1])))
        if draw(st.booleans()):
            msg["data"] = draw(st.one_of(st.text(max_size=5), st.integers()))
        out.append(json.dumps(msg).encode() + draw(st.sampled_from([b"", b" ", b"\n", b"\r\n\t"])))
    return b"".join(out)


def cuts(data: bytes, points: list[int]) -> list[bytes]:
    idx = sorted({min(p, len(data)) for p in points})
    bounds = [0, *idx, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def run(conn: Any, pieces: list[bytes]) -> list[Any]:
    out: list[Any] = []
    for piece in pieces:
        got = conn.receive_data(piece)
        while got:
            out += got
            got = conn.auth_result(md.MistGrant()) if conn.awaiting_auth else []
    return out


def conn_2015(auth: bool) -> md.Mist2015Connection:
    return md.Mist2015Connection(max_frame=64, max_subscriptions=3, max_tags=4, auth_required=auth)


def conn_1x(auth: bool) -> md.Mist1Connection:
    return md.Mist1Connection(max_frame=96, max_subscriptions=3, max_tags=4, auth_required=auth)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.one_of(lines_2015(), st.binary(max_size=200)), st.lists(st.integers(0, 300), max_size=6), st.booleans()
)
def test_2015_lines_do_not_depend_on_chunking(data: bytes, points: list[int], auth: bool) -> None:
    whole = run(conn_2015(auth), [data])
    assert run(conn_2015(auth), cuts(data, points)) == whole
    assert run(conn_2015(auth), [data[i : i + 1] for i in range(len(data))]) == whole
    for out in whole:
        if isinstance(out, md.Send):
            assert out.data.startswith((b"pong\n", b"list ", b"error ")) and out.data.endswith(b"\n")
    if whole and isinstance(whole[-1], md.Close):
        assert sum(isinstance(o, md.Close) for o in whole) == 1


@settings(max_examples=examples(300), deadline=None)
@given(
    st.one_of(stream_1x(), st.binary(max_size=200)), st.lists(st.integers(0, 300), max_size=6), st.booleans()
)
def test_1x_stream_does_not_depend_on_chunking(data: bytes, points: list[int], auth: bool) -> None:
    whole = run(conn_1x(auth), [data])
    assert run(conn_1x(auth), cuts(data, points)) == whole
    assert run(conn_1x(auth), [data[i : i + 1] for i in range(len(data))]) == whole
    for out in whole:
        if isinstance(out, md.Send):
            assert out.data.endswith(b"\n") and isinstance(json.loads(out.data)["command"], str)


@settings(max_examples=examples(200), deadline=None)
@given(stream_1x(), st.binary(max_size=30))
def test_1x_trailing_data_only_adds_outputs(data: bytes, trailing: bytes) -> None:
    """What a prefix of the stream produces is a prefix of what the whole stream produces."""
    first = run(conn_1x(False), [data])
    assert run(conn_1x(False), [data + trailing])[: len(first)] == first


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.booleans(), TAGS), max_size=30))
def test_2015_reference_counts_follow_a_model(ops: list[tuple[bool, list[str]]]) -> None:
    conn = md.Mist2015Connection(max_subscriptions=1000)
    model: Counter[frozenset[str]] = Counter()
    order: list[frozenset[str]] = []
    for sub, tags in ops:
        key = frozenset(tags)
        line = ("subscribe " if sub else "unsubscribe ") + ",".join(tags) + "\n"
        out = conn.receive_data(line.encode())
        if sub:
            model[key] += 1
            if model[key] == 1:
                order.append(key)
                assert out == [md.Subscribe(key)]
            else:
                assert out == []
        elif model[key]:
            model[key] -= 1
            if not model[key]:
                del model[key]
                order.remove(key)
                assert out == [md.Unsubscribe(key)]
            else:
                assert out == []
        else:
            assert out == []
    listed = conn.receive_data(b"list\n")
    expect = b"list " + b" ".join(",".join(sorted(k, reverse=True)).encode() for k in order) + b"\n"
    assert listed == [md.Send(expect)]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.booleans(), TAGS), max_size=30))
def test_1x_subscriptions_are_a_set(ops: list[tuple[bool, list[str]]]) -> None:
    conn = md.Mist1Connection(max_subscriptions=1000)
    order: list[frozenset[str]] = []
    for sub, tags in ops:
        key = frozenset(tags)
        out = conn.receive_data(
            json.dumps({"command": "subscribe" if sub else "unsubscribe", "tags": tags}).encode()
        )
        if sub and key not in order:
            order.append(key)
            assert out == [md.Subscribe(key)]
        elif not sub and key in order:
            order.remove(key)
            assert out == [md.Unsubscribe(key)]
        else:
            assert out == []
    data = " ".join(",".join(sorted(k)) for k in order)
    assert conn.receive_data(b'{"command":"list"}') == [md.Send(md.render_reply("list", data=data))]


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.binary(max_size=120), st.text(max_size=60).map(str.encode)), st.booleans())
def test_websocket_frames_get_a_documented_reply(frame: bytes, binary: bool) -> None:
    for conn in (
        md.Mist2015WsConnection(max_frame=100, max_tags=4),
        md.Mist1WsConnection(max_frame=100, max_tags=4),
    ):
        outs = conn.receive_frame(frame, binary=binary)
        if len(frame) > 100:
            assert outs == [md.Close(Disconnect.MESSAGE_TOO_BIG)]
            continue
        for out in outs:
            if isinstance(out, md.Send):
                assert isinstance(json.loads(out.data), dict)
            else:
                assert not isinstance(out, md.Close)
