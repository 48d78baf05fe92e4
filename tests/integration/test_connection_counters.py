"""Counters of connections on ``/metrics`` (docs/operations.md): events dropped by the overflow policy stay
counted once their connections close, and a TCP peer aborted by the write timeout is counted."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from hubbub.core import Session
from hubbub.core.session import Overflow
from hubbub.events import Event, Publisher
from hubbub.server import Server
from hubbub.server_config import load_config

HOST = "127.0.0.1"
WAIT = 10.0


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **extra: str) -> AsyncIterator[tuple[Server, aiohttp.ClientSession]]:
    cli = {"data_dir": str(tmp_path / "d"), "http.listen": f"{HOST}:0", "native.tcp_listen": f"{HOST}:0"}
    cli.update(extra)
    async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
        yield server, http


async def counter(server: Server, http: aiohttp.ClientSession, name: str, dialect: str) -> float | None:
    """The value of ``name{dialect=...}`` on the server's ``/metrics``, or None when it is not there."""
    async with http.get(f"http://{HOST}:{server.ports['http']}/metrics") as r:
        text = await r.text()
    m = re.search(rf'^{name}{{dialect="{dialect}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


class Enc:
    key = "test"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return event.payload


def test_dropped_events_stay_counted_after_their_connection_closes(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as (server, http):
            node = server.node
            assert node is not None
            sess = Session("mist2015", Enc(), max_items=4, max_bytes=1 << 20, overflow=Overflow.DROP_OLDEST)
            node.attach(sess)
            for i in range(10):
                ev = Event("/d", i + 1, "e", i, Publisher("mist2015"), b"%d" % i, "text/plain")
                sess.deliver(ev, [], {})
            assert sess.stats.dropped == 6
            assert await counter(server, http, "hubbub_dropped_total", "mist2015") == 6
            node.detach(sess)
            assert await counter(server, http, "hubbub_dropped_total", "mist2015") == 6

    asyncio.run(main())


def test_a_tcp_peer_that_reads_nothing_is_aborted_and_counted(tmp_path: Path) -> None:
    """A native TCP subscriber that stops reading while its queue stays within its bounds (a few large events)
    is aborted once a write has waited ``limits.write_timeout_s``; the abort is counted, and the connection
    gives back its session."""

    async def main() -> None:
        async with serve(tmp_path, **{"limits.write_timeout_s": "1"}) as (server, http):
            node = server.node
            assert node is not None
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little for it
            sock.connect((HOST, server.ports["native"]))
            reader, stalled = await asyncio.open_connection(sock=sock)
            stalled.write(
                b'{"op":"hello","id":0,"v":1}\n{"op":"subscribe","id":1,"sub":"s","pattern":"/w"}\n'
            )
            await asyncio.wait_for(reader.readline(), WAIT)
            await asyncio.wait_for(reader.readline(), WAIT)  # subscribed; from here on it reads nothing
            assert await counter(server, http, "hubbub_write_timeouts_total", "native") == 0
            url = f"http://{HOST}:{server.ports['http']}/api/v1/publish/w"
            for _ in range(20):  # 4 MB in 20 events: far within the queue's bounds, far beyond the sockets'
                async with http.post(url, data=b"z" * 200_000) as r:
                    assert r.status == 200
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT
            while node.sessions:
                assert loop.time() < deadline, "the stalled connection was never aborted"
                await asyncio.sleep(0.05)
            assert await counter(server, http, "hubbub_write_timeouts_total", "native") == 1
            assert node.metrics.slow_closes == {}
            stalled.close()

    asyncio.run(main())
