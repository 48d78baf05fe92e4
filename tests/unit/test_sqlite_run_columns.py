"""SQLite's replay pages read as columns (``log/sqlite/_columns.py``): exactly the runs the row-by-row read
gives, over arbitrary payload bytes (NUL bytes, bytes that are not UTF-8, empty ones), shapes that change
within a page, payload sizes that differ, small times, interleaved channels, limits and byte budgets."""

from __future__ import annotations

import pickle
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from hubbub.dialects.native_columns import run_batches, run_frames
from hubbub.dialects.native_common import event_frames, pack_batches
from hubbub.events import Publisher
from hubbub.log import AppendRequest, AppendRun, SqliteLogStore
from hubbub.log.base import EventRun
from hubbub.log.sqlite._columns import ColumnReads
from hubbub.run_columns import STAMP, RunColumns
from tests.hypothesis_budget import examples

# One event to write: (payload size or None for an arbitrary one, shape, channel).
_SHAPES = [
    ("native", "u", "a", "", "application/octet-stream", {}, ()),
    ("native", "u", "b", "", "application/octet-stream", {}, ()),
    ("native", "u", "a", "m1", "application/octet-stream", {}, ()),
    ("native", "u", "a", "", "text/plain", {}, ()),
    ("native", "u", "a", "", "application/octet-stream", {"h": "1"}, ()),
    ("native", "u", "a", "", "application/octet-stream", {}, ("t",)),
]


def _req(payload: bytes, shape: int, channel: str) -> AppendRequest:
    dialect, user, app, msg_id, ctype, headers, tags = _SHAPES[shape]
    return AppendRequest(channel, Publisher(dialect, user, app, msg_id), payload, ctype, headers, tags)


@st.composite
def logs(draw: st.DrawFn) -> list[AppendRequest | AppendRun]:
    """Stretches of events, mostly of one payload size and one shape (the column path's pages), payloads of
    any bytes; and inside them what a page must not take as its run: one event of another shape, two
    events whose sizes differ from the stretch's but add up to twice it, one of any size; now and then
    another channel's event between; and stretches appended as one publisher's run (``AppendRun``)."""
    out: list[AppendRequest | AppendRun] = []
    size = draw(st.sampled_from([0, 1, 16, 33, 257, 2049]))
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 3)) == 0:
            size = draw(st.sampled_from([0, 1, 16, 33, 257, 2049]))
        shape = draw(st.sampled_from([0, 0, 0, 1, 2, 3, 4, 5]))
        if shape < 4 and draw(st.integers(0, 3)) == 0:
            # One connection's burst, appended as one run (no headers or tags: the shapes before 4).
            dialect, user, app, msg_id, ctype, _, _ = _SHAPES[shape]
            sizes = draw(st.lists(st.sampled_from([size, size, size, size + 1]), min_size=1, max_size=40))
            payloads = [draw(st.binary(min_size=k, max_size=k)) for k in sizes]
            out.append(AppendRun("/r", Publisher(dialect, user, app, msg_id), ctype, payloads))
            continue
        i, n = 0, draw(st.integers(1, 40))
        while i < n:
            odd = draw(st.sampled_from(["shape", "pair", "any", *["same"] * 9]))
            channel = "/other" if draw(st.integers(0, 19)) == 0 else "/r"
            if odd == "shape":  # another shape, same size
                other = draw(st.sampled_from([k for k in range(len(_SHAPES)) if k != shape]))
                out.append(_req(draw(st.binary(min_size=size, max_size=size)), other, channel))
            elif odd == "pair" and size:  # two sizes that make up the stretch's
                out.append(_req(draw(st.binary(min_size=size - 1, max_size=size - 1)), shape, "/r"))
                out.append(_req(draw(st.binary(min_size=size + 1, max_size=size + 1)), shape, "/r"))
                i += 1
            elif odd == "any":
                out.append(_req(draw(st.binary(max_size=40)), shape, channel))
            else:
                out.append(_req(draw(st.binary(min_size=size, max_size=size)), shape, channel))
            i += 1
    return out


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteLogStore]:
    st = SqliteLogStore(tmp_path / "log.db")
    try:
        yield st
    finally:
        st.close()


