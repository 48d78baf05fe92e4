"""WebSocket library shoot-out: aiohttp against ``websockets`` and ``picows`` for frames per second.

Run it from the repository root::

    python bench/ws_libs.py            # full run, writes bench/WS_LIBS.md (a few minutes)
    python bench/ws_libs.py --quick    # small N, 100 idle connections, prints the table (< 30 s)

``websockets`` and ``picows`` are not hubbub dependencies; install them into the same python first::

    pip install websockets picows

A library that is not installed is skipped with a message.

Each library serves one minimal WebSocket endpoint in its own process on a free 127.0.0.1 port, on a
uvloop event loop (all three run on it; picows also uses its own ``aiofastnet`` transports on top of the
loop, which is its default when installed). Per-message deflate is off everywhere. The server speaks a
tiny control language in text frames:

* ``!burst N SIZE``: send N text frames of SIZE bytes to every connected client, message by message,
  each frame to every client in turn (the shape of a pub/sub fan-out), with each library's own
  backpressure (aiohttp and websockets ``await`` their send; picows honours ``pause_writing``);
* ``!count``: reply ``count K`` with the number of non-control frames this connection received since the
  last ``!count``;
* ``!echo``: reply ``echo``; ``!clients``: reply ``clients K``.

The load driver is this process: raw asyncio protocols on uvloop that do the WebSocket handshake by
hand, write pre-built masked frames in one buffer, and check incoming bursts only by their length
headers (every header byte of every frame is checked with strided slices, so the check runs at C speed
whatever the chunking). The driver's CPU time (``getrusage``) is reported beside the server's
(``/proc/<pid>/stat``) so that a reader can see which side was the limit. Idle memory per connection is
the server's VmRSS growth (``/proc/<pid>/status``) over K idle connections, each having completed one
``!echo`` round trip, divided by K, measured on a fresh server each time.

Every measurement runs three times; the table shows the median (and the spread).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import resource
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

__all__ = ["LIBS", "Row", "main"]

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
LIBS = ("aiohttp", "websockets", "picows")
REPS = 3
TIMEOUT_S = 120.0
LOWAT = 64 * 1024
_TICK = os.sysconf("SC_CLK_TCK")
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


# --------------------------------------------------------------------------------------------- servers
# Each server runs in a child started as ``ws_libs.py --serve LIB``. It prints ``READY <port> <loop>``
# once listening and exits when its stdin closes, so it cannot outlive the driver.


def _control(text: str, count: int, clients: int) -> tuple[str | None, int, int, int]:
    """Parse one control frame: (reply or None, new count, burst frames, burst size)."""
    cmd, *args = text.split()
    if cmd == "!burst":
        return None, count, int(args[0]), int(args[1])
    if cmd == "!count":
        return f"count {count}", 0, 0, 0
    if cmd == "!clients":
        return f"clients {clients}", count, 0, 0
    return "echo", count, 0, 0


def _payload(size: int) -> bytes:
    # Encoded once per burst and sent as a text frame, as hubbub encodes once per fan-out.
    return (b"0123456789abcdef" * (size // 16 + 1))[:size]


async def _serve_aiohttp(ready: Callable[[int], None]) -> None:
    from aiohttp import WSMsgType, web

    clients: list[web.WebSocketResponse] = []

    async def burst(n: int, payload: bytes) -> None:
        targets = list(clients)
        for _ in range(n):
            for ws in targets:
                with contextlib.suppress(ConnectionError):
                    await ws.send_frame(payload, WSMsgType.TEXT)

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        clients.append(ws)
        count = 0
        try:
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT or not msg.data.startswith("!"):
                    count += 1
                    continue
                reply, count, n, size = _control(msg.data, count, len(clients))
                if reply is not None:
                    await ws.send_str(reply)
                else:
                    await burst(n, _payload(size))
        finally:
            clients.remove(ws)
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0, backlog=1024)
    await site.start()
    ready(runner.addresses[0][1])
    await asyncio.Future()  # serve until the process exits


async def _serve_websockets(ready: Callable[[int], None]) -> None:
    # websockets is optional (not a hubbub dependency, see above): missing from the checked environment;
    # unused-ignore: where it is installed, it is typed.
    from websockets.asyncio.server import (  # type: ignore[import-not-found, unused-ignore]
        ServerConnection,
        serve,
    )
    from websockets.exceptions import ConnectionClosed  # type: ignore[import-not-found, unused-ignore]

    clients: list[ServerConnection] = []

    async def burst(n: int, payload: bytes) -> None:
        targets = list(clients)
        for _ in range(n):
            for ws in targets:
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(payload, text=True)

    async def handler(ws: ServerConnection) -> None:
        clients.append(ws)
        count = 0
        try:
            async for msg in ws:
                if not isinstance(msg, str) or not msg.startswith("!"):
                    count += 1
                    continue
                reply, count, n, size = _control(msg, count, len(clients))
                if reply is not None:
                    await ws.send(reply)
                else:
                    await burst(n, _payload(size))
        except ConnectionClosed:  # the driver drops connections without a close frame
            pass
        finally:
            clients.remove(ws)

    # ping_interval=None: no keepalive pings mixed into the measured bursts (aiohttp and picows send none
    # by default).
    async with serve(handler, HOST, 0, compression=None, ping_interval=None, backlog=1024) as server:
        ready(server.sockets[0].getsockname()[1])
        await asyncio.Future()


async def _serve_picows(ready: Callable[[int], None]) -> None:
    # picows is optional (not a hubbub dependency, see above): missing from the checked environment;
    # unused-ignore: where it is installed, it is typed.
    from picows import (  # type: ignore[import-not-found, unused-ignore]
        WSFrame,
        WSListener,
        WSMsgType,
        WSTransport,
        WSUpgradeRequest,
        ws_create_server,
    )

    loop = asyncio.get_running_loop()
    clients: list[Listener] = []
    tasks: set[asyncio.Task[None]] = set()

    class Listener(WSListener):  # type: ignore[misc, unused-ignore]  # WSListener is Any without picows
        def __init__(self) -> None:
            self.transport: WSTransport | None = None
            self.count = 0
            self.resumed: asyncio.Future[None] | None = None

        def on_ws_connected(self, transport: WSTransport) -> None:
            self.transport = transport
            clients.append(self)

        def on_ws_disconnected(self, transport: WSTransport) -> None:
            clients.remove(self)
            self.resume_writing()

        def pause_writing(self) -> None:
            if self.resumed is None:
                self.resumed = loop.create_future()

        def resume_writing(self) -> None:
            if self.resumed is not None and not self.resumed.done():
                self.resumed.set_result(None)
            self.resumed = None

        def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
            if frame.msg_type is WSMsgType.CLOSE:
                transport.send_close(frame.get_close_code())
                transport.disconnect()
                return
            data = frame.get_payload_as_bytes()
            if frame.msg_type is not WSMsgType.TEXT or not data.startswith(b"!"):
                self.count += 1
                return
            reply, self.count, n, size = _control(data.decode(), self.count, len(clients))
            if reply is not None:
                transport.send(WSMsgType.TEXT, reply.encode())
            else:
                task = loop.create_task(burst(n, _payload(size)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    async def burst(n: int, payload: bytes) -> None:
        targets = list(clients)
        for _ in range(n):
            for c in targets:
                if c.resumed is not None:
                    await c.resumed
                if c.transport is not None and not c.transport.is_disconnected:
                    c.transport.send(WSMsgType.TEXT, payload)

    def factory(request: WSUpgradeRequest) -> Listener:
        return Listener()

    server = await ws_create_server(factory, HOST, 0, backlog=1024)
    ready(server.sockets[0].getsockname()[1])
    await asyncio.Future()


_SERVERS: dict[str, Callable[[Callable[[int], None]], Awaitable[None]]] = {
    "aiohttp": _serve_aiohttp,
    "websockets": _serve_websockets,
    "picows": _serve_picows,
}


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _serve(lib: str) -> None:
    """Child entry point: serve ``lib`` until stdin closes."""

    async def run() -> None:
        loop = asyncio.get_running_loop()

        def on_stdin() -> None:
            # The driver closed our stdin (or died): exit at once. A graceful shutdown is not measured and
            # would wait for the open connections' closing handshakes.
            if not os.read(0, 4096):
                os._exit(0)

        loop.add_reader(0, on_stdin)

        def ready(port: int) -> None:
            print(f"READY {port} {type(loop).__module__.split('.')[0]}", flush=True)

        await _SERVERS[lib](ready)

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(run())


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class ServerProc:
    """A ``--serve LIB`` child: its port, event loop, CPU seconds and RSS. Stopped by closing its stdin."""

    def __init__(self, lib: str) -> None:
        self.lib = lib
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", lib],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        poll = select.poll()  # not select(): the driver's fds go past FD_SETSIZE with 10k connections
        poll.register(self.proc.stdout, select.POLLIN)
        line = self.proc.stdout.readline().decode().split() if poll.poll(30_000) else []
        if len(line) != 3 or line[0] != "READY":
            self.stop()
            raise RuntimeError(f"{lib} server did not start: {line!r}")
        self.port = int(line[1])
        self.loop = line[2]

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK

    def cpu_wait_s(self) -> float:
        """Seconds the server was runnable but waiting for a core (``run_delay`` in schedstat): high when
        other work on the machine competes with it. 0.0 where the kernel keeps no schedstat."""
        try:
            with open(f"/proc/{self.proc.pid}/schedstat") as f:
                return int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ---------------------------------------------------------------------------------------------- driver


def _frame(payload: bytes, key: bytes) -> bytes:
    """A masked client text frame (RFC 6455 5.2)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x81, 0x80 | n))
    elif n < 1 << 16:
        head = bytes((0x81, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x81, 0x80 | 127)) + n.to_bytes(8, "big")
    mask = (key * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")).to_bytes(n, "big")
    return head + key + masked


def _header(size: int) -> bytes:
    """The header of an unmasked server text frame of ``size`` bytes."""
    if size < 126:
        return bytes((0x81, size))
    if size < 1 << 16:
        return bytes((0x81, 126)) + size.to_bytes(2, "big")
    return bytes((0x81, 127)) + size.to_bytes(8, "big")


class Client(asyncio.Protocol):
    """One raw WebSocket client. Called from the driver's event loop only.

    Outside a burst, incoming frames are parsed one by one and text payloads queued on ``messages``.
    During a burst (``expect_burst``) the bytes are only counted and their headers checked.
    """

    def __init__(self, port: int) -> None:
        self.key = base64.b64encode(os.urandom(16))
        self.request = (
            f"GET / HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {self.key.decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        self.mask = os.urandom(4)
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.messages: asyncio.Queue[bytes] = asyncio.Queue()
        self.transport: asyncio.Transport | None = None
        self._head = bytearray()
        self._buf = bytearray()
        self._upgraded = False
        self._left = 0
        self._lowat = 1
        self._pos = 0
        self._flen = 1
        self._fhead = b""
        self.burst_done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        err = ConnectionError(f"connection lost: {exc}")
        for fut in (self.opened, self.burst_done):
            if fut is not None and not fut.done():
                fut.set_exception(err)

    def _fail(self, why: str) -> None:
        for fut in (self.opened, self.burst_done):
            if fut is not None and not fut.done():
                fut.set_exception(RuntimeError(why))
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if not self._upgraded:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = bytes(self._head[:end]).lower(), bytes(self._head[end + 4 :])
            accept = base64.b64encode(hashlib.sha1(self.key + _GUID).digest()).lower()
            if (
                not head.startswith(b"http/1.1 101")
                or accept not in head
                or b"sec-websocket-extensions" in head
            ):
                self._fail(f"bad handshake: {head[:200]!r}")
                return
            self._upgraded = True
            self.opened.set_result(None)
        if self._left:
            take = min(len(data), self._left)
            self._check(data if take == len(data) else data[:take])
            self._left -= take
            data = data[take:]
            if self._left < self._lowat:
                self._set_lowat(max(1, self._left))
            if not self._left and self.burst_done is not None and not self.burst_done.done():
                self.burst_done.set_result(None)
        if data:
            self._buf += data
            self._parse()

    def _check(self, chunk: bytes) -> None:
        # Byte p of every frame header sits at chunk positions congruent to p - pos modulo the frame
        # length; a strided slice gathers them all in C.
        flen = self._flen
        for p, byte in enumerate(self._fhead):
            seg = chunk[(p - self._pos) % flen :: flen]
            if seg.count(byte) != len(seg):
                self._fail(f"unexpected frame header in burst (byte {p})")
                return
        self._pos = (self._pos + len(chunk)) % flen

    def _parse(self) -> None:
        buf = self._buf
        while len(buf) >= 2:
            n, hl = buf[1] & 0x7F, 2
            if n == 126:
                n, hl = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                n, hl = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < hl + n:
                return
            opcode, payload = buf[0] & 0x0F, bytes(buf[hl : hl + n])
            del buf[: hl + n]
            if opcode == 0x1:
                self.messages.put_nowait(payload)
            elif opcode == 0x8:
                self._fail("server closed the connection")

    def send_text(self, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_frame(payload, self.mask))

    def _set_lowat(self, n: int) -> None:
        assert self.transport is not None
        self.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, n)
        self._lowat = n

    def expect_burst(self, frames: int, size: int) -> asyncio.Future[None]:
        assert not self._buf, "frames pending before a burst"
        self._fhead = _header(size)
        self._flen = len(self._fhead) + size
        self._left, self._pos = frames * self._flen, 0
        # The kernel wakes the driver only once LOWAT bytes are queued, so a server that writes one
        # frame per syscall does not cost the driver one callback per frame.
        self._set_lowat(min(LOWAT, self._left))
        self.burst_done = asyncio.get_running_loop().create_future()
        return self.burst_done

    async def ask(self, text: str) -> str:
        self.send_text(text.encode())
        return (await asyncio.wait_for(self.messages.get(), TIMEOUT_S)).decode()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_clients(port: int, k: int, concurrency: int = 200) -> list[Client]:
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(concurrency)

    async def one() -> Client:
        async with sem:
            _, client = await loop.create_connection(lambda: Client(port), HOST, port)
            await asyncio.wait_for(client.opened, TIMEOUT_S)
            return client

    return list(await asyncio.gather(*(one() for _ in range(k))))


async def wait_clients(client: Client, k: int) -> None:
    """Wait until the server counts exactly ``k`` connections (closed ones from an earlier scenario gone)."""
    deadline = time.monotonic() + TIMEOUT_S
    while (reply := await client.ask("!clients")) != f"clients {k}":
        if time.monotonic() > deadline:
            raise RuntimeError(f"server still reports {reply!r}, expected {k}")
        await asyncio.sleep(0.02)


def _driver_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@dataclass(frozen=True, slots=True)
class Sample:
    value: float
    server_cpu: float  # share of one core over the measured interval
    server_wait: float  # share of the interval the server waited for a core
    driver_cpu: float


async def _timed(server: ServerProc, work: Callable[[], Awaitable[float]]) -> Sample:
    """Run ``work`` (which returns the amount done) and turn it into a rate with both sides' CPU shares."""
    s0, w0, d0, t0 = server.cpu_s(), server.cpu_wait_s(), _driver_cpu(), time.perf_counter()
    amount = await work()
    dt = time.perf_counter() - t0
    cpu, wait, driver = server.cpu_s() - s0, server.cpu_wait_s() - w0, _driver_cpu() - d0
    return Sample(amount / dt, cpu / dt, wait / dt, driver / dt)


async def fanout(server: ServerProc, clients: Sequence[Client], frames: int, size: int) -> Sample:
    async def work() -> float:
        done = [c.expect_burst(frames, size) for c in clients]
        clients[0].send_text(f"!burst {frames} {size}".encode())
        await asyncio.wait_for(asyncio.gather(*done), TIMEOUT_S)
        return frames * len(clients)

    return await _timed(server, work)


async def ingest(server: ServerProc, client: Client, frames: int) -> Sample:
    await client.ask("!count")  # reset the server's count
    batch = _frame(b"x" * 16, client.mask) * frames

    async def work() -> float:
        assert client.transport is not None
        client.transport.write(batch)
        reply = await client.ask("!count")
        if reply != f"count {frames}":
            raise RuntimeError(f"server counted {reply!r}, expected {frames}")
        return frames

    return await _timed(server, work)


async def idle_bytes_per_conn(lib: str, k: int) -> float:
    """Server RSS growth per idle connection, on a fresh server, after one warm-up connection."""
    server = ServerProc(lib)
    clients: list[Client] = []
    try:
        clients = await open_clients(server.port, 1)
        await clients[0].ask("!echo")
        before = server.rss()
        clients += await open_clients(server.port, k)
        replies = await asyncio.gather(*(c.ask("!echo") for c in clients[1:]))
        assert all(r == "echo" for r in replies)
        await wait_clients(clients[0], k + 1)
        return (server.rss() - before) / k
    finally:
        for c in clients:
            c.close()
        server.stop()


# --------------------------------------------------------------------------------------------- running


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    kind: str  # fanout | ingest | idle
    clients: int
    frames: int
    size: int
    unit: str


def scenarios(quick: bool) -> list[Scenario]:
    q = quick
    return [
        Scenario("1 client, 16 B frames", "fanout", 1, 20_000 if q else 300_000, 16, "frames/s"),
        Scenario("1 client, 1 KiB frames", "fanout", 1, 5_000 if q else 100_000, 1024, "frames/s"),
        Scenario("100 clients, 16 B (fan-out)", "fanout", 100, 300 if q else 5_000, 16, "deliveries/s"),
        Scenario("100 clients, 1 KiB (fan-out)", "fanout", 100, 100 if q else 1_500, 1024, "deliveries/s"),
        Scenario("ingest 1 client, 16 B", "ingest", 1, 30_000 if q else 500_000, 16, "frames/s"),
        *(
            Scenario(f"idle {k} conns", "idle", k, 0, 0, "bytes/conn")
            for k in ((100,) if q else (1_000, 10_000))
        ),
    ]


@dataclass(frozen=True, slots=True)
class Row:
    scenario: str
    library: str
    unit: str
    value: float  # median of REPS
    low: float
    high: float
    server_cpu: float | None  # median share of one core; None for idle memory
    server_wait: float | None
    driver_cpu: float | None


def _row(sc: Scenario, lib: str, samples: list[Sample]) -> Row:
    values = [s.value for s in samples]
    return Row(
        sc.name, lib, sc.unit, statistics.median(values), min(values), max(values),
        statistics.median(s.server_cpu for s in samples), statistics.median(s.server_wait for s in samples),
        statistics.median(s.driver_cpu for s in samples),
    )  # fmt: skip


async def _measure(sc: Scenario, servers: dict[str, ServerProc], reps: int) -> list[Row]:
    """One send or ingest scenario for every library. Repetitions alternate between libraries, so that
    other load on the machine, if any, falls on all of them alike rather than on whichever ran then."""
    samples: dict[str, list[Sample]] = {lib: [] for lib in servers}
    conns = {lib: await open_clients(srv.port, sc.clients) for lib, srv in servers.items()}
    try:
        for clients in conns.values():
            await wait_clients(clients[0], sc.clients)
        for _ in range(reps):
            for lib, clients in conns.items():
                if sc.kind == "fanout":
                    samples[lib].append(await fanout(servers[lib], clients, sc.frames, sc.size))
                else:
                    samples[lib].append(await ingest(servers[lib], clients[0], sc.frames))
    finally:
        for clients in conns.values():
            for c in clients:
                c.close()
    return [_row(sc, lib, s) for lib, s in samples.items()]


async def _measure_idle(sc: Scenario, libs: Sequence[str], reps: int) -> list[Row]:
    values: dict[str, list[float]] = {lib: [] for lib in libs}
    for _ in range(reps):
        for lib in libs:
            values[lib].append(await idle_bytes_per_conn(lib, sc.clients))
    return [
        Row(sc.name, lib, sc.unit, statistics.median(v), min(v), max(v), None, None, None)
        for lib, v in values.items()
    ]


async def run(libs: Sequence[str], quick: bool, reps: int) -> tuple[list[Row], dict[str, str]]:
    """Every scenario for every library; the rows grouped by library."""
    servers: dict[str, ServerProc] = {}
    rows: list[Row] = []

    def report(sc: Scenario, new: list[Row]) -> None:
        rows.extend(new)
        cells = "".join(f"{r.library:>12} {r.value:>10,.0f}" for r in new)
        print(f"  {sc.name:<30} {sc.unit:<13}{cells}", flush=True)

    try:
        for lib in libs:
            servers[lib] = srv = ServerProc(lib)
            # Warm-up, not measured: code paths, allocator arenas, socket buffers.
            warm = await open_clients(srv.port, 1)
            await fanout(srv, warm, 2_000, 1024)
            await ingest(srv, warm[0], 5_000)
            warm[0].close()
        for sc in scenarios(quick):
            if sc.kind != "idle":
                report(sc, await _measure(sc, servers, reps))
    finally:
        for srv in servers.values():
            srv.stop()
    for sc in scenarios(quick):
        if sc.kind == "idle":  # a fresh server per measurement, started by idle_bytes_per_conn
            report(sc, await _measure_idle(sc, libs, reps))
    loops = {lib: srv.loop for lib, srv in servers.items()}
    return sorted(rows, key=lambda r: libs.index(r.library)), loops


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _steal() -> tuple[int, int]:
    """Machine-wide (steal, total) CPU ticks from ``/proc/stat``."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v * 100:.0f} %" if pct else f"{v:,.0f}"


def render_table(rows: list[Row], libs: Sequence[str]) -> str:
    """Two markdown tables: medians side by side, then every row with its spread and CPU shares."""
    names = list(dict.fromkeys(r.scenario for r in rows))
    by = {(r.scenario, r.library): r for r in rows}
    out = [
        "| scenario | unit | " + " | ".join(libs) + " | best |",
        "|---|---|" + "---:|" * len(libs) + "---|",
    ]
    for name in names:
        present = [by[name, lib] for lib in libs if (name, lib) in by]
        lower_better = present[0].unit == "bytes/conn"
        best = (min if lower_better else max)(present, key=lambda r: r.value)
        cells = [_fmt(by[name, lib].value) if (name, lib) in by else "-" for lib in libs]
        out.append(f"| {name} | {present[0].unit} | " + " | ".join(cells) + f" | {best.library} |")
    out += [
        "",
        "| scenario | library | median | min - max | server CPU | server waiting for CPU | driver CPU |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    out += [
        f"| {r.scenario} | {r.library} | {_fmt(r.value)} | {_fmt(r.low)} - {_fmt(r.high)} "
        f"| {_fmt(r.server_cpu, True)} | {_fmt(r.server_wait, True)} | {_fmt(r.driver_cpu, True)} |"
        for r in rows
    ]
    return "\n".join(out)


_PLACEHOLDER = "## Conclusion\n\n(Write the conclusion here; re-running the benchmark keeps this section.)\n"


def _kept_conclusion(path: Path) -> str:
    """The hand-written ``## Conclusion`` section of an earlier report, which a re-run keeps."""
    with contextlib.suppress(OSError):
        text = path.read_text()
        if (at := text.find("## Conclusion")) >= 0:
            return text[at:]
    return _PLACEHOLDER


def write_markdown(
    path: Path, rows: list[Row], libs: Sequence[str], loops: dict[str, str], load: str, command: str
) -> None:
    """Write the report; everything from ``## Conclusion`` on is kept from the existing file."""
    conclusion = _kept_conclusion(path)
    versions = ", ".join(f"{lib} {_version(lib)} ({loops.get(lib, '?')} loop)" for lib in libs)
    text = f"""\
# WebSocket libraries: aiohttp vs websockets vs picows

Generated by `bench/ws_libs.py`. Re-run with:

```
pip install websockets picows
{command}
```

## Machine

- CPU: {_cpu_model()}, {os.cpu_count()} cores; Linux {platform.release()}
- Python {platform.python_version()}; uvloop {_version("uvloop")}
- {versions}
- load average (1 min) at start / end: {load}

The benchmark itself accounts for a load of up to 2 (server and driver); more means other work shared
the cores, which shows as *server waiting for CPU* and a wider min - max. Steal is time the hypervisor
gave to other machines. Repetitions alternate between libraries so that such noise falls on all alike.

## Method

One server process per library on 127.0.0.1, uvloop, per-message deflate off, default limits otherwise
(websockets: `ping_interval=None`). Each burst payload is encoded once and sent as a text frame to each
client in turn: aiohttp `await ws.send_frame(payload, WSMsgType.TEXT)`, websockets
`await ws.send(payload, text=True)`, picows `transport.send(WSMsgType.TEXT, payload)` (pausing on
`pause_writing`). Received text arrives as `str` in aiohttp and websockets, as a `WSFrame` in picows.
The driver is raw asyncio protocols in one process (handshake by hand, pre-built masked frames written
in one buffer, bursts checked by frame headers only, woken only once 64 KiB are queued thanks to
`SO_RCVLOWAT`). Each row is the median of {REPS} runs. *Frames/s* is frames delivered to the client
per second; with 100 clients, *deliveries/s* counts each frame once per client. *Ingest* is
client-to-server frames counted by the server. *Server CPU* and *driver CPU* are each process's CPU
time over the interval as a share of one core; *server waiting for CPU* is the share of the interval
the server was runnable but had no core (`/proc/<pid>/schedstat`), so CPU plus waiting near 100 %
means the server was the limit. *Idle* is server VmRSS growth per idle connection (after one `!echo`
round trip each), on a fresh server.

## Results

{render_table(rows, libs)}

{conclusion}"""
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="small N and 100 idle connections (< 30 s)")
    ap.add_argument("--libs", default=",".join(LIBS), help="comma-separated subset of " + ",".join(LIBS))
    ap.add_argument("--reps", type=int, default=REPS, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help="markdown report (default: bench/WS_LIBS.md, none with --quick)")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--serve", choices=LIBS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        _serve(args.serve)
        return 0
    _raise_nofile()
    libs = []
    for lib in args.libs.split(","):
        if lib not in LIBS:
            ap.error(f"unknown library {lib!r}")
        if importlib.util.find_spec(lib) is None:
            print(f"skipping {lib}: not installed (pip install {lib})", flush=True)
        else:
            libs.append(lib)
    print("versions: " + ", ".join(f"{lib} {_version(lib)}" for lib in libs), flush=True)
    if not libs:
        print("nothing to measure: pip install websockets picows (aiohttp comes with hubbub)")
        return 1
    load_start, (steal0, total0) = os.getloadavg()[0], _steal()
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        rows, loops = runner.run(run(libs, args.quick, args.reps))
    steal1, total1 = _steal()
    steal = (steal1 - steal0) / max(1, total1 - total0)
    load = f"{load_start:.1f} / {os.getloadavg()[0]:.1f}; hypervisor steal {steal:.0%} of CPU time"
    print()
    print(render_table(rows, libs))
    out = args.out or (None if args.quick else ROOT / "bench" / "WS_LIBS.md")
    if out is not None:
        command = "python bench/ws_libs.py" + (" --quick" if args.quick else "")
        write_markdown(out, rows, libs, loops, load, command)
        print(f"\nwrote {out}")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
