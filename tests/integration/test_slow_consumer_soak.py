"""Slow-consumer soak (protocols README §4), bounded in time, on a real ``hubbub serve`` process.

Publishers push to ``/soak/bulk`` as fast as the server takes them, while subscribers of every landed
dialect to ``/soak/**`` stop reading. The server's RSS stays flat (each connection's queue is bounded by
``limits.send_queue`` and ``limits.send_queue_bytes``); the stalled connections are dealt with by their
dialect's policy (native WebSocket and TCP: error 4302, then close; ivy: close 1013; guble: its queued live
events dropped for a catch-up from the log, and close 1013 when even that falls behind); and a subscriber
that keeps up with its own channel (``/soak/tick``, published to at a steady rate on the same server
meanwhile) gets every event, gapless and in time, without being closed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .serverproc import ServerProcess

BULK = "/soak/bulk"
TICK = "/soak/tick"
#: Ticks per second on TICK.
TICK_RATE = 200
PAYLOAD = "x" * 1000
#: Seconds of full publish load while RSS is sampled.
LOAD_S = 16.0
SEND_QUEUE = 1024
SEND_QUEUE_BYTES = 1 << 20
#: What the server may add to its RSS under load, whatever the duration, in KiB: the SQLite page caches
#: (32 MiB for the writer, 8 MiB for each of 4 reader threads, filled as the log grows and is read), four
#: stalled connections' queues at their hard cap (4 x send_queue_bytes each), a guble catch-up's snapshot
#: (native.max_recovery = 10000 events of about 1.1 KB), and 48 MiB for allocator slack and socket buffers.
BUDGET_KB = (32 + 4 * 8) * 1024 + 4 * 4 * SEND_QUEUE_BYTES // 1024 + 12 * 1024 + 48 * 1024


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def metric(http: aiohttp.ClientSession, base: str, name: str) -> float:
    async with http.get(base + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def publisher(port: int, stop: asyncio.Event, sent: list[int], pushed: list[int]) -> None:
    """Fire-and-forget publishes to BULK on one native TCP connection, as fast as the server reads them
    (``pushed[0]``: how many all publishers have written so far); then one acknowledged publish, after
    which everything before it is committed (commits are in order)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b'{"op":"hello","id":0,"v":1}\n')
    await reader.readline()
    burst = (json.dumps({"op": "publish", "id": 1, "channel": BULK, "text": PAYLOAD}).encode() + b"\n") * 100
    n = 0
    while not stop.is_set():
        writer.write(burst)
        n += 100
        pushed[0] += 100
        await writer.drain()
    writer.write(json.dumps({"op": "publish", "id": 2, "channel": BULK, "text": "end", "ack": True}).encode())
    writer.write(b"\n")
    reply = json.loads(await reader.readline())
    assert reply["op"] == "reply", reply
    sent.append(n + 1)
    writer.close()
    await writer.wait_closed()


