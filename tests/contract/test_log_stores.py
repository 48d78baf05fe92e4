"""One conformance suite for every ``LogStore`` engine (the invariants in ``hubbub/log/base.py``).

Every test runs against each engine: ``memory``, ``sqlite`` in each durability mode, and ``postgres`` in
``commit`` and ``none`` (PostgreSQL: a real server, ``tests/conftest.py``, an empty database per test). Its
``fsync`` runs the very code ``commit`` does (the store looks at its durability in two places: the writer
connection's ``synchronous_commit``, ``on`` against ``local``, which differ only on a server with synchronous
standbys, and ``durability == "none"``), so it is not run through the suite again;
``test_postgres_writer_runs_with_its_durabilitys_synchronous_commit`` checks what does differ. Tests that
need a store to survive a close (``persistent``) skip the memory engine. Time comes from a fake clock, so
nothing depends on the wall clock or on sleeping.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from hubbub.errors import EpochMismatch, StorageError, TrimEpochGone, TrimError, TrimOutOfRange
from hubbub.events import Event, Publisher
from hubbub.log import (
    AppendRequest,
    AppendResult,
    AppendRun,
    ChannelInfo,
    LogMark,
    LogStore,
    MemoryLogStore,
    RetentionPolicy,
    SqliteLogStore,
    StoreStats,
    open_store,
)
from hubbub.log.consumers import ConsumerSpec
from hubbub.log.postgres import PostgresLogStore
from hubbub.log.records import encode_headers, encode_tags
from hubbub.log.sqlite import ScanColumns, ScanPlan
from hubbub.log.sqlite import _reads as sqlite_reads

NS = 1_000_000_000
START = 1_700_000_000 * NS
EPOCH_RE = re.compile(r"^[0-9a-z]{8}$")
ENGINES = [
    "memory",
    "sqlite-fsync",
    "sqlite-commit",
    "sqlite-none",
    "postgres-commit",
    "postgres-none",
]


class Clock:
    """A fake ``time.time_ns``: stands still until moved."""

    def __init__(self, now: int = START) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * NS)


class Factory:
    """Opens stores of one engine on one file (sqlite) or database (postgres) and closes them all at the end
    of the test."""

    def __init__(self, engine: str, tmp_path: Path, pg_url: str = "") -> None:
        self.engine = engine
        self.path = tmp_path / "log.db"
        self.pg_url = pg_url
        self.clock = Clock()
        self.persistent = engine != "memory"
        self.opened: list[LogStore] = []
        self.retention = RetentionPolicy()
        self.idem_window_s: float = 600

    def open(self, retention: RetentionPolicy | None = None, idem_window_s: float | None = None) -> LogStore:
        if retention is not None:
            self.retention = retention
        if idem_window_s is not None:
            self.idem_window_s = idem_window_s
        store: LogStore
        if self.engine == "memory":
            store = MemoryLogStore(
                retention=self.retention, idem_window_s=self.idem_window_s, clock=self.clock
            )
        elif self.engine.startswith("postgres"):
            store = PostgresLogStore(
                self.pg_url,
                durability=self.engine.split("-")[1],
                retention=self.retention,
                idem_window_s=self.idem_window_s,
                clock=self.clock,
            )
        else:
            store = SqliteLogStore(
                self.path,
                durability=self.engine.split("-")[1],
                retention=self.retention,
                idem_window_s=self.idem_window_s,
                clock=self.clock,
            )
        self.opened.append(store)
        return store

    def reopen(self, store: LogStore) -> LogStore:
        """Close ``store`` and open the same file or database again (not memory)."""
        assert self.persistent
        store.close()
        return self.open()

    def close_all(self) -> None:
        for st in self.opened:
            st.close()


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


PUB = Publisher("native", "alice", "app1", "m1")


def req(
    channel: str,
    payload: bytes = b"x",
    *,
    user: str = "alice",
    idem: str = "",
    headers: Mapping[str, str] | None = None,
    tags: tuple[str, ...] = (),
    content_type: str = "text/plain",
) -> AppendRequest:
    return AppendRequest(
        channel=channel,
        publisher=Publisher("native", user, "app1", idem),
        payload=payload,
        content_type=content_type,
        headers=headers or {},
        tags=tags,
        idem=idem,
    )


def seqs(events: list[Event]) -> list[int]:
    return [e.seq for e in events]


def append_n(store: LogStore, channel: str, n: int, payload: bytes = b"x") -> list[Event]:
    return [r.event for r in store.append([req(channel, payload) for _ in range(n)])]


# -- sequencing ---------------------------------------------------------------------------------------


def test_seq_starts_at_one_and_is_consecutive_within_a_batch(store: LogStore) -> None:
    res = store.append([req("/a"), req("/b"), req("/a"), req("/c"), req("/a")])
    assert [(r.event.channel, r.event.seq, r.duplicate) for r in res] == [
        ("/a", 1, False),
        ("/b", 1, False),
        ("/a", 2, False),
        ("/c", 1, False),
        ("/a", 3, False),
    ]
    res = store.append([req("/b"), req("/a")])
    assert [(r.event.channel, r.event.seq) for r in res] == [("/b", 2), ("/a", 4)]
    assert seqs(store.read("/a")) == [1, 2, 3, 4]
    assert store.append([]) == []


def test_result_events_carry_what_was_appended(store: LogStore) -> None:
    headers = {"x-trace": "t1", ":pseudo": "p", "ü": "ÿ"}
    r = store.append(
        [req("/chat/ünï", b"\x00\xffbin", headers=headers, tags=("a", "b"), content_type="application/x")]
    )[0]
    ev = r.event
    assert (ev.channel, ev.payload, ev.content_type, dict(ev.headers), ev.tags) == (
        "/chat/ünï",
        b"\x00\xffbin",
        "application/x",
        headers,
        ("a", "b"),
    )
    assert ev.publisher == Publisher("native", "alice", "app1", "")
    assert store.read("/chat/ünï") == [ev]
    empty = store.append([req("/e", b"")])[0].event
    assert store.read("/e") == [empty]
    assert empty.payload == b"" and dict(empty.headers) == {} and empty.tags == ()


def mixed_batch() -> list[AppendRequest]:
    """Requests whose publisher, content type, headers or tags change after runs of many lengths: single
    events, runs shorter than, as long as and longer than the sqlite engine's shortest shared-column run (8),
    and runs longer than its largest insert statement (256 rows); runs whose headers differ per event (the
    sqlite engine's per-row-headers runs) and a run of equal headers that goes on with differing ones."""
    one_pub = Publisher("native", "bob", "app2", "")
    keys = itertools.count()
    kinds: list[Callable[[int], AppendRequest]] = [
        lambda i: req("/m/a", b"p%d" % i),  # a new but equal publisher per event
        lambda i: AppendRequest("/m/b", one_pub, b"", "text/plain"),  # one publisher object, empty payloads
        lambda i: req("/m/a", b"h", headers={"x-trace": "same", ":p": "q"}, tags=("t", "u")),
        lambda i: req("/m/b", b"u%d" % i, headers={"x-trace": f"t{i}"}),  # every event differs
        lambda i: req("/m/a", b"c" * i, content_type="application/x"),
        lambda i: req("/m/c" if i % 2 else "/m/a", "é".encode(), user="carol"),  # one run, two channels
        lambda i: req("/m/a", b"k", idem=f"k{next(keys)}"),  # the publisher's msg_id differs per event
        # As the data pipeline's sink publishes: a header and a key per event, alternating channels.
        lambda i: req(f"/m/{'abc'[i % 3]}", b"s", headers={"src": f"/x#e:{i}"}, idem=f"s{next(keys)}"),
        # Equal headers for a run, then a different one per event (the run that binds them once ends).
        lambda i: req("/m/b", b"v", headers={"x": "same" if i < 10 else f"v{i}"}, tags=("t",)),
        # One publisher object: a burst's stretch of rows that bind their payload only (the sqlite engine's),
        # across the channels (a new one among them), broken by a key's duplicate when the batch comes again.
        lambda i: AppendRequest(f"/m/{'ad'[i // 300 % 2]}", one_pub, b"b%d" % i, "text/plain"),
        lambda i: AppendRequest(
            "/m/c", one_pub, b"k%d" % i, "text/plain", idem="" if i % 50 else f"b{next(keys)}"
        ),
    ]
    lengths = [1, 3, 7, 8, 9, 1, 300, 2, 600, 40, 8, 7, 520, 5, 9, 11, 300, 30, 1, 300, 700, 300, 8, 7]
    out: list[AppendRequest] = []
    for n, length in enumerate(lengths):
        kind = kinds[n % len(kinds)]
        out += [kind(i) for i in range(length)]
    return out


def test_batches_of_mixed_runs_read_back_exactly(factory: Factory, store: LogStore) -> None:
    batch = mixed_batch()
    res = store.append(batch)
    events = [r.event for r in res]
    assert not any(r.duplicate for r in res)
    assert [(e.channel, e.payload, e.content_type, e.publisher) for e in events] == [
        (r.channel, r.payload, r.content_type, r.publisher) for r in batch
    ]
    for ch in ("/m/a", "/m/b", "/m/c", "/m/d"):
        assert store.read(ch, limit=10_000) == [e for e in events if e.channel == ch]
    assert store.stats().bytes == sum(e.size for e in events)
    if factory.persistent:
        store = factory.reopen(store)
        assert [e for ch in ("/m/a", "/m/b", "/m/c", "/m/d") for e in store.read(ch, limit=10_000)] == sorted(
            events, key=lambda e: (e.channel, e.seq)
        )


def runs_batch(pub: Publisher) -> list[AppendRequest | AppendRun]:
    """Runs among requests: runs of one and of many events (more than the sqlite engine's largest insert
    statement), of a channel that is new, right after and right before a stretch of requests of the same
    channel and publisher object (so that a stretch must stop at a run), keyed requests repeated after a
    run, headers and tags, empty and large payloads."""
    big = b"B" * 5000
    return [
        *[AppendRequest("/r/a", pub, b"s%d" % i, "text/plain") for i in range(12)],
        AppendRun("/r/a", pub, "text/plain", [b"r%d" % i for i in range(300)]),
        *[AppendRequest("/r/a", pub, b"t%d" % i, "text/plain") for i in range(10)],
        req("/r/a", b"k", idem="k1"),
        AppendRun("/r/new", pub, "application/x", [b"", big, b"n"]),
        req("/r/b", b"h", headers={"x": "y"}, tags=("t",)),
        AppendRun("/r/a", pub, "text/plain", [b"one"]),
        req("/r/a", b"k", idem="k1"),  # the batch's own key: a duplicate of the first
        AppendRun("/r/b", pub, "text/plain", [b"b%d" % i for i in range(9)]),
        AppendRun("/r/a", Publisher("native", "bob", "app2", ""), "text/plain", [b"x", b"y"]),
    ]


def expanded(batch: list[AppendRequest | AppendRun]) -> list[AppendRequest]:
    return [r for entry in batch for r in (entry.requests() if isinstance(entry, AppendRun) else [entry])]


def test_runs_append_as_the_requests_they_stand_for(factory: Factory, store: LogStore) -> None:
    """An engine that takes runs (``takes_runs``) appends a batch holding them exactly as the memory
    reference appends the batch with each run expanded into its requests: the results (one per event), the
    reads, the heads, the counts and the durable consumers' journals; a later batch after them too."""
    if not store.takes_runs:
        pytest.skip("core gives this engine requests only")
    ref = MemoryLogStore(clock=factory.clock)
    spec = ConsumerSpec("c", "/r/**")
    for s in (store, ref):
        s.consumer_create(spec)
        s.append([req("/r/a", b"before"), req("/r/b", b"before")])
    pub = Publisher("native", "alice", "app1", "")
    batch = runs_batch(pub)
    # LogStore.append is typed for requests; an engine that takes_runs (checked above) takes runs too.
    got, want = store.append(batch), ref.append(expanded(batch))  # type: ignore[arg-type]  # runs: see above

    def facts(results: list[AppendResult]) -> list[tuple[object, ...]]:
        out: list[tuple[object, ...]] = []
        for r in results:
            e = r.event
            out.append((e.channel, e.seq, e.time_ns, e.publisher, e.payload, e.content_type, dict(e.headers)))
            out.append((e.tags, r.duplicate, len(r.journal)))
        return out

    assert len(got) == len(expanded(batch)) == 340
    assert facts(got) == facts(want)
    for ch in ("/r/a", "/r/b", "/r/new"):
        assert facts([AppendResult(e) for e in store.read(ch, limit=10_000)]) == facts(
            [AppendResult(e) for e in ref.read(ch, limit=10_000)]
        )
        mine, theirs = store.head(ch), ref.head(ch)
        assert (mine.first, mine.top, mine.top_time) == (theirs.first, theirs.top, theirs.top_time)
    assert store.stats() == ref.stats()
    cid = store.consumers()[0].id
    assert [(i.event.channel, i.event.seq) for i in store.consumer_items(cid, limit=10_000)] == [
        (i.event.channel, i.event.seq) for i in ref.consumer_items(ref.consumers()[0].id, limit=10_000)
    ]
    again = [AppendRun("/r/a", pub, "text/plain", [b"later"]), req("/r/a", b"k", idem="k1")]
    assert facts(store.append(again)) == facts(ref.append(expanded(again)))  # type: ignore[arg-type]  # runs
    if factory.persistent:
        store = factory.reopen(store)
        assert facts([AppendResult(e) for e in store.read("/r/a", limit=10_000)]) == facts(
            [AppendResult(e) for e in ref.read("/r/a", limit=10_000)]
        )


def test_epochs(factory: Factory, store: LogStore) -> None:
    res = store.append([req(f"/ch{i}") for i in range(6)])
    epochs = [r.event.epoch for r in res]
    assert all(EPOCH_RE.match(e) for e in epochs)
    assert len(set(epochs)) == 6
    again = store.append([req("/ch0")])[0].event
    assert again.epoch == epochs[0]
    assert store.head("/ch0").epoch == epochs[0]
    if factory.persistent:
        store = factory.reopen(store)
        assert store.head("/ch0").epoch == epochs[0]
        assert store.append([req("/ch0")])[0].event.position.epoch == epochs[0]


def test_time_is_strictly_increasing_over_the_whole_log(factory: Factory, store: LogStore) -> None:
    clock = factory.clock
    assert store.top_time() == 0
    first = store.append([req("/a")])[0].event
    assert first.time_ns == clock.now  # max(now, last + 1) with an empty log is now
    times = [first.time_ns]
    times += [r.event.time_ns for r in store.append([req("/b"), req("/a"), req("/c")])]  # same clock reading
    clock.advance(-3600)  # the clock steps back an hour
    times += [r.event.time_ns for r in store.append([req("/c"), req("/b")])]
    clock.advance(7200)
    times += [r.event.time_ns for r in store.append([req("/a")])]
    assert times == sorted(set(times))
    assert times[-1] == clock.now
    assert store.top_time() == times[-1]
    assert store.head("/a").top_time == times[-1]
    if factory.persistent:
        clock.advance(-7200)
        store = factory.reopen(store)
        assert store.top_time() == times[-1]
        assert store.append([req("/d")])[0].event.time_ns == times[-1] + 1


# -- reads ---------------------------------------------------------------------------------------------


def test_read_by_seq_range_and_limit(store: LogStore) -> None:
    append_n(store, "/a", 10)
    append_n(store, "/b", 2)
    assert seqs(store.read("/a")) == list(range(1, 11))
    assert seqs(store.read("/a", after_seq=3, limit=4)) == [4, 5, 6, 7]
    assert seqs(store.read("/a", after_seq=9)) == [10]
    assert store.read("/a", after_seq=10) == []
    assert store.read("/a", after_seq=2**70) == []
    assert seqs(store.read("/a", after_seq=-5, limit=2)) == [1, 2]
    assert store.read("/a", limit=0) == []
    assert store.read("/nope") == []
    assert all(e.channel == "/a" for e in store.read("/a"))


def test_count_log_counts_what_read_log_gives(store: LogStore) -> None:
    """``count_log``: the events ``read_log`` gives under a prefix (or of one channel) from a position up to
    a mark, from a time on, and how many of them carry headers; a reset channel's retired events are not
    counted, nor events after the mark."""
    assert store.count_log(0, store.log_mark()) == (0, 0)
    first = [req(f"/p/{i % 3}") for i in range(9)] + [req("/pp"), req("/p")]
    written = [r.event for r in store.append(first)]
    written += [r.event for r in store.append([req("/p/1", headers={":filter.user_id": "u"}), req("/q")])]
    store.reset_channel("/p/2")
    store.append([req("/p/2")])
    mark = store.log_mark()
    store.append([req("/p/0") for _ in range(3)])  # after the mark
    assert store.count_log(0, mark) == (11, 1)  # /p/2's three retired events are gone from the count
    assert store.count_log(0, mark, "/p") == (10, 1)  # with /pp
    assert store.count_log(0, mark, "/p/") == (8, 1)
    assert store.count_log(0, mark, channel="/p") == (1, 0)
    assert store.count_log(0, mark, channel="/p/1") == (4, 1)
    t = written[4].time_ns
    after = store.log_seek(t)
    assert store.count_log(after, mark, "/p/", from_time=t) == (
        sum(1 for e in written[4:] if e.channel.startswith("/p/") and e.channel != "/p/2") + 1,
        1,
    )
    assert store.count_log(mark.pos, mark) == (0, 0)


def test_log_census_gives_each_channels_first_and_last_seq_in_a_range(store: LogStore) -> None:
    """``log_census``: per channel with events ``read_log`` gives (current epochs, under a prefix, up to a
    mark, from a time), its epoch and the first and last seq of those events."""
    assert store.log_census(0, store.log_mark()) == {}
    written = [
        r.event for r in store.append([req(f"/p/{i % 3}") for i in range(9)] + [req("/pp"), req("/q")])
    ]
    store.reset_channel("/p/2")
    store.append([req("/p/2")])
    mark = store.log_mark()
    store.append([req("/p/0")])  # after the mark
    ep = {ch: store.head(ch).epoch for ch in ("/p/0", "/p/1", "/p/2", "/pp", "/q")}
    assert store.log_census(0, mark, "/p/") == {
        "/p/0": (ep["/p/0"], 1, 3),
        "/p/1": (ep["/p/1"], 1, 3),
        "/p/2": (ep["/p/2"], 1, 1),
    }
    t = written[4].time_ns  # /p/1 #2
    assert store.log_census(store.log_seek(t), mark, "/p", from_time=t) == {
        "/p/0": (ep["/p/0"], 3, 3),
        "/p/1": (ep["/p/1"], 2, 3),
        "/p/2": (ep["/p/2"], 1, 1),
        "/pp": (ep["/pp"], 1, 1),
    }
    assert len(store.log_census(0, mark)) == 5


def test_read_log_pages_a_pattern_in_commit_order_up_to_a_mark(store: LogStore) -> None:
    """``read_log``: the events of current epochs under a prefix, in commit order, a page at a time, up to a
    mark taken before later commits; backwards too. ``log_seek`` finds where a time starts."""
    assert store.log_mark() == LogMark(0, 0)
    assert store.read_log(0, LogMark(0, 0)).events == []
    written = [r.event for r in store.append([req(f"/p/{i % 3}") for i in range(10)] + [req("/q")])]
    written += [r.event for r in store.append([req("/p/0"), req("/px")])]
    mark = store.log_mark()
    assert mark.time_ns == written[-1].time_ns
    store.append([req("/p/1") for _ in range(3)])  # after the mark: never read through it
    under = [e for e in written if e.channel.startswith("/p")]
    got: list[Event] = []
    after = 0
    while True:
        page = store.read_log(after, mark, 4, "/p")
        got += page.events
        if len(page.events) < 4:
            break
        after = page.pos
    assert [(e.channel, e.seq, e.epoch, e.time_ns) for e in got] == [
        (e.channel, e.seq, e.epoch, e.time_ns) for e in under
    ]
    assert got[0].payload == b"x" and got[0].publisher == written[0].publisher
    everything = store.read_log(0, mark, 100)
    assert [e.time_ns for e in everything.events] == [e.time_ns for e in written]
    back = store.read_log(0, mark, 3, "/p", reverse=True)
    assert [e.time_ns for e in back.events] == [e.time_ns for e in reversed(under)][:3]
    more = store.read_log(0, LogMark(back.pos - 1, mark.time_ns), 100, "/p", reverse=True)
    assert [e.time_ns for e in more.events] == [e.time_ns for e in reversed(under)][3:]
    # Where a time starts: every event at or after it is past the position found.
    t = written[5].time_ns
    start = store.log_seek(t)
    from_t = store.read_log(start, mark, 100).events
    assert [e.time_ns for e in from_t if e.time_ns >= t] == [e.time_ns for e in written[5:]]
    assert store.log_seek(0) == 0
    # A reset channel's retired events are not read.
    store.reset_channel("/p/2")
    assert all(e.channel != "/p/2" for e in store.read_log(0, store.log_mark(), 100, "/p").events)


def test_read_log_pages_are_bounded_in_payload_bytes_too(store: LogStore) -> None:
    """``read_log(max_bytes=...)``: a page ends with the event that brings its payloads to the budget (at
    least one event, however large) and is then ``full``; paging on until a page is neither ``limit`` long
    nor ``full`` gives every event once, in order, forwards and backwards; without a budget a page is
    bounded by ``limit`` alone."""
    sizes = [100, 300, 50, 1000, 10, 10, 10, 400, 5, 700]
    written = [r.event for r in store.append([req(f"/b/{i % 2}", bytes(n)) for i, n in enumerate(sizes)])]
    store.append([req("/c", bytes(5000))])  # outside the prefix: never counted against a page's budget
    mark = store.log_mark()
    first = store.read_log(0, mark, 100, "/b", max_bytes=400)
    assert [len(e.payload) for e in first.events] == [100, 300] and first.full
    assert first.pos > 0
    big = store.read_log(first.pos, mark, 100, "/b", max_bytes=1)
    assert [len(e.payload) for e in big.events] == [50] and big.full
    whole = store.read_log(0, mark, 100, "/b", max_bytes=10_000)
    assert len(whole.events) == len(sizes) and not whole.full
    assert not store.read_log(0, mark, 100, "/b").full
    assert len(store.read_log(0, mark, 3, "/b", max_bytes=10_000).events) == 3
    for reverse in (False, True):
        pages: list[list[int]] = []
        got: list[Event] = []
        top = mark
        after = 0
        while True:
            page = store.read_log(after, top, 4, "/b", reverse=reverse, max_bytes=500)
            got += page.events
            pages.append([len(e.payload) for e in page.events])
            assert sum(pages[-1][:-1]) < 500  # stops at the event that reaches the budget
            if len(page.events) < 4 and not page.full:
                break
            if reverse:
                top = LogMark(page.pos - 1, mark.time_ns)
            else:
                after = page.pos
        order = list(reversed(written)) if reverse else written
        assert [(e.channel, e.seq) for e in got] == [(e.channel, e.seq) for e in order]
        assert [e.payload for e in got] == [e.payload for e in order]
        if not reverse:
            assert pages == [[100, 300, 50, 1000], [10, 10, 10, 400], [5, 700], []]


def test_read_log_gives_every_event_whole_whatever_its_publisher(store: LogStore) -> None:
    """``read_log`` pages through events whose publishers differ in one field each, interleaved (an engine
    may carry a page's publisher over to the next): every event comes back as written, field by field."""
    publishers = [
        Publisher("native", "alice", "app1", ""),
        Publisher("guble", "alice", "app1", ""),
        Publisher("native", "bob", "app1", ""),
        Publisher("native", "alice", "app2", ""),
        Publisher("native", "alice", "app1", "m1"),
    ]
    reqs = [
        AppendRequest(
            f"/w/{i % 3}",
            publishers[i * 7 % len(publishers)],
            b"p%d" % i,
            "text/plain" if i % 4 else "application/json",
            {"h": str(i)} if i % 5 == 0 else {},
            ("t",) if i % 6 == 0 else (),
        )
        for i in range(40)
    ]
    written = [r.event for r in store.append(reqs)]
    mark = store.log_mark()
    for size in (1, 2, 3, 100):
        got: list[Event] = []
        after = 0
        while True:
            page = store.read_log(after, mark, size, "/w")
            got += page.events
            if len(page.events) < size:
                break
            after = page.pos
        assert got == written, size


def test_read_by_time_range(factory: Factory, store: LogStore) -> None:
    stamps = []
    for _ in range(8):
        stamps.append(store.append([req("/t"), req("/other"), req("/t")])[0].event.time_ns)
        factory.clock.advance(1)
    evs = store.read("/t")
    assert seqs(store.read("/t", from_time=stamps[3])) == [7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    assert seqs(store.read("/t", to_time=stamps[2])) == [1, 2, 3, 4]
    assert seqs(store.read("/t", from_time=stamps[2], to_time=stamps[4])) == [5, 6, 7, 8]
    assert seqs(store.read("/t", after_seq=6, from_time=stamps[2], to_time=stamps[4])) == [7, 8]
    assert seqs(store.read("/t", from_time=stamps[2], limit=3)) == [5, 6, 7]
    # from_time inclusive, to_time exclusive, at the exact time of an event.
    assert seqs(store.read("/t", from_time=evs[5].time_ns, to_time=evs[7].time_ns)) == [6, 7]
    assert store.read("/t", from_time=stamps[-1] + NS) == []
    assert store.read("/t", to_time=stamps[0]) == []
    assert store.read("/t", from_time=stamps[5], to_time=stamps[2]) == []
    assert seqs(store.read("/t", from_time=-(2**70), to_time=2**70)) == list(range(1, 17))


def test_read_last(store: LogStore) -> None:
    append_n(store, "/a", 5)
    assert seqs(store.read_last("/a", 3)) == [3, 4, 5]
    assert seqs(store.read_last("/a", 50)) == [1, 2, 3, 4, 5]
    assert store.read_last("/a", 0) == []
    assert store.read_last("/nope", 3) == []


def test_head_of_unknown_and_known_channels(store: LogStore) -> None:
    info = store.head("/never")
    assert info == ChannelInfo("/never", "", 0, 0, 0)
    assert info.empty
    evs = append_n(store, "/a", 3)
    info = store.head("/a")
    assert info == ChannelInfo("/a", evs[0].epoch, 1, 3, evs[-1].time_ns)
    assert not info.empty
    heads = store.heads(["/a", "/never", "/a"])
    assert heads == {"/a": info, "/never": ChannelInfo("/never", "", 0, 0, 0)}


def test_channels_order_after_limit_prefix(store: LogStore) -> None:
    names = ["/b", "/a/2", "/a", "/a/10", "/é", "/z", "/\U0001f600", "/\uffff", "/A", "/a b"]
    store.append([req(n) for n in names])
    expected = sorted(names, key=lambda n: n.encode())
    got = [c.channel for c in store.channels()]
    assert got == expected
    assert [c.channel for c in store.channels(limit=3)] == expected[:3]
    assert [c.channel for c in store.channels(after=expected[3], limit=2)] == expected[4:6]
    assert store.channels(after=expected[-1]) == []
    assert store.channels(limit=0) == []
    assert [c.channel for c in store.channels(prefix="/a")] == ["/a", "/a b", "/a/10", "/a/2"]
    assert [c.channel for c in store.channels(prefix="/a/")] == ["/a/10", "/a/2"]
    assert [c.channel for c in store.channels(prefix="/a", after="/a b")] == ["/a/10", "/a/2"]
    assert [c.channel for c in store.channels(prefix="/\U0001f600")] == ["/\U0001f600"]
    assert [c.channel for c in store.channels(prefix="/\U0010ffff")] == []
    assert store.channels(prefix="/q") == []
    info = {c.channel: c for c in store.channels()}
    assert info["/b"] == store.head("/b")
    # Channels without retained events are left out.
    store.reset_channel("/b")
    assert "/b" not in [c.channel for c in store.channels()]


# -- retention -------------------------------------------------------------------------------------------


def test_retention_by_count(factory: Factory) -> None:
    store = factory.open(RetentionPolicy(max_events=3))
    evs = append_n(store, "/a", 2)
    assert store.head("/a").first == 1
    evs += append_n(store, "/a", 5)  # 7 appended, within one batch too
    head = store.head("/a")
    assert (head.epoch, head.first, head.top, head.top_time) == (evs[0].epoch, 5, 7, evs[-1].time_ns)
    assert seqs(store.read("/a")) == [5, 6, 7]
    assert seqs(store.read_last("/a", 10)) == [5, 6, 7]
    assert store.stats() == StoreStats(events=3, bytes=3, channels=1)
    assert store.append([req("/a")])[0].event.seq == 8
    assert store.head("/a").first == 6


def test_retention_by_bytes(factory: Factory) -> None:
    store = factory.open(RetentionPolicy(max_bytes=10))
    store.append([req("/a", b"1234"), req("/a", b"1234")])
    assert store.head("/a").first == 1
    store.append([req("/a", b"123")])  # 11 bytes: the oldest goes
    assert (store.head("/a").first, store.head("/a").top) == (2, 3)
    assert store.stats().bytes == 7
    # Headers and tags count as well.
    store.append([req("/a", b"", headers={"k": "v"})])  # 2 bytes -> 9
    assert store.head("/a").first == 2
    store.append([req("/a", b"", tags=("t",))])  # 1 byte -> 10
    assert store.head("/a").first == 2
    # A single event over the limit is committed, acknowledged, and trimmed at once.
    ev = store.append([req("/a", b"x" * 11)])[0].event
    head = store.head("/a")
    assert (ev.seq, head.first, head.top, head.epoch) == (6, 7, 6, ev.epoch)
    assert store.read("/a") == []
    assert store.channels() == []
    assert store.stats() == StoreStats(0, 0, 0)
    assert store.append([req("/a", b"ok")])[0].event.seq == 7
    assert seqs(store.read("/a")) == [7]
    # Exactly at the limit is within it: 2 + 4 + 4 = 10 keeps all three, and one more drops only the oldest.
    store.append([req("/a", b"1234"), req("/a", b"1234")])
    assert seqs(store.read("/a")) == [7, 8, 9]
    store.append([req("/a", b"12")])
    assert seqs(store.read("/a")) == [8, 9, 10]


def test_retention_by_age(factory: Factory, store: LogStore) -> None:
    clock = factory.clock
    epoch_b = store.append([req("/a"), req("/b")])[1].event.epoch
    clock.advance(10)
    store.append([req("/a")])
    clock.advance(10)
    store.append([req("/a"), req("/c")])
    assert store.apply_retention(RetentionPolicy(), clock.now) == 0
    removed = store.apply_retention(RetentionPolicy(max_age_s=15), clock.now)
    assert removed == 2  # /a 1 and /b 1 are 20 s old; /a 2 is 10 s old
    assert (store.head("/a").first, store.head("/a").top) == (2, 3)
    assert seqs(store.read("/a")) == [2, 3]
    b = store.head("/b")
    assert (b.first, b.top, b.epoch) == (2, 1, epoch_b)
    assert store.read("/b") == []
    assert [c.channel for c in store.channels()] == ["/a", "/c"]
    assert store.apply_retention(RetentionPolicy(max_age_s=15), clock.now) == 0
    assert store.apply_retention(RetentionPolicy(max_age_s=1), clock.now + 2 * NS) == 3
    assert store.stats() == StoreStats(0, 0, 0)
    assert store.head("/a").top == 3
    assert store.append([req("/a")])[0].event.seq == 4


def test_retention_by_total_size(factory: Factory, store: LogStore) -> None:
    for _ in range(4):
        store.append([req("/a", b"aaaa"), req("/b", b"bb")])
        factory.clock.advance(1)
    assert store.stats() == StoreStats(events=8, bytes=24, channels=2)
    assert store.apply_retention(RetentionPolicy(max_total_bytes=24), factory.clock.now) == 0
    # Oldest first by time over the whole log: a1 b1 a2 (10 bytes) brings 24 down to 14.
    assert store.apply_retention(RetentionPolicy(max_total_bytes=15), factory.clock.now) == 3
    assert (store.head("/a").first, store.head("/b").first) == (3, 2)
    assert store.stats() == StoreStats(events=5, bytes=14, channels=2)
    epoch_a = store.head("/a").epoch
    assert store.apply_retention(RetentionPolicy(max_total_bytes=1), factory.clock.now) == 5
    a = store.head("/a")
    assert (a.first, a.top, a.epoch) == (5, 4, epoch_a)
    assert store.stats() == StoreStats(0, 0, 0)


def test_retention_age_and_total_together(factory: Factory, store: LogStore) -> None:
    store.append([req("/a", b"1234")])
    factory.clock.advance(100)
    store.append([req("/a", b"1234"), req("/b", b"1234")])
    removed = store.apply_retention(RetentionPolicy(max_age_s=50, max_total_bytes=4), factory.clock.now)
    assert removed == 2
    assert seqs(store.read("/b")) == [1]


# -- resets --------------------------------------------------------------------------------------------


def test_reset_channel(factory: Factory, store: LogStore) -> None:
    old = append_n(store, "/a", 3)
    append_n(store, "/b", 1)
    info = store.reset_channel("/a")
    assert EPOCH_RE.match(info.epoch) and info.epoch != old[0].epoch
    assert (info.channel, info.first, info.top, info.top_time) == ("/a", 1, 0, 0)
    assert store.head("/a") == info
    assert store.read("/a") == [] and store.read_last("/a", 5) == []
    assert [c.channel for c in store.channels()] == ["/b"]
    ev = store.append([req("/a")])[0].event
    assert (ev.seq, ev.epoch) == (1, info.epoch)
    assert ev.time_ns > old[-1].time_ns
    assert seqs(store.read("/b")) == [1]
    fresh = store.reset_channel("/fresh")
    assert (fresh.first, fresh.top) == (1, 0) and EPOCH_RE.match(fresh.epoch)
    assert store.head("/fresh") == fresh
    assert store.append([req("/fresh")])[0].event.position.epoch == fresh.epoch
    if factory.persistent:
        store = factory.reopen(store)
        assert store.head("/a").epoch == info.epoch
        assert seqs(store.read("/a")) == [1]


def test_reset_keeps_the_old_epochs_events(factory: Factory, store: LogStore) -> None:
    """A new epoch deletes nothing: the old epoch's events stay, readable under their old epoch."""
    old = append_n(store, "/a", 3, b"xy")
    append_n(store, "/b", 1)
    first = store.reset_channel("/a")
    assert store.stats() == StoreStats(events=4, bytes=7, channels=1, retired_epochs=1)
    retired = ChannelInfo("/a", old[0].epoch, 1, 3, old[-1].time_ns)
    assert store.retired_epochs("/a") == [retired] and store.retired_epochs("/b") == []
    assert store.read("/a", epoch=old[0].epoch) == old
    assert store.read("/a", 1, 1, epoch=old[0].epoch) == old[1:2]
    assert store.read("/a", epoch=first.epoch) == [] and store.read("/a", epoch="nosuchep") == []
    new = append_n(store, "/a", 2)
    assert seqs(store.read("/a")) == [1, 2] and {e.epoch for e in store.read("/a")} == {first.epoch}
    second = store.reset_channel("/a")
    assert [ci.epoch for ci in store.retired_epochs("/a")] == [old[0].epoch, first.epoch]
    # An epoch without events leaves nothing behind.
    store.reset_channel("/a")
    assert [ci.epoch for ci in store.retired_epochs("/a")] == [old[0].epoch, first.epoch]
    assert store.head("/a").epoch not in (second.epoch, "")
    assert store.stats() == StoreStats(events=6, bytes=9, channels=1, retired_epochs=2)
    if factory.persistent:
        store = factory.reopen(store)
        assert store.retired_epochs("/a")[0] == retired
        assert store.read("/a", epoch=old[0].epoch) == old
        assert store.read("/a", epoch=first.epoch) == new
        assert store.stats() == StoreStats(events=6, bytes=9, channels=1, retired_epochs=2)
        assert store.append([req("/a")])[0].event.seq == 1


def test_retired_epochs_are_trimmed_by_retention_and_trim(factory: Factory, store: LogStore) -> None:
    old = append_n(store, "/a", 4, b"abcd")
    store.reset_channel("/a")
    factory.clock.advance(10)
    append_n(store, "/a", 2, b"ab")
    # Total size: the oldest events of the whole log go first, retired epochs included.
    assert store.apply_retention(RetentionPolicy(max_total_bytes=16), factory.clock.now) == 1
    assert store.retired_epochs("/a") == [ChannelInfo("/a", old[0].epoch, 2, 4, old[-1].time_ns)]
    # trim names the retired epoch; the current one is untouched.
    info = store.trim("/a", 2, epoch=old[0].epoch)
    assert info == ChannelInfo("/a", old[0].epoch, 3, 4, old[-1].time_ns)
    assert store.trim("/a", 1, epoch=old[0].epoch) == info  # never down
    assert seqs(store.read("/a", epoch=old[0].epoch)) == [3, 4] and seqs(store.read("/a")) == [1, 2]
    cur = store.head("/a")
    for seq, epoch, error in (
        (5, old[0].epoch, TrimOutOfRange),
        (0, "nosuchep", TrimEpochGone),
        (-1, old[0].epoch, TrimOutOfRange),
    ):
        with pytest.raises(error) as err:
            store.trim("/a", seq, epoch=epoch)
        assert isinstance(err.value, TrimError) and not isinstance(err.value, ValueError)
        if error is TrimEpochGone:  # it carries the current head (the 409's position)
            assert isinstance(err.value, EpochMismatch) and err.value.head == cur
        else:
            assert isinstance(err.value, TrimOutOfRange) and (err.value.seq, err.value.top) == (seq, 4)
    assert store.trim("/a", 1, epoch=cur.epoch).first == 2  # the current epoch by name
    # Age: the retired epoch's events are older than the cutoff, the current one's are not.
    assert store.apply_retention(RetentionPolicy(max_age_s=5), factory.clock.now) == 2
    assert store.retired_epochs("/a") == [] and store.read("/a", epoch=old[0].epoch) == []
    assert store.stats() == StoreStats(events=1, bytes=2, channels=1, retired_epochs=0)
    with pytest.raises(TrimEpochGone):
        store.trim("/a", 4, epoch=old[0].epoch)  # gone with its last event
    if factory.persistent:
        store = factory.reopen(store)
        assert store.retired_epochs("/a") == [] and store.stats().events == 1


def test_trim(factory: Factory, store: LogStore) -> None:
    a = append_n(store, "/a", 5, b"xx")
    append_n(store, "/b", 2)
    info = store.trim("/a", 3)
    assert info == ChannelInfo("/a", a[0].epoch, 4, 5, a[-1].time_ns)
    assert store.head("/a") == info
    assert seqs(store.read("/a")) == [4, 5] and seqs(store.read_last("/a", 10)) == [4, 5]
    assert store.stats() == StoreStats(events=4, bytes=2 * 2 + 2 * 1, channels=2)
    # Idempotent, and first never moves down.
    assert store.trim("/a", 3) == info and store.trim("/a", 1) == info and store.trim("/a", 0) == info
    assert seqs(store.read("/b")) == [1, 2]  # other channels untouched
    # Up to top: every event goes, the position stays.
    everything = store.trim("/a", 5)
    assert (everything.epoch, everything.first, everything.top) == (a[0].epoch, 6, 5)
    assert store.read("/a") == [] and [c.channel for c in store.channels()] == ["/b"]
    # A listing with the emptied channels keeps /a's position: where a reader that starts now goes on.
    assert store.channels(include_empty=True) == [everything, store.head("/b")]
    assert store.channels(include_empty=True, prefix="/a", limit=1) == [everything]
    assert store.channels(after="/a", include_empty=True) == [store.head("/b")]
    assert store.stats() == StoreStats(events=2, bytes=2, channels=1)
    ev = store.append([req("/a")])[0].event
    assert (ev.seq, ev.epoch) == (6, a[0].epoch)  # seq continues in the same epoch
    for channel, seq, top in (("/a", 7, 6), ("/a", -1, 6), ("/never", 1, 0)):
        with pytest.raises(TrimOutOfRange) as err:
            store.trim(channel, seq)
        assert (err.value.seq, err.value.top) == (seq, top)
    with pytest.raises(TrimEpochGone) as gone:
        store.trim("/never", 0, epoch="nosuchep")
    assert gone.value.head == ChannelInfo("/never", "", 0, 0, 0)
    assert seqs(store.read("/a")) == [6]
    assert store.trim("/never", 0) == ChannelInfo("/never", "", 0, 0, 0)
    assert store.head("/never").epoch == ""
    if factory.persistent:
        store = factory.reopen(store)
        assert store.head("/a") == ChannelInfo("/a", a[0].epoch, 6, 6, ev.time_ns)
        store.trim("/a", 6)
        assert store.channels(include_empty=True, prefix="/a") == [store.head("/a")]
        assert store.head("/a").first == 7 and store.channels(prefix="/a") == []
        assert store.stats() == StoreStats(events=2, bytes=2, channels=1)
        assert store.trim("/a", 6).first == 7 and store.read("/a") == []


def test_new_epochs_on_open(factory: Factory, store: LogStore) -> None:
    a = append_n(store, "/a", 3)
    b = append_n(store, "/b", 1)[0]
    store.trim("/b", 1)
    if factory.persistent:
        store = factory.reopen(store)
    store.new_epochs_on_open()
    ha, hb = store.head("/a"), store.head("/b")
    assert ha.epoch not in ("", a[0].epoch) and hb.epoch not in ("", b.epoch)
    assert (ha.first, ha.top, hb.first, hb.top) == (1, 0, 1, 0)
    assert store.read("/a") == [] and store.channels() == []
    # Nothing is deleted: the old epochs' events stay under their old epochs (/b had none left).
    assert store.stats() == StoreStats(events=3, bytes=3, channels=0, retired_epochs=1)
    assert store.retired_epochs("/a") == [ChannelInfo("/a", a[0].epoch, 1, 3, a[-1].time_ns)]
    assert store.read("/a", epoch=a[0].epoch) == a and store.retired_epochs("/b") == []
    ev = store.append([req("/a")])[0].event
    assert (ev.seq, ev.epoch) == (1, ha.epoch)


# -- idempotency -----------------------------------------------------------------------------------------


def test_idempotent_append(factory: Factory) -> None:
    store = factory.open(idem_window_s=60)
    orig = store.append([req("/a", b"one", idem="k1")])[0]
    assert not orig.duplicate
    factory.clock.advance(30)
    res = store.append(
        [req("/a", b"one", idem="k1"), req("/a", b"two", idem="k2"), req("/a", b"two", idem="k2")]
    )
    assert res[0].duplicate and res[0].event == orig.event
    assert not res[1].duplicate and res[1].event.seq == 2
    assert res[2].duplicate and res[2].event == res[1].event  # within one batch
    # Another user, another channel or no key: not a duplicate.
    other = store.append([req("/a", idem="k1", user="bob"), req("/b", idem="k1"), req("/a"), req("/a")])
    assert not any(r.duplicate for r in other)
    assert seqs(store.read("/a")) == [1, 2, 3, 4, 5]
    assert store.stats().events == 6
    # Past the window (by the new commit's time) the key may be used again.
    factory.clock.advance(30)
    again = store.append([req("/a", b"one", idem="k1")])[0]
    assert not again.duplicate and again.event.seq == 6
    assert store.append([req("/a", b"one", idem="k1")])[0].event == again.event


def test_idempotent_batch_interleaving_channels_and_users(factory: Factory) -> None:
    """A batch whose keyed rows switch channel and user back and forth (each switch a new run of keys in
    the SQLite engine), retried: every row is answered with its original event, nothing is appended."""
    store = factory.open(idem_window_s=60)
    shape = [("/a", "alice"), ("/b", "alice"), ("/a", "alice"), ("/a", "bob"), ("/b", "bob"), ("/a", "alice")]
    batch = [
        req(ch, f"{i}".encode(), user=user, idem=f"k{i}", headers={"src": f"s{i}"})
        for i, (ch, user) in enumerate(shape * 40)
    ]
    first = store.append(batch)
    assert not any(r.duplicate for r in first)
    assert seqs(store.read("/a")) == list(range(1, 161)) and seqs(store.read("/b")) == list(range(1, 81))
    factory.clock.advance(1)
    again = store.append([*batch[::-1], req("/a", b"new", idem="k-new")])
    assert [r.duplicate for r in again] == [True] * len(batch) + [False]
    assert [r.event for r in again[:-1]] == [r.event for r in first][::-1]
    assert again[-1].event.seq == 161
    assert store.stats().events == len(batch) + 1


def test_appends_match_the_memory_reference(factory: Factory) -> None:
    """Every engine executes the one sequencing plan (``hubbub.log.sequencing``): batches of keyed and
    unkeyed requests over a few channels and users, with retries inside and across batches, keys expiring,
    the clock stepping back, new channels and a reset, give each engine the results of the memory reference
    (epochs compared through the bijection learned as they appear)."""
    rnd = random.Random(30)
    store = factory.open(idem_window_s=2)
    ref = MemoryLogStore(idem_window_s=2, clock=factory.clock)
    epochs: dict[str, str] = {}

    def same(a: Event, b: Event) -> None:
        assert epochs.setdefault(a.epoch, b.epoch) == b.epoch
        assert (a.channel, a.seq, a.time_ns, a.payload, a.headers, a.tags, a.publisher) == (
            b.channel,
            b.seq,
            b.time_ns,
            b.payload,
            b.headers,
            b.tags,
            b.publisher,
        )

    for step in range(60):
        batch = []
        for _ in range(rnd.randrange(1, 40)):
            ch = rnd.choice(["/a", "/b", "/a/b", f"/new{step}"])
            user = rnd.choice(["alice", "bob"])
            key = rnd.choice(["", "", "k1", "k2", "k3"])
            # A repeated key is a repeated request: the same content.
            body = f"{user}{ch}{key}".encode() if key else rnd.randbytes(rnd.randrange(8))
            batch.append(req(ch, body, user=user, idem=key, tags=(user,) if key else ()))
        got, want = store.append(batch), ref.append(batch)
        assert [r.duplicate for r in got] == [r.duplicate for r in want]
        for g, w in zip(got, want, strict=True):
            same(g.event, w.event)
        if step == 30:
            g_head, w_head = store.reset_channel("/a"), ref.reset_channel("/a")
            assert epochs.setdefault(g_head.epoch, w_head.epoch) == w_head.epoch
            assert (g_head.first, g_head.top) == (w_head.first, w_head.top)
        factory.clock.advance(rnd.choice([0, 0.3, 0.9, -0.5]))
    for ch in ["/a", "/b", "/a/b"]:
        got_events, want_events = store.read(ch, limit=10_000), ref.read(ch, limit=10_000)
        assert len(got_events) == len(want_events)
        for g_ev, w_ev in zip(got_events, want_events, strict=True):
            same(g_ev, w_ev)


def test_idempotency_window_in_fractions_of_a_second(factory: Factory) -> None:
    store = factory.open(idem_window_s=0.5)
    orig = store.append([req("/a", idem="k")])[0]
    factory.clock.advance(0.4)
    assert store.append([req("/a", idem="k")])[0].event == orig.event
    factory.clock.advance(0.2)
    assert not store.append([req("/a", idem="k")])[0].duplicate


def test_sqlite_prunes_expired_keys_in_bounded_steps(tmp_path: Path) -> None:
    """A long backlog of expired idempotency keys goes over several appends (some commits run on the event
    loop), never all in one; a key past its window is appended anew meanwhile, and one inside it is not."""
    from hubbub.log.sqlite import _store as sqlite_store

    clock = Clock()
    store = SqliteLogStore(tmp_path / "log.db", durability="commit", idem_window_s=60, clock=clock)
    try:
        step = sqlite_store._IDEM_PRUNE_MAX
        for b in range(5):  # 5 commits of step keys, one commit time each
            store.append([req("/k", idem=f"old{b}-{i}") for i in range(step)])
            clock.advance(1)
        clock.advance(60)  # all expired

        def keys() -> int:
            with contextlib.closing(sqlite3.connect(tmp_path / "log.db")) as conn:
                n: int = conn.execute("SELECT count(*) FROM idem").fetchone()[0]
                return n

        left = [keys()]
        assert left == [5 * step]
        live = store.append([req("/k", idem="live")])[0].event
        left.append(keys())
        for _ in range(5):
            again = store.append([req("/k", idem="old4-0"), req("/k", idem="live")])
            assert again[1].duplicate and again[1].event == live  # in the window: never appended again
            left.append(keys())
        # Past its window "old4-0" was appended anew (once: later appends answer with that new event).
        fresh = store.read("/k", after_seq=5 * step, limit=10)
        assert [e.publisher.msg_id for e in fresh] == ["live", "old4-0"]
        # Each append deleted at most one bound's worth (plus the other keys of that commit time), and the
        # backlog took several appends.
        drops = [a - b for a, b in itertools.pairwise(left)]
        assert all(d <= 2 * step for d in drops), drops
        assert len([d for d in drops if d > 0]) >= 3, drops
        assert keys() == 2, drops  # "live" and the re-keyed "old4-0"
    finally:
        store.close()


def test_keyed_batches_after_fresh_ones_answer_repeats_with_the_original(factory: Factory) -> None:
    """A bulk load's batches: all keys new, then a batch mixing new keys, keys of earlier batches, a key
    repeated inside it and a new channel; then an expired key. (The sqlite engine writes the keys of a batch
    that follows a batch of new keys without looking them up first, and starts the batch over when one was
    known: the results, heads and log must be as if it had looked them up.)"""
    store = factory.open(idem_window_s=60)
    first = store.append([req(f"/k/{'ab'[i % 2]}", b"%d" % i, idem=f"k{i}") for i in range(20)])
    fresh = store.append([req(f"/k/{'ab'[i % 2]}", b"%d" % i, idem=f"k{i}") for i in range(20, 40)])
    assert not any(r.duplicate for r in first + fresh)
    mixed = [
        req("/k/a", b"new", idem="n1"),
        req("/k/b", b"again", idem="k3"),  # from the first batch
        req("/k/new", b"n", idem="n2"),  # a channel this batch creates
        req("/k/a", b"again", idem="k24"),  # from the second batch
        req("/k/a", b"new", idem="n1"),  # repeated inside the batch
        req("/k/b", b"plain"),
        req("/k/new", b"n", idem="n3"),
    ]
    res = store.append(mixed)
    assert [r.duplicate for r in res] == [False, True, False, True, True, False, False]
    assert res[1].event == first[3].event and res[3].event == fresh[4].event and res[4].event == res[0].event
    assert [(r.event.channel, r.event.seq) for r in res if not r.duplicate] == [
        ("/k/a", 21),
        ("/k/new", 1),
        ("/k/b", 21),
        ("/k/new", 2),
    ]
    assert store.head("/k/a").top == 21 and store.head("/k/b").top == 21 and store.head("/k/new").top == 2
    assert [e.seq for e in store.read("/k/new")] == [1, 2]
    assert seqs(store.read("/k/a", limit=100)) == list(range(1, 22))
    assert store.stats().events == 44
    # Fresh keys again, then (past the window) a key that was known: appended anew.
    assert not any(r.duplicate for r in store.append([req("/k/a", idem=f"f{i}") for i in range(5)]))
    factory.clock.advance(61)
    late = store.append([req("/k/a", idem="k0"), req("/k/a", idem="g1")])
    assert not any(r.duplicate for r in late) and [r.event.seq for r in late] == [27, 28]
    assert store.append([req("/k/a", idem="k0")])[0].event == late[0].event
    assert seqs(store.read("/k/a", limit=100)) == list(range(1, 29))


def test_idempotency_survives_restart(factory: Factory) -> None:
    if not factory.persistent:
        pytest.skip("the memory engine keeps nothing across a restart")
    store = factory.open(idem_window_s=60)
    orig = store.append([req("/a", b"p", idem="k", headers={"h": "v"}, tags=("t",))])[0].event
    store = factory.reopen(store)
    dup = store.append([req("/a", b"p", idem="k", headers={"h": "v"}, tags=("t",))])[0]
    assert dup.duplicate and dup.event == orig
    factory.clock.advance(61)
    store = factory.reopen(store)
    assert not store.append([req("/a", b"p", idem="k")])[0].duplicate


def test_idempotency_of_trimmed_event_and_after_reset(factory: Factory) -> None:
    store = factory.open(RetentionPolicy(max_events=1), idem_window_s=60)
    orig = store.append([req("/a", b"p", idem="k")])[0].event
    store.append([req("/a", b"later")])
    dup = store.append([req("/a", b"p", idem="k")])[0]
    assert dup.duplicate and (dup.event.seq, dup.event.epoch, dup.event.time_ns) == (
        1,
        orig.epoch,
        orig.time_ns,
    )
    assert dup.event.payload == b"p"
    # After a new epoch, a retry still answers the original, in its old epoch (trimmed: rebuilt).
    store.reset_channel("/a")
    res = store.append([req("/a", b"p", idem="k")])[0]
    assert res.duplicate and res.event == dup.event
    assert store.head("/a").top == 0
    # Past the window the key is new, in the new epoch.
    factory.clock.advance(61)
    res = store.append([req("/a", b"p", idem="k")])[0]
    assert not res.duplicate and res.event.seq == 1 and res.event.epoch == store.head("/a").epoch


def test_idempotency_across_new_epochs(factory: Factory) -> None:
    """A retry of a publish acknowledged before a new epoch is the same publish: it answers the original
    event (still in the log, under its old epoch) and appends nothing, however many epochs later."""
    store = factory.open(idem_window_s=60)
    orig = store.append([req("/a", b"p", idem="k", headers={"h": "v"}, tags=("t",))])[0].event
    store.append([req("/a", b"q", idem="k2")])
    store.reset_channel("/a")
    store.append([req("/a", b"new")])
    if factory.persistent:
        store = factory.reopen(store)
    store.new_epochs_on_open()
    res = store.append([req("/a", b"p", idem="k", headers={"h": "v"}, tags=("t",)), req("/a", b"r")])
    assert res[0].duplicate and res[0].event == orig
    assert not res[1].duplicate and (res[1].event.seq, res[1].event.epoch) == (1, store.head("/a").epoch)
    # Another user's key is not the same publish.
    assert not store.append([req("/a", b"p", idem="k", user="bob")])[0].duplicate
    # A key used again in the new epoch (past the window) is the new epoch's from then on.
    factory.clock.advance(61)
    again = store.append([req("/a", b"q", idem="k2")])[0]
    assert not again.duplicate and again.event.epoch == store.head("/a").epoch
    assert store.append([req("/a", b"q", idem="k2")])[0].event == again.event
    if factory.persistent:
        store = factory.reopen(store)
        assert store.append([req("/a", b"q", idem="k2")])[0].event == again.event


def test_idempotency_of_big_keyed_batches(factory: Factory) -> None:
    """A bulk load's batches (every publish keyed, many channels and users, odd sizes past one statement's
    rows, keys any text): a retry of each batch, whole or mixed with new keys, appends only the new ones."""
    store = factory.open(idem_window_s=60)
    odd = ['q"uote', "back\\slash", "é", "\U0001f600", "a,b]", "[", "null", "1", " ", "\t"]
    keys = [f"/src/c{i % 3}#ep:{i}" for i in range(1100)] + odd
    batch = [req(f"/c{i % 3}", str(i).encode(), idem=k, user=f"u{i % 2}") for i, k in enumerate(keys)]
    first = store.append(batch)
    assert not any(r.duplicate for r in first)
    if factory.persistent:
        store = factory.reopen(store)
    factory.clock.advance(10)
    again = store.append(batch)
    assert all(r.duplicate for r in again)
    assert [r.event for r in again] == [r.event for r in first]
    # Half old keys, half new ones, interleaved, and a new key repeated in the batch.
    new = [req(f"/c{i % 3}", b"n", idem=f"new{i}", user=f"u{i % 2}") for i in range(250)]
    mixed = [x for pair in zip(batch[::4], new, strict=False) for x in pair] + [new[0]]
    res = store.append(mixed)
    assert [r.duplicate for r in res] == [i % 2 == 0 for i in range(len(mixed) - 1)] + [True]
    assert res[-1].event == res[1].event
    assert store.stats().events == len(keys) + len(new)
    # The same key of another user is another publish.
    assert not store.append([req("/c0", idem=keys[0], user="u9")])[0].duplicate


def test_idempotency_off_with_zero_window(factory: Factory) -> None:
    store = factory.open(idem_window_s=0)
    res = store.append([req("/a", idem="k"), req("/a", idem="k")])
    assert [r.duplicate for r in res] == [False, False]
    assert seqs(store.read("/a")) == [1, 2]


# -- stats, close ---------------------------------------------------------------------------------------


def test_stats(store: LogStore) -> None:
    assert store.stats() == StoreStats(0, 0, 0)
    store.append([req("/a", b"abc", headers={"k": "vv"}, tags=("t1",)), req("/b", "é".encode()), req("/a")])
    evs = store.read("/a") + store.read("/b")
    assert store.stats() == StoreStats(events=3, bytes=sum(e.size for e in evs), channels=2)
    assert store.stats().bytes == 3 + 3 + 2 + 2 + 1


def test_close_is_idempotent_and_final(factory: Factory, store: LogStore) -> None:
    store.append([req("/a")])
    store.close()
    store.close()
    with pytest.raises(StorageError):
        store.append([req("/a")])
    with pytest.raises(StorageError):
        store.read("/a")
    with pytest.raises(StorageError):
        store.head("/a")
    if factory.persistent:
        reopened = factory.open()
        assert seqs(reopened.read("/a")) == [1]


# -- concurrency ---------------------------------------------------------------------------------------


def test_reads_from_other_threads_while_appending(store: LogStore) -> None:
    batches, per_batch = 60, 25
    done = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            last_top = 0
            while True:
                finished = done.is_set()
                head = store.head("/a")
                assert head.top >= last_top and head.top % per_batch == 0  # whole batches only
                last_top = head.top
                evs = store.read("/a", after_seq=max(head.top - 40, 0), limit=100)
                assert seqs(evs) == list(range(evs[0].seq, evs[0].seq + len(evs))) if evs else True
                assert not evs or evs[-1].seq >= head.top
                last = store.read_last("/b", 3)
                assert len({e.epoch for e in last}) <= 1
                store.stats()
                store.channels()
                if finished:
                    assert head.top == batches * per_batch
                    return
        except BaseException as exc:  # handed to the main thread
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(batches):
            store.append([req("/a") for _ in range(per_batch - 1)] + [req("/b"), req("/a")])
    finally:
        done.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads)
    assert store.head("/a").top == batches * per_batch


# -- bulk reads (the data pipeline) -----------------------------------------------------------------------


def test_read_rows_compact_text(store: LogStore) -> None:
    store.append(
        [
            req("/a", b"1", user="u1"),
            req("/a", b"2", user="u1"),
            req("/a", b"3", user="u2", content_type="application/json"),
            req("/a", b"4", user="u1", idem="k4", headers={"h": "v"}, tags=("t",)),
        ]
    )
    epoch, full = store.read_rows("/a", 0, 100)
    assert epoch == store.head("/a").epoch
    evs = store.read("/a")
    assert full == [
        (
            e.seq,
            e.time_ns,
            e.publisher.dialect,
            e.publisher.user,
            e.publisher.app,
            e.publisher.msg_id,
            e.content_type,
            encode_headers(e.headers),
            encode_tags(e.tags),
            e.payload,
        )
        for e in evs
    ]
    compact = store.read_rows("/a", 0, 100, compact_text=True)[1]
    assert compact[0] == full[0]
    assert [r[3] for r in compact] == ["u1", None, "u2", None]
    assert [r[5] for r in compact] == ["", None, None, "k4"]
    assert [r[6] for r in compact] == ["text/plain", None, "application/json", None]
    assert [r[:2] + r[7:] for r in compact] == [r[:2] + r[7:] for r in full]
    page = store.read_rows("/a", 1, 2, compact_text=True)[1]  # compared with its own first row
    assert page[0] == full[1] and page[1][2:7] == (None, "u2", None, None, "application/json")
    assert store.read_rows("/a", 4, 10, compact_text=True) == (epoch, [])
    assert store.read_rows("/a", 0, 10, to_time=evs[2].time_ns)[1] == full[:2]
    assert store.read_rows("/none", 0, 10) == ("", [])
    old = store.reset_channel("/a")
    assert store.read_rows("/a", 0, 10) == (old.epoch, [])
    assert store.read_rows("/a", 2, 10, epoch=epoch) == (epoch, full[2:])
    assert store.read_rows("/a", 0, 10, epoch="nosuchep") == ("", [])


def _scan_all(
    store: LogStore, plan: ScanPlan, bounds: Sequence[tuple[int, int, int]] | None = None
) -> list[list[ScanRow]]:
    """Every piece of a plan, scanned, decoded: one list of rows per split."""
    return [
        _scan_rows(store, store.scan_columns(lo, hi, max_time=plan.max_time, bounds=bounds))
        for lo, hi in zip(plan.splits, plan.splits[1:], strict=False)
    ]


def test_scan_plan_and_columns(factory: Factory, store: LogStore) -> None:
    assert store.scan_plan(10) == ScanPlan((), 0, {}, 0, 0)
    assert store.scan_columns(1, 1, max_time=0) == []
    sent: list[Event] = []
    for i in range(12):
        ch = ["/a", "/b", "/c/ü"][i % 3]
        sent += [
            r.event
            for r in store.append(
                [
                    req(
                        ch,
                        bytes([i, 0, 255]) + "é".encode(),
                        user="ü" if i == 10 else "u",
                        headers={"h": str(i % 2)} if i % 3 else None,
                        tags=("t",) if i % 2 else (),
                        content_type="text/plain" if i < 9 else "application/json",
                    )
                ]
            )
        ]
        factory.clock.advance(1)
    store.trim("/a", 2)  # /a's seqs 1 and 2 go
    kept = [e for e in sent if not (e.channel == "/a" and e.seq <= 2)]
    plan = store.scan_plan(4)
    ids = {info.channel: cid for cid, info in plan.channels.items()}
    assert sorted(ids) == ["/a", "/b", "/c/ü"] and not plan.retired
    assert all(plan.channels[ids[ch]] == store.head(ch) for ch in ids)
    assert plan.events == 10 and plan.bytes == sum(e.size for e in kept)
    assert plan.max_time == store.top_time()
    pieces = _scan_all(store, plan)
    assert [len(p) for p in pieces] == [4, 4, 2]
    want = [
        (
            ids[e.channel],
            e.seq,
            e.time_ns,
            e.publisher.dialect,
            e.publisher.user,
            e.publisher.app,
            e.publisher.msg_id,
            e.content_type,
            encode_headers(e.headers),
            encode_tags(e.tags),
            e.payload,
        )
        for e in kept
    ]
    assert [r for p in pieces for r in p] == want  # pos order is commit order
    lo, hi = plan.splits[0], plan.splits[-1]
    first = store.scan_columns(plan.splits[0], plan.splits[1], max_time=plan.max_time)
    assert first[0].text == ("native", "u", "app1", "", "text/plain")  # one value each
    last = store.scan_columns(plan.splits[-2], plan.splits[-1], max_time=plan.max_time)
    assert not isinstance(last[0].text[1], str)  # users differ: one value per event
    # Bounds: epochs and seq ranges.
    bounded = store.scan_columns(lo, hi, max_time=plan.max_time, bounds=[(ids["/b"], 2, 3)])
    assert [(r[0], r[1]) for r in _scan_rows(store, bounded)] == [(ids["/b"], 2), (ids["/b"], 3)]
    assert store.scan_columns(lo, hi, max_time=plan.max_time, bounds=[]) == []
    # A time range is a pos range; max_time hides later commits.
    times = [r[2] for r in want]
    part = store.scan_plan(100, from_time=times[3], to_time=times[7])
    assert [r[2] for p in _scan_all(store, part) for r in p] == times[3:7]
    assert store.scan_plan(100, from_time=times[-1] + 1).splits == ()
    store.append([req("/a", b"late")])
    assert _scan_rows(store, store.scan_columns(lo, hi + 10, max_time=plan.max_time)) == want
    # Retired epochs are in the plan, under their own ids.
    old = store.head("/b")
    store.reset_channel("/b")
    plan = store.scan_plan(100)
    assert len(plan.retired) == 1
    (rid,) = plan.retired
    assert plan.channels[rid] == store.retired_epochs("/b")[0] == old
    assert [r[1] for p in _scan_all(store, plan) for r in p if r[0] == rid] == [1, 2, 3, 4]


# -- sqlite specifics ----------------------------------------------------------------------------------


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "hubbub.db"


def test_sqlite_read_rows_compact_text(sqlite_path: Path) -> None:
    store = SqliteLogStore(sqlite_path)
    try:
        store.append(
            [
                req("/a", b"1", user="u1"),
                req("/a", b"2", user="u1"),
                req("/a", b"3", user="u2", content_type="application/json"),
                req("/a", b"4", user="u1", idem="k4", headers={"h": "v"}),
            ]
        )
        epoch, full = store.read_rows("/a", 0, 100)
        assert store.read_rows("/a", 0, 100, compact_text=True)[0] == epoch
        compact = store.read_rows("/a", 0, 100, compact_text=True)[1]
        assert compact[0] == full[0]  # the first row holds every value
        text = slice(2, 7)  # publisher_dialect, _user, _app, _msg_id, content_type
        for c, f in zip(compact[1:], full[1:], strict=True):
            assert c[:2] == f[:2] and c[7:] == f[7:]
            assert [
                None if v == first else v for v, first in zip(f[text], full[0][text], strict=True)
            ] == list(c[text])
        assert [r[3] for r in compact] == ["u1", None, "u2", None]
        assert [r[5] for r in compact] == ["", None, None, "k4"]
        # A page compares with its own first row (seq 2 here), not the channel's.
        page = store.read_rows("/a", 1, 2, compact_text=True)[1]
        assert page[0] == full[1]
        assert page[1][2:7] == (None, "u2", None, None, "application/json")
        assert store.read_rows("/a", 4, 10, compact_text=True) == (epoch, [])
        assert store.read_rows("/none", 0, 10, compact_text=True) == ("", [])
    finally:
        store.close()


#: A row of :func:`_scan_rows`: ``(channel id, seq, time_ns, dialect, user, app, msg_id, content_type,
#: headers, tags, payload)``.
ScanRow = tuple[int, int, int, str, str, str, str, str, bytes, bytes, bytes]


def _scan_rows(store: LogStore, pieces: list[ScanColumns]) -> list[ScanRow]:
    """ScanColumns decoded in Python: ``(channel id, seq, time_ns, dialect, user, app, msg_id, content_type,
    headers, tags, payload)`` per event."""

    def ints(text: str) -> list[int]:
        return [int(x) for x in text.split(",")] if text else []

    def var(col: tuple[str, bytes]) -> list[bytes]:
        out, at = [], 0
        for n in ints(col[0]):
            out.append(col[1][at : at + n])
            at += n
        assert at == len(col[1])
        return out

    rows: list[ScanRow] = []
    for p in pieces:
        dialect, user, app, msg_id, content_type = (
            [v] * p.n if isinstance(v, str) else [b.decode() for b in var(v)] for v in p.text
        )
        ids, seqs, times = ints(p.channel_id), ints(p.seq), ints(p.time_ns)
        headers, tags, payload = var(p.headers), var(p.tags), var(p.payload)
        cols = (ids, seqs, times, dialect, user, app, msg_id, content_type, headers, tags, payload)
        assert all(len(c) == p.n for c in cols)
        rows.extend(zip(*cols, strict=True))
    return rows


def test_sqlite_scan_plan_and_columns(sqlite_path: Path) -> None:
    store = SqliteLogStore(sqlite_path)
    try:
        assert store.scan_plan(10) == ScanPlan((), 0, {}, 0, 0)
        assert store.scan_columns(1, 1, max_time=0) == []
        for i in range(12):
            ch = ["/a", "/b", "/c/ü"][i % 3]
            store.append(
                [
                    req(
                        ch,
                        bytes([i, 0, 255]) + "é".encode(),
                        user="ü" if i == 10 else "u",
                        headers={"h": str(i % 2)} if i % 3 else None,
                        tags=("t",) if i % 2 else (),
                        content_type="text/plain" if i < 9 else "application/json",
                    )
                ]
            )
        store.trim("/a", 2)  # a hole in pos: /a's seqs 1 and 2
        plan = store.scan_plan(4)
        ids = {info.channel: cid for cid, info in plan.channels.items()}
        assert sorted(ids) == ["/a", "/b", "/c/ü"]
        assert plan.events == 10 and plan.max_time == store.top_time()
        assert len(plan.splits) == 4  # 4 + 4 + 2 events
        reader = SqliteLogStore(sqlite_path, readonly=True)
        try:
            pieces = [
                p
                for lo, hi in zip(plan.splits, plan.splits[1:], strict=False)
                for p in reader.scan_columns(lo, hi, max_time=plan.max_time)
            ]
            assert [p.n for p in pieces] == [4, 4, 2]
            assert pieces[0].text == ("native", "u", "app1", "", "text/plain")  # one value each
            assert not isinstance(pieces[-1].text[1], str)  # users differ: one value per event
            got = _scan_rows(reader, pieces)
            want = sorted(
                ((ids[ch], *row) for ch in ids for row in reader.read_rows(ch, 0, 100)[1]),
                key=lambda r: r[2],  # time order is pos order
            )
            assert got == want
            # Bounds: channels and seq ranges, through the temporary table.
            lo, hi = plan.splits[0], plan.splits[-1]
            bounded = reader.scan_columns(lo, hi, max_time=plan.max_time, bounds=[(ids["/b"], 2, 3)])
            assert [(r[0], r[1]) for r in _scan_rows(reader, bounded)] == [(ids["/b"], 2), (ids["/b"], 3)]
            # A time range is a pos range; later commits are past max_time.
            times = [r[2] for r in want]
            part = store.scan_plan(100, from_time=times[3], to_time=times[7])
            pieces = reader.scan_columns(part.splits[0], part.splits[1], max_time=part.max_time)
            assert [r[2] for r in _scan_rows(reader, pieces)] == times[3:7]
            store.append([req("/a", b"late")])
            pieces = reader.scan_columns(lo, hi + 10, max_time=plan.max_time)
            assert _scan_rows(reader, pieces) == want
            # Over SQLite's string limit, a range is read in halves: the same events in pos order.
            reader._reader().setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 40)
            pieces = reader.scan_columns(lo, hi, max_time=plan.max_time)
            assert len(pieces) > 1 and _scan_rows(reader, pieces) == want
        finally:
            reader.close()
    finally:
        store.close()


