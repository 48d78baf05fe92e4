"""The durable-consumer side of the ``LogStore`` contract (``hubbub/log/consumers.py``), on every engine.

Every test runs on ``memory``, ``sqlite`` and ``postgres`` (a real server, ``tests/conftest.py``, a fresh
database per test); tests that reopen a store skip the memory engine. The crash tests run the store in a
child process and kill it with SIGKILL, then reopen the file or database in the test process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import psycopg
import pytest

from hubbub.errors import BadChannel, BadRequest
from hubbub.events import Event, Publisher
from hubbub.log import AppendRequest, LogStore, RetentionPolicy
from hubbub.log.consumers import SEPARATED, ConsumerSpec, JournalItem, Retry, check_name
from hubbub.log.postgres import PostgresLogStore
from hubbub.log.sqlite import SqliteLogStore
from tests.contract.test_log_stores import NS, Factory, req

ENGINES = ["memory", "sqlite-commit", "sqlite-fsync", "postgres-commit"]


@pytest.fixture(params=ENGINES)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    engine: str = request.param
    pg_url = request.getfixturevalue("pg_url") if engine.startswith("postgres") else ""
    f = Factory(engine, tmp_path, pg_url)
    try:
        yield f
    finally:
        f.close_all()


@pytest.fixture
def store(factory: Factory) -> LogStore:
    return factory.open()


def spec(name: str = "c", pattern: str = "/a/**", **kw: object) -> ConsumerSpec:
    return ConsumerSpec(name, pattern, **kw)  # type: ignore[arg-type]  # kw: ConsumerSpec's own fields


def items(store: LogStore, cid: int) -> list[tuple[int, str, int, bytes]]:
    return [
        (i.pos, i.event.channel, i.event.seq, i.event.payload) for i in store.consumer_items(cid, limit=10**6)
    ]


# -- definitions ------------------------------------------------------------------------------------------


def test_create_is_idempotent_and_keeps_the_first_spec(store: LogStore) -> None:
    info, created = store.consumer_create(spec("c", "/a/**", shared=True, batch_wait_ms=7, batch_bytes=99))
    assert created and info.top == 0 and info.pending == 0 and info.created_ns > 0
    again, created2 = store.consumer_create(spec("c", "/other"))
    assert not created2
    assert again.id == info.id and again.spec == info.spec
    assert again.spec.shared and again.spec.batch_wait_ms == 7 and again.spec.batch_bytes == 99
    store.consumer_create(spec("b", "foo.*", syntax=SEPARATED, tags=("t",)))
    assert [c.spec.name for c in store.consumers()] == ["b", "c"]
    assert store.consumers()[0].spec == spec("b", "foo.*", syntax=SEPARATED, tags=("t",))


def test_bad_filters_create_nothing(store: LogStore) -> None:
    with pytest.raises(BadChannel):
        store.consumer_create(spec("c", "no-slash"))
    with pytest.raises(BadChannel):
        store.consumer_create(spec("c", "*.x.*", syntax=SEPARATED))
    with pytest.raises(BadRequest):
        store.consumer_create(spec("c", "/a", syntax="nope"))
    for bad in (
        spec("bad name"),
        spec(batch_bytes=0),
        spec(batch_wait_ms=-1),
        spec("c", "a.*", syntax=SEPARATED, separator="*"),
    ):
        with pytest.raises(BadRequest):
            store.consumer_create(bad)
    assert store.consumers() == []
    store.append([req("/a/b")])
    assert store.consumers() == []


def test_names_are_checked() -> None:
    assert check_name("a.B-9_z") == "a.B-9_z"
    for bad in ("", "a b", "x" * 129, "é", "a/b"):
        with pytest.raises(BadRequest):
            check_name(bad)


def test_delete_removes_the_journal_and_a_new_one_starts_over(store: LogStore) -> None:
    old, _ = store.consumer_create(spec())
    store.append([req("/a/1"), req("/a/2")])
    assert store.consumer_delete("c") is True
    assert store.consumer_delete("c") is False
    assert store.consumers() == [] and store.consumer_items(old.id) == []
    store.append([req("/a/3")])
    new, created = store.consumer_create(spec())
    assert created and new.id != old.id
    store.append([req("/a/4")])
    assert items(store, new.id) == [(1, "/a/4", 1, b"x")]


def test_delete_by_id_keeps_a_newer_consumer_of_the_same_name(store: LogStore) -> None:
    """A delete checked against one consumer names its id: the consumer created again under that name
    meanwhile (another owner, another journal) is not the one deleted."""
    old, _ = store.consumer_create(spec("c", owner="alice"))
    assert store.consumer_delete("c", old.id) is True
    new, created = store.consumer_create(spec("c", owner="bob"))
    assert created and new.id != old.id
    store.append([req("/a/1")])
    assert store.consumer_delete("c", old.id) is False
    assert [(c.id, c.spec.owner, c.pending) for c in store.consumers()] == [(new.id, "bob", 1)]
    assert items(store, new.id) == [(1, "/a/1", 1, b"x")]
    assert store.consumer_delete("other", new.id) is False
    assert store.consumer_delete("c", new.id) is True
    assert store.consumers() == []


# -- journaling ---------------------------------------------------------------------------------------------


def test_append_journals_matching_events_in_the_same_commit(store: LogStore) -> None:
    a, _ = store.consumer_create(spec("a", "/a/**"))
    b, _ = store.consumer_create(spec("b", "/a/x"))
    res = store.append([req("/a/x", b"1"), req("/b", b"2"), req("/a/y", b"3"), req("/a/x", b"4")])
    assert [r.journal for r in res] == [((a.id, 1), (b.id, 1)), (), ((a.id, 2),), ((a.id, 3), (b.id, 2))]
    assert items(store, a.id) == [(1, "/a/x", 1, b"1"), (2, "/a/y", 1, b"3"), (3, "/a/x", 2, b"4")]
    assert items(store, b.id) == [(1, "/a/x", 1, b"1"), (2, "/a/x", 2, b"4")]
    got = store.consumer_items(a.id)[0]
    assert got.event == res[0].event and got.attempts == 0 and got.not_before_ns == 0
    info = {c.spec.name: c for c in store.consumers()}
    assert (info["a"].top, info["a"].pending, info["a"].bytes) == (3, 3, 3)
    assert (info["b"].top, info["b"].pending) == (2, 2)


def test_the_journal_keeps_every_field(store: LogStore) -> None:
    c, _ = store.consumer_create(spec("c", "/**"))
    r = store.append(
        [
            req(
                "/chat/ü",
                b"\x00\xff",
                headers={"k": "v", ":p": "q"},
                tags=("z", "a"),
                content_type="x/y",
                idem="m",
            )
        ]
    )[0]
    assert store.consumer_items(c.id) == [JournalItem(1, r.event)]


def test_a_mixed_append_journals_every_field_of_every_event(store: LogStore) -> None:
    """One append of long runs of alike events (SQLite binds their shared columns once) interleaved with
    events that differ in each shared column, for two consumers: every item is its event, field for field,
    at the position the append reported."""
    every, tagged = (
        store.consumer_create(spec("e", "/**"))[0],
        store.consumer_create(spec("t", "/**", tags=("t",)))[0],
    )
    variants = [
        req("/a/y", b"v1"),
        req("/a/x", b"v2", user="bob"),
        req("/a/x", b"v3", content_type="x/y"),
        req("/a/x", b"v4", headers={"k": "v"}),
        req("/a/x", b"v5", tags=("t",)),
        req("/a/x", b"v6", idem="m1"),
    ]
    batch = [req("/a/x", bytes([i]), tags=("t",) if i % 2 else ()) for i in range(30)]
    batch[5:5] = variants
    batch += [req("/a/x", bytes([i]), tags=("t",), idem=f"k{i}") for i in range(20)]
    # Requests sharing their publisher, channel, content type and tags objects (one connection's burst),
    # one field changed at a time, each change alone between runs of the shared shape.
    pub, tags, ctype = Publisher("native", "carol", "app2", ""), ("t",), "a/b"
    shared = [AppendRequest("/a/z", pub, bytes([i]), ctype, tags=tags) for i in range(12)]
    changed = [
        AppendRequest("/a/w", pub, b"c1", ctype, tags=tags),
        AppendRequest("/a/z", Publisher("native", "dave", "app2", ""), b"c2", ctype, tags=tags),
        AppendRequest("/a/z", pub, b"c3", "a/c", tags=tags),
        AppendRequest("/a/z", pub, b"c4", ctype, tags=("t", "u")),
        AppendRequest("/a/z", pub, b"c5", ctype, headers={"h": "1"}, tags=tags),
        AppendRequest("/a/z", pub, b"c6", ctype, headers={"h": "2"}, tags=tags),
        AppendRequest("/a/z", pub, b"c7", ctype),
    ]
    batch += shared[:3]
    for c in changed:
        batch += [c, *shared[:3]]
    batch += shared
    results = store.append(batch)
    expect: dict[int, list[JournalItem]] = {every.id: [], tagged.id: []}
    for r in results:
        assert len(r.journal) == (2 if "t" in r.event.tags else 1)
        for cid, pos in r.journal:
            expect[cid].append(JournalItem(pos, r.event))
    assert store.consumer_items(every.id, limit=1000) == expect[every.id]
    assert store.consumer_items(tagged.id, limit=1000) == expect[tagged.id]
    assert [i.pos for i in expect[every.id]] == list(range(1, len(batch) + 1))
    assert {i.event.publisher.user for i in expect[tagged.id]} == {"alice", "carol", "dave"}


def test_bursts_with_unmatched_events_and_duplicates_between_them(store: LogStore) -> None:
    """Runs of alike events (SQLite builds a run's key once per burst) broken by events no consumer matches,
    by duplicates, by another dialect and by events that only one of three consumers matches: each consumer
    gets exactly its events, in order, at the positions the append reported, field for field."""
    a = store.consumer_create(spec("a", "/a/**"))[0]
    x = store.consumer_create(spec("x", "/a/x"))[0]
    q = store.consumer_create(spec("q", "/a/**", tags=("q",)))[0]
    store.append([req("/a/x", b"first", idem="d1")])
    pub, other = Publisher("native", "u", "app", ""), Publisher("qpubs", "u", "app", "")
    burst = [AppendRequest("/a/x", pub, bytes([i]), "t/p") for i in range(10)]
    batch = [
        *burst[:4],
        AppendRequest("/b/x", pub, b"none", "t/p"),
        *burst[4:6],
        req("/a/x", b"again", idem="d1"),  # a duplicate: journaled before, not again
        *burst[6:8],
        AppendRequest("/a/x", other, b"other dialect", "t/p"),
        AppendRequest("/a/y", pub, b"not x", "t/p"),
        AppendRequest("/a/x", pub, b"tagged", "t/p", tags=("q",)),
        *burst[8:],
        AppendRequest("/b/x", pub, b"none again", "t/p"),
    ]
    results = store.append(batch)
    expect: dict[int, list[JournalItem]] = {a.id: [], x.id: [], q.id: []}
    for r in results:
        if r.duplicate:
            assert r.journal == ()
            continue
        ch, tags = r.event.channel, r.event.tags
        want = [c.id for c, ok in ((a, ch.startswith("/a/")), (x, ch == "/a/x"), (q, "q" in tags)) if ok]
        assert [cid for cid, _ in r.journal] == want
        for cid, pos in r.journal:
            expect[cid].append(JournalItem(pos, r.event))
    for c in (a, x, q):
        got = store.consumer_items(c.id, limit=1000)
        assert got[-len(expect[c.id]) :] == expect[c.id]
        assert [i.pos for i in got] == list(range(1, len(got) + 1))
    assert [i.event.payload for i in expect[q.id]] == [b"tagged"]
    assert len(expect[x.id]) == 10 + 2 and len(expect[a.id]) == 10 + 3


def test_only_events_after_creation_are_journaled(store: LogStore) -> None:
    store.append([req("/a/1")])
    c, _ = store.consumer_create(spec())
    store.append([req("/a/1"), req("/a/2")])
    assert items(store, c.id) == [(1, "/a/1", 2, b"x"), (2, "/a/2", 1, b"x")]


def test_duplicates_are_not_journaled_again(store: LogStore) -> None:
    c, _ = store.consumer_create(spec())
    first = store.append([req("/a/1", idem="k1")])
    again = store.append([req("/a/1", idem="k1")])
    assert first[0].journal == ((c.id, 1),)
    assert again[0].duplicate and again[0].journal == ()
    assert [i.pos for i in store.consumer_items(c.id)] == [1]


#: Consumers as a store held them before its syntaxes were named for what they are (``ConsumerSpec.to_json``
#: then): a qpubs topic's consumer stored its syntax as ``qpubs``.
STORED_AS_QPUBS: Final = {
    "head": '{"batch_bytes":2097152,"batch_wait_ms":5,"pattern":"foo.*","separator":".","shared":false,'
    '"syntax":"qpubs","tags":[]}',
    "tail": '{"batch_bytes":2097152,"batch_wait_ms":5,"pattern":"*.bar","separator":".","shared":false,'
    '"syntax":"qpubs","tags":[]}',
    "exact": '{"batch_bytes":2097152,"batch_wait_ms":5,"pattern":"foo.","separator":".","shared":false,'
    '"syntax":"qpubs","tags":[]}',
    "never": '{"batch_bytes":2097152,"batch_wait_ms":5,"pattern":"a*","separator":".","shared":false,'
    '"syntax":"qpubs","tags":[]}',
    "multi": '{"batch_bytes":2097152,"batch_wait_ms":5,"pattern":"a::*","separator":"::","shared":false,'
    '"syntax":"qpubs","tags":[]}',
}


def store_specs(factory: Factory, specs: dict[str, str]) -> None:
    """Write each named consumer's stored spec as ``specs`` gives it, in the closed store's file or
    database (as an earlier version left it)."""
    rows = [(text, name) for name, text in specs.items()]
    if factory.engine.startswith("postgres"):
        with psycopg.connect(factory.pg_url, autocommit=True) as pg:
            for text, name in rows:
                assert (
                    pg.execute("UPDATE consumers SET spec = %s WHERE name = %s", (text, name)).rowcount == 1
                )
        return
    with contextlib.closing(sqlite3.connect(factory.path)) as conn, conn:
        for text, name in rows:
            assert conn.execute("UPDATE consumers SET spec = ? WHERE name = ?", (text, name)).rowcount == 1


@pytest.mark.parametrize("stored_as_qpubs", [False, True])
def test_separated_and_tag_filters(factory: Factory, stored_as_qpubs: bool) -> None:
    """A separated-name consumer gets what a live qpubs ``listen`` of its topic gets; so does one an earlier
    version stored with the syntax ``qpubs``, once the store is opened again."""
    store = factory.open()
    head, _ = store.consumer_create(spec("head", "foo.*", syntax=SEPARATED))
    tail, _ = store.consumer_create(spec("tail", "*.bar", syntax=SEPARATED))
    exact, _ = store.consumer_create(spec("exact", "foo.", syntax=SEPARATED))
    never, _ = store.consumer_create(spec("never", "a*", syntax=SEPARATED))
    multi, _ = store.consumer_create(spec("multi", "a::*", syntax=SEPARATED, separator="::"))
    tagged, _ = store.consumer_create(spec("tagged", "/**", tags=("t1", "t2")))
    if stored_as_qpubs:
        if not factory.persistent:
            pytest.skip("the memory engine keeps nothing")
        store.close()
        store_specs(factory, STORED_AS_QPUBS)
        store = factory.open()
        loaded = {c.spec.name: c.spec for c in store.consumers()}
        assert {n: (s.syntax, s.pattern, s.separator) for n, s in loaded.items()} == {
            "head": (SEPARATED, "foo.*", "."),
            "tail": (SEPARATED, "*.bar", "."),
            "exact": (SEPARATED, "foo.", "."),
            "never": (SEPARATED, "a*", "."),
            "multi": (SEPARATED, "a::*", "::"),
            "tagged": ("native", "/**", "."),
        }
    # qpubs.md §1's table: foo.* gets foo.bar, foo.bar.baz and foo. (not foo); *.bar gets foo.bar,
    # baz.foo.bar and .bar (not bar).
    # A native channel whose one segment holds the separator (/foo.x) renders as foo.x and matches foo.*, as a
    # live qpubs listen would (matching is on the rendered name, as the engine does).
    chans = [
        "/foo",
        "/foo/bar",
        "/bar",
        "/bar/foo",
        "/foo/bar/baz",
        "/foo/",
        "/baz/foo/bar",
        "//bar",
        "/a/b",
        "/foo.x",
    ]
    store.append([req(ch, ch.encode()) for ch in chans])
    store.append([req("/t", b"1", tags=("t1",)), req("/t", b"2", tags=("t2", "t1", "t3"))])
    assert [i.event.channel for i in store.consumer_items(head.id)] == [
        "/foo/bar",
        "/foo/bar/baz",
        "/foo/",
        "/foo.x",
    ]
    assert [i.event.channel for i in store.consumer_items(tail.id)] == ["/foo/bar", "/baz/foo/bar", "//bar"]
    assert [i.event.channel for i in store.consumer_items(exact.id)] == ["/foo/"]
    assert store.consumer_items(never.id) == []
    assert [i.event.channel for i in store.consumer_items(multi.id)] == ["/a/b"]
    assert [i.event.payload for i in store.consumer_items(tagged.id)] == [b"2"]


def test_items_page_by_position(store: LogStore) -> None:
    c, _ = store.consumer_create(spec())
    store.append([req("/a/x", bytes([i])) for i in range(10)])
    assert [i.pos for i in store.consumer_items(c.id, after_pos=3, limit=4)] == [4, 5, 6, 7]
    assert store.consumer_items(c.id, limit=0) == []
    assert store.consumer_items(c.id + 100) == []


# -- settling -----------------------------------------------------------------------------------------------


def test_settle_acks_and_retries(store: LogStore) -> None:
    c, _ = store.consumer_create(spec())
    store.append([req("/a/x", bytes([i])) for i in range(6)])
    store.consumer_settle([(c.id, [1, 2])], [Retry(c.id, (3, 4), 5 * NS)])
    got = store.consumer_items(c.id)
    assert [(i.pos, i.attempts, i.not_before_ns) for i in got] == [
        (3, 1, 5 * NS),
        (4, 1, 5 * NS),
        (5, 0, 0),
        (6, 0, 0),
    ]
    store.consumer_settle([], [Retry(c.id, (3,), 7 * NS)])
    assert (store.consumer_items(c.id)[0].attempts, store.consumer_items(c.id)[0].not_before_ns) == (
        2,
        7 * NS,
    )
    # Acknowledging twice, unknown positions and unknown consumers change nothing else.
    store.consumer_settle([(c.id, [1, 2, 3, 99]), (c.id + 50, [5])], [Retry(c.id + 50, (5,), 1)])
    assert [i.pos for i in store.consumer_items(c.id)] == [4, 5, 6]
    info = store.consumers()[0]
    assert (info.top, info.pending, info.bytes) == (6, 3, 3)
    store.consumer_settle([], [])


def test_settle_acks_runs_and_scattered_positions_exactly(store: LogStore) -> None:
    """Acks of consecutive runs (SQLite deletes them as ranges), of scattered positions and of positions
    already gone, in one call and unsorted: exactly the named positions go, and the counts follow."""
    c, other = store.consumer_create(spec())[0], store.consumer_create(spec("d"))[0]
    store.append([req("/a/x", bytes([i])) for i in range(40)])
    acked = [*range(10, 2, -1), 12, 14, 15, *range(20, 31), 33, 99, 35, 36, 37]  # 3-10, 20-30, 35-37 ...
    store.consumer_settle([(c.id, acked), (c.id, [1, 2, 3])])
    gone = {1, 2, *range(3, 11), 12, 14, 15, *range(20, 31), 33, 35, 36, 37}
    left = [p for p in range(1, 41) if p not in gone]
    assert [i.pos for i in store.consumer_items(c.id, limit=100)] == left
    assert [i.event.payload for i in store.consumer_items(c.id, limit=1)] == [bytes([10])]
    assert len(store.consumer_items(other.id, limit=100)) == 40  # another consumer's journal is untouched
    info = {i.spec.name: i for i in store.consumers()}
    assert (info["c"].pending, info["c"].bytes) == (40 - len(gone), 40 - len(gone))
    assert (info["d"].pending, info["d"].bytes) == (40, 40)
    # A whole batch acknowledged in order is one run.
    store.consumer_settle([(other.id, list(range(1, 41)))])
    assert store.consumer_items(other.id) == []
    assert {i.spec.name: i.pending for i in store.consumers()}["d"] == 0


def test_items_keep_their_events_when_the_log_empties_and_fills_again(factory: Factory) -> None:
    """Retention empties the log, new events come (SQLite gives them the positions of the ones gone), and
    retention empties it again: every unacknowledged item still reads as its event."""
    store = factory.open()
    c, _ = store.consumer_create(spec())
    store.append([req("/b", b"unmatched") for _ in range(3)])  # the log's first positions, no item's
    evs = [r.event for r in store.append([req("/a/x", b"%d" % i) for i in range(5)])]
    for _ in range(3):
        factory.clock.advance(60)
        store.apply_retention(RetentionPolicy(max_age_s=30), factory.clock())
        assert store.stats().events == 0
        evs += [r.event for r in store.append([req("/a/y", b"later")])]
    factory.clock.advance(60)
    store.apply_retention(RetentionPolicy(max_age_s=30), factory.clock())
    assert [(i.pos, i.event) for i in store.consumer_items(c.id)] == list(enumerate(evs, 1))


def test_an_ack_of_a_position_not_allocated_yet_is_passed_over(store: LogStore) -> None:
    """Acknowledging positions beyond the journal's top changes nothing: the items later journaled there are
    delivered (SQLite must not move ``acked_to`` past its top)."""
    c, _ = store.consumer_create(spec())
    store.consumer_settle([(c.id, [1, 2, 3])])
    store.append([req("/a/x", b"one")])
    store.consumer_settle([(c.id, [1, 2, 3])])
    store.append([req("/a/x", b"two"), req("/a/x", b"three")])
    assert [(i.pos, i.event.payload) for i in store.consumer_items(c.id)] == [(2, b"two"), (3, b"three")]
    assert store.consumers()[0].pending == 2


def test_acks_in_order_and_around_gaps_stay_acked_across_reopens(factory: Factory) -> None:
    """Batches acknowledged in order (SQLite moves the consumer's ``acked_to`` and deletes their rows later,
    in large ranges), a batch acknowledged ahead of an earlier one, the earlier one after it, and a reopen
    between: exactly the unacknowledged items are left, and the counts follow."""
    store = factory.open()
    c, _ = store.consumer_create(spec())
    n = 5000
    for i in range(0, n, 500):
        store.append([req("/a/x", b"%d" % j) for j in range(i, i + 500)])
    store.consumer_settle([(c.id, list(range(1, 101)))])
    store.consumer_settle([(c.id, [*range(150, 161), 170])])  # ahead of 101-149
    assert [i.pos for i in store.consumer_items(c.id, limit=2)] == [101, 102]
    store.consumer_settle([(c.id, list(range(101, 150)))])  # the gap: every item up to 169 is acked now
    assert [i.pos for i in store.consumer_items(c.id, limit=2)] == [161, 162]
    store.consumer_settle([(c.id, list(range(161, 170)))])
    for lo in range(171, 4001, 100):
        store.consumer_settle([(c.id, list(range(lo, min(lo + 100, 4001))))])
    if factory.persistent:
        store = factory.reopen(store)
    store.consumer_settle([(c.id, list(range(1, 4001)))])  # all acknowledged already: nothing changes
    left = store.consumer_items(c.id, limit=n)
    assert [(i.pos, i.event.payload) for i in left] == [(p, b"%d" % (p - 1)) for p in range(4001, n + 1)]
    assert [i.pos for i in store.consumer_items(c.id, after_pos=10, limit=1)] == [4001]
    info = store.consumers()[0]
    assert (info.top, info.pending, info.bytes) == (n, 1000, sum(len(b"%d" % j) for j in range(4000, n)))
    store.consumer_settle([], [Retry(c.id, (3999, 4001), 9)])  # a retry of an acked item is passed over
    assert [(i.pos, i.attempts) for i in store.consumer_items(c.id, limit=2)] == [(4001, 1), (4002, 0)]
    if factory.engine.startswith("sqlite"):
        store.close()
        conn = sqlite3.connect(factory.path)
        try:
            # The acknowledged rows went in ranges: at most one sweep's worth is left below acked_to.
            (acked_to,) = conn.execute("SELECT acked_to FROM consumers").fetchone()
            (kept,) = conn.execute("SELECT count(*) FROM journal WHERE pos <= ?", (acked_to,)).fetchone()
            assert acked_to == 4000 and kept < 2048
        finally:
            conn.close()


_V3_JOURNAL = """CREATE TABLE journal (
    consumer_id INTEGER NOT NULL, pos INTEGER NOT NULL, attempts INTEGER NOT NULL,
    not_before INTEGER NOT NULL,
    channel TEXT NOT NULL, epoch TEXT NOT NULL, seq INTEGER NOT NULL, time_ns INTEGER NOT NULL,
    size INTEGER NOT NULL, publisher_dialect TEXT NOT NULL, publisher_user TEXT NOT NULL,
    publisher_app TEXT NOT NULL, publisher_msg_id TEXT NOT NULL, content_type TEXT NOT NULL,
    headers BLOB NOT NULL, tags BLOB NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (consumer_id, pos)
) WITHOUT ROWID"""


def test_sqlite_opens_a_version_3_database_with_its_consumers(tmp_path: Path) -> None:
    """Schema version 3 (journal rows that copy their event, no ``acked_to``) migrates: the items read as
    they were written, acks and new appends go on from there."""
    path = tmp_path / "v3.db"
    SqliteLogStore(path).close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE journal")
        conn.execute(_V3_JOURNAL)
        conn.execute("ALTER TABLE consumers DROP COLUMN acked_to")
        conn.execute(
            "INSERT INTO consumers (id, name, spec, created_ns, top, pending, bytes) "
            "VALUES (?, ?, ?, 0, 3, 2, 5)",
            (7, "c", spec().to_json()),
        )
        ch, pub = ("/a/x", "e0000001"), ("native", "u", "app", "", "text/plain", b"", b"")
        conn.executemany(
            f"INSERT INTO journal VALUES (7, {', '.join('?' * 16)})",
            [
                (2, 0, 0, *ch, 2, 10, 2, *pub, b"ab"),
                (3, 1, 99, *ch, 3, 11, 3, *pub, b"cde"),
            ],
        )
        conn.execute("UPDATE meta SET value = 3 WHERE key = 'schema_version'")
    conn.close()
    store = SqliteLogStore(path)
    try:
        got = store.consumer_items(7)
        assert [
            (i.pos, i.attempts, i.not_before_ns, i.event.channel, i.event.epoch, i.event.seq) for i in got
        ] == [
            (2, 0, 0, "/a/x", "e0000001", 2),
            (3, 1, 99, "/a/x", "e0000001", 3),
        ]
        assert [(i.event.time_ns, i.event.payload, i.event.publisher.app) for i in got] == [
            (10, b"ab", "app"),
            (11, b"cde", "app"),
        ]
        store.consumer_settle([(7, [2])])
        assert store.append([req("/a/y", b"n")])[0].journal == ((7, 4),)
        assert [i.pos for i in store.consumer_items(7)] == [3, 4]
        assert (store.consumers()[0].pending, store.consumers()[0].bytes) == (2, 4)
    finally:
        store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (4,)
    conn.close()


# -- retention never drops unacknowledged items ------------------------------------------------------


def test_retention_trim_and_reset_keep_the_journal(factory: Factory) -> None:
    store = factory.open(retention=RetentionPolicy(max_events=2))
    c, _ = store.consumer_create(spec())
    store.append([req("/a/x", bytes([i])) for i in range(5)])
    assert [e.seq for e in store.read("/a/x")] == [4, 5]
    store.trim("/a/x", 5)
    store.reset_channel("/a/x")
    factory.clock.advance(3600)
    store.apply_retention(RetentionPolicy(max_age_s=1, max_total_bytes=1), factory.clock())
    assert store.stats().events == 0
    assert [(i.pos, i.event.seq, i.event.payload) for i in store.consumer_items(c.id)] == [
        (p, p, bytes([p - 1])) for p in range(1, 6)
    ]


def test_items_keep_their_events_through_every_path_that_deletes_events(factory: Factory) -> None:
    """Items whose events go (a per-channel limit, in the events' own append and in a later one, ``trim`` of
    the current epoch and of a retired one, age retention), some acknowledged and some not, for two
    consumers at different points: each unacknowledged item still reads as exactly the event appended, by
    every engine (SQLite's journal refers to events and copies them before they go), across a reopen."""
    store = factory.open(retention=RetentionPolicy(max_events=4))
    c, d = store.consumer_create(spec())[0], store.consumer_create(spec("d", "/a/y"))[0]

    made = iter(range(100))

    def put(channel: str, n: int) -> list[Event]:
        reqs = [req(channel, b"p%d" % next(made), headers={"k": str(i)}, tags=(f"t{i}",)) for i in range(n)]
        return [r.event for r in store.append(reqs)]

    evs = put("/a/x", 3) + put("/a/y", 6)  # /a/y: 6 events in one append, 2 of them over the limit at once
    store.consumer_settle([(c.id, [1])])
    evs += put("/a/x", 3)  # the limit drops /a/x 1-2 (item 2 unacknowledged)
    store.trim("/a/y", 4)
    old_epoch = evs[0].epoch
    store.reset_channel("/a/x")
    evs += put("/a/x", 2)
    store.trim("/a/x", 4, epoch=old_epoch)  # the retired epoch keeps 5-6
    store.consumer_settle([(c.id, [7, 8])])
    for _ in range(20):  # one event per append, each over the limit by one: every append deletes one
        evs += put("/a/z", 1)
    expected_c = [(p, evs[p - 1]) for p in range(2, 35) if p not in (7, 8)]
    expected_d = [(p, evs[2 + p]) for p in range(1, 7)]

    def check() -> None:
        assert [(i.pos, i.event) for i in store.consumer_items(c.id, limit=100)] == expected_c
        assert [(i.pos, i.event) for i in store.consumer_items(d.id, limit=100)] == expected_d

    check()
    factory.clock.advance(3600)
    store.append([req("/b", b"later")])
    store.apply_retention(RetentionPolicy(max_age_s=60), factory.clock())
    assert store.stats().events == 1
    check()
    if factory.persistent:
        store = factory.reopen(store)
        check()
    info = {i.spec.name: i for i in store.consumers()}
    assert (info["c"].pending, info["d"].pending) == (len(expected_c), len(expected_d))
    assert info["c"].bytes == sum(e.size for _, e in expected_c)


# -- persistence ---------------------------------------------------------------------------------------


def test_everything_survives_a_reopen(factory: Factory) -> None:
    if not factory.persistent:
        pytest.skip("the memory engine keeps nothing")
    store = factory.open()
    c, _ = store.consumer_create(spec(shared=True))
    store.append([req("/a/x", bytes([i])) for i in range(4)])
    store.consumer_settle([(c.id, [1])], [Retry(c.id, (2,), 42)])
    before = (store.consumers(), store.consumer_items(c.id))
    store = factory.reopen(store)
    assert (store.consumers(), store.consumer_items(c.id)) == before
    res = store.append([req("/a/x", b"n")])
    assert res[0].journal == ((c.id, 5),)


def test_only_a_shared_engine_says_it_is_shared(factory: Factory) -> None:
    """``LogStore.shared``: the consumer service reads the journal for other nodes' items only then."""
    assert factory.open().shared is factory.engine.startswith("postgres")


def test_one_store_at_a_time_holds_a_consumer(factory: Factory) -> None:
    a = factory.open()
    assert a.consumer_hold(7) and a.consumer_hold(7, take=False)
    if not a.shared:
        return  # one process: always held
    b = factory.open()
    assert a.consumer_hold(7)
    assert not b.consumer_hold(7) and b.consumer_hold(8)  # per consumer
    assert a.consumer_hold(7, take=False)
    assert b.consumer_hold(7)
    assert not a.consumer_hold(7)
    b.close()  # a hold ends with its store (once the server has seen the session end: a moment)
    deadline = time.monotonic() + 10
    while not a.consumer_hold(7):
        assert time.monotonic() < deadline, "the hold outlived its store"
        time.sleep(0.01)  # polling the server
    assert a.consumer_hold(8)


def test_a_shared_database_journals_for_consumers_of_every_node(factory: Factory) -> None:
    if not factory.engine.startswith("postgres"):
        pytest.skip("only PostgreSQL is shared by several nodes")
    a = factory.open()
    b = factory.open()
    b.append([req("/a/0")])  # b has loaded the (empty) set of consumers
    c, _ = a.consumer_create(spec())
    b.append([req("/a/1")])
    a.append([req("/a/2")])
    b.append([req("/a/3")])
    # Positions follow commit order whichever node commits, one after another: the consumer service takes a
    # node's own notification only when it continues what it read (core/consumer_delivery.py).
    assert [i.pos for i in a.consumer_items(c.id)] == [1, 2, 3]
    assert a.consumer_delete("c")
    b.append([req("/a/4")])
    assert b.consumer_items(c.id) == []


_CHILD = textwrap.dedent(
    """
    import sys
    from hubbub.events import Publisher
    from hubbub.log import AppendRequest, open_store, RetentionPolicy
    from hubbub.log.consumers import ConsumerSpec

    url, n = sys.argv[1], int(sys.argv[2])
    store = open_store(url, "", "commit", RetentionPolicy(max_events=3), 600)
    info, _ = store.consumer_create(ConsumerSpec("dur", "/jobs/**"))
    pub = Publisher("native", "", "child", "")
    for i in range(n):
        store.append([AppendRequest("/jobs/" + str(i % 3), pub, str(i).encode(), "text/plain")])
    store.consumer_settle([(info.id, list(range(1, n // 2 + 1)))])
    print("ready", info.id, flush=True)
    sys.stdin.read()  # killed here, with the store open
    """
)


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_after_a_crash_acked_stays_acked_and_the_rest_is_delivered_again(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = f"sqlite:///{tmp_path / 'crash.db'}" if engine == "sqlite" else request.getfixturevalue("pg_url")
    n = 20
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = child.stdout.readline() if child.stdout else ""
        assert line.startswith("ready"), line
        cid = int(line.split()[1])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        for f in (child.stdin, child.stdout):
            if f is not None:
                f.close()
    assert child.returncode == -signal.SIGKILL
    store: LogStore
    if engine == "sqlite":
        from hubbub.log import SqliteLogStore

        store = SqliteLogStore(tmp_path / "crash.db")
    else:
        store = PostgresLogStore(url)
    try:
        got = store.consumer_items(cid, limit=1000)
        # Acknowledged: gone for good. Unacknowledged: all there, in order, with their payloads, although
        # the log itself kept only the last 3 events of each channel.
        assert [i.pos for i in got] == list(range(n // 2 + 1, n + 1))
        assert [i.event.payload for i in got] == [str(p - 1).encode() for p in range(n // 2 + 1, n + 1)]
        assert store.consumers()[0].pending == n - n // 2
        assert store.append([req("/jobs/x")])[0].journal == ((cid, n + 1),)
    finally:
        store.close()
