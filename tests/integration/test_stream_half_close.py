"""A byte-stream connection whose peer half-closes it (sends its last requests, then shuts its write side)
still gets every answer, in order, then the server's end of stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 10.0
HOST = "127.0.0.1"


def test_a_half_closed_stream_connection_gets_its_answers_then_the_end(tmp_path: Path) -> None:
    """A peer that sends its last requests and shuts its write side (a half-close) still gets every answer,
    in order, then the server's end of stream: native's hello and pings, mist's pings."""
    cli = {
        "data_dir": str(tmp_path / "d"),
        "store": "memory",
        "durability": "none",
        "http.listen": f"{HOST}:0",
        "native.tcp_listen": f"{HOST}:0",
        "mist.tcp_listen": f"{HOST}:0",
    }

    async def main() -> None:
        async with Server(load_config(cli=cli, env={})) as server:
            nr, nw = await asyncio.open_connection(HOST, server.ports["native"])
            pings = b"".join(b'{"op":"ping","id":%d}\n' % i for i in range(2, 40))
            nw.write(b'{"op":"hello","id":1,"v":1}\n' + pings)
            nw.write_eof()
            got = await asyncio.wait_for(nr.read(), WAIT)  # up to the server's end of stream
            assert [orjson.loads(x)["id"] for x in got.splitlines()] == list(range(1, 40))
            nw.close()
            mr, mw = await asyncio.open_connection(HOST, server.ports["mist"])
            mw.write(b"ping\n" * 20)
            mw.write_eof()
            assert await asyncio.wait_for(mr.read(), WAIT) == b"pong\n" * 20
            mw.close()

    asyncio.run(main())