class _ForgetfulNames(dict[int, tuple[str, str]]):
    """A channel-name cache that another reader clears between a page's two steps (the first look-up of
    each page finds it empty)."""

    # Not dict.get's overloads: the reads call get(cid) only.
    def get(self, key: int, default: object = None) -> object:  # type: ignore[override]  # see above
        self.clear()
        return super().get(key, default)


@pytest.mark.parametrize("forgetful", [False, True])
def test_sqlite_read_log_names_each_event_through_a_small_or_cleared_name_cache(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch, forgetful: bool
) -> None:
    """``read_log`` on SQLite names channels through a cache of channel ids shared by the readers: past its
    bound it is cleared, and another reader may clear it meanwhile; every event still comes back with its
    own channel and epoch (a channel reset to a new epoch has a new id), whole and in commit order."""
    monkeypatch.setattr(sqlite_reads, "_NAMES_MAX", 3)
    store = SqliteLogStore(sqlite_path)
    try:
        if forgetful:
            store._names = _ForgetfulNames()
        written = [r.event for r in store.append([req(f"/n/{i % 7}", b"%d" % i) for i in range(30)])]
        store.reset_channel("/n/3")
        written = [e for e in written if e.channel != "/n/3"]
        written += [r.event for r in store.append([req(f"/n/{i % 4 + 2}", b"r%d" % i) for i in range(12)])]
        mark = store.log_mark()
        for size in (1, 5, 100):
            got: list[Event] = []
            after = 0
            while True:
                page = store.read_log(after, mark, size, "/n")
                got += page.events
                if len(page.events) < size:
                    break
                after = page.pos
            assert got == written, size
    finally:
        store.close()


