"""Two real ``hubbub serve`` processes on one PostgreSQL and one Redis (both started by the tests): every
subscriber sees every node's events in per-channel seq order, once, across a ``kill -9`` of Redis."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests.redisserver import RedisServer

from .nativelines import Lines
from .serverproc import ServerProcess

pytestmark = pytest.mark.slow


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def _healthz(node: ServerProcess) -> dict[str, Any]:
    status, body = _get(node.ports["http"], "/healthz")
    obj = json.loads(body)
    assert status == 200 and isinstance(obj, dict), (status, body)
    return obj


def _metric(node: ServerProcess, name: str) -> float:
    _, body = _get(node.ports["http"], "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling a condition the servers decide


def _node(tmp: Path, name: str, pg_url: str, redis: RedisServer) -> ServerProcess:
    return ServerProcess(
        tmp / name,
        [
            "--store", pg_url, "--broker", redis.url, "--cluster-node-id", name,
            "--cluster-gap-wait-s", "0.05", "--cluster-poll-interval-s", "0.2",
        ],
    ).start()  # fmt: skip


@pytest.fixture
def cluster(tmp_path: Path, pg_url: str, redis_server: RedisServer) -> Iterator[list[ServerProcess]]:
    nodes = [_node(tmp_path, "a", pg_url, redis_server), _node(tmp_path, "b", pg_url, redis_server)]
    try:
        yield nodes
    finally:
        for n in nodes:
            n.kill()


def _events(c: Lines, n: int) -> list[dict[str, Any]]:
    return [c.next_push() for _ in range(n)]


def _publish_many(port: int, channel: str, n: int, tag: str, acked: list[int]) -> None:
    with Lines(port) as c:
        for i in range(n):
            acked.append(int(c.publish(channel, f"{tag}{i}")["seq"]))


def test_subscribers_on_both_nodes_see_every_publish_in_order_once(cluster: list[ServerProcess]) -> None:
    a, b = cluster
    assert _healthz(a)["broker"]["state"] == "up" and _healthz(b)["broker"]["node_id"] == "b"
    with Lines(a.ports["native"]) as sub_a, Lines(b.ports["native"]) as sub_b:
        for s in (sub_a, sub_b):
            assert s.subscribe("s", "/room/**")["op"] == "reply"
        # Publishers on both nodes, to one channel at once: seqs interleave across the nodes.
        acks_a: list[int] = []
        acks_b: list[int] = []
        threads = [
            threading.Thread(target=_publish_many, args=(a.ports["native"], "/room/1", 150, "a", acks_a)),
            threading.Thread(target=_publish_many, args=(b.ports["native"], "/room/1", 150, "b", acks_b)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(acks_a + acks_b) == list(range(1, 301))
        for s in (sub_a, sub_b):
            got = _events(s, 300)
            assert [e["seq"] for e in got] == list(range(1, 301))
            texts = {e["seq"]: e["text"] for e in got}
            assert {texts[q] for q in acks_a} == {f"a{i}" for i in range(150)}
        # Nothing more is queued for either subscriber: the next event is the next publish.
        assert sub_a.publish("/room/2", "last")["seq"] == 1
        for s in (sub_a, sub_b):
            e = s.next_push()
            assert (e["channel"], e["seq"], e["text"]) == ("/room/2", 1, "last")
        # A replay on node B of what node A published agrees with the live stream.
        with Lines(b.ports["native"]) as r:
            reply = r.subscribe("r", "/room/1", last=5)
            assert reply["position"]["seq"] == 300
            assert [e["seq"] for e in _events(r, 5)] == [296, 297, 298, 299, 300]
    assert _metric(b, "hubbub_cluster_broker_up") == 1
    assert _metric(b, "hubbub_cluster_received_total") >= 150


def test_foreign_messages_on_the_redis_channel_are_ignored(
    cluster: list[ServerProcess], redis_server: RedisServer
) -> None:
    import redis

    a, b = cluster
    with redis.Redis.from_url(redis_server.url) as r:
        assert r.publish("hubbub.events", b"not a hubbub message") == 2  # both nodes listen
        r.publish("hubbub.events", msgpack.packb([1, "x", "e", [["/z", 1]]]))
    _wait_for(lambda: _metric(b, "hubbub_cluster_bad_messages_total") == 2, "node B to count them")
    with Lines(b.ports["native"]) as sub, Lines(a.ports["native"]) as pub:
        assert sub.subscribe("s", "/z")["op"] == "reply"
        assert pub.publish("/z", "fine")["seq"] == 1
        assert sub.next_push()["text"] == "fine"


def test_redis_killed_and_restarted_loses_and_repeats_nothing(
    cluster: list[ServerProcess], redis_server: RedisServer
) -> None:
    a, b = cluster
    total = 400
    with Lines(b.ports["native"]) as sub, Lines(a.ports["native"]) as pub:
        assert sub.subscribe("s", "/feed")["op"] == "reply"
        for i in range(100):
            assert pub.publish("/feed", f"m{i}")["seq"] == i + 1
        assert [e["seq"] for e in _events(sub, 100)] == list(range(1, 101))
        redis_server.kill()  # kill -9, mid-stream
        for i in range(100, 250):  # node A keeps acknowledging: the log is PostgreSQL
            assert pub.publish("/feed", f"m{i}")["seq"] == i + 1
        _wait_for(lambda: _healthz(b)["status"] == "degraded", "node B to notice")
        assert _healthz(b)["broker"]["state"] == "down"
        assert _metric(b, "hubbub_cluster_broker_up") == 0
        # Without Redis, node B still delivers node A's events, from the log.
        got = _events(sub, 150)
        redis_server.start()  # the same port
        _wait_for(lambda: _healthz(a)["status"] == "ok" and _healthz(b)["status"] == "ok", "Redis again")
        for i in range(250, total):
            assert pub.publish("/feed", f"m{i}")["seq"] == i + 1
        got += _events(sub, total - 250)
        assert [e["seq"] for e in got] == list(range(101, total + 1))
        assert [e["text"] for e in got] == [f"m{i}" for i in range(100, total)]
        assert pub.publish("/feed", "end")["seq"] == total + 1
        assert sub.next_push()["seq"] == total + 1  # and nothing repeated before it
    assert _metric(b, "hubbub_cluster_reconnects_total") >= 1


def test_a_node_started_without_redis_serves_and_joins_later(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    redis_server.kill()
    a = _node(tmp_path, "a", pg_url, redis_server)
    try:
        assert _healthz(a)["broker"]["state"] == "down"
        with Lines(a.ports["native"]) as c:
            assert c.subscribe("s", "/x")["op"] == "reply"
            assert c.publish("/x", "one")["seq"] == 1
            assert c.next_push()["text"] == "one"
            redis_server.start()
            _wait_for(lambda: _healthz(a)["status"] == "ok", "Redis")
            assert c.publish("/x", "two")["seq"] == 2
            assert c.next_push()["text"] == "two"
    finally:
        a.kill()


def test_three_nodes_a_node_killed_mid_load_loses_no_acknowledged_event(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    a, b, c = (_node(tmp_path, n, pg_url, redis_server) for n in "abc")
    try:
        with Lines(c.ports["native"]) as watcher, Lines(a.ports["native"]) as on_a:
            for s in (watcher, on_a):
                assert s.subscribe("s", "/load")["op"] == "reply"
            acked: dict[int, str] = {}
            pub = Lines(a.ports["native"])
            for i in range(150):
                r = pub.publish("/load", f"m{i}")
                acked[int(r["seq"])] = f"m{i}"
            epoch = str(r["epoch"])
            # A commit in flight at the kill: sent, maybe committed, never acknowledged.
            pub.send({"op": "publish", "id": 9999, "channel": "/load", "text": "maybe", "ack": True})
            a.kill()  # kill -9 node A mid-load
            pub.close()
            # The publisher goes on on node B.
            with Lines(b.ports["native"]) as pub_b:
                for i in range(150, 300):
                    r = pub_b.publish("/load", f"m{i}")
                    acked[int(r["seq"])] = f"m{i}"
            top = max(acked)
            # Node A's subscriber saw some prefix, then lost its connection.
            seen: list[dict[str, Any]] = []
            with pytest.raises((ConnectionError, OSError)):
                while True:
                    seen.append(on_a.next_push())
            last = seen[-1]["seq"] if seen else 0
            assert [e["seq"] for e in seen] == list(range(1, last + 1))
            # ... and recovers on node B from its position, with no gap and no repeat.
            with Lines(b.ports["native"]) as again:
                reply = again.subscribe("s", "/load", since={"seq": last, "epoch": epoch})
                assert reply["position"] == {"seq": top, "epoch": epoch}, reply
                rest = [again.next_push() for _ in range(reply["position"]["seq"] - last)]
                assert [e["seq"] for e in rest] == list(range(last + 1, reply["position"]["seq"] + 1))
                assert again.next_push("recovered")["replayed"] == len(rest)
            # Node C's subscriber sees every committed event, acknowledged ones included, in order, once.
            got = [watcher.next_push() for _ in range(top)]
            assert [e["seq"] for e in got] == list(range(1, top + 1))
            texts = {e["seq"]: e["text"] for e in got}
            assert all(texts[q] == t for q, t in acked.items())
    finally:
        for n in (a, b, c):
            n.kill()


def test_two_nodes_given_one_id_still_hear_each_other_and_say_so(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    extra = ["--store", pg_url, "--broker", redis_server.url, "--cluster-node-id", "twin"]
    a = ServerProcess(tmp_path / "a", extra).start()
    b = ServerProcess(tmp_path / "b", extra).start()
    try:
        with Lines(b.ports["native"]) as sub, Lines(a.ports["native"]) as pub:
            assert sub.subscribe("s", "/t")["op"] == "reply"
            for i in range(3):
                assert pub.publish("/t", f"m{i}")["seq"] == i + 1
            assert [sub.next_push()["seq"] for _ in range(3)] == [1, 2, 3]
        _wait_for(lambda: "another node uses this node's id" in b.log(), "node B to say so")
        assert _metric(b, "hubbub_cluster_fills_total") == 0  # heard through Redis, not from the log
    finally:
        a.kill()
        b.kill()


def test_broker_and_presence_report_redis_down_together(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    a = _node(tmp_path, "a", pg_url, redis_server)
    try:
        _wait_for(lambda: _healthz(a)["status"] == "ok", "node A with Redis")
        redis_server.kill()
        seen: list[tuple[str, str]] = []

        def broker_down() -> bool:
            h = _healthz(a)
            seen.append((h["broker"]["state"], h["presence"]["state"]))
            return bool(h["broker"]["state"] == "down")

        _wait_for(broker_down, "node A to notice Redis is gone")
        # Presence follows the broker's view: never "up" in an answer whose broker is "down" (it said "up" for
        # about 2 s, until its next write to Redis failed).
        assert seen[-1] == ("down", "down"), seen
        assert _healthz(a)["presence"] == {"state": "down"}
        assert _metric(a, "hubbub_presence_up") == 0
        redis_server.start()
        _wait_for(
            lambda: _healthz(a)["broker"]["state"] == "up" and _healthz(a)["presence"]["state"] == "up",
            "both back with Redis",
        )
    finally:
        a.kill()
