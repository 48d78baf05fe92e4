"""A replayed run of events as batch frames (msgpack), without building its single event frames.

:func:`event_batches` builds each event's head with one ``struct`` call and
joins the heads with the payloads: several Python-level steps per event. When every payload of a run has the
same size (one publisher's readings, a sensor's records) and its seqs and times keep one msgpack form each,
every frame of the run has the same length and the same bytes but for its seq and time. Then a batch is one
``join`` of the payloads with the frame's constant bytes between them, and the seqs and times are written
into it a column at a time: each byte of the seq (and of the time) of every frame by one strided slice
assignment, packed beforehand by one ``struct`` call for the whole batch. About a third fewer instructions per
event than the head-per-event path at 16 B (valgrind's count over a replay page of 2,048), and no
:class:`bytes` object per head.

Pure functions, no I/O; safe to call from any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from itertools import repeat
from operator import add, itemgetter

from hubbub.events import Event
from hubbub.run_columns import RunColumns

from .native_common import (
    Encoding,
    batch_ends,
    batch_frame,
    batch_overhead,
    event_frames,
    is_json_type,
    json_run_format,
    mp_array_header,
    msgpack_run_parts,
    pack_batches,
)

__all__ = [
    "STRIDED_PAYLOAD_MAX",
    "UNIFORM_FRAME_MAX",
    "event_batches",
    "mp_bin_form",
    "mp_uint_form",
    "run_batches",
    "run_frames",
    "uniform_batches",
]

#: The largest frame the column path builds: past it, copying the payloads (which this path does twice: into
#: the batch being written, then into its bytes) costs more than the per-event steps it saves.
UNIFORM_FRAME_MAX = 512

#: The largest payload of :class:`RunColumns` rows written into a batch a byte-column at a time (one strided
#: copy per byte of the payload, each over the whole batch); a larger one is cut into a bytes per event and
#: joined.
STRIDED_PAYLOAD_MAX = 32
#: A ``wide`` run's times (``RunColumns.wide``): msgpack's ``uint 64``.
_WIDE_FORM = (b"\xcf", "Q")

_first = itemgetter(0)
_second = itemgetter(1)
#: A msgpack batch frame up to its array header: ``{"op": "batch", "frames":``.
_BATCH_OPEN = batch_frame("msgpack", ())[:-1]
#: The pair a replayed event's msgpack frame ends with.
_REPLAY_PAIR = b"\xa6replay\xc3"


def mp_uint_form(v: int) -> tuple[bytes, str]:
    """The msgpack form of the unsigned integer ``v`` as (type byte(s), struct code of the value): msgpack
    writes the shortest one, so the form is the same for every value of a range."""
    if v < 0x80:
        return b"", "B"
    if v < 0x100:
        return b"\xcc", "B"
    if v < 0x10000:
        return b"\xcd", "H"
    if v < 0x100000000:
        return b"\xce", "I"
    return b"\xcf", "Q"


def mp_bin_form(n: int) -> tuple[bytes, str]:
    """The msgpack bin header form for ``n`` bytes, as :func:`mp_uint_form`."""
    if n < 0x100:
        return b"\xc4", "B"
    if n < 0x10000:
        return b"\xc5", "H"
    return b"\xc6", "I"


#: Where msgpack's integer form changes (the seqs of a run are cut there).
_MP_UINT_BOUNDS = (0x80, 0x100, 0x10000, 0x100000000)


def _msgpack_heads(
    proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool, lead: bytes
) -> tuple[list[bytes], list[int]] | None:
    """Each event's frame of a msgpack run up to its payload's bytes (the bin header included), after
    ``lead``, and the payloads' sizes. Packed by one precompiled :class:`struct.Struct` per stretch of seqs
    whose integer form is the same: one call per event. ``None`` when the times or payload sizes of the run do
    not share one form each (then the caller encodes the frames one by one)."""
    if type(rows) is RunColumns:  # its columns as they are, not a pass over its rows for each
        times, sizes = rows.times(), [rows.size] * len(rows)
    else:
        times = list(map(_first, rows))
        sizes = list(map(len, map(_second, rows)))
    t_lo, t_hi = min(times), max(times)
    n_lo, n_hi = min(sizes), max(sizes)
    if t_lo < 0 or mp_uint_form(t_lo) != mp_uint_form(t_hi) or mp_bin_form(n_lo) != mp_bin_form(n_hi):
        return None
    t_pre, t_code = mp_uint_form(t_lo)
    b_pre, b_code = mp_bin_form(n_lo)
    _, before_seq, before_time, after_time = msgpack_run_parts(proto, subs, replay)
    before_seq = lead + before_seq
    b = before_time + t_pre
    c = after_time + b_pre
    heads: list[bytes] = []
    seq = proto.seq
    end = seq + len(rows)
    at = 0
    while seq < end:
        s_pre, s_code = mp_uint_form(seq)
        stop = min([end, *(x for x in _MP_UINT_BOUNDS if x > seq)])
        a = before_seq + s_pre
        st = struct.Struct(f">{len(a)}s{s_code}{len(b)}s{t_code}{len(c)}s{b_code}")
        k = stop - seq
        heads += map(
            st.pack,
            repeat(a, k),
            range(seq, stop),
            repeat(b, k),
            times[at : at + k],
            repeat(c, k),
            sizes[at : at + k],
        )
        at += k
        seq = stop
    return heads, sizes


def event_batches(
    encoding: Encoding,
    proto: Event,
    rows: Sequence[tuple[int, bytes]],
    subs: Sequence[str],
    replay: bool,
    limit: int,
) -> list[bytes]:
    """The frames of a run (as :func:`event_frames`) packed into batch frames of at most ``limit`` bytes:
    byte for byte ``pack_batches(encoding, event_frames(…), limit)`` (the tests compare them). JSON frames
    are :func:`run_frames`'s (a run of plain text is not encoded event by event).

    For msgpack the event frames are never built: each batch is one join of the events' heads (see
    :func:`_msgpack_heads`) and payloads, so a payload is copied once, into its batch. The replay suffix
    that ends an event is packed at the start of the next one's head (and cut off the first head of a batch),
    so a batch of ``n`` events joins ``2n + 3`` pieces. A replay page to a batching connection goes this way.
    Pure: safe on any thread.
    """
    suffix = _REPLAY_PAIR if replay else b""
    got = _msgpack_heads(proto, rows, subs, replay, suffix) if encoding == "msgpack" and rows else None
    if got is None:
        return pack_batches(encoding, run_frames(encoding, proto, rows, subs, replay), limit)
    heads, sizes = got
    payloads = rows.payload_list() if type(rows) is RunColumns else list(map(_second, rows))
    k = len(rows)
    cut = len(suffix)
    # Each event's frame is its head without the lead, its payload and the suffix: the lead's bytes count.
    if k > 1 and sum(map(len, heads)) + sum(sizes) + batch_overhead(encoding, k) <= limit:
        ends = [k]
    else:
        ends = batch_ends(encoding, list(map(add, map(len, heads), sizes)), limit)
    out: list[bytes] = []
    start = 0
    for end in ends:
        n = end - start
        if n == 1:
            out.append(b"".join((heads[start][cut:], payloads[start], suffix)))
        else:
            parts = [b""] * (2 * n + 2)
            parts[0] = _BATCH_OPEN + mp_array_header(n)
            parts[2::2] = heads[start:end]
            parts[3::2] = payloads[start:end]
            parts[2] = heads[start][cut:]
            parts.append(suffix)
            out.append(b"".join(parts))
        start = end
    return out


#: The bytes a JSON string escapes (orjson's: control characters, the quote and the backslash) and DEL.
_JSON_ESCAPED = bytes(range(0x20)) + b'"\\\x7f'


def run_frames(
    encoding: Encoding, proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool
) -> list[bytes]:
    """:func:`~hubbub.dialects.native_common.event_frames` (the same bytes). A msgpack run read as columns
    with small payloads is cut from the blocks its batches would be written in. A JSON run whose content
    type is not JSON and whose payloads are all ASCII text that JSON leaves as it is (no control character,
    quote, backslash or DEL: checked once over the whole run) has each payload put between the quotes of
    its ``text`` field as it is, without decoding it and encoding it again as a JSON string."""
    if encoding == "msgpack" and type(rows) is RunColumns:
        got = _column_frames(proto, rows, subs, replay)
        if got is not None:
            return got
    if encoding == "json" and rows and not is_json_type(proto.content_type):
        columns = rows if type(rows) is RunColumns else None
        payloads = columns.payloads if columns is not None else b"".join(map(_second, rows))
        if payloads.isascii() and len(payloads.translate(None, _JSON_ESCAPED)) == len(payloads):
            fmt = json_run_format(proto, subs, replay, b'"text":"%b"')
            if columns is not None:  # its columns as they are, not a pair per row
                seq0 = proto.seq
                seqs = range(seq0, seq0 + len(columns))
                return list(map(fmt.__mod__, zip(seqs, columns.times(), columns.payload_list(), strict=True)))
            return [fmt % (seq, t, p) for seq, (t, p) in enumerate(rows, proto.seq)]
    return event_frames(encoding, proto, rows, subs, replay)


def run_batches(
    encoding: Encoding,
    proto: Event,
    rows: Sequence[tuple[int, bytes]],
    subs: Sequence[str],
    replay: bool,
    limit: int,
) -> list[bytes]:
    """:func:`~hubbub.dialects.native_common.event_batches` (the same bytes), through
    :func:`uniform_batches` when the run allows it."""
    if encoding == "msgpack":
        got = uniform_batches(proto, rows, subs, replay, limit)
        if got is not None:
            return got
    return event_batches(encoding, proto, rows, subs, replay, limit)


def uniform_batches(
    proto: Event, rows: Sequence[tuple[int, bytes]], subs: Sequence[str], replay: bool, limit: int
) -> list[bytes] | None:
    """The msgpack batch frames of a run (byte for byte ``event_batches("msgpack", …)``) when all its
    payloads have one size, its seqs and times one msgpack form each and its frames are at most
    :data:`UNIFORM_FRAME_MAX` bytes; else ``None``.

    Rows read as columns (:class:`~hubbub.run_columns.RunColumns`, one payload size and ``uint 64`` times by
    construction) are written as they are: the stamps are the times' bytes, and a small payload's bytes go
    in a column at a time like the seqs', so the batch is built without a Python object per event."""
    k = len(rows)
    if not k:
        return None
    seq0 = proto.seq
    s_form = mp_uint_form(seq0)
    if s_form != mp_uint_form(seq0 + k - 1):
        return None
    columns = rows if type(rows) is RunColumns and rows.wide else None
    payloads: list[bytes] = []
    times: list[int] = []
    if columns is not None:
        size = columns.size
        t_form = _WIDE_FORM
    else:
        payloads = list(map(_second, rows))
        size = len(payloads[0])
        if size * k != sum(map(len, payloads)) or min(map(len, payloads)) != size:
            return None
        times = list(map(_first, rows))
        t_lo = min(times)
        t_form = mp_uint_form(t_lo)
        if t_lo < 0 or t_form != mp_uint_form(max(times)):
            return None
    s_code, t_code = s_form[1], t_form[1]
    s_width, t_width = struct.calcsize(s_code), struct.calcsize(t_code)
    layout = _layout(proto, subs, replay, s_form, t_form, size)
    head, at_seq, at_time, suffix = layout
    frame = len(head) + size + len(suffix)
    if frame > UNIFORM_FRAME_MAX:
        return None
    ends = _ends(frame, k, limit)
    if columns is not None and size <= STRIDED_PAYLOAD_MAX:
        return _strided_batches(columns, ends, seq0, s_code, layout)
    if columns is not None:
        payloads = columns.payload_list()
    between = suffix + head
    out: list[bytes] = []
    start = 0
    for end in ends:
        n = end - start
        lead = b"" if n == 1 else _BATCH_OPEN + mp_array_header(n)
        base = len(lead)
        items = payloads[start:end]
        items[0] = lead + head + items[0]
        items[-1] += suffix
        buf = bytearray(between).join(items)
        seqs = struct.pack(f">{n}{s_code}", *range(seq0 + start, seq0 + end))
        if columns is not None:
            stamps = columns.stamps[start * 8 : end * 8]  # the times' uint 64 bytes as they are
        else:
            stamps = struct.pack(f">{n}{t_code}", *times[start:end])
        for j in range(s_width):
            buf[base + at_seq + j :: frame] = seqs[j::s_width]
        for j in range(t_width):
            buf[base + at_time + j :: frame] = stamps[j::t_width]
        out.append(bytes(buf))
        start = end
    return out


