"""Native federation links between two hubbub nodes in one process (``upstream``): events both ways, with
their publisher and without the hop headers for ordinary subscribers, nothing back over the link, interest
that follows the subscriptions, the metrics of both ends, and cycles refused at either end."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.client import AsyncClient
from hubbub.config import Config
from hubbub.events import Event, Position
from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports import federation_link
from hubbub.transports.federation_flow import LinkCursors
from hubbub.transports.federation_link import FederationUpstream

WAIT = 15.0


def config(tmp: Path, name: str, *upstream: str, keys: dict[str, object] | None = None) -> Config:
    """Node ``name``'s configuration, linked up to ``upstream``, with ``keys`` (dotted) set too."""
    cli = {
        "data_dir": str(tmp / name),
        "http.listen": "127.0.0.1:0",
        "native.tcp_listen": "127.0.0.1:0",
        "federation.node_id": name,
        "upstream": list(upstream),
    }
    return load_config({**cli, **(keys or {})}, env={})


def url(server: Server) -> str:
    return f"ws://127.0.0.1:{server.ports['http']}"


async def until(check: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def synced(*links: FederationUpstream) -> None:
    await until(lambda: all(link.synced for link in links), "the links to follow the subscriptions")


async def metrics(server: Server) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{server.ports['http']}/metrics") as r,
    ):
        return await r.text()


async def log(server: Server, channel: str) -> list[Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{server.ports['http']}/api/v1/log{channel}?limit=1000") as r,
    ):
        body = await r.json()
    events: list[Any] = body["events"]
    return events


@contextlib.asynccontextmanager
async def client(server: Server) -> AsyncIterator[AsyncClient]:
    c = await AsyncClient.connect(url(server))
    try:
        yield c
    finally:
        await c.close()


async def take(sub: Any, n: int) -> list[Event]:
    it = sub.__aiter__()
    return [await asyncio.wait_for(it.__anext__(), WAIT) for _ in range(n)]


def test_events_cross_a_link_both_ways_once_with_their_publisher(tmp_path: Path) -> None:
    async def main() -> None:
        async with Server(config(tmp_path, "A")) as a, Server(config(tmp_path, "B", url(a))) as b:
            link = b.upstreams[0]
            async with client(a) as ca, client(b) as cb:
                async with cb.subscribe("/down/**") as below, ca.subscribe("/up/**") as above:
                    await synced(link)
                    assert set(link.wanted()) == {"/down/**"}
                    # Up: everything published below goes up; down: only what someone below listens to.
                    await ca.publish("/down/1", "a1", headers={"k": "v"})
                    await ca.publish("/other/1", "not wanted below")
                    await cb.publish("/up/1", "b1", tags=["t"])
                    await cb.publish("/down/2", "b2")  # published below: below sees it once, above keeps it
                    got_below = await take(below, 2)
                    got_above = await take(above, 1)
                    assert [(e.channel, e.payload) for e in got_below] == [
                        ("/down/1", b"a1"),
                        ("/down/2", b"b2"),
                    ]
                    assert got_below[0].headers == {"k": "v"}  # the hop headers are not shown
                    assert got_below[0].publisher.dialect == "native"
                    assert (got_above[0].channel, got_above[0].payload, got_above[0].tags) == (
                        "/up/1",
                        b"b1",
                        ("t",),
                    )
                    # Nothing came back: the last event each side sees is a marker published after.
                    await ca.publish("/down/3", "a3")
                    assert [e.payload for e in await take(below, 1)] == [b"a3"]
                # The subscriptions are gone: the link unsubscribes upstream.
                await synced(link)
                assert link.wanted() == {}
                assert [e["text"] for e in await log(a, "/down/2")] == ["b2"]  # went up once
            text = await metrics(b)
            assert re.search(r'hubbub_federation_link_up\{link="fed-[^"]+",upstream="A"\} 1.0', text)
            # Up: /up/1 and /down/2, nothing else; down: /down/1 and /down/3, not /down/2 back again.
            assert re.search(r'link_events_total\{direction="up",link="[^"]+"\} 2.0', text)
            assert re.search(r'link_events_total\{direction="down",link="[^"]+"\} 2.0', text)
            text = await metrics(a)
            assert 'hubbub_federation_peer_up{peer="B"} 1.0' in text

    asyncio.run(main())


