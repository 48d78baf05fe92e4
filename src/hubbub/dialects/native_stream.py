"""The native protocol's raw TCP stream (protocols/native.md §1): sans-I/O framing and whole-read decoding.

:class:`NativeStreamDecoder` splits a raw TCP byte stream into frames, picking the framing from the first
byte (JSON lines, or msgpack frames each after a 4-byte big-endian length), and decodes each read in one loop
(the common publishes as a :class:`PublishRun`); every other frame goes through
:meth:`~.native_codec.NativeCodec.decode_object`. :mod:`.native` re-exports both.

Invariants:

* Every read is bounded by ``max_frame`` and the ``limits.*`` values given to the constructor.
* Stream parsing does not depend on chunking: feeding the same bytes in any split gives the same items
  (``feed_runs`` gives the same publishes, only grouped in runs per read).

Concurrency contract: a stream decoder belongs to one connection and is called from one thread (the event
loop); the codecs it decodes with keep no state of a connection and may be shared (see :mod:`.native_codec`).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias

import msgpack
import orjson

from hubbub.errors import BadFrame, FrameTooLarge, HubbubError

from .native_codec import NativeCodec, exact_json
from .native_commands import MAX_ID, Command, Publish, json_payload
from .native_common import DEFAULT_CONTENT_TYPE, DEFAULT_MAX_FRAME, Encoding, Limits
from .native_shapes import JsonLayouts, MsgpackShape, learn_msgpack

__all__ = [
    "MAX_STREAM_FRAME",
    "RUN_MAX",
    "NativeStreamDecoder",
    "PublishRun",
    "RunItem",
    "StreamItem",
    "decode_messages",
]

_unpackb = msgpack.unpackb
_orjson_loads = orjson.loads

MAX_STREAM_FRAME: Final = 1 << 24  # TCP msgpack length prefix must be below 2^24 (native.md §1)


# -- raw TCP framing --------------------------------------------------------------------------------------

StreamItem: TypeAlias = Command | HubbubError

_U32: Final = struct.Struct(">I").unpack_from
#: The content type of a JSON publish's ``text`` payload (native.md §3.4).
_TEXT_TYPE: Final = "text/plain; charset=utf-8"
#: No value read: orjson refused the line.
_UNREAD: Final = object()


#: The most publishes a :class:`PublishRun` holds: a longer burst of one read is cut into runs of this many,
#: and the TCP transport lets the loop's other work run between them (``transports.tcp.dispatch``), this
#: run's commit and replies first. A pipelining publisher's read of 1,000 publishes of 100 bytes otherwise
#: went through decode, commit and replies in one step (about 7 ms of the loop on the 2-core dev machine)
#: while other connections waited, a durable consumer's ack among them. Measured alternately against uncut
#: runs: bench/quick_native.py --count 100000 --size 100 --durability commit, publish with acks 98.0k-98.2k
#: → 119.6k-121.0k msgs/s, end to end 99.6k-100.3k → 112.7k-113.4k; the side-by-side suite's 1 KiB
#: scenarios unchanged (a read of them holds fewer publishes than a run). Reads cut at 32 KiB instead cost
#: 1 KiB events a commit per 30 of them (1to1 and persist at 0.65-0.75 of uncut, fanout at 0.6).
RUN_MAX: Final = 256
#: Layouts a msgpack stream may compile before it has read 4,096 frames with them (see _learn_shape).
_COMPILES: Final = 4
#: Common frames a msgpack stream reads alone before it looks again for a layout to learn, after a frame whose
#: successor differs in length (see _frames).
_LEARN_AFTER_SIZE_CHANGE: Final = 16
#: Most raw channel texts a msgpack stream keeps for its layouts (cleared when full).
_RAW_CHANNELS: Final = 1024


class PublishRun:
    """Consecutive publishes of the common shape from one read of a TCP stream, as parallel lists.

    The common shape is ``op``, ``id``, ``channel`` and the payload (msgpack ``payload`` as bin; JSON one of
    ``text``, ``json``, ``b64``), optionally a boolean ``ack``, and nothing else: no content type, headers,
    tags or idempotency key. A read full of them (a pipelining client's burst) thus builds no command value
    per publish: the connection makes the store's requests straight from these lists. Publish ``i`` is
    ``Publish(replies[i][0], channels[i], payloads[i], content_types[i], ack=replies[i][1])``.
    """

    __slots__ = ("channels", "content_types", "payloads", "replies")

    def __init__(self) -> None:
        #: Canonical channels.
        self.channels: list[str] = []
        self.payloads: list[bytes] = []
        self.content_types: list[str] = []
        #: ``(request id, ack wanted)`` of each publish: what a connection keeps until the commit.
        self.replies: list[tuple[int, bool]] = []

    def __len__(self) -> int:
        return len(self.replies)

    def add(self, rid: int, ack: bool, channel: str, payload: bytes, content_type: str) -> None:
        """Add one publish (a canonical channel)."""
        self.channels.append(channel)
        self.payloads.append(payload)
        self.content_types.append(content_type)
        self.replies.append((rid, ack))

    def extend(
        self,
        replies: list[tuple[int, bool]],
        channels: list[str],
        payloads: Sequence[bytes],
        content_type: str,
    ) -> None:
        """Add publishes of one content type read at once (a learned layout's burst: native_shapes)."""
        self.replies += replies
        self.channels += channels
        self.payloads += payloads
        self.content_types += [content_type] * len(replies)

    def __repr__(self) -> str:
        return f"PublishRun({len(self)} publishes)"

    def commands(self, start: int = 0) -> list[Publish]:
        """The publishes from ``start`` on, as :class:`Publish` commands."""
        return [
            Publish(rid, channel, payload, ct, {}, (), "", ack)
            for (rid, ack), channel, payload, ct in zip(
                self.replies[start:],
                self.channels[start:],
                self.payloads[start:],
                self.content_types[start:],
                strict=True,
            )
        ]


#: What :meth:`NativeStreamDecoder.feed_runs` returns: commands, errors and runs of common publishes.
RunItem: TypeAlias = Command | HubbubError | PublishRun


class NativeStreamDecoder:
    """Splits a native TCP byte stream into commands (native.md §1).

    The first byte picks the framing: ``{`` → JSON lines (``\\n``-terminated, a ``\\r`` before it ignored,
    blank lines skipped), ``0x00`` → msgpack frames each preceded by a 4-byte big-endian length (below 2^24
    and at most ``max_frame``); any other byte is a fatal :class:`BadFrame`. :meth:`feed` returns commands
    and errors in stream order. Non-fatal errors (4001, 4002, 4004, 4007) consume exactly their own frame.
    After a fatal error (4000, 4003) ``failed`` is set, the buffer is dropped and later input is ignored:
    the transport sends the error (when ``encoding`` is known) and closes.

    :meth:`feed_runs` is the transport's form of :meth:`feed`: the same items, except that consecutive
    publishes of the common shape come as one :class:`PublishRun`. Each read's frames are split and
    decoded in one loop; only frames of another shape go through :meth:`NativeCodec.decode_object`.

    ``codecs`` (by encoding) lets every connection of a listener share its codecs, which keep no state of
    a connection; without it the decoder builds its own once the encoding is known.

    The buffer never holds more than one incomplete frame of at most ``max_frame`` bytes (+ ``\\r``) plus
    the complete frames of the current chunk.
    """

    __slots__ = (
        "_buf",
        "_codec",
        "_codecs",
        "_compiles",
        "_hits",
        "_layouts",
        "_learn_in",
        "_limits",
        "_misses",
        "_raw_channels",
        "_run",
        "_scanned",
        "_shape",
        "encoding",
        "error",
        "failed",
        "max_frame",
    )

    def __init__(
        self,
        max_frame: int = DEFAULT_MAX_FRAME,
        *,
        max_channel_bytes: int = 1024,
        max_tags: int = 64,
        max_tag_bytes: int = 256,
        max_headers: int = 64,
        max_header_bytes: int = 8192,
        codecs: Mapping[Encoding, NativeCodec] | None = None,
    ) -> None:
        self.max_frame = max_frame
        self._limits = Limits(max_channel_bytes, max_tags, max_tag_bytes, max_headers, max_header_bytes)
        self._codecs = codecs
        #: ``"json"`` or ``"msgpack"`` once the first byte was seen (the server answers in the same one).
        self.encoding: Encoding | None = None
        self._codec: NativeCodec | None = None
        self._buf = bytearray()
        self._scanned = 0  # JSON lines: bytes of _buf already known to hold no newline
        #: The run the current read's common publishes join (the last item of that read's output).
        self._run: PublishRun | None = None
        # msgpack: the learned layout of the client's common publishes (native_shapes), the raw bytes of
        # channels read with it, frames read with shapes, expressions compiled, bursts missed in a row, and
        # common frames to decode before the next attempt to learn.
        self._shape: MsgpackShape | None = None
        self._raw_channels: dict[bytes, str] = {}
        self._hits = 0
        self._compiles = 0
        self._misses = 0
        self._learn_in = 0
        # JSON lines: the learned layout of the client's common text publishes (created with the first line).
        self._layouts: JsonLayouts | None = None
        self.failed = False
        #: The fatal error, once ``failed``.
        self.error: HubbubError | None = None

    @property
    def codec(self) -> NativeCodec:
        """The codec for the detected encoding. Only valid once ``encoding`` is set."""
        if self._codec is None:
            raise RuntimeError("the stream's encoding is not known yet")
        return self._codec

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[StreamItem]:
        """Add received bytes; return the commands and errors of every frame they complete, in order."""
        out: list[StreamItem] = []
        for item in self.feed_runs(data):
            if isinstance(item, PublishRun):
                out += item.commands()
            else:
                out.append(item)
        return out

    def feed_runs(self, data: bytes | bytearray | memoryview) -> list[RunItem]:
        """:meth:`feed`, with a read's consecutive publishes of the common shape in a :class:`PublishRun`."""
        if self.failed or not data:
            return []
        out: list[RunItem] = []
        self._run = None
        if self.encoding is None:
            first = data[0]
            if first == 0x7B:
                self.encoding = "json"
            elif first == 0x00:
                self.encoding = "msgpack"
            else:
                self._fail(BadFrame("the first byte must be '{' (JSON lines) or 0x00 (msgpack)"), out)
                return out
            if self._codecs is not None:
                self._codec = self._codecs[self.encoding]
            else:
                lim = self._limits
                self._codec = NativeCodec(
                    self.encoding,
                    max_frame=self.max_frame,
                    max_channel_bytes=lim.max_channel_bytes,
                    max_tags=lim.max_tags,
                    max_tag_bytes=lim.max_tag_bytes,
                    max_headers=lim.max_headers,
                    max_header_bytes=lim.max_header_bytes,
                )
        if self.encoding == "json":
            self._buf += data
            self._lines(out)
        else:
            self._frames(data, out)
        self._run = None
        return out

    def _fail(self, exc: HubbubError, out: list[RunItem]) -> None:
        out.append(exc)
        self.failed = True
        self.error = exc
        self._buf = bytearray()
        self._scanned = 0

    def _object(self, obj: Any, out: list[RunItem]) -> bool:
        """Decode one frame's value through the codec's general path into ``out``; False after a fatal
        error."""
        self._run = None
        try:
            if type(obj) is not dict:
                raise BadFrame("a frame must be an object")
            out.append(self.codec.decode_object(obj))
        except HubbubError as exc:
            if exc.fatal:
                self._fail(exc, out)
                return False
            out.append(exc)
        return True

    def _quick_json(self, obj: Any, out: list[RunItem], exact: bool) -> bool:
        """Add a JSON publish of the common shape (see :class:`PublishRun`) to the read's run (``exact``: see
        :func:`_common_json`).

        False, with nothing added, for any other frame, including every frame the general path would
        refuse: the general path then decodes it, with its own errors. (:meth:`_frames` has the msgpack
        case inline.)
        """
        fields = _common_json(obj, self.codec._channels, exact)
        if fields is None:
            return False
        run = self._run
        if run is None or len(run.replies) >= RUN_MAX:
            run = self._run = PublishRun()
            out.append(run)
        run.add(*fields)
        return True

    def _lines(self, out: list[RunItem]) -> None:
        buf = self._buf
        limit = self.max_frame
        codec = self.codec
        quick = self._quick_json
        load = codec._load
        pos = 0
        search = self._scanned
        layouts = self._layouts
        if layouts is None:
            layouts = self._layouts = JsonLayouts()
        # A read of one line (each at a light load) is read alone, and teaches nothing: orjson reads a line
        # for less than a layout's set-up. Lines left to read one at a time before the layout is tried again
        # (after a burst it did not fit): ``alone``.
        bursts = buf.count(b"\n", search) > 1
        alone = 0
        while True:
            if bursts and layouts.shape is not None and alone <= 0:
                taken = self._take_lines(buf, pos, layouts, out)
                if taken > 0:
                    pos = search = pos + taken
                    continue
                if taken == 0:
                    # Read lines alone a while (longer after each miss in a row), and learn from the next one.
                    alone = 1 << layouts.misses
                    layouts.misses = min(layouts.misses + 1, 8)
                    layouts.learn_in = 0
            alone -= 1
            nl = buf.find(b"\n", search)
            if nl < 0:
                if len(buf) - pos > limit + 1:  # + 1: room for the '\r' of a CRLF line of exactly max_frame
                    self._fail(FrameTooLarge(f"line over {limit} bytes"), out)
                    return
                break
            end = nl - 1 if nl > pos and buf[nl - 1] == 0x0D else nl
            if end - pos > limit:
                self._fail(FrameTooLarge(f"line over {limit} bytes"), out)
                return
            if end > pos:
                # orjson's reading of the usual line, a common publish, is exact (_common_json); any other
                # line whose reading may not be (exact_json) is read again by the codec, which reads integers
                # beyond 64 bits exactly (NativeCodec._load) and refuses what is not JSON (fatal).
                line = buf[pos:end]
                try:
                    obj = _orjson_loads(line)
                except (ValueError, RecursionError):  # orjson.JSONDecodeError is a ValueError
                    obj = _UNREAD
                if obj is not _UNREAD and quick(obj, out, False):
                    run = self._run
                    if bursts and run is not None and run.content_types[-1] is _TEXT_TYPE:
                        layouts.learn_in -= 1
                        if layouts.learn_in <= 0 and layouts.learn(line.decode("utf-8")):
                            alone = 0  # a new layout is tried at once
                else:
                    if obj is _UNREAD or not exact_json(obj):
                        try:
                            obj = load(line)
                        except HubbubError as exc:  # BadFrame from _load: fatal
                            self._fail(exc, out)
                            return
                    if not quick(obj, out, True) and not self._object(obj, out):
                        return
            pos = search = nl + 1
        if pos:
            del buf[:pos]
        self._scanned = len(buf)

    def _take_lines(self, buf: bytearray, pos: int, layouts: JsonLayouts, out: list[RunItem]) -> int:
        """Read the longest burst of the complete lines from ``pos`` that the learned layout takes (as
        :func:`decode_messages` reads a WebSocket burst, :class:`~.native_shapes.JsonShape`) into the read's
        run; the bytes it took, newlines included: 0 when the layout takes not even the first line, -1 when
        fewer than two complete lines are held (orjson reads a line alone for less than the layout's set-up:
        the one line of each read at a light load). Lines ending in a CR, and a burst that is not UTF-8, are
        read alone."""
        last = buf.rfind(b"\n", pos)
        if last < pos or buf.find(b"\n", pos, last) < 0:
            return -1
        chunk = buf[pos:last]  # (one copy: a bytearray decodes as bytes do)
        if b"\r" in chunk:
            return 0
        try:
            lines: list[bytes | str] = list(chunk.decode("utf-8").split("\n"))
        except UnicodeDecodeError:
            return 0
        shape = layouts.shape
        assert shape is not None
        channels, limit = self.codec._channels, self.max_frame
        run = self._run
        k = min(len(lines), _room(run))
        got = shape.take(lines[:k], channels, limit)
        if got is None and k > 1 and shape.take(lines[:1], channels, limit) is not None:
            # The longest burst of the layout, by halving: a miss costs a scan of the lines tried.
            while got is None and k > 1:
                k = (k + 1) // 2
                got = shape.take(lines[:k], channels, limit)
        if got is None:
            return 0
        layouts.misses = 0
        layouts.hits += k
        run = self._run = _filling(run, out)
        run.extend(*got, _TEXT_TYPE)
        if k == len(lines):
            return last + 1 - pos
        return len("\n".join(lines[:k]).encode("utf-8")) + 1  # type: ignore[arg-type]  # (str lines)

    def _frames(self, data: bytes | bytearray | memoryview, out: list[RunItem]) -> None:
        # The read is parsed from one bytes object (the held partial frame and the read joined, or the read
        # itself): a payload is a slice of it, and what is left over is held again as a bytearray. One join
        # copies each part once (a bytearray extended and then copied to bytes took a second copy of the
        # read: 2-3 % of a mixed-size stream's decode).
        buf = self._buf
        view = b"".join((buf, data)) if buf else bytes(data)  # bytes(data) is data when data is bytes
        end = len(view)
        limit = min(self.max_frame, MAX_STREAM_FRAME - 1)
        codec = self._codec
        assert codec is not None  # (what the codec property checks: frames come once the encoding is known)
        channels = codec._channels
        unpackb = _unpackb
        run: PublishRun | None = None
        pos = 0
        shape = self._shape
        raw_channels = self._raw_channels
        # Frames left to decode one at a time before the shape is tried again (after a burst it did not fit).
        alone = 0
        while end - pos >= 4:
            if shape is not None and alone <= 0:
                # A burst of the learned layout, read at once up to the run's room (see native_shapes).
                size = shape.size
                k = (end - pos) // size
                if k:
                    k = min(k, _room(run))
                    got = None
                    if shape.matches(view, pos):
                        # The longest burst is found by halving: a miss costs a scan of the frames tried.
                        got = shape.take(view, pos, k, raw_channels)
                        while got is None and k > 1:
                            k = (k + 1) // 2
                            got = shape.take(view, pos, k, raw_channels)
                    if got is not None:
                        self._misses = 0
                        self._hits += k
                        run = _filling(run, out)
                        run.extend(*got, DEFAULT_CONTENT_TYPE)
                        pos += k * size
                        continue
                    # This frame is not of the shape: decode frames alone a while (longer after each miss in a
                    # row) before the shape is tried again, and learn from the next common publish.
                    alone = 1 << self._misses
                    self._misses = min(self._misses + 1, 8)
                    self._learn_in = 0
            alone -= 1
            (n,) = _U32(view, pos)
            if n > limit:
                self._fail(FrameTooLarge(f"frame over {limit} bytes"), out)
                return
            start = pos + 4
            if end - start < n:
                break
            frame_at = pos
            pos = start + n
            try:
                obj = unpackb(view[start:pos], raw=False, strict_map_key=False)
            except Exception:
                # unpackb is pure C: any failure (bad format, extra data, bad UTF-8, unhashable key, nesting
                # depth) means the bytes are not one msgpack value.
                self._fail(BadFrame("not msgpack"), out)
                return
            # A publish of the common shape joins the read's run (see _quick_json); inline, as this runs
            # once per published message.
            if type(obj) is dict and obj.get("op") == "publish":
                rid = obj.get("id")
                ack = obj.get("ack", False)
                raw_channel = obj.get("channel")
                payload = obj.get("payload")
                if (
                    type(rid) is int
                    and 0 <= rid < MAX_ID
                    and type(ack) is bool
                    and type(raw_channel) is str
                    and type(payload) is bytes
                    and len(obj) == 4 + ("ack" in obj)
                ):
                    channel = channels.get(raw_channel)
                    if channel is not None:
                        self._learn_in -= 1
                        if self._learn_in <= 0:
                            if view[frame_at:start] != view[pos : pos + 4]:
                                # The next frame is not as long (or not read yet): a client of mixed payload
                                # sizes, whose layouts would each fit a frame or two and cost a learning
                                # each (a compile or a walk of the frame). Look again a few frames on.
                                self._learn_in = _LEARN_AFTER_SIZE_CHANGE
                            elif self._learn_shape(view, frame_at, pos, channel):
                                shape = self._shape
                                alone = 0  # a new shape is tried at once
                        if run is None or len(run.replies) >= RUN_MAX:
                            run = PublishRun()
                            out.append(run)
                        run.channels.append(channel)
                        run.payloads.append(payload)
                        run.content_types.append(DEFAULT_CONTENT_TYPE)
                        run.replies.append((rid, ack))
                        continue
            run = None
            if not self._object(obj, out):
                return
        if pos >= end:
            if buf:
                self._buf = bytearray()
        else:
            self._buf = bytearray(memoryview(view)[pos:])

    def _learn_shape(self, view: bytes, at: int, end: int, channel: str) -> bool:
        """Learn the layout of the common publish frame ``view[at:end]`` (``channel``: its canonical channel)
        and keep it (see :mod:`.native_shapes`); whether the decoder's shape changed."""
        # The next attempt: after the shape misses a frame, or after a run's worth of frames decoded alone.
        self._learn_in = RUN_MAX
        # A new expression costs some 200 µs: a few for a start, then one per 4,096 frames read with shapes.
        learned = learn_msgpack(view, at, end, self._compiles < _COMPILES + self._hits // 4096)
        if learned is None:
            return False
        shape, raw = learned
        if len(self._raw_channels) >= _RAW_CHANNELS:
            self._raw_channels.clear()
        self._raw_channels[raw] = channel
        if shape is None or (self._shape is not None and shape.source == self._shape.source):
            return False
        self._compiles += shape.fresh
        self._shape = shape
        return True


# -- WebSocket messages -----------------------------------------------------------------------------------

#: A common publish's fields, as :meth:`PublishRun.add` takes them.
_Fields: TypeAlias = tuple[int, bool, str, bytes, str]


def _room(run: PublishRun | None) -> int:
    """How many more publishes the run being filled takes (:data:`RUN_MAX` once a new one is due)."""
    return RUN_MAX if run is None or len(run.replies) >= RUN_MAX else RUN_MAX - len(run.replies)


def _filling(run: PublishRun | None, out: list[RunItem]) -> PublishRun:
    """The run a burst goes into: ``run`` while it has room, else a new one, added to ``out``. (The per-frame
    loop of :meth:`NativeStreamDecoder._frames` has the same step inline.)"""
    if run is None or len(run.replies) >= RUN_MAX:
        run = PublishRun()
        out.append(run)
    return run


def _common_json(obj: Any, channels: dict[str, str], exact: bool) -> _Fields | None:
    """The fields of a JSON publish of the common shape (see :class:`PublishRun`) on a channel the codec
    knows (``channels``: raw text to canonical); None for any other frame, including every frame the general
    path would refuse. ``obj`` is orjson's reading, or ``exact`` when it is read exactly (the codec's
    reading, or :func:`~.native_codec.exact_json`): orjson reads an integer beyond 64 bits as a float, which
    only a ``json`` payload could hold here (the id and ``ack`` are checked for their types), so that one is
    taken only from an exact reading."""
    if type(obj) is not dict or obj.get("op") != "publish":
        return None
    rid = obj.get("id")
    ack = obj.get("ack", False)
    raw_channel = obj.get("channel")
    if (
        type(rid) is not int
        or not 0 <= rid < MAX_ID
        or type(ack) is not bool
        or type(raw_channel) is not str
        or len(obj) != 4 + ("ack" in obj)
    ):
        return None
    # A channel the codec has not seen yet takes the general path once, which canonicalizes it.
    channel = channels.get(raw_channel)
    if channel is None:
        return None
    # The fourth field must be the payload: one of text, json and b64 (json_payload checks which).
    text = obj.get("text")
    if type(text) is str:
        return rid, ack, channel, text.encode("utf-8"), _TEXT_TYPE
    if not exact and "json" in obj:
        return None
    try:
        payload, content_type = json_payload(obj)
    except HubbubError:
        return None
    return rid, ack, channel, payload, content_type


def _common_msgpack(obj: Any, channels: dict[str, str]) -> _Fields | None:
    """:func:`_common_json` for a msgpack publish (``payload`` bin): what :meth:`NativeStreamDecoder._frames`
    takes inline."""
    if type(obj) is not dict or obj.get("op") != "publish":
        return None
    rid = obj.get("id")
    ack = obj.get("ack", False)
    raw_channel = obj.get("channel")
    payload = obj.get("payload")
    if (
        type(rid) is not int
        or not 0 <= rid < MAX_ID
        or type(ack) is not bool
        or type(raw_channel) is not str
        or type(payload) is not bytes
        or len(obj) != 4 + ("ack" in obj)
    ):
        return None
    channel = channels.get(raw_channel)
    if channel is None:
        return None
    return rid, ack, channel, payload, DEFAULT_CONTENT_TYPE


def decode_messages(
    codec: NativeCodec, messages: Sequence[bytes | str], layouts: JsonLayouts | None = None
) -> list[RunItem]:
    """A burst of WebSocket messages (each one native frame, a text frame as ``str`` or ``bytes``, a binary
    one as ``bytes``) decoded as :meth:`NativeStreamDecoder.feed_runs` decodes a read's frames: consecutive
    publishes of the common shape in a :class:`PublishRun` (at most :data:`RUN_MAX` each), every other
    message as ``codec.decode`` gives it, a command or its error. The items are what decoding each message
    alone gives (the same publishes, only grouped). A fatal error ends the burst: the messages after it are
    not decoded (the connection closes).

    ``layouts``: the connection's learned JSON layout (:class:`~.native_shapes.JsonLayouts`), which reads a
    burst of ``text`` publishes of one layout with one regular-expression ``findall``, and which this call
    updates; without it every message is decoded alone.

    The codec keeps no state of a connection (see :mod:`.native_codec`); ``layouts`` is the connection's.
    """
    out: list[RunItem] = []
    run: PublishRun | None = None
    channels = codec._channels
    is_json = codec.encoding == "json"
    if not is_json:
        layouts = None
    shape = layouts.shape if layouts is not None else None
    # A message certainly within max_frame (a str of n characters is at most 4n bytes of UTF-8); others, and
    # every message not of the common shape, take the codec's general path with its checks and errors.
    limit = codec.max_frame
    n = len(messages)
    i = 0
    alone_until = 0  # messages before this index are decoded alone (after a burst the layout missed)
    while i < n:
        if shape is not None and i >= alone_until:
            assert layouts is not None
            k = min(n - i, _room(run))
            burst = list(messages[i : i + k])
            got = shape.take(burst, channels, limit)
            if got is None and k > 1 and shape.take(burst[:1], channels, limit) is not None:
                # The longest burst of the layout, by halving: a miss costs a scan of the messages tried.
                while got is None and k > 1:
                    k = (k + 1) // 2
                    got = shape.take(burst[:k], channels, limit)
            if got is not None:
                layouts.misses = 0
                layouts.hits += k
                run = _filling(run, out)
                run.extend(*got, _TEXT_TYPE)
                i += k
                continue
            # Decode messages alone a while (longer after each miss in a row), and learn from the next one.
            alone_until = i + (1 << layouts.misses)
            layouts.misses = min(layouts.misses + 1, 8)
            layouts.learn_in = 0
        m = messages[i]
        i += 1
        fields: _Fields | None = None
        if is_json:
            if len(m) * (4 if type(m) is str else 1) <= limit:
                try:
                    obj = _orjson_loads(m)
                except ValueError:  # orjson.JSONDecodeError: the general path answers it
                    obj = None
                if obj is not None:
                    fields = _common_json(obj, channels, False)
        elif type(m) is bytes and len(m) <= limit:
            try:
                obj = _unpackb(m, raw=False, strict_map_key=False)
            except Exception:  # not msgpack: the general path answers it
                obj = None
            fields = _common_msgpack(obj, channels)
        if fields is not None:
            if layouts is not None and type(m) is str and fields[4] is _TEXT_TYPE:
                layouts.learn_in -= 1
                if layouts.learn_in <= 0 and layouts.learn(m):
                    shape = layouts.shape
                    alone_until = i  # a new layout is tried at once
            if run is None or len(run.replies) >= RUN_MAX:
                run = PublishRun()
                out.append(run)
            run.add(*fields)
            continue
        run = None
        try:
            out.append(codec.decode(m))
        except HubbubError as exc:
            out.append(exc)
            if exc.fatal:
                break
    return out
