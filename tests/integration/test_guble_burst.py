"""Guble subscribers under a publish burst: several connections on one channel, each with the same
receiver id (``g1``), get every message exactly once and in order, catch-ups from the log included, however
fast each one reads. A real server on a loopback port, with a small send queue, so that the reader that
pauses overflows it and its connection catches up from the log."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from hubbub.core import Session
from hubbub.server import Server
from hubbub.server_config import load_config

WAIT = 30.0
N = 3000
#: Large enough that 3000 of them outgrow the socket buffers between the server and a reader that pauses.
PAYLOAD = b"x" * 4000
SEND_QUEUE = 128
#: Publishes in flight at most: a commit then takes fewer events than a catch-up may hold while it replays
#: (4 x send_queue), so a connection that reads is never closed as a stalled one.
WINDOW = 64

WS = aiohttp.ClientWebSocketResponse


@contextlib.asynccontextmanager
async def serve(data_dir: Path, **extra: str) -> AsyncIterator[tuple[Server, str]]:
    cli = {"data_dir": str(data_dir), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}
    cli.update(extra)
    async with Server(load_config(cli=cli, env={})) as server:
        yield server, f"127.0.0.1:{server.ports['http']}"


async def recv(ws: WS) -> bytes:
    msg = await asyncio.wait_for(ws.receive(), WAIT)
    assert msg.type == aiohttp.WSMsgType.BINARY, msg
    data: bytes = msg.data
    return data


def ids_of(frames: list[bytes], path: bytes) -> list[int]:
    """The message ids of the event frames (``<path>,<id>,...``) among ``frames``, in order."""
    return [int(f.split(b",", 2)[1]) for f in frames if f.startswith(path + b",")]


async def subscriber(http: aiohttp.ClientSession, addr: str, user: str) -> WS:
    ws = await http.ws_connect(f"ws://{addr}/stream/user/{user}", max_msg_size=0)
    assert (await recv(ws)).startswith(b"#connected")
    await ws.send_str("+ /fx")
    assert await recv(ws) == b"#subscribed-to /fx"
    return ws


def watch_catch_ups(sess: Session) -> asyncio.Event:
    """An event set when ``sess`` switches to catch-up (the connection's own handler still does the work)."""
    switched = asyncio.Event()
    handler = sess.on_catch_up
    assert handler is not None

    def observed() -> None:
        switched.set()
        handler()

    sess.on_catch_up = observed
    return switched


async def publish(pub: WS, published: asyncio.Event) -> None:
    """Send N messages back to back, at most WINDOW of them unacknowledged."""
    window = asyncio.Semaphore(WINDOW)

    async def acks() -> None:
        for _ in range(N):
            assert await recv(pub) == b"#send"
            window.release()
        published.set()

    reader = asyncio.ensure_future(acks())
    for _ in range(N):
        await window.acquire()
        await pub.send_bytes(b"> /fx\n\n" + PAYLOAD)
    await reader


async def read_all(ws: WS, pause_until: list[asyncio.Event]) -> list[bytes]:
    """Every frame up to the event with id N (or the close, as a last pseudo-frame). With ``pause_until``,
    nothing is read before one of those events is set."""
    if pause_until:
        waits = [asyncio.ensure_future(e.wait()) for e in pause_until]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
    frames: list[bytes] = []
    while ids_of(frames[-1:], b"/fx") != [N]:
        msg = await asyncio.wait_for(ws.receive(), WAIT)
        if msg.type != aiohttp.WSMsgType.BINARY:
            frames.append(repr(msg).encode())
            break
        frames.append(msg.data)
    return frames


def test_burst_reaches_every_guble_subscriber_once_in_order(tmp_path: Path) -> None:
    """Three subscribers to ``/fx`` (one of them pausing its reads until its connection has switched to
    catch-up), and a fourth connection sends 3000 messages: each subscriber gets ids 1..3000 exactly once, in
    order, with each catch-up's fetch block in between."""

    async def main() -> None:
        extra = {"limits.send_queue": str(SEND_QUEUE), "store": "memory"}
        async with serve(tmp_path / "d", **extra) as (server, addr), aiohttp.ClientSession() as http:
            assert server.node is not None
            subs = [await subscriber(http, addr, user) for user in ("fast1", "slow", "fast2")]
            slow = next(s for s in server.node.sessions if s.user == "slow")
            switched = watch_catch_ups(slow)
            pub = await http.ws_connect(f"ws://{addr}/stream/user/pub")
            assert (await recv(pub)).startswith(b"#connected")
            published = asyncio.Event()
            _, *got = await asyncio.gather(
                publish(pub, published),
                read_all(subs[0], []),
                read_all(subs[1], [switched, published]),
                read_all(subs[2], []),
            )
            assert switched.is_set(), "the paused reader's queue never overflowed: the test proves nothing"
            for frames in got:
                ids = ids_of(frames, b"/fx")
                out_of_order = sum(a >= b for a, b in itertools.pairwise(ids))
                assert ids == list(range(1, N + 1)), (
                    f"{len(ids)} events, {len(ids) - len(set(ids))} duplicates, {out_of_order} out of order, "
                    f"last frame {frames[-1]!r:.80}"
                )
                # Each catch-up is framed like a fetch, and ends live again.
                assert frames.count(b"#fetch-end /fx") == frames.count(b"#subscribed-to /fx")
            assert got[1].count(b"#fetch-end /fx") >= 1
            for ws in (*subs, pub):
                await ws.close()

    asyncio.run(main())
