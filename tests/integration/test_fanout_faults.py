"""An encoder that raises for one event costs its own connections only (core/faults.py), over real sockets.

Two connections of each of several encodings (native WebSocket JSON, native WebSocket msgpack with batch
frames, native SSE, ivy, guble, a qpubs NDJSON listen) subscribe to one channel, a durable consumer follows
it, and a native publisher sends events with acknowledgements, one of them the *poison*. The encoder of one
encoding (each in turn) raises for the poison, as the qpubs encoder once raised inside the commit's fan-out.
Every other connection gets every event once and in order; the publisher gets every acknowledgement; the
consumer journals every event; the connections of the failing encoding are closed with the documented
internal-error close (never left open with a gap), counted in ``hubbub_internal_closes_total`` and logged
once. The replay path gets the same treatment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest

from hubbub.core.session import Session
from hubbub.core.subscriptions import SubscriptionRegistry
from hubbub.events import Event
from hubbub.server import Server
from hubbub.server_config import load_config

from .consumer_wire import Wire, text

WAIT = 10.0
PAIR = 2
POISON = b"POISON"
CHANNEL = "/iso/x"


class Poisoned:
    """A session's encoder that raises for an event whose payload holds :data:`POISON` (as an encoder bug
    would, for one event and one encoding) and is the encoder it wraps in every other way."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.key = inner.key

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        if POISON in event.payload:
            raise TypeError("unencodable")
        data: bytes = self._inner.encode_event(event, subs, replay, cache)
        return data

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name == "encode_page":

            def encode_page(events: Sequence[Event], *args: Any) -> Any:
                if any(POISON in e.payload for e in events):
                    raise TypeError("unencodable")
                return attr(events, *args)

            return encode_page
        if name not in ("encode_run", "encode_run_batches"):
            return attr

        def encode_run(proto: Event, rows: Sequence[tuple[int, bytes]], *args: Any) -> Any:
            if any(POISON in payload for _t, payload in rows):
                raise TypeError("unencodable")
            return attr(proto, rows, *args)

        return encode_run