#: Frames a batch of :func:`_strided_batches` is written in at a time: a block of small frames (50 KiB at
#: 16 B payloads) stays in the core's own caches through the strided writes, one pass per byte of seq, time
#: and payload, which over a whole batch (400 KiB for 2,048 such frames) went out to the shared cache each
#: time: 0.38 -> 0.11-0.13 µs an event to encode a 16 B page (128 frames: 0.14-0.16; 512: cache-bound
#: again under load).
_BLOCK = 256


def _layout(
    proto: Event,
    subs: Sequence[str],
    replay: bool,
    s_form: tuple[bytes, str],
    t_form: tuple[bytes, str],
    size: int,
) -> tuple[bytes, int, int, bytes]:
    """The msgpack frame of a run's events whose seqs, times and payload sizes have one form each: ``(head,
    where its seq starts, where its time starts, suffix)``, ``head`` being a frame up to its payload with
    zeros for its seq and time."""
    (s_pre, s_code), (t_pre, t_code), (b_pre, b_code) = s_form, t_form, mp_bin_form(size)
    suffix, before_seq, before_time, after_time = msgpack_run_parts(proto, subs, replay)
    a = before_seq + s_pre
    c = b"".join((after_time, b_pre, struct.pack(">" + b_code, size)))
    s_width, t_width = struct.calcsize(s_code), struct.calcsize(t_code)
    head = b"".join((a, bytes(s_width), before_time, t_pre, bytes(t_width), c))
    return head, len(a), len(a) + s_width + len(before_time) + len(t_pre), suffix


