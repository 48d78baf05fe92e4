"""A stopping server ends every TCP connection it holds, also one whose peer stopped reading: the connection's
task is over and its socket closed when ``Server`` exits (native, mist, qrpc: every TCP listener).

Such a connection outlasts the server's grace period (its close waits for the peer to take what is buffered)
and is cancelled; its socket must still be closed then, not left to the garbage collector, which reports it as
a ``ResourceWarning`` in whichever test happens to run at that moment."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings
from pathlib import Path

import aiohttp
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

HOST = "127.0.0.1"
#: What each dialect's subscriber sends to follow channel /big (where a tag ``big`` goes with each event).
SUBSCRIBE = {
    "native": b'{"op":"hello","id":1,"v":1}\n{"op":"subscribe","id":2,"sub":"s","pattern":"/big"}\n',
    "mist": b"subscribe big\n",
    "qrpc": b'{"v":1,"id":"c1","n":"listen","m":{"topic":"big"}}\n',
}
EVENT = b"x" * 65536


@pytest.mark.parametrize("dialect", sorted(SUBSCRIBE))
def test_a_peer_that_stopped_reading_has_its_socket_closed_when_the_server_stops(
    dialect: str, tmp_path: Path
) -> None:
    leftover: list[str] = []

    async def main() -> None:
        cfg = load_config({"data_dir": str(tmp_path)}, env={})
        async with Server(cfg) as server, aiohttp.ClientSession() as http:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once: server writes wait
            sock.connect((HOST, server.ports[dialect]))
            reader, writer = await asyncio.open_connection(sock=sock)
            writer.write(SUBSCRIBE[dialect])
            await writer.drain()
            base = f"http://{HOST}:{server.ports['http']}"
            # 6.4 MiB of events for a peer that reads one byte: the server's write to it waits at its stop.
            for _ in range(100):
                async with http.post(f"{base}/api/v1/publish/big?tag=big", data=EVENT) as r:
                    assert r.status == 200, await r.text()
            assert await asyncio.wait_for(reader.read(1), 10)  # subscribed: events (or replies) came
        # The server is gone: none of its connections' tasks runs on, and the peer sees its socket closed.
        leftover.extend(repr(t) for t in asyncio.all_tasks() if t is not asyncio.current_task())
        try:
            while await asyncio.wait_for(reader.read(1 << 20), 10):
                pass
        except ConnectionResetError:
            pass
        writer.close()
        await writer.wait_closed()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(main())
        gc.collect()
    assert leftover == [], "\n".join(leftover)
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