def test_a_link_that_would_close_a_cycle_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with Server(config(tmp_path, "A")) as a, Server(config(tmp_path, "B", url(a))) as b:
            await until(lambda: b.upstreams[0].state == "up", "B's link up")
            # A linking up to B, which is below it: B reports A above it; A refuses, B would answer 409.
            async with Server(config(tmp_path / "again", "A", url(b))) as a2:
                await until(lambda: a2.upstreams[0].state == "refused", "the cycle refused")
            # A node linking to itself is refused too.
            async with Server(config(tmp_path / "self", "A", url(a))) as a3:
                await until(lambda: a3.upstreams[0].state == "refused", "the self-link refused")
            # And the upstream end answers 409 to a node above it.
            headers = {"Hubbub-Federation-Node": "A", "Sec-WebSocket-Protocol": "hubbub.v1.msgpack"}
            async with aiohttp.ClientSession() as http:
                try:
                    async with http.ws_connect(url(b) + "/ws/hubbub", headers=headers):
                        raise AssertionError("the upgrade should have been refused")
                except aiohttp.WSServerHandshakeError as exc:
                    assert exc.status == 409

    asyncio.run(main())


#: Channels and events per channel of the long backlogs: 12,000 events, more than a link's replay once held
#: in memory (10,000, then rounds that reconnected the link).
LONG_CHANNELS = 300
LONG_ROUNDS = 40


async def publish_long(c: AsyncClient, prefix: str) -> None:
    """``LONG_ROUNDS`` rounds of one event to each of ``LONG_CHANNELS`` channels, payload the round."""
    for r in range(LONG_ROUNDS):
        await asyncio.gather(*(c.publish(f"{prefix}{i}", str(r)) for i in range(LONG_CHANNELS)))


async def check_long(server: Server, prefix: str, before: dict[str, list[str]] | None = None) -> None:
    """``server`` holds every event of :func:`publish_long` once, each channel in order (after ``before``)."""
    want = {f"{prefix}{i}": [str(r) for r in range(LONG_ROUNDS)] for i in range(LONG_CHANNELS)}
    for ch, first in (before or {}).items():
        want[ch] = first + want[ch]
    total = sum(len(v) for v in want.values())
    got: dict[str, list[str]] = {}
    async with client(server) as c, c.subscribe(prefix.rsplit("/", 1)[0] + "/**", from_time=0) as sub:
        for _ in range(total):
            ev = await sub.get(WAIT)
            assert isinstance(ev, Event), ev
            got.setdefault(ev.channel, []).append(ev.payload.decode())
    assert got == want


def test_a_backlog_of_12000_events_goes_up_in_one_replay_after_the_node_above_comes_back(
    tmp_path: Path,
) -> None:
    """The node above is down while the node below takes 12,000 publishes over 300 channels: once it is
    back, every event goes up once, in order per channel, in one replay (the link does not reconnect)."""

    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        a_cfg = config(tmp_path, "A", keys={"http.listen": f"127.0.0.1:{port}"})
        async with Server(a_cfg) as a, Server(config(tmp_path, "B", url(a))) as b:
            link = b.upstreams[0]
            await until(lambda: link.state == "up", "the link up")
            await a.stop()
            await until(lambda: link.state != "up", "the link down")
            async with client(b) as cb:
                await publish_long(cb, "/up/c")
            async with Server(a_cfg) as a2:
                await until(lambda: link.state == "up", "the link up again")
                reconnects = link.reconnects
                await until(lambda: link.stats.sent_up == LONG_CHANNELS * LONG_ROUNDS, "the backlog to go up")
                await check_long(a2, "/up/c")
                assert link.stats.gaps == 0 and link.reconnects == reconnects

    asyncio.run(main())


