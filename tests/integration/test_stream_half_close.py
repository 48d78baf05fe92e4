"""A byte-stream connection whose peer half-closes it (sends its last requests, then shuts its write side)
still gets every answer, in order, then the server's end of stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 10.0
HOST = "127.0.0.1"


def _server(tmp_path: Path, **cli: object) -> Server:
    """A server on a memory store with every stream dialect's listener on a free loopback port."""
    keys = {
        "data_dir": str(tmp_path / "d"),
        "store": "memory",
        "durability": "none",
        "http.listen": f"{HOST}:0",
        **{key: f"{HOST}:0" for key in ("native.tcp_listen", "mist.tcp_listen", "mqtt.tcp_listen")},
        "qpubs.qrpc_listen": f"{HOST}:0",
        **cli,
    }
    return Server(load_config(cli=keys, env={}))


def test_a_half_closed_stream_connection_gets_its_answers_then_the_end(tmp_path: Path) -> None:
    """A peer that sends its last requests and shuts its write side (a half-close) still gets every answer,
    in order, then the server's end of stream: native's hello and pings, mist's pings."""

    async def main() -> None:
        async with _server(tmp_path) as server:
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


#: Per stream dialect: bad input that the server answers (where the dialect has an answer) and ends the
#: connection for, and the start of that answer.
_ENDED_BY_THE_SERVER: dict[str, tuple[bytes, bytes]] = {
    "native": (b'{"op":"hello","id":1,"v":1}\n\xff\xfe not JSON\n', b'"code":4000'),
    "mist": (b"{not JSON\n", b'"error":"Invalid JSON"'),
    "mqtt": (b"\x10\x0d\x00\x04MQTT\x09\x02\x00\x3c\x00\x01c", b"\x20\x02\x00\x01"),  # CONNECT, level 9
    "qrpc": (b"x" * 8192, b""),  # a line over limits.max_frame: closed without an answer
}


@pytest.mark.parametrize("dialect", list(_ENDED_BY_THE_SERVER))
def test_a_connection_the_server_ends_keeps_its_last_answer_for_a_peer_still_sending(
    tmp_path: Path, dialect: str
) -> None:
    """A peer that goes on sending after its bad input, and reads later, still reads the server's answer
    and then the end of the stream: the server shuts its side and reads on (dropping) until the peer ends
    its own, rather than close a socket with bytes unread, which the kernel answers with a reset that takes
    the answer with it (the peer's read fails instead)."""
    bad, answer = _ENDED_BY_THE_SERVER[dialect]

    async def main() -> None:
        async with _server(tmp_path, **{"limits.max_frame": 4096}) as server:
            node = server.node
            assert node is not None
            reader, writer = await asyncio.open_connection(HOST, server.ports[dialect])
            writer.write(bad + b"x" * (1 << 20))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            await asyncio.sleep(0.3)  # the server has ended the connection, with bytes of ours unread
            got = await asyncio.wait_for(reader.read(), WAIT)  # up to the server's end of stream
            assert answer in got, got[:300]
            # The session has left the node while the socket waits for our end (rosters, limits).
            await _until(lambda: not node.sessions, "the session ended")
            writer.close()

    asyncio.run(main())


async def _until(cond: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not cond():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.01)
