"""Who may do what with a durable consumer, held to one rule in every dialect that serves consumers
(docs/consumers.md "Permissions"; the rule is ``Access.check_consumer``, applied by the consumer service).

One parametrized matrix: every operation, by every kind of caller, in every dialect, on a consumer made by
its owner in either dialect. The callers, with ``auth.mode = token``:

| caller | grants |
|---|---|
| owner | made the consumer; reads ``/m/**`` |
| reader | another user who reads ``/m/**`` (all the consumer journals) |
| outsider | another user who may publish on ``/m/**`` but reads only ``/other/**`` |
| admin | admin |

Using a consumer (creating it, creating one that exists, opening it, and so acking and nacking) takes read
over all it journals; deleting it (``consumer_delete``; qrpc ``deleteSubscription``, ``closeSubscription``
and ``openSubscription`` with ``delete``) takes that and being its owner. Admin may do all of it. A refusal
is each dialect's own: native 4102 (an ack or nack of a consumer not held: 4207), qrpc ``EPERM`` (``EBATCH``).

After each cell an admin reads what the consumer still holds up to a sentinel event, so a refused (or
merely opening) caller is shown to have cost the owner nothing: every position and payload, in order. The
dialects are native (TCP, JSON) and qpubs over qrpc; qpubs HTTP has no durable subscriptions (only live
``listen``/``once``), and no dialect lists consumers, so neither is a column or a row here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from .consumer_wire import Wire, text
from .qrpcclient import CallError, QrpcClient
from .serverproc import ServerProcess

WAIT = 10.0
TOKENS = {
    "tok-owner": {"user": "owner", "publish": ["/m/**"], "subscribe": ["/m/**"]},
    "tok-reader": {"user": "reader", "publish": [], "subscribe": ["/m/**"]},
    "tok-outsider": {"user": "outsider", "publish": ["/m/**"], "subscribe": ["/other/**"]},
    "tok-admin": {"user": "admin", "admin": True},
    # Tokens without a user: two callers, and an admin (whose consumers have no owner).
    "tok-nobody1": {"publish": ["/m/**"], "subscribe": ["/m/**"]},
    "tok-nobody2": {"publish": [], "subscribe": ["/m/**"]},
    "tok-rootless": {"admin": True},
}
CALLERS = ("owner", "reader", "outsider", "admin")
DIALECTS = ("native", "qrpc")

#: op -> the callers allowed it. ``create``: a new consumer over the owner's channels; ``recreate``: create
#: with the owner's consumer's name (answered with its definition); ``open``: open it and close again
#: without settling; ``ack``/``nack``: open it and settle the batch; the rest delete it.
ALLOWED = {
    "create": {"owner", "reader", "admin"},
    "recreate": {"owner", "reader", "admin"},
    "open": {"owner", "reader", "admin"},
    "ack": {"owner", "reader", "admin"},
    "nack": {"owner", "reader", "admin"},
    "delete": {"owner", "admin"},
    "close_delete": {"owner", "admin"},
    "open_delete": {"owner", "admin"},
}
#: Operations a dialect has no form of (native's ``unconsume`` never deletes).
UNSUPPORTED = {"native": {"close_delete", "open_delete"}, "qrpc": set()}

_cells = itertools.count(1)


@dataclass(frozen=True)
class Refused:
    """A dialect's error answer: native's code, or qrpc's ``code``."""

    code: str


Batch = tuple[int, list[tuple[int, str]]]  # (batch number, [(pos, payload)])


class Caller(Protocol):
    """One connection of a dialect, authenticated as one caller."""

    forbidden: str
    not_held: str

    async def create(self, name: str, sub: str) -> Refused | None: ...
    async def open(self, name: str) -> Refused | Batch: ...
    async def settle(self, name: str, batch: int, nack: bool) -> Refused | None: ...
    async def delete(self, name: str, how: str) -> Refused | bool: ...
    async def release(self, name: str) -> None: ...
    async def reauth(self, token: str) -> None: ...
    async def closed_by_server(self, name: str) -> None: ...
    async def close(self) -> None: ...


class NativeCaller:
    forbidden, not_held = "4102", "4207"

    def __init__(self, wire: Wire) -> None:
        self.w = wire

    @classmethod
    async def connect(cls, srv: ServerProcess, token: str) -> NativeCaller:
        return cls(await Wire.open(srv.ports, "tcp", "json", token))

    async def _op(self, **fields: Any) -> Refused | dict[str, Any]:
        r = await self.w.request(fields)
        return Refused(str(r["code"])) if r["op"] == "error" else r

    async def create(self, name: str, sub: str) -> Refused | None:
        r = await self._op(op="consumer_create", consumer=name, pattern=f"/m/{sub}/**")
        return r if isinstance(r, Refused) else None

    async def open(self, name: str) -> Refused | Batch:
        r = await self._op(op="consume", consumer=name, create=False)
        if isinstance(r, Refused):
            return r
        d = await self.w.push()
        return d["batch"], [(it["pos"], text(it)) for it in d["items"]]

    async def settle(self, name: str, batch: int, nack: bool) -> Refused | None:
        r = await self._op(op="nack" if nack else "ack", consumer=name, batch=batch)
        return r if isinstance(r, Refused) else None

    async def delete(self, name: str, how: str) -> Refused | bool:
        assert how == "delete"
        r = await self._op(op="consumer_delete", consumer=name)
        return r if isinstance(r, Refused) else bool(r["deleted"])

    async def release(self, name: str) -> None:
        await self._op(op="unconsume", consumer=name)

    async def reauth(self, token: str) -> None:
        assert (await self.w.request({"op": "auth", "token": token}))["op"] == "reply"

    async def closed_by_server(self, name: str) -> None:
        d = await self.w.push("consumer_closed")
        assert (d["consumer"], d["reason"]) == (name, "forbidden")

    async def close(self) -> None:
        await self.w.close()


