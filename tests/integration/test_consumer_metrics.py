"""The durable consumers' ``/metrics`` (docs/consumers.md "Monitoring") against a real server process: a
consumer is created, published to, consumed, nacked, acked and dropped by its connection, and every figure
moves as it should; in process: live exclusive groups, and the bound on per-consumer series.

Tests wait on frames and on the figures themselves, never on time passing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from hubbub.core import Batch, ConsumerService, Node, NodeSettings
from hubbub.events import Event, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, RetentionPolicy
from hubbub.log.consumers import ConsumerSpec
from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports.metrics import ConsumerCollector, ConsumerSeries, render_metrics

from .consumer_wire import WAIT, Wire
from .qrpcclient import QrpcClient
from .serverproc import ServerProcess

Samples = dict[tuple[str, str], float]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "data").start()
    try:
        yield srv
    finally:
        srv.kill()


def parse(text: str) -> Samples:
    """``(sample name, consumer label or "")`` -> value."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, s.labels.get("consumer", ""))] = s.value
    return out


async def scrape(port: int, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as r,
    ):
        assert r.status == 200
        return parse(await r.text())


def per(m: Samples, name: str, consumer: str = "jobs") -> float:
    return m[(f"hubbub_consumer_{name}", consumer)]


def test_figures_move_with_publish_consume_nack_ack_and_disconnect(server: ServerProcess) -> None:
    async def body() -> None:
        port = server.ports["http"]
        m = await scrape(port)
        assert m[("hubbub_consumers", "")] == 0 and not any(k[1] for k in m)
        w = await Wire.open(server.ports, "tcp", "json")
        pub = await Wire.open(server.ports, "tcp", "json")
        r = await w.request({"op": "consume", "consumer": "jobs", "pattern": "/jobs/**", "max": 4})
        assert r["op"] == "reply"
        for i in range(10):
            reply = await pub.request({"op": "publish", "channel": "/jobs/a", "ack": True, "text": str(i)})
            assert reply["op"] == "reply"
        d1 = await w.push()
        n1 = len(d1["items"])
        m = await scrape(port)
        assert per(m, "openers") == 1 and per(m, "batches_total") == 1
        assert per(m, "outstanding") == n1 and per(m, "pending") == 10 - n1
        assert per(m, "acked_total") == per(m, "nacked_total") == per(m, "redelivered_total") == 0
        assert 0 < per(m, "oldest_unacked_seconds") < WAIT
        # Nack: the items come back with one more attempt; they count as nacked and as redelivered.
        assert (await w.request({"op": "nack", "consumer": "jobs", "batch": d1["batch"]}))["op"] == "reply"
        d2 = await w.push()
        again = sum(1 for it in d2["items"] if it["attempts"])
        assert again == n1
        m = await scrape(port)
        assert per(m, "nacked_total") == n1 and per(m, "redelivered_total") == again
        assert per(m, "batches_total") == 2 and per(m, "outstanding") == len(d2["items"])
        # Ack: acknowledged items leave the journal; the next batch follows.
        assert (await w.request({"op": "ack", "consumer": "jobs", "batch": d2["batch"]}))["op"] == "reply"
        d3 = await w.push()
        n3 = len(d3["items"])
        m = await scrape(port)
        acked = len(d2["items"])
        assert per(m, "acked_total") == acked and per(m, "batches_total") == 3
        assert per(m, "outstanding") == n3 and per(m, "pending") == 10 - acked - n3
        assert m[("hubbub_consumers", "")] == 1 and m[("hubbub_consumers_acked_total", "")] == acked
        assert m[("hubbub_consumers_pending", "")] == 10 - acked - n3
        assert m[("hubbub_consumers_unlabelled", "")] == 0
        # The connection goes away holding d3: it goes back to pending, and out again as a redelivery.
        await w.close()
        async with asyncio.timeout(WAIT):  # the server's side of the close is seen only in the figures
            while per(m := await scrape(port), "openers") != 0:
                pass
        assert per(m, "outstanding") == 0 and per(m, "pending") == 10 - acked
        w = await Wire.open(server.ports, "tcp", "json")
        assert (await w.request({"op": "consume", "consumer": "jobs", "create": False}))["op"] == "reply"
        d4 = await w.push()
        m = await scrape(port)
        assert per(m, "redelivered_total") == again + sum(1 for it in d4["items"] if it["attempts"]) > again
        assert m[("hubbub_consumers_redelivered_total", "")] == per(m, "redelivered_total")
        assert (await w.request({"op": "consumer_delete", "consumer": "jobs"}))["deleted"] is True
        m = await scrape(port)
        assert m[("hubbub_consumers", "")] == 0 and ("hubbub_consumer_pending", "jobs") not in m
        for x in (w, pub):
            await x.close()

    asyncio.run(asyncio.wait_for(body(), 120))


