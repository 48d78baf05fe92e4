"""Native TCP cuts a connection's burst of publishes into runs of at most ``RUN_MAX`` and lets the other
connections' work run between them: a burst of many runs and reads, and frames larger than a read
(``transports.tcp.READ_CHUNK``), are still answered whole and in order, and another connection is served
while a large burst is being taken."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson

from hubbub.dialects.native import RUN_MAX
from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports.tcp import READ_CHUNK

from .serverproc import ServerProcess

WAIT = 30.0


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
    writer.write(b'{"op":"hello","id":1,"v":1}\n')
    assert (await _read(reader))["op"] == "reply"
    return reader, writer


async def _read(reader: asyncio.StreamReader) -> dict[str, Any]:
    obj: dict[str, Any] = orjson.loads(await asyncio.wait_for(reader.readline(), WAIT))
    return obj


def _against_a_server(tmp_path: Path, main: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    """``main(native TCP port)`` against a real server process (memory store)."""
    server = ServerProcess(tmp_path / "d", ["--store", "memory", "--durability", "none"]).start()
    try:
        asyncio.run(main(server.ports["native"]))
    finally:
        server.terminate()


def _publish(rid: int, channel: str, text: str) -> bytes:
    return orjson.dumps({"op": "publish", "id": rid, "channel": channel, "text": text, "ack": True}) + b"\n"


def test_a_burst_and_frames_larger_than_a_read_are_answered_whole_and_in_order(tmp_path: Path) -> None:
    big = "b" * (READ_CHUNK + READ_CHUNK // 2 + 17)  # a frame over two reads, cut at no read boundary

    async def main(port: int) -> None:
        sub_r, sub_w = await _connect(port)
        sub_w.write(b'{"op":"subscribe","id":2,"sub":"s","pattern":"/slices/**"}\n')
        assert (await _read(sub_r))["op"] == "reply"
        r, w = await _connect(port)
        frames = [_publish(10 + i, "/slices/a", big if i in (5, 2000) else f"e{i}") for i in range(3000)]
        assert len(frames) > 10 * RUN_MAX
        w.write(b"".join(frames))  # one write: many runs, several reads
        seqs = []
        for i in range(3000):
            reply = await _read(r)
            assert reply["op"] == "reply" and reply["id"] == 10 + i, reply
            seqs.append(reply["seq"])
        assert seqs == list(range(1, 3001))
        got: list[dict[str, Any]] = []
        while len(got) < 3000:
            msg = await _read(sub_r)
            if msg["op"] == "batch":
                got += [f for f in msg["frames"] if f["op"] == "event"]
            elif msg["op"] == "event":
                got.append(msg)
        assert [e["seq"] for e in got] == seqs
        assert [e["text"] for e in got] == [big if i in (5, 2000) else f"e{i}" for i in range(3000)]
        for writer in (w, sub_w):
            writer.close()

    _against_a_server(tmp_path, main)


def test_another_connection_is_served_while_a_large_burst_is_taken(tmp_path: Path) -> None:
    """Connection A sends a burst of many runs in one write; connection B's publish, sent as soon as A's
    burst is written, is answered before most of A's: the server took A's burst a run at a time."""
    n = 20_000

    async def main(port: int) -> None:
        a_r, a_w = await _connect(port)
        b_r, b_w = await _connect(port)
        burst = b"".join(_publish(10 + i, "/fair/a", f"event {i:08d} " + "x" * 60) for i in range(n))
        assert n > 50 * RUN_MAX and len(burst) > 4 * READ_CHUNK
        answered = 0

        async def read_a() -> None:
            nonlocal answered
            while answered < n:
                reply = await _read(a_r)
                assert reply["op"] == "reply", reply
                answered += 1

        reader = asyncio.create_task(read_a())
        a_w.write(burst)
        b_w.write(_publish(7, "/fair/b", "b"))
        reply = await _read(b_r)
        assert reply["op"] == "reply" and reply["id"] == 7, reply
        at_b = answered  # A's replies read when B's came
        await reader
        assert at_b < n // 2, f"B was answered only after {at_b} of A's {n} publishes"
        for w in (a_w, b_w):
            w.close()

    _against_a_server(tmp_path, main)


def test_a_burst_is_committed_a_run_at_a_time(tmp_path: Path) -> None:
    """A burst that arrives in few reads is taken a run of ``RUN_MAX`` publishes at a time, each committed
    (and answered) before the next is taken: between them the loop runs its other work."""
    n = 20 * RUN_MAX
    burst = b"".join(_publish(10 + i, "/runs/a", f"e{i}") for i in range(n))

    def client(port: int) -> list[int]:
        with socket.create_connection(("127.0.0.1", port)) as s, s.makefile("rb") as f:
            s.sendall(b'{"op":"hello","id":1,"v":1}\n')
            assert orjson.loads(f.readline())["op"] == "reply"
            s.sendall(burst)
            return [orjson.loads(f.readline())["seq"] for _ in range(n)]

    async def main() -> None:
        cli = {
            "data_dir": str(tmp_path / "d"),
            "store": "memory",
            "durability": "none",
            "http.listen": "127.0.0.1:0",
            "native.tcp_listen": "127.0.0.1:0",
        }
        async with Server(load_config(cli=cli, env={})) as server:
            assert server.node is not None
            before = server.node.statistics()["writer"]["batches"]
            seqs = await asyncio.get_running_loop().run_in_executor(None, client, server.ports["native"])
            assert seqs == list(range(1, n + 1))
            commits = server.node.statistics()["writer"]["batches"] - before
            assert commits >= n // RUN_MAX, f"{n} publishes in {commits} commits"

    asyncio.run(main())
