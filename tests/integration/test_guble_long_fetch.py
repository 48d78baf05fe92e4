"""Guble fetches longer than 10,000 events (the count they once stopped at) are exact (guble.md §5).

The log is appended straight to the store before the server starts: 25,000 events over the subtree of ``/p``
(``/p`` itself and two channels below it), interleaved with events of ``/pp`` and ``/q``, which the subtree
does not hold. A ``+ /p 0`` must announce exactly the subtree's 25,000 events, send every one in the log's
order, then go live; a fetch without a subscription (``+ /p -20000 0``: the last 20,000) likewise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.events import Event, Publisher
from hubbub.log import DB_FILENAME, AppendRequest, SqliteLogStore
from hubbub.log.base import LogPage
from hubbub.server import Server
from hubbub.server_config import load_config

from .test_guble import connect, recv, serve

SUBTREE = ["/p", "/p/a", "/p/b/c"]
OTHERS = ["/pp", "/q"]
EVENTS = 25_000


@pytest.fixture(scope="module")
def backlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Event]]]:
    """The data directory and the subtree's events, in commit order."""
    data = tmp_path_factory.mktemp("guble-long")
    store = SqliteLogStore(data / DB_FILENAME)
    pub = Publisher("guble", "bulk", "", "")
    inside: list[Event] = []
    try:
        for start in range(0, EVENTS, 5000):
            batch: list[AppendRequest] = []
            for i in range(start, start + 5000):
                batch.append(AppendRequest(SUBTREE[i % 3], pub, str(i).encode(), "application/octet-stream"))
                if i % 5 == 0:
                    batch.append(AppendRequest(OTHERS[i % 2], pub, b"x", "application/octet-stream"))
            inside += [r.event for r in store.append(batch) if r.event.channel in SUBTREE]
    finally:
        store.close()
    assert len(inside) == EVENTS
    yield data, inside


def ids(frames: list[bytes]) -> list[tuple[str, int, bytes]]:
    """(channel, seq, body) of each message frame."""
    out = []
    for f in frames:
        head, _, rest = f.partition(b"\n")
        fields = head.decode().split(",")
        out.append((fields[0], int(fields[1]), rest.rsplit(b"\n", 1)[-1]))
    return out


def expected(events: list[Event]) -> list[tuple[str, int, bytes]]:
    return [(e.channel, e.seq, e.payload) for e in events]


async def block(ws: aiohttp.ClientWebSocketResponse, path: str) -> list[bytes]:
    """A fetch block's message frames, after checking its announced count."""
    start = await recv(ws)
    assert start.startswith(f"#fetch-start {path} ".encode()), start
    n = int(start.rsplit(b" ", 1)[1])
    frames = [await recv(ws) for _ in range(n)]
    assert await recv(ws) == f"#fetch-end {path}".encode()
    return frames


def test_fetch_of_a_subtree_past_10000_events_is_exact(backlog: tuple[Path, list[Event]]) -> None:
    data, inside = backlog

    async def main() -> None:
        async with serve(data) as addr, aiohttp.ClientSession() as http:
            sub, _ = await connect(http, addr, "s")
            await sub.send_str("+ /p 0")
            assert ids(await block(sub, "/p")) == expected(inside)
            assert await recv(sub) == b"#subscribed-to /p"
            pub, _ = await connect(http, addr, "p")
            await pub.send_str("> /q\n\nnot-mine")
            await pub.send_str("> /p/a\n\nlive")
            top = max(e.seq for e in inside if e.channel == "/p/a")
            live = ("/p/a", top + 1, b"live")
            assert ids([await recv(sub)]) == [live]
            everything = [*expected(inside), live]

            last, _ = await connect(http, addr, "l")
            await last.send_str("+ /p -20000 0")
            assert ids(await block(last, "/p")) == everything[-20000:]
            # From seq 3000 of /p itself, every channel of the subtree from that event's time on.
            await last.send_str("+ /p 3000 12000")
            first = next(i for i, e in enumerate(inside) if e.channel == "/p" and e.seq == 3000)
            assert ids(await block(last, "/p")) == everything[first : first + 12000]
            for ws in (sub, pub, last):
                await ws.close()

    asyncio.run(main())


def test_a_fetch_reads_its_events_once(backlog: tuple[Path, list[Event]]) -> None:
    """The count ``#fetch-start`` announces comes from the log's rows, not from reading the events a first
    time: a fetch reads each event of its range once, as it sends it."""
    data, inside = backlog

    async def main() -> None:
        cli = {"data_dir": str(data), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}
        async with Server(load_config(cli=cli, env={})) as server, aiohttp.ClientSession() as http:
            assert server.node is not None
            store = server.node._store
            read = store.read_log
            rows: list[int] = []

            def counting(*args: Any, **kwargs: Any) -> LogPage:
                page = read(*args, **kwargs)
                rows.append(len(page.events))
                return page

            store.read_log = counting  # type: ignore[method-assign]  # a test double
            ws, _ = await connect(http, f"127.0.0.1:{server.ports['http']}", "f")
            await ws.send_str("+ /p 0 0")  # a fetch without a subscription
            got = ids(await block(ws, "/p"))
            # The backlog, and the live event another test of this module may have published.
            assert got[:EVENTS] == expected(inside) and [c for c, _, _ in got[EVENTS:]] in ([], ["/p/a"])
            # The range holds the subtree's events and those of /pp, whose path shares the prefix /p.
            in_range = EVENTS + EVENTS // 10
            assert in_range <= sum(rows) < in_range + 2048
            await ws.close()

    asyncio.run(main())
