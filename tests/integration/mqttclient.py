"""A minimal asyncio MQTT 3.1.1 client over hubbub's own codec, for the tests that need byte-level control
(pipelining, malformed packets, withheld acknowledgements); the stock clients (paho-mqtt, mosquitto_pub and
mosquitto_sub) are tested beside it."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from hubbub.dialects import mqtt_codec as c

WAIT = 10.0


async def _closed_at_the_end(writer: asyncio.StreamWriter) -> None:
    """Close ``writer`` when cancelled: ``asyncio.run`` cancels the tasks left at its end, so a client a
    failing test did not close is closed in its own loop, not left for the garbage collector to report (as a
    ``ResourceWarning``, an error in whichever test it collects in)."""
    try:
        await asyncio.Future()
    finally:
        writer.close()


class MqttClient:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.packets = c.PacketReader(1 << 24)
        self._pid = 0
        #: QoS 2 deliveries received (PUBREC sent) whose PUBREL has not come yet.
        self.releasing: set[int] = set()
        self._guard = asyncio.get_running_loop().create_task(_closed_at_the_end(writer))

    @classmethod
    async def open(cls, port: int, ssl_context: ssl.SSLContext | None = None) -> MqttClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ssl_context)
        return cls(reader, writer)

    @classmethod
    async def connect(cls, port: int, client_id: str = "", **kw: Any) -> MqttClient:
        """Open and CONNECT; fails unless CONNACK 0."""
        cl = await cls.open(port)
        ack = await cl.handshake(client_id, **kw)
        assert ack.code == 0, ack
        return cl

    async def handshake(self, client_id: str, **kw: Any) -> c.Connack:
        self.send(c.encode_connect(client_id, **kw))
        ack = await self.next()
        assert isinstance(ack, c.Connack), ack
        return ack

    def pid(self) -> int:
        self._pid = self._pid % 65535 + 1
        return self._pid

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def next(self, timeout: float = WAIT) -> c.Packet:  # noqa: ASYNC109 - a test helper
        """The next packet from the server (fails on EOF or timeout); the PUBRELs of QoS 2 deliveries received
        are completed on the way (PUBCOMP), not returned."""
        async with asyncio.timeout(timeout):
            while True:
                while (p := self.packets.next()) is None:
                    data = await self.reader.read(65536)
                    assert data, "connection closed"
                    self.packets.feed(data)
                if isinstance(p, c.Ack) and p.kind == c.PUBREL and p.packet_id in self.releasing:
                    self.releasing.discard(p.packet_id)
                    self.send(c.encode_ack(c.PUBCOMP, p.packet_id))
                    continue
                return p

    async def closed(self, timeout: float = WAIT) -> bytes:  # noqa: ASYNC109 - a test helper
        """Wait for the server to close (then close this end); the bytes it sent before."""
        out = b""
        async with asyncio.timeout(timeout):
            while data := await self.reader.read(65536):
                out += data
        self.writer.close()
        return out

    async def subscribe(self, *filters: tuple[str, int]) -> tuple[int, ...]:
        pid = self.pid()
        self.send(c.encode_subscribe(pid, list(filters)))
        ack = await self.next()
        assert isinstance(ack, c.Suback) and ack.packet_id == pid, ack
        return ack.codes

    async def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        """Publish and wait for its acknowledgement (QoS 2: the whole exchange)."""
        pid = self.pid() if qos else 0
        self.send(c.encode_publish(topic, payload, qos, retain, False, pid))
        if qos == 1:
            assert await self.next() == c.Ack(c.PUBACK, pid)
        elif qos == 2:
            assert await self.next() == c.Ack(c.PUBREC, pid)
            self.send(c.encode_ack(c.PUBREL, pid))
            assert await self.next() == c.Ack(c.PUBCOMP, pid)

    async def ping(self) -> None:
        """A PINGREQ answered: every packet sent before it was handled."""
        self.send(bytes((c.PINGREQ << 4, 0)))
        assert await self.next() == c.Empty(c.PINGRESP)

    async def message(self, ack: bool = True) -> c.PublishPacket:
        """The next PUBLISH, acknowledged as its QoS asks (``ack``; QoS 2: PUBREC now, PUBCOMP when its
        PUBREL comes)."""
        p = await self.next()
        assert isinstance(p, c.PublishPacket), p
        if ack and p.qos == 1:
            self.send(c.encode_ack(c.PUBACK, p.packet_id))
        elif ack and p.qos == 2:
            self.send(c.encode_ack(c.PUBREC, p.packet_id))
            self.releasing.add(p.packet_id)
        return p

    async def disconnect(self) -> None:
        self.send(bytes((c.DISCONNECT << 4, 0)))
        await self.closed()

    def abort(self) -> None:
        """Drop the connection without DISCONNECT (an abnormal end: the will goes out)."""
        self.writer.transport.abort()
