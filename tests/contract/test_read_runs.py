"""``LogStore.read_runs`` against every engine: the events of ``read``, grouped in runs, bounded and in one
snapshot; bad stored data never becomes a run."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from hubbub.errors import StorageError
from hubbub.events import Event, Publisher
from hubbub.log import AppendRequest, LogStore, MemoryLogStore, SqliteLogStore
from hubbub.log.base import EventRun, same_but_position
from hubbub.log.postgres import PostgresLogStore
from hubbub.log.sqlite._columns import ColumnReads


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogStore]:
    st: LogStore
    if request.param == "memory":
        st = MemoryLogStore()
    elif request.param == "postgres":
        st = PostgresLogStore(request.getfixturevalue("pg_url"))
    else:
        st = SqliteLogStore(tmp_path / "log.db")
    try:
        yield st
    finally:
        st.close()


def req(
    payload: bytes = b"x",
    *,
    app: str = "a",
    msg_id: str = "",
    headers: dict[str, str] | None = None,
    tags: tuple[str, ...] = (),
    content_type: str = "text/plain",
    channel: str = "/r",
) -> AppendRequest:
    return AppendRequest(
        channel, Publisher("native", "u", app, msg_id), payload, content_type, headers or {}, tags
    )


def flat(runs: list[EventRun]) -> list[Event]:
    return [e for r in runs for e in r.events()]


def check_runs(runs: list[EventRun]) -> None:
    """Every run is non-empty, starts with its proto's own row, and is maximal (neighbours differ)."""
    for r in runs:
        assert r.rows and r.rows[0] == (r.proto.time_ns, r.proto.payload)
    for a, b in itertools.pairwise(runs):
        last = a.events()[-1]
        assert not (b.proto.seq == last.seq + 1 and same_but_position(last, b.proto))


def test_uniform_events_are_one_run(store: LogStore) -> None:
    store.append([req(b"p%d" % i) for i in range(50)])
    runs = store.read_runs("/r", 0, 50, 1000)
    assert len(runs) == 1
    assert runs[0].proto == store.read("/r", 0, 1)[0]
    assert flat(runs) == store.read("/r", 0, 1000)


def test_mixed_events_group_exactly_as_read(store: LogStore) -> None:
    kinds = [
        req(b"1"),
        req(b"2"),
        req(b"3", app="b"),
        req(b"4", msg_id="k1"),
        req(b"5", msg_id="k2"),
        req(b"6", headers={"h": "1"}),
        req(b"7", headers={"h": "1"}),
        req(b"8", headers={"h": "2", ":filter.user_id": "u"}),
        req(b"9", tags=("t",)),
        req(b"10", tags=("t",)),
        req(b"11", content_type="application/json"),
        req(b"12"),
        req(b"13"),
    ]
    store.append([req(b"other", channel="/other")])
    store.append(kinds)
    store.append([req(b"other", channel="/other")])
    runs = store.read_runs("/r", 0, 13, 1000)
    check_runs(runs)
    assert flat(runs) == store.read("/r", 0, 1000)
    assert [len(r.rows) for r in runs] == [2, 1, 1, 1, 2, 1, 2, 1, 2]


def test_bounds(store: LogStore) -> None:
    store.append([req(b"%d" % i, app="a" if i % 3 else "b") for i in range(1, 21)])
    assert [e.seq for e in flat(store.read_runs("/r", 3, 7, 100))] == [4, 5, 6, 7]
    assert [e.seq for e in flat(store.read_runs("/r", 3, 20, 2))] == [4, 5]
    assert [e.seq for e in flat(store.read_runs("/r", 18, 1000, 100))] == [19, 20]
    assert store.read_runs("/r", 5, 5, 100) == []
    assert store.read_runs("/r", 7, 3, 100) == []
    assert store.read_runs("/r", 0, 20, 0) == []
    assert store.read_runs("/r", 20, 30, 100) == []
    assert store.read_runs("/nope", 0, 10, 100) == []
    for after in range(0, 20, 3):
        for up_to in (after + 1, after + 5, 20):
            assert flat(store.read_runs("/r", after, up_to, 4)) == [
                e for e in store.read("/r", after, 4) if e.seq <= up_to
            ]


def test_trimmed_and_reset_channels(store: LogStore) -> None:
    store.append([req(b"%d" % i) for i in range(10)])
    store.trim("/r", 6)
    assert [e.seq for e in flat(store.read_runs("/r", 2, 10, 100))] == [7, 8, 9, 10]
    old = store.head("/r").epoch
    info = store.reset_channel("/r")
    assert store.read_runs("/r", 0, 10, 100) == []
    store.append([req(b"new")])
    runs = store.read_runs("/r", 0, 10, 100)
    assert [(e.seq, e.epoch, e.payload) for e in flat(runs)] == [(1, info.epoch, b"new")]
    assert info.epoch != old


