"""RFC 6455 frames read from a byte stream, sans-I/O: :class:`FrameParser` turns the bytes of one WebSocket
connection (after the upgrade) into whole messages and control frames, enforcing the protocol's rules.

The server's reader (``transports/ws_socket.py``) parses the frames of a client: every one must be masked
(RFC 6455 §5.1). The same parser with ``server=False`` reads a server's frames, which must not be.

Rules (each violation raises :class:`FrameError` with the close code the connection is failed with):

* a frame masked or not as its side requires (§5.1), else 1002;
* RSV1-3 clear: hubbub negotiates no extension (§5.2), else 1002;
* opcodes 0-2 and 8-10 only (§5.2), else 1002;
* control frames final and at most 125 bytes (§5.5), else 1002;
* a continuation only inside a fragmented message, a new data frame never inside one (§5.4), else 1002;
* a message (all its fragments) at most ``max_message`` bytes, else 1009: the limit is checked from each
  frame's header, before its payload is buffered, so a partial frame is held only up to the limit;
* text messages valid UTF-8 (§8.1), else 1007; close frames with no payload or a 2-byte code that is
  allowed on the wire (§7.4) and a UTF-8 reason, else 1002 (1007 for the reason).

Invariants: the bytes held are at most one frame header, one frame's payload below the limit and one
fragmented message below the limit, plus what one :meth:`FrameParser.feed` brought; nothing is held once
every frame fed has been taken (an idle connection keeps an empty parser). Parsing does not depend on how the
stream is cut into reads. Once :meth:`FrameParser.next` has raised, the parser is failed and is fed nothing
more. Concurrency contract: one owner, no locking.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import Final, TypeAlias, final

from hubbub.disconnect import Disconnect

__all__ = [
    "BINARY",
    "CLOSE",
    "CONTINUATION",
    "PING",
    "PONG",
    "TEXT",
    "Frame",
    "FrameError",
    "FrameParser",
    "close_payload",
    "control_frame",
    "unmask",
    "unmask_into",
]

CONTINUATION: Final = 0x0
TEXT: Final = 0x1
BINARY: Final = 0x2
CLOSE: Final = 0x8
PING: Final = 0x9
PONG: Final = 0xA

#: One parsed item: ``(opcode, payload)``. A text message's payload is ``str`` (decoded, ``decode_text``),
#: every other payload ``bytes``; a close frame's is its raw payload (code and reason).
Frame: TypeAlias = tuple[int, bytes | str]

_H16: Final = struct.Struct("!H")
_H64: Final = struct.Struct("!Q")

#: Close codes a peer may send (RFC 6455 §7.4.1 and the IANA registry; 3000-4999 for libraries and
#: applications). 1004-1006 and 1015 are never sent on the wire.
_SENDABLE: Final = frozenset((1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014))


@final
class FrameError(Exception):
    """The stream broke RFC 6455: fail the connection with ``code`` (the reason says why)."""

    def __init__(self, code: Disconnect, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def unmask_into(key: bytes, data: bytearray) -> None:
    """XOR ``data`` in place with the 4-byte masking ``key`` (RFC 6455 §5.3), with one big-integer XOR (a
    :class:`FrameParser` may be given a compiled one: the server's is aiohttp's)."""
    n = len(data)
    if n:
        keys = (key * ((n >> 2) + 1))[:n]
        data[:] = (int.from_bytes(data, "little") ^ int.from_bytes(keys, "little")).to_bytes(n, "little")


def unmask(key: bytes, payload: bytes | bytearray) -> bytes:
    """``payload`` XORed with the 4-byte masking ``key`` (RFC 6455 §5.3)."""
    data = bytearray(payload)
    unmask_into(key, data)
    return bytes(data)


def control_frame(opcode: int, payload: bytes) -> bytes:
    """A server's control frame (FIN set, no mask) of ``payload`` (at most 125 bytes)."""
    return bytes((0x80 | opcode, len(payload))) + payload


def close_payload(code: int, reason: str = "") -> bytes:
    """The payload of a close frame: ``code`` and ``reason`` cut to fit the 125 bytes of a control frame."""
    return _H16.pack(code) + reason.encode()[:123]