async def until_log(server: Server, channel: str, n: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while len(await log(server, channel)) < n:
        assert loop.time() < deadline, f"{channel}: fewer than {n} events"
        await asyncio.sleep(0.05)


def test_links_present_their_token_from_the_url_or_federation_token(tmp_path: Path) -> None:
    """With ``auth.mode = token`` above, a link comes up with a token (in its URL, or ``federation.token``;
    the URL's wins) and carries events both ways; without one it stays down, retrying."""
    tokens = {
        "linktok": {"user": "fed", "publish": ["/**"], "subscribe": ["/**"]},
        "usertok": {"user": "u", "publish": ["/**"], "subscribe": ["/**"]},
    }

    async def main() -> None:
        a_cfg = config(tmp_path, "A", keys={"auth.mode": "token", "auth.tokens": tokens})
        async with Server(a_cfg) as a:
            in_url = config(tmp_path, "B", url(a) + "?token=linktok")
            in_cfg = config(tmp_path, "C", url(a), keys={"federation.token": "linktok"})
            none = config(tmp_path, "D", url(a))
            # A URL's own token names that link: it wins over federation.token.
            both = config(tmp_path, "E", url(a) + "?token=linktok", keys={"federation.token": "badtok"})
            async with Server(in_url) as b, Server(in_cfg) as c, Server(none) as d, Server(both) as e:
                await synced(b.upstreams[0], c.upstreams[0], e.upstreams[0])
                assert b.upstreams[0].url == url(a) + "/ws/hubbub"  # the token is not kept in the URL
                await until(lambda: d.upstreams[0].reconnects >= 2, "the link without a token to retry")
                assert d.upstreams[0].state != "up"
                async with client(b) as cb, cb.subscribe("/x/**") as below:
                    await synced(b.upstreams[0])
                    ca = await AsyncClient.connect(url(a), token="usertok")
                    try:
                        await ca.publish("/x/1", "down")
                    finally:
                        await ca.close()
                    assert [e.payload for e in await take(below, 1)] == [b"down"]
                async with client(c) as cc:
                    await cc.publish("/y/1", "up")
                await until_log_auth(a, "/y/1", "usertok")

    asyncio.run(main())


async def until_log_auth(server: Server, channel: str, token: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        while True:
            async with http.get(f"http://127.0.0.1:{server.ports['http']}/api/v1/log{channel}") as r:
                body = await r.json()
            if body.get("events"):
                return
            assert loop.time() < deadline, f"{channel}: nothing went up"
            await asyncio.sleep(0.05)


def test_a_node_below_catches_up_on_12000_events_in_one_replay(tmp_path: Path) -> None:
    """The node below is down while 12,000 events are published above over 300 channels, three of which it
    knew: once back, it stores every event once, each channel in order, and counts no gap."""

    async def main() -> None:
        a_cfg = config(tmp_path, "A")
        async with Server(a_cfg) as a, client(a) as ca:
            b_cfg = config(tmp_path, "B", url(a))
            async with Server(b_cfg) as b, client(b) as cb, cb.subscribe("/d/**") as below:
                await synced(b.upstreams[0])
                for i in range(3):
                    await ca.publish(f"/d/c{i}", "-1")
                await take(below, 3)
            await publish_long(ca, "/d/c")
            async with Server(b_cfg) as b, client(b) as cb, cb.subscribe("/d/**"):
                link = b.upstreams[0]
                await check_long(b, "/d/c", {f"/d/c{i}": ["-1"] for i in range(3)})
                assert link.stats.gaps == 0

    asyncio.run(main())


def test_a_channel_written_on_both_sides_recovers_without_loops(tmp_path: Path) -> None:
    """Both nodes publish to one channel: above, the channel holds events the link must not send back
    down (they came from below), so the stream down has holes by design. The node below, restarted while
    both sides publish, ends with every event once and does not reconnect in a loop."""

    async def main() -> None:
        async with Server(config(tmp_path, "A")) as a, client(a) as ca:
            b_cfg = config(tmp_path, "B", url(a))
            async with Server(b_cfg) as b, client(b) as cb, cb.subscribe("/m/**"):
                await synced(b.upstreams[0])
                for i in range(10):
                    await ca.publish("/m/x", f"a{i}")
                    await cb.publish("/m/x", f"b{i}")
                await until_log(b, "/m/x", 20)
            for i in range(10, 20):
                await ca.publish("/m/x", f"a{i}")
            async with Server(b_cfg) as b, client(b) as cb, cb.subscribe("/m/**"):
                link = b.upstreams[0]
                await synced(link)
                for i in range(20, 30):
                    await ca.publish("/m/x", f"a{i}")
                    await cb.publish("/m/x", f"b{i}")
                await until_log(b, "/m/x", 50)
                await until_log(a, "/m/x", 50)
                for server in (a, b):
                    texts = [e["text"] for e in await log(server, "/m/x")]
                    assert sorted(texts) == sorted([f"a{i}" for i in range(30)] + [f"b{i}" for i in range(10)]
                                                   + [f"b{i}" for i in range(20, 30)])  # fmt: skip
                    assert [t for t in texts if t[0] == "a"] == [f"a{i}" for i in range(30)]
                assert link.reconnects == 0 and link.stats.gaps == 0

    asyncio.run(main())


def test_a_token_file_is_read_at_each_connection(tmp_path: Path) -> None:
    """``federation.token_file`` is read for each connection's hello: a link whose file is missing, then holds
    a refused token, keeps retrying, and comes up once the file holds a good one (a renewed token is used
    without a restart)."""
    tokens = {"linktok": {"user": "fed", "publish": ["/**"], "subscribe": ["/**"]}}
    token_file = tmp_path / "link-token"

    async def main() -> None:
        a_cfg = config(tmp_path, "A", keys={"auth.mode": "token", "auth.tokens": tokens})
        async with Server(a_cfg) as a:
            b_cfg = config(tmp_path, "B", url(a), keys={"federation.token_file": str(token_file)})
            async with Server(b_cfg) as b:
                link = b.upstreams[0]
                await until(lambda: link.reconnects >= 1, "a retry while the file is missing")
                token_file.write_text("badtok\n")
                seen = link.reconnects
                await until(lambda: link.reconnects >= seen + 2, "retries with the refused token")
                assert link.state != "up"
                token_file.write_text("linktok\n")
                await until(lambda: link.state == "up", "the link up with the token from the file")
                await synced(link)
                async with client(b) as cb:
                    await cb.publish("/y/1", "up")
                await until_log_auth(a, "/y/1", "linktok")

    asyncio.run(main())


def test_a_fast_burst_from_above_does_not_overflow_the_links_up_session(tmp_path: Path) -> None:
    """12,000 events come down as fast as the node above sends them while the node below publishes its own:
    what came from above is never queued to go back up, so the link's up session (a send queue of 64 here)
    is not closed as a slow consumer for it and the link never reconnects; both logs hold every event once,
    each channel in order."""

    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        a_cfg = config(tmp_path, "A", keys={"http.listen": f"127.0.0.1:{port}"})
        async with Server(config(tmp_path, "B", f"ws://127.0.0.1:{port}")) as b:
            link = b.upstreams[0]
            link.send_queue = 64  # the link's own queue only: the subscriber below keeps the default bound
            # The interest below, with a tag no event has: the link subscribes to /d/** above, nothing is
            # delivered below (the burst's check reads the log).
            async with (
                Server(a_cfg) as a,
                client(a) as ca,
                client(b) as cb,
                cb.subscribe("/d/**", tags=["none"]),
            ):
                await synced(link)
                reconnects = link.reconnects

                async def publish_up() -> None:
                    # 30 at a time: bursts of local events the up session's bound takes.
                    for r in range(LONG_ROUNDS):
                        await asyncio.gather(*(cb.publish(f"/u/c{i}", str(r)) for i in range(30)))

                await asyncio.gather(publish_long(ca, "/d/c"), publish_up())
                total = LONG_CHANNELS * LONG_ROUNDS
                await until(
                    lambda: link.stats.received_down >= total and link.stats.sent_up >= 30 * LONG_ROUNDS,
                    "both bursts to cross",
                )
                await check_long(b, "/d/c")
                for i in range(30):
                    got = [e["text"] for e in await log(a, f"/u/c{i}")]
                    assert got == [str(r) for r in range(LONG_ROUNDS)]
                assert link.reconnects == reconnects
                assert link.stats.gaps == 0

    asyncio.run(main())


def test_interest_that_returns_long_after_a_restart_recovers_what_the_node_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node below is down while the node above publishes to channels it knew and to a new one under the
    same pattern; once restarted, its link is up, with no interest, long before its subscriber comes back
    (no link may stop recovering some time after it came up: any such window is shrunk to nothing here). The
    subscriber resumes from its positions on the node below and gets every event it missed, once, in order,
    then the live ones; the node's log holds every event of each channel once, in order."""
    monkeypatch.setattr(federation_link, "RECOVER_WINDOW_S", 0.0, raising=False)
    channels = ["/t/c0", "/t/c1", "/t/c2"]

    async def main() -> None:
        async with Server(config(tmp_path, "A")) as a, client(a) as ca:
            b_cfg = config(tmp_path, "B", url(a))
            since: dict[str, Position] = {}
            async with Server(b_cfg) as b, client(b) as cb, cb.subscribe("/t/**") as below:
                await synced(b.upstreams[0])
                for i in range(6):
                    await ca.publish(channels[i % 3], f"{i}")
                for ev in await take(below, 6):
                    since[ev.channel] = Position(ev.seq, ev.epoch)
            for i in range(6, 21):  # B is down
                await ca.publish(channels[i % 3], f"{i}")
                await ca.publish("/t/new", f"new{i}")
            async with Server(b_cfg) as b, client(b) as cb:
                link = b.upstreams[0]
                await until(lambda: link.synced and not link.upward.subs, "the link up with no interest")
                async with cb.subscribe("/t/**", since=since) as below:
                    await synced(link)
                    for ch in [*channels, "/t/new"]:
                        await ca.publish(ch, "mark")
                    got: dict[str, list[str]] = {}
                    while sum(p[-1:] == ["mark"] for p in got.values()) < 4:
                        item = await below.get(WAIT)
                        assert isinstance(item, Event), item
                        got.setdefault(item.channel, []).append(item.payload.decode())
                want = {
                    ch: [str(i) for i in range(6, 21) if i % 3 == n] + ["mark"]
                    for n, ch in enumerate(channels)
                }
                want["/t/new"] = [f"new{i}" for i in range(6, 21)] + ["mark"]
                assert got == want
                for n, ch in enumerate(channels):
                    texts = [e["text"] for e in await log(b, ch)]
                    assert texts == [str(i) for i in range(21) if i % 3 == n] + ["mark"]
                assert link.stats.gaps == 0

    asyncio.run(main())


def test_a_failing_cursor_saver_is_supervised_and_the_link_starts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link's cursor saver fails once: the failure reaches the link's supervisor (logged, counted), which
    starts the link again, saver and connection together; events cross and the cursors are saved again."""
    original = LinkCursors.save_loop
    calls = 0

    async def save_loop(self: LinkCursors) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the saver broke")
        await original(self)

    monkeypatch.setattr(LinkCursors, "save_loop", save_loop)

    async def main() -> None:
        async with Server(config(tmp_path, "A")) as a, Server(config(tmp_path, "B", url(a))) as b:
            link = b.upstreams[0]
            failures = link.node.supervision.failures
            await until(lambda: failures.get("federation") == 1 and calls == 2, "the failure supervised")
            async with client(a) as ca, client(b) as cb, cb.subscribe("/t/**") as below:
                await synced(link)
                await ca.publish("/t/x", "1")
                assert [e.payload for e in await take(below, 1)] == [b"1"]
                path = link.cursors.path
                assert path is not None
                await until(lambda: "/t/x" in path.read_text(), "the cursor saved")
            assert failures.get("federation") == 1

    asyncio.run(main())


def test_a_pattern_back_after_a_reconnect_recovers_channels_that_appeared_while_it_was_away(
    tmp_path: Path,
) -> None:
    """The node below had /t/** and /x/**; while it is down a channel appears under /t/. Restarted, only
    /x/** comes back at first, and its events move the link's newest time past the new channel's; the link
    then reconnects (the node above restarts), and only then /t/** comes back: the new channel is still
    owed from where /t/** was when the node went down, and arrives whole."""

    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        a_cfg = config(tmp_path, "A", keys={"http.listen": f"127.0.0.1:{port}"})
        b_cfg = config(tmp_path, "B", f"ws://127.0.0.1:{port}")
        since: dict[str, Position] = {}
        async with Server(a_cfg) as a, client(a) as ca:
            async with Server(b_cfg) as b, client(b) as cb, cb.subscribe("/t/**") as t, cb.subscribe("/x/**"):
                await synced(b.upstreams[0])
                await ca.publish("/t/c0", "0")
                ev = (await take(t, 1))[0]
                since[ev.channel] = Position(ev.seq, ev.epoch)
            await ca.publish("/t/new", "n0")  # B is down
            await ca.publish("/t/new", "n1")
            b = await Server(b_cfg).__aenter__()
            try:
                link = b.upstreams[0]
                async with client(b) as cb, cb.subscribe("/x/**") as x:
                    await synced(link)
                    await ca.publish("/x/a", "1")
                    assert [e.payload for e in await take(x, 1)] == [b"1"]
                    await until(lambda: link.cursors.down.last_time > 0, "the link's time to move")
                    reconnects = link.reconnects
                    await a.stop()
                    async with Server(a_cfg) as a2, client(a2) as ca2:
                        await until(lambda: link.reconnects > reconnects and link.synced, "the link back")
                        async with cb.subscribe("/t/**", since=since) as t:
                            await synced(link)
                            await ca2.publish("/t/new", "mark")
                            got = [(e.channel, e.payload) for e in await take(t, 3)]
                            assert got == [("/t/new", b"n0"), ("/t/new", b"n1"), ("/t/new", b"mark")]
                assert link.stats.gaps == 0
            finally:
                await b.__aexit__(None, None, None)

    asyncio.run(main())


def test_a_crash_before_the_cursor_saver_ran_loses_nothing_of_a_pattern_the_link_subscribed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link's cursor saver never gets to run (a loaded machine) and the node below crashes: on disk is
    only what was written before the crash, with none of the channels' positions. The pattern the link had
    subscribed is held there all the same (written before its subscribe went up), so the restarted link
    recovers it and the node below's log gets every event it missed, each once, in order."""

    async def stalled(self: LinkCursors) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(LinkCursors, "save_loop", stalled)
    channels = ["/t/c0", "/t/c1", "/t/c2"]

    async def main() -> None:
        async with Server(config(tmp_path, "A")) as a, client(a) as ca:
            b_cfg = config(tmp_path, "B", url(a))
            async with Server(b_cfg) as b, client(b) as cb, cb.subscribe("/t/**") as below:
                link = b.upstreams[0]
                await synced(link)
                for i in range(6):
                    await ca.publish(channels[i % 3], f"{i}")
                assert [e.payload.decode() for e in await take(below, 6)] == [str(i) for i in range(6)]
                path = link.cursors.path
                assert path is not None
                on_disk = path.read_bytes()  # what a kill -9 now would leave
            path.write_bytes(on_disk)  # the clean stop's last save never happened
            for i in range(6, 21):  # B is down
                await ca.publish(channels[i % 3], f"{i}")
            async with Server(b_cfg) as b, client(b) as cb, cb.subscribe("/t/**") as below:
                link = b.upstreams[0]
                await synced(link)
                for ch in channels:
                    await ca.publish(ch, "mark")
                got: dict[str, list[str]] = {}
                while sum(p[-1:] == ["mark"] for p in got.values()) < 3:
                    item = await below.get(WAIT)
                    assert isinstance(item, Event), item
                    got.setdefault(item.channel, []).append(item.payload.decode())
                for n, ch in enumerate(channels):
                    texts = [e["text"] for e in await log(b, ch)]
                    assert texts == [str(i) for i in range(21) if i % 3 == n] + ["mark"]
                assert link.stats.gaps == 0

    asyncio.run(main())
