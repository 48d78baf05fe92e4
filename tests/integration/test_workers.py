"""A real ``hubbub serve --workers 2``: connections on either worker process see one node (one sequence per
channel, every event once and in order, replay and recovery across workers), a worker killed with -9 is
restarted and costs only its own connections, SIGTERM loses no acknowledged publish, and the workers' fork
server killed stops the node.

Which worker serves a connection is the kernel's choice (``SO_REUSEPORT``); the tests find it from
``/proc`` (the worker process holding the socket's other end) and reconnect until a connection lands on
the worker they want.

Starting a node of two workers is the costly part (a second of CPU; seconds of wall time on a loaded
machine), so the tests that leave the node as they found it share one (:func:`node`, one xdist worker runs
them all: ``SHARED``), each on channels, topics, consumers and tokens of its own (:func:`space`), its
assertions relative to what it made, so that neither their order nor which of them run matters. The tests
that kill a worker or stop the node start their own (:func:`own_node`)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .nativelines import Lines
from .qrpcclient import QrpcClient
from .serverproc import ServerProcess

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="finds workers through /proc")

#: The tests that share the module's node: in one xdist group, so that one xdist worker starts it once
#: (``--dist loadgroup`` hands the group out whole, before the single tests: tests/conftest.py).
SHARED = pytest.mark.xdist_group("workers_node")


def _wait_for(check: Callable[[], bool], what: str | Callable[[], str], timeout: float = 30.0) -> None:
    """Poll ``check`` until it holds; ``what`` names it in the failure (a callable: read at the failure, so it
    can show the last value ``check`` saw)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what() if callable(what) else what}"
        time.sleep(0.02)  # polling a condition the server processes decide


def _children(pid: int) -> list[int]:
    """The children of process ``pid``, each once: every thread's, read again when one of its threads ended
    during the read (its children then move to another thread, which may have been read already)."""
    while True:
        out: set[int] = set()
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    out.update(int(p) for p in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}"):
                return []
            continue  # a thread ended (the parent's and the fork server's come and go)
        return sorted(out)


