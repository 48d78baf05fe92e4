"""MQTT's state shared by every process of one log (docs/dialects/mqtt.md "Clusters and workers"): retained
messages, persistent sessions and the takeover of a client id, between two nodes of a cluster (real
PostgreSQL and Redis, started by the tests), between the two workers of a ``serve --workers 2`` node (each
connection placed on the worker wanted, as in test_workers.py) and between the two workers of such a node of
the cluster.

Every delivery is checked whole: each message's topic, payload, QoS and retain flag, in order, and nothing
more (a PINGREQ answered after them).

The tests share the cluster and the nodes of the module (starting them is most of the time), each on topics
and client ids of its own (:func:`space`), so that neither their order nor which of them run matters; they
run on one xdist worker, which starts them once."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from hubbub.dialects import mqtt_codec as c
from tests.redisserver import RedisServer

from .mqttclient import MqttClient
from .serverproc import ServerProcess
from .test_cluster import _node
from .test_cluster_workers import _node as _cluster_workers_node
from .test_workers import _serving, _wait_for, _workers

#: Opens an MQTT connection on one of the two places (a node, a worker): 0 or 1.
Open = Callable[[int], Awaitable[MqttClient]]

N = 30

pytestmark = pytest.mark.xdist_group("mqtt_shared")

_spaces = itertools.count(1)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, module_redis_server: RedisServer
) -> Iterator[Open]:
    tmp = tmp_path_factory.mktemp("cluster")
    nodes = [
        _node(tmp, "a", module_pg_url, module_redis_server),
        _node(tmp, "b", module_pg_url, module_redis_server),
    ]

    async def open_on(i: int) -> MqttClient:
        return await MqttClient.open(nodes[i].ports["mqtt"])

    try:
        yield open_on
    finally:
        for n in nodes:
            n.kill()


def _on_workers(srv: ServerProcess) -> Open:
    """Opens a connection on worker 0 or 1 of ``srv``."""

    async def open_on(i: int) -> MqttClient:
        """A connection served by worker ``i`` (connecting again until the kernel gives it that one)."""
        pids = _workers(srv)
        for _ in range(200):
            cl = await MqttClient.open(srv.ports["mqtt"])
            if _serving(cl.writer.get_extra_info("socket"), pids) == pids[i]:
                return cl
            cl.abort()
        raise AssertionError(f"no connection landed on worker {i}")

    return open_on


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Open]:
    srv = ServerProcess(
        tmp_path_factory.mktemp("workers") / "data", ["--workers", "2", "--cluster-gap-wait-s", "0.05"]
    ).start(timeout=60.0)
    try:
        _wait_for(lambda: len(_workers(srv)) == 2, "two workers")
        yield _on_workers(srv)
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def cluster_workers(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, module_redis_server: RedisServer
) -> Iterator[Open]:
    """The two workers of a node of the cluster (each a member of it: docs/cluster.md "Nodes of several
    workers"), on the cluster's log and Redis."""
    srv = _cluster_workers_node(
        tmp_path_factory.mktemp("cluster-workers"), "w", module_pg_url, module_redis_server
    )
    try:
        yield _on_workers(srv)
    finally:
        srv.kill()


_WITH_PROC = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="finds workers through /proc")


@pytest.fixture(
    params=[
        "cluster",
        pytest.param("workers", marks=_WITH_PROC),
        pytest.param("cluster_workers", marks=_WITH_PROC),
    ]
)
def places(request: pytest.FixtureRequest) -> Open:
    """Two places serving one log: the two nodes of a cluster, the two workers of a node, or the two workers
    of a cluster node."""
    opener: Open = request.getfixturevalue(request.param)
    return opener


@pytest.fixture
def space() -> str:
    """A prefix of the test's own for its topics and client ids on the shared places."""
    return f"t{next(_spaces)}"


async def _connect(open_on: Open, where: int, client_id: str, **kw: object) -> MqttClient:
    cl = await open_on(where)
    ack = await cl.handshake(client_id, **kw)
    assert ack.code == 0, ack
    return cl