class QrpcCaller:
    forbidden, not_held = "EPERM", "EBATCH"

    def __init__(self, q: QrpcClient) -> None:
        self.q = q
        self.opened = ""  # the last openSubscription call

    @classmethod
    async def connect(cls, srv: ServerProcess, token: str) -> QrpcCaller:
        q = await QrpcClient.connect(srv.ports["qrpc"])
        assert (await q.call("auth", {"token": token}))["ok"] is True
        return cls(q)

    async def _call(self, name: str, m: dict[str, Any]) -> Refused | Any:
        try:
            return await self.q.call(name, m)
        except CallError as e:
            return Refused(e.code)

    async def create(self, name: str, sub: str) -> Refused | None:
        r = await self._call("createSubscription", {"subId": name, "topic": f"m.{sub}.*"})
        return r if isinstance(r, Refused) else None

    async def open(self, name: str) -> Refused | Batch:
        self.opened = self.q.send("openSubscription", {"subId": name, "create": False})
        msg = await self.q.next(self.opened)
        if msg.get("e"):
            return Refused(msg["e"]["code"])
        m = msg["m"]
        return m["batch"], [(it["pos"], it["value"]) for it in m["items"]]

    async def settle(self, name: str, batch: int, nack: bool) -> Refused | None:
        r = await self._call("ack", {"subId": name, "batch": batch, **({"error": "no"} if nack else {})})
        return r if isinstance(r, Refused) else None

    async def delete(self, name: str, how: str) -> Refused | bool:
        if how == "close_delete":  # its answer has no "deleted"
            r = await self._call("closeSubscription", {"subId": name, "delete": True})
            return r if isinstance(r, Refused) else True
        call = "deleteSubscription" if how == "delete" else "openSubscription"
        r = await self._call(call, {"subId": name, **({"delete": True} if how == "open_delete" else {})})
        return r if isinstance(r, Refused) else bool(r["deleted"])

    async def release(self, name: str) -> None:
        await self._call("closeSubscription", {"subId": name})

    async def reauth(self, token: str) -> None:
        assert (await self.q.call("auth", {"token": token}))["ok"] is True

    async def closed_by_server(self, name: str) -> None:
        assert await self.q.next(self.opened) == {"v": 1, "id": self.opened, "s": "end"}

    async def close(self) -> None:
        await self.q.close()


