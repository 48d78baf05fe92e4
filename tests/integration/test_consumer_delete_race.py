"""A consumer delete is checked on the loop and applied on the log writer thread; what lies between must not
let it delete a consumer the check was not made against (docs/consumers.md "Permissions"). In every dialect
that deletes consumers: native (``consumer_delete``) and qpubs over qrpc (``deleteSubscription``).

The writer is held on a gate so that the interleaving is certain, not hoped for: alice's delete of her
consumer is checked while an admin's delete of it and bob's creation of a consumer of the same name wait
on the writer, ahead of alice's. Tests wait on the writer's queue and on replies, never on time passing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hubbub.log.consumers import ConsumerSpec
from hubbub.server import Server
from hubbub.server_config import load_config

from .consumer_wire import WAIT, Wire
from .qrpcclient import QrpcClient

TOKENS = {
    "tok-root": {"user": "root", "admin": True},
    "tok-alice": {"user": "alice", "publish": ["/m/**"], "subscribe": ["/m/**"]},
    "tok-bob": {"user": "bob", "publish": ["/m/**"], "subscribe": ["/m/**"]},
}


class NativeAlice:
    """alice over native TCP: she made the consumer; ``answer`` is her delete's (deleted, or the code)."""

    def __init__(self, w: Wire) -> None:
        self.w = w

    @classmethod
    async def make(cls, srv: Server, name: str) -> NativeAlice:
        w = await Wire.open(srv.ports, "tcp", "json", "tok-alice")
        r = await w.request({"op": "consumer_create", "consumer": name, "pattern": "/m/**"})
        assert r["op"] == "reply" and r["created"] is True, r
        return cls(w)

    async def send_delete(self, name: str) -> None:
        await self.w.send({"op": "consumer_delete", "id": 7, "consumer": name})

    async def answer(self) -> Any:
        r = await self.w.recv()
        assert r.get("id") == 7, r
        return r["code"] if r["op"] == "error" else r["deleted"]

    async def close(self) -> None:
        await self.w.close()


class QrpcAlice:
    """alice over qrpc, as :class:`NativeAlice`."""

    def __init__(self, q: QrpcClient) -> None:
        self.q = q
        self.cid = ""

    @classmethod
    async def make(cls, srv: Server, name: str) -> QrpcAlice:
        q = await QrpcClient.connect(srv.ports["qrpc"])
        assert (await q.call("auth", {"token": "tok-alice"}))["ok"] is True
        assert (await q.call("createSubscription", {"subId": name, "topic": "m.*"}))["created"] is True
        return cls(q)

    async def send_delete(self, name: str) -> None:
        self.cid = self.q.send("deleteSubscription", {"subId": name})

    async def answer(self) -> Any:
        msg = await self.q.next(self.cid, WAIT)
        return msg["e"]["code"] if msg.get("e") else msg["m"]["deleted"]

    async def close(self) -> None:
        await self.q.close()


ALICE: dict[str, Callable[[Server, str], Awaitable[NativeAlice | QrpcAlice]]] = {
    "native": NativeAlice.make,
    "qrpc": QrpcAlice.make,
}


@pytest.mark.parametrize("dialect", ALICE)
def test_a_delete_never_removes_the_consumer_created_again_meanwhile(tmp_path: Path, dialect: str) -> None:
    cli: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "qpubs.qrpc_listen": "127.0.0.1:0",
        "auth.mode": "token",
        "auth.tokens": TOKENS,
    }

    async def body() -> None:
        async with Server(load_config(cli=cli, env={})) as srv:
            node = srv.node
            assert node is not None
            svc = node.consumers
            assert svc is not None and node._batcher.writer is not None
            writer = node._batcher.writer
            root, bob = node.authenticate("tok-root", "native"), node.authenticate("tok-bob", "native")
            alice = await ALICE[dialect](srv, "c")
            mine = svc.info("c")
            assert mine is not None and mine.spec.owner == "alice"

            async def queued(n: int) -> None:
                """Until ``n`` submissions wait behind the gate (the writer's own count, polled)."""
                deadline = asyncio.get_running_loop().time() + WAIT
                while writer.statistics()["queued"] < n:
                    assert asyncio.get_running_loop().time() < deadline, f"{n} never queued"
                    await asyncio.sleep(0.002)

            entered, gate = threading.Event(), threading.Event()

            def hold(_: object) -> None:
                entered.set()
                gate.wait(WAIT)

            held = node._batcher.control(hold)
            # Once the writer is inside the gate, what is submitted stays in its queue, in order.
            assert await asyncio.to_thread(entered.wait, WAIT)
            try:
                admin_delete = asyncio.ensure_future(svc.delete("c", identity=root))
                await queued(1)
                bobs = ConsumerSpec("c", "/m/**")
                bob_create = asyncio.ensure_future(svc.create(bobs, identity=bob, dialect="native"))
                await queued(2)
                await alice.send_delete("c")  # checked against hers, which the node still knows
                await queued(3)
            finally:
                gate.set()
            await held
            assert await admin_delete is True
            info, created = await bob_create
            assert created and info.spec.owner == "bob" and info.id != mine.id
            # Hers was gone when her delete was applied, and bob's is not hers to delete.
            assert await alice.answer() is False
            now = svc.info("c")
            assert now is not None and (now.id, now.spec.owner) == (info.id, "bob")
            assert [(i.id, i.spec.owner) for i in await svc.consumers()] == [(info.id, "bob")]
            await alice.close()

    asyncio.run(asyncio.wait_for(body(), 60))
