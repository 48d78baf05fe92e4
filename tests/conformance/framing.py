"""Sans-I/O stream framing for the vector clients: bytes in, lines, length-prefixed frames or SSE events out.

Every splitter is bounded by :data:`MAX_UNIT` and does not depend on how the input is chunked.
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass

__all__ = ["MAX_UNIT", "Len32Splitter", "LineSplitter", "MqttSplitter", "SseEvent", "SseParser"]

MAX_UNIT = (
    64 * 1024 * 1024
)  # a bound on any one buffered line or frame, far above every limit the vectors use


class LineSplitter:
    """Bytes in, lines out (without the newline). ``ndjson=True`` drops a final CR and skips empty lines."""

    def __init__(self, *, ndjson: bool = False, max_line: int = MAX_UNIT) -> None:
        self._buf = bytearray()
        self._ndjson = ndjson
        self._max = max_line

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        start = 0
        while (nl := self._buf.find(b"\n", start)) >= 0:
            out.append(bytes(self._buf[start:nl]))
            start = nl + 1
        del self._buf[:start]
        if len(self._buf) > self._max:
            raise ValueError(f"line longer than {self._max} bytes")
        return self._filter(out)

    def end(self) -> list[bytes]:
        """At EOF: a last line without its newline still counts (as for a bufio.Scanner or readline)."""
        rest, self._buf = bytes(self._buf), bytearray()
        return self._filter([rest]) if rest else []

    def _filter(self, lines: list[bytes]) -> list[bytes]:
        if not self._ndjson:
            return lines
        lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]
        return [ln for ln in lines if ln]


class Len32Splitter:
    """Bytes in, frames out: a 4-byte big-endian length, then that many bytes."""

    def __init__(self, *, max_frame: int = MAX_UNIT) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while len(self._buf) >= 4:
            (size,) = struct.unpack_from(">I", self._buf)
            if size > self._max:
                raise ValueError(f"len32 frame of {size} bytes is over the runner's bound")
            if len(self._buf) < 4 + size:
                break
            out.append(bytes(self._buf[4 : 4 + size]))
            del self._buf[: 4 + size]
        return out

    def leftover(self) -> int:
        return len(self._buf)


class MqttSplitter:
    """Bytes in, MQTT control packets out (OASIS MQTT 3.1.1 §2.2): each unit is a whole packet, its fixed
    header (the type-and-flags byte and the Remaining Length, 1 to 4 bytes of 7 bits, least significant
    first, the top bit saying another follows) included, so a vector compares every byte the server sent."""

    def __init__(self, *, max_frame: int = MAX_UNIT) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while True:
            size = 0
            for i in range(1, 5):
                if len(self._buf) <= i:
                    return out
                size |= (self._buf[i] & 0x7F) << (7 * (i - 1))
                if not self._buf[i] & 0x80:
                    break
            else:
                raise ValueError("MQTT Remaining Length over 4 bytes")
            if size > self._max:
                raise ValueError(f"MQTT packet of {size} bytes is over the runner's bound")
            if len(self._buf) < i + 1 + size:
                return out
            out.append(bytes(self._buf[: i + 1 + size]))
            del self._buf[: i + 1 + size]

    def leftover(self) -> int:
        return len(self._buf)


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched server-sent event. ``event`` is ``message`` when the block had no ``event`` field."""

    event: str
    data: str
    id: str | None


class SseParser:
    """A ``text/event-stream`` parser (WHATWG rules for lines and fields). Bytes in, events out.

    A block (lines up to a blank line) becomes an event when it has a ``data``, ``event`` or ``id`` field.
    Blocks of only comments or only ``retry`` are skipped, as the vector README asks.
    """

    def __init__(self, *, max_line: int = MAX_UNIT) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._buf = ""
        self._started = False
        self._max = max_line
        self._reset()

    def _reset(self) -> None:
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._has_fields = False

    def feed(self, data: bytes, *, final: bool = False) -> list[SseEvent]:
        self._buf += self._decoder.decode(data, final)
        if not self._started and self._buf:
            self._started = True
            self._buf = self._buf.removeprefix("\ufeff")
        out: list[SseEvent] = []
        pos = 0
        while True:
            cr = self._buf.find("\r", pos)
            lf = self._buf.find("\n", pos)
            ends = [i for i in (cr, lf) if i >= 0]
            if not ends:
                break
            end = min(ends)
            if end == cr and end == len(self._buf) - 1 and not final:
                break  # a lone \r at the end may be the first half of \r\n
            line = self._buf[pos:end]
            pos = end + (2 if self._buf.startswith("\r\n", end) else 1)
            if (event := self._line(line)) is not None:
                out.append(event)
        self._buf = self._buf[pos:]
        if len(self._buf) > self._max:
            raise ValueError(f"SSE line longer than {self._max} characters")
        return out

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            event = None
            if self._has_fields:
                event = SseEvent(self._event or "message", "\n".join(self._data), self._id)
            self._reset()
            return event
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_fields = True
        elif name == "event":
            self._event = value
            self._has_fields = True
        elif name == "id":
            self._id = value
            self._has_fields = True
        # retry and unknown fields are ignored
        return None