CONNECT: dict[str, Callable[[ServerProcess, str], Awaitable[Caller]]] = {
    "native": NativeCaller.connect,
    "qrpc": QrpcCaller.connect,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("perm") / "data"
    srv = ServerProcess(data, extra=["--auth-mode", "token", "--auth-tokens", json.dumps(TOKENS)]).start()
    try:
        yield srv
    finally:
        srv.kill()


async def publish(admin: Wire, channel: str, *payloads: str) -> None:
    for p in payloads:
        r = await admin.request({"op": "publish", "channel": channel, "text": p, "ack": True})
        assert r["op"] == "reply", r


async def holds(admin: Wire, name: str, channel: str) -> list[tuple[int, str]] | None:
    """What the consumer ``name`` holds, (pos, payload) in delivery order up to a sentinel published now
    (acknowledged as read); ``None`` when it does not exist."""
    await publish(admin, channel, "end")
    r = await admin.request({"op": "consume", "consumer": name, "create": False})
    if r["op"] == "error":
        assert r["code"] == 4204, r
        return None
    got: list[tuple[int, str]] = []
    while True:
        d = await admin.push()
        items = [(it["pos"], text(it)) for it in d["items"]]
        assert (await admin.request({"op": "ack", "consumer": name, "batch": d["batch"]}))["op"] == "reply"
        for pos, payload in items:
            if payload == "end":
                assert (await admin.request({"op": "unconsume", "consumer": name}))["op"] == "reply"
                return got
            got.append((pos, payload))


CASES = [
    pytest.param(op, caller, dialect, creator, id=f"{op}-{caller}-{dialect}-made_by_{creator}")
    for op in ALLOWED
    for caller in CALLERS
    for dialect in DIALECTS
    for creator in DIALECTS
    if op not in UNSUPPORTED[dialect]
]


@pytest.mark.parametrize(("op", "caller", "dialect", "creator"), CASES)
def test_consumer_permission_matrix(
    server: ServerProcess, op: str, caller: str, dialect: str, creator: str
) -> None:
    allowed = caller in ALLOWED[op]

    async def body() -> None:
        sub = f"k{next(_cells)}"
        name, channel = sub, f"/m/{sub}/x"
        admin = await Wire.open(server.ports, "tcp", "json", "tok-admin")
        owner = await CONNECT[creator](server, "tok-owner")
        assert await owner.create(name, sub) is None
        await owner.close()
        await publish(admin, channel, "1", "2", "3")
        three = [(1, "1"), (2, "2"), (3, "3")]
        actor = await CONNECT[dialect](server, f"tok-{caller}")
        expect: list[tuple[int, str]] | None = three  # what the owner's consumer holds afterwards
        if op in ("create", "recreate"):
            made = name + "-new" if op == "create" else name
            created = await actor.create(made, sub)
            assert created is None if allowed else created == Refused(actor.forbidden)
            if op == "create":
                assert (await holds(admin, made, channel) is not None) is allowed
        elif op in ("open", "ack", "nack"):
            opened = await actor.open(name)
            if allowed:
                assert not isinstance(opened, Refused), opened
                batch, items = opened
                assert items == three
                if op != "open":
                    assert await actor.settle(name, batch, nack=op == "nack") is None
                    expect = [] if op == "ack" else three
                await actor.release(name)
            else:
                assert opened == Refused(actor.forbidden)
                # Not holding it, no batch number settles anything (the owner's first batch is 1).
                assert await actor.settle(name, 1, nack=op == "nack") == Refused(actor.not_held)
        else:
            deleted = await actor.delete(name, op)
            if allowed:
                assert deleted is True
                expect = None
            else:
                assert deleted == Refused(actor.forbidden)
        await actor.close()
        assert await holds(admin, name, channel) == expect
        await admin.close()

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_opener_goes_when_its_connection_logs_in_as_someone_who_may_not_use_it(
    server: ServerProcess, dialect: str
) -> None:
    """A connection that authenticates again keeps its openers only while the new identity may use their
    consumers: the opener is closed (native ``consumer_closed`` ``forbidden``; qrpc: the call ends), its
    batch is pending again, and the connection can no longer settle it."""

    async def body() -> None:
        sub = f"k{next(_cells)}"
        channel = f"/m/{sub}/x"
        admin = await Wire.open(server.ports, "tcp", "json", "tok-admin")
        owner = await CONNECT[dialect](server, "tok-owner")
        assert await owner.create(sub, sub) is None
        await publish(admin, channel, "1", "2", "3")
        r = await owner.open(sub)
        assert not isinstance(r, Refused) and r[1] == [(1, "1"), (2, "2"), (3, "3")], r
        await owner.reauth("tok-outsider")
        await owner.closed_by_server(sub)
        assert await owner.settle(sub, r[0], nack=False) == Refused(owner.not_held)
        await owner.close()
        assert await holds(admin, sub, channel) == [(1, "1"), (2, "2"), (3, "3")]
        await admin.close()

    asyncio.run(asyncio.wait_for(body(), 60))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tokens_without_a_user_never_own_consumers(server: ServerProcess, dialect: str) -> None:
    """Every token without a user has the same (empty) user, so an owner recorded from it would make any
    such token the owner of every such consumer: one could delete another's. With auth on, such a token
    may not create a consumer; a consumer without an owner (an admin without a user made it) is deleted by
    admins only, while any caller who reads all it journals may still open it."""

    async def body() -> None:
        sub = f"k{next(_cells)}"
        name, channel = sub, f"/m/{sub}/x"
        admin = await Wire.open(server.ports, "tcp", "json", "tok-admin")
        nobody1 = await CONNECT[dialect](server, "tok-nobody1")
        assert await nobody1.create(name + "-mine", sub) == Refused(nobody1.forbidden)
        assert await holds(admin, name + "-mine", channel) is None  # nothing was created
        rootless = await CONNECT[dialect](server, "tok-rootless")
        assert await rootless.create(name, sub) is None
        await rootless.close()
        await publish(admin, channel, "1", "2")
        nobody2 = await CONNECT[dialect](server, "tok-nobody2")
        reader = await CONNECT[dialect](server, "tok-reader")
        for caller in (nobody1, nobody2, reader):
            assert await caller.delete(name, "delete") == Refused(caller.forbidden)
        r = await nobody2.open(name)  # using it is reading, which it may
        assert not isinstance(r, Refused) and r[1] == [(1, "1"), (2, "2")], r
        await nobody2.release(name)
        assert await holds(admin, name, channel) == [(1, "1"), (2, "2")]
        admin_caller = await CONNECT[dialect](server, "tok-admin")
        assert await admin_caller.delete(name, "delete") is True
        for c in (nobody1, nobody2, reader, admin_caller):
            await c.close()
        await admin.close()

    asyncio.run(asyncio.wait_for(body(), 60))
