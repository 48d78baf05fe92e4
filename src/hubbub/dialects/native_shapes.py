"""The byte layout of one client's common msgpack publishes, learned once and then matched a burst at a time.

A pipelining client sends its publishes as the same bytes each time but for the request id, the payload
and maybe the channel: one encoder, one key order, one id width, one payload size. :func:`learn_msgpack`
reads such a frame's layout (a :class:`MsgpackShape`: the frame's bytes, fixed but for the id, the channel
and the payload, each of a fixed width at a fixed place), and :meth:`MsgpackShape.take` reads ``k``
consecutive frames of it (length prefix included) as columns: the fixed bytes checked a column at a time
(one strided slice of the burst each), the three values read by one ``struct`` format, the id as an integer.
No msgpack decode, no map and no key strings per frame, and no Python step per frame. The stream decoder
(:mod:`.native_stream`) uses it for a read's publishes and decodes every other frame as before. The layout
is also a fixed-length regular expression, which checks the first frame of a burst and names the layout.

Why the reading is exact: every piece of the layout has a fixed length, so ``k`` frames of it tile a region
of ``k`` frames' length, frame by frame, as the length-prefixed framing reads it. A frame that matches
has the learned frame's bytes everywhere but in three values: the id is an unsigned integer of the learned
width (any bytes are one, but a positive fixint's, below 0x80; :data:`~.native_commands.MAX_ID` is
checked), the payload a ``bin`` of the learned length (any bytes are one), the channel a ``str`` of the
learned length whose bytes must be one the decoder has already read as a valid channel (``channels``, bytes
to canonical); so ``msgpack.unpackb`` and the common-shape checks would read that frame as the same publish.
Only a frame whose every key is a distinct one of ``op``, ``id``, ``channel``, ``payload`` and ``ack``, each
value of the type the common shape takes, is learned; anything else (another encoding of a value, a
duplicate key) gives no shape.

Concurrency contract: a shape is immutable once built and may be shared; the compiled expressions are kept
in a bounded module cache (the event loop thread only, as every decoder).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping, Sequence
from itertools import repeat
from typing import Final, TypeVar

from .native_commands import MAX_ID

__all__ = ["TAKE_MAX_CHARS", "JsonLayouts", "JsonShape", "MsgpackShape", "learn_json", "learn_msgpack"]

_from_bytes = int.from_bytes
#: A raw channel: msgpack's bytes or JSON's text.
K = TypeVar("K", bytes, str)

#: Compiled expressions by source: compiling one costs some 200 µs, and clients of one kind share a layout.
_COMPILED: dict[bytes, re.Pattern[bytes]] = {}
_COMPILED_MAX: Final = 64

#: msgpack's unsigned integer formats by type byte: the width of the value after it.
_UINT_WIDTH: Final = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
#: ``struct``'s big-endian unsigned integer code of each width.
_UINT_CODE: Final = {1: "B", 2: "H", 4: "I", 8: "Q"}
#: msgpack's bin formats by type byte: the width of the length after it.
_BIN_WIDTH: Final = {0xC4: 1, 0xC5: 2, 0xC6: 4}
_PUBLISH: Final = b"\xa7publish"


def _canonical(raw: Sequence[K], channels: Mapping[K, str]) -> list[str] | None:
    """The canonical channels of a burst's raw channel texts (``channels``: the decoder's known ones, raw to
    canonical), or None when one is unknown (the burst is then read frame by frame: the general path
    canonicalizes or refuses it)."""
    first = raw[0]
    if raw.count(first) == len(raw):  # a burst to one channel, as a rule: one look-up
        channel = channels.get(first)
        return None if channel is None else [channel] * len(raw)
    chans = list(map(channels.get, raw))
    return None if None in chans else chans  # type: ignore[return-value]


class MsgpackShape:
    """One learned layout of a common publish frame (see the module docstring)."""

    __slots__ = (
        "_id_max",
        "_literals",
        "_match",
        "_template",
        "_unpack",
        "_varying",
        "ack",
        "channel_group",
        "fresh",
        "id_group",
        "payload_group",
        "size",
        "source",
    )

    def __init__(
        self,
        source: bytes,
        pattern: re.Pattern[bytes],
        frame: bytes,
        ack: bool,
        fields: Sequence[tuple[int, int, str]],
        groups: tuple[int, int, int],
    ) -> None:
        #: The expression's source: two shapes of one source are one layout.
        self.source = source
        #: Its expression was compiled for it (not found in the module's cache).
        self.fresh = False
        self._match = pattern.match
        #: Bytes of one frame, its 4-byte length prefix included.
        self.size = size = len(frame)
        self.ack = ack
        self.id_group, self.channel_group, self.payload_group = groups
        code = fields[groups[0]][2]
        # Above every id: a fixint's byte is below 0x80 (a byte of 0x80 or more is another type); an id 4 or
        # 8 bytes wide may be MAX_ID or more, which the general path refuses.
        self._id_max = 0x80 if code == "b" else MAX_ID if code in ("I", "Q") else 1 << 16
        # The frame's values as columns: ``struct`` reads the id (as an integer), the channel and the payload
        # of every frame of a burst in one call, in frame order (the groups' order), skipping the rest.
        fmt = [">"]
        at = 0
        varying: list[int] = []
        for offset, width, code in fields:
            fmt.append(f"{offset - at}x{width if code == 's' else ''}{'B' if code == 'b' else code}")
            varying += range(offset, offset + width)
            at = offset + width
        fmt.append(f"{size - at}x")
        self._unpack = struct.Struct("".join(fmt)).iter_unpack
        # Every other byte is the learned frame's: the burst is checked either with those bytes compared a
        # column at a time (one strided slice each), or, when fewer bytes vary than stay, with the varying
        # ones zeroed a column at a time and the whole compared once with the frame so zeroed, repeated.
        template = bytearray(frame)
        for j in varying:
            template[j] = 0
        self._template = bytes(template)
        fixed = sorted(set(range(size)) - set(varying))
        if len(varying) <= len(fixed):
            self._varying: tuple[int, ...] | None = tuple(varying)
            self._literals: tuple[tuple[int, int], ...] = ()
        else:
            self._varying = None
            self._literals = tuple((j, frame[j]) for j in fixed)

    def matches(self, data: bytes, pos: int) -> bool:
        """Whether the frame at ``pos`` (its length prefix) has this layout."""
        return self._match(data, pos, pos + self.size) is not None

    def take(
        self, data: bytes, pos: int, k: int, channels: dict[bytes, str]
    ) -> tuple[list[tuple[int, bool]], list[str], tuple[bytes, ...]] | None:
        """The replies (``(id, ack)``), canonical channels and payloads of the ``k`` frames from ``pos``
        (which ``data`` holds whole), or None unless every one of them has this layout, an id below
        :data:`MAX_ID` and a channel in ``channels`` (raw bytes to canonical)."""
        size = self.size
        end = pos + k * size
        if len(data) < end:
            return None
        burst = data[pos:end]
        varying = self._varying
        if varying is not None:
            buf = bytearray(burst)
            zeros = bytes(k)
            for j in varying:
                buf[j::size] = zeros
            if buf != self._template * k:
                return None
        else:
            for j, b in self._literals:
                if burst[j::size].count(b) != k:
                    return None
        cols = list(zip(*self._unpack(burst), strict=True))
        rids: tuple[int, ...] = cols[self.id_group]
        if max(rids) >= self._id_max:
            return None
        chans = _canonical(cols[self.channel_group], channels)
        if chans is None:
            return None
        return list(zip(rids, repeat(self.ack))), chans, cols[self.payload_group]

    def __repr__(self) -> str:
        return f"MsgpackShape(size={self.size}, ack={self.ack})"


def learn_msgpack(
    frame: bytes, pos: int, end: int, may_compile: bool
) -> tuple[MsgpackShape | None, bytes] | None:
    """The layout of the msgpack frame ``frame[pos:end]`` (its length prefix from ``pos``), which the
    caller has decoded as a publish of the common shape, and the raw bytes of its channel; None for a frame
    this module does not take (see the module docstring). The shape is None when its expression is not
    compiled yet and ``may_compile`` is false (a compile costs as much as a few hundred frames' decode)."""
    body = frame[pos + 4 : end]
    if not body or body[0] not in (0x84, 0x85):
        return None
    pairs = body[0] & 0x0F
    parts = [re.escape(frame[pos : pos + 5])]
    groups: dict[bytes, int] = {}
    #: Each group's place in the frame (length prefix included), width and ``struct`` code ("b": a fixint).
    fields: list[tuple[int, int, str]] = []
    seen: set[bytes] = set()
    ack: bool | None = None
    channel = b""
    i = 1
    n = len(body)
    for _ in range(pairs):
        if i >= n or not 0xA0 <= body[i] <= 0xBF:
            return None
        klen = body[i] & 0x1F
        key = body[i + 1 : i + 1 + klen]
        if key in seen:
            return None
        seen.add(key)
        parts.append(re.escape(body[i : i + 1 + klen]))
        i += 1 + klen
        if i >= n:
            return None
        t = body[i]
        if key == b"op":
            if body[i : i + 8] != _PUBLISH:
                return None
            parts.append(re.escape(_PUBLISH))
            i += 8
        elif key == b"id":
            if t < 0x80:
                parts.append(b"([\\x00-\\x7f])")
                fields.append((4 + i, 1, "b"))
                i += 1
            elif t in _UINT_WIDTH:
                w = _UINT_WIDTH[t]
                parts.append(re.escape(bytes([t])) + b"(.{%d})" % w)
                fields.append((5 + i, w, _UINT_CODE[w]))
                i += 1 + w
            else:
                return None
            groups[key] = len(groups)
        elif key == b"channel":
            if 0xA0 <= t <= 0xBF:
                head, length = 1, t & 0x1F
            elif t == 0xD9 and i + 1 < n:
                head, length = 2, body[i + 1]
            else:
                return None
            parts.append(re.escape(body[i : i + head]) + b"(.{%d})" % length)
            fields.append((4 + i + head, length, "s"))
            channel = body[i + head : i + head + length]
            groups[key] = len(groups)
            i += head + length
        elif key == b"payload":
            lw = _BIN_WIDTH.get(t)
            if lw is None or i + 1 + lw > n:
                return None
            length = _from_bytes(body[i + 1 : i + 1 + lw])
            parts.append(re.escape(body[i : i + 1 + lw]) + b"(.{%d})" % length)
            fields.append((5 + i + lw, length, "s"))
            groups[key] = len(groups)
            i += 1 + lw + length
        elif key == b"ack":
            if t not in (0xC2, 0xC3):
                return None
            ack = t == 0xC3
            parts.append(re.escape(body[i : i + 1]))
            i += 1
        else:
            return None
    if i != n or seen != ({b"op", b"id", b"channel", b"payload"} | ({b"ack"} if ack is not None else set())):
        return None
    source = b"".join(parts)
    pattern = _COMPILED.get(source)
    fresh = pattern is None
    if pattern is None:
        if not may_compile:
            return None, channel
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        pattern = _COMPILED[source] = re.compile(source, re.DOTALL)
    shape = MsgpackShape(
        source,
        pattern,
        frame[pos:end],
        bool(ack),
        fields,
        (groups[b"id"], groups[b"channel"], groups[b"payload"]),
    )
    shape.fresh = fresh
    return shape, channel


# -- JSON over WebSocket ----------------------------------------------------------------------------------

#: What JSON lets a string hold unescaped: every character but ``"``, ``\`` and the controls below 0x20.
_JSON_CHARS: Final = '([^"\\\\\\x00-\\x1f]*)'
#: A JSON integer that an id may be (below MAX_ID, 2^31: at most ten digits, no sign, no leading zero).
_JSON_ID: Final = "(0|[1-9][0-9]{0,9})"
_JSON_SPACE: Final = " \t\n\r"
#: Messages are joined with NUL for one findall: no match can hold one (JSON text has none unescaped).
_SEP: Final = "\x00"
_JSON_COMPILED: dict[str, re.Pattern[str]] = {}
#: The longest message a layout reads (characters): past some 250, the expression's scan of a message's
#: characters costs more than orjson's reading of it (in process, 256-message bursts: 0.76 against 1.16 µs a
#: message of 64-byte text, 1.36 against 1.29 at 256, 2.34 against 1.52 at 512), so longer ones (most of a
#: mixed-size stream's) are read alone.
TAKE_MAX_CHARS: Final = 256


class JsonShape:
    """One learned layout of a JSON ``text`` publish message (see :func:`learn_json`)."""

    __slots__ = ("_findall", "ack", "channel_group", "fresh", "id_group", "source", "text_group")

    def __init__(
        self, source: str, pattern: re.Pattern[str], ack: bool, groups: tuple[int, int, int]
    ) -> None:
        self.source = source
        self.fresh = False
        self._findall = pattern.findall
        self.ack = ack
        self.id_group, self.channel_group, self.text_group = groups

    def take(
        self, messages: list[bytes | str], channels: dict[str, str], limit: int
    ) -> tuple[list[tuple[int, bool]], list[str], list[bytes]] | None:
        """The replies (``(id, ack)``), canonical channels and payloads of ``messages``, or None unless every
        one is a text message (``str``) of this layout, of at most :data:`TAKE_MAX_CHARS` and ``limit`` // 4
        characters (certainly within ``max_frame`` once encoded), on a channel in ``channels`` (raw text to
        canonical)."""
        longest = max(map(len, messages))
        if longest > TAKE_MAX_CHARS or longest * 4 > limit:
            return None
        try:
            joined = _SEP.join(messages)  # type: ignore[arg-type]  # a bytes among them: TypeError
        except TypeError:
            return None
        k = len(messages)
        found = self._findall(_SEP + joined + _SEP)
        if len(found) != k:
            return None
        cols = list(zip(*found, strict=True))
        rids = list(map(int, cols[self.id_group]))
        if max(rids) >= MAX_ID:
            return None
        chans = _canonical(cols[self.channel_group], channels)
        if chans is None:
            return None
        # One encode for every payload: a text holds no NUL (the layout's characters), so the split is exact.
        try:
            payloads = _SEP.join(cols[self.text_group]).encode("utf-8").split(b"\x00")
        except UnicodeEncodeError:  # a lone surrogate (never in a str decoded from UTF-8): orjson refuses it
            return None
        return list(zip(rids, repeat(self.ack))), chans, payloads

    def __repr__(self) -> str:
        return f"JsonShape(ack={self.ack})"


def _json_string(m: str, i: int) -> int:
    """The end (after the closing quote) of the JSON string opening at ``m[i]``, or -1 unless it holds only
    characters a layout takes unescaped."""
    if i >= len(m) or m[i] != '"':
        return -1
    j = m.find('"', i + 1)
    if j < 0:
        return -1
    inner = m[i + 1 : j]
    if "\\" in inner or any(c < " " for c in inner):
        return -1
    return j + 1


def _space(m: str, i: int) -> int:
    while i < len(m) and m[i] in _JSON_SPACE:
        i += 1
    return i


def learn_json(m: str, may_compile: bool) -> JsonShape | None:
    """The layout of the JSON message ``m``, which the caller has read as a ``text`` publish of the common
    shape: its exact text but for the id, the channel and the text, each of which the layout takes when it
    is a JSON integer below MAX_ID, and a string with nothing escaped. None for a message it does not take
    (a key escaped or repeated, a value of another form, another payload field), or when its expression is
    not compiled yet and ``may_compile`` is false.

    Why the reading is exact: a message of the layout is the learned one with other digits and other
    unescaped characters in those three places, so orjson reads it as the same object with those values,
    which the common-shape checks take as they took the learned one (the channel is checked against the
    codec's known channels as before)."""
    parts: list[str] = []
    groups: dict[str, int] = {}
    ack: bool | None = None
    i = _space(m, 0)
    if i >= len(m) or m[i] != "{":
        return None
    i += 1
    mark = 0  # the literal text not yet in parts starts here
    while True:
        i = _space(m, i)
        end = _json_string(m, i)
        if end < 0:
            return None
        key = m[i + 1 : end - 1]
        if key in groups:
            return None
        i = _space(m, end)
        if i >= len(m) or m[i] != ":":
            return None
        i = _space(m, i + 1)
        if key == "op":
            if not m.startswith('"publish"', i):
                return None
            i += 9
            groups[key] = -1
        elif key == "ack":
            if m.startswith("true", i):
                ack, i = True, i + 4
            elif m.startswith("false", i):
                ack, i = False, i + 5
            else:
                return None
            groups[key] = -1
        elif key == "id":
            j = i
            while j < len(m) and m[j].isascii() and m[j].isdigit():
                j += 1
            if j == i or j - i > 10 or (m[i] == "0" and j - i > 1):
                return None
            parts += [re.escape(m[mark:i]), _JSON_ID]
            groups[key] = len(parts) // 2 - 1
            i = mark = j
        elif key in ("channel", "text"):
            end = _json_string(m, i)
            if end < 0:
                return None
            parts += [re.escape(m[mark : i + 1]), _JSON_CHARS]
            groups[key] = len(parts) // 2 - 1
            mark, i = end - 1, end  # the closing quote is literal
        else:
            return None
        i = _space(m, i)
        if i >= len(m):
            return None
        if m[i] == "}":
            break
        if m[i] != ",":
            return None
        i += 1
    if _space(m, i + 1) != len(m) or set(groups) != (
        {"op", "id", "channel", "text"} | ({"ack"} if ack is not None else set())
    ):
        return None
    source = _SEP + "".join(parts) + re.escape(m[mark:]) + "(?=" + _SEP + ")"
    pattern = _JSON_COMPILED.get(source)
    fresh = pattern is None
    if pattern is None:
        if not may_compile:
            return None
        if len(_JSON_COMPILED) >= _COMPILED_MAX:
            _JSON_COMPILED.clear()
        pattern = _JSON_COMPILED[source] = re.compile(source)
    shape = JsonShape(source, pattern, bool(ack), (groups["id"], groups["channel"], groups["text"]))
    shape.fresh = fresh
    return shape


class JsonLayouts:
    """A WebSocket connection's learned JSON layout and what paces its learning (the stream decoder keeps
    the same for msgpack): messages read with it, expressions compiled, bursts it missed in a row, and
    common publishes to read before the next attempt to learn. Created at the connection's first burst."""

    __slots__ = ("compiles", "hits", "learn_in", "misses", "shape")

    def __init__(self) -> None:
        self.shape: JsonShape | None = None
        self.hits = 0
        self.compiles = 0
        self.misses = 0
        self.learn_in = 0

    def may_compile(self) -> bool:
        """A new expression costs some 200 µs: a few for a start, then one per 4,096 messages read with
        layouts."""
        return self.compiles < 4 + self.hits // 4096

    def learn(self, m: str) -> bool:
        """Learn the layout of ``m`` (see :func:`learn_json`); whether the shape changed. A message longer
        than :data:`TAKE_MAX_CHARS` teaches nothing (no layout would read it)."""
        self.learn_in = 256
        if len(m) > TAKE_MAX_CHARS:
            return False
        shape = learn_json(m, self.may_compile())
        if shape is None or (self.shape is not None and shape.source == self.shape.source):
            return False
        self.compiles += shape.fresh
        self.shape = shape
        return True
