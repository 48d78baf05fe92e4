"""RFC 6455 §5.1 on the server's side: every frame a client sends is masked, or the connection is failed.

aiohttp's WebSocket reader parses frames of both directions alike and has no option to require the mask, so
hubbub checks it itself, in front of the reader (``transports/http_listener.py``). :class:`MaskCheck` is
sans-I/O: it is fed the client's bytes as they arrive and walks only the frame headers (RFC 6455 §5.2),
skipping payloads by their length, so its cost is per frame, not per byte.

Invariants: the check is at a frame boundary before the first byte it is fed and after every frame it has
walked; it never reads a payload byte; once it has found an unmasked frame it is done (the connection
fails) and is fed nothing more.
"""

from __future__ import annotations

import struct
from typing import Final, final

from hubbub.disconnect import Disconnect

__all__ = ["CLOSE_PROTOCOL_ERROR", "MaskCheck"]

#: The close frame a server sends when it fails a connection for a protocol error (RFC 6455 §5.5.1: FIN and
#: close, no mask; code 1002 and its reason).
CLOSE_PROTOCOL_ERROR: Final = (
    struct.pack("!BBH", 0x88, 2 + len(Disconnect.PROTOCOL_ERROR.reason), Disconnect.PROTOCOL_ERROR)
    + Disconnect.PROTOCOL_ERROR.reason.encode()
)


@final
class MaskCheck:
    """Finds the first unmasked frame in a client's byte stream, however the stream is cut into reads.

    :meth:`feed` returns ``-1`` while every frame header seen is masked, else the offset in the data just fed
    of the unmasked frame's header (``0`` when that header began in an earlier read: the bytes before it in
    this read, if any, were all part of that header). Hand the reader only ``data[:offset]``, then fail.
    """

    __slots__ = ("_partial", "_skip")

    def __init__(self) -> None:
        #: Bytes of a frame header cut by the end of a read (at most 9: a header's length ends at byte 10).
        self._partial = b""
        #: Bytes of the current frame (mask key and payload) still to come.
        self._skip = 0

    def feed(self, data: bytes) -> int:
        """Walk the frame headers in ``data`` (the next bytes from the client). Called from the event loop,
        one read at a time, in order."""
        n = len(data)
        i = self._skip
        if i >= n:  # the common read of a large message: payload only
            self._skip = i - n
            return -1
        base = 0
        if self._partial:
            base = len(self._partial)
            data = self._partial + data
            self._partial = b""
            n += base
        while i < n:
            if n - i < 2:
                return self._cut(data, i)
            second = data[i + 1]
            if not second & 0x80:
                return max(i - base, 0)
            length = second & 0x7F
            if length < 126:
                i += 6 + length  # 2 header bytes, 4 of mask key
            elif length == 126:
                if n - i < 4:
                    return self._cut(data, i)
                i += 8 + int.from_bytes(data[i + 2 : i + 4], "big")
            else:
                if n - i < 10:
                    return self._cut(data, i)
                i += 14 + int.from_bytes(data[i + 2 : i + 10], "big")
        self._skip = i - n
        return -1

    def _cut(self, data: bytes, i: int) -> int:
        """A header cut by the end of the read: keep its bytes for the next read."""
        self._partial = data[i:]
        self._skip = 0
        return -1
