"""Byte framing of the native protocol's client side, sans-I/O (native.md §1).

:class:`Framing` turns the bytes a client reads into whole messages and wraps the messages it sends, for
the three ways a native connection carries frames over a byte stream:

* ``lines``: raw TCP, one JSON frame per line (``\\n``; an empty line or a ``\\r`` before it is allowed);
* ``length``: raw TCP, msgpack frames each behind a 4-byte big-endian length;
* ``ws``: a WebSocket spoken over a plain socket (RFC 6455, after the upgrade): messages of any opcode
  reassembled from their fragments, pings answered, client frames masked.

A client that gets whole messages from a WebSocket library (aiohttp) needs no framing: its messages go to
:class:`~hubbub.client.protocol.ClientProtocol` as they are.

Every read is bounded by ``max_frame``: a length, a line or a message over it raises
:class:`~hubbub.errors.FrameTooLarge` (the stream cannot be resynchronised: the caller drops the
connection). Parsing does not depend on chunking. Concurrency contract: one owner, no locking.
"""

from __future__ import annotations

import os
import struct
from typing import Final, Literal, TypeAlias

from hubbub.errors import FrameTooLarge

__all__ = ["Framing", "FramingKind", "ws_frame"]

FramingKind: TypeAlias = Literal["lines", "length", "ws"]

_LEN: Final = struct.Struct(">I")


def ws_frame(op: int, body: bytes) -> bytes:
    """A final WebSocket frame of opcode ``op``, masked as client frames must be (RFC 6455 §5.3): a random
    key, applied with one big-integer XOR."""
    n = len(body)
    if n < 126:
        head = bytes([0x80 | op, 0x80 | n])
    elif n < 1 << 16:
        head = bytes([0x80 | op, 0x80 | 126]) + struct.pack(">H", n)
    else:
        head = bytes([0x80 | op, 0x80 | 127]) + struct.pack(">Q", n)
    key = os.urandom(4)
    if not body:
        return head + key
    k = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return head + key + (int.from_bytes(body, "big") ^ k).to_bytes(n, "big")


class Framing:
    """One connection's framing (see the module docstring). ``feed`` received bytes and get the message
    bodies back, in order; ``wrap`` a body for sending. ``control`` collects frames the caller must send
    back (WebSocket pongs); ``closed`` is set once the peer said it closes (nothing after counts)."""

    __slots__ = ("buf", "closed", "control", "kind", "max_frame", "parts")

    def __init__(self, kind: FramingKind, max_frame: int) -> None:
        self.kind: FramingKind = kind
        self.max_frame = max_frame
        self.buf = bytearray()
        self.parts = bytearray()  # a fragmented WebSocket message so far
        self.control = bytearray()
        self.closed = False

    @property
    def ws(self) -> bool:
        return self.kind == "ws"

    def wrap(self, body: bytes) -> bytes:
        if self.kind == "length":
            return _LEN.pack(len(body)) + body
        if self.kind == "lines":
            return body + b"\n"
        return ws_frame(0x2, body)

    def feed(self, data: bytes) -> list[bytes]:
        if self.closed:  # nothing after a close frame counts
            return []
        self.buf += data
        if self.kind == "length":
            return self._lengths()
        if self.kind == "lines":
            return self._lines()
        return self._ws()

    def _lengths(self) -> list[bytes]:
        out: list[bytes] = []
        buf = self.buf
        while len(buf) >= 4:
            (n,) = _LEN.unpack_from(buf)
            if n > self.max_frame:
                raise FrameTooLarge(f"server frame of {n} bytes over {self.max_frame}")
            if len(buf) < 4 + n:
                break
            out.append(bytes(buf[4 : 4 + n]))
            del buf[: 4 + n]
        return out

    def _lines(self) -> list[bytes]:
        out: list[bytes] = []
        buf = self.buf
        at = 0
        while True:
            end = buf.find(b"\n", at)
            if end < 0:
                break
            if end - at > self.max_frame + 1:  # one byte more for a "\r"
                raise FrameTooLarge(f"server line of {end - at} bytes over {self.max_frame}")
            line = bytes(buf[at:end]).rstrip(b"\r")
            if line:
                out.append(line)
            at = end + 1
        del buf[:at]
        if len(buf) > self.max_frame + 1:
            raise FrameTooLarge(f"server line over {self.max_frame}")
        return out

    def _ws(self) -> list[bytes]:
        out: list[bytes] = []
        buf = self.buf
        while len(buf) >= 2:
            fin, op, masked, n = buf[0] & 0x80, buf[0] & 0x0F, buf[1] & 0x80, buf[1] & 0x7F
            at = 2
            if n == 126:
                if len(buf) < 4:
                    break
                (n,) = struct.unpack_from(">H", buf, 2)
                at = 4
            elif n == 127:
                if len(buf) < 10:
                    break
                (n,) = struct.unpack_from(">Q", buf, 2)
                at = 10
            if n > self.max_frame:
                raise FrameTooLarge(f"server message of {n} bytes over {self.max_frame}")
            mask = b""
            if masked:
                mask = bytes(buf[at : at + 4])
                at += 4
            if len(buf) < at + n:
                break
            payload = bytes(buf[at : at + n])
            del buf[: at + n]
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if op == 0x9:  # ping
                self.control += ws_frame(0xA, payload)
            elif op == 0x8:
                self.closed = True
                break
            elif op in (0x0, 0x1, 0x2):
                self.parts += payload
                if len(self.parts) > self.max_frame:
                    raise FrameTooLarge(f"server message over {self.max_frame}")
                if fin:
                    out.append(bytes(self.parts))
                    self.parts.clear()
        return out
