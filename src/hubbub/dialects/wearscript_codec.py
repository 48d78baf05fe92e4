"""The WearScript codec (protocols/wearscript.md §1, mapping.md §4-§5): one binary frame is one msgpack array
``[channel, arg1, …]``; :func:`decode_frame` reads one (or raises :class:`BadFrame` with its close code),
:func:`pack` writes msgpack as the hub sends it, :func:`render_event` an event of any dialect as a frame.
The dialect (:mod:`hubbub.dialects.wearscript`) re-exports all of it.

Concurrency contract: pure functions, thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import msgpack

from hubbub.disconnect import Disconnect
from hubbub.events import Event

__all__ = [
    "CLOSE_INVALID",
    "CLOSE_POLICY",
    "CLOSE_TOO_BIG",
    "CLOSE_UNSUPPORTED",
    "CONTENT_TYPE",
    "HEAD_HEADER",
    "MAX_DEPTH",
    "BadFrame",
    "Frame",
    "decode_frame",
    "pack",
    "render_event",
]

#: Content type of every WearScript data message in the log (mapping.md §4).
CONTENT_TYPE: Final = "application/msgpack"
#: Deepest nesting of arrays and maps a frame may hold (§8).
MAX_DEPTH: Final = 64

#: The pseudo-header that keeps a data message's frame head (its array header and channel string, hex) when
#: the sender encoded them otherwise than :func:`pack` does (a str8 name, a wide array header), so that the
#: event still goes out byte-identical to the frame it came in (mapping.md §5.2). Absent in the usual case.
HEAD_HEADER: Final = ":wearscript.head"

# WebSocket close reasons (§8).
CLOSE_UNSUPPORTED: Final = Disconnect.UNSUPPORTED_DATA  # 1003: a text frame
CLOSE_INVALID: Final = Disconnect.INVALID_PAYLOAD  # 1007: not one msgpack array with a string channel, …
CLOSE_POLICY: Final = Disconnect.POLICY_VIOLATION  # 1008: too many channels, or a publish not allowed
CLOSE_TOO_BIG: Final = Disconnect.MESSAGE_TOO_BIG  # 1009: over limits.max_frame


class BadFrame(Exception):
    """A frame the dialect refuses; the connection closes with ``code`` (§8)."""

    def __init__(self, code: Disconnect, why: str) -> None:
        super().__init__(why)
        self.code = code


# -- the codec ----------------------------------------------------------------------------------------------


def pack(value: Any) -> bytes:
    """msgpack in the old-spec-compatible form the hub sends (§1): strings and bytes as raw (fixstr, str16,
    str32; never str8 or bin), the smallest integers and headers, floats as float64. A string read leniently
    from raw that was not UTF-8 packs back to the same bytes."""
    out: bytes = msgpack.packb(value, use_bin_type=False, unicode_errors="surrogateescape")
    return out


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _header_len(first: int) -> int:
    """Length of a msgpack array header from its first byte (0 when it is not an array)."""
    if 0x90 <= first <= 0x9F:
        return 1
    return 3 if first == 0xDC else 5 if first == 0xDD else 0


def _ext(code: int, data: bytes) -> bytes:
    return bytes(data)  # ext values are kept as opaque bytes (§1)


def _too_deep(value: Any) -> bool:
    """Does an argument nest deeper than :data:`MAX_DEPTH` (the frame's own array being level 1)?"""
    stack: list[tuple[Any, int]] = [(value, 2)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, list):
            if depth > MAX_DEPTH:
                return True
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, dict):
            if depth > MAX_DEPTH:
                return True
            for k, x in v.items():
                stack.append((k, depth + 1))
                stack.append((x, depth + 1))
    return False