def test_sqlite_bad_stored_columns_are_a_storage_error(tmp_path: Path) -> None:
    st = SqliteLogStore(tmp_path / "log.db")
    try:
        st.append([req(b"%d" % i) for i in range(6)])
        with sqlite3.connect(tmp_path / "log.db") as db:
            # Row 4 differs from the page's first row, so it is read and decoded on its own.
            db.execute("UPDATE events SET headers = x'c1' WHERE seq = 4")
        with pytest.raises(StorageError):
            st.read_runs("/r", 0, 6, 100)
        assert [e.seq for e in flat(st.read_runs("/r", 0, 3, 100))] == [1, 2, 3]
        with pytest.raises(StorageError):
            st.read_runs("/r", 3, 6, 100)  # the page's first row itself
    finally:
        st.close()


def test_postgres_bad_stored_columns_are_a_storage_error(pg_url: str) -> None:
    st = PostgresLogStore(pg_url)
    try:
        st.append([req(b"%d" % i) for i in range(6)])
        with psycopg.connect(pg_url, autocommit=True) as db:
            db.execute("UPDATE events SET headers = '\\xc1'::bytea WHERE seq = 4")
        with pytest.raises(StorageError) as err:
            st.read_runs("/r", 0, 6, 100)
        assert "UPDATE" not in str(err.value) and "SELECT" not in str(err.value)
        assert [e.seq for e in flat(st.read_runs("/r", 0, 3, 100))] == [1, 2, 3]
        with pytest.raises(StorageError):
            st.read_runs("/r", 3, 6, 100)
        with pytest.raises(StorageError):
            st.read("/r")
    finally:
        st.close()


def test_read_runs_pages_are_bounded_in_payload_bytes_too(store: LogStore) -> None:
    """``read_runs(max_bytes=...)``: a page ends with the event that brings its payloads to the budget (at
    least one event, however large); paging on after the last seq got gives every event once, in order,
    whole, in runs or not; without a budget a page is bounded by ``limit`` alone."""
    sizes = [100, 300, 50, 1000, 10, 10, 10, 400, 5, 700]
    apps = ["a"] * 6 + ["b"] * 4  # two runs: the budget cuts both the one-run read and the grouped one
    written = [
        r.event
        for r in store.append(
            [req(bytes([i]) * n, app=a) for i, (n, a) in enumerate(zip(sizes, apps, strict=True))]
        )
    ]
    store.append([req(b"y" * 5000, channel="/other")])  # another channel: never counted against a page
    assert [len(e.payload) for e in flat(store.read_runs("/r", 0, 10, 100, max_bytes=400))] == [100, 300]
    assert [len(e.payload) for e in flat(store.read_runs("/r", 2, 10, 100, max_bytes=1))] == [50]
    assert [len(e.payload) for e in flat(store.read_runs("/r", 0, 10, 100, max_bytes=0))] == [100]
    assert flat(store.read_runs("/r", 0, 10, 100, max_bytes=10_000)) == written
    assert len(flat(store.read_runs("/r", 0, 10, 100))) == 10
    assert len(flat(store.read_runs("/r", 0, 10, 3, max_bytes=10_000))) == 3
    assert [len(e.payload) for e in flat(store.read_runs("/r", 0, 5, 100, max_bytes=10_000))] == sizes[:5]
    got: list[Event] = []
    pages: list[list[int]] = []
    after = 0
    while after < 10:
        runs = store.read_runs("/r", after, 10, 4, max_bytes=500)
        check_runs(runs)
        page = flat(runs)
        pages.append([len(e.payload) for e in page])
        assert page and sum(pages[-1][:-1]) < 500  # stops at the event that reaches the budget
        got += page
        after = page[-1].seq
    assert pages == [[100, 300, 50, 1000], [10, 10, 10, 400], [5, 700]]
    assert got == written


def test_sqlite_pages_under_a_budget_read_their_rows_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite ends a page under a byte budget while it reads it: a page within the budget runs the
    statements of a page without one (no pass over the rows for their payload sizes), and a page the budget
    ends adds one count of its rows, which reads no payload. (A page SQLite reads as columns instead, in
    one statement, is cut to the budget before it is read: ``tests/unit/test_sqlite_run_columns.py``.)"""
    store = SqliteLogStore(tmp_path / "log.db")
    monkeypatch.setattr(ColumnReads, "rows", lambda *args: None)
    try:
        written = [r.event for r in store.append([req(bytes([i]) * 16) for i in range(50)])]
        statements: list[str] = []
        store._reader().set_trace_callback(statements.append)
        assert flat(store.read_runs("/r", 0, 50, 100)) == written
        plain, statements[:] = list(statements), []
        assert flat(store.read_runs("/r", 0, 50, 100, max_bytes=16 * 50)) == written
        assert statements == plain
        statements.clear()
        assert flat(store.read_runs("/r", 0, 50, 100, max_bytes=16 * 10)) == written[:10]
        extra = [s for s in statements if s not in plain]
        assert len(statements) == len(plain) + 1 and len(extra) == 1
        assert extra[0].startswith("SELECT count(*)") and "payload" not in extra[0]
    finally:
        store.close()