async def ticker(port: int, stop: asyncio.Event, sent: list[int], acked: dict[int, float]) -> None:
    """TICK_RATE acknowledged publishes a second to TICK, each carrying its send time; ``acked``: when the
    acknowledgement of each (by id, which is its seq) came back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b'{"op":"hello","id":0,"v":1}\n')
    await reader.readline()
    final: list[int] = []
    all_acked = asyncio.Event()

    async def replies() -> None:
        while True:
            msg = json.loads(await reader.readline())
            assert msg["op"] == "reply", msg
            acked[msg["id"]] = time.time()
            if final and len(acked) == final[0]:
                all_acked.set()

    reading = asyncio.ensure_future(replies())
    n = 0
    t0 = time.monotonic()
    while not stop.is_set():
        n += 1
        frame = {"op": "publish", "id": n, "channel": TICK, "text": repr(time.time()), "ack": True}
        writer.write(json.dumps(frame).encode() + b"\n")
        await asyncio.sleep(max(0.0, t0 + n / TICK_RATE - time.monotonic()))
    final.append(n)
    if len(acked) < n:  # every tick acknowledged (a ping would be answered before the last commits)
        await asyncio.wait_for(all_acked.wait(), 60)
    if reading.done():
        reading.result()  # its error, if it failed
    reading.cancel()
    sent.append(n)
    writer.close()
    await writer.wait_closed()


def tick_subscriber(port: int, ready: threading.Event, seen: dict[str, list[Any]]) -> None:
    """Reads TICK on native TCP, recording the seqs and how late each event arrived. A thread with a
    blocking socket: a reader that keeps up must not share the event loop with the publishers."""
    with socket.create_connection(("127.0.0.1", port)) as sock, sock.makefile("rb", buffering=1 << 20) as f:
        sock.sendall(
            b'{"op":"hello","id":0,"v":1}\n{"op":"subscribe","id":1,"sub":"s","pattern":"/soak/tick"}\n'
        )
        f.readline()
        f.readline()
        ready.set()
        for line in f:
            msg = json.loads(line)
            if msg["op"] == "event":
                now = time.time()
                seen.setdefault("seqs", []).append(msg["seq"])
                seen.setdefault("at", []).append(now)
                seen.setdefault("late", []).append(now - float(msg["text"]))
            elif msg["op"] == "error":
                seen.setdefault("error", []).append(msg["code"])
        seen.setdefault("closed", []).append(1)


@pytest.mark.slow
def test_slow_consumer_soak(tmp_path: Path) -> None:
    srv = ServerProcess(
        tmp_path / "data",
        ["--limits-send-queue", str(SEND_QUEUE), "--limits-send-queue-bytes", str(SEND_QUEUE_BYTES)],
    ).start()
    try:
        asyncio.run(asyncio.wait_for(_soak(srv), 110))
    finally:
        srv.terminate()
    assert "Traceback" not in srv.log()


async def _soak(srv: ServerProcess) -> None:
    assert srv.proc is not None
    pid = srv.proc.pid
    base = f"http://127.0.0.1:{srv.ports['http']}"
    ws_base = f"ws://127.0.0.1:{srv.ports['http']}"
    tcp = srv.ports["native"]
    async with aiohttp.ClientSession() as http:
        # The stalled subscribers: they subscribe, then read nothing.
        stalled_r, stalled_w = await asyncio.open_connection("127.0.0.1", tcp)
        stalled_w.write(
            b'{"op":"hello","id":0,"v":1}\n{"op":"subscribe","id":1,"sub":"s","pattern":"/soak/**"}\n'
        )
        nat = await http.ws_connect(ws_base + "/ws/hubbub", protocols=("hubbub.v1.json",))
        await nat.send_json({"op": "hello", "id": 0, "v": 1})
        await nat.receive_json()
        await nat.send_json({"op": "subscribe", "id": 1, "sub": "s", "pattern": "/soak/**"})
        await nat.receive_json()
        ivy = await http.ws_connect(ws_base + "/ws", protocols=("ivy1",))
        await ivy.receive_str()
        await ivy.send_str("+/soak")
        await ivy.send_str("@")
        assert (await ivy.receive_str()).startswith("##@")
        gub = await http.ws_connect(ws_base + "/stream/user/slow")
        await gub.receive_bytes()
        await gub.send_str("+ /soak")
        assert await gub.receive_bytes() == b"#subscribed-to /soak"

        seen: dict[str, list[Any]] = {}
        ready = threading.Event()
        reader = threading.Thread(target=tick_subscriber, args=(tcp, ready, seen), daemon=True)
        reader.start()
        assert await asyncio.to_thread(ready.wait, 10)
        rss0 = rss_kb(pid)
        stop = asyncio.Event()
        sent: list[int] = []
        ticks: list[int] = []
        acked: dict[int, float] = {}
        pushed = [0]
        pubs = [asyncio.ensure_future(publisher(tcp, stop, sent, pushed)) for _ in range(2)]
        tick = asyncio.ensure_future(ticker(tcp, stop, ticks, acked))

        samples: list[tuple[float, int]] = []
        kicked: dict[str, float] = {}

        async def loaded() -> bool:
            """The load has done its part: as many publishes as the assertions below want, and the stalled
            native (TCP and WebSocket) and ivy connections closed (on a loaded machine that may take longer
            than LOAD_S: the load then goes on, its RSS sampled all along)."""
            for d in ("native", "ivy"):
                kicked[d] = await metric(http, base, f'hubbub_slow_consumer_closes_total{{dialect="{d}"}}')
            return pushed[0] > 10 * TICK_RATE * LOAD_S and kicked["native"] >= 2 and kicked["ivy"] >= 1

        t0 = time.monotonic()
        while (now := time.monotonic() - t0) < LOAD_S or not await loaded():
            assert now < LOAD_S + 40, f"{pushed[0]} publishes, slow-consumer closes {kicked}"
            samples.append((now, rss_kb(pid)))
            await asyncio.sleep(0.25)
        native_kicked, ivy_kicked = kicked["native"], kicked["ivy"]
        guble_dropped = await metric(http, base, 'hubbub_dropped_total{dialect="guble"}')
        stop.set()
        await asyncio.gather(*pubs, tick)
        total = sum(sent)

        # Bounded by what the configuration allows, not by how long the load lasts or how much was published.
        peak = max(kb for _t, kb in samples)
        assert peak <= rss0 + BUDGET_KB, f"RSS {rss0} kB before the load, peak {peak} kB: {samples}"
        assert total > 10 * TICK_RATE * LOAD_S, f"only {total} bulk publishes"

        async def top(ch: str) -> int:
            async with http.get(f"{base}/api/v1/log{ch}?limit=0") as r:
                return int((await r.json())["top"])

        assert await top(BULK) == total
        # The subscriber that keeps up got every tick, gapless and in time, and stayed open.
        n_ticks = await top(TICK)
        assert n_ticks == ticks[0]
        deadline = time.monotonic() + 30
        while len(seen.get("seqs", [])) < n_ticks:
            progress = {k: v if k == "error" else len(v) for k, v in seen.items()}
            assert time.monotonic() < deadline and reader.is_alive(), progress
            await asyncio.sleep(0.05)
        assert seen["seqs"] == list(range(1, n_ticks + 1))
        assert "error" not in seen and "closed" not in seen
        # In time: each tick reaches the subscriber about when its publisher has its acknowledgement (both go
        # out once it is committed), not held behind the stalled connections. Measured from the send, a loaded
        # machine makes both late alike (the server takes the ticker's publishes among the bulk's); what the
        # subscriber waits beyond the acknowledgement is the fan-out's own delay.
        behind = sorted(at - acked[seq] for seq, at in zip(seen["seqs"], seen["at"], strict=True))
        p99 = behind[int(len(behind) * 0.99)]
        late = sorted(seen["late"])
        assert p99 < 1.0, (
            f"ticks reached the subscriber up to {behind[-1]:.3f} s after their acknowledgement "
            f"(p99 {p99:.3f} s; up to {late[-1]:.3f} s after they were sent)"
        )

        # The stalled ones, read now: native pushed 4302 and closed (both transports); ivy closed 1013.
        assert native_kicked >= 2 and ivy_kicked >= 1, (native_kicked, ivy_kicked)
        codes = []
        while line := await asyncio.wait_for(stalled_r.readline(), 30):
            msg = json.loads(line)
            if msg["op"] == "error":
                codes.append(msg["code"])
        assert codes == [4302]
        close: Any = await asyncio.wait_for(_until_close(nat), 30)
        assert (close.type, close.data) == (aiohttp.WSMsgType.CLOSE, 4302)
        close = await asyncio.wait_for(_until_close(ivy), 30)
        assert (close.type, close.data) == (aiohttp.WSMsgType.CLOSE, 1013)
        # guble's stalled receiver dropped its queued live events for a catch-up from the log; when even the
        # catch-up fell behind the live stream, it was closed with 1013.
        # (hubbub_dropped_total counts the drops of open connections only, so a closed one shows none.)
        guble_closed = await metric(http, base, 'hubbub_slow_consumer_closes_total{dialect="guble"}')
        assert guble_dropped > 0 or guble_closed >= 1
        if guble_closed:
            close = await asyncio.wait_for(_until_close(gub), 30)
            assert (close.type, close.data) == (aiohttp.WSMsgType.CLOSE, 1013)
        await gub.close()
        stalled_w.close()


async def _until_close(ws: aiohttp.ClientWebSocketResponse) -> aiohttp.WSMessage:
    while True:
        msg = await ws.receive()
        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
            return msg


#: The write timeout of the shutdown test's server, and the bound on its exit after SIGTERM (the closing
#: connections' own wait, CLOSE_WAIT_S, is 5 s).
STALLED_WRITE_S = 600
EXIT_S = 60


@pytest.mark.slow
def test_shutdown_with_a_stalled_peer(tmp_path: Path) -> None:
    """SIGTERM ends the process promptly even when a native TCP subscriber stopped reading (its last frames
    can never be sent): the closing connection is aborted after a bounded wait instead of holding the
    shutdown forever. The peer's write may wait 600 s here (``limits.write_timeout_s``), ten times the bound
    on the exit: a shutdown that waited for that write could not pass for a prompt one, and the bound can
    leave a loaded machine its pace."""
    srv = ServerProcess(tmp_path / "data", ["--limits-write-timeout-s", str(STALLED_WRITE_S)]).start()

    async def stall_then_term() -> float:
        port = srv.ports["native"]
        _r, stalled = await asyncio.open_connection("127.0.0.1", port)
        stalled.write(b'{"op":"hello","id":0,"v":1}\n{"op":"subscribe","id":1,"sub":"s","pattern":"/s"}\n')
        reader, pub = await asyncio.open_connection("127.0.0.1", port)
        pub.write(b'{"op":"hello","id":0,"v":1}\n')
        await reader.readline()
        burst = (b'{"op":"publish","id":1,"channel":"/s","text":"' + b"z" * 1000 + b'"}\n') * 100
        async with aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"
            while not await metric(http, base, 'hubbub_slow_consumer_closes_total{dialect="native"}'):
                for _ in range(20):
                    pub.write(burst)
                    await pub.drain()
        pub.close()
        assert srv.proc is not None
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        while srv.proc.poll() is None:
            assert time.monotonic() - t0 < EXIT_S, f"the server did not exit within {EXIT_S} s of SIGTERM"
            await asyncio.sleep(0.05)
        stalled.close()
        return time.monotonic() - t0

    try:
        took = asyncio.run(stall_then_term())
    finally:
        srv.kill()
    assert srv.proc is not None and srv.proc.returncode == 0, srv.log()
    assert took < EXIT_S, took
