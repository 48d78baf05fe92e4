"""The connectors' routes side of the ``LogStore`` contract (``hubbub/log/routes.py``), on every engine, and
through a worker's :class:`~hubbub.workers.remote.RemoteLogStore`: records put, replaced and deleted by name,
one per key, kept across a reopen, and seen by every store of the same log."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hubbub.log import LogStore, SqliteLogStore
from hubbub.log.routes import RouteRecord
from hubbub.workers.owner import LogOwner
from hubbub.workers.remote import RemoteLogStore
from tests.contract.test_consumer_stores import ENGINES
from tests.contract.test_log_stores import Factory


@pytest.fixture(params=ENGINES)
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    engine: str = request.param
    pg_url = request.getfixturevalue("pg_url") if engine.startswith("postgres") else ""
    f = Factory(engine, tmp_path, pg_url)
    try:
        yield f
    finally:
        f.close_all()


def rec(name: str, key: str = "", body: str = "{}", connector: str = "fcm") -> RouteRecord:
    return RouteRecord(connector, name, key or f"k-{name}", body)


def test_put_list_replace_delete(factory: Factory) -> None:
    store = factory.open()
    assert store.route_records("fcm") == []
    assert store.route_put(rec("b", body='{"n":1}'))
    assert store.route_put(rec("a"))
    assert not store.route_put(rec("a", body='{"other":1}'))  # the name exists: kept as it was
    assert not store.route_put(rec("c", key="k-a"))  # another record has the key
    assert store.route_put(rec("a", connector="webhook"))  # (another connector's names and keys)
    assert store.route_records("fcm") == [rec("a"), rec("b", body='{"n":1}')]
    assert store.route_put(rec("b", key="k-new", body='{"n":2}'), replace=True)
    assert not store.route_put(rec("b", key="k-a"), replace=True)  # a's key: refused, b unchanged
    assert store.route_records("fcm") == [rec("a"), rec("b", key="k-new", body='{"n":2}')]
    assert store.route_put(rec("d", key="k-b"))  # b's old key is free again
    assert store.route_delete("fcm", "a") and not store.route_delete("fcm", "a")
    assert [r.name for r in store.route_records("fcm")] == ["b", "d"]
    assert store.route_records("webhook") == [rec("a", connector="webhook")]


def test_records_survive_a_reopen(factory: Factory) -> None:
    if not factory.persistent:
        pytest.skip("the memory engine keeps nothing")
    store = factory.open()
    store.route_put(rec("a", body='{"device_token":"t"}'))
    store = factory.reopen(store)
    assert store.route_records("fcm") == [rec("a", body='{"device_token":"t"}')]


def test_every_store_of_a_log_sees_the_same_records(factory: Factory, tmp_path: Path) -> None:
    """PostgreSQL: two nodes' stores; SQLite: the writer and a reader of the file (a worker's reads)."""
    if factory.engine == "memory":
        pytest.skip("one process's memory")
    a = factory.open()
    b: LogStore = factory.open() if a.shared else SqliteLogStore(factory.path, readonly=True)
    try:
        assert a.route_put(rec("x"))
        assert b.route_records("fcm") == [rec("x")]
        if a.shared:  # the other node writes too: one record per key, whoever puts it first
            assert not b.route_put(rec("y", key="k-x"))
            assert b.route_delete("fcm", "x")
            assert a.route_records("fcm") == []
    finally:
        if not a.shared:
            b.close()


def test_a_workers_store_puts_through_the_owner_and_reads_the_file(tmp_path: Path) -> None:
    store = SqliteLogStore(tmp_path / "log.db")
    owner = LogOwner(store, str(tmp_path / "log.db"))
    owner.start()
    calls, calls_owner = socket.socketpair()
    events, events_owner = socket.socketpair()
    owner.connect(0, calls_owner, events_owner)
    remote = RemoteLogStore(calls, events, 0)
    try:
        assert remote.route_put(rec("a"))
        assert not remote.route_put(rec("b", key="k-a"))
        assert store.route_records("fcm") == [rec("a")] == remote.route_records("fcm")
        assert remote.route_delete("fcm", "a") and remote.route_records("fcm") == []
    finally:
        remote.close()
        owner.close()
        store.close()