def test_a_retained_message_published_on_one_is_sent_by_the_other_and_cleared_from_it(
    places: Open, space: str
) -> None:
    rc = f"{space}/rc"

    async def main() -> None:
        pub = await _connect(places, 0, f"{space}-pub-0")
        await pub.publish(f"{rc}/x", b"x-from-0", qos=1, retain=True)
        await pub.publish(f"{rc}/y", b"y-from-0", qos=2, retain=True)
        sub = await _connect(places, 1, f"{space}-sub-1")
        assert await sub.subscribe((f"{rc}/#", 1)) == (1,)
        got = [await sub.message() for _ in range(2)]
        assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
            (f"{rc}/x", b"x-from-0", 1, True),
            (f"{rc}/y", b"y-from-0", 1, True),
        ]
        await sub.ping()
        # An empty retained payload published on 1 clears the channel's retained message for 0 too.
        clear = await _connect(places, 1, f"{space}-pub-1")
        await clear.publish(f"{rc}/x", b"", qos=1, retain=True)
        m = await sub.message()  # delivered live as any publish [MQTT-3.3.1-10], without the flag
        assert (m.topic, m.payload, m.retain) == (f"{rc}/x", b"", False)
        late = await _connect(places, 0, f"{space}-late-0")
        assert await late.subscribe((f"{rc}/+", 0)) == (0,)
        m = await late.message()
        assert (m.topic, m.payload, m.qos, m.retain) == (f"{rc}/y", b"y-from-0", 0, True)
        await late.ping()  # and nothing for rc/x
        for cl in (pub, sub, clear, late):
            await cl.disconnect()

    asyncio.run(main())


def test_a_persistent_session_left_on_one_is_resumed_on_the_other_with_every_message(
    places: Open, space: str
) -> None:
    ps, keeper = f"{space}/ps", f"{space}-keeper"

    async def main() -> None:
        away = await places(0)
        assert await away.handshake(keeper, clean_session=False) == c.Connack(False, 0)
        assert await away.subscribe((f"{ps}/#", 1)) == (1,)
        await away.disconnect()
        pubs = [await _connect(places, 0, f"{space}-pub-0"), await _connect(places, 1, f"{space}-pub-1")]
        for i in range(N):  # from both, one after the other: one order
            await pubs[i % 2].publish(f"{ps}/x", b"%d" % i, qos=1)
        back = await places(1)
        assert await back.handshake(keeper, clean_session=False) == c.Connack(True, 0)
        got = [await back.message() for _ in range(N)]
        assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
            (f"{ps}/x", b"%d" % i, 1, False) for i in range(N)
        ]
        await back.ping()  # nothing more
        await pubs[0].publish(f"{ps}/live", b"live", qos=1)  # the filter is the session's here too, live
        m = await back.message()
        assert (m.topic, m.payload) == (f"{ps}/live", b"live")
        await back.disconnect()
        for p in pubs:
            await p.disconnect()

    asyncio.run(main())


def test_a_client_id_connecting_on_the_other_closes_the_older_connection_and_its_will_goes_out(
    places: Open, space: str
) -> None:
    wills, same = f"{space}/wills", f"{space}-same"

    async def main() -> None:
        watcher = await _connect(places, 1, f"{space}-watcher")
        assert await watcher.subscribe((f"{wills}/#", 1)) == (1,)
        first = await _connect(places, 0, same, will=c.Will(f"{wills}/same", b"first gone", 1, False))
        second = await _connect(places, 1, same, will=c.Will(f"{wills}/same", b"second gone", 1, False))
        assert await first.closed() == b""
        # A takeover is no DISCONNECT: the closed connection's will is published [MQTT-3.1.2-8].
        m = await watcher.message()
        assert (m.topic, m.payload, m.retain) == (f"{wills}/same", b"first gone", False)
        await second.ping()
        # And back the other way: the newest CONNECT wins wherever it is.
        third = await _connect(places, 0, same)
        assert await second.closed() == b""
        m = await watcher.message()
        assert (m.topic, m.payload) == (f"{wills}/same", b"second gone")
        await third.ping()
        await watcher.ping()  # no other will
        await third.disconnect()
        await watcher.disconnect()

    asyncio.run(main())


def test_two_connects_of_one_client_id_at_once_on_both_leave_exactly_one(places: Open, space: str) -> None:
    """Two CONNECTs of one id made at the same moment, one on each: whichever is newer stays, the other is
    closed (before or after its CONNACK), never both, never neither."""

    async def attempt(where: int) -> MqttClient | None:
        cl = await places(where)
        try:
            ack = await cl.handshake(f"{space}-racer")
        except AssertionError:  # closed before its CONNACK: a newer CONNECT came first
            cl.writer.close()
            return None
        assert ack.code == 0
        return cl

    async def main() -> None:
        for _ in range(5):
            alive = [cl for cl in await asyncio.gather(attempt(0), attempt(1)) if cl is not None]
            assert alive, "both were closed"
            if len(alive) == 2:  # both accepted: the older is closed once it hears of the newer
                closing = {asyncio.ensure_future(cl.closed()): cl for cl in alive}
                done, pending = await asyncio.wait(closing, return_when=asyncio.FIRST_COMPLETED, timeout=10)
                assert len(done) == 1, f"{len(done)} of the two connections were closed"
                waiting = pending.pop()
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
                alive = [closing[waiting]]
            await alive[0].ping()  # the survivor is served
            await alive[0].disconnect()

    asyncio.run(main())
