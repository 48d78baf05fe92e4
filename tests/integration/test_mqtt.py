"""MQTT 3.1.1 over real sockets (docs/dialects/mqtt.md): QoS 0, 1 and 2 both ways, filters and their
wildcards, native publishers and subscribers on the same channels, bad input, the keepalive, takeover,
wills, credentials and permissions, with hubbub's byte-level test client (tests/integration/mqttclient.py);
the stock clients are in test_mqtt_clients.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hubbub.client import AsyncClient
from hubbub.dialects import mqtt_codec as c
from hubbub.events import Event
from hubbub.server import Server
from hubbub.server_config import load_config

from .mqttclient import MqttClient

WAIT = 10.0
TOKENS = {
    "tok-root": {"user": "root", "admin": True},
    "tok-alice": {"user": "alice", "publish": ["/pub/**"], "subscribe": ["/pub/**"]},
}


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **overrides: Any) -> AsyncIterator[Server]:
    cli: dict[str, Any] = {"data_dir": str(tmp_path / "data"), "mqtt.tcp_listen": "127.0.0.1:0"}
    cli.update(overrides)
    async with Server(load_config(cli=cli, env={})) as srv:
        yield srv


async def metrics(srv: Server, token: str = "") -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{srv.ports['http']}/metrics", headers=headers) as r,
    ):
        assert r.status == 200
        return await r.text()


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_qos0_and_qos1_between_mqtt_and_native(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            sub = await MqttClient.connect(port, "sub")
            assert await sub.subscribe(("a/+", 1), ("b/#", 0)) == (1, 0)
            pub = await MqttClient.connect(port, "pub")
            url = f"ws://127.0.0.1:{srv.ports['http']}"
            async with AsyncClient.connect(url) as native, native.subscribe("/a/**") as nsub:
                # MQTT to MQTT and native: every message, in order, at min(publish, granted) QoS.
                for i in range(20):
                    await pub.publish("a/x", f"m{i}".encode(), qos=i % 2)
                for i in range(20):
                    m = await sub.message()
                    assert (m.topic, m.payload, m.qos, m.retain) == ("a/x", f"m{i}".encode(), i % 2, False)
                for i in range(20):
                    ev = await nsub.get(WAIT)
                    assert ev is not None and not hasattr(ev, "reason")
                    assert (ev.channel, ev.seq, ev.payload, ev.publisher.dialect) == (
                        "/a/x",
                        i + 1,
                        f"m{i}".encode(),
                        "mqtt",
                    )
                # native to MQTT: QoS 1 under a QoS 1 filter, 0 under a QoS 0 one; b/# matches b; + one level.
                await native.publish("/a/y", b"n1")
                await native.publish("/b", b"n2")
                await native.publish("/b/c/d", b"n3")
                await native.publish("/a/y/z", b"not for a/+")
                await native.publish("/a", b"not for a/+ either")
                got = [await sub.message() for _ in range(3)]
                assert [(m.topic, m.payload, m.qos) for m in got] == [
                    ("a/y", b"n1", 1),
                    ("b", b"n2", 0),
                    ("b/c/d", b"n3", 0),
                ]
                await sub.ping()  # nothing else was sent before the PINGRESP
                await pub.disconnect()
                await sub.disconnect()

    asyncio.run(main())


def test_overlapping_filters_deliver_once_and_dollar_topics(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            sub = await MqttClient.connect(port, "sub")
            assert await sub.subscribe(("#", 0), ("x/+", 2), ("$SYS/#", 0)) == (0, 2, 0)
            pub = await MqttClient.connect(port, "pub")
            await pub.publish("x/1", b"a", qos=2)
            await pub.publish("$SYS/up", b"b", qos=1)
            await pub.publish("/lead", b"c", qos=1)
            got = [await sub.message() for _ in range(3)]
            # One delivery at the highest QoS of the filters that match; $SYS only through $SYS/#.
            assert [(m.topic, m.payload, m.qos) for m in got] == [
                ("x/1", b"a", 2),
                ("$SYS/up", b"b", 0),
                ("/lead", b"c", 0),
            ]
            # A filter held again replaces its QoS; UNSUBSCRIBE ends it.
            assert await sub.subscribe(("x/+", 0)) == (0,)
            await pub.publish("x/2", b"d", qos=2)
            assert (m := await sub.message()).qos == 0 and m.payload == b"d"
            sub.send(c.encode_unsubscribe(sub.pid(), ["#", "x/+"]))
            assert isinstance(await sub.next(), c.Ack)
            await pub.publish("x/3", b"e", qos=1)
            await pub.publish("$SYS/x", b"f", qos=0)
            assert (await sub.message()).payload == b"f"
            await sub.disconnect()
            await pub.disconnect()

    asyncio.run(main())


def test_qos2_exchanges_and_duplicates(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            sub = await MqttClient.connect(port, "sub")
            assert await sub.subscribe(("q", 2)) == (2,)
            pub = await MqttClient.connect(port, "pub")
            # The same identifier again before PUBREL is one message [MQTT-4.3.3-2].
            pub.send(c.encode_publish("q", b"once", 2, packet_id=7))
            assert await pub.next() == c.Ack(c.PUBREC, 7)
            pub.send(c.encode_publish("q", b"once", 2, dup=True, packet_id=7))
            assert await pub.next() == c.Ack(c.PUBREC, 7)
            pub.send(c.encode_ack(c.PUBREL, 7))
            assert await pub.next() == c.Ack(c.PUBCOMP, 7)
            await pub.publish("q", b"twice", qos=2)
            m1 = await sub.message()
            m2 = await sub.message()
            assert (m1.payload, m1.qos, m2.payload) == (b"once", 2, b"twice")
            await sub.ping()
            url = f"ws://127.0.0.1:{srv.ports['http']}"
            async with AsyncClient.connect(url) as native, native.subscribe("/q", last=10) as log:
                stored = [await log.get(WAIT) for _ in range(2)]
                events = [e for e in stored if isinstance(e, Event)]
                assert events == stored, stored  # events only: no gap, no end
                assert [(e.seq, e.payload) for e in events] == [(1, b"once"), (2, b"twice")]
            await sub.disconnect()
            await pub.disconnect()

    asyncio.run(main())


@pytest.mark.parametrize(
    "bad",
    [
        c.encode_publish("a", b""),  # not a CONNECT first
        c.encode_connect("x") + c.encode_connect("x"),  # CONNECT twice
        c.encode_connect("x") + b"\x36\x05\x00\x01a\x00\x01",  # QoS 3
        c.encode_connect("x") + c.encode_publish("a/+", b""),  # a wildcard in a topic name
        c.encode_connect("x") + c.encode_subscribe(1, [("a/#/b", 0)]),  # a bad filter
        c.encode_connect("x") + b"\xc0\xff\xff\xff\xff\x01",  # five length bytes
        c.encode_connect("x") + c.encode_publish("a", b"x" * 5000),  # over limits.max_frame
    ],
)
def test_bad_input_closes_the_connection(tmp_path: Path, bad: bytes) -> None:
    async def main() -> None:
        async with serve(tmp_path, **{"limits.max_frame": 4096}) as srv:
            cl = await MqttClient.open(srv.ports["mqtt"])
            cl.send(bad)
            rest = await cl.closed()
            if bad.startswith(c.encode_connect("x")):
                assert rest == c.encode_connack(False, 0)
            else:
                assert rest == b""
            assert metric(await metrics(srv), 'hubbub_bad_input_total{dialect="mqtt"}') == 1

    asyncio.run(main())


def test_refused_connects(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, **{"auth.mode": "token", "auth.tokens": TOKENS}) as srv:
            port = srv.ports["mqtt"]
            cases: list[tuple[dict[str, Any], int]] = [
                ({"level": 3}, 1),
                ({"clean_session": False}, 2),
                ({"username": "u", "password": b"nope"}, 4),
                ({}, 5),
            ]
            for kw, code in cases:
                cl = await MqttClient.open(port)
                ack = await cl.handshake("" if code == 2 else "x", **kw)
                assert ack == c.Connack(False, code)
                assert await cl.closed() == b""
            # The password is the token; a user name alone is one too.
            for kw in ({"username": "any", "password": b"tok-alice"}, {"username": "tok-alice"}):
                cl = await MqttClient.connect(port, "alice", **kw)
                await cl.disconnect()

    asyncio.run(main())


def test_permissions_on_subscribe_and_publish(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path, **{"auth.mode": "token", "auth.tokens": TOKENS}) as srv:
            port = srv.ports["mqtt"]
            alice = await MqttClient.connect(port, "alice", username="alice", password=b"tok-alice")
            # A filter is granted when she may read every topic it matches.
            assert await alice.subscribe(("pub/#", 1), ("secret/#", 1), ("#", 0)) == (1, 0x80, 0x80)
            # A publish she may not make is acknowledged and dropped, and counted.
            await alice.publish("secret/x", b"no", qos=1)
            await alice.publish("pub/x", b"yes", qos=1)
            m = await alice.message()
            assert (m.topic, m.payload) == ("pub/x", b"yes")
            root = await MqttClient.connect(port, "root", password=b"tok-root", username="root")
            await root.publish("secret/y", b"hidden", qos=1)
            await root.publish("pub/z", b"seen", qos=1)
            m = await alice.message()
            assert (m.topic, m.payload) == ("pub/z", b"seen")
            text = await metrics(srv, "tok-root")
            assert metric(text, "hubbub_mqtt_publishes_dropped_total") == 1
            assert metric(text, "hubbub_mqtt_sessions") == 2
            await alice.disconnect()
            await root.disconnect()

    asyncio.run(main())


def test_will_on_abnormal_end_only(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            watcher = await MqttClient.connect(port, "watcher")
            assert await watcher.subscribe(
                ("wills/+", 1),
            ) == (1,)
            clean = await MqttClient.connect(port, "clean", will=c.Will("wills/clean", b"x", 1, False))
            await clean.disconnect()
            dirty = await MqttClient.connect(port, "dirty", will=c.Will("wills/dirty", b"gone", 1, False))
            dirty.abort()
            m = await watcher.message()
            assert (m.topic, m.payload, m.qos) == ("wills/dirty", b"gone", 1)
            await watcher.ping()
            await watcher.disconnect()

    asyncio.run(main())


def test_takeover_and_keepalive(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            first = await MqttClient.connect(port, "same")
            second = await MqttClient.connect(port, "same")
            assert await first.closed() == b""
            await second.ping()
            await second.disconnect()
            silent = await MqttClient.connect(port, "silent", keepalive=1)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            assert await silent.closed(timeout=5) == b""
            assert 1.4 <= loop.time() - t0 < 4

    asyncio.run(main())


def test_deliveries_wait_for_the_window_and_a_client_that_acknowledges_nothing_is_a_slow_consumer(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with serve(tmp_path, **{"mqtt.max_inflight": 4, "limits.send_queue": 16}) as srv:
            port = srv.ports["mqtt"]
            sub = await MqttClient.connect(port, "sub")
            assert await sub.subscribe(("t", 1)) == (1,)
            pub = await MqttClient.connect(port, "pub")
            for i in range(10):
                await pub.publish("t", b"%d" % i, qos=1)
            # Four in flight, the rest wait for room in the window, in order.
            got = [await sub.message(ack=False) for _ in range(4)]
            assert [(m.packet_id, m.payload) for m in got] == [(i + 1, b"%d" % i) for i in range(4)]
            await sub.ping()  # nothing else came
            for i in range(4, 10):
                sub.send(c.encode_ack(c.PUBACK, got[0].packet_id))
                got = [*got[1:], await sub.message(ack=False)]
                assert got[-1].payload == b"%d" % i
            # Acknowledging nothing more, past limits.send_queue waiting: a slow consumer.
            for _ in range(20):
                await pub.publish("t", b"more", qos=1)
            await sub.closed()
            await pub.disconnect()

    asyncio.run(main())


def test_retained_messages_from_the_log_across_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            pub = await MqttClient.connect(port, "pub")
            await pub.publish("rt/a", b"v1", qos=1, retain=True)
            await pub.publish("rt/a", b"v2", qos=2, retain=True)
            await pub.publish("rt/a", b"live", qos=1)  # not retained: v2 stays the retained one
            await pub.publish("rt/b", b"b1", qos=0, retain=True)
            await pub.publish("rt/c", b"c1", qos=1, retain=True)
            await pub.publish("rt/c", b"", qos=1, retain=True)  # an empty payload clears
            await pub.ping()
            sub = await MqttClient.connect(port, "sub")
            assert await sub.subscribe(("rt/#", 1), ("rt/a", 0)) == (1, 0)
            got = [await sub.message() for _ in range(2)]
            assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
                ("rt/a", b"v2", 1, True),
                ("rt/b", b"b1", 0, True),
            ]
            await pub.publish("rt/b", b"b2", qos=1, retain=True)
            m = await sub.message()
            assert (m.topic, m.payload, m.retain) == ("rt/b", b"b2", False)  # live: no retain flag
            await sub.ping()
            await sub.disconnect()
            await pub.disconnect()
            assert metric(await metrics(srv), "hubbub_mqtt_retained") == 2
        async with serve(tmp_path) as srv:
            sub = await MqttClient.connect(srv.ports["mqtt"], "sub")
            assert await sub.subscribe(("rt/+", 2)) == (2,)
            got = [await sub.message() for _ in range(2)]
            assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
                ("rt/a", b"v2", 2, True),
                ("rt/b", b"b2", 1, True),
            ]
            await sub.ping()
            await sub.disconnect()

    asyncio.run(main())


@pytest.mark.parametrize("persistent", [False, True], ids=["clean", "persistent"])
def test_a_subscribe_s_second_read_of_retained_messages_sends_what_came_before_the_filters_and_only_that(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    """The retained messages are read before a SUBSCRIBE's filters are registered and again after. Held at
    each read in turn: one retained meanwhile before the registration reaches the client as retained, once;
    one published once the client has its SUBACK (and read again late, as on a loaded machine) comes live
    only."""
    from hubbub.transports import mqtt_filters
    from hubbub.transports.mqtt_retained import read_retained as real  # the function mqtt_filters imported

    after_first, after_second = asyncio.Event(), asyncio.Event()
    first_done, second_reading = asyncio.Event(), asyncio.Event()

    async def held(node: Any, index: Any, filters: Any, known: Any = None) -> Any:
        got = await real(node, index, filters, known)
        if known is None:
            first_done.set()
            await after_first.wait()
        else:
            second_reading.set()
            await after_second.wait()
            got = await real(node, index, filters, known)
        return got

    monkeypatch.setattr(mqtt_filters, "read_retained", held)

    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            pub = await MqttClient.connect(port, "pub")
            await pub.publish("rr/a", b"a1", qos=1, retain=True)
            sub = await MqttClient.connect(port, "sub", clean_session=not persistent)
            sub.send(c.encode_subscribe(sub.pid(), [("rr/#", 1)]))
            await first_done.wait()
            # Committed after the first read, before the filter is registered: only the second read has it.
            await pub.publish("rr/b", b"b1", qos=1, retain=True)
            after_first.set()
            ack = await sub.next()
            assert isinstance(ack, c.Suback) and ack.codes == (1,), ack
            m = await sub.message()
            assert (m.topic, m.payload, m.retain) == ("rr/a", b"a1", True)
            await second_reading.wait()
            # Published once the client has its SUBACK: it comes live, and the late second read finds it too.
            await pub.publish("rr/a", b"a2", qos=1, retain=True)
            m = await sub.message()
            assert (m.topic, m.payload, m.retain) == ("rr/a", b"a2", False)
            after_second.set()
            m = await sub.message()
            assert (m.topic, m.payload, m.retain) == ("rr/b", b"b1", True)
            await sub.ping()  # nothing else came: not a2 again, as retained
            await sub.disconnect()
            await pub.disconnect()

    asyncio.run(main())


def test_persistent_sessions_keep_filters_and_messages_across_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            away = await MqttClient.open(port)
            assert await away.handshake("keeper", clean_session=False) == c.Connack(False, 0)
            assert await away.subscribe(("ps/#", 2)) == (2,)
            await away.disconnect()
            pub = await MqttClient.connect(port, "pub")
            for i in range(10):
                await pub.publish("ps/x", b"%d" % i, qos=1 + i % 2)
            # Back: the session is there, with every message published while away, in order.
            back = await MqttClient.open(port)
            assert await back.handshake("keeper", clean_session=False) == c.Connack(True, 0)
            got = [await back.message(ack=i < 5) for i in range(10)]
            assert [(m.topic, m.payload, m.qos, m.dup) for m in got] == [
                ("ps/x", b"%d" % i, 1 + i % 2, False) for i in range(10)
            ]
            back.abort()  # five unacknowledged: the batch is delivered again, with DUP
            again = await MqttClient.open(port)
            assert await again.handshake("keeper", clean_session=False) == c.Connack(True, 0)
            got = [await again.message() for _ in range(10)]
            assert [(m.payload, m.dup) for m in got] == [(b"%d" % i, True) for i in range(10)]
            await again.ping()
            await again.disconnect()
            await pub.publish("ps/y", b"before the restart", qos=1)
            await pub.disconnect()
        async with serve(tmp_path) as srv:
            port = srv.ports["mqtt"]
            pub = await MqttClient.connect(port, "pub")
            await pub.publish("ps/z", b"after the restart", qos=2)
            back = await MqttClient.open(port)
            assert await back.handshake("keeper", clean_session=False) == c.Connack(True, 0)
            got = [await back.message() for _ in range(2)]
            assert [(m.topic, m.payload) for m in got] == [
                ("ps/y", b"before the restart"),
                ("ps/z", b"after the restart"),
            ]
            # Live, and UNSUBSCRIBE ends the filter for good.
            await pub.publish("ps/live", b"now", qos=1)
            assert (await back.message()).payload == b"now"
            back.send(c.encode_unsubscribe(back.pid(), ["ps/#"]))
            assert isinstance(await back.next(), c.Ack)
            await back.disconnect()
            await pub.publish("ps/gone", b"x", qos=1)
            # A clean session discards a persistent one.
            clean = await MqttClient.open(port)
            assert await clean.handshake("keeper", clean_session=False) == c.Connack(True, 0)
            assert await clean.subscribe(("ps/#", 1)) == (1,)
            await clean.disconnect()
            await pub.publish("ps/kept", b"x", qos=1)
            wipe = await MqttClient.open(port)
            assert await wipe.handshake("keeper", clean_session=True) == c.Connack(False, 0)
            await wipe.disconnect()
            assert metric(await metrics(srv), "hubbub_mqtt_persistent_sessions") == 0
            fresh = await MqttClient.open(port)
            assert await fresh.handshake("keeper", clean_session=False) == c.Connack(False, 0)
            await fresh.ping()  # nothing from the discarded session
            await fresh.disconnect()
            await pub.disconnect()

    asyncio.run(main())


def test_credentials_with_mqtt_auth_off(tmp_path: Path) -> None:
    async def main() -> None:
        cfg = {"auth.mode": "token", "auth.tokens": TOKENS, "mqtt.auth": "off"}
        async with serve(tmp_path, **cfg) as srv:
            port = srv.ports["mqtt"]
            # A plain user name (mosquitto_pub -u) is no token: ignored, not refused.
            anon = await MqttClient.connect(port, "anon", username="bob", password=b"not a token")
            await anon.disconnect()
            alice = await MqttClient.connect(port, "alice", password=b"tok-alice", username="alice")
            assert await alice.subscribe(("pub/#", 1), ("#", 1)) == (1, 0x80)  # her token's permissions
            await alice.disconnect()

    asyncio.run(main())


def test_ivy_and_guble_publishers_and_a_guble_subscriber(tmp_path: Path) -> None:
    async def main() -> None:
        async with serve(tmp_path) as srv, aiohttp.ClientSession() as http:
            base = f"http://127.0.0.1:{srv.ports['http']}"
            sub = await MqttClient.connect(srv.ports["mqtt"], "sub")
            assert await sub.subscribe(
                ("x/#", 1),
            ) == (1,)
            guble = await http.ws_connect(f"{base}/stream/user/g")
            await guble.send_str("+ /x")
            while not (await guble.receive_bytes(timeout=WAIT)).startswith(b"#subscribed-to /x"):
                pass
            for i in range(3):
                async with http.post(f"{base}/events/x/ivy", data={"data": f"i{i}"}) as r:
                    assert r.status == 200, await r.text()
                async with http.post(f"{base}/api/message/x/guble", data=f"g{i}".encode()) as r:
                    assert r.status == 200, await r.text()
            got = [await sub.message() for _ in range(6)]
            assert [(m.topic, m.payload, m.qos) for m in got] == [
                (t, f"{p}{i}".encode(), 1) for i in range(3) for t, p in (("x/ivy", "i"), ("x/guble", "g"))
            ]
            pub = await MqttClient.connect(srv.ports["mqtt"], "pub")
            await pub.publish("x/mqtt", b"from mqtt", qos=1)
            lines = [(await guble.receive_bytes(timeout=WAIT)).decode() for _ in range(7)]
            # guble's rendering (mapping.md §5.2): path, seq, user, app, filters, time, node; then the body.
            head, *rest = lines[-1].split("\n")
            assert head.split(",")[:2] == ["/x/mqtt", "1"] and rest[-1] == "from mqtt", lines[-1]
            await guble.close()
            await pub.disconnect()
            await sub.disconnect()

    asyncio.run(main())


def test_a_persistent_session_back_while_its_last_acknowledgement_is_stored(tmp_path: Path) -> None:
    """A client acknowledges its last message, disconnects and comes back at once, while the batch's
    acknowledgement is still being stored: the new connection waits for it (the consumer is still held by
    the old one until then), and gets what was published while it was away."""

    async def main() -> None:
        async with serve(tmp_path, durability="fsync") as srv:
            port = srv.ports["mqtt"]
            first = await MqttClient.open(port)
            assert await first.handshake("quick", clean_session=False) == c.Connack(False, 0)
            assert await first.subscribe(("q/#", 1)) == (1,)
            pub = await MqttClient.connect(port, "pub")
            for round_ in range(5):
                await pub.publish("q/x", b"r%d" % round_, qos=1)
                m = await first.message(ack=False)
                assert m.payload == b"r%d" % round_
                # The PUBACK and the DISCONNECT in one write, and a new connection right behind them.
                first.send(c.encode_ack(c.PUBACK, m.packet_id) + bytes((c.DISCONNECT << 4, 0)))
                again = await MqttClient.open(port)
                again.send(c.encode_connect("quick", clean_session=False))
                await first.closed()
                assert await again.next() == c.Connack(True, 0)
                await pub.publish("q/away", b"a%d" % round_, qos=1)
                got = await again.message()
                assert (got.topic, got.payload, got.dup) == ("q/away", b"a%d" % round_, False)
                first = again
            await first.disconnect()
            await pub.disconnect()

    asyncio.run(main())


def test_retained_and_session_files_of_an_earlier_version_are_moved_into_the_log(tmp_path: Path) -> None:
    """Earlier versions kept the retained index and the persistent sessions' filters in
    ``data_dir/mqtt/*.jsonl``: they are loaded into the log's state maps at start (an entry whose event is
    gone skipped), and the files renamed ``*.migrated``."""

    async def main() -> None:
        async with serve(tmp_path) as srv:
            pub = await MqttClient.connect(srv.ports["mqtt"], "pub")
            await pub.publish("old/a", b"kept", qos=1)  # retained only by the old file below
            await pub.disconnect()
            assert srv.node is not None
            head = await srv.node.head("/old/a")
        base = tmp_path / "data" / "mqtt"
        base.mkdir(parents=True, exist_ok=True)
        (base / "retained.jsonl").write_text(
            f'["/old/a",[{head.top},"{head.epoch}"]]\n["/old/gone",[7,"{head.epoch}"]]\n', encoding="utf-8"
        )
        (base / "sessions.jsonl").write_text('["legacy",{"old/#":1}]\n', encoding="utf-8")
        for _ in range(2):  # migrated at the first start; the second finds it in the log alone
            async with serve(tmp_path) as srv:
                port = srv.ports["mqtt"]
                sub = await MqttClient.connect(port, "sub")
                assert await sub.subscribe(("old/#", 1)) == (1,)
                m = await sub.message()
                assert (m.topic, m.payload, m.retain) == ("old/a", b"kept", True)
                await sub.ping()  # nothing for old/gone
                await sub.disconnect()
                legacy = await MqttClient.open(port)
                assert await legacy.handshake("legacy", clean_session=False) == c.Connack(True, 0)
                pub = await MqttClient.connect(port, "pub")
                await pub.publish("old/new", b"after", qos=1)
                m = await legacy.message()
                assert (m.topic, m.payload, m.retain) == ("old/new", b"after", False)
                await legacy.disconnect()
                await pub.disconnect()
            assert sorted(p.name for p in base.iterdir()) == [
                "retained.jsonl.migrated",
                "sessions.jsonl.migrated",
            ]

    asyncio.run(main())


def test_mqtt_and_wearscript_both_ways(tmp_path: Path) -> None:
    """The mapping's two ends (protocols/mapping.md §2.4, §4, §5.2; docs/dialects/mqtt.md "What is stored"):
    an MQTT publish reaches a WearScript device as ``[name, payload]`` (the payload one raw string, `args`),
    byte for byte; a WearScript frame reaches an MQTT subscriber as its topic and, for payload, the msgpack
    array of its arguments exactly as received; every message once, in order."""
    import msgpack

    from .test_wearscript import HUB, Peer, lenient, peer, sync

    async def event(ws: Peer) -> bytes:
        """The next event frame (the hub's lists of other dialects' subscriptions skipped: MQTT's show)."""
        while lenient(frame := await ws.recv_raw())[0] == "subscriptions":
            pass
        return frame

    async def main() -> None:
        async with serve(tmp_path) as srv, aiohttp.ClientSession() as http:
            addr = f"127.0.0.1:{srv.ports['http']}"
            async with peer(http, addr, new_spec=True) as ws:
                assert await ws.recv() == HUB
                await ws.send("subscriptions", "glass:0", ["ws", "sync:0"])
                await sync(ws, "sync:0")
                sub = await MqttClient.connect(srv.ports["mqtt"], "sub")
                assert await sub.subscribe(("ws/#", 1)) == (1,)
                pub = await MqttClient.connect(srv.ports["mqtt"], "pub")
                payloads = [b"hello", b"\xff\x00 not utf-8", b""]
                for i, p in enumerate(payloads):
                    await pub.publish(f"ws/x{i}", p, qos=i % 2)
                got = [await event(ws) for _ in payloads]
                assert got == [
                    msgpack.packb([f"ws:x{i}", p], use_bin_type=False) for i, p in enumerate(payloads)
                ]
                ms = [await sub.message() for _ in payloads]
                assert [(m.topic, m.payload) for m in ms] == [(f"ws/x{i}", p) for i, p in enumerate(payloads)]
                # WearScript to MQTT: the arguments' bytes as sent, at QoS 1 (another dialect's event).
                frames: list[tuple[str, *tuple[object, ...]]] = [
                    ("ws:y", 1, "two", b"\x00\x01"),
                    ("ws:deep:er", {"k": [1.5, None]}),
                ]
                for f in frames:
                    await ws.send(*f)
                ms = [await sub.message() for _ in frames]
                assert [(m.topic, m.payload, m.qos, m.retain) for m in ms] == [
                    (f[0].replace(":", "/"), msgpack.packb(list(f[1:]), use_bin_type=True), 1, False)
                    for f in frames
                ]
                # A barrier: nothing else reached the device (the sender gets no echo).
                await ws.send("test:server:0", "device", "sync:0")
                assert lenient(await event(ws)) == ["sync:0", "0"]
                await sub.ping()
                await sub.disconnect()
                await pub.disconnect()

    asyncio.run(main())


def test_acknowledgements_keep_the_publish_order_when_some_are_dropped_at_once(tmp_path: Path) -> None:
    """[MQTT-4.6.0-2]: PUBACKs go in the order of the PUBLISHes. A publish the token may not make is dropped
    and acknowledged at once, but after the acknowledgements of the publishes before it, which wait for their
    commit (and a retained one for its entry too)."""

    async def main() -> None:
        async with serve(tmp_path, **{"auth.mode": "token", "auth.tokens": TOKENS}) as srv:
            port = srv.ports["mqtt"]
            alice = await MqttClient.connect(port, "alice", username="alice", password=b"tok-alice")
            pids = list(range(1, 41))
            alice.send(
                b"".join(
                    c.encode_publish(
                        "pub/x" if pid % 2 else "secret/x", b"%d" % pid, 1, pid % 3 == 0, False, pid
                    )
                    for pid in pids
                )
            )
            got = [await alice.next() for _ in pids]
            assert got == [c.Ack(c.PUBACK, pid) for pid in pids]
            await alice.disconnect()

    asyncio.run(main())


def test_mist_reaches_mqtt_and_mqtt_never_reaches_mist(tmp_path: Path) -> None:
    """protocols/mapping.md §4: a mist publish (either generation) is an event of ``mist.channel`` (``/mist``)
    with its tags, which MQTT subscribers of topic ``mist`` get as its data's bytes, at QoS 1 (another
    dialect's event), once each and in order; an MQTT publish has no tags, and a mist subscription needs at
    least one (§4.2), so an MQTT publish on ``mist`` reaches no mist client of either generation: the next
    thing each one gets is a mist event published after it."""
    from .mist_clients import Client1x, GoClient2015, Message

    async def main() -> None:
        async with serve(tmp_path, **{"mist.tcp_listen": "127.0.0.1:0"}) as srv:
            sub = await MqttClient.connect(srv.ports["mqtt"], "sub")
            assert await sub.subscribe(("mist", 2)) == (2,)
            old = GoClient2015("127.0.0.1", srv.ports["mist"])
            await old.connect()
            new = await Client1x.connect("127.0.0.1", srv.ports["mist"])
            # mist to MQTT: the 2015 line protocol and 1.x's JSON, one after the other.
            await old.publish(["b", "a"], "from 2015")
            m = await sub.message()
            assert (m.topic, m.payload, m.qos, m.retain) == ("mist", b"from 2015", 1, False)
            await new.send(command="publish", tags=["x"], data="from 1.x \u00e9")
            m = await sub.message()
            assert (m.topic, m.payload, m.qos, m.retain) == ("mist", "from 1.x \u00e9".encode(), 1, False)
            # MQTT to mist: nothing, whatever the tags the mist clients hold.
            await old.subscribe(["a"])
            await old.ping()
            await new.send(command="subscribe", tags=["x"])
            await new.ping()
            pub = await MqttClient.connect(srv.ports["mqtt"], "pub")
            for qos in (0, 1, 2):
                await pub.publish("mist", b"from mqtt %d" % qos, qos=qos)
            await pub.ping()
            got = [(m.topic, m.payload) for m in [await sub.message() for _ in range(3)]]
            assert got == [("mist", b"from mqtt %d" % qos) for qos in (0, 1, 2)]  # stored, and delivered
            # The barrier, on the same channel after them: the first thing either mist client gets.
            barrier = await Client1x.connect("127.0.0.1", srv.ports["mist"])
            await barrier.send(command="publish", tags=["a", "x"], data="barrier")
            await barrier.ping()
            assert await old.next_message() == Message(("a", "x"), "barrier")
            assert await new.recv() == {"command": "publish", "tags": ["a", "x"], "data": "barrier"}
            assert old.messages.empty() and new.inbox.empty()
            m = await sub.message()
            assert (m.topic, m.payload) == ("mist", b"barrier")
            await sub.ping()
            await sub.disconnect()
            await pub.disconnect()
            for c in (old, new, barrier):
                await c.close()

    asyncio.run(main())
