"""A worker's store over its links to the log owner (``workers/owner.py``, ``workers/remote.py``), in one
process: what the worker learns of the owner's store at its greeting, and appends through the owner."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hubbub.events import Publisher
from hubbub.log.base import AppendRequest
from hubbub.log.sqlite import SqliteLogStore
from hubbub.workers.owner import LogOwner
from hubbub.workers.remote import RemoteLogStore

PUB = Publisher("native", "alice")


@contextmanager
def _worker(tmp_path: Path, durability: str) -> Iterator[tuple[SqliteLogStore, RemoteLogStore]]:
    path = tmp_path / "log.db"
    store = SqliteLogStore(path, durability=durability)
    owner = LogOwner(store, str(path))
    owner.start()
    calls, calls_owner = socket.socketpair()
    events, events_owner = socket.socketpair()
    owner.connect(0, calls_owner, events_owner)
    remote = RemoteLogStore(calls, events, 0)
    try:
        yield store, remote
    finally:
        remote.close()
        owner.close()
        for sock in (calls_owner, events_owner):
            sock.close()
        store.close()


@pytest.mark.parametrize("durability", ["commit", "fsync"])
def test_a_worker_appends_on_its_loop_what_the_owners_store_would(tmp_path: Path, durability: str) -> None:
    """The owner's store's inline limits reach the worker (core appends that small a batch on the loop, a
    round trip to the owner, rather than through its writer thread); none where the owner's commit waits for
    an fsync."""
    with _worker(tmp_path, durability) as (store, remote):
        assert (remote.inline_append_max, remote.inline_append_max_bytes) == (
            store.inline_append_max,
            store.inline_append_max_bytes,
        )
        assert (remote.inline_append_max > 0) is (durability != "fsync")
        results = remote.append([AppendRequest("/a", PUB, b"%d" % i, "text/plain") for i in range(3)])
        assert [(r.event.seq, r.event.payload) for r in results] == [(1, b"0"), (2, b"1"), (3, b"2")]
