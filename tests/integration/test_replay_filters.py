"""Delivery filters apply to replays as to live fan-out (README §3, mapping.md §6): a native ``since``,
``last`` or ``from_time`` replay, exact channel or pattern, skips the events whose ``:filter.*``
pseudo-headers do not match the connection, with no gap reported and no duplicate or loss at the
replay/live junction; so do SSE replays and guble fetches."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from hubbub.channels import parse_pattern
from hubbub.core import Node, NodeSettings, ReplayPlan, ReplaySpec, Session
from hubbub.core import replay_service as node_mod
from hubbub.dialects import native as nc
from hubbub.events import Event, Position, Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, LogStore, RetentionPolicy
from hubbub.server import Server
from hubbub.server_config import load_config
from hubbub.transports.native import NativeEncoder


class Enc:
    """Frames as (channel, seq, replay, payload) tuples; no ``encode_run``, so the node encodes event by
    event."""

    key = "test"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return repr((event.channel, event.seq, replay, event.payload.decode())).encode()


def decode(frame: bytes) -> tuple[str, int, bool, str]:
    if frame[:1] == b"(":
        t: tuple[str, int, bool, str] = eval(frame.decode())
        return t
    ev = msgpack.unpackb(frame)
    return (ev["channel"], ev["seq"], ev.get("replay", False), ev["payload"].decode())


def make_session(encoder: str, user: str, max_items: int = 1024) -> Session:
    enc: Any = Enc() if encoder == "tuple" else NativeEncoder(nc.NativeCodec("msgpack"))
    return Session("native", enc, max_items=max_items, max_bytes=1 << 22, user=user)


def ev(channel: str, payload: str, to: str | None = None) -> AppendRequest:
    """An event; ``to`` sets the ``user_id`` filter (the payload says whom it is for)."""
    headers = {"k": "v"} if to is None else {"k": "v", ":filter.user_id": to}
    return AppendRequest(channel, Publisher("native", "p", "a", ""), payload.encode(), "text/plain", headers)


def mixed(channel: str, n_carol: int) -> list[AppendRequest]:
    """Plain events around filtered ones, with a long run of carol's events (it spans several pages)."""
    return [
        ev(channel, "all-1"),
        ev(channel, "carol-1", "carol"),
        ev(channel, "all-2"),
        ev(channel, "dave-1", "dave"),
        *[ev(channel, f"carol-r{i}", "carol") for i in range(n_carol)],
        ev(channel, "all-3"),
        ev(channel, "dave-2", "dave"),
    ]


def visible(events: list[AppendRequest], user: str) -> list[tuple[int, str]]:
    """(seq, payload) of the events a connection of ``user`` may receive, seqs counted from 1."""
    return [
        (i, e.payload.decode())
        for i, e in enumerate(events, 1)
        if e.headers.get(":filter.user_id", user) == user
    ]


Body = Callable[[Node, LogStore], Awaitable[None]]


