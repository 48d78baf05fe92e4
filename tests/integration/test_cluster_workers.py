"""A cluster of multi-process nodes: two ``hubbub serve --workers 2`` on one PostgreSQL and one Redis (both
started by the tests), each worker a member of the cluster (docs/cluster.md "Nodes of several workers").
Publishes from every worker of both nodes reach subscribers on every worker of both nodes in one sequence per
channel, every id once and in order; a subscriber recovers on another node; a durable consumer has one
holder among the four workers; a worker killed with -9 costs only its own connections, which reconnect and
recover with no gap; SIGTERM stops a node cleanly; guble's roster lists the receivers of every worker.

Connections are placed on the worker wanted as in test_workers.py (the kernel's choice, found from
``/proc``). The tests share the module's two nodes (starting them is most of the time; one xdist worker runs
the group), each on channels and consumers of its own (:func:`space`): the test that kills a worker waits
for its restart, leaving the nodes as it found them; the one that stops a node starts a third of its own."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.redisserver import RedisServer

from .nativelines import Lines
from .serverproc import ServerProcess
from .test_workers import _lines_on, _running, _serving, _wait_for, _workers

pytestmark = [
    pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="finds workers through /proc"),
    pytest.mark.xdist_group("cluster_workers"),
]


def _node(
    tmp: Path, name: str, pg_url: str, redis: RedisServer, extra: tuple[str, ...] = ()
) -> ServerProcess:
    """Node ``name`` of the cluster: two workers, members ``<name>/w0`` and ``<name>/w1``."""
    srv = ServerProcess(
        tmp / name,
        [
            "--workers", "2", "--store", pg_url, "--broker", redis.url, "--cluster-node-id", name,
            "--cluster-gap-wait-s", "0.05", "--cluster-poll-interval-s", "0.2", *extra,
        ],
    ).start(timeout=60.0)  # fmt: skip
    try:
        _wait_for(lambda: len(_workers(srv)) == 2, "two workers")
    except BaseException:
        srv.kill()
        raise
    return srv


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, module_redis_server: RedisServer
) -> Iterator[list[ServerProcess]]:
    tmp = tmp_path_factory.mktemp("cluster-workers")
    nodes: list[ServerProcess] = []
    try:
        for name in ("a", "b"):
            nodes.append(_node(tmp, name, module_pg_url, module_redis_server))
        yield nodes
    finally:
        for n in nodes:
            n.kill()


@pytest.fixture
def space(request: pytest.FixtureRequest) -> str:
    """A name of the test's own (its function's) for its channels and consumers on the shared nodes."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name.removeprefix("test_"))


def _every_worker(nodes: list[ServerProcess]) -> list[tuple[ServerProcess, int]]:
    """Every (node, worker pid) of the cluster, node by node."""
    return [(n, w) for n in nodes for w in _workers(n)]