def test_groups_and_the_bound_on_labelled_consumers(tmp_path: Path) -> None:
    async def main() -> None:
        store = open_store("sqlite", str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node, ConsumerService(node) as svc:
            for name in ("c", "a", "b"):
                await svc.create(ConsumerSpec(name, "/jobs/**"))
            got: list[Event] = []
            members = [svc.join("g", "/jobs/**", got.append) for _ in range(2)]
            for i in range(3):
                await node.publish(AppendRequest("/jobs/x", Publisher("native"), b"%d" % i, "text/plain"))
            await svc.metrics.refresh()
            registry = CollectorRegistry()
            registry.register(ConsumerCollector(node, limit=2))

            def render() -> str:  # auth off: every scraper is shown each consumer
                return render_metrics(registry, ConsumerSeries(node, None, limit=2)).decode()

            m = parse(render())
            assert {k[1] for k in m if k[1]} == {"a", "b"}  # the first two by name
            assert m[("hubbub_consumers", "")] == 3 and m[("hubbub_consumers_unlabelled", "")] == 1
            assert per(m, "pending", "a") == 3 and m[("hubbub_consumers_pending", "")] == 9
            assert per(m, "oldest_unacked_seconds", "a") > 0
            assert m[("hubbub_consumer_groups", "")] == 1 and m[("hubbub_consumer_group_members", "")] == 2
            assert m[("hubbub_consumer_group_events_total", "")] == len(got) == 3
            members[0].leave()
            m = parse(render())
            assert m[("hubbub_consumer_group_members", "")] == 1
            # A nacked batch waiting out its backoff: pending again (or already out again), still the oldest.
            batches: asyncio.Queue[Batch] = asyncio.Queue()
            opener = await svc.open("a", batches.put_nowait, create=False)
            b = await asyncio.wait_for(batches.get(), WAIT)
            await opener.nack(b.number)
            m = parse(render())
            assert per(m, "nacked_total", "a") == len(b.items) and per(m, "batches_total", "a") >= 1
            assert per(m, "pending", "a") + per(m, "outstanding", "a") == 3
            assert per(m, "oldest_unacked_seconds", "a") > 0 and per(m, "openers", "a") == 1
            opener.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_each_consumers_series_only_for_admin(tmp_path: Path) -> None:
    """A consumer's name tells of its channels and users, so with auth on only an admin's scrape has the
    per-consumer series (``consumer`` label); any other token gets the totals, which count every consumer.
    Consumers of every dialect that makes them (native, qpubs over qrpc) alike."""
    tokens = {
        "tok-root": {"user": "root", "admin": True},
        "tok-alice": {"user": "alice", "publish": ["/alice/**"], "subscribe": ["/alice/**"]},
        "tok-bob": {"user": "bob", "publish": [], "subscribe": []},
    }
    cli = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "qpubs.qrpc_listen": "127.0.0.1:0",
        "auth.mode": "token",
        "auth.tokens": tokens,
    }

    async def body() -> None:
        async with Server(load_config(cli=cli, env={})) as srv:
            w = await Wire.open(srv.ports, "tcp", "json", "tok-alice")
            r = await w.request(
                {"op": "consumer_create", "consumer": "alice-payroll", "pattern": "/alice/**"}
            )
            assert r["op"] == "reply", r
            q = await QrpcClient.connect(srv.ports["qrpc"])
            assert (await q.call("auth", {"token": "tok-alice"}))["ok"] is True
            assert (await q.call("createSubscription", {"subId": "alice-hr", "topic": "alice.*"}))["created"]
            port = srv.ports["http"]
            admin = await scrape(port, "tok-root")
            assert {k[1] for k in admin if k[1]} == {"alice-payroll", "alice-hr"}
            assert per(admin, "pending", "alice-hr") == 0 and admin[("hubbub_consumers", "")] == 2
            for token in ("tok-alice", "tok-bob"):  # its owner is no admin either
                m = await scrape(port, token)
                assert not any(k[1] for k in m), token
                assert not any(k[0].startswith("hubbub_consumer_pending") for k in m)
                assert m[("hubbub_consumers", "")] == 2 and m[("hubbub_consumers_unlabelled", "")] == 0
                assert m[("hubbub_consumers_pending", "")] == 0
            await w.close()
            await q.close()

    asyncio.run(asyncio.wait_for(body(), 60))