@pytest.fixture(params=["memory", "sqlite"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., None]:
    def runner(body: Body, events: list[AppendRequest], **settings: Any) -> None:
        async def main() -> None:
            store = open_store(request.param, str(tmp_path / "data"), "commit", RetentionPolicy(), 600)
            if events:
                store.append(events)
            async with Node(store, NodeSettings(**settings)) as node:
                await body(node, store)

        asyncio.run(main())

    return runner


async def take_all(sess: Session) -> list[tuple[str, int, bool, str]]:
    out: list[tuple[str, int, bool, str]] = []
    while sess.queued:
        out.extend(decode(f) for f in await sess.next_frames())
    return out


async def subscribe(
    node: Node, sess: Session, pattern: str, spec: ReplaySpec
) -> tuple[ReplayPlan, list[ReplayPlan]]:
    plans: list[ReplayPlan] = []
    replayed: list[ReplayPlan] = []
    await node.subscribe(
        sess,
        "s",
        parse_pattern(pattern),
        frozenset(),
        spec,
        on_snapshot=plans.append,
        on_replayed=replayed.append,
    )
    return plans[0], replayed


N_CAROL = 250


@pytest.mark.parametrize("encoder", ["tuple", "native"])
@pytest.mark.parametrize("start", ["since", "last", "from_time"])
def test_exact_channel_replay_skips_events_filtered_away_from_the_connection(
    run: Callable[..., None], monkeypatch: pytest.MonkeyPatch, encoder: str, start: str
) -> None:
    # Small pages: carol's run fills whole pages that dave's and the anonymous replays pass over entirely.
    monkeypatch.setattr(node_mod, "REPLAY_PAGE", 100)
    events = mixed("/f", N_CAROL)
    spec = {
        "since": ReplaySpec(since=Position(0, "")),
        "last": ReplaySpec(last=len(events)),
        "from_time": ReplaySpec(from_time=0),
    }[start]

    async def body(node: Node, store: LogStore) -> None:
        for user in ("carol", "dave", ""):
            sess = make_session(encoder, user)
            node.attach(sess)
            plan, replayed = await subscribe(node, sess, "/f", spec)
            assert plan.gaps == [] and plan.position == Position(len(events), store.head("/f").epoch)
            want = visible(events, user)
            got = await take_all(sess)
            assert got == [("/f", seq, True, p) for seq, p in want]
            assert not sess.kicked and replayed[0].sent == len(want)
            node.detach(sess)
        # Live after the replay: the junction neither repeats nor loses anything, and filters still apply.
        dave = make_session(encoder, "dave")
        node.attach(dave)
        await subscribe(node, dave, "/f", spec)
        await take_all(dave)
        await node.publish(ev("/f", "live-carol", "carol"))
        await node.publish(ev("/f", "live-all"))
        assert await take_all(dave) == [("/f", len(events) + 2, False, "live-all")]

    run(body, events)


@pytest.mark.parametrize("start", ["since", "last", "from_time"])
def test_pattern_replay_skips_events_filtered_away_from_the_connection(
    run: Callable[..., None], start: str
) -> None:
    a, b = mixed("/p/a", 5), mixed("/p/b", 3)
    # Interleaved in commit order, so the merged replay alternates between the channels.
    events = [e for pair in zip(a, b, strict=False) for e in pair] + a[len(b) :]

    def expected(user: str) -> list[tuple[str, int, bool, str]]:
        out: list[tuple[str, int, bool, str]] = []
        seqs = {"/p/a": 0, "/p/b": 0}
        for e in events:
            seqs[e.channel] += 1
            if e.headers.get(":filter.user_id", user) == user:
                out.append((e.channel, seqs[e.channel], True, e.payload.decode()))
        return out

    async def body(node: Node, store: LogStore) -> None:
        epoch_a, epoch_b = store.head("/p/a").epoch, store.head("/p/b").epoch
        for user in ("carol", "dave", ""):
            spec = {
                "since": ReplaySpec(since={"/p/a": Position(0, epoch_a), "/p/b": Position(0, epoch_b)}),
                "last": ReplaySpec(last=len(events)),
                "from_time": ReplaySpec(from_time=0),
            }[start]
            sess = make_session("tuple", user)
            node.attach(sess)
            plan, replayed = await subscribe(node, sess, "/p/**", spec)
            assert plan.gaps == []
            want = expected(user)
            assert await take_all(sess) == want
            assert replayed[0].sent == len(want) and not sess.kicked
            await node.publish(ev("/p/b", "live-carol", "carol"))
            await node.publish(ev("/p/a", "live-all"))
            live = await take_all(sess)
            assert [(c, p) for c, _s, r, p in live if not r] == (
                [("/p/b", "live-carol"), ("/p/a", "live-all")] if user == "carol" else [("/p/a", "live-all")]
            )
            node.detach(sess)
            events.extend([ev("/p/b", "live-carol", "carol"), ev("/p/a", "live-all")])

    run(body, events)


def test_application_id_filter_in_a_replay(run: Callable[..., None]) -> None:
    async def body(node: Node, store: LogStore) -> None:
        mine, other = make_session("tuple", "u"), make_session("tuple", "u")
        for s in (mine, other):
            node.attach(s)
        await node.publish(ev("/app", "all"))
        r = AppendRequest(
            "/app", Publisher("native"), b"mine", "text/plain", {":filter.application_id": mine.id}
        )
        await node.publish(r)
        await node.publish(
            AppendRequest("/app", Publisher("native"), b"nobody", "text/plain", {":filter.colour": "red"})
        )
        for s in (mine, other):
            await subscribe(node, s, "/app", ReplaySpec(last=3))
        assert [p for _c, _s, _r, p in await take_all(mine)] == ["all", "mine"]
        assert [p for _c, _s, _r, p in await take_all(other)] == ["all"]

    run(body, [])


@pytest.mark.parametrize("encoder", ["tuple", "native"])
def test_live_events_held_during_a_filtered_replay_are_released_once(
    run: Callable[..., None], monkeypatch: pytest.MonkeyPatch, encoder: str
) -> None:
    """Publishes land while a slow replay passes over filtered pages: the live stream continues the replay
    exactly, and the held filtered event stays withheld."""
    monkeypatch.setattr(node_mod, "REPLAY_PAGE", 50)
    events = [ev("/j", f"all-{i}") for i in range(100)] + mixed("/j", 300)

    async def body(node: Node, store: LogStore) -> None:
        sess = make_session(encoder, "dave", max_items=8)
        node.attach(sess)
        n = len(events)
        want = [("/j", s, True, p) for s, p in visible(events, "dave")]
        want.append(("/j", n + 2, False, "live-1"))
        got: list[tuple[str, int, bool, str]] = []
        task = asyncio.ensure_future(subscribe(node, sess, "/j", ReplaySpec(since=Position(0, ""))))
        while len(got) < 20:
            got.extend(decode(f) for f in await asyncio.wait_for(sess.next_frames(limit_bytes=1), 5))
        await node.publish(ev("/j", "live-carol", "carol"))
        await node.publish(ev("/j", "live-1"))
        while len(got) < len(want):
            got.extend(decode(f) for f in await asyncio.wait_for(sess.next_frames(limit_bytes=1), 5))
        plan, replayed = await asyncio.wait_for(task, 5)
        await node.publish(ev("/j", "live-2"))
        got.extend(await take_all(sess))
        assert got == [*want, ("/j", n + 3, False, "live-2")]
        assert not sess.kicked and plan.gaps == [] and replayed[0].sent == len(want) - 1

    run(body, events)


def test_replayed_mixed_runs_are_the_single_event_frames_of_the_visible_events(
    run: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run-encoded replay (encoded on the reader thread) equals encoding each visible event alone."""
    monkeypatch.setattr(node_mod, "REPLAY_PAGE", 64)
    events = mixed("/m", 100) * 5

    async def body(node: Node, store: LogStore) -> None:
        codec = nc.NativeCodec("json")
        sess = Session("native", NativeEncoder(codec), max_items=32, max_bytes=1 << 20, user="dave")
        node.attach(sess)
        stored = [e for e in store.read("/m", 0, len(events)) if e.headers.get(":filter.user_id") != "carol"]
        task = asyncio.ensure_future(subscribe(node, sess, "/m", ReplaySpec(last=len(events))))
        frames: list[bytes] = []
        while len(frames) < len(stored):
            frames.extend(await asyncio.wait_for(sess.next_frames(), 5))
        await asyncio.wait_for(task, 5)
        assert frames == [codec.encode_event(e, ["s"], True) for e in stored] and not sess.queued

    run(body, events)


# -- SSE and guble -------------------------------------------------------------------------------------------


async def read_sse(resp: aiohttp.ClientResponse, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    block: dict[str, str] = {}
    while len(out) < n:
        line = (await asyncio.wait_for(resp.content.readline(), 5)).decode().rstrip("\n")
        if line == "":
            if "data" in block:
                out.append({"event": block.get("event", "message"), **json.loads(block["data"])})
            block = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            block[key] = value
    return out


def server_config(tmp_path: Path) -> Any:
    return load_config(
        {"data_dir": str(tmp_path), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}, env={}
    )


@pytest.mark.parametrize("path", ["s/a", "s/**"])
def test_sse_replay_skips_filtered_events(tmp_path: Path, path: str) -> None:
    async def main() -> None:
        async with Server(server_config(tmp_path)) as srv, aiohttp.ClientSession() as http:
            node = srv.node
            assert node is not None
            base = f"http://127.0.0.1:{srv.ports['http']}"
            for e in (ev("/s/a", "a1"), ev("/s/a", "carol", "carol"), ev("/s/a", "a2")):
                await node.publish(e)
            async with http.get(f"{base}/api/v1/stream/{path}?last=3") as stream:
                got = await read_sse(stream, 3)
                assert [(e["event"], e.get("text"), e.get("replay")) for e in got[:2]] == [
                    ("message", "a1", True),
                    ("message", "a2", True),
                ]
                assert got[2]["event"] == "recovered" and got[2]["replayed"] == 2
                await node.publish(ev("/s/a", "live-carol", "carol"))
                await node.publish(ev("/s/a", "live"))
                (live,) = await read_sse(stream, 1)
                assert (live["text"], live["seq"], live.get("replay", False)) == ("live", 5, False)

    asyncio.run(main())


def test_guble_fetch_skips_filtered_events(tmp_path: Path) -> None:
    """guble applies filters in its fetch (its own planner); the counts in fetch-start say so too."""

    async def recv(ws: aiohttp.ClientWebSocketResponse) -> bytes:
        msg = await asyncio.wait_for(ws.receive(), 5)
        data: bytes = msg.data
        return data

    async def main() -> None:
        async with Server(server_config(tmp_path)) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"
            for q in ("", "?filterUserId=carol", ""):
                async with http.post(f"{base}/api/message/g{q}", data=b"x") as r:
                    assert r.status == 200
            for user, n in (("carol", 3), ("dave", 2)):
                ws = await http.ws_connect(f"ws://127.0.0.1:{srv.ports['http']}/stream/user/{user}")
                assert (await recv(ws)).startswith(b"#connected")
                await ws.send_str("+ /g -10")
                assert await recv(ws) == f"#fetch-start /g {n}".encode()
                seqs = [(await recv(ws)).split(b",")[1] for _ in range(n)]
                assert seqs == ([b"1", b"2", b"3"] if user == "carol" else [b"1", b"3"])
                assert await recv(ws) == b"#fetch-end /g"
                await ws.close()

    asyncio.run(main())