def test_children_are_found_when_a_thread_ends_while_they_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers are found whatever the threads of the parent and the fork server do meanwhile: a thread
    that started a child and ends between the listing of the threads and the reading of its children (its
    child then moves to another thread) made ``_children`` fail with FileNotFoundError."""
    started = threading.Event()
    end = threading.Event()
    child: list[subprocess.Popen[bytes]] = []
    tid: list[int] = []

    def spawner() -> None:
        tid.append(threading.get_native_id())
        child.append(
            subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        )
        started.set()
        end.wait()

    t = threading.Thread(target=spawner)
    t.start()
    try:
        assert started.wait(10)
        listdir = os.listdir
        ended: list[str] = []

        def listed_then_ended(path: str) -> list[str]:
            names = listdir(path)
            if path == f"/proc/{os.getpid()}/task" and not ended:
                ended.append(path)
                end.set()
                t.join()
                _wait_for(lambda: not os.path.exists(f"{path}/{tid[0]}"), "the thread's end", 10.0)
            return names

        monkeypatch.setattr(os, "listdir", listed_then_ended)
        assert child[0].pid in _children(os.getpid())
        assert ended
    finally:
        end.set()
        t.join()
        for c in child:
            c.kill()
            c.wait()
            assert c.stdin is not None
            c.stdin.close()


def _workers(node: ServerProcess) -> list[int]:
    """The pids of the node's worker processes: the children of its fork server, the parent's one child."""
    assert node.proc is not None
    return sorted(pid for server in _children(node.proc.pid) for pid in _children(server))


def _running(pid: int) -> bool:
    """Is process ``pid`` there and not a zombie?"""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _serving(sock: socket.socket, workers: list[int]) -> int | None:
    """The worker process holding the server end of ``sock`` (a loopback TCP connection)."""
    here = sock.getsockname()[1]
    there = sock.getpeername()[1]
    inode = None
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            cols = line.split()
            local, remote = cols[1], cols[2]
            if int(local.split(":")[1], 16) == there and int(remote.split(":")[1], 16) == here:
                inode = cols[9]
                break
    if inode is None:
        return None
    link = f"socket:[{inode}]"
    for pid in workers:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == link:
                    return pid
            except FileNotFoundError:
                continue
    return None


def _lines_on(node: ServerProcess, worker: int, port: str = "native") -> Lines:
    """A native connection served by ``worker`` (connecting again until the kernel gives it that one)."""
    workers = _workers(node)
    for _ in range(200):
        c = Lines(node.ports[port])
        if _serving(c.sock, workers) == worker:
            return c
        c.close()
    raise AssertionError(f"no connection landed on worker {worker}")


def _start_node(data: Path) -> ServerProcess:
    """``hubbub serve --workers 2`` on ``data``, once both workers run."""
    srv = ServerProcess(data, ["--workers", "2", "--cluster-gap-wait-s", "0.05"]).start(timeout=60.0)
    try:
        _wait_for(lambda: len(_workers(srv)) == 2, "two workers")
    except BaseException:
        srv.kill()
        raise
    return srv


@pytest.fixture(scope="module")
def module_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[int]]]:
    """The node the ``SHARED`` tests use, and its workers as started."""
    srv = _start_node(tmp_path_factory.mktemp("workers") / "data")
    try:
        yield srv, _workers(srv)
    finally:
        srv.kill()


@pytest.fixture
def node(module_node: tuple[ServerProcess, list[int]]) -> Iterator[ServerProcess]:
    """The module's node, for a test that leaves it as it found it: the same two workers, running, before and
    after the test (checked when the test starts and ends; a worker killed may die a moment after that)."""
    srv, workers = module_node

    def check() -> None:
        now = _workers(srv)  # a worker killed stays listed until its parent reaps it: its state tells
        assert srv.alive and now == workers and all(map(_running, now)), (
            f"the shared node's workers {workers} are now {now}: a test that kills a worker or stops the"
            " node must start its own (own_node)"
        )

    check()
    yield srv
    check()


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[ServerProcess]:
    """A node of the test's own, for a test that kills a worker or stops the node."""
    srv = _start_node(tmp_path / "data")
    try:
        yield srv
    finally:
        srv.kill()


