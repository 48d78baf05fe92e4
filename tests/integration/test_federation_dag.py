"""Three real ``hubbub serve`` processes federated into a DAG over native links (``--upstream``).

Topologies (``X ← Y``: Y is linked up to X): the chain A ← B ← C; the fan-in A ← B, A ← C; and both
(A ← B ← C with A ← C, so C reaches A by two paths). On each node two subscribers, ``/t/**`` and
``/t/from-A/**``; every node publishes (acknowledged) to its own channels. Each subscriber must see exactly
the events it matches, from every node, once, in per-channel order. Then the middle node B is killed
(kill -9) while the others keep publishing, and restarted on the same port and data directory: once its
links are back, no acknowledged event is missing anywhere and none is duplicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest

from hubbub.client import AsyncClient, Gap
from hubbub.events import Event

from .serverproc import ServerProcess

WAIT = 60.0
NODES = ("A", "B", "C")
TOPOLOGIES = {
    "chain": {"B": ["A"], "C": ["B"]},
    "fan-in": {"B": ["A"], "C": ["A"]},
    "dag": {"B": ["A"], "C": ["B", "A"]},
}
PATTERNS = ("/t/**", "/t/from-A/**")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Mesh:
    def __init__(self, tmp: Path, links: dict[str, list[str]]) -> None:
        self.tmp = tmp
        self.links = links
        self.ports: dict[str, int] = {}
        self.procs: dict[str, ServerProcess] = {}

    def url(self, node: str) -> str:
        return f"ws://127.0.0.1:{self.ports[node]}"

    def start(self, node: str) -> None:
        """Start ``node``; a restart keeps its port (the URL the nodes below it link up to). A first start
        picks a free port then, and another if a process took it before the node bound it (every test server
        listens on port 0, from the same range): nobody links to the node before it starts."""
        fresh = node not in self.ports
        tries = 5 if fresh else 1
        for attempt in range(tries):
            if fresh:
                self.ports[node] = free_port()
            extra = ["--http-listen", f"127.0.0.1:{self.ports[node]}", "--federation-node-id", node]
            for up in self.links.get(node, []):
                extra += ["--upstream", self.url(up)]
            try:
                # Started within WAIT: at a load of 16-20 a server's imports alone can take over 20 s.
                self.procs[node] = ServerProcess(self.tmp / node, extra).start(timeout=WAIT)
                return
            except RuntimeError as exc:
                if attempt == tries - 1 or "address already in use" not in str(exc):
                    raise

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()

    def federation_log(self) -> str:
        """Every node's federation records and warnings (a failed delivery's first evidence: gaps,
        events not stored, refused subscriptions, the recovery frames sent upstream)."""
        lines = []
        for node, proc in self.procs.items():
            for line in proc.log().splitlines():
                if '"hubbub.federation"' in line or '"level":"warning"' in line or '"level":"error"' in line:
                    lines.append(f"{node}: {line[:600]}")
        return "\n".join(lines[-80:])

    async def stored(self, http: aiohttp.ClientSession, channels: set[str]) -> str:
        """What each running node holds of ``channels`` (``seq:payload`` in log order): tells a link that
        never stored the missing events from a subscriber that skipped events its node stored."""
        lines = []
        for node in self.procs:
            for ch in sorted(channels):
                try:
                    url = f"http://127.0.0.1:{self.ports[node]}/api/v1/log{ch}?limit=1000"
                    async with http.get(url) as r:
                        body = await r.json()
                    got = " ".join(f"{e['seq']}:{e['text']}" for e in body["events"])
                except (aiohttp.ClientError, ValueError, KeyError) as exc:
                    got = f"unreadable: {exc!r}"
                lines.append(f"{node} stores {ch}: {got}")
        return "\n".join(lines)

    async def synced(self, http: aiohttp.ClientSession) -> None:
        """Every link of every node up, subscribed to its node's interest and done recovering. The interest
        must be there (a pattern subscribed upstream): a node restarted before its subscribers came back has
        a link synced to no interest, which says nothing about what it has recovered."""
        deadline = time.monotonic() + WAIT
        while True:
            ok = True
            for node, ups in self.links.items():
                async with http.get(f"http://127.0.0.1:{self.ports[node]}/metrics") as r:
                    text = await r.text()
                flags = re.findall(r"hubbub_federation_link_synced\{[^}]*\} (\S+)", text)
                pats = re.findall(r"hubbub_federation_link_patterns\{[^}]*\} (\S+)", text)
                ok = ok and len(flags) == len(ups) and all(float(f) == 1.0 for f in flags)
                ok = ok and len(pats) == len(ups) and all(float(p) >= 1.0 for p in pats)
            if ok:
                return
            assert time.monotonic() < deadline, "the links did not come up: " + "".join(
                p.log()[-3000:] for p in self.procs.values()
            )
            await asyncio.sleep(0.05)


class Subscriber:
    """One subscription on one node, collecting every event (a gap fails the test)."""

    def __init__(self, node: str, pattern: str) -> None:
        self.node = node
        self.pattern = pattern
        self.events: list[Event] = []
        self.gaps: list[Gap] = []
        self.ready = asyncio.Event()
        self.changed = asyncio.Event()

    async def run(self, client: AsyncClient) -> None:
        async with client.subscribe(self.pattern) as sub:
            self.ready.set()
            async for item in sub:
                if isinstance(item, Gap):
                    self.gaps.append(item)
                else:
                    self.events.append(item)
                self.changed.set()

    def matches(self, channel: str) -> bool:
        return channel.startswith(self.pattern[:-2])

    async def until(
        self, want: set[tuple[str, bytes]], explain: Callable[[set[str]], Awaitable[str]] | None = None
    ) -> None:
        """Wait until every event of ``want`` came; on a timeout, fail with every missing id, the gaps
        received and ``explain`` of the channels missing events."""
        deadline = asyncio.get_running_loop().time() + WAIT
        while not want <= {(e.channel, e.payload) for e in self.events}:
            self.changed.clear()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                missing = want - {(e.channel, e.payload) for e in self.events}
                why = await explain({ch for ch, _ in missing}) if explain is not None else ""
                raise AssertionError(
                    f"{self.node} {self.pattern}: missing {len(missing)}: {sorted(missing)}, "
                    f"gaps {self.gaps}\n{why}"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    def check(self, want: set[tuple[str, bytes]]) -> None:
        got = Counter((e.channel, e.payload) for e in self.events)
        dups = [k for k, n in got.items() if n > 1]
        assert not dups, f"{self.node} {self.pattern}: duplicates {dups[:5]}"
        assert set(got) == want, f"{self.node} {self.pattern}: unexpected {sorted(set(got) - want)[:5]}"
        assert not self.gaps, f"{self.node} {self.pattern}: gaps {self.gaps}"
        last: dict[str, int] = {}
        for e in self.events:
            n = int(e.payload.split(b":")[1])
            assert n > last.get(e.channel, -1), f"{self.node} {self.pattern}: {e.channel} out of order"
            last[e.channel] = n


@contextlib.asynccontextmanager
async def connected(mesh: Mesh, node: str) -> AsyncIterator[AsyncClient]:
    client = await AsyncClient.connect(mesh.url(node))
    try:
        yield client
    finally:
        await client.close()


async def publish_round(
    clients: dict[str, AsyncClient], sent: list[tuple[str, bytes]], start: int, n: int
) -> None:
    """``n`` acknowledged publishes per node, on three channels each, interleaved across nodes."""
    for i in range(start, start + n):
        for node, client in clients.items():
            channel = f"/t/from-{node}/c{i % 3}"
            payload = f"{node}:{i}".encode()
            await client.publish(channel, payload)
            sent.append((channel, payload))


@pytest.mark.slow
@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_three_nodes_deliver_everything_once_in_order_and_survive_a_crash(
    tmp_path: Path, topology: str
) -> None:
    mesh = Mesh(tmp_path, TOPOLOGIES[topology])

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            for node in NODES:
                mesh.start(node)
            subs = [Subscriber(node, pattern) for node in NODES for pattern in PATTERNS]
            async with contextlib.AsyncExitStack() as stack:
                sub_clients = {n: await stack.enter_async_context(connected(mesh, n)) for n in NODES}
                tasks = [asyncio.create_task(s.run(sub_clients[s.node])) for s in subs]
                for s in subs:
                    await asyncio.wait_for(s.ready.wait(), WAIT)
                await mesh.synced(http)
                pubs = {n: await stack.enter_async_context(connected(mesh, n)) for n in NODES}
                sent: list[tuple[str, bytes]] = []
                await publish_round(pubs, sent, 0, 20)

                def wanted(s: Subscriber) -> set[tuple[str, bytes]]:
                    return {(ch, p) for ch, p in sent if s.matches(ch)}

                async def explain(channels: set[str]) -> str:
                    return await mesh.stored(http, channels) + "\n" + mesh.federation_log()

                for s in subs:
                    await s.until(wanted(s), explain)
                    s.check(wanted(s))

                # kill -9 the middle node; the others keep publishing; then B comes back on its port and data.
                mesh.procs["B"].kill()
                await publish_round({n: pubs[n] for n in ("A", "C")}, sent, 20, 15)
                mesh.start("B")
                await mesh.synced(http)
                await publish_round(pubs, sent, 35, 10)  # B's publisher reconnected by itself
                for s in subs:
                    await s.until(wanted(s), explain)
                # Markers last: anything duplicated would have arrived before them.
                marks = [(f"/t/from-{n}/c0", f"{n}:{1000}".encode()) for n in NODES]
                for node, (ch, p) in zip(NODES, marks, strict=True):
                    await pubs[node].publish(ch, p)
                    sent.append((ch, p))
                for s in subs:
                    await s.until(wanted(s), explain)
                    s.check(wanted(s))
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        mesh.stop()


async def metric(http: aiohttp.ClientSession, port: int, pattern: str) -> list[str]:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
        return re.findall(pattern, await r.text())


def test_two_processes_link_both_ways_and_refuse_a_cycle(tmp_path: Path) -> None:
    """``hubbub serve --upstream``: events go up and down one link between two processes, and a third
    process that names itself A and links up to B (below A) is refused at both ends."""
    mesh = Mesh(tmp_path, {"B": ["A"]})

    async def main() -> None:
        async with aiohttp.ClientSession() as http:
            mesh.start("A")
            mesh.start("B")
            up, down = Subscriber("A", "/t/**"), Subscriber("B", "/t/**")
            async with connected(mesh, "A") as ca, connected(mesh, "B") as cb:
                tasks = [asyncio.create_task(up.run(ca)), asyncio.create_task(down.run(cb))]
                await asyncio.wait_for(up.ready.wait(), WAIT)
                await asyncio.wait_for(down.ready.wait(), WAIT)
                await mesh.synced(http)
                await ca.publish("/t/from-A/c0", b"A:0")
                await cb.publish("/t/from-B/c0", b"B:0")
                both = {("/t/from-A/c0", b"A:0"), ("/t/from-B/c0", b"B:0")}
                for s in (up, down):
                    await s.until(both)
                    s.check(both)
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            # A second "A" linking up to B, which is below A: refused by the node itself, and by B (409).
            rogue = ServerProcess(
                tmp_path / "rogue",
                ["--http-listen", "127.0.0.1:0", "--federation-node-id", "A", "--upstream", mesh.url("B")],
            ).start()
            port = rogue.ports["http"]
            try:
                deadline = time.monotonic() + WAIT
                state = r'hubbub_federation_link_state\{link="[^"]+",state="refused"\} (\S+)'
                while await metric(http, port, state) != ["1.0"]:
                    assert time.monotonic() < deadline, rogue.log()[-2000:]
                    await asyncio.sleep(0.05)
            finally:
                rogue.kill()
            headers = {"Hubbub-Federation-Node": "A"}
            try:
                async with http.ws_connect(mesh.url("B") + "/ws/hubbub", protocols=("hubbub.v1.msgpack",),
                                           headers=headers):  # fmt: skip
                    raise AssertionError("B took a link from the node above it")
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 409

    try:
        asyncio.run(main())
    finally:
        mesh.stop()