def _cluster(node: ServerProcess) -> dict[str, Any]:
    """``GET /api/v1/cluster`` on ``node`` (whichever worker takes the connection)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{node.ports['http']}/api/v1/cluster", timeout=10) as r:
        body = json.loads(r.read())
    assert isinstance(body, dict)
    return body


def _members(node: ServerProcess) -> list[str]:
    """The live members of the cluster, as ``node`` sees them: one per worker."""
    return [str(m) for m in _cluster(node)["members"]]


def _publish_many(c: Lines, channel: str, n: int, tag: str, acked: list[int]) -> None:
    for i in range(n):
        acked.append(int(c.publish(channel, f"{tag}{i}")["seq"]))


def _events(c: Lines, n: int) -> list[dict[str, Any]]:
    return [c.next_push() for _ in range(n)]


def test_publishes_on_every_worker_reach_every_worker_of_both_nodes_in_order_once(
    cluster: list[ServerProcess], space: str
) -> None:
    room = f"/{space}/room"
    places = _every_worker(cluster)
    assert len(places) == 4
    # Four members, two per node, each worker its own: /api/v1/cluster on any worker lists them all, and
    # two nodes, each with its two workers.
    _wait_for(lambda: _members(cluster[0]) == ["a/w0", "a/w1", "b/w0", "b/w1"], "the four members")
    for n in cluster:
        body = _cluster(n)
        name = n.data_dir.name
        assert body["nodes"] == ["a", "b"] and body["node_id"] == name, body
        assert body["member"] in (f"{name}/w0", f"{name}/w1") and body["broker"]["node_id"] == body["member"]
    subs = [_lines_on(n, w) for n, w in places]
    pubs = [_lines_on(n, w) for n, w in places]
    try:
        for s in subs:
            assert s.subscribe("s", f"{room}/**")["op"] == "reply"
        acks: list[list[int]] = [[] for _ in pubs]
        threads = [
            threading.Thread(target=_publish_many, args=(p, f"{room}/1", 50, f"p{i}-", acks[i]))
            for i, p in enumerate(pubs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # One sequence for the channel, whichever worker of whichever node committed: 1..200, each once.
        assert sorted(q for a in acks for q in a) == list(range(1, 201))
        for s in subs:
            got = _events(s, 200)
            assert [e["seq"] for e in got] == list(range(1, 201))
            texts = {e["seq"]: e["text"] for e in got}
            for i, a in enumerate(acks):
                assert [texts[q] for q in a] == [f"p{i}-{k}" for k in range(50)]
        # Nothing more is queued for any subscriber: the next event is the next publish.
        assert pubs[-1].publish(f"{room}/2", "last")["seq"] == 1
        for s in subs:
            e = s.next_push()
            assert (e["channel"], e["seq"], e["text"]) == (f"{room}/2", 1, "last")
    finally:
        for c in subs + pubs:
            c.close()


def test_a_subscriber_recovers_on_a_worker_of_the_other_node_with_no_gap(
    cluster: list[ServerProcess], space: str
) -> None:
    a, b = cluster
    feed = f"/{space}/feed"
    with _lines_on(a, _workers(a)[1]) as pub:
        sub = _lines_on(a, _workers(a)[0])
        assert sub.subscribe("s", feed)["op"] == "reply"
        for i in range(40):
            assert pub.publish(feed, f"m{i}")["seq"] == i + 1
        seen = _events(sub, 40)
        assert [e["seq"] for e in seen] == list(range(1, 41))
        sub.close()
        for i in range(40, 100):  # published while it is away
            assert pub.publish(feed, f"m{i}")["seq"] == i + 1
        with _lines_on(b, _workers(b)[1]) as again:  # back, on the other node, from where it was
            since = {"seq": seen[-1]["seq"], "epoch": seen[-1]["epoch"]}
            assert again.subscribe("s", feed, since=since)["op"] == "reply"
            got = _events(again, 60)
            assert [e["seq"] for e in got] == list(range(41, 101))
            assert [e["text"] for e in got] == [f"m{i}" for i in range(40, 100)]
            assert pub.publish(feed, "live")["seq"] == 101
            e = again.next_push()  # and nothing repeated before it
            assert (e["seq"], e["text"]) == (101, "live")
        # An exact replay of the last five, on the other worker of the other node.
        with _lines_on(b, _workers(b)[0]) as r:
            reply = r.subscribe("r", feed, last=5)
            assert reply["position"]["seq"] == 101
            assert [e["seq"] for e in _events(r, 5)] == [97, 98, 99, 100, 101]


def test_a_durable_consumer_is_held_by_exactly_one_worker_of_the_cluster(
    cluster: list[ServerProcess], space: str
) -> None:
    jobs, name = f"/{space}/jobs", f"{space}.jobs"
    (holder_node, holder), *others = _every_worker(cluster)
    with _lines_on(holder_node, holder) as cons:
        r = cons.request({"op": "consume", "consumer": name, "pattern": f"{jobs}/**", "max": 10})
        assert r["op"] == "reply" and r["created"] is True, r
        rest = [_lines_on(n, w) for n, w in others]
        try:
            # The other worker of its node and both workers of the other node are refused: one holder.
            for c in rest:
                assert c.request({"op": "consume", "consumer": name, "create": False})["code"] == 4206
            for i in range(30):  # published from every other worker, journaled in their commits
                assert rest[i % 3].publish(f"{jobs}/x", f"j{i}")["op"] == "reply"
            got: list[str] = []
            positions: list[int] = []
            while len(got) < 30:
                d = cons.next_push("deliver")
                got += [it["text"] for it in d["items"]]
                positions += [it["pos"] for it in d["items"]]
                assert cons.request({"op": "ack", "consumer": name, "batch": d["batch"]})["op"] == "reply"
            assert got == [f"j{i}" for i in range(30)] and positions == list(range(1, 31))
            # Let go, then taken on a worker of the other node: nothing pending, the next event comes there.
            assert cons.request({"op": "unconsume", "consumer": name})["op"] == "reply"
            taker = rest[-1]
            deadline = time.monotonic() + 10
            while (r := taker.request({"op": "consume", "consumer": name, "create": False}))["op"] == "error":
                assert r["code"] == 4206 and time.monotonic() < deadline, r
                time.sleep(0.02)  # polling the hold, which the holder gives back by itself
            assert r["pending"] == 0, r
            for c in (cons, *rest[:-1]):  # and now it is the only holder
                assert c.request({"op": "consume", "consumer": name, "create": False})["code"] == 4206
            assert cons.publish(f"{jobs}/y", "after")["op"] == "reply"
            d = taker.next_push("deliver")
            assert [(it["text"], it["pos"]) for it in d["items"]] == [("after", 31)]
        finally:
            for c in rest:
                c.close()


def test_a_worker_killed_costs_only_its_connections_which_recover_with_no_gap(
    cluster: list[ServerProcess], space: str
) -> None:
    a, b = cluster
    k = f"/{space}/k"
    victim, survivor = _workers(a)
    restarts = a.log().count("restarted")
    with _lines_on(b, _workers(b)[0]) as pub:
        stays = [_lines_on(a, survivor), _lines_on(b, _workers(b)[1])]
        gone = _lines_on(a, victim)
        for s in (*stays, gone):
            assert s.subscribe("s", k)["op"] == "reply"
        for i in range(30):
            assert pub.publish(k, f"m{i}")["seq"] == i + 1
        seen = _events(gone, 30)
        assert [e["seq"] for e in seen] == list(range(1, 31))
        os.kill(victim, signal.SIGKILL)
        with pytest.raises((ConnectionError, OSError)):
            while True:  # the killed worker's connection ends
                gone.recv()
        gone.close()
        for i in range(30, 80):  # the rest of the cluster serves on, their connections untouched
            assert pub.publish(k, f"m{i}")["seq"] == i + 1
        for s in stays:
            assert [e["seq"] for e in _events(s, 80)] == list(range(1, 81))
        # The node restarts its worker (the same member id), which the client reconnects to and recovers on.
        _wait_for(lambda: a.log().count("restarted") > restarts, "the worker's restart")
        new = next(w for w in _workers(a) if w != survivor and _running(w))
        with _lines_on(a, new) as back:
            since = {"seq": seen[-1]["seq"], "epoch": seen[-1]["epoch"]}
            assert back.subscribe("s", k, since=since)["op"] == "reply"
            assert [e["seq"] for e in _events(back, 50)] == list(range(31, 81))
            assert pub.publish(k, "after")["seq"] == 81
            for s in (back, *stays):
                e = s.next_push()
                assert (e["seq"], e["text"]) == (81, "after")
        for s in stays:
            s.close()
    _wait_for(lambda: _members(b) == ["a/w0", "a/w1", "b/w0", "b/w1"], "the four members again")


def test_sigterm_stops_a_node_cleanly_and_loses_no_acknowledged_publish(
    cluster: list[ServerProcess],
    space: str,
    tmp_path: Path,
    module_pg_url: str,
    module_redis_server: RedisServer,
) -> None:
    a = cluster[0]
    t = f"/{space}/t"
    c = _node(tmp_path, "c", module_pg_url, module_redis_server)
    try:
        _wait_for(lambda: "c/w1" in _members(a) and "c/w0" in _members(a), "node c's members")
        with _lines_on(a, _workers(a)[0]) as sub:
            assert sub.subscribe("s", t)["op"] == "reply"
            acked: dict[int, list[int]] = {}
            stop = threading.Event()

            def publish(worker: int) -> None:
                mine = acked[worker] = []
                conn = _lines_on(c, worker)
                try:
                    while not stop.is_set():
                        reply = conn.publish(t, f"{worker}-{len(mine)}")
                        if reply.get("op") != "reply":
                            return  # refused while shutting down
                        mine.append(int(reply["seq"]))
                except (ConnectionError, OSError):
                    return  # closed by the shutdown: what was acknowledged is counted
                finally:
                    conn.close()

            threads = [threading.Thread(target=publish, args=(w,)) for w in _workers(c)]
            for th in threads:
                th.start()
            _wait_for(lambda: len(acked) == 2 and all(len(x) > 30 for x in acked.values()), "publishes")
            assert c.terminate(timeout=40.0) == 0
            stop.set()
            for th in threads:
                th.join(30)
            log = c.log()
            assert log.count('"hubbub stopped"') == 3, log  # each worker, then the parent
            assert "killed" not in log and "restarting" not in log, log
            every = sorted(q for x in acked.values() for q in x)
            assert every == sorted(set(every))
            # Node a delivered every event of node c's, in one sequence: all acknowledged ones are there.
            top = every[-1]
            got = [e["seq"] for e in _events(sub, top)]
            assert got == list(range(1, top + 1))
        # Its members left the presence at once (a clean stop), not after cluster.presence_ttl_s.
        _wait_for(lambda: _members(a) == ["a/w0", "a/w1", "b/w0", "b/w1"], "node c's members leaving", 5.0)
    finally:
        c.kill()


def test_under_durability_none_a_restarted_worker_keeps_the_epochs(
    cluster: list[ServerProcess],
    space: str,
    tmp_path: Path,
    module_pg_url: str,
    module_redis_server: RedisServer,
) -> None:
    """``durability = none`` starts new epochs once for the node, at its start: a worker killed lost no
    commit (PostgreSQL has them), so its restart must not tell every client of the cluster that continuity
    was lost."""
    a = cluster[0]
    ch = f"/{space}/e"
    with _lines_on(a, _workers(a)[0]) as pub:
        first = pub.publish(ch, "before")
    d = _node(tmp_path, "d", module_pg_url, module_redis_server, ("--durability", "none"))
    try:
        with _lines_on(a, _workers(a)[0]) as pub:
            second = pub.publish(ch, "after d started")
        assert second["epoch"] != first["epoch"] and second["seq"] == 1  # the node's start: new epochs
        victim, survivor = _workers(d)
        restarts = d.log().count("restarted")
        os.kill(victim, signal.SIGKILL)
        _wait_for(lambda: d.log().count("restarted") > restarts, "the worker's restart")
        new = next(w for w in _workers(d) if w not in (victim, survivor) and _running(w))
        with _lines_on(d, new) as pub:  # on the restarted worker
            third = pub.publish(ch, "after the restart")
        assert (third["epoch"], third["seq"]) == (second["epoch"], 2), (second, third)
    finally:
        d.kill()


async def _guble_on(
    http: aiohttp.ClientSession, node: ServerProcess, worker: int, user: str, channel: str
) -> aiohttp.ClientWebSocketResponse:
    """A guble receiver of ``channel`` as ``user``, on ``worker`` of ``node``."""
    for _ in range(200):
        ws = await http.ws_connect(f"http://127.0.0.1:{node.ports['http']}/stream/user/{user}")
        if _serving(ws.get_extra_info("socket"), _workers(node)) == worker:
            break
        await ws.close()
    else:
        raise AssertionError(f"no connection landed on worker {worker}")
    await ws.send_str(f"+ {channel}")
    while True:
        data = (await ws.receive(timeout=20)).data
        text = data.decode() if isinstance(data, bytes) else str(data)
        if text.startswith(f"#subscribed-to {channel}"):
            return ws


def test_guble_subscribers_list_the_receivers_of_every_worker_of_every_node(
    cluster: list[ServerProcess], space: str
) -> None:
    """Rosters are the cluster's: each worker keeps its receivers under its member id, and
    ``/api/subscribers`` on any worker of any node lists them all, oldest first."""
    room = f"/{space}/room"

    async def roster(http: aiohttp.ClientSession, node: ServerProcess) -> list[str]:
        async with http.get(f"http://127.0.0.1:{node.ports['http']}/api/subscribers{room}") as r:
            assert r.status == 200
            return [m["user_id"] for m in json.loads(await r.read())]

    async def until(http: aiohttp.ClientSession, want: list[str]) -> None:
        deadline = time.monotonic() + 20
        while (got := await roster(http, cluster[0])) != want:
            assert time.monotonic() < deadline, f"{got}, want {want}"
            await asyncio.sleep(0.02)  # polling what the workers decide
        # Then every read agrees, on each node, whichever worker the kernel gives it.
        for node in cluster:
            for _ in range(6):
                assert await roster(http, node) == want

    async def main() -> None:
        # A connection per request: each read goes to whichever worker the kernel picks.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            users = [f"u{i}" for i in range(4)]
            receivers = []
            for user, (node, worker) in zip(users, _every_worker(cluster), strict=True):
                receivers.append(await _guble_on(http, node, worker, user, room))
            await until(http, users)
            await receivers[1].send_str(f"- {room}")  # cancelled on a/w1: gone from every worker's view
            await until(http, ["u0", "u2", "u3"])
            for ws in receivers:
                await ws.close()
            await until(http, [])

    asyncio.run(main())