def _strided_blocks(
    columns: RunColumns, start: int, end: int, seq0: int, s_code: str, layout: tuple[bytes, int, int, bytes]
) -> Iterator[bytearray]:
    """The frames ``start..end`` of rows read as columns with small payloads (``layout``: see
    :func:`_layout`), :data:`_BLOCK` at a time: the frame's bytes repeated, with its seqs, times and payloads
    written in a byte-column at a time."""
    head, at_seq, at_time, suffix = layout
    size = columns.size
    s_width = struct.calcsize(s_code)
    unit = head + bytes(size) + suffix
    frame = len(unit)
    at_pay = len(head)
    block = unit * _BLOCK
    stamps, payloads = columns.stamps, columns.payloads
    for lo in range(start, end, _BLOCK):
        hi = min(end, lo + _BLOCK)
        buf = bytearray(block if hi - lo == _BLOCK else unit * (hi - lo))
        seqs = struct.pack(f">{hi - lo}{s_code}", *range(seq0 + lo, seq0 + hi))
        for j in range(s_width):
            buf[at_seq + j :: frame] = seqs[j::s_width]
        t = stamps[lo * 8 : hi * 8]  # the times' uint 64 bytes as they are
        for j in range(8):
            buf[at_time + j :: frame] = t[j::8]
        p = payloads[lo * size : hi * size]
        for j in range(size):
            buf[at_pay + j :: frame] = p[j::size]
        yield buf