@pytest.mark.parametrize("max_params", [None, 40, 13])
def test_sqlite_rows_of_mixed_runs(sqlite_path: Path, max_params: int | None) -> None:
    """Rows are stored in append order (``pos``) with the right ``size``, also where SQLite allows only a few
    parameters per statement (so the multi-row inserts are smaller)."""
    store = SqliteLogStore(sqlite_path)
    try:
        if max_params is not None:
            assert store._conn is not None
            store._conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, max_params)
        events = [r.event for r in store.append(mixed_batch())]
        # Again, backwards (the idempotent requests are now duplicates: no rows).
        events += [r.event for r in store.append(mixed_batch()[::-1]) if not r.duplicate]
    finally:
        store.close()
    conn = sqlite3.connect(sqlite_path)
    try:
        rows = conn.execute(
            "SELECT c.path, e.seq, e.time_ns, e.size, e.publisher_msg_id FROM events e "
            "JOIN channels c ON c.id = e.channel_id ORDER BY e.pos"
        ).fetchall()
    finally:
        conn.close()
    assert rows == [(e.channel, e.seq, e.time_ns, e.size, e.publisher.msg_id) for e in events]
    # Every way of writing a row stores its headers, tags and payload as BLOBs (empty ones too).
    conn = sqlite3.connect(sqlite_path)
    try:
        kinds = conn.execute(
            "SELECT DISTINCT typeof(headers), typeof(tags), typeof(payload) FROM events"
        ).fetchall()
    finally:
        conn.close()
    assert kinds == [("blob", "blob", "blob")]


