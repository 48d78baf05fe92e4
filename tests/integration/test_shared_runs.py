"""Fan-out runs shared between connections (``FanOut.fan_out_run``), dialect by dialect, over real sockets
against a real server: several connections of one dialect subscribed to one channel get a burst committed in
runs of many events, so the run encoding and the sharing of one encoded run between connections with the
same encoder key and subscription ids are used. Each connection must get every event of the burst exactly
once, in order, with its own bookkeeping: its own subscription ids (several connections use the same ids, one
uses others), the right positions, and its own replay or catch-up state.

Per dialect: two connections with the same subscriptions, one with other (overlapping) subscriptions, one that
reads nothing until the server holds a backlog for it (native and ivy: a queue of events waiting for its
socket; guble: an overflow, which switches it to a catch-up from the log), and, where the dialect replays,
one that subscribes in the middle of the burst with a replay, while a probe commits a run between its
snapshot and its going live (so the run is held, then released after the replay).

Synchronisation is on events only: subscription replies, the server's queue state after each commit (read
on the event loop, between commits), the catch-up hook, and the probe's commit. Commits are submitted to the
node directly (whole runs per commit, as many as the test wants); every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import aiohttp
import msgpack
import pytest

from hubbub.core import Node, Session
from hubbub.events import Publisher
from hubbub.log.base import AppendRequest, AppendResult, EventLog
from hubbub.server import Server
from hubbub.server_config import load_config

P = ParamSpec("P")
T = TypeVar("T")

WAIT = 20.0
#: Server queue bound (events); a connection that reads is never let past half of it (Session.wait_room).
SEND_QUEUE = 512
#: Events per commit: each commit fans out as one run.
ROUND = 32
#: Events of the burst at least; more while a connection that reads nothing has no backlog yet.
N = 400
#: Index of the event after which the late connection asks for a replay (native ``since``, guble start id).
LATE_AFTER = 2 * ROUND
#: Backlog (events queued on the server) at which a native or ivy connection that stopped reading resumes.
BACKLOG = 4 * ROUND
#: Bound on the burst: past it the connection that stopped reading never built a backlog.
MAX_EVENTS = 20_000
#: Payload size: large enough that a connection that stops reading fills its socket buffers soon.
SIZE = 4000
#: Receive buffer of the connections that stop reading (a fixed size turns off the kernel's autotuning).
SLOW_RCVBUF = 32 * 1024
END = b"end"

DIALECTS = ["tcp-json", "tcp-msgpack", "ws-json", "ws-msgpack", "ivy", "guble"]


def payload(i: int) -> bytes:
    return b"%06d" % i + b"x" * (SIZE - 6)


def index_of(body: bytes) -> int:
    return -1 if body == END else int(body[:6])


@contextlib.asynccontextmanager
async def serve(data_dir: Path) -> AsyncIterator[Server]:
    cli = {
        "data_dir": str(data_dir),
        "store": "memory",
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "limits.send_queue": str(SEND_QUEUE),
    }
    async with Server(load_config(cli=cli, env={})) as server:
        yield server


def small_socket(addr_info: Any) -> socket.socket:
    """A client socket with a small fixed receive buffer (aiohttp ``socket_factory``)."""
    family, type_, proto, _, _ = addr_info
    sock = socket.socket(family, type_, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
    return sock


# -- connections ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Conn:
    """One client connection and everything it read (dialect items: native frames as dicts, ivy text
    messages, guble binary messages). Its reader task reads until the END event or the close; a connection
    with a ``gate`` reads its subscription answers, then nothing until the gate opens."""

    role: str
    recv: Callable[[], Awaitable[list[Any] | None]]
    is_ready: Callable[[list[Any]], bool]
    is_end: Callable[[Any], bool]
    close: Callable[[], Awaitable[None]]
    gate: asyncio.Event | None = None
    items: list[Any] = field(default_factory=list)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closed: object = None
    session: Session | None = None
    task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while True:
            got = await self.recv()
            if got is None:
                self.closed = True
                return
            self.items += got
            if not self.ready.is_set() and self.is_ready(self.items):
                self.ready.set()
                if self.gate is not None:
                    await self.gate.wait()
            if got and self.is_end(got[-1]):
                return


class Stack:
    """The client side of one test: HTTP sessions (one with small socket buffers), connections, tasks."""

    def __init__(self, server: Server) -> None:
        assert server.node is not None
        self.node: Node = server.node
        self.addr = f"127.0.0.1:{server.ports['http']}"
        self.tcp = server.ports["native"]
        self.http = aiohttp.ClientSession()
        self.slow_http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(socket_factory=small_socket))
        self.conns: list[Conn] = []

    async def aclose(self) -> None:
        for c in self.conns:
            if c.task is not None:
                c.task.cancel()
                with contextlib.suppress(BaseException):
                    await c.task
            await c.close()
        await self.http.close()
        await self.slow_http.close()

    async def start(self, make: Callable[[], Awaitable[Conn]]) -> Conn:
        """Open a connection, start its reader, wait for its subscriptions to be answered; find its session
        on the server (the one session that is new)."""
        before = set(self.node.sessions)
        conn = await make()
        self.conns.append(conn)
        conn.task = asyncio.ensure_future(conn.run())
        await asyncio.wait_for(conn.ready.wait(), WAIT)
        new = set(self.node.sessions) - before
        assert len(new) == 1, conn.role
        conn.session = new.pop()
        return conn


# native: raw TCP (JSON lines, length-prefixed msgpack) and WebSocket (text JSON, binary msgpack)


async def native_link(
    st: Stack, transport: str, encoding: str, slow: bool
) -> tuple[Callable[[dict[str, Any]], Awaitable[None]], Callable[[], Awaitable[list[Any] | None]], Any]:
    """(send a frame, receive the next message's frames or None at the close, close)."""
    if transport == "tcp":
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if slow:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", st.tcp))
        # A small stream buffer for the one that stops reading: the client does not soak up the backlog.
        reader, writer = await asyncio.open_connection(sock=sock, limit=SIZE * 16 if slow else 1 << 22)

        async def send_tcp(obj: dict[str, Any]) -> None:
            if encoding == "json":
                writer.write(json.dumps(obj).encode() + b"\n")
            else:
                body = msgpack.packb(obj)
                writer.write(struct.pack(">I", len(body)) + body)
            await writer.drain()

        async def recv_tcp() -> list[Any] | None:
            try:
                if encoding == "json":
                    line = await reader.readline()
                    if not line:
                        return None
                    return unbatch(json.loads(line))
                head = await reader.readexactly(4)
                return unbatch(msgpack.unpackb(await reader.readexactly(struct.unpack(">I", head)[0])))
            except (asyncio.IncompleteReadError, ConnectionError):
                return None

        async def close_tcp() -> None:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

        return send_tcp, recv_tcp, close_tcp

    http = st.slow_http if slow else st.http
    ws = await http.ws_connect(
        f"ws://{st.addr}/ws/hubbub", protocols=[f"hubbub.v1.{encoding}"], max_msg_size=1 << 24
    )

    async def send_ws(obj: dict[str, Any]) -> None:
        if encoding == "json":
            await ws.send_str(json.dumps(obj))
        else:
            await ws.send_bytes(msgpack.packb(obj))

    async def recv_ws() -> list[Any] | None:
        msg = await ws.receive()
        if msg.type == aiohttp.WSMsgType.TEXT and encoding == "json":
            return unbatch(json.loads(msg.data))
        if msg.type == aiohttp.WSMsgType.BINARY and encoding == "msgpack":
            return unbatch(msgpack.unpackb(msg.data))
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING), msg
        return None

    return send_ws, recv_ws, ws.close