def _pages(store: SqliteLogStore, limit: int, max_bytes: int | None) -> list[EventRun]:
    """Every run of ``/r`` read page by page, as a replay reads it."""
    top = store.head("/r").top
    out: list[EventRun] = []
    after = 0
    while after < top:
        runs = store.read_runs("/r", after, top, limit, max_bytes=max_bytes)
        assert runs
        out += runs
        after = runs[-1].last_seq
    return out


def _never(*args: object) -> None:
    return None


def _row_by_row(store: SqliteLogStore, limit: int, max_bytes: int | None) -> list[EventRun]:
    """:func:`_pages` without the column path: every page read row by row."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ColumnReads, "rows", _never)
        return _pages(store, limit, max_bytes)


def _same_runs(got: list[EventRun], want: list[EventRun]) -> None:
    assert [r.proto for r in got] == [r.proto for r in want]
    assert [list(r.rows) for r in got] == [list(r.rows) for r in want]
    for r in got:
        assert all(type(t) is int and type(p) is bytes for t, p in r.rows)


@settings(max_examples=examples(60), deadline=None)
@given(
    events=logs(),
    limit=st.sampled_from([1, 3, 7, 2048]),
    max_bytes=st.one_of(st.none(), st.integers(0, 2000)),
    small_times=st.booleans(),
)
def test_column_pages_are_the_row_by_row_pages(
    tmp_path_factory: pytest.TempPathFactory,
    events: list[AppendRequest | AppendRun],
    limit: int,
    max_bytes: int | None,
    small_times: bool,
) -> None:
    path = tmp_path_factory.mktemp("cols") / "log.db"
    store = SqliteLogStore(path)
    try:
        store.append(events)
        if small_times:
            # Times below 2**32 (never a wall clock's, but a time is any int64): a page holding one is read
            # row by row.
            with sqlite3.connect(path) as conn:
                conn.execute("UPDATE events SET time_ns = pos * 1000 WHERE pos % 3 = 0")
        if not store.head("/r").top:
            return
        want = _row_by_row(store, limit, max_bytes)
        got = _pages(store, limit, max_bytes)
        _same_runs(got, want)
        event("a page read as columns" if any(type(r.rows) is RunColumns for r in got) else "row by row only")
        for r in got:  # and the frames the replay sends of them
            for replay in (True, False):
                assert run_batches("msgpack", r.proto, r.rows, ("s",), replay, 700) == pack_batches(
                    "msgpack", event_frames("msgpack", r.proto, list(r.rows), ("s",), replay), 700
                )
                assert run_frames("json", r.proto, r.rows, ("s",), replay) == event_frames(
                    "json", r.proto, list(r.rows), ("s",), replay
                )
    finally:
        store.close()


def test_a_page_of_one_size_and_shape_is_read_as_columns(
    store: SqliteLogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual replay page (one publisher, one payload size) comes as columns, in one statement over its
    rows, whatever bytes its payloads hold; the byte budget ends it at the same row as before."""
    payloads = [bytes([i % 256, 0, 0xFF, 0xC3, 0x28, 0, i // 256]) + b"\x00" * 9 for i in range(300)]
    written = [r.event for r in store.append([_req(p, 0, "/r") for p in payloads])]
    statements: list[str] = []
    store._reader().set_trace_callback(statements.append)
    runs = store.read_runs("/r", 0, 300, 2048, max_bytes=4 << 20)
    assert len(runs) == 1 and isinstance(runs[0].rows, RunColumns)
    assert runs[0].events() == written
    aggregates = [s for s in statements if "group_concat" in s]
    assert len(aggregates) == 1 and "pos BETWEEN" in aggregates[0]  # one channel's rows: a range of the table
    cut = store.read_runs("/r", 10, 300, 2048, max_bytes=16 * 20 + 1)
    assert isinstance(cut[0].rows, RunColumns)
    assert [e.seq for r in cut for e in r.events()] == list(range(11, 32))  # the 21st reaches the budget
    with monkeypatch.context() as m:
        m.setattr(ColumnReads, "rows", _never)
        _same_runs(cut, store.read_runs("/r", 10, 300, 2048, max_bytes=16 * 20 + 1))


def test_interleaved_channels_read_their_page_by_the_index(store: SqliteLogStore) -> None:
    reqs = [_req(b"%015d" % i, 0, "/r" if i % 2 else "/o") for i in range(200)]
    written = [r.event for r in store.append(reqs) if r.event.channel == "/r"]
    statements: list[str] = []
    store._reader().set_trace_callback(statements.append)
    runs = store.read_runs("/r", 0, 100, 2048)
    assert len(runs) == 1 and isinstance(runs[0].rows, RunColumns)
    assert runs[0].events() == written
    assert [s for s in statements if "group_concat" in s and "seq BETWEEN" in s]


def test_run_columns_are_the_rows_they_hold() -> None:
    rows = [(1 << 40, b"ab"), (-5, b"\x00\x00"), ((1 << 63) - 1, b"\xff\xfe")]
    cols = RunColumns(b"".join(STAMP.pack(t) for t, _ in rows), b"".join(p for _, p in rows), 2)
    assert cols == rows and rows == cols and list(cols) == rows and len(cols) == 3
    assert cols[1] == rows[1] and cols[-1] == rows[-1] and cols[1:] == rows[1:] and cols[::2] == rows[::2]
    assert cols[5:] == [] and list(cols[-2:]) == rows[-2:]
    assert pickle.loads(pickle.dumps(cols)) == rows
    assert cols.times() == [t for t, _ in rows] and cols.payload_list() == [p for _, p in rows]
    assert RunColumns(STAMP.pack(1) * 2, b"", 0) == [(1, b""), (1, b"")]
    with pytest.raises(IndexError):
        cols[3]
    with pytest.raises(ValueError):
        RunColumns(b"\x00" * 8, b"abc", 2)
    assert msgpack.unpackb(msgpack.packb(list(cols))) == [list(r) for r in rows]


def test_a_channel_whose_pages_do_not_qualify_is_seldom_tried(store: SqliteLogStore) -> None:
    """A page whose rows are not one size (or one shape) is read row by row after its aggregate found so;
    the channel's next pages are read row by row without one, a run of pages longer after each miss, and a
    page that qualifies again resets it."""
    store.append([_req(bytes(16 + i % 2), 0, "/r") for i in range(400)])
    statements: list[str] = []
    store._reader().set_trace_callback(statements.append)
    tried = []
    for after in range(0, 400, 10):
        statements.clear()
        runs = store.read_runs("/r", after, 400, 10)
        assert [e.seq for r in runs for e in r.events()] == list(range(after + 1, after + 11))
        tried.append(any("group_concat" in s for s in statements))
    assert tried[:8] == [True, False, True, False, False, True, False, False] and sum(tried) <= 8


def test_a_page_past_sqlites_string_limit_is_read_row_by_row(store: SqliteLogStore) -> None:
    """A page without a byte budget whose payloads together pass SQLite's length limit (a connection's
    ``SQLITE_LIMIT_LENGTH``, 1e9 by default) cannot be concatenated: it is read row by row, whole."""
    written = [r.event for r in store.append([_req(bytes([i]) * 1000, 0, "/r") for i in range(20)])]
    store._reader().setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 5000)
    runs = store.read_runs("/r", 0, 20, 100)
    assert [type(r.rows) for r in runs] == [list]
    assert runs[0].events() == written