@pytest.fixture
def space(request: pytest.FixtureRequest) -> str:
    """A name of the test's own (its function's), to put its channels, topics, consumers and tokens under
    on the shared node: a plain channel segment, qpubs topic word, consumer name and mist token."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name.removeprefix("test_"))


def _publish_many(c: Lines, channel: str, n: int, tag: str, acked: list[int]) -> None:
    for i in range(n):
        acked.append(int(c.publish(channel, f"{tag}{i}")["seq"]))


def _events(c: Lines, n: int) -> list[dict[str, Any]]:
    return [c.next_push() for _ in range(n)]


@SHARED
def test_publishes_on_either_worker_reach_subscribers_on_both_in_one_sequence_once(
    node: ServerProcess, space: str
) -> None:
    a, b = _workers(node)
    room = f"/{space}/room"
    # One node: one federation id, made by the parent, not one per worker of a new data directory.
    ids = {json.loads(line)["message"] for line in node.log().splitlines() if "federation node id" in line}
    assert len(ids) == 1, ids
    with _lines_on(node, a) as sub_a, _lines_on(node, b) as sub_b:
        for s in (sub_a, sub_b):
            assert s.subscribe("s", f"{room}/**")["op"] == "reply"
        pub_a, pub_b = _lines_on(node, a), _lines_on(node, b)
        acks_a: list[int] = []
        acks_b: list[int] = []
        threads = [
            threading.Thread(target=_publish_many, args=(pub_a, f"{room}/1", 150, "a", acks_a)),
            threading.Thread(target=_publish_many, args=(pub_b, f"{room}/1", 150, "b", acks_b)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # One sequence for the channel, whichever worker committed: 1..300, each seq acknowledged once.
        assert sorted(acks_a + acks_b) == list(range(1, 301))
        for s in (sub_a, sub_b):
            got = _events(s, 300)
            assert [e["seq"] for e in got] == list(range(1, 301))
            texts = {e["seq"]: e["text"] for e in got}
            assert [texts[q] for q in acks_a] == [f"a{i}" for i in range(150)]
            assert [texts[q] for q in acks_b] == [f"b{i}" for i in range(150)]
        # Nothing more is queued for either subscriber: the next event is the next publish.
        assert pub_b.publish(f"{room}/2", "last")["seq"] == 1
        for s in (sub_a, sub_b):
            e = s.next_push()
            assert (e["channel"], e["seq"], e["text"]) == (f"{room}/2", 1, "last")
        # A replay on worker B of what both published agrees with the live stream.
        with _lines_on(node, b) as r:
            reply = r.subscribe("r", f"{room}/1", last=5)
            assert reply["position"]["seq"] == 300
            assert [e["seq"] for e in _events(r, 5)] == [296, 297, 298, 299, 300]
        pub_a.close()
        pub_b.close()


@SHARED
def test_a_subscriber_recovers_on_the_other_worker_with_no_gap(node: ServerProcess, space: str) -> None:
    a, b = _workers(node)
    feed = f"/{space}/feed"
    with _lines_on(node, a) as pub:
        sub = _lines_on(node, a)
        assert sub.subscribe("s", feed)["op"] == "reply"
        for i in range(50):
            assert pub.publish(feed, f"m{i}")["seq"] == i + 1
        seen = _events(sub, 50)
        sub.close()
        for i in range(50, 120):  # published while it is away
            assert pub.publish(feed, f"m{i}")["seq"] == i + 1
        last = seen[-1]
        with _lines_on(node, b) as again:  # back, on the other worker, from where it was
            since = {"seq": last["seq"], "epoch": last["epoch"]}
            assert again.subscribe("s", feed, since=since)["op"] == "reply"
            got = _events(again, 70)
            assert [e["seq"] for e in got] == list(range(51, 121))
            assert [e["text"] for e in got] == [f"m{i}" for i in range(50, 120)]
            assert pub.publish(feed, "live")["seq"] == 121
            assert again.next_push()["seq"] == 121  # and nothing repeated before it


def test_a_worker_killed_is_restarted_and_costs_only_its_own_connections(own_node: ServerProcess) -> None:
    node = own_node
    a, b = _workers(node)
    with _lines_on(node, b) as pub, _lines_on(node, b) as stays:
        gone = _lines_on(node, a)
        for s in (stays, gone):
            assert s.subscribe("s", "/k")["op"] == "reply"
        for i in range(30):
            assert pub.publish("/k", f"m{i}")["seq"] == i + 1
        seen = _events(gone, 30)
        os.kill(a, signal.SIGKILL)
        with pytest.raises((ConnectionError, OSError)):
            while True:  # the killed worker's connection ends
                gone.recv()
        gone.close()
        for i in range(30, 80):  # worker B serves on, its connections untouched
            assert pub.publish("/k", f"m{i}")["seq"] == i + 1
        assert [e["seq"] for e in _events(stays, 80)] == list(range(1, 81))
        _wait_for(lambda: len(_workers(node)) == 2 and a not in _workers(node), "the worker's restart")
        new = next(w for w in _workers(node) if w != b)
        _wait_for(
            lambda: "worker 0 restarted" in node.log() or "worker 1 restarted" in node.log(), "its start"
        )
        with _lines_on(node, new) as back:  # the client reconnects (to the new worker) and recovers
            since = {"seq": seen[-1]["seq"], "epoch": seen[-1]["epoch"]}
            assert back.subscribe("s", "/k", since=since)["op"] == "reply"
            assert [e["seq"] for e in _events(back, 50)] == list(range(31, 81))
            assert pub.publish("/k", "after")["seq"] == 81
            assert back.next_push()["text"] == "after"
            assert stays.next_push()["text"] == "after"


def test_a_fork_server_killed_stops_the_node_and_its_workers(own_node: ServerProcess) -> None:
    """The workers are the fork server's children: if it dies they die with it, and the node stops with
    status 1 (a service manager restarts it), leaving the data directory to the next node."""
    node = own_node
    assert node.proc is not None
    (server,) = _children(node.proc.pid)
    workers = _workers(node)
    os.kill(server, signal.SIGKILL)
    assert node.proc.wait(30) == 1
    assert "shutting down: workers: fork-server failed" in node.log()
    _wait_for(lambda: not any(map(_running, workers)), "the workers' end")
    again = ServerProcess(node.data_dir).start(timeout=60.0)
    again.kill()


def test_sigterm_loses_no_acknowledged_publish(own_node: ServerProcess) -> None:
    node = own_node
    a, b = _workers(node)
    acked: dict[str, list[int]] = {"a": [], "b": []}
    stop = threading.Event()

    def publish(worker: int, tag: str) -> None:
        c = _lines_on(node, worker)
        i = 0
        try:
            while not stop.is_set():
                reply = c.publish("/t", f"{tag}{i}")
                if reply.get("op") != "reply":
                    return  # refused while shutting down
                acked[tag].append(int(reply["seq"]))
                i += 1
        except (ConnectionError, OSError):
            return  # closed by the shutdown: what was acknowledged is counted
        finally:
            c.close()

    threads = [threading.Thread(target=publish, args=(w, t)) for w, t in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    _wait_for(lambda: len(acked["a"]) > 50 and len(acked["b"]) > 50, "publishes on both workers")
    assert node.terminate() == 0
    stop.set()
    for t in threads:
        t.join(30)
    every = sorted(acked["a"] + acked["b"])
    assert every == sorted(set(every))  # one sequence
    # The log, read by a single-process server on the same data directory, holds every acknowledged one.
    again = ServerProcess(node.data_dir).start(timeout=60.0)
    try:
        with Lines(again.ports["native"]) as r:
            top = r.subscribe("r", "/t")["position"]["seq"]
            assert top >= every[-1]
            reply = r.subscribe("all", "/t", since={"seq": 0, "epoch": ""})
            assert reply["op"] == "reply", reply
            got = [e["seq"] for e in _events(r, top)]
            assert got == list(range(1, top + 1))
    finally:
        again.kill()


@SHARED
def test_other_dialects_share_the_workers_sequence(node: ServerProcess, space: str) -> None:
    """qrpc listens on both workers get every emit of either worker, in order, once."""
    a, b = _workers(node)

    async def on(worker: int) -> QrpcClient:
        for _ in range(200):
            q = await QrpcClient.connect(node.ports["qrpc"])
            if _serving(q.writer.get_extra_info("socket"), [a, b]) == worker:
                return q
            await q.close()
        raise AssertionError(f"no qrpc connection landed on worker {worker}")

    async def main() -> None:
        qa, qb = await on(a), await on(b)
        la, lb = qa.send("listen", {"topic": f"{space}.q.*"}), qb.send("listen", {"topic": f"{space}.q.*"})
        for q in (qa, qb):  # calls are handled in order: the listen is registered after this
            assert await q.call("ignore", {"topic": "__barrier__"}) == {"ok": True, "removed": 0}
        for i in range(40):
            q = qa if i % 2 else qb
            await q.call("emit", {"topic": f"{space}.q.x", "value": i})
        for q, lid in ((qa, la), (qb, lb)):
            assert [(await q.next(lid))["m"]["value"] for _ in range(40)] == list(range(40))
        await qa.close()
        await qb.close()

    asyncio.run(main())


@SHARED
def test_a_durable_consumer_is_held_by_one_worker_and_gets_every_workers_events(
    node: ServerProcess, space: str
) -> None:
    a, b = _workers(node)
    jobs, name = f"/{space}/jobs", f"{space}.jobs"
    with _lines_on(node, a) as cons, _lines_on(node, b) as other, _lines_on(node, b) as pub:
        r = cons.request({"op": "consume", "consumer": name, "pattern": f"{jobs}/**", "max": 10})
        assert r["op"] == "reply" and r["created"] is True, r
        # Held on worker A: a connection on worker B may not open it too (one holder among the workers).
        assert other.request({"op": "consume", "consumer": name, "create": False})["code"] == 4206
        for i in range(25):  # published on worker B, journaled in its commits
            assert pub.publish(f"{jobs}/a", f"j{i}")["op"] == "reply"
        got: list[str] = []
        positions: list[int] = []
        while len(got) < 25:
            d = cons.next_push("deliver")
            got += [it["text"] for it in d["items"]]
            positions += [it["pos"] for it in d["items"]]
            assert cons.request({"op": "ack", "consumer": name, "batch": d["batch"]})["op"] == "reply"
        assert got == [f"j{i}" for i in range(25)] and positions == list(range(1, 26))
        # Let go on worker A, opened on worker B: nothing pending, and the next event comes there. Worker A
        # gives its hold back just after the reply (as a cluster node does): busy until then.
        assert cons.request({"op": "unconsume", "consumer": name})["op"] == "reply"
        deadline = time.monotonic() + 10
        while (r := other.request({"op": "consume", "consumer": name, "create": False}))["op"] == "error":
            assert r["code"] == 4206 and time.monotonic() < deadline, r
            time.sleep(0.02)  # polling the hold, which the other worker gives back by itself
        assert r["pending"] == 0, r
        assert cons.publish(f"{jobs}/b", "after")["op"] == "reply"  # from worker A this time
        d = other.next_push("deliver")
        assert [(it["text"], it["pos"]) for it in d["items"]] == [("after", 26)]


def _socket_on(node: ServerProcess, worker: int, port: str) -> socket.socket:
    """A plain TCP connection to listener ``port`` served by ``worker``."""
    workers = _workers(node)
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", node.ports[port]), timeout=20.0)
        if _serving(s, workers) == worker:
            return s
        s.close()
    raise AssertionError(f"no connection landed on worker {worker}")


def _mist_lines(s: socket.socket, n: int) -> list[str]:
    """The next ``n`` lines a mist 2015 TCP connection receives."""
    buf = b""
    while buf.count(b"\n") < n:
        chunk = s.recv(65536)
        assert chunk, f"closed after {buf!r}"
        buf += chunk
    return buf.decode().splitlines()[:n]


@SHARED
def test_mist_token_registrations_reach_every_worker(node: ServerProcess, space: str) -> None:
    """The token registry is the data directory's file, shared by the workers: a token registered through one
    worker is known to the other at once, and changes made through both are all kept."""
    a, b = _workers(node)
    tok, other = f"{space}-tok", f"{space}-other"
    with _socket_on(node, a, "mist") as on_a, _socket_on(node, b, "mist") as on_b:
        on_a.sendall(f"register red,blue {tok}\ntags {tok}\n".encode())
        assert _mist_lines(on_a, 1) == [f"tags {tok} blue,red"]
        on_b.sendall(f"tags {tok}\nregister green {other}\nset x {tok}\ntags {tok}\n".encode())
        assert _mist_lines(on_b, 2) == [f"tags {tok} blue,red", f"tags {tok} blue,red,x"]
        on_a.sendall(f"tags {other}\ntags {tok}\nregister y {tok}\n".encode())
        assert _mist_lines(on_a, 3) == [
            f"tags {other} green",
            f"tags {tok} blue,red,x",
            "error already exists",
        ]
    saved = json.loads((node.data_dir / "mist-tokens.json").read_text())
    # Every token of this test's, and only those (the file holds the other tests' too, if any).
    mine = {t: tags for t, tags in saved["tokens"].items() if t.startswith(f"{space}-")}
    assert mine == {other: ["green"], tok: ["blue", "red", "x"]}
