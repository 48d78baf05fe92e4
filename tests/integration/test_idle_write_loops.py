"""An idle connection of every dialect holds no task for its write loop: the pump parks on its session once
the queue is empty (``SessionPump.start``) and a frame queued later still goes out (native's own test is
``test_native_idle.py``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import msgpack

from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 10.0
HOST = "127.0.0.1"


def _write_loops() -> int:
    """The tasks running a connection's write loop."""
    coros = (t.get_coro() for t in asyncio.all_tasks())
    return sum(1 for c in coros if getattr(c, "__qualname__", "") == "SessionPump.run")


async def _no_write_loops() -> None:
    """Return once no task runs a connection's write loop; fail after ``WAIT`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while _write_loops():
        assert loop.time() < deadline, f"{_write_loops()} write loops left"
        await asyncio.sleep(0.01)


def test_idle_connections_of_every_dialect_hold_no_write_task(tmp_path: Path) -> None:
    cli = {
        "data_dir": str(tmp_path / "d"),
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "mist.tcp_listen": f"{HOST}:0",
    }

    async def main() -> None:
        async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
            base = f"ws://{HOST}:{server.ports['http']}"
            # Each connection gets a reply (its greeting, a pong), so its writer ran once, then parked.
            ivy = await http.ws_connect(f"{base}/ws", protocols=("ivy1",))
            assert (await ivy.receive_str(timeout=WAIT)).startswith("@")
            await ivy.send_str("@")
            assert (await ivy.receive_str(timeout=WAIT)).startswith("##@")
            guble = await http.ws_connect(f"{base}/stream/")
            assert (await guble.receive(timeout=WAIT)).data.startswith(b"#")
            wear = await http.ws_connect(f"{base}/wearscript/ws")
            assert msgpack.unpackb((await wear.receive(timeout=WAIT)).data)[0] == "subscriptions"  # the hub's
            mist = await http.ws_connect(f"{base}/mist/v1/ws")
            await mist.send_str('{"command":"ping"}')
            assert await mist.receive_str(timeout=WAIT) == '{"command":"ping","data":"pong"}\n'
            reader, writer = await asyncio.open_connection(HOST, server.ports["mist"])
            writer.write(b"ping\n")
            assert await asyncio.wait_for(reader.readline(), WAIT) == b"pong\n"

            await _no_write_loops()

            # A parked writer starts again for what is queued later.
            await ivy.send_str("@")
            assert (await ivy.receive_str(timeout=WAIT)).startswith("##@")
            await mist.send_str('{"command":"ping"}')
            assert json.loads(await mist.receive_str(timeout=WAIT)) == {"command": "ping", "data": "pong"}
            writer.write(b"ping\n")
            assert await asyncio.wait_for(reader.readline(), WAIT) == b"pong\n"
            await _no_write_loops()

            for ws in (ivy, guble, wear, mist):
                await ws.close()
            writer.close()

    asyncio.run(main())