@pytest.fixture
def poison(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``poison(prefix)``: every session attached from now on whose encoding key starts with ``prefix`` gets
    a :class:`Poisoned` encoder."""

    def arm(prefix: str) -> None:
        attach = SubscriptionRegistry.attach

        def poisoned_attach(self: SubscriptionRegistry, session: Session) -> None:
            if session.encoder.key.startswith(prefix):
                session.encoder = Poisoned(session.encoder)
            attach(self, session)

        monkeypatch.setattr(SubscriptionRegistry, "attach", poisoned_attach)

    return arm


@contextlib.asynccontextmanager
async def serve(data_dir: Path) -> AsyncIterator[Server]:
    cli = {"data_dir": str(data_dir), "http.listen": "127.0.0.1:0", "native.tcp_listen": "127.0.0.1:0"}
    async with Server(load_config(cli=cli, env={})) as server:
        yield server


#: Reads a connection until it has ``n`` events or ends: (event texts, how it ended or ``None``).
Collect = Callable[[int], Awaitable[tuple[list[str], Any]]]


def closed(msg: aiohttp.WSMessage) -> int:
    """The close code of the message that ended a WebSocket (0 when it ended without a close frame)."""
    return int(msg.data) if msg.type == aiohttp.WSMsgType.CLOSE else 0


def first(frames: list[dict[str, Any]] | int) -> dict[str, Any]:
    assert not isinstance(frames, int), frames
    return frames[0]


async def native_ws(
    http: aiohttp.ClientSession, addr: str, encoding: str, spec: dict[str, Any], replied: bool = True
) -> Collect:
    """``replied``: wait for the subscription's reply (else it is read, if it comes, with the events: a
    replay that fails drops what is queued, the reply included, for the error and the close)."""
    ws = await http.ws_connect(f"ws://{addr}/ws/hubbub", protocols=[f"hubbub.v1.{encoding}"])

    async def send(obj: dict[str, Any]) -> None:
        if encoding == "json":
            await ws.send_str(json.dumps(obj))
        else:
            await ws.send_bytes(msgpack.packb(obj))

    async def frames() -> list[dict[str, Any]] | int:
        msg = await ws.receive(timeout=WAIT)
        if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            return closed(msg)
        obj = json.loads(msg.data) if encoding == "json" else msgpack.unpackb(msg.data)
        return list(obj["frames"]) if obj.get("op") == "batch" else [obj]

    await send({"op": "hello", "id": 1, "v": 1, "batch": encoding == "msgpack"})
    assert first(await frames())["op"] == "reply"
    await send({"op": "subscribe", "id": 2, "sub": "s", **spec})
    if replied:
        assert first(await frames())["op"] == "reply"

    async def collect(n: int) -> tuple[list[str], Any]:
        got: list[str] = []
        errors: list[tuple[int, str, bool]] = []
        while len(got) < n:
            fs = await frames()
            if isinstance(fs, int):
                await ws.close()
                return got, ("close", fs, errors)
            for f in fs:
                if f.get("op") == "event":
                    got.append(f["text"] if encoding == "json" else bytes(f["payload"]).decode())
                elif f.get("op") == "error":
                    errors.append((f["code"], f["message"], f["temporary"]))
        await ws.close()
        return got, None

    return collect


async def sse(http: aiohttp.ClientSession, addr: str) -> Collect:
    resp = await http.get(f"http://{addr}/api/v1/stream{CHANNEL}")
    assert resp.status == 200
    assert await asyncio.wait_for(resp.content.readline(), WAIT) == b"retry: 2000\n"

    async def collect(n: int) -> tuple[list[str], Any]:
        got: list[str] = []
        while len(got) < n:
            line = await asyncio.wait_for(resp.content.readline(), WAIT)
            if not line:
                return got, "end of stream"
            if line.startswith(b"data: "):
                got.append(json.loads(line[6:])["text"])
        resp.close()
        return got, None

    return collect


async def ivy_ws(http: aiohttp.ClientSession, addr: str) -> Collect:
    ws = await http.ws_connect(f"ws://{addr}/ws", protocols=("ivy1",))
    assert (await ws.receive_str(timeout=WAIT)).startswith("@")
    await ws.send_str("+" + CHANNEL)
    await ws.send_str("@")  # a time request: its reply means the subscription is in place
    assert (await ws.receive_str(timeout=WAIT)).startswith("##@")

    async def collect(n: int) -> tuple[list[str], Any]:
        got: list[str] = []
        while len(got) < n:
            msg = await ws.receive(timeout=WAIT)
            if msg.type != aiohttp.WSMsgType.TEXT:
                return got, ("close", closed(msg))
            got.append(msg.data.rsplit(":", 1)[1])
        await ws.close()
        return got, None

    return collect


async def guble_ws(http: aiohttp.ClientSession, addr: str) -> Collect:
    ws = await http.ws_connect(f"ws://{addr}/stream/")
    assert (await ws.receive(timeout=WAIT)).data.startswith(b"#connected")
    await ws.send_str("+ " + CHANNEL)
    assert (await ws.receive(timeout=WAIT)).data == f"#subscribed-to {CHANNEL}".encode()

    async def collect(n: int) -> tuple[list[str], Any]:
        got: list[str] = []
        notices: list[bytes] = []
        while len(got) < n:
            msg = await ws.receive(timeout=WAIT)
            if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                return got, ("close", closed(msg), notices)
            data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
            if data.startswith((b"!", b"#")):
                notices.append(data)
            else:
                got.append(data.rsplit(b"\n", 1)[1].decode())
        await ws.close()
        return got, None

    return collect


async def qpubs_listen(http: aiohttp.ClientSession, addr: str) -> Collect:
    resp = await http.get(f"http://{addr}/qpubs/listen", params={"topic": CHANNEL[1:].replace("/", ".")})
    assert resp.status == 200  # the headers go out once the listener is registered

    async def collect(n: int) -> tuple[list[str], Any]:
        got: list[str] = []
        while len(got) < n:
            line = await asyncio.wait_for(resp.content.readline(), WAIT)
            if not line:
                return got, "end of stream"
            if line.strip():
                got.append(json.loads(line)["value"])
        resp.close()
        return got, None

    return collect


#: The encodings under test: the key prefix of their sessions, and the close the failing ones must end with.
ENCODINGS: dict[str, tuple[str, Any]] = {
    # native: the error 4300 (temporary: reconnect and resume with since), then the close 4300.
    "native json": ("native.json", ("close", 4300, [(4300, "internal", True)])),
    "native msgpack": ("native.msgpack", ("close", 4300, [(4300, "internal", True)])),
    # SSE and qpubs listens: the response ends (an SSE client resumes with Last-Event-ID).
    "sse": ("native.sse", "end of stream"),
    "qpubs": ("qpubs.http.ndjson", "end of stream"),
    # The dialects that close with WebSocket codes: 1011; guble says so first, in its own notice.
    "ivy": ("ivy", ("close", 1011)),
    "guble": ("guble", ("close", 1011, [b"!error-server-internal internal"])),
}


async def subscribers(http: aiohttp.ClientSession, addr: str) -> dict[str, list[Collect]]:
    exact = {"pattern": CHANNEL}
    return {
        "native json": [await native_ws(http, addr, "json", exact) for _ in range(PAIR)],
        "native msgpack": [await native_ws(http, addr, "msgpack", exact) for _ in range(PAIR)],
        "sse": [await sse(http, addr) for _ in range(PAIR)],
        "qpubs": [await qpubs_listen(http, addr) for _ in range(PAIR)],
        "ivy": [await ivy_ws(http, addr) for _ in range(PAIR)],
        "guble": [await guble_ws(http, addr) for _ in range(PAIR)],
    }


async def internal_closes(http: aiohttp.ClientSession, addr: str) -> dict[str, float]:
    async with http.get(f"http://{addr}/metrics") as r:
        body = await r.text()
    out = {}
    for line in body.splitlines():
        if line.startswith("hubbub_internal_closes_total{"):
            labels, _, value = line.partition("} ")
            out[labels.split('dialect="', 1)[1].rstrip('"')] = float(value)
    return {d: v for d, v in out.items() if v}


def fault_lines(caplog: pytest.LogCaptureFixture) -> Iterator[logging.LogRecord]:
    return (r for r in caplog.records if r.name == "hubbub.node" and r.levelno == logging.ERROR)


@pytest.mark.parametrize("mode", ["burst", "one by one"])
@pytest.mark.parametrize("failing", list(ENCODINGS))
def test_an_encoder_that_raises_closes_its_own_connections_only(
    tmp_path: Path,
    poison: Callable[[str], None],
    caplog: pytest.LogCaptureFixture,
    failing: str,
    mode: str,
) -> None:
    """``burst``: the events are pipelined, so the poison is encoded within a run shared between the
    connections of each encoding (``FanOut.fan_out_run``); ``one by one``: each publish waits for its
    acknowledgement, so each event fans out alone (the rendering shared per encoding, each connection
    queued separately)."""
    prefix, closed_with = ENCODINGS[failing]
    poison(prefix)
    n = 120 if mode == "burst" else 24
    bad = n // 2
    texts = [f"e{i}" if i != bad else POISON.decode() for i in range(n)]
    caplog.set_level(logging.ERROR, logger="hubbub.node")

    async def main() -> None:
        async with serve(tmp_path / "d") as server, aiohttp.ClientSession() as http:
            addr = f"127.0.0.1:{server.ports['http']}"
            subs = await subscribers(http, addr)
            consumer = await Wire.open(server.ports, "tcp", "json")
            assert (await consumer.request({"op": "consume", "consumer": "iso", "pattern": CHANNEL}))[
                "op"
            ] == ("reply")
            pub = await http.ws_connect(f"ws://{addr}/ws/hubbub", protocols=["hubbub.v1.json"])
            await pub.send_str(json.dumps({"op": "hello", "id": 1, "v": 1}))
            assert json.loads((await pub.receive(timeout=WAIT)).data)["op"] == "reply"
            acks: list[dict[str, Any]] = []
            for i, t in enumerate(texts):
                frame = {"op": "publish", "id": 10 + i, "channel": CHANNEL, "text": t, "ack": True}
                await pub.send_str(json.dumps(frame))
                if mode == "one by one":
                    acks.append(json.loads((await pub.receive(timeout=WAIT)).data))
            while len(acks) < n:
                acks.append(json.loads((await pub.receive(timeout=WAIT)).data))
            # Every publish acknowledged, in order, with consecutive seqs.
            assert [(a["op"], a["id"], a["seq"]) for a in acks] == [
                ("reply", 10 + i, i + 1) for i in range(n)
            ]

            for name, conns in subs.items():
                for got, end in await asyncio.gather(*(c(n) for c in conns)):
                    if name == failing:
                        # Closed with the documented reason, having got a gapless prefix without the poison.
                        assert end == closed_with, (name, end)
                        assert got == texts[: len(got)] and len(got) <= bad, (name, got)
                    else:
                        assert (got, end) == (texts, None), name

            # The durable consumer journaled every event.
            journaled: list[str] = []
            while len(journaled) < n:
                batch = await consumer.push("deliver")
                journaled += [text(it) for it in batch["items"]]
                await consumer.request({"op": "ack", "consumer": "iso", "batch": batch["batch"]})
            assert journaled == texts
            await consumer.close()

            dialect = "native" if failing.startswith(("native", "sse")) else failing
            assert await internal_closes(http, addr) == {dialect: PAIR}
            await pub.close()

    asyncio.run(main())
    # Logged once for the poison and the encoding, with its place and the exception's type, never its text.
    lines = list(fault_lines(caplog))
    assert len(lines) == 1, [r.getMessage() for r in lines]
    rec = lines[0].__dict__
    assert (rec["channel"], rec["error"]) == (CHANNEL, "TypeError")
    assert rec["seq"] <= bad + 1 < rec["seq"] + rec["events"]  # the poison, alone or in its run
    assert rec["encoding"].startswith(prefix)
    assert "unencodable" not in lines[0].getMessage() and "POISON" not in str(rec)


@pytest.mark.parametrize("pattern", ["exact", "wildcard"])
def test_a_replay_whose_encoding_raises_closes_the_connection(
    tmp_path: Path, poison: Callable[[str], None], caplog: pytest.LogCaptureFixture, pattern: str
) -> None:
    """The replay path (``ReplayService``): an exact channel's span and a pattern's pages are encoded on a
    reader thread. The failing connection is closed with error 4300 (it would resume with ``since``), not
    left subscribed after a replay that stopped, and the fault is logged with the event's channel and seq;
    another encoding replays everything."""
    poison("native.msgpack")
    caplog.set_level(logging.ERROR, logger="hubbub.node")
    n = 40
    texts = [f"e{i}" if i != 25 else POISON.decode() for i in range(n)]

    async def main() -> None:
        async with serve(tmp_path / "d") as server, aiohttp.ClientSession() as http:
            addr = f"127.0.0.1:{server.ports['http']}"
            pub = await Wire.open(server.ports, "ws", "json")
            for t in texts:
                assert (await pub.request({"op": "publish", "channel": CHANNEL, "text": t, "ack": True}))[
                    "op"
                ] == "reply"
            spec: dict[str, Any] = {"last": n} | (
                {"pattern": CHANNEL} if pattern == "exact" else {"pattern": "/iso/*"}
            )
            good = await native_ws(http, addr, "json", spec)
            failed = await native_ws(http, addr, "msgpack", spec, replied=False)
            assert await good(n) == (texts, None)
            got, end = await failed(n)
            assert end == ("close", 4300, [(4300, "internal", True)])
            assert got == texts[: len(got)] and len(got) <= 25
            assert await internal_closes(http, addr) == {"native": 1}
            await pub.close()

    asyncio.run(main())
    lines = list(fault_lines(caplog))
    assert len(lines) == 1 and lines[0].__dict__["channel"] == CHANNEL, [r.getMessage() for r in lines]
    assert lines[0].__dict__["seq"] == 26 or pattern == "exact"  # the poison (a span's fault names its run)
