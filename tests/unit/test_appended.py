"""Runs answered as runs (``hubbub.log.appended``): the memory store's ``append_runs`` against its ``append``,
the sequences a ``RunAppended`` stands for, and the batcher handing them on."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import pytest

from hubbub.core.batcher import WriteBatcher
from hubbub.core.faults import Faults
from hubbub.events import Event, Publisher
from hubbub.log import AppendRequest, MemoryLogStore, SqliteLogStore
from hubbub.log.appended import Committed, RunAppended, RunAppender, RunEvents, answers_runs, expand_runs
from hubbub.log.base import AppendResult, AppendRun, EventRun
from hubbub.log.consumers import ConsumerSpec

PUB = Publisher("native", "u", "a")


def _batch() -> list[AppendRequest | AppendRun]:
    return [
        AppendRun("/a", PUB, "text/plain", [b"1", b"22", b"333"]),
        AppendRequest("/a", PUB, b"single", "text/plain", {"h": "v"}),
        AppendRun("/b", PUB, "application/json", [b"{}"]),
        AppendRequest("/b", PUB, b"keyed", "text/plain", idem="k1"),
        AppendRequest("/b", PUB, b"keyed again", "text/plain", idem="k1"),
        AppendRun("/a", PUB, "text/plain", [b"4", b"5"]),
    ]


def _same(a: list[AppendResult], b: list[AppendResult]) -> None:
    # Two stores give the same events but for their epochs and times (each its own clock and epochs).
    def key(r: AppendResult) -> tuple[object, ...]:
        e = r.event
        return (
            e.channel,
            e.seq,
            e.publisher,
            e.payload,
            e.content_type,
            dict(e.headers),
            e.tags,
            r.duplicate,
        )

    assert [key(r) for r in a] == [key(r) for r in b]


def test_append_runs_answers_each_run_as_one_and_means_what_append_means() -> None:
    plain, runs = MemoryLogStore(), MemoryLogStore()
    assert isinstance(runs, RunAppender)
    try:
        want = plain.append(_batch())
        got = runs.append_runs(_batch())
        assert len(got) == len(want) == 9
        # The three places of the first run hold one object; so do the two of the last.
        assert got[0] is got[1] is got[2] and type(got[0]) is RunAppended
        assert got[7] is got[8] and type(got[7]) is RunAppended and got[7] is not got[0]
        assert [type(r) for r in got[3:7]] == [AppendResult, RunAppended, AppendResult, AppendResult]
        expanded = expand_runs(got)
        _same(expanded, want)
        # The results built from a run are the events the store reads back.
        assert [r.event for r in expanded if r.event.channel == "/a"] == runs.read("/a")
        assert expanded[6].duplicate and expanded[6].event == expanded[5].event
    finally:
        plain.close()
        runs.close()


def test_a_run_that_a_durable_consumer_journals_is_answered_event_by_event() -> None:
    store = MemoryLogStore()
    try:
        store.consumer_create(ConsumerSpec("c", "/a"))
        got = store.append_runs([AppendRun("/a", PUB, "text/plain", [b"1", b"2"])])
        assert [type(r) for r in got] == [AppendResult, AppendResult]
        assert all(isinstance(r, AppendResult) and r.journal for r in got)
        # While a durable consumer exists, every run is answered event by event (journaled or not).
        other = store.append_runs([AppendRun("/z", PUB, "text/plain", [b"1", b"2"])])
        assert [type(r) for r in other] == [AppendResult, AppendResult]
    finally:
        store.close()


class _CreatesFirst:
    """The store's lock, with a durable consumer created (by another thread, say) the first time an append
    waits for it: after ``append_runs`` was called, before it holds the lock."""

    def __init__(self, store: MemoryLogStore) -> None:
        self.store, self.lock, self.created = store, store._lock, False

    def __enter__(self) -> None:
        if not self.created:
            self.created = True
            self.store.consumer_create(ConsumerSpec("c", "/a"))
        self.lock.__enter__()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.lock.__exit__(kind, exc, tb)


def test_a_consumer_created_while_an_append_waits_for_the_lock_journals_that_append() -> None:
    store = MemoryLogStore()
    try:
        store._lock = _CreatesFirst(store)  # type: ignore[assignment]  # the RLock, wrapped
        got = store.append_runs([AppendRun("/a", PUB, "text/plain", [b"1", b"2"])])
        assert [type(r) for r in got] == [AppendResult, AppendResult]
        assert all(isinstance(r, AppendResult) and r.journal for r in got)
    finally:
        store.close()


def test_a_run_appended_is_the_sequence_of_its_results() -> None:
    proto = Event("/c", 7, "ep", 100, PUB, b"x", "text/plain", {}, ())
    run = EventRun(proto, [(100, b"x"), (105, b"yy"), (111, b"zzz")])
    ra = RunAppended(run)
    results = ra.results()
    assert len(ra) == 3
    assert [r.event.seq for r in results] == [7, 8, 9]
    assert [(r.event.time_ns, r.event.payload) for r in results] == list(run.rows)
    assert list(ra) == results and ra[1] == results[1] and ra[-1] == results[2] and ra[1:] == results[1:]
    assert not any(r.duplicate or r.journal for r in results)
    events = RunEvents(run)
    assert list(events) == run.events() == [r.event for r in results]
    assert events[0] == proto and events[-1] == results[2].event and events[:2] == run.events()[:2]
    with pytest.raises(IndexError):
        ra[3]
    with pytest.raises(IndexError):
        events[-4]
    assert expand_runs([results[0], results[1]]) == results[:2]
    assert expand_runs([ra, ra, ra]) == results


class _Session:
    """What the batcher asks of a publishing session."""

    def __init__(self) -> None:
        self.identity = None
        self.dialect = "native"
        self.bucket = None
        self.owed = 0

    def settled(self, n: int) -> None:
        self.owed -= n


def test_the_batcher_completes_a_run_with_its_results_and_fans_it_out_as_one() -> None:
    async def main() -> None:
        store = MemoryLogStore()
        fanned: list[tuple[int, object]] = []
        many: list[list[tuple[int, int]]] = []
        hooked: list[list[AppendResult]] = []
        b = WriteBatcher(
            store,
            _Access(),  # type: ignore[arg-type]  # a fake of the access control
            lambda items, result: fanned.append((len(items), result[0])),
            max_pending=1000,
            commit_batch=4096,
            faults=Faults(),
        )
        b.commit_hook = lambda results: hooked.append(expand_runs(results))
        b.start()
        try:
            sess = _Session()
            b.submit_run(
                AppendRun("/r", PUB, "text/plain", [b"a", b"b", b"c"]),
                sess,  # type: ignore[arg-type]  # a fake session
                lambda r: None,
                lambda rs: many.append([(r.event.seq, len(r.event.payload)) for r in rs]),
            )
            for _ in range(100):
                if many:
                    break
                await asyncio.sleep(0.01)
        finally:
            await b.stop()
            store.close()
        assert many == [[(1, 1), (2, 1), (3, 1)]]
        assert fanned and fanned[0][0] == 3 and type(fanned[0][1]) is RunAppended
        assert [[r.event.seq for r in rs] for rs in hooked] == [[1, 2, 3]]

    asyncio.run(main())


class _Access:
    class authorizer:  # the attribute the batcher reads
        enabled = False


def test_a_store_that_changes_append_is_asked_through_it(tmp_path: Path) -> None:
    class Recording(MemoryLogStore):
        def append(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult]:
            return super().append(batch)

    class Both(Recording):
        def append_runs(self, batch: Sequence[AppendRequest | AppendRun]) -> list[Committed]:
            return super().append_runs(batch)

    sqlite = SqliteLogStore(tmp_path / "log.db")
    try:
        assert answers_runs(MemoryLogStore()) and answers_runs(sqlite) and answers_runs(Both())
        assert not answers_runs(Recording())
        assert not answers_runs(object())
    finally:
        sqlite.close()