def unbatch(obj: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = obj["frames"] if obj["op"] == "batch" else [obj]
    return out


def native_body(f: dict[str, Any]) -> bytes:
    body = f.get("payload", f.get("text"))
    return body if isinstance(body, bytes) else str(body).encode()


def native_is_end(f: Any) -> bool:
    return bool(f.get("op") == "event" and native_body(f) == END)


async def open_native(
    st: Stack, dialect: str, role: str, subs: list[dict[str, Any]], batch: bool, gate: asyncio.Event | None
) -> Conn:
    transport, encoding = dialect.split("-")
    send, recv, close = await native_link(st, transport, encoding, gate is not None)
    await send({"op": "hello", "id": 1, "v": 1, "batch": batch})
    for k, sub in enumerate(subs):
        await send({"op": "subscribe", "id": 2 + k, **sub})
    want = 1 + len(subs)

    def ready(items: list[Any]) -> bool:
        errors = [f for f in items if f["op"] == "error"]
        assert not errors, errors
        return sum(1 for f in items if f["op"] == "reply") == want

    return Conn(role, recv, ready, native_is_end, close, gate)


# ivy


async def open_ivy(st: Stack, role: str, paths: list[str], gate: asyncio.Event | None) -> Conn:
    http = st.slow_http if gate is not None else st.http
    ws = await http.ws_connect(f"ws://{st.addr}/ws", protocols=("ivy1",), max_msg_size=1 << 24)
    for p in paths:
        await ws.send_str(f"+{p}")
    await ws.send_str("@")  # answered once the subscriptions before it are in place

    async def recv() -> list[Any] | None:
        msg = await ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            return None
        return [msg.data]

    def ready(items: list[Any]) -> bool:
        return any(m.startswith("##@") for m in items)

    def is_end(m: Any) -> bool:
        return bool(m.endswith(":" + END.decode()) and m.startswith("@"))

    async def close() -> None:
        await ws.close()

    return Conn(role, recv, ready, is_end, close, gate)


# guble


async def open_guble(st: Stack, role: str, commands: list[str], gate: asyncio.Event | None) -> Conn:
    http = st.slow_http if gate is not None else st.http
    ws = await http.ws_connect(f"ws://{st.addr}/stream/user/u", max_msg_size=1 << 24)
    for c in commands:
        await ws.send_str(c)

    async def recv() -> list[Any] | None:
        msg = await ws.receive()
        if msg.type != aiohttp.WSMsgType.BINARY:
            return None
        return [msg.data]

    def ready(items: list[Any]) -> bool:
        return b"#subscribed-to /burst" in items

    def is_end(m: Any) -> bool:
        return bool(m.startswith(b"/burst,") and m.rsplit(b"\n", 1)[-1] == END)

    async def close() -> None:
        await ws.close()

    return Conn(role, recv, ready, is_end, close, gate)


# -- the burst -----------------------------------------------------------------------------------------------


class Burst:
    """Commits to ``/burst`` in runs, pacing on the queues of the connections that read: before each
    commit, each of those sessions is let down to half its queue (``Session.wait_room``), as a publisher's
    back-pressure would, so that only a connection that reads nothing can overflow."""

    def __init__(self, st: Stack) -> None:
        self.node = st.node
        self.st = st
        self.next = 0
        self.results: list[AppendResult] = []

    async def commit(self, payloads: list[bytes]) -> None:
        for c in self.st.conns:
            s = c.session
            if s is not None and (c.gate is None or c.gate.is_set()) and s.queued >= s.max_items // 2:
                await asyncio.wait_for(s.wait_room(), WAIT)
        done = asyncio.Event()
        left = [len(payloads)]

        def one(r: Any) -> None:
            assert isinstance(r, AppendResult), r
            self.results.append(r)
            left[0] -= 1
            if not left[0]:
                done.set()

        for p in payloads:
            await self.node.writable()
            self.node.submit(AppendRequest("/burst", Publisher("native"), p, "text/plain"), None, one)
        await asyncio.wait_for(done.wait(), WAIT)

    async def round(self) -> None:
        await self.commit([payload(i) for i in range(self.next, self.next + ROUND)])
        self.next += ROUND


@dataclass
class Probe:
    """Commits a round between a new subscription's snapshot read and its going live: installed as the node's
    ``read`` (the reader-thread hand-off every snapshot goes through), once armed it fires once, for the first
    read made while a session outside ``known`` has a subscription still holding, right after the real read;
    it records how many events that subscription holds then (held for it, to be released after its replay)."""

    node: Node
    burst: Burst
    known: set[Session] | None = None
    held: int = -1
    fired: bool = False

    def install(self) -> None:
        real = self.node._reads.call

        async def read(fn: Callable[Concatenate[EventLog, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
            result = await real(fn, *args, **kwargs)
            if self.known is not None and not self.fired:
                holding = [
                    s
                    for sess in self.node.sessions
                    if sess not in self.known
                    for s in self.node.subscriptions(sess)
                    if s.holding is not None
                ]
                if holding:
                    self.fired = True
                    await self.burst.round()
                    self.held = sum(len(s.holding or ()) for s in holding)
            return result

        self.node._reads.call = read  # type: ignore[method-assign]  # a test double


# -- the test ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_connections_of_one_dialect_share_runs_and_keep_their_own_bookkeeping(
    dialect: str, tmp_path: Path
) -> None:
    async def main() -> None:
        async with serve(tmp_path / "d") as server:
            st = Stack(server)
            try:
                await scenario(st, dialect)
            finally:
                await st.aclose()

    asyncio.run(main())


async def scenario(st: Stack, dialect: str) -> None:
    node = st.node
    burst = Burst(st)
    probe = Probe(node, burst)
    probe.install()
    slow_gate = asyncio.Event()
    switched = asyncio.Event()
    native = dialect not in ("ivy", "guble")
    epoch = ""

    async def open_role(role: str, gate: asyncio.Event | None = None) -> Conn:
        if native:
            same = [{"sub": "s", "pattern": "/burst"}]
            by_role: dict[str, list[dict[str, Any]]] = {
                "same": same,
                "other": [{"sub": "t", "pattern": "/**"}, {"sub": "s", "pattern": "/burst"}],
                "slow": same,
                "late": [{"sub": "s", "pattern": "/burst", "since": {"seq": LATE_AFTER, "epoch": epoch}}],
            }
            subs = by_role[role]
            # Batching and plain connections side by side (a batching one packs the shared run); the one
            # that stops reading gets single frames, so that its small stream buffer takes each one.
            batch = role != "slow" and len(st.conns) != 0
            return await open_native(st, dialect, role, subs, batch, gate)
        if dialect == "ivy":
            paths = {"same": ["/burst"], "other": ["/", "/burst"], "slow": ["/burst"]}[role]
            return await open_ivy(st, role, paths, gate)
        cmds = {
            "same": ["+ /burst"],
            "other": ["+ /", "+ /burst"],  # both match; its /burst receiver is g2, the others' g1
            "slow": ["+ /burst"],
            "late": [f"+ /burst {LATE_AFTER + 1}"],  # fetch from id LATE_AFTER + 1, then live
        }[role]
        return await open_guble(st, role, cmds, gate)

    fast = [await st.start(functools.partial(open_role, r)) for r in ("same", "same", "other")]
    slow = await st.start(lambda: open_role("slow", slow_gate))
    assert slow.session is not None
    if dialect == "guble":
        handler = slow.session.on_catch_up
        assert handler is not None

        def observed() -> None:
            switched.set()
            slow_gate.set()  # it reads again once its catch-up has begun
            handler()

        slow.session.on_catch_up = observed

    # The first runs, then (where the dialect replays) a connection that asks for a replay from the middle of
    # them; the probe commits a round while its snapshot is being read.
    while burst.next < LATE_AFTER + ROUND:
        await burst.round()
    epoch = burst.results[0].event.epoch
    late: Conn | None = None
    if dialect != "ivy":  # ivy has no replay
        probe.known = set(node.sessions)
        late = await st.start(lambda: open_role("late"))
        assert probe.fired and probe.held > 0, "no commit was held during the late replay"

    # The burst goes on until the connection that reads nothing has a backlog on the server (or, for
    # guble, has overflowed into a catch-up); then it reads.
    while burst.next < N or not slow_gate.is_set():
        await burst.round()
        if dialect != "guble" and slow.session.queued >= BACKLOG:
            slow_gate.set()
        assert burst.next < MAX_EVENTS, "the connection that stopped reading never had a backlog"
    await burst.commit([END])
    total = burst.next
    conns = [*fast, slow] + ([late] if late is not None else [])
    await asyncio.wait_for(asyncio.gather(*(c.task for c in conns if c.task is not None)), WAIT)
    for c in conns:
        assert c.closed is None and c.session is not None and not c.session.kicked, (c.role, c.closed)
    if dialect == "guble":
        assert switched.is_set()

    if native:
        check_native(conns, total, epoch)
    elif dialect == "ivy":
        check_ivy(conns, total)
    else:
        check_guble(conns, total)


def check_native(conns: list[Conn], total: int, epoch: str) -> None:
    for c in conns:
        events = [f for f in c.items if f["op"] == "event"]
        first = LATE_AFTER if c.role == "late" else 0
        got = [index_of(native_body(f)) for f in events]
        assert got == [*range(first, total), -1], f"{c.role}: {len(got)} events, {len(set(got))} distinct"
        # Positions: the seq of each event is its place in the burst, in the one epoch.
        assert [f["seq"] for f in events] == list(range(first + 1, total + 2)), c.role
        assert {f["epoch"] for f in events} == {epoch}, c.role
        # Sub ids: the connection's own matching subscriptions, whoever shares its frames.
        want = ["s", "t"] if c.role == "other" else ["s"]
        assert all(sorted(f["subs"]) == want for f in events), (c.role, {tuple(f["subs"]) for f in events})
        replayed = [bool(f.get("replay")) for f in events]
        if c.role == "late":
            # The replay, then live: the run committed during the snapshot read came live, after the replay.
            n = replayed.count(True)
            assert n and replayed == [True] * n + [False] * (len(events) - n)
            rec = [f for f in c.items if f["op"] == "recovered"]
            assert len(rec) == 1 and rec[0]["replayed"] == n, rec
            assert c.items.index(rec[0]) == c.items.index(events[n - 1]) + 1
        else:
            assert not any(replayed), c.role


def check_ivy(conns: list[Conn], total: int) -> None:
    stamps: dict[int, str] = {}
    for c in conns:
        events = [m for m in c.items if m.startswith("@") and ":/burst:" in m]
        got = []
        for m in events:
            ts, path, data = m[1:].split(":", 2)
            assert path == "/burst", m
            i = index_of(data.encode())
            got.append(i)
            # Every connection shows an event with the same commit time, whoever encoded it.
            assert stamps.setdefault(i, ts) == ts, (c.role, i)
        assert got == [*range(total), -1], f"{c.role}: {len(got)} events, {len(set(got))} distinct"


def check_guble(conns: list[Conn], total: int) -> None:
    for c in conns:
        msgs = [m for m in c.items if m.startswith(b"/burst,")]
        ids = [int(m.split(b",", 2)[1]) for m in msgs]
        got = [index_of(m.rsplit(b"\n", 1)[-1]) for m in msgs]
        first = LATE_AFTER if c.role == "late" else 0
        assert got == [*range(first, total), -1], (
            f"{c.role}: {len(got)} events, {len(got) - len(set(got))} duplicates, "
            f"{sum(a >= b for a, b in itertools.pairwise(got))} out of order"
        )
        # Positions: guble ids are the channel's seqs.
        assert ids == list(range(first + 1, total + 2)), c.role
        # Each fetch or catch-up is a fetch block with the count it announces (the last may still be open
        # when END came in it), then the subscription live again.
        starts = blocks(c.items)
        if c.role == "slow":
            assert starts >= 1, "the slow connection never caught up"
        else:
            assert starts == (1 if c.role == "late" else 0), c.role


def blocks(items: list[bytes]) -> int:
    """The fetch blocks of /burst in ``items``, checked: each holds the messages its start announces."""
    n = 0
    i = 0
    while i < len(items):
        if items[i].startswith(b"#fetch-start /burst "):
            n += 1
            want = int(items[i].split()[-1])
            j = i + 1
            while j < len(items) and items[j] != b"#fetch-end /burst":
                assert items[j].startswith(b"/burst,"), items[j][:40]
                j += 1
            if j < len(items):
                assert j - i - 1 == want, (j - i - 1, want)
                assert items[j + 1 : j + 2] in ([b"#subscribed-to /burst"], []), items[j + 1][:40]
            else:
                assert j - i - 1 <= want
            i = j
        i += 1
    return n
