"""A wildcard subscriber far behind recovers exactly from the log, over every native transport.

The backlog is appended straight to the store before the server starts (one shared server for the module):
1,000 channels with one event each (the subscriber's positions), then ``BEHIND`` more events round-robin over
them, more than the 10,000 a replay was once limited to. Each transport's subscriber resumes ``/**`` from
those positions and must get every later event once, each channel in seq order, the whole in commit order,
then live events after them. (The 200,000-event figure is ``bench/wide_recovery.py``: 30,000 keeps this
module at a few seconds.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from hubbub.client import AsyncClient
from hubbub.config import load_config
from hubbub.events import Event, Position, Publisher
from hubbub.log import DB_FILENAME, AppendRequest, SqliteLogStore
from hubbub.server import Server

CHANNELS = 1000
BEHIND = 30_000
WAIT = 60.0


def channel(i: int) -> str:
    return f"/w/c{i:04d}"


@pytest.fixture(scope="module")
def backlog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Event], list[Event]]]:
    """The data directory, the first event of every channel, and the ``BEHIND`` events after them."""
    data = tmp_path_factory.mktemp("wide")
    store = SqliteLogStore(data / DB_FILENAME)
    pub = Publisher("native", "", "bulk", "")
    try:
        firsts = [
            r.event
            for r in store.append(
                [AppendRequest(channel(i), pub, b"0", "text/plain") for i in range(CHANNELS)]
            )
        ]
        later: list[Event] = []
        for start in range(0, BEHIND, 5000):
            batch = [
                AppendRequest(channel(i % CHANNELS), pub, str(i).encode(), "text/plain")
                for i in range(start, start + 5000)
            ]
            later += [r.event for r in store.append(batch)]
    finally:
        store.close()
    yield data, firsts, later


@contextlib.asynccontextmanager
async def serve(data: Path) -> AsyncIterator[Server]:
    cfg = load_config(
        cli={"data_dir": str(data), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}, env={}
    )
    async with Server(cfg) as server:
        yield server


def check(got: list[tuple[str, int, str]], later: list[Event]) -> None:
    """Every event of ``later`` once, in commit order (so each channel in seq order), nothing else."""
    want = [(e.channel, e.seq, e.payload.decode()) for e in later]
    assert len(got) == len(want)
    assert got == want


@pytest.mark.parametrize("transport", ["ws", "tcp"])
def test_wildcard_subscriber_far_behind_recovers_exactly(
    backlog: tuple[Path, list[Event], list[Event]], transport: str
) -> None:
    data, firsts, later = backlog

    async def body() -> None:
        async with serve(data) as server:
            url = (
                f"ws://127.0.0.1:{server.ports['http']}"
                if transport == "ws"
                else f"tcp://127.0.0.1:{server.ports['native']}"
            )
            since = {e.channel: Position(e.seq, e.epoch) for e in firsts}
            async with AsyncClient.connect(url) as client, client.subscribe("/**", since=since) as sub:
                got: list[tuple[str, int, str]] = []
                while len(got) < BEHIND:
                    ev = await sub.get(WAIT)
                    assert isinstance(ev, Event), ev
                    got.append((ev.channel, ev.seq, ev.payload.decode()))
                check(got, later)
                await client.publish(f"/live/{transport}", "after")
                ev = await sub.get(WAIT)
                assert isinstance(ev, Event)
                assert (ev.channel, ev.seq, ev.payload) == (f"/live/{transport}", 1, b"after")

    asyncio.run(body())


def test_sse_last_event_id_far_behind_recovers_exactly(
    backlog: tuple[Path, list[Event], list[Event]],
) -> None:
    """An SSE stream of ``/**`` resumed from the id of the last event before the backlog."""
    data, firsts, later = backlog
    last = firsts[-1]

    async def body() -> None:
        async with serve(data) as server, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.ports['http']}/api/v1/stream/**"
            headers = {"Last-Event-ID": f"{last.time_ns}:{last.epoch}:{last.seq}:{last.channel}"}
            got: list[tuple[str, int, str]] = []
            async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=WAIT)) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    if line.startswith(b"event: gap"):
                        raise AssertionError("gap")
                    if line.startswith(b"data: ") and b'"seq"' in line:
                        obj = orjson.loads(line[6:])
                        got.append((obj["channel"], obj["seq"], obj["text"]))
                        if len(got) == BEHIND:
                            break
            check(got, later)

    asyncio.run(body())
