"""A crash campaign for MQTT's persistent sessions (the native one is test_crash_campaign.py): real
``hubbub serve`` processes (SQLite, the default durability) killed with SIGKILL while MQTT publishers have
QoS 1 publishes in flight and a CleanSession 0 subscriber is being served, restarted on the same data
directory, the subscriber back with the same client id each time.

The promise checked (docs/dialects/mqtt.md "Sessions"): every publish answered PUBACK reaches the
subscriber at least once, each publisher's messages first come in the order of publication, and every
message that comes again is flagged DUP [MQTT-3.3.1-1], after a crash too: the process that knew what it
had sent is gone, so the restarted one flags everything that was pending when it took the session's
consumer up (QoS 1 is at least once). Every identifier is checked, not a count.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hubbub.dialects import mqtt_codec as c

from .mqttclient import MqttClient
from .serverproc import ServerProcess

WAIT = 20.0
PUBLISHERS = 2
WINDOW = 32  # QoS 1 publishes in flight on each publisher's connection
KILLS = 3
#: acknowledged publishes between two kills (all publishers), and the subscriber's deliveries in the cycle
ACKS_PER_CYCLE = 300


@dataclass
class Delivery:
    conn: int  # the subscriber's connection (0, 1, ...), counted across the whole campaign
    publisher: int
    n: int
    dup: bool


@dataclass
class Campaign:
    acked: list[list[int]] = field(default_factory=lambda: [[] for _ in range(PUBLISHERS)])
    sent: list[int] = field(default_factory=lambda: [0] * PUBLISHERS)  # the last n sent, per publisher
    got: list[Delivery] = field(default_factory=list)
    subscribed: bool = False
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def note(self) -> None:
        self.changed.set()

    async def until(self, what: str, cond: Callable[[], bool]) -> None:
        """Wait for ``cond()`` to hold, woken by every ack and delivery; fail after WAIT seconds."""
        try:
            async with asyncio.timeout(WAIT):
                while not cond():
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None


async def read_packets(reader: asyncio.StreamReader, packets: c.PacketReader) -> c.Packet | None:
    """The next packet, or None when the connection ends (the server was killed)."""
    while (p := packets.next()) is None:
        try:
            data = await reader.read(65536)
        except (ConnectionError, OSError):
            return None
        if not data:
            return None
        packets.feed(data)
    return p


async def publisher(port: int, k: int, camp: Campaign, stop: asyncio.Event) -> None:
    """QoS 1 publishes of ``p<k>-<n>`` (n counting on across restarts), WINDOW in flight, until the server
    goes away or ``stop`` is set; every PUBACK recorded (they come in publish order)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    packets = c.PacketReader(1 << 20)
    writer.write(c.encode_connect(f"crash-pub{k}"))
    assert await read_packets(reader, packets) == c.Connack(False, 0)
    in_flight: dict[int, int] = {}  # packet id -> n
    window = asyncio.Semaphore(WINDOW)

    async def read_acks() -> None:
        try:
            while (p := await read_packets(reader, packets)) is not None:
                assert isinstance(p, c.Ack) and p.kind == c.PUBACK, p
                n = in_flight.pop(p.packet_id)
                assert not camp.acked[k] or n > camp.acked[k][-1], "PUBACKs out of publish order"
                camp.acked[k].append(n)
                camp.note()
                window.release()
        finally:
            window.release()  # wake the sender: it sees the acks are over

    acks = asyncio.ensure_future(read_acks())
    pid = 0
    try:
        while not acks.done() and not stop.is_set():
            await window.acquire()
            if acks.done() or stop.is_set():
                break
            camp.sent[k] += 1
            pid = pid % 65535 + 1
            in_flight[pid] = camp.sent[k]
            writer.write(c.encode_publish(f"crash/p{k}", b"p%d-%d" % (k, camp.sent[k]), 1, False, False, pid))
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        if stop.is_set() and not acks.done():
            await camp.until(f"publisher {k}'s last PUBACKs", lambda: not in_flight)
            writer.write(bytes((c.DISCONNECT << 4, 0)))
        await asyncio.gather(acks, return_exceptions=True)
        writer.transport.abort()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def subscriber(port: int, conn: int, camp: Campaign, first: bool) -> None:
    """One connection of the CleanSession 0 subscriber: CONNECT (session present unless ``first``),
    SUBSCRIBE the first time, then every PUBLISH recorded and acknowledged until the connection ends."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    packets = c.PacketReader(1 << 20)
    writer.write(c.encode_connect("crash-sub", clean_session=False))
    assert await read_packets(reader, packets) == c.Connack(not first, 0)
    if first:
        writer.write(c.encode_subscribe(1, [("crash/#", 1)]))
        assert await read_packets(reader, packets) == c.Suback(1, (1,))
        camp.subscribed = True
        camp.note()
    try:
        while (p := await read_packets(reader, packets)) is not None:
            assert isinstance(p, c.PublishPacket) and p.qos == 1, p
            k, n = p.payload.decode().removeprefix("p").split("-")
            assert p.topic == f"crash/p{k}", p
            camp.got.append(Delivery(conn, int(k), int(n), p.dup))
            camp.note()
            writer.write(c.encode_ack(c.PUBACK, p.packet_id))
    finally:
        writer.transport.abort()


def check(camp: Campaign) -> None:
    """Every acknowledged id delivered; first deliveries in publish order; every repeat flagged DUP."""
    for k in range(PUBLISHERS):
        mine = [d for d in camp.got if d.publisher == k]
        delivered = {d.n for d in mine}
        missing = [n for n in camp.acked[k] if n not in delivered]
        assert not missing, f"publisher {k}: acknowledged ids never delivered: {missing[:20]}"
        assert all(1 <= d.n <= camp.sent[k] for d in mine), f"publisher {k}: an id never published"
        seen: set[int] = set()
        top = 0
        for d in mine:
            if d.n in seen:
                # A repeat, on the same connection or after a disconnect or a crash: flagged.
                assert d.dup, f"publisher {k}: {d} again without DUP"
                continue
            # A first delivery: after every earlier first delivery of its publisher.
            assert d.n > top, f"publisher {k}: {d.n} first delivered after {top}"
            seen.add(d.n)
            top = d.n
        # Within one connection, each publisher's messages come in order, none twice.
        for conn in {d.conn for d in mine}:
            ns = [d.n for d in mine if d.conn == conn]
            assert ns == sorted(set(ns)), f"publisher {k}: connection {conn} delivered {ns}"


@pytest.mark.slow
def test_persistent_qos1_session_loses_nothing_acknowledged_across_kill_9(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data").start()
    camp = Campaign()

    async def main() -> None:
        conn = 0
        sub = asyncio.ensure_future(subscriber(srv.ports["mqtt"], conn, camp, first=True))
        await camp.until("the subscription", lambda: camp.subscribed)
        for cycle in range(KILLS + 1):
            stop = asyncio.Event()
            pubs = [
                asyncio.ensure_future(publisher(srv.ports["mqtt"], k, camp, stop)) for k in range(PUBLISHERS)
            ]
            target = sum(map(len, camp.acked)) + ACKS_PER_CYCLE
            got_before = len(camp.got)

            def cycle_done(target: int = target, got_before: int = got_before) -> bool:
                """Mid-stream: this cycle's acks and deliveries are flowing."""
                acked = sum(map(len, camp.acked))
                return acked >= target and len(camp.got) > got_before + ACKS_PER_CYCLE // 2

            await camp.until(f"cycle {cycle}'s acks and deliveries", cycle_done)
            if cycle == KILLS:
                break
            await asyncio.to_thread(srv.kill)  # SIGKILL: publishes in flight, deliveries unacknowledged
            await asyncio.wait_for(asyncio.gather(*pubs, sub, return_exceptions=True), WAIT)
            for t in (*pubs, sub):
                assert t.exception() is None, t.exception()
            await asyncio.to_thread(srv.start)  # the same data directory
            conn += 1
            sub = asyncio.ensure_future(subscriber(srv.ports["mqtt"], conn, camp, first=False))
        # The last cycle ends without a kill: the publishers stop once their window is acknowledged, and the
        # subscriber gets everything acknowledged.
        stop.set()
        await asyncio.wait_for(asyncio.gather(*pubs), WAIT)
        await camp.until(
            "every acknowledged id",
            lambda: all(
                set(camp.acked[k]) <= {d.n for d in camp.got if d.publisher == k} for k in range(PUBLISHERS)
            ),
        )
        sub.cancel()
        await asyncio.gather(sub, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        if srv.alive:
            srv.terminate()
    check(camp)
    assert all(len(a) >= ACKS_PER_CYCLE // PUBLISHERS for a in camp.acked)
    repeats = len(camp.got) - len({(d.publisher, d.n) for d in camp.got})
    print({"acked": [len(a) for a in camp.acked], "delivered": len(camp.got), "repeats": repeats,
           "dup": sum(d.dup for d in camp.got)})  # fmt: skip


def test_messages_sent_before_a_kill_9_come_again_with_dup_and_later_ones_without(tmp_path: Path) -> None:
    """The journal does not record what went out: after a crash, every message that was pending when the
    restarted server took the session's consumer up may have been sent, and comes with DUP 1
    [MQTT-3.3.1-1]; a message published after that, while the client is away, was never sent: DUP 0."""
    srv = ServerProcess(tmp_path / "data").start()

    async def main() -> None:
        port = srv.ports["mqtt"]
        sub = await MqttClient.open(port)
        assert await sub.handshake("dup-sub", clean_session=False) == c.Connack(False, 0)
        assert await sub.subscribe(("dup/#", 1)) == (1,)
        pub = await MqttClient.connect(port, "dup-pub")
        # One at a time, so that each is a batch of its own: 0 and 1 acknowledged, 2 sent and not, and 3..5
        # behind it, never sent (a consumer has one batch out at a time).
        for i in range(3):
            await pub.publish("dup/x", b"%d" % i, qos=1)
            m = await sub.message(ack=i < 2)
            assert (m.payload, m.dup) == (b"%d" % i, False)
        for i in range(3, 6):
            await pub.publish("dup/x", b"%d" % i, qos=1)
        await sub.ping()
        await asyncio.to_thread(srv.kill)
        pub.abort()
        sub.abort()
        await asyncio.to_thread(srv.start)  # the same data directory
        port = srv.ports["mqtt"]
        back = await MqttClient.open(port)
        assert await back.handshake("dup-sub", clean_session=False) == c.Connack(True, 0)
        # 2 went out before: DUP. 3..5 did not, but the restarted process cannot tell them from 2.
        got = [await back.message() for _ in range(2, 6)]
        assert [(m.payload, m.dup) for m in got] == [(b"%d" % i, True) for i in range(2, 6)]
        await back.ping()  # nothing more
        await back.disconnect()
        pub = await MqttClient.connect(port, "dup-pub")
        for i in range(6, 9):
            await pub.publish("dup/x", b"%d" % i, qos=1)
        again = await MqttClient.open(port)
        assert await again.handshake("dup-sub", clean_session=False) == c.Connack(True, 0)
        got = [await again.message() for _ in range(6, 9)]
        assert [(m.payload, m.dup) for m in got] == [(b"%d" % i, False) for i in range(6, 9)]
        await again.ping()
        await again.disconnect()
        await pub.disconnect()

    try:
        asyncio.run(main())
    finally:
        if srv.alive:
            srv.terminate()
