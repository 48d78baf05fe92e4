"""Wire encodings for the load driver: hubbub (native TCP and WebSocket, msgpack), NATS, MQTT 3.1.1, Redis.

Everything here works on raw blocking sockets and pre-encoded bytes. The driver never parses deliveries one by
one: it counts a *marker* (a byte string that occurs exactly once per delivery or ack) with ``bytes.count``,
so the driver stays far cheaper than any server it drives; its cost is then per byte received, the same for
every target (the subscribers read into one buffer, :class:`StreamCounter`, so a read allocates nothing).
Payloads are all ``x`` so no marker can occur inside them.

A :class:`Spec` is picklable: worker processes get one and open their own sockets.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import struct
import time
from dataclasses import dataclass

import msgpack

__all__ = [
    "Spec",
    "StreamCounter",
    "ack_marker",
    "count_stream",
    "deliver_marker",
    "open_pub",
    "open_sub",
    "pub_frames",
]

HOST = "127.0.0.1"

#: Kinds: ``hubbub`` (native TCP, msgpack, batch:true), ``hubbub-ws`` (WebSocket msgpack, one frame per
#: message), ``hubbub-json`` (native TCP, JSON lines, batch:true), ``hubbub-wsjson`` (WebSocket JSON text
#: frames, one frame per message: what a browser speaks), ``nats``, ``js`` (NATS JetStream),
#: ``mqtt0``/``mqtt1`` (Mosquitto QoS 0/1), ``redis`` (pub/sub), ``xredis`` (Redis streams).
KINDS = (
    "hubbub",
    "hubbub-ws",
    "hubbub-json",
    "hubbub-wsjson",
    "nats",
    "js",
    "mqtt0",
    "mqtt1",
    "redis",
    "xredis",
)

#: The hubbub kinds that speak JSON, and those that run over WebSocket.
JSON_KINDS = ("hubbub-json", "hubbub-wsjson")
WS_KINDS = ("hubbub-ws", "hubbub-wsjson")


@dataclass(frozen=True)
class Spec:
    """Where a target listens. ``source``: the loopback address the driver's sockets connect from ("": the
    kernel's choice, 127.0.0.1): one source address to one port has only the ephemeral port range (about
    28,000 on Linux), so a driver holding more connections spreads them over 127.0.0.2, 127.0.0.3, …
    (all loopback on Linux)."""

    kind: str
    port: int
    http_port: int = 0
    source: str = ""


class Conn:
    """A blocking socket plus whatever bytes arrived after its handshake."""

    def __init__(self, sock: socket.socket, rest: bytes = b"") -> None:
        self.sock = sock
        self.rest = rest

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _connect(port: int, source: str = "") -> socket.socket:
    if not source:
        s = socket.create_connection((HOST, port), timeout=30)
    else:
        s = socket.socket()
        try:
            s.settimeout(30)
            # The port is chosen at connect for the whole 4-tuple, not reserved at bind for the address alone.
            s.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24), 1)
            s.bind((source, 0))
            s.connect((HOST, port))
        except BaseException:
            s.close()
            raise
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 21)
    return s


def _read_until(s: socket.socket, needle: bytes, buf: bytes = b"", timeout: float = 30.0) -> bytes:
    deadline = time.monotonic() + timeout
    while needle not in buf:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {needle!r} within {timeout}s (got {buf[:200]!r})")
        chunk = s.recv(1 << 16)
        if not chunk:
            raise ConnectionError(f"closed while waiting for {needle!r} (got {buf[:200]!r})")
        buf += chunk
    return buf


# -- hubbub ----------------------------------------------------------------------------------------------


def _mp(obj: object) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True)
    return body


def _hub_frame(obj: object) -> bytes:
    body = _mp(obj)
    return struct.pack(">I", len(body)) + body


def _ws_frame(body: bytes, text: bool = False) -> bytes:
    # Client frames must be masked; an all-zero mask key leaves the payload unchanged (RFC 6455 §5.3).
    n = len(body)
    op = 0x81 if text else 0x82
    if n < 126:
        head = bytes([op, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([op, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([op, 0x80 | 127]) + struct.pack(">Q", n)
    return head + b"\x00\x00\x00\x00" + body


def _js(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


#: Once per reply frame and once per event (live or replayed) the server sends, in each encoding.
_MP_REPLY, _MP_EVENT = b"\xa2op\xa5reply", b"\xa2op\xa5event"
_JS_REPLY, _JS_EVENT = b'"op":"reply"', b'"op":"event"'


def _reply_marker(kind: str) -> bytes:
    return _JS_REPLY if kind in JSON_KINDS else _MP_REPLY


def _hub_open(spec: Spec, batch: bool) -> Conn:
    reply = _reply_marker(spec.kind)
    hello: dict[str, object] = {"op": "hello", "id": 1, "v": 1}
    if spec.kind in WS_KINDS:
        proto = "hubbub.v1.json" if spec.kind in JSON_KINDS else "hubbub.v1.msgpack"
        s = _connect(spec.http_port, spec.source)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            (
                f"GET /ws/hubbub HTTP/1.1\r\nHost: {HOST}:{spec.http_port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {proto}\r\n\r\n"
            ).encode()
        )
        buf = _read_until(s, b"\r\n\r\n")
        if not buf.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(f"websocket upgrade refused: {buf[:200]!r}")
        rest = buf.split(b"\r\n\r\n", 1)[1]
        s.sendall(_hub_send_obj(spec, {**hello, "batch": False}))
        rest = _read_until(s, reply, rest)
        return Conn(s, rest.split(reply, 1)[1])
    s = _connect(spec.port, spec.source)
    s.sendall(_hub_send_obj(spec, {**hello, "batch": batch}))
    buf = _read_until(s, reply)
    return Conn(s, buf.split(reply, 1)[1])


def _hub_send_obj(spec: Spec, obj: object) -> bytes:
    k = spec.kind
    if k == "hubbub-ws":
        return _ws_frame(_mp(obj))
    if k == "hubbub-wsjson":
        return _ws_frame(_js(obj), text=True)
    if k == "hubbub-json":
        return _js(obj) + b"\n"
    return _hub_frame(obj)


# -- NATS ------------------------------------------------------------------------------------------------


def _nats_open(spec: Spec) -> Conn:
    s = _connect(spec.port, spec.source)
    _read_until(s, b"\r\n")  # INFO
    s.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\nPING\r\n')
    _read_until(s, b"PONG\r\n")
    return Conn(s)


def nats_request(spec: Spec, subject: str, body: dict[str, object]) -> dict[str, object]:
    """A JetStream API call over a throwaway connection."""
    c = _nats_open(spec)
    try:
        data = json.dumps(body).encode()
        c.sock.sendall(
            b"SUB _R.req 9\r\nPUB " + subject.encode() + b" _R.req %d\r\n" % len(data) + data + b"\r\n"
        )
        buf = _read_until(c.sock, b"MSG _R.req")
        buf = _read_until(c.sock, b"\r\n", buf.split(b"MSG _R.req", 1)[1])
        head, _, rest = buf.partition(b"\r\n")
        size = int(head.split()[-1])
        while len(rest) < size:
            rest += c.sock.recv(1 << 16)
        reply: dict[str, object] = json.loads(rest[:size])
        if "error" in reply:
            raise RuntimeError(f"JetStream {subject}: {reply['error']}")
        return reply
    finally:
        c.close()


# -- MQTT 3.1.1 ------------------------------------------------------------------------------------------


def _mqtt_len(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _mqtt_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def _mqtt_open(spec: Spec) -> Conn:
    s = _connect(spec.port, spec.source)
    cid = f"b{os.getpid()}-{time.monotonic_ns()}"
    body = _mqtt_str("MQTT") + bytes([4, 0x02]) + struct.pack(">H", 0) + _mqtt_str(cid)
    s.sendall(b"\x10" + _mqtt_len(len(body)) + body)
    buf = _read_until(s, b"\x20\x02")
    return Conn(s, buf[4:])


#: MQTT packet ids whose bytes are neither 0x40 nor 0x02, so that PUBACK (40 02 hi lo) counts exactly.
_MQTT_IDS = [i for i in range(1, 65536) if (i >> 8) not in (0x40, 0x02) and (i & 0xFF) not in (0x40, 0x02)]


# -- Redis -----------------------------------------------------------------------------------------------


def resp(*args: bytes | str) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _redis_open(spec: Spec) -> Conn:
    s = _connect(spec.port, spec.source)
    s.sendall(resp("PING"))
    _read_until(s, b"+PONG\r\n")
    return Conn(s)


# -- dispatch --------------------------------------------------------------------------------------------


def open_pub(spec: Spec) -> Conn:
    """A connection ready to publish (blocking, no timeout); for ``js`` also subscribed to the ack inbox."""
    c = _open_pub(spec)
    c.sock.settimeout(None)
    return c


def _open_pub(spec: Spec) -> Conn:
    k = spec.kind
    if k.startswith("hubbub"):
        return _hub_open(spec, batch=True)
    if k in ("nats", "js"):
        c = _nats_open(spec)
        if k == "js":
            c.sock.sendall(b"SUB _I.a 1\r\nPING\r\n")
            _read_until(c.sock, b"PONG\r\n")
        return c
    if k.startswith("mqtt"):
        return _mqtt_open(spec)
    return _redis_open(spec)


def open_sub(spec: Spec, subject: str, replay_last: int = 0) -> Conn:
    """See :func:`_open_sub`; the socket is returned blocking, without a timeout."""
    c = _open_sub(spec, subject, replay_last)
    c.sock.settimeout(None)
    return c


def _open_sub(spec: Spec, subject: str, replay_last: int = 0) -> Conn:
    """A connection subscribed to ``subject`` (the subscription is confirmed before this returns).

    ``replay_last`` asks hubbub for a replay of the last N events (the reply comes first, then the events).
    For ``js`` the subscriber is a push consumer on stream ``B`` delivering to its own subject; for ``xredis``
    the caller reads with XREAD itself.
    """
    k = spec.kind
    if k.startswith("hubbub"):
        c = _hub_open(spec, batch=True)
        req: dict[str, object] = {"op": "subscribe", "id": 2, "sub": "s", "pattern": subject}
        if replay_last:
            req["last"] = replay_last
        c.sock.sendall(_hub_send_obj(spec, req))
        reply = _reply_marker(k)
        buf = _read_until(c.sock, reply, c.rest)
        return Conn(c.sock, buf.split(reply, 1)[1])
    if k == "nats":
        c = _nats_open(spec)
        c.sock.sendall(b"SUB %s 1\r\nPING\r\n" % subject.encode())
        _read_until(c.sock, b"PONG\r\n")
        return c
    if k == "js":
        c = _nats_open(spec)
        dlv = f"dlv.{os.getpid()}.{time.monotonic_ns()}"
        c.sock.sendall(b"SUB %s 1\r\nPING\r\n" % dlv.encode())
        _read_until(c.sock, b"PONG\r\n")
        cfg = {
            "deliver_subject": dlv,
            "ack_policy": "none",
            "deliver_policy": "all" if replay_last else "new",
            "filter_subject": subject,
            "max_ack_pending": -1,
        }
        nats_request(spec, "$JS.API.CONSUMER.CREATE.B", {"stream_name": "B", "config": cfg})
        return c
    if k.startswith("mqtt"):
        c = _mqtt_open(spec)
        body = struct.pack(">H", 1) + _mqtt_str(subject) + b"\x00"
        c.sock.sendall(b"\x82" + _mqtt_len(len(body)) + body)
        buf = _read_until(c.sock, b"\x90\x03", c.rest)
        return Conn(c.sock, buf.split(b"\x90\x03", 1)[1][3:])
    c = _redis_open(spec)
    if k == "redis":
        c.sock.sendall(resp("SUBSCRIBE", subject))
        buf = _read_until(c.sock, b"subscribe\r\n")
        buf = _read_until(c.sock, b":1\r\n", buf)
        c.rest = buf.split(b":1\r\n", 1)[1]
    return c


def pub_frames(spec: Spec, subject: str, payload: bytes, n: int, ack: bool) -> bytes:
    """``n`` publishes of ``payload`` to ``subject``, concatenated, ready for one ``sendall``."""
    k = spec.kind
    if k.startswith("hubbub"):
        # JSON carries the payload as ``text`` (the bench payloads are ASCII), msgpack as ``payload`` (bin).
        msg: dict[str, object] = {"op": "publish", "id": 3, "channel": subject, "ack": ack}
        if k in JSON_KINDS:
            msg["text"] = payload.decode()
        else:
            msg["payload"] = payload
        return _hub_send_obj(spec, msg) * n
    if k == "nats":
        return (b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)) * n
    if k == "js":
        return (b"PUB %s _I.a %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)) * n
    if k == "mqtt0":
        body = _mqtt_str(subject) + payload
        return (b"\x30" + _mqtt_len(len(body)) + body) * n
    if k == "mqtt1":
        out = []
        topic = _mqtt_str(subject)
        for i in range(n):
            body = topic + struct.pack(">H", _MQTT_IDS[i % len(_MQTT_IDS)]) + payload
            out.append(b"\x32" + _mqtt_len(len(body)) + body)
        return b"".join(out)
    if k == "redis":
        return resp("PUBLISH", subject, payload) * n
    return resp("XADD", subject, "*", "d", payload) * n


def deliver_marker(spec: Spec, subject: str) -> bytes:
    k = spec.kind
    if k.startswith("hubbub"):
        return _JS_EVENT if k in JSON_KINDS else _MP_EVENT
    if k == "nats":
        return b"MSG " + subject.encode() + b" "
    if k == "js":
        return b" $JS.ACK."  # push deliveries keep the stream subject and carry an ack reply subject
    if k.startswith("mqtt"):
        return _mqtt_str(subject)
    if k == "redis":
        return b"$7\r\nmessage\r\n"
    return b"$1\r\nd\r\n"


def ack_marker(spec: Spec) -> bytes:
    """Once per acknowledged publish (for kinds without acks: once per reply the server sends, or b"")."""
    k = spec.kind
    if k.startswith("hubbub"):
        return _reply_marker(k)
    if k == "js":
        return b"MSG _I.a"
    if k == "mqtt1":
        return b"\x40\x02"
    if k == "redis":
        return b":"  # PUBLISH answers :<receivers>
    if k == "xredis":
        return b"-"  # XADD answers $N\r\n<ms>-<seq>\r\n: one dash per id
    return b""


class StreamCounter:
    """Counts ``marker`` in one socket's byte stream, read into a buffer allocated once (``buf``, which the
    counters of one process may share: each read is counted before the next).

    ``s.recv(1 << 20)`` allocates a fresh 1 MiB object for every read (and ``count_stream`` copies each read
    once more to join the carried tail), a cost per byte received that a driver reading a stream of larger
    deliveries pays more of; ``recv_into`` the buffer and ``bytearray.count`` over the bytes read cost
    neither. The stream's last ``len(marker) - 1`` bytes go before the next read in the buffer, so that a
    marker split between two reads is counted once, when its end arrives (none fits whole in fewer bytes).
    """

    __slots__ = ("_buf", "_keep", "_marker", "_tail", "_view")

    def __init__(self, marker: bytes, buf: bytearray | None = None) -> None:
        self._marker = marker
        self._keep = len(marker) - 1
        self._buf = buf if buf is not None else bytearray(1 << 20)
        self._view = memoryview(self._buf)
        self._tail = b""

    def feed(self, data: bytes) -> int:
        """Count the markers ``data`` completes (bytes read before this counter took over the socket)."""
        got = 0
        while data:
            held = self._held()
            piece, data = data[: len(self._buf) - held], data[len(self._buf) - held :]
            self._buf[held : held + len(piece)] = piece
            got += self._counted(len(piece))
        return got

    def recv(self, sock: socket.socket) -> int:
        """Read once from ``sock`` (``BlockingIOError`` if nothing is there) and count the markers the read
        completes; ``-1`` once the peer closed the stream."""
        n = sock.recv_into(self._view[self._held() :])
        return self._counted(n) if n else -1

    def _held(self) -> int:
        """Put the stream's carried tail at the start of the buffer; its length."""
        held = len(self._tail)
        self._buf[:held] = self._tail
        return held

    def _counted(self, n: int) -> int:
        end = len(self._tail) + n
        got = self._buf.count(self._marker, 0, end)
        self._tail = bytes(self._buf[max(0, end - self._keep) : end])
        return got


def count_stream(chunk: bytes, tail: bytes, marker: bytes) -> tuple[int, bytes]:
    """Count ``marker`` in ``tail + chunk``, carrying the last ``len(marker) - 1`` bytes to the next call."""
    data = tail + chunk
    n = data.count(marker)
    keep = len(marker) - 1
    # A marker ending in the carried tail was counted already: keep fewer bytes than a whole marker.
    return n, data[-keep:] if keep and len(data) >= keep else data if keep else b""
