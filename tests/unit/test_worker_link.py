"""A worker's store over its links to the log owner (``workers/owner.py``, ``workers/remote.py``), in one
process: what the worker learns of the owner's store at its greeting, and appends through the owner."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hubbub.events import Publisher
from hubbub.log.base import AppendRequest
from hubbub.log.sqlite import SqliteLogStore
from hubbub.workers import owner as owner_mod
from hubbub.workers.frames import FrameReader, Publishers, unpack_events
from hubbub.workers.owner import LogOwner
from hubbub.workers.remote import RemoteLogStore

PUB = Publisher("native", "alice")


@contextmanager
def _worker(tmp_path: Path, durability: str) -> Iterator[tuple[SqliteLogStore, RemoteLogStore, LogOwner]]:
    path = tmp_path / "log.db"
    store = SqliteLogStore(path, durability=durability)
    owner = LogOwner(store, str(path))
    owner.start()
    calls, calls_owner = socket.socketpair()
    events, events_owner = socket.socketpair()
    owner.connect(0, calls_owner, events_owner)
    remote = RemoteLogStore(calls, events, 0)
    try:
        yield store, remote, owner
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
    with _worker(tmp_path, durability) as (store, remote, _):
        assert (remote.inline_append_max, remote.inline_append_max_bytes) == (
            store.inline_append_max,
            store.inline_append_max_bytes,
        )
        assert (remote.inline_append_max > 0) is (durability != "fsync")
        results = remote.append([AppendRequest("/a", PUB, b"%d" % i, "text/plain") for i in range(3)])
        assert [(r.event.seq, r.event.payload) for r in results] == [(1, b"0"), (2, b"1"), (3, b"2")]


def test_a_worker_that_does_not_read_gets_whole_commits_then_the_tops_it_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other workers' events go to a worker as far as its socket and outbox take them, each message
    whole and in commit order (the owner's thread sends what the socket takes at once, the sender thread the
    rest); past the outbox's bound, the channels' tops instead, once it reads again."""
    monkeypatch.setattr(owner_mod, "OUTBOX_BYTES", 64 << 10)
    path = tmp_path / "log.db"
    store = SqliteLogStore(path)
    owner = LogOwner(store, str(path))
    owner.start()
    pairs = [socket.socketpair() for _ in range(4)]
    (calls0, calls0_o), (ev0, ev0_o), (calls1, calls1_o), (ev1, ev1_o) = pairs
    ev1_o.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)  # fills after a few commits
    owner.connect(0, calls0_o, ev0_o)
    owner.connect(1, calls1_o, ev1_o)  # worker 1: greeted, never reads its events until the end
    assert FrameReader(calls1).read()[0] == "hello"
    remote = RemoteLogStore(calls0, ev0, 0)
    try:
        for i in range(200):
            remote.append([AppendRequest("/a", PUB, b"%d" % i * 200, "text/plain") for _ in range(10)])
        assert owner.statistics()["tops_sent"] > 0
        # Whole commits in order up to where the outbox overflowed, then the tops of what it left out; the
        # sender may send the tops while later commits fit again, and those follow in order.
        reader = FrameReader(ev1)
        seqs: list[int] = []
        tops: list[int] = []
        epoch = store.head("/a").epoch
        while max([0, *seqs[-1:], *tops]) < 2000:
            msg = reader.read()
            if msg[0] == "tops":
                assert [(ch, ep) for ch, ep, _ in msg[1]] == [("/a", epoch)]
                tops.append(msg[1][0][2])
                continue
            assert msg[0] == "events"
            ((worker, packed),) = msg[1]
            assert worker == 0
            got = [ev.seq for ev in unpack_events(packed, Publishers())]
            assert got == list(range(got[0], got[0] + len(got))) and len(got) == 10  # a whole commit
            if not tops:
                assert got[0] == len(seqs) + 1  # no gap before the first tops
            else:
                assert got[0] > tops[-1]  # after the tops, only what was committed after them
            seqs += got
        assert tops and seqs[0] == 1 and 0 < len(seqs) < 2000
        assert seqs == sorted(set(seqs))
    finally:
        remote.close()
        owner.close()
        for a, b in pairs:
            a.close()
            b.close()
        store.close()


def test_a_worker_that_sends_a_malformed_call_is_dropped_and_the_others_go_on(tmp_path: Path) -> None:
    """A message that does not unpickle ends that worker's connection (it sees its calls socket end), never
    the owner's thread: another worker's appends still commit."""
    with _worker(tmp_path, "commit") as (_, remote, owner):
        calls, calls_o = socket.socketpair()
        events, events_o = socket.socketpair()
        owner.connect(1, calls_o, events_o)
        assert FrameReader(calls).read()[0] == "hello"
        calls.sendall(b"\x00\x00\x00\x05junk!")
        calls.settimeout(5)
        assert calls.recv(1) == b""  # dropped
        assert owner.failed is None
        results = remote.append([AppendRequest("/b", PUB, b"x", "text/plain")])
        assert [r.event.seq for r in results] == [1]
        for sock in (calls, events):
            sock.close()


def test_a_listening_worker_gets_the_commits_sent_before_it_listened_then_hears_of_the_owners_end(
    tmp_path: Path,
) -> None:
    """Worker 1 listens on its loop after worker 0 committed: it gets those commits first (they waited in its
    socket), then later ones, every seq once in order without its own; when the owner goes, ``on_lost``."""
    path = tmp_path / "log.db"
    store = SqliteLogStore(path)
    owner = LogOwner(store, str(path))
    owner.start()
    pairs = [socket.socketpair() for _ in range(4)]
    (c0, c0_o), (e0, e0_o), (c1, c1_o), (e1, e1_o) = pairs
    owner.connect(0, c0_o, e0_o)
    owner.connect(1, c1_o, e1_o)
    w0, w1 = RemoteLogStore(c0, e0, 0), RemoteLogStore(c1, e1, 1)

    def publish(worker: RemoteLogStore, n: int) -> None:
        worker.append([AppendRequest("/a", PUB, b"%d" % i, "text/plain") for i in range(n)])

    async def main() -> tuple[list[int], bool]:
        seqs: list[int] = []
        got, lost = asyncio.Event(), asyncio.Event()

        def on_broadcast(msg: Any) -> None:
            kind, items = msg
            assert kind == "events"
            for worker, events in items:
                assert worker == 0
                seqs.extend(ev.seq for ev in events)
            if len(seqs) >= 30:
                got.set()

        publish(w0, 10)
        w1.listen(on_broadcast, lost.set)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, publish, w1, 5)  # its own: not broadcast to it
        await loop.run_in_executor(None, publish, w0, 20)
        async with asyncio.timeout(5):
            await got.wait()
            await loop.run_in_executor(None, owner.close)
            await lost.wait()
        w1.unlisten()
        return seqs, lost.is_set()

    try:
        seqs, lost = asyncio.run(main())
        assert seqs == [*range(1, 11), *range(16, 36)] and lost
    finally:
        for r in (w0, w1):
            r.close()
        owner.close()
        for a, b in pairs:
            a.close()
            b.close()
        store.close()
