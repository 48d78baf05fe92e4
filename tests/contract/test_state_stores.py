"""The state maps side of the ``LogStore`` contract (:class:`~hubbub.log.base.StateMaps`) and the push
connectors' routes kept in them (``hubbub/log/routes.py``), on every engine and through a worker's
:class:`~hubbub.workers.remote.RemoteLogStore` (``worker``: writes through the owner, reads from the file),
with two stores sharing one PostgreSQL database (two nodes) and the PostgreSQL schema's versions."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from hubbub.errors import StorageError
from hubbub.log import LogStore, RetentionPolicy, SqliteLogStore
from hubbub.log.postgres import SCHEMA_VERSION, PostgresLogStore
from hubbub.log.routes import RouteRecord, delete_route, put_route, route_ns, route_records
from hubbub.workers.owner import LogOwner
from hubbub.workers.remote import RemoteLogStore
from tests.contract.test_consumer_stores import ENGINES
from tests.contract.test_log_stores import Factory


class _Factory(Factory):
    """:class:`Factory` with the ``worker`` engine: a worker's store over a SQLite log owned by this
    process (the node's parent), as ``--workers`` runs it."""

    def __init__(self, engine: str, tmp_path: Path, pg_url: str = "") -> None:
        super().__init__("sqlite-commit" if engine == "worker" else engine, tmp_path, pg_url)
        self.worker = engine == "worker"
        self._closers: list[RemoteLogStore | LogOwner | socket.socket] = []

    def open(self, retention: RetentionPolicy | None = None, idem_window_s: float | None = None) -> LogStore:
        store = super().open(retention, idem_window_s)
        if not self.worker:
            return store
        owner = LogOwner(store, str(self.path))
        owner.start()
        calls, calls_owner = socket.socketpair()
        events, events_owner = socket.socketpair()
        owner.connect(0, calls_owner, events_owner)
        remote = RemoteLogStore(calls, events, 0)
        # The owner's ends too: it releases them once it has seen the worker go, which may be after its close.
        self._closers += [remote, owner, calls_owner, events_owner]
        return remote

    def reopen(self, store: LogStore) -> LogStore:
        self.close_all()
        self._closers, self.opened = [], []
        return self.open()

    def close_all(self) -> None:
        for c in self._closers:
            c.close()
        super().close_all()


@pytest.fixture(params=[*ENGINES, "worker"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_Factory]:
    engine: str = request.param
    pg_url = request.getfixturevalue("pg_url") if engine.startswith("postgres") else ""
    f = _Factory(engine, tmp_path, pg_url)
    try:
        yield f
    finally:
        f.close_all()


@pytest.fixture
def store(factory: _Factory) -> LogStore:
    return factory.open()


def _second(factory: _Factory, first: LogStore) -> LogStore:
    """Another store of the same log: a second node's (PostgreSQL), a second worker's, or a reader of the
    file (SQLite: a worker's reads); the memory engine has none."""
    if factory.engine == "memory":
        pytest.skip("one process's memory")
    if factory.worker:
        return _worker_of(factory)
    if first.shared:
        return factory.open()
    reader = SqliteLogStore(factory.path, readonly=True)
    factory.opened.append(reader)
    return reader


def _worker_of(factory: _Factory) -> LogStore:
    owner = factory._closers[-3]
    assert isinstance(owner, LogOwner)
    calls, calls_owner = socket.socketpair()
    events, events_owner = socket.socketpair()
    owner.connect(1, calls_owner, events_owner)
    remote = RemoteLogStore(calls, events, 1)
    factory._closers.insert(0, remote)
    factory._closers += [calls_owner, events_owner]
    return remote


# -- state maps --------------------------------------------------------------------------------------------


def test_state_maps_set_get_list_and_versions(factory: _Factory, store: LogStore) -> None:
    assert store.state_get("m", "/a") is None
    assert store.state_list("m") == []
    # Unconditional writes count their version up from 1.
    assert store.state_set("m", "/a", "1") == 1
    assert store.state_set("m", "/a", "2") == 2
    assert store.state_get("m", "/a") == ("2", 2)
    # A versioned write lands only over an older version (or none).
    assert store.state_set("m", "/b", "b10", 10) == 10
    assert store.state_set("m", "/b", "b7", 7) is None
    assert store.state_set("m", "/b", "b10 again", 10) is None
    assert store.state_get("m", "/b") == ("b10", 10)
    # A removal is a tombstone with its version: an older write arriving late does not bring it back.
    assert store.state_set("m", "/b", None, 12) == 12
    assert store.state_set("m", "/b", "b11", 11) is None
    assert store.state_get("m", "/b") == (None, 12)
    assert store.state_set("m", "/b", "b13", 13) == 13
    # Lists: by prefix, in key order, without removed entries, one namespace only.
    for key in ("/c/x", "/c", "/cd", "/c/é", "/c/y"):
        store.state_set("m", key, key.upper())
    store.state_set("m", "/c/y", None)
    store.state_set("other", "/c/z", "elsewhere")
    assert store.state_list("m", "/c") == [("/c", "/C"), ("/c/x", "/C/X"), ("/c/é", "/C/É"), ("/cd", "/CD")]
    assert store.state_list("m", "/c/") == [("/c/x", "/C/X"), ("/c/é", "/C/É")]
    assert [k for k, _ in store.state_list("m")] == ["/a", "/b", "/c", "/c/x", "/c/é", "/cd"]
    assert store.state_list("other") == [("/c/z", "elsewhere")]
    if factory.persistent:  # kept across a reopen
        store = factory.reopen(store)
        assert store.state_get("m", "/b") == ("b13", 13)
        assert store.state_get("m", "/c/y") == (None, 2)
        assert store.state_list("m", "/c/") == [("/c/x", "/C/X"), ("/c/é", "/C/É")]


def test_state_swap_sets_only_from_the_version_expected(store: LogStore) -> None:
    # Insert-if-absent: a swap from 0 lands on a key never set, and only once.
    assert store.state_swap("m", "/k", "first", 0) == 1
    assert store.state_swap("m", "/k", "second", 0) is None
    assert store.state_get("m", "/k") == ("first", 1)
    # From the version read: lands once, one up; a stale version is refused.
    assert store.state_swap("m", "/k", "third", 1) == 2
    assert store.state_swap("m", "/k", "stale", 1) is None
    assert store.state_swap("m", "/k", "ahead", 5) is None
    # A removal by swap leaves a tombstone; inserting again swaps from the tombstone's version, not 0.
    assert store.state_swap("m", "/k", None, 2) == 3
    assert store.state_get("m", "/k") == (None, 3) and store.state_list("m") == []
    assert store.state_swap("m", "/k", "back", 0) is None
    assert store.state_swap("m", "/k", "back", 3) == 4
    # Unconditional and versioned writes move the version a swap expects.
    assert store.state_set("m", "/k", "set") == 5
    assert store.state_swap("m", "/k", "late", 4) is None
    assert store.state_get("m", "/k") == ("set", 5)


def test_state_maps_are_shared_by_the_stores_of_one_log(factory: _Factory) -> None:
    """Two stores of one log (two nodes on one PostgreSQL database, two workers of a node): each sees the
    other's entries, versioned writes leave the newest whatever the order they arrive in, and of two
    swaps from one version exactly one lands."""
    a = factory.open()
    if not (a.shared or factory.worker):
        pytest.skip("one writer of the log")
    b = _second(factory, a)
    assert a.state_set("m", "/k", "from a", 5) == 5
    assert b.state_get("m", "/k") == ("from a", 5)
    assert b.state_set("m", "/k", "from b", 9) == 9
    assert a.state_set("m", "/k", "late from a", 7) is None
    assert a.state_list("m") == [("/k", "from b")]
    assert a.state_swap("m", "/new", "a's", 0) == 1
    assert b.state_swap("m", "/new", "b's", 0) is None
    assert b.state_get("m", "/new") == ("a's", 1)


# -- the connectors' routes, kept in the state maps ----------------------------------------------------------


def rec(name: str, key: str = "", body: str = "{}", connector: str = "fcm") -> RouteRecord:
    return RouteRecord(connector, name, key or f"k-{name}", body)


def test_routes_put_list_replace_delete(store: LogStore) -> None:
    assert route_records(store, "fcm") == []
    assert put_route(store, rec("b", body='{"n":1}'))
    assert put_route(store, rec("a"))
    assert not put_route(store, rec("a", body='{"other":1}'))  # the name exists: kept as it was
    assert not put_route(store, rec("c", key="k-a"))  # another record has the key
    assert put_route(store, rec("a", connector="webhook"))  # (another connector's names and keys)
    assert route_records(store, "fcm") == [rec("a"), rec("b", body='{"n":1}')]
    assert put_route(store, rec("b", key="k-new", body='{"n":2}'), replace=True)
    assert not put_route(store, rec("b", key="k-a"), replace=True)  # a's key: refused, b unchanged
    assert route_records(store, "fcm") == [rec("a"), rec("b", key="k-new", body='{"n":2}')]
    assert put_route(store, rec("d", key="k-b"))  # b's old key is free again
    assert delete_route(store, "fcm", "a") and not delete_route(store, "fcm", "a")
    assert [r.name for r in route_records(store, "fcm")] == ["b", "d"]
    assert put_route(store, rec("a"))  # a deleted record's name and key may be put again
    assert route_records(store, "webhook") == [rec("a", connector="webhook")]
    # One map per connector, one entry per key: the record's name and body.
    assert [k for k, _ in store.state_list(route_ns("fcm"))] == ["k-a", "k-b", "k-new"]


def test_routes_left_twice_by_a_crash_read_as_one_and_clear(store: LogStore) -> None:
    """A replace that moved a record's key and stopped before removing the old entry left two entries of
    one name: listed once, and the next put or delete of the name clears both."""
    assert put_route(store, rec("a", key="k-1"))
    store.state_set(route_ns("fcm"), "k-2", '{"body": "{}", "name": "a"}')  # the new entry, alone
    assert route_records(store, "fcm") == [rec("a", key="k-1")]
    assert put_route(store, rec("a", key="k-3"), replace=True)
    assert [k for k, _ in store.state_list(route_ns("fcm"))] == ["k-3"]
    store.state_set(route_ns("fcm"), "k-4", '{"body": "{}", "name": "a"}')
    store.state_set(route_ns("fcm"), "k-5", "not a record")  # (left out, never a crash)
    assert delete_route(store, "fcm", "a") and route_records(store, "fcm") == []


def test_routes_survive_a_reopen(factory: _Factory, store: LogStore) -> None:
    if not factory.persistent:
        pytest.skip("the memory engine keeps nothing")
    put_route(store, rec("a", body='{"device_token":"t"}'))
    store = factory.reopen(store)
    assert route_records(store, "fcm") == [rec("a", body='{"device_token":"t"}')]


def test_every_store_of_a_log_sees_the_same_routes(factory: _Factory) -> None:
    """PostgreSQL: two nodes' stores; a worker's: two workers; SQLite: the writer and a reader of the file."""
    a = factory.open()
    b = _second(factory, a)
    assert put_route(a, rec("x"))
    assert route_records(b, "fcm") == [rec("x")]
    if a.shared or factory.worker:  # the other one writes too: one record per key, whoever puts it first
        assert not put_route(b, rec("y", key="k-x"))
        assert delete_route(b, "fcm", "x")
        assert route_records(a, "fcm") == []


# -- PostgreSQL's schema versions ----------------------------------------------------------------------------


def test_postgres_schema_2_migrates_to_the_state_maps(pg_url: str) -> None:
    """A database of the last release (version 2: no ``state``) is migrated by the first writer. One that an
    unreleased build numbered 3 (a ``connector_routes`` table, no ``state``) or 4 (both) is migrated as from
    2: its routes copied into the state maps, the table dropped; a version 4 without that table is refused
    as newer."""
    PostgresLogStore(pg_url).close()

    def database(sql: str) -> list[tuple[object, ...]]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    database("DROP TABLE state")
    database("UPDATE schema_version SET version = 2")
    store = PostgresLogStore(pg_url)
    assert put_route(store, rec("a")) and route_records(store, "fcm") == [rec("a")]
    store.close()
    assert database("SELECT version FROM schema_version") == [(SCHEMA_VERSION,)] == [(3,)]
    routes = "CREATE TABLE connector_routes (connector TEXT, name TEXT, key TEXT, body TEXT)"
    for dev, drop_state in ((3, True), (4, False)):
        if drop_state:
            database("DROP TABLE state")
        database(routes)
        database(f"INSERT INTO connector_routes VALUES ('webhook', 'h{dev}', 'h{dev}', '{{\"url\": 1}}')")
        database(f"UPDATE schema_version SET version = {dev}")
        store = PostgresLogStore(pg_url)
        try:
            # Version 4 kept its state maps (h3, copied at the step before) and gains its routes.
            want = [rec(f"h{v}", f"h{v}", '{"url": 1}', "webhook") for v in range(3, dev + 1)]
            assert route_records(store, "webhook") == want
        finally:
            store.close()
        assert database("SELECT to_regclass('connector_routes')") == [(None,)]
        assert database("SELECT version FROM schema_version") == [(3,)]
    database("UPDATE schema_version SET version = 4")
    with pytest.raises(StorageError, match="schema version 4"):
        PostgresLogStore(pg_url)
