"""A cluster node's native bursts reach PostgreSQL as runs (``AppendRun``), and every subscriber, on the
publishing node and on the other one (through Redis), still gets every event once, in seq order."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from hubbub.log import AppendRequest, AppendResult, AppendRun
from hubbub.log.postgres import PostgresLogStore
from hubbub.server import Server
from hubbub.server_config import load_config
from tests.redisserver import RedisServer

from .nativelines import Lines

N = 400  # publishes per node, each node's as one burst


def _burst(port: int, tag: str) -> list[int]:
    """Publish ``N`` events to ``/burst`` in one write, and the seqs of their acks, in order."""
    frames = b"".join(
        orjson.dumps({"op": "publish", "id": 10 + i, "channel": "/burst", "text": f"{tag}{i}", "ack": True})
        + b"\n"
        for i in range(N)
    )
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s, s.makefile("rb") as f:
        s.sendall(b'{"op":"hello","id":1,"v":1}\n')
        assert orjson.loads(f.readline())["op"] == "reply"
        s.sendall(frames)
        acks = [orjson.loads(f.readline()) for _ in range(N)]
    assert [a["id"] for a in acks] == list(range(10, 10 + N))
    return [int(a["seq"]) for a in acks]


def _subscriber(port: int, ready: threading.Event, got: list[dict[str, Any]]) -> None:
    with Lines(port, timeout=30) as s:
        assert s.subscribe("s", "/burst")["op"] == "reply"
        ready.set()
        got += [s.next_push() for _ in range(2 * N)]


def test_bursts_on_two_nodes_are_appended_as_runs_and_delivered_everywhere_in_order(
    tmp_path: Path, pg_url: str, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries: list[type] = []
    real = PostgresLogStore.append

    def append(self: PostgresLogStore, batch: list[AppendRequest | AppendRun]) -> list[AppendResult]:
        entries.extend(type(r) for r in batch)
        return real(self, batch)

    monkeypatch.setattr(PostgresLogStore, "append", append)

    def cli(name: str) -> dict[str, Any]:
        return {
            "data_dir": str(tmp_path / name),
            "store": pg_url,
            "broker": redis_server.url,
            "cluster.node_id": name,
            "cluster.gap_wait_s": "0.05",
            "http.listen": "127.0.0.1:0",
            "native.tcp_listen": "127.0.0.1:0",
        }

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with (
            Server(load_config(cli=cli("a"), env={})) as a,
            Server(load_config(cli=cli("b"), env={})) as b,
        ):
            ports = [a.ports["native"], b.ports["native"]]
            got: list[list[dict[str, Any]]] = [[], []]
            subs = []
            for port, into in zip(ports, got, strict=True):
                ready = threading.Event()
                subs.append(loop.run_in_executor(None, _subscriber, port, ready, into))
                assert await loop.run_in_executor(None, ready.wait, 30)
            acks = await asyncio.gather(
                *(loop.run_in_executor(None, _burst, p, t) for p, t in zip(ports, "ab", strict=True))
            )
            await asyncio.wait_for(asyncio.gather(*subs), 60)
        assert sorted(acks[0] + acks[1]) == list(range(1, 2 * N + 1))
        for mine in acks:
            assert mine == sorted(mine)
        for events in got:
            assert [e["seq"] for e in events] == list(range(1, 2 * N + 1))
            texts = {e["seq"]: e["text"] for e in events}
            for tag, mine in zip("ab", acks, strict=True):
                assert [texts[q] for q in mine] == [f"{tag}{i}" for i in range(N)]

    asyncio.run(main())
    assert AppendRun in entries
    # Each node's burst is a few runs, not a request per event.
    assert entries.count(AppendRun) < N // 4 and entries.count(AppendRequest) < N // 4
