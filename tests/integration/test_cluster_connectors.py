"""Push connectors on a real two-node cluster (docs/connectors.md "Clusters"): two ``hubbub serve``
processes on one PostgreSQL and one Redis. A device subscribed through node A's guble ``/fcm/`` REST (and,
once, a webhook made through node A's ``/api/v1/webhooks``) is listed by node B, gets the events published
on both nodes exactly once and in order from whichever node holds its consumer, and when that node is killed
-9 in the middle of a stream the other takes over with nothing lost: at least once, a redelivery being one
contiguous run of ids already sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config
from tests.redisserver import RedisServer

from .fcm_server import LEGACY_KEY, FcmServer
from .serverproc import ServerProcess
from .webhook_receiver import Receiver

pytestmark = pytest.mark.slow

WAIT = 30.0
PHASE1 = 40  # published alternately on both nodes, the subscription served by one
PHASE2 = 40  # published on the survivor; the deliverer killed when half of them went out
PHASE3 = 20  # published on the survivor after the take-over


def _node(tmp: Path, name: str, pg_url: str, redis: RedisServer, extra: list[str]) -> ServerProcess:
    return ServerProcess(
        tmp / name,
        [
            "--store", pg_url, "--broker", redis.url, "--cluster-node-id", name,
            "--cluster-gap-wait-s", "0.05", "--cluster-poll-interval-s", "0.2", *extra,
        ],
    ).start(60.0)  # fmt: skip


async def _call(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request on a connection of its own."""
    data = None if body is None else json.dumps(body).encode()
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"http://127.0.0.1:{port}{path}", data=data) as r,
    ):
        return r.status, json.loads(await r.read())


async def _publish(port: int, channel: str, text: str) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"http://127.0.0.1:{port}/api/v1/publish{channel}", data=text.encode()) as r,
    ):
        assert r.status == 200, await r.text()


async def _states(port: int, connector: str) -> list[str]:
    status, body = await _call(port, "GET", "/api/v1/connectors")
    assert status == 200, body
    (c,) = [c for c in body["connectors"] if c["name"] == connector]
    return [s["state"] for s in c["subscriptions"]]


