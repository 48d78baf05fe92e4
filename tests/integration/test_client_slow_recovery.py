"""A Python client subscriber closed as a slow consumer while far behind recovers every event by itself.

A ``/**`` subscription of :class:`hubbub.client.AsyncClient` whose application stops reading: the client's
queue fills, it stops reading the socket, the server's queue (``limits.send_queue``) overflows and the server
closes the connection with 4302. More than 10,000 events are then published (the most a recovery could once
replay: past it the client got 4203 and its subscription ended). When the application reads again, the client
has reconnected and resumed from the last position it delivered of every channel: the application sees every
event once, each channel in seq order, no gap, then live events, without noticing the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from hubbub.client import AsyncClient
from hubbub.client.bulk import BulkPublisher
from hubbub.events import Event
from hubbub.server import Server
from hubbub.server_config import load_config

CHANNELS = 20
AFTER_CLOSE = 12_000
PAYLOAD = 1000
WAIT = 60.0


def channel(i: int) -> str:
    return f"/slow/c{i % CHANNELS:02d}"


def payload(i: int) -> bytes:
    return str(i).encode().ljust(PAYLOAD, b".")


@contextlib.asynccontextmanager
async def serve(data: Path) -> AsyncIterator[Server]:
    cli = {
        "data_dir": str(data),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "limits.send_queue": "64",
    }
    async with Server(load_config(cli=cli, env={})) as server:
        yield server


def publish(url: str, start: int, n: int) -> None:
    with BulkPublisher(url, window=512, keep_acks=False) as pub:
        for i in range(start, start + n):
            pub.publish(channel(i), payload(i))
        pub.flush()


def test_slow_consumer_far_behind_recovers_through_the_client(tmp_path: Path) -> None:
    async def body() -> None:
        async with serve(tmp_path / "d") as server:
            node = server.node
            assert node is not None
            tcp = f"tcp://127.0.0.1:{server.ports['native']}"
            url = f"ws://127.0.0.1:{server.ports['http']}"
            async with AsyncClient.connect(url) as client, client.subscribe("/**", max_queue=16) as sub:
                # The application reads nothing: publish until the server closes the connection as slow.
                sent = 0
                while not node.metrics.slow_closes.get("native"):
                    await asyncio.to_thread(publish, tcp, sent, 2000)
                    sent += 2000
                    assert sent < 200_000, "never closed as a slow consumer"
                # Far behind: more than the 10,000 events a recovery once stopped at.
                await asyncio.to_thread(publish, tcp, sent, AFTER_CLOSE)
                sent += AFTER_CLOSE
                got: list[tuple[str, int, bytes]] = []
                deadline = time.monotonic() + WAIT
                while len(got) < sent:
                    item = await sub.get(max(0.1, deadline - time.monotonic()))
                    assert isinstance(item, Event), item  # never a Gap
                    got.append((item.channel, item.seq, item.payload))
                per: dict[str, list[tuple[int, bytes]]] = {}
                for ch, seq, body_ in got:
                    per.setdefault(ch, []).append((seq, body_))
                want: dict[str, list[tuple[int, bytes]]] = {}
                for i in range(sent):
                    w = want.setdefault(channel(i), [])
                    w.append((len(w) + 1, payload(i)))
                assert per == want  # every event once, each channel in seq order
                await client.publish("/slow/live", "after")
                item = await sub.get(WAIT)
                assert isinstance(item, Event)
                assert (item.channel, item.seq, item.payload) == ("/slow/live", 1, b"after")
            assert node.metrics.slow_closes.get("native", 0) >= 1

    asyncio.run(body())
