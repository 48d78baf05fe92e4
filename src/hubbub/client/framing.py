"""Byte framing of the native protocol's client side, sans-I/O (native.md §1).

:class:`Framing` turns the bytes a client reads into whole messages and wraps the messages it sends, for
the three ways a native connection carries frames over a byte stream:

* ``lines``: raw TCP, one JSON frame per line (``\\n``; an empty line or a ``\\r`` before it is allowed);
* ``length``: raw TCP, msgpack frames each behind a 4-byte big-endian length;
* ``ws``: a WebSocket spoken over a plain socket (RFC 6455, after the upgrade): the server's frames read by
  the parser the server reads its clients' with (:class:`~hubbub.ws_frames.FrameParser`: unmasked, no
  extension, fragments reassembled), pings answered, client frames masked. A frame that breaks RFC 6455
  raises :class:`~hubbub.errors.BadFrame`.

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

from hubbub.disconnect import Disconnect
from hubbub.errors import BadFrame, FrameTooLarge
from hubbub.ws_frames import CLOSE, PING, PONG, FrameError, FrameParser

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

    __slots__ = ("_frames", "buf", "closed", "control", "kind", "max_frame")

    def __init__(self, kind: FramingKind, max_frame: int) -> None:
        self.kind: FramingKind = kind
        self.max_frame = max_frame
        self.buf = bytearray()
        self._frames = FrameParser(max_frame, server=False, decode_text=False) if kind == "ws" else None
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
        if self._frames is not None:
            return self._ws(data)
        self.buf += data
        if self.kind == "length":
            return self._lengths()
        return self._lines()

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

    def _ws(self, data: bytes) -> list[bytes]:
        # The server's frames, by the parser the server reads its clients' with (hubbub.ws_frames): a
        # server's frames unmasked, no extension, fragments reassembled up to max_frame.
        frames = self._frames
        assert frames is not None
        frames.feed(data)
        out: list[bytes] = []
        try:
            while (item := frames.next()) is not None:
                op, payload = item
                assert isinstance(payload, bytes)  # decode_text is off
                if op == PING:
                    self.control += ws_frame(0xA, payload)
                elif op == CLOSE:
                    self.closed = True
                    break
                elif op != PONG:
                    out.append(payload)
        except FrameError as e:
            if e.code == Disconnect.MESSAGE_TOO_BIG:
                raise FrameTooLarge(f"server message over {self.max_frame}") from None
            raise BadFrame(f"server WebSocket frame: {e}") from None
        return out