def _strided_batches(
    columns: RunColumns, ends: list[int], seq0: int, s_code: str, layout: tuple[bytes, int, int, bytes]
) -> list[bytes]:
    """:func:`uniform_batches` of rows read as columns with small payloads: each batch its header and the
    blocks of its frames (:func:`_strided_blocks`) joined."""
    out: list[bytes] = []
    start = 0
    for end in ends:
        n = end - start
        lead = b"" if n == 1 else _BATCH_OPEN + mp_array_header(n)
        out.append(b"".join((lead, *_strided_blocks(columns, start, end, seq0, s_code, layout))))
        start = end
    return out


def _column_frames(
    proto: Event, columns: RunColumns, subs: Sequence[str], replay: bool
) -> list[bytes] | None:
    """The msgpack event frames of rows read as columns (a connection without batch frames, WebSocket's one
    message per frame): cut from the blocks :func:`_strided_batches` writes, without packing each event's
    seq, time and payload apart. ``None`` when the run does not allow it (as :func:`uniform_batches`)."""
    k = len(columns)
    seq0 = proto.seq
    s_form = mp_uint_form(seq0)
    size = columns.size
    if not k or not columns.wide or size > STRIDED_PAYLOAD_MAX or s_form != mp_uint_form(seq0 + k - 1):
        return None
    layout = _layout(proto, subs, replay, s_form, _WIDE_FORM, size)
    frame = len(layout[0]) + size + len(layout[3])
    data = b"".join(_strided_blocks(columns, 0, k, seq0, s_form[1], layout))
    return list(
        map(data.__getitem__, map(slice, range(0, len(data), frame), range(frame, len(data) + 1, frame)))
    )


def _ends(frame: int, k: int, limit: int) -> list[int]:
    """Where ``pack_batches`` cuts ``k`` frames of ``frame`` bytes each: the end index of each group, the
    longest that fits ``limit`` with its batch overhead (at least one frame)."""
    ends: list[int] = []
    start = 0
    while start < k:
        n = max(1, min(k - start, (limit - batch_overhead("msgpack", 1)) // frame))
        # The array header grows with the count (1, 3, 5 bytes): shrink until the group fits.
        while n > 1 and n * frame + batch_overhead("msgpack", n) > limit:
            n -= 1
        start += n
        ends.append(start)
    return ends
