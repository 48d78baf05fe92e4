"""The PostgreSQL engine's runs (``AppendRun``) beyond the contract suite's
``test_runs_append_as_the_requests_they_stand_for``: with retention in the same transaction, over several
batches mixed with other channels' requests and duplicates; a batch that fails at its commit leaves nothing,
and the next one goes on as if it had never been; and a cluster node's view takes runs when its store does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import psycopg
import pytest

from hubbub.cluster.delivery import OrderedDelivery
from hubbub.cluster.view import ClusterView
from hubbub.errors import StorageError
from hubbub.events import Publisher
from hubbub.log import AppendRequest, AppendResult, AppendRun, MemoryLogStore, RetentionPolicy
from hubbub.log.consumers import ConsumerSpec
from hubbub.log.postgres import PostgresLogStore
from tests.contract.test_log_stores import Clock, expanded, req, runs_batch

PUB = Publisher("native", "alice", "app1", "m1")


def facts(results: list[AppendResult]) -> list[tuple[object, ...]]:
    """Everything of each result but the epoch (each engine draws its own)."""
    return [
        (
            e.channel,
            e.seq,
            e.time_ns,
            e.publisher,
            e.payload,
            e.content_type,
            dict(e.headers),
            e.tags,
            r.duplicate,
            len(r.journal),
        )
        for r in results
        for e in (r.event,)
    ]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pg(pg_url: str, clock: Clock) -> Iterator[PostgresLogStore]:
    st = PostgresLogStore(pg_url, retention=RetentionPolicy(max_events=40, max_bytes=900), clock=clock)
    yield st
    st.close()


def test_runs_among_requests_under_retention_append_as_their_requests(
    pg: PostgresLogStore, clock: Clock
) -> None:
    """Batch after batch of runs between other channels' requests, keyed repeats and headers, with
    ``max_events``/``max_bytes`` cutting inside the same transactions: every result, read, head and count as
    the memory reference's with the runs expanded."""
    ref = MemoryLogStore(retention=RetentionPolicy(max_events=40, max_bytes=900), clock=clock)
    bob = Publisher("native", "bob", "app2", "")
    batches: list[list[AppendRequest | AppendRun]] = [
        runs_batch(PUB),
        [
            req("/r/c", b"c1"),
            AppendRun("/r/a", PUB, "text/plain", [b"%d" % i for i in range(50)]),
            req("/r/a", b"k", idem="k1"),  # on record from the first batch: a duplicate of its event
            AppendRun("/r/c", bob, "application/json", [b"{}", b"[]"]),
            req("/r/a", b"k2", idem="k2"),
            AppendRun("/r/a", PUB, "text/plain", [b"y" * 30] * 25),  # max_bytes cuts into this batch's own
            req("/r/a", b"k2", idem="k2"),
        ],
        [AppendRun(f"/r/n{i}", PUB, "text/plain", [b"z"] * (i + 1)) for i in range(5)],
    ]
    for batch in batches:
        clock.now += 1000
        assert facts(pg.append(batch)) == facts(ref.append(expanded(batch)))
    names = ["/r/a", "/r/b", "/r/c", "/r/new", *(f"/r/n{i}" for i in range(5))]
    for ch in names:
        assert facts([AppendResult(e) for e in pg.read(ch, limit=10_000)]) == facts(
            [AppendResult(e) for e in ref.read(ch, limit=10_000)]
        ), ch
        mine, theirs = pg.head(ch), ref.head(ch)
        assert (mine.first, mine.top, mine.top_time) == (theirs.first, theirs.top, theirs.top_time), ch
    assert pg.stats() == ref.stats()


