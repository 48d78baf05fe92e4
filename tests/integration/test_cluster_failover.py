"""A wildcard subscriber fails over between real cluster nodes: three ``hubbub serve`` processes on one
PostgreSQL and one Redis, publishers on two of them, a Python-client ``/**`` subscriber on the third, which
is killed -9 under load. The subscriber resumes on another node with its positions and gets every
acknowledged event once, each channel in seq order."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from hubbub.client import AsyncClient
from hubbub.errors import HubbubError
from hubbub.events import Event, Position
from tests.redisserver import RedisServer

from .nativelines import Lines
from .serverproc import ServerProcess

#: Three server processes, PostgreSQL and Redis: tens of seconds on an idle machine, minutes on a loaded one,
#: where the suite's 120 s would end it for the machine's pace (WAIT bounds a hang).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHANNELS = 100
#: Events the subscriber gets on node 3 before the kill, and each publisher publishes after the resume.
BEFORE_KILL = 800
AFTER_RESUME = 500
#: Seconds without progress (an event, an acknowledgement) that make a hang: a bound on waiting, never on the
#: test's time, which a loaded machine stretches.
WAIT = 60.0


def _node(tmp: Path, name: str, pg_url: str, redis: RedisServer) -> ServerProcess:
    return ServerProcess(
        tmp / name,
        [
            "--store", pg_url, "--broker", redis.url, "--cluster-node-id", name,
            "--cluster-gap-wait-s", "0.05", "--cluster-poll-interval-s", "0.2",
        ],
    ).start()  # fmt: skip


class Publisher(threading.Thread):
    """Acknowledged publishes to ``CHANNELS`` channels round-robin, one at a time, until ``stop``."""

    def __init__(self, port: int, tag: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.tag, self.stop = port, tag, stop
        self.acked: dict[tuple[str, int], str] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Lines(self.port, timeout=WAIT) as c:
                i = 0
                while not self.stop.is_set():
                    ch, text = f"/f/c{i % CHANNELS:03d}", f"{self.tag}{i}"
                    self.acked[(ch, int(c.publish(ch, text)["seq"]))] = text
                    i += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_a_wildcard_subscriber_fails_over_to_another_node_killed_minus_9_under_load(
    tmp_path: Path, pg_url: str, redis_server: RedisServer
) -> None:
    nodes = [_node(tmp_path, n, pg_url, redis_server) for n in ("n1", "n2", "n3")]
    n1, n2, n3 = nodes
    stop = threading.Event()
    pubs = [Publisher(n1.ports["native"], "a", stop), Publisher(n2.ports["native"], "b", stop)]
    got: dict[str, list[tuple[int, str]]] = {}
    positions: dict[str, Position] = {}

    def take(ev: Event | object) -> None:
        assert isinstance(ev, Event), ev
        got.setdefault(ev.channel, []).append((ev.seq, ev.payload.decode()))
        positions[ev.channel] = Position(ev.seq, ev.epoch)

    async def body() -> None:
        t0 = time.time_ns()
        first = await AsyncClient.connect(f"ws://127.0.0.1:{n3.ports['http']}", reconnect=False)
        try:
            sub = first.subscribe("/**")
            await sub
            for p in pubs:
                p.start()
            for _ in range(BEFORE_KILL):
                take(await sub.get(WAIT))
            n3.kill()  # -9, with events on their way to the subscriber
            with pytest.raises((HubbubError, ConnectionError, OSError)):
                while True:
                    item = await sub.get(WAIT)
                    if item is None:
                        raise ConnectionError("ended")
                    take(item)
        finally:
            await first.close()
        # Node 1, from the positions the subscriber has (channels it has no event of: from when it started).
        async with (
            AsyncClient.connect(f"ws://127.0.0.1:{n1.ports['http']}") as again,
            again.subscribe("/**", since=dict(positions), from_time=t0) as sub2,
        ):
            marks = [len(p.acked) for p in pubs]
            loop = asyncio.get_running_loop()
            moved, progress = loop.time(), (0, 0)
            while any(len(p.acked) < m + AFTER_RESUME for p, m in zip(pubs, marks, strict=True)):
                assert all(p.is_alive() for p in pubs), [p.error for p in pubs]
                if (now := (sum(map(len, got.values())), sum(len(p.acked) for p in pubs))) != progress:
                    moved, progress = loop.time(), now
                assert loop.time() < moved + WAIT, f"no event and no acknowledgement for {WAIT} s: {now}"
                while True:  # read what is there meanwhile (the publishers go on meanwhile)
                    try:
                        take(await sub2.get(0.05))
                    except TimeoutError:
                        break
            stop.set()
            for p in pubs:
                p.join(WAIT)
                assert p.error is None, p.error
            want = {k: v for p in pubs for k, v in p.acked.items()}
            while sum(map(len, got.values())) < len(want):
                take(await sub2.get(WAIT))

    try:
        asyncio.run(body())
    finally:
        stop.set()
        for n in nodes:
            n.kill()
    want = {k: v for p in pubs for k, v in p.acked.items()}
    tops = {ch: max(s for c, s in want if c == ch) for ch, _ in want}
    for ch, evs in got.items():
        # Once each, in order: seq 1 up to the channel's last acknowledged event, each with its text.
        assert [s for s, _ in evs] == list(range(1, tops[ch] + 1)), ch
        assert all(want[(ch, s)] == t for s, t in evs), ch
    assert set(got) == set(tops)