def test_sqlite_failed_commit_leaves_nothing_and_no_gap(sqlite_path: Path) -> None:
    store = SqliteLogStore(sqlite_path, busy_timeout_ms=50)
    try:
        store.append([req("/a"), req("/a")])
        blocker = sqlite3.connect(sqlite_path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            with pytest.raises(StorageError) as err:
                store.append([req("/a"), req("/new")])
            assert "SELECT" not in str(err.value) and str(sqlite_path) not in str(err.value)
            assert err.value.code == 4301
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        assert store.head("/a").top == 2 and store.head("/new").empty
        res = store.append([req("/a"), req("/new")])
        assert [r.event.seq for r in res] == [3, 1]
        assert seqs(store.read("/a")) == [1, 2, 3]
    finally:
        store.close()


def test_sqlite_one_writer_per_file(sqlite_path: Path) -> None:
    store = SqliteLogStore(sqlite_path)
    try:
        with pytest.raises(StorageError, match="in use"):
            SqliteLogStore(sqlite_path)
    finally:
        store.close()
    SqliteLogStore(sqlite_path).close()  # free again after close


def test_sqlite_refuses_unknown_schema_version(sqlite_path: Path) -> None:
    SqliteLogStore(sqlite_path).close()
    conn = sqlite3.connect(sqlite_path)
    with conn:
        conn.execute("UPDATE meta SET value = 99 WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(StorageError, match="schema version"):
        SqliteLogStore(sqlite_path)
    # The failed open released its lock: the second attempt fails the same way, not with "in use".
    with pytest.raises(StorageError, match="schema version"):
        SqliteLogStore(sqlite_path)


@pytest.mark.parametrize("durability", ["commit", "fsync"])
def test_sqlite_commits_survive_kill_9(sqlite_path: Path, durability: str) -> None:
    """A committed batch survives the process being killed without closing anything."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from hubbub.events import Publisher
        from hubbub.log import AppendRequest, SqliteLogStore
        st = SqliteLogStore({str(sqlite_path)!r}, durability={durability!r})
        pub = Publisher("native")
        for i in range(5):
            st.append([AppendRequest("/k", pub, b"p%d" % i, "text/plain") for _ in range(100)])
        print(st.head("/k").epoch, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == -9, proc.stderr
    epoch = proc.stdout.strip()
    store = SqliteLogStore(sqlite_path, durability=durability)
    try:
        assert store.head("/k") == ChannelInfo("/k", epoch, 1, 500, store.head("/k").top_time)
        assert seqs(store.read("/k", limit=1000)) == list(range(1, 501))
        assert store.append([req("/k")])[0].event.seq == 501
    finally:
        store.close()


# -- open_store ------------------------------------------------------------------------------------------


def test_commits_may_be_lost_only_for_the_epochs_of_an_unclean_stop(
    factory: Factory, store: LogStore
) -> None:
    """Nothing of a store that was opened fresh, or closed cleanly, can have been lost."""
    a = append_n(store, "/a", 2)[0]
    assert not store.commits_may_be_lost("/a", a.epoch) and not store.commits_may_be_lost("/none", "")
    if factory.persistent:
        store = factory.reopen(store)
        assert not store.commits_may_be_lost("/a", a.epoch)


def _killed_writer(path: Path, durability: str) -> str:
    """Append to ``/k`` in another process that is then killed (no close); returns ``/k``'s epoch."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from hubbub.events import Publisher
        from hubbub.log import AppendRequest, SqliteLogStore
        st = SqliteLogStore({str(path)!r}, durability={durability!r})
        st.append([AppendRequest("/k", Publisher("native"), b"p", "text/plain") for _ in range(3)])
        print(st.head("/k").epoch, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == -9, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("durability", ["commit", "none", "fsync"])
def test_sqlite_commits_may_be_lost_after_an_unclean_stop(sqlite_path: Path, durability: str) -> None:
    SqliteLogStore(sqlite_path).close()  # an earlier, clean run
    epoch = _killed_writer(sqlite_path, durability)
    store = SqliteLogStore(sqlite_path, durability="commit")
    try:
        # fsync synced every commit: nothing can be lost. Otherwise /k's epoch may have lost its last commits.
        assert store.commits_may_be_lost("/k", epoch) == (durability != "fsync")
        assert not store.commits_may_be_lost("/k", "otherepo")
        store.append([req("/n")])  # a channel begun since the unclean stop
        assert not store.commits_may_be_lost("/n", store.head("/n").epoch)
        store = _reopen(store, sqlite_path)  # a clean restart does not make it any less true
        assert store.commits_may_be_lost("/k", epoch) == (durability != "fsync")
        if durability != "fsync":
            new = store.reset_channel("/k")  # the new epoch is the store's own: nothing of it was lost
            assert not store.commits_may_be_lost("/k", new.epoch)
            assert not store.commits_may_be_lost("/k", epoch)
            assert seqs(store.read("/k", epoch=epoch)) == [1, 2, 3]
            store = _reopen(store, sqlite_path)
            assert not store.commits_may_be_lost("/k", new.epoch)
    finally:
        store.close()
    # durability=none: every start gives every channel a new epoch, so nothing is suspect after it.
    store = SqliteLogStore(sqlite_path, durability="none")
    try:
        store.new_epochs_on_open()
        assert not store.commits_may_be_lost("/k", store.head("/k").epoch)
    finally:
        store.close()


def _reopen(store: SqliteLogStore, path: Path) -> SqliteLogStore:
    store.close()
    return SqliteLogStore(path)


# The schema of version 1 as that version created it (frozen here: the migration's input).
_V1_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TABLE channels (id INTEGER PRIMARY KEY, path TEXT NOT NULL UNIQUE, epoch TEXT NOT NULL, "
    "first INTEGER NOT NULL, top INTEGER NOT NULL, top_time INTEGER NOT NULL, count INTEGER NOT NULL, "
    "bytes INTEGER NOT NULL)",
    "CREATE TABLE events (pos INTEGER PRIMARY KEY, channel_id INTEGER NOT NULL, seq INTEGER NOT NULL, "
    "time_ns INTEGER NOT NULL, size INTEGER NOT NULL, publisher_dialect TEXT NOT NULL, "
    "publisher_user TEXT NOT NULL, publisher_app TEXT NOT NULL, publisher_msg_id TEXT NOT NULL, "
    "content_type TEXT NOT NULL, headers BLOB NOT NULL, tags BLOB NOT NULL, payload BLOB NOT NULL)",
    "CREATE UNIQUE INDEX events_channel_seq ON events (channel_id, seq)",
    "CREATE TABLE idem (channel_id INTEGER NOT NULL, user TEXT NOT NULL, key TEXT NOT NULL, "
    "seq INTEGER NOT NULL, time_ns INTEGER NOT NULL, PRIMARY KEY (channel_id, user, key)) WITHOUT ROWID",
    "CREATE INDEX idem_time ON idem (time_ns)",
)


def test_sqlite_migrates_a_version_1_database(sqlite_path: Path) -> None:
    t1, t2 = START, START + 1
    conn = sqlite3.connect(sqlite_path)
    with conn:
        for stmt in _V1_SCHEMA:
            conn.execute(stmt)
        conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", 1), ("last_time", t2)])
        conn.execute("INSERT INTO channels VALUES (7, '/a', 'aaaaaaaa', 1, 2, ?, 2, 2)", (t2,))
        conn.executemany(
            "INSERT INTO events (channel_id, seq, time_ns, size, publisher_dialect, publisher_user, "
            "publisher_app, publisher_msg_id, content_type, headers, tags, payload) "
            "VALUES (7, ?, ?, 1, 'native', 'alice', 'app1', ?, 'text/plain', x'', x'', ?)",
            [(1, t1, "k", b"p"), (2, t2, "", b"q")],
        )
        conn.execute("INSERT INTO idem VALUES (7, 'alice', 'k', 1, ?)", (t1,))
    conn.close()
    with pytest.raises(StorageError, match="schema version"):
        SqliteLogStore(sqlite_path, readonly=True)  # a reader never migrates
    clock = Clock(t2 + NS)
    store = SqliteLogStore(sqlite_path, clock=clock)
    try:
        assert store.head("/a") == ChannelInfo("/a", "aaaaaaaa", 1, 2, t2)
        assert [(e.seq, e.payload, e.time_ns) for e in store.read("/a")] == [(1, b"p", t1), (2, b"q", t2)]
        dup = store.append([req("/a", b"p", idem="k")])[0]
        assert dup.duplicate and (dup.event.seq, dup.event.epoch) == (1, "aaaaaaaa")
        # How version 1's writer stopped is unknown: its epochs count as possibly having lost commits.
        assert store.commits_may_be_lost("/a", "aaaaaaaa")
        new = store.reset_channel("/a")
        assert store.append([req("/b"), req("/a")])[1].event.position.epoch == new.epoch
        assert store.retired_epochs("/a") == [ChannelInfo("/a", "aaaaaaaa", 1, 2, t2)]
        assert store.append([req("/a", b"p", idem="k")])[0].event == dup.event
        store = _reopen(store, sqlite_path)
        kept = store.read("/a", epoch="aaaaaaaa")
        assert seqs(kept) == [1, 2] and kept[0] == dup.event
        assert store.stats() == StoreStats(events=4, bytes=4, channels=2, retired_epochs=1)
        reader = SqliteLogStore(sqlite_path, readonly=True)
        try:
            assert reader.retired_epochs("/a") == store.retired_epochs("/a")
        finally:
            reader.close()
    finally:
        store.close()
    conn = sqlite3.connect(sqlite_path)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (4,)
    conn.close()


def test_sqlite_scan_plan_includes_retired_epochs(sqlite_path: Path) -> None:
    store = SqliteLogStore(sqlite_path)
    try:
        old = append_n(store, "/a", 3)
        append_n(store, "/b", 2)
        store.reset_channel("/a")
        new = append_n(store, "/a", 2)
        plan = store.scan_plan(100)
        assert plan.events == 7 and len(plan.retired) == 1
        by_epoch = {(ci.channel, ci.epoch): cid for cid, ci in plan.channels.items()}
        assert sorted(by_epoch) == sorted(
            [("/a", old[0].epoch), ("/a", new[0].epoch), ("/b", store.head("/b").epoch)]
        )
        assert plan.retired == {by_epoch["/a", old[0].epoch]}
        assert plan.channels[by_epoch["/a", old[0].epoch]] == store.retired_epochs("/a")[0]
        store.reset_channel("/a")  # after the plan: its ids still name the same epochs
        pieces = store.scan_columns(plan.splits[0], plan.splits[-1], max_time=plan.max_time)
        got = [
            (plan.channels[r[0]].channel, plan.channels[r[0]].epoch, r[1]) for r in _scan_rows(store, pieces)
        ]
        assert sorted(got) == sorted((e.channel, e.epoch, e.seq) for e in [*old, *new, *store.read("/b")])
    finally:
        store.close()


def test_open_store_urls(tmp_path: Path) -> None:
    pol = RetentionPolicy()
    data_dir = tmp_path / "data" / "dir"
    st = open_store("sqlite", str(data_dir), "commit", pol, 600)
    try:
        assert isinstance(st, SqliteLogStore) and st.engine == "sqlite"
        assert (data_dir / "hubbub.db").exists()
    finally:
        st.close()
    path = tmp_path / "other" / "x.db"
    st = open_store(f"sqlite://{path}", str(data_dir), "fsync", pol, 600)
    try:
        assert isinstance(st, SqliteLogStore) and st.path == path and st.durability == "fsync"
    finally:
        st.close()
    st = open_store("memory", str(tmp_path / "unused"), "none", pol, 600)
    try:
        assert isinstance(st, MemoryLogStore) and st.engine == "memory"
        assert not (tmp_path / "unused").exists()
    finally:
        st.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://relative.db", "three slashes"),
        ("sqlite:///", "three slashes"),
        ("redis://user:secret@host", "unknown log store redis://"),
        ("mysql", "unknown log store 'mysql'"),
        ("", "unknown log store"),
    ],
)
def test_open_store_rejects(tmp_path: Path, url: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        open_store(url, str(tmp_path), "commit", RetentionPolicy(), 600)
    assert "secret" not in str(err.value)


def test_open_store_postgres(pg_url: str) -> None:
    st = open_store(pg_url, "", "fsync", RetentionPolicy(max_events=5), 600)
    try:
        assert isinstance(st, PostgresLogStore) and st.engine == "postgres" and st.durability == "fsync"
        st.append([req("/a")])
    finally:
        st.close()
    st = open_store(pg_url.replace("postgresql://", "postgres://"), "", "commit", RetentionPolicy(), 600)
    try:
        assert seqs(st.read("/a")) == [1]
    finally:
        st.close()
    reader = open_store(pg_url, "", "commit", RetentionPolicy(), 0, readonly=True)
    try:
        assert reader.readonly and seqs(reader.read("/a")) == [1]
        with pytest.raises(StorageError, match="read-only"):
            reader.append([req("/a")])
    finally:
        reader.close()


@pytest.mark.parametrize(("durability", "setting"), [("fsync", "on"), ("commit", "local"), ("none", "off")])
def test_postgres_writer_runs_with_its_durabilitys_synchronous_commit(
    pg_url: str, durability: str, setting: str
) -> None:
    """The one thing ``fsync`` and ``commit`` do differently (the suite runs ``commit`` only, module
    docstring): the ``synchronous_commit`` of the connection every write goes through, also once it has
    reconnected."""
    store = PostgresLogStore(pg_url, durability=durability)
    try:
        store.append([req("/a")])
        assert store._writer().execute("SHOW synchronous_commit").fetchone() == (setting,)
        store._drop_writer()
        store.append([req("/a")])
        assert store._writer().execute("SHOW synchronous_commit").fetchone() == (setting,)
        assert seqs(store.read("/a")) == [1, 2]
    finally:
        store.close()


def test_open_store_postgres_unreachable_hides_credentials() -> None:
    """A server that cannot be reached: StorageError, quickly, naming neither the password nor the host."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # a port nothing listens on
        port = s.getsockname()[1]
        url = f"postgresql://user:secret@127.0.0.1:{port}/hubbub"
        with pytest.raises(StorageError) as err:
            open_store(url, "", "commit", RetentionPolicy(), 600)
    assert err.value.code == 4301
    assert "secret" not in str(err.value) and "127.0.0.1" not in str(err.value)


def test_open_store_rejects_unknown_durability(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durability"):
        open_store("memory", str(tmp_path), "sometimes", RetentionPolicy(), 600)