async def _deliverer(nodes: list[ServerProcess], connector: str) -> int:
    """The index of the node that serves the one subscription (the other waits for its hold)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        states = [await _states(n.ports["http"], connector) for n in nodes]
        serving = [i for i, s in enumerate(states) if s and s[0] in ("idle", "delivering", "retrying")]
        if len(serving) == 1 and all(
            s == ["held_elsewhere"] for i, s in enumerate(states) if i != serving[0]
        ):
            return serving[0]
        assert loop.time() < deadline, states
        await asyncio.sleep(0.05)


def at_least_once(ids: list[int], n: int) -> None:
    """``ids`` is 1..n in order, but for one run of ids already sent, sent again where a node took over."""
    restart = next((i for i in range(1, len(ids)) if ids[i] != ids[i - 1] + 1), len(ids))
    head, tail = ids[:restart], ids[restart:]
    assert head == list(range(1, len(head) + 1)), ids
    if tail:
        assert 1 <= tail[0] <= len(head), ids  # a redelivered suffix of what was sent
        assert tail == list(range(tail[0], tail[0] + len(tail))), ids
    assert (tail or head)[-1] == n, ids


async def _scenario(
    nodes: list[ServerProcess],
    connector: str,
    channel: str,
    sent: Callable[[], list[int]],
    gate: asyncio.Event,
) -> None:
    """Phase 1 on both nodes, exactly once and in order; phase 2 on the survivor with the deliverer killed
    -9 mid-stream (``gate`` closed makes the target refuse until the kill); phase 3 after the take-over."""
    ports = [n.ports["http"] for n in nodes]
    for i in range(1, PHASE1 + 1):
        await _publish(ports[i % 2], channel, str(i))
    await _wait(lambda: len(sent()) >= PHASE1)
    assert sent() == list(range(1, PHASE1 + 1))  # exactly once, in order, from one node
    dead = await _deliverer(nodes, connector)
    alive = 1 - dead
    gate.clear()  # from the 20th of phase 2 on, the target refuses until the deliverer is dead
    for i in range(PHASE1 + 1, PHASE1 + PHASE2 + 1):
        await _publish(ports[alive], channel, str(i))
    await _wait(lambda: len(sent()) >= PHASE1 + PHASE2 // 2)
    nodes[dead].kill()
    gate.set()
    for i in range(PHASE1 + PHASE2 + 1, PHASE1 + PHASE2 + PHASE3 + 1):
        await _publish(ports[alive], channel, str(i))
    n = PHASE1 + PHASE2 + PHASE3
    await _wait(lambda: bool(sent()) and sent()[-1] == n)
    at_least_once(sent(), n)
    assert await _states(ports[alive], connector) in (["idle"], ["delivering"])


async def _wait(check: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_fcm_device_subscribed_on_one_node_is_served_by_the_cluster(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    async def body() -> None:
        gate = asyncio.Event()
        gate.set()
        half = PHASE1 + PHASE2 // 2

        def answer(token: str) -> tuple[int, dict[str, Any], dict[str, str]]:
            if not gate.is_set() and len(fcm.delivered) >= half:
                return 503, {}, {}
            return 200, {}, {}

        fcm = await FcmServer(answer=answer).start()
        extra = ["--fcm", "--fcm-api-key", LEGACY_KEY, "--fcm-endpoint", f"{fcm.base}/fcm/send"]
        nodes = [_node(tmp_path, n, pg_url, redis_server, extra) for n in ("a", "b")]
        try:
            a, b = (n.ports["http"] for n in nodes)
            assert await _call(a, "POST", "/fcm/dev-1/user-1/t") == (200, {"subscribed": "/t"})
            assert await _call(b, "GET", "/fcm/") == (200, ["t"])  # node B lists it at once
            assert await _call(b, "POST", "/fcm/dev-1/user-1/t") == (
                200,
                {"error": "subscription already exists"},
            )

            def sent() -> list[int]:
                assert {d for d, _ in fcm.delivered} <= {"dev-1"}
                return [int(m["data"]["message"]) for _, m in fcm.delivered]

            await _scenario(nodes, "fcm", "/t/x", sent, gate)
        finally:
            for n in nodes:
                n.kill()
            await fcm.stop()

    asyncio.run(body())


def test_webhook_made_on_one_node_is_served_by_the_cluster(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    async def body() -> None:
        gate = asyncio.Event()
        gate.set()
        half = PHASE1 + PHASE2 // 2

        def answer(body: dict[str, Any]) -> tuple[int, dict[str, str]]:
            if not gate.is_set() and len(rcv.accepted) >= half:
                return 503, {}
            return 200, {}

        rcv = await Receiver("s3cret", answer=answer).start()
        nodes = [_node(tmp_path, n, pg_url, redis_server, []) for n in ("a", "b")]
        try:
            a, b = (n.ports["http"] for n in nodes)
            hook = {"url": rcv.url, "pattern": "/orders/**", "secret": "s3cret"}
            assert await _call(a, "PUT", "/api/v1/webhooks/orders", hook) == (
                201,
                {"name": "orders", "created": True},
            )
            status, listed = await _call(b, "GET", "/api/v1/webhooks")
            assert status == 200 and [(h["name"], h["source"]) for h in listed["webhooks"]] == [
                ("orders", "api")
            ]

            def sent() -> list[int]:
                return [int(b["payload"]) for b in rcv.accepted]

            await _scenario(nodes, "webhook", "/orders/x", sent, gate)
        finally:
            for n in nodes:
                n.kill()
            await rcv.stop()

    asyncio.run(body())


def test_a_node_without_a_hook_in_its_file_keeps_another_nodes_backlog(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    """Node A's file defines hook ``orders``, whose receiver refuses while A's events wait; node B starts on
    the same log with a file without it (an older one, or another node's): B keeps A's consumer, and when
    the receiver comes back A delivers every event, in order."""

    async def body() -> None:
        rcv = await Receiver("s3cret", answer=lambda b: (503, {})).start()

        def cli(name: str, hooks: dict[str, Any]) -> dict[str, Any]:
            return {
                "data_dir": str(tmp_path / name),
                "store": pg_url,
                "broker": redis_server.url,
                "cluster.node_id": name,
                "cluster.poll_interval_s": "0.2",
                "http.listen": "127.0.0.1:0",
                "native.tcp_listen": "127.0.0.1:0",
                "webhooks.hooks": json.dumps(hooks),
                "webhooks.retry_base_s": "0.02",
                "webhooks.retry_max_s": "0.1",
            }

        hook = {"url": rcv.url, "pattern": "/orders/**", "secret": "s3cret"}
        try:
            async with Server(load_config(cli=cli("a", {"orders": hook}), env={})) as a:
                port = a.ports["http"]
                for i in range(1, 11):
                    await _publish(port, "/orders/x", str(i))
                await rcv.wait(lambda: len(rcv.requests) >= 2)  # refused, retried: 10 events wait
                async with Server(load_config(cli=cli("b", {}), env={})) as b:
                    status, listed = await _call(b.ports["http"], "GET", "/api/v1/admin/consumers")
                    assert status == 200, listed
                    kept = [c for c in listed["consumers"] if c["name"] == "webhook.orders"]
                    assert kept and kept[0]["backlog"] + kept[0]["in_flight"] == 10, listed
                    rcv.answer = lambda b: (200, {})
                    await rcv.wait(lambda: len(rcv.accepted) >= 10)
                    assert [int(x["payload"]) for x in rcv.accepted] == list(range(1, 11))
        finally:
            await rcv.stop()

    asyncio.run(asyncio.wait_for(body(), 60))
