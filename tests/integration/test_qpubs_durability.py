"""Durable qpubs subscriptions against real ``hubbub serve`` processes over qrpc (protocols/qpubs.md §6):
acknowledged items survive a ``kill -9`` as acknowledged, unacknowledged ones come back; a work queue of
three members under load hands each event to exactly one of them, and a member that dies holding a batch
has that batch redelivered to another."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from .qrpcclient import QrpcClient
from .serverproc import ServerProcess

N = 40


async def _emit_all(q: QrpcClient, topic: str, values: range) -> None:
    """Emit every value, pipelined, and wait for every result (each committed)."""
    ids = [q.send("emit", {"topic": topic, "value": v}) for v in values]
    for cid in ids:
        msg = await q.next(cid)
        assert msg.get("e") is None and msg["m"]["ok"] is True, msg


def test_crash_redelivers_every_unacked_item_and_no_acked_one(tmp_path: Path) -> None:
    """Batches of one item (``qpubs.batch_bytes`` 1): the first N/2 are acknowledged, the next one is held
    unacknowledged when the server is killed -9. After the restart, opening the subscription again gives
    every unacknowledged item (positions N/2+1 … N), and never an acknowledged one."""
    data = tmp_path / "data"
    extra = ["--qpubs-batch-bytes", "1"]
    srv = ServerProcess(data, extra).start()
    acked: set[int] = set()
    try:

        async def before() -> None:
            q = await QrpcClient.connect(srv.ports["qrpc"])
            created = await q.call("createSubscription", {"subId": "crash", "topic": "c.*"})
            assert created["created"] is True
            await _emit_all(q, "c.x", range(1, N + 1))
            oid = q.send("openSubscription", {"subId": "crash"})
            for _ in range(N // 2):
                m = (await q.next(oid))["m"]
                assert len(m["items"]) == 1
                assert await q.call("ack", {"subId": "crash", "batch": m["batch"]}) == {"ok": True}
                acked.add(m["items"][0]["pos"])
            held = (await q.next(oid))["m"]  # out, not acknowledged, when the server dies
            assert held["items"][0]["pos"] not in acked
            srv.kill()
            await asyncio.wait_for(q.eof.wait(), 10)
            await q.close()

        asyncio.run(before())
        assert acked == set(range(1, N // 2 + 1))
        srv = ServerProcess(data, extra).start()

        async def after() -> list[dict[str, Any]]:
            q = await QrpcClient.connect(srv.ports["qrpc"])
            oid = q.send("openSubscription", {"subId": "crash", "create": False})
            got: list[dict[str, Any]] = []
            while len(got) < N - N // 2:
                m = (await q.next(oid))["m"]
                got += m["items"]
                assert await q.call("ack", {"subId": "crash", "batch": m["batch"]}) == {"ok": True}
            # Nothing more: a barrier answered, and no batch line before it.
            assert await q.call("ignore", {"topic": "__barrier__"}) == {"ok": True, "removed": 0}
            assert q.lines[oid].empty()
            await q.close()
            return got

        got = asyncio.run(after())
        assert sorted(it["pos"] for it in got) == list(range(N // 2 + 1, N + 1))
        assert sorted(it["value"] for it in got) == list(range(N // 2 + 1, N + 1))
        assert srv.terminate() == 0
    finally:
        srv.kill()


def test_work_queue_of_three_under_load_and_a_member_that_dies_mid_batch(tmp_path: Path) -> None:
    """Three members share ``jobs``; a producer emits 600 events while they work. Member C takes one batch,
    acknowledges it, takes another and dies without acknowledging. Every event is acknowledged exactly
    once, by one member; A and B never see the same event; C's abandoned batch goes to A or B."""
    total = 600
    srv = ServerProcess(tmp_path / "data", ["--qpubs-batch-bytes", "40"]).start()
    try:

        async def main() -> None:
            port = srv.ports["qrpc"]
            prod = await QrpcClient.connect(port)
            members = {name: await QrpcClient.connect(port) for name in "ABC"}
            calls: dict[str, str] = {}
            for name, q in members.items():
                calls[name] = q.send("openSubscription", {"subId": "jobs", "topic": "jobs.*", "shared": True})
                assert await q.call("ignore", {"topic": "__barrier__"}) == {"ok": True, "removed": 0}
            received: dict[str, list[int]] = {n: [] for n in "ABC"}
            acked: dict[str, list[int]] = {n: [] for n in "ABC"}
            abandoned: list[int] = []
            done = asyncio.Event()

            async def work(name: str) -> None:
                q, cid = members[name], calls[name]
                batches = 0
                while not done.is_set():
                    try:
                        m = (await q.next(cid, 0.5))["m"]
                    except TimeoutError:
                        continue
                    values = [it["value"] for it in m["items"]]
                    received[name] += values
                    batches += 1
                    if name == "C" and batches == 2:
                        abandoned.extend(values)
                        q.abort()  # dies holding the batch
                        return
                    assert await q.call("ack", {"subId": "jobs", "batch": m["batch"]}) == {"ok": True}
                    acked[name] += values
                    if sum(map(len, acked.values())) >= total:
                        done.set()

            workers = [asyncio.ensure_future(work(n)) for n in "ABC"]
            await _emit_all(prod, "jobs.j", range(total))
            await asyncio.wait_for(done.wait(), 60)
            await asyncio.gather(*workers)
            every = acked["A"] + acked["B"] + acked["C"]
            assert sorted(every) == list(range(total))  # each acknowledged exactly once
            assert not set(received["A"]) & set(received["B"])
            assert abandoned and set(abandoned) <= set(acked["A"]) | set(acked["B"])
            assert acked["C"] and not set(acked["C"]) & (set(received["A"]) | set(received["B"]))
            for q in (prod, members["A"], members["B"]):
                await q.close()

        asyncio.run(main())
        assert srv.terminate() == 0
    finally:
        srv.kill()