@final
class FrameParser:
    """One connection's frames (see the module docstring): :meth:`feed` the bytes read, then take items with
    :meth:`next` until it returns None."""

    __slots__ = ("_buf", "_decode", "_into", "_masked", "_op", "_parts", "_pos", "max_message")

    def __init__(
        self,
        max_message: int,
        *,
        server: bool = True,
        decode_text: bool = True,
        unmask: Callable[[bytes, bytearray], None] = unmask_into,
    ) -> None:
        self.max_message = max_message
        #: XORs a payload in place with its masking key (``unmask_into``, or a compiled equivalent).
        self._into = unmask
        #: Masked frames expected (a server reading a client) or unmasked ones (a client reading a server).
        self._masked = 0x80 if server else 0
        self._decode = decode_text
        #: The bytes not parsed yet start at ``_pos`` (``bytes`` while a read is parsed in place, a
        #: ``bytearray`` once a frame spans reads).
        self._buf: bytes | bytearray = b""
        self._pos = 0
        #: The opcode of the fragmented message being reassembled, or -1; its fragments so far.
        self._op = -1
        self._parts: list[bytes] | None = None

    @property
    def buffered(self) -> int:
        """Bytes held: unparsed input and the fragments of an unfinished message."""
        held = len(self._buf) - self._pos
        return held + sum(map(len, self._parts)) if self._parts else held

    def feed(self, data: bytes) -> None:
        """Add the next bytes of the stream."""
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            self._buf, self._pos = data, 0
            return
        if isinstance(buf, bytearray):
            if pos:
                del buf[:pos]
            buf += data
        else:
            self._buf = bytearray(memoryview(buf)[pos:])
            self._buf += data
        self._pos = 0

    def next(self) -> Frame | None:
        """The next message or control frame, or None until more bytes are fed. Raises :class:`FrameError`
        when the stream breaks a rule."""
        # The common frame first: a whole text or binary message of up to 64 KiB, masked as the side
        # requires, outside a fragmented message. Anything else takes the general path (_next).
        buf, i = self._buf, self._pos
        end = len(buf)
        if end - i < 2:
            return self._consumed()
        first, second = buf[i], buf[i + 1]
        if first not in (0x81, 0x82) or (second & 0x80) != self._masked or self._op >= 0:
            return self._next()
        n = second & 0x7F
        at = i + 2
        if n > 125:
            if n == 127:
                return self._next()
            if end - at < 2:
                return self._consumed()
            n = buf[at] << 8 | buf[at + 1]
            at += 2
        if n > self.max_message:
            raise FrameError(Disconnect.MESSAGE_TOO_BIG, "message too big")
        if self._masked:
            stop = at + 4 + n
            if stop > end:
                return self._consumed()
            payload = bytearray(buf[at + 4 : stop])
            self._into(bytes(buf[at : at + 4]), payload)
        else:
            stop = at + n
            if stop > end:
                return self._consumed()
            payload = bytearray(buf[at:stop])
        self._pos = stop
        if first == 0x82:
            return BINARY, bytes(payload)
        if not self._decode:
            return TEXT, bytes(payload)
        try:
            return TEXT, payload.decode()
        except UnicodeDecodeError:
            raise FrameError(Disconnect.INVALID_PAYLOAD, "text not UTF-8") from None

    def take(self, most: int) -> list[bytes | str]:
        """Up to ``most`` messages of the common kind (:meth:`next`'s first case), in order, in one call (a
        burst that came in one read): it stops before any other frame, and before a frame that breaks a
        rule, which :meth:`next` then takes (or raises for)."""
        out: list[bytes | str] = []
        if self._op >= 0:
            return out
        buf, i = self._buf, self._pos
        end = len(buf)
        masked, limit, decode, into = self._masked, self.max_message, self._decode, self._into
        add = out.append
        bulk = True
        while end - i >= 2 and len(out) < most:
            first, second = buf[i], buf[i + 1]
            if first not in (0x81, 0x82) or (second & 0x80) != masked:
                break
            n = second & 0x7F
            at = i + 2
            if n > 125:
                if n == 127 or end - at < 2:
                    break
                n = buf[at] << 8 | buf[at + 1]
                at += 2
            if n > limit:
                break
            if masked:
                stop = at + 4 + n
                if stop > end:
                    break
                # A burst of frames like this one (a client's messages of one size) is unmasked at once. Tried
                # only where the next frame's header is this one's: a stream of changing sizes would otherwise
                # pay the run's column scan of the rest of the read at every frame.
                if bulk and buf[stop : stop + at - i] == buf[i:at]:
                    size = stop - i
                    k = min((end - i) // size, most - len(out))
                    if k >= 2 and n <= 32 * k:
                        got = _unmask_burst(buf, i, at - i, n, k, first == 0x81 and decode, into)
                        if got:
                            out += got
                            i += len(got) * size
                            continue
                        # A message of the run is not UTF-8: read frame by frame up to it (and not again in
                        # this call, as the run's pass was wasted).
                        bulk = got is None
                payload = bytearray(buf[at + 4 : stop])
                into(bytes(buf[at : at + 4]), payload)
            else:
                stop = at + n
                if stop > end:
                    break
                payload = bytearray(buf[at:stop])
            if first == 0x82 or not decode:
                add(bytes(payload))
            else:
                try:
                    add(payload.decode())
                except UnicodeDecodeError:
                    break
            i = stop
        self._pos = i
        self._consumed()
        return out

    def _next(self) -> Frame | None:
        """:meth:`next` for every frame (fragments, control frames, long lengths, errors)."""
        while True:
            buf, i = self._buf, self._pos
            end = len(buf)
            if end - i < 2:
                return self._consumed()
            first, second = buf[i], buf[i + 1]
            if (second & 0x80) != self._masked:
                raise FrameError(Disconnect.PROTOCOL_ERROR, "frame masked wrongly")
            if first & 0x70:
                raise FrameError(Disconnect.PROTOCOL_ERROR, "reserved bits set")
            op = first & 0x0F
            fin = first & 0x80
            n = second & 0x7F
            at = i + 2
            if op >= CLOSE:
                if op > PONG:
                    raise FrameError(Disconnect.PROTOCOL_ERROR, "unknown opcode")
                if n > 125 or not fin:
                    raise FrameError(Disconnect.PROTOCOL_ERROR, "control frame fragmented or too long")
            elif op > BINARY:
                raise FrameError(Disconnect.PROTOCOL_ERROR, "unknown opcode")
            elif n == 126:
                if end - at < 2:
                    return self._consumed()
                (n,) = _H16.unpack_from(buf, at)
                at += 2
            elif n == 127:
                if end - at < 8:
                    return self._consumed()
                (n,) = _H64.unpack_from(buf, at)
                at += 8
            if op < CLOSE:
                if (op == CONTINUATION) != (self._op >= 0):
                    raise FrameError(Disconnect.PROTOCOL_ERROR, "continuation out of place")
                if n > self.max_message - (sum(map(len, self._parts)) if self._parts else 0):
                    raise FrameError(Disconnect.MESSAGE_TOO_BIG, "message too big")
            key = b""
            if self._masked:
                key = bytes(buf[at : at + 4])
                at += 4
            if end - at < n:
                return self._consumed()
            payload = bytes(buf[at : at + n])
            self._pos = at + n
            if key:
                payload = unmask(key, payload)
            if op >= CLOSE:
                if op == CLOSE:
                    _check_close(payload)
                return op, payload
            if not fin:
                if op:
                    self._op, self._parts = op, [payload]
                else:
                    assert self._parts is not None
                    self._parts.append(payload)
                continue
            if op == CONTINUATION:
                assert self._parts is not None
                self._parts.append(payload)
                op, payload = self._op, b"".join(self._parts)
                self._op, self._parts = -1, None
            if op == TEXT and self._decode:
                try:
                    return op, payload.decode()
                except UnicodeDecodeError:
                    raise FrameError(Disconnect.INVALID_PAYLOAD, "text not UTF-8") from None
            return op, payload

    def _consumed(self) -> Frame | None:
        """Out of whole frames: drop what was parsed (nothing is held once the input is used up)."""
        if self._pos >= len(self._buf):
            self._buf, self._pos = b"", 0
        return None


def _unmask_burst(
    buf: bytes | bytearray,
    i: int,
    head: int,
    n: int,
    k: int,
    text: bool,
    into: Callable[[bytes, bytearray], None],
) -> list[bytes | str] | None:
    """The messages of the longest run (of at most ``k``, at least two) of masked frames from ``buf[i]`` that
    are alike but for their masking keys and payloads: the same first byte (a whole text or binary message)
    and the same ``head`` header bytes (so the same payload length ``n``); ``into`` unmasks a payload in
    place. None when there is no such run; an empty list when a text message of it is not UTF-8 (the
    caller's frame by frame reading then finds which).

    Each step takes the whole run, in C: the header bytes compared a column at a time (one strided slice per
    byte offset), the frames split into keys and payloads by one ``struct`` format, then each payload copied,
    unmasked and decoded by ``map``: no Python step per frame."""
    size = head + 4 + n
    for o in range(head):
        col = buf[i + o : i + k * size : size]
        k = min(k, k - len(col.lstrip(col[:1])))  # the frames, from the first, whose byte o is the first's
    if k < 2:
        return None
    frames = struct.iter_unpack(f"{head}x4s{n}s", buf[i : i + k * size])
    keys, payloads = zip(*frames, strict=True)
    plain = list(map(bytearray, payloads))
    deque(map(into, keys, plain), maxlen=0)
    if not text:
        return list(map(bytes, plain))
    try:
        return list(map(bytearray.decode, plain))
    except UnicodeDecodeError:
        return []


def _check_close(payload: bytes) -> None:
    """A close frame's payload: nothing, or a code a peer may send and a UTF-8 reason (RFC 6455 §5.5.1)."""
    if not payload:
        return
    if len(payload) < 2:
        raise FrameError(Disconnect.PROTOCOL_ERROR, "close frame of one byte")
    (code,) = _H16.unpack_from(payload)
    if code not in _SENDABLE and not 3000 <= code <= 4999:
        raise FrameError(Disconnect.PROTOCOL_ERROR, "close code not allowed")
    try:
        payload[2:].decode()
    except UnicodeDecodeError:
        raise FrameError(Disconnect.INVALID_PAYLOAD, "close reason not UTF-8") from None