def _fail_at_commit(url: str, payload: bytes) -> None:
    """A deferred constraint trigger: a transaction that inserted an event with ``payload`` fails at its
    COMMIT, after every statement of the append ran."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS "
            "$$BEGIN RAISE EXCEPTION 'boom at commit'; END$$"
        )
        conn.execute(
            "CREATE CONSTRAINT TRIGGER boom AFTER INSERT ON events DEFERRABLE INITIALLY DEFERRED "
            f"FOR EACH ROW WHEN (NEW.payload = '\\x{payload.hex()}'::bytea) EXECUTE FUNCTION boom()"
        )


def test_a_batch_with_runs_failing_at_commit_leaves_nothing(pg_url: str, clock: Clock) -> None:
    """A batch of runs, other channels' requests, a new channel, a consumer's match and an idempotency key
    that fails at its commit: nothing of it is in the log (events, heads, journal, key, the log's time and
    positions), and the next batch appends as if it had never been tried."""
    pg = PostgresLogStore(pg_url, clock=clock)
    _fail_at_commit(pg_url, b"boom")
    ref = MemoryLogStore(clock=clock)
    try:
        for s in (pg, ref):
            s.consumer_create(ConsumerSpec("c", "/f/**"))
        first: list[AppendRequest | AppendRun] = [
            AppendRun("/f/a", PUB, "text/plain", [b"a1", b"a2"]),
            req("/f/b", b"b1"),
        ]
        assert facts(pg.append(first)) == facts(ref.append(expanded(first)))
        before = (pg.stats(), pg.heads(["/f/a", "/f/b", "/f/new"]), pg.top_time(), pg.log_mark().pos)
        clock.now += 1000
        failing: list[AppendRequest | AppendRun] = [
            req("/f/b", b"b2", idem="once"),
            AppendRun("/f/a", PUB, "text/plain", [b"a3", b"boom", b"a5"]),
            AppendRun("/f/new", PUB, "text/plain", [b"n1"]),
            req("/f/b", b"b2", idem="once"),
        ]
        with pytest.raises(StorageError):
            pg.append(failing)
        assert (pg.stats(), pg.heads(["/f/a", "/f/b", "/f/new"]), pg.top_time(), pg.log_mark().pos) == before
        assert [i.event.payload for i in pg.consumer_items(pg.consumers()[0].id, limit=100)] == [
            b"a1",
            b"a2",
            b"b1",
        ]
        # The same batch without the failing payload: appended in full (the key was not recorded), at the
        # seqs and positions the failed one would have had.
        retry = [
            r if not isinstance(r, AppendRun) or b"boom" not in r.payloads
            else AppendRun(r.channel, r.publisher, r.content_type, [b"a3", b"a4", b"a5"])
            for r in failing
        ]  # fmt: skip
        assert facts(pg.append(retry)) == facts(ref.append(expanded(retry)))
        for ch in ("/f/a", "/f/b", "/f/new"):
            assert facts([AppendResult(e) for e in pg.read(ch)]) == facts(
                [AppendResult(e) for e in ref.read(ch)]
            )
        assert [
            (i.event.channel, i.event.seq) for i in pg.consumer_items(pg.consumers()[0].id, limit=100)
        ] == [(i.event.channel, i.event.seq) for i in ref.consumer_items(ref.consumers()[0].id, limit=100)]
        assert pg.log_mark().pos == before[3] + 5
    finally:
        pg.close()


def test_a_cluster_nodes_view_takes_runs_when_its_store_does(pg: PostgresLogStore) -> None:
    """The node's batcher reads ``takes_runs`` of the store it is given; the view passes runs through."""
    view = ClusterView(pg, cast(OrderedDelivery, cast(Any, object())))
    assert view.takes_runs and pg.takes_runs
    assert not ClusterView(_NoRuns(), cast(Any, object())).takes_runs
    got = view.append([AppendRun("/v/a", PUB, "text/plain", [b"1", b"2"]), req("/v/a", b"3")])
    assert [(r.event.seq, r.event.payload) for r in got] == [(1, b"1"), (2, b"2"), (3, b"3")]


class _NoRuns(MemoryLogStore):
    takes_runs = False