def _unpacker(data: bytes) -> msgpack.Unpacker:
    # Old-spec raw and new-spec str both decode to str; raw that is not UTF-8 keeps its bytes as
    # surrogate escapes, so nothing is lost (§1 "decoding is lenient").
    up = msgpack.Unpacker(
        raw=False,
        unicode_errors="surrogateescape",
        ext_hook=_ext,
        strict_map_key=False,
        max_buffer_size=max(len(data), 1),
    )
    up.feed(data)
    return up


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame. ``name`` is element 0; ``args`` the other elements, decoded; ``args_bytes`` the
    msgpack array of the arguments, their bytes exactly as received (the payload stored in the log);
    ``head`` the frame's bytes before the arguments (its array header and the channel string)."""

    name: str
    args: tuple[Any, ...]
    args_bytes: bytes
    head: bytes = b""

    def odd_head(self) -> str:
        """The :data:`HEAD_HEADER` value for this frame: ``""`` when its head is the one :func:`pack` writes
        (so rendering the event gives the frame back as it is), else the head in hex."""
        if self.head == _array_header(len(self.args) + 1) + pack(self.name):
            return ""
        return self.head.hex()


def decode_frame(data: bytes, max_frame: int = 1 << 20) -> Frame:
    """Decode one binary frame, or raise :class:`BadFrame` with the close code of §8."""
    if len(data) > max_frame:
        raise BadFrame(CLOSE_TOO_BIG, f"frame over {max_frame} bytes")
    up = _unpacker(data)
    try:
        n = up.read_array_header()
        if n == 0:
            raise BadFrame(CLOSE_INVALID, "an empty array")
        name = up.unpack()
        start = up.tell()
        args = tuple(up.unpack() for _ in range(n - 1))
        end = up.tell()
    except BadFrame:
        raise
    except (msgpack.OutOfData, msgpack.UnpackException, ValueError, TypeError) as exc:
        raise BadFrame(CLOSE_INVALID, f"not one msgpack array: {type(exc).__name__}") from None
    except RecursionError:
        raise BadFrame(CLOSE_INVALID, f"nested deeper than {MAX_DEPTH}") from None
    if end != len(data):
        raise BadFrame(CLOSE_INVALID, "more than one msgpack value")
    if not isinstance(name, str):
        raise BadFrame(CLOSE_INVALID, "element 0 is not a string")
    if any(_too_deep(a) for a in args if isinstance(a, list | dict)):
        raise BadFrame(CLOSE_INVALID, f"nested deeper than {MAX_DEPTH}")
    return Frame(name, args, _array_header(n - 1) + data[start:end], data[:start])


def render_event(name: str, event: Event) -> bytes:
    """The frame for an event (mapping.md §5): ``[name, *args]``. A msgpack payload that is one array gives
    the arguments, their bytes unchanged (so an event a WearScript client published goes out as it came);
    another msgpack value is one argument; any other payload is one string argument (raw bytes when it is
    not UTF-8). A frame head kept in :data:`HEAD_HEADER` is used as it came when it names the same channel
    and the same number of arguments."""
    payload = event.payload
    head = pack(name)
    if event.content_type == CONTENT_TYPE and payload:
        hl = _header_len(payload[0])
        if hl:
            try:
                up = _unpacker(payload)
                n = up.read_array_header()
                for _ in range(n):
                    up.skip()
                if up.tell() == len(payload):
                    odd = event.headers.get(HEAD_HEADER) if event.headers else None
                    if odd and _head_fits(odd, name, n):
                        return bytes.fromhex(odd) + payload[hl:]
                    return _array_header(n + 1) + head + payload[hl:]
            except (msgpack.OutOfData, msgpack.UnpackException, ValueError):
                pass
        else:
            try:
                up = _unpacker(payload)
                up.skip()
                if up.tell() == len(payload):
                    return b"\x92" + head + payload
            except (msgpack.OutOfData, msgpack.UnpackException, ValueError):
                pass
    try:
        arg: str | bytes = payload.decode("utf-8")
    except UnicodeDecodeError:
        arg = payload
    return b"\x92" + head + pack(arg)


def _head_fits(odd: str, name: str, n_args: int) -> bool:
    """Is ``odd`` (hex) an array header of ``n_args + 1`` elements followed by the string ``name``?"""
    try:
        data = bytes.fromhex(odd)
        up = _unpacker(data)
        if up.read_array_header() != n_args + 1:
            return False
        return bool(up.unpack() == name and up.tell() == len(data))
    except (msgpack.OutOfData, msgpack.UnpackException, ValueError, TypeError):
        return False
