"""A wildcard subscriber far behind recovers exactly from the log, over every native transport.

The backlog is appended straight to the store before the server starts (one shared server for the module):
1,000 channels with one event each (the subscriber's positions), then 30,000 more events round-robin over
them, more than the 10,000 a replay was once limited to, and for the WebSocket (marked slow) 200,000. Each
transport's subscriber resumes ``/**`` from those positions and must get every later event once, each
channel in seq order, the whole in commit order, then live events after them. 30,000 take about a second
per transport, 200,000 about eight.
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
from hubbub.events import Event, Position, Publisher
from hubbub.log import DB_FILENAME, AppendRequest, SqliteLogStore
from hubbub.server import Server
from hubbub.server_config import load_config

CHANNELS = 1000
WAIT = 60.0

#: One worker builds each backlog once (200,000 events take about 3 s to append and 40 MB to hold).
pytestmark = pytest.mark.xdist_group("wide_recovery")

#: (channel, seq, payload text) of the events behind, in commit order.
Want = list[tuple[str, int, str]]


def channel(i: int) -> str:
    return f"/w/c{i:04d}"


#: The backlogs a test asks for (``indirect``): each is built once for the module.
SMALL, LARGE = 30_000, 200_000


@pytest.fixture(scope="module")
def backlog(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[tuple[Path, list[Event], Want]]:
    """The data directory, the first event of every channel, and the ``request.param`` events after them."""
    behind: int = request.param
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
        later: Want = []
        for start in range(0, behind, 5000):
            batch = [
                AppendRequest(channel(i % CHANNELS), pub, str(i).encode(), "text/plain")
                for i in range(start, start + 5000)
            ]
            later += [(r.event.channel, r.event.seq, r.event.payload.decode()) for r in store.append(batch)]
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


def check(got: Want, later: Want) -> None:
    """Every event of ``later`` once, in commit order (so each channel in seq order), nothing else."""
    assert len(got) == len(later)
    assert got == later


# The paging that recovery runs without a ceiling is the core's, one for every transport: each transport
# recovers the smaller backlog, and the WebSocket (the browsers' path) the larger one too.
@pytest.mark.parametrize(
    ("backlog", "transport"),
    [(SMALL, "ws"), (SMALL, "tcp"), pytest.param(LARGE, "ws", marks=pytest.mark.slow)],
    indirect=["backlog"],
)
def test_wildcard_subscriber_far_behind_recovers_exactly(
    backlog: tuple[Path, list[Event], Want], transport: str
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
                got: Want = []
                while len(got) < len(later):
                    ev = await sub.get(WAIT)
                    assert isinstance(ev, Event), ev
                    got.append((ev.channel, ev.seq, ev.payload.decode()))
                check(got, later)
                await client.publish(f"/live/{transport}", "after")
                ev = await sub.get(WAIT)
                assert isinstance(ev, Event)
                assert (ev.channel, ev.seq, ev.payload) == (f"/live/{transport}", 1, b"after")

    asyncio.run(body())


@pytest.mark.parametrize("backlog", [SMALL], indirect=True)
def test_sse_last_event_id_far_behind_recovers_exactly(
    backlog: tuple[Path, list[Event], Want],
) -> None:
    """An SSE stream of ``/**`` resumed from the id of the last event before the backlog."""
    data, firsts, later = backlog
    last = firsts[-1]

    async def body() -> None:
        async with serve(data) as server, aiohttp.ClientSession() as http:
            url = f"http://127.0.0.1:{server.ports['http']}/api/v1/stream/**"
            headers = {"Last-Event-ID": f"{last.time_ns}:{last.epoch}:{last.seq}:{last.channel}"}
            got: Want = []
            async with http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=WAIT)) as resp:
                assert resp.status == 200
                async for line in resp.content:
                    if line.startswith(b"event: gap"):
                        raise AssertionError("gap")
                    if line.startswith(b"data: ") and b'"seq"' in line:
                        obj = orjson.loads(line[6:])
                        got.append((obj["channel"], obj["seq"], obj["text"]))
                        if len(got) == len(later):
                            break
            check(got, later)

    asyncio.run(body())
