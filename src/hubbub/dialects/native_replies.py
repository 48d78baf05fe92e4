"""Publish acknowledgements of the native protocol (native.md §3.4), built from cached templates.

A publisher's burst is acknowledged by replies that share every byte but the id, seq and time (and, in
msgpack, the width of those integers). :class:`PublishReplies` keeps the constant bytes per reply shape and
encodes only the varying fields:

* msgpack: per (channel, epoch, width of the id, of the seq, of the time), one :class:`struct.Struct` whose
  ``s`` fields are the constant bytes (each ending with the type byte of the integer after it), so one
  reply is one ``pack`` call. The integer widths are msgpack's smallest encoding of each value (what
  ``msgpack.Packer`` writes); a reply reuses the previous reply's shape while its three integers stay in
  that shape's ranges, so a run of a channel costs one range check and one ``pack`` per reply.
* JSON: per (channel, epoch), one ``%`` template of the three integers (``time`` inside its string quotes).

Both give the bytes of encoding the whole reply object with the spec's key order (the tests compare them
for every integer width). Replies outside the templates (a duplicate, an id that is not an integer, an
integer msgpack cannot hold) go to the caller's general encoder.

Concurrency contract: an instance belongs to one codec and is called from one thread (the event loop); the
module-level tables are constant.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgpack
import orjson

from hubbub.events import Event

from .native_common import Encoding

__all__ = ["REPLY_SHAPES_MAX", "PublishReplies"]

#: Reply templates (msgpack: shapes) an instance keeps (cleared when full).
REPLY_SHAPES_MAX: Final = 1024

# A publish reply's map header and keys up to the id's value: {"op": "reply", "id": …, (4 more)}.
_MP_REPLY_HEAD: Final = b"\x86\xa2op\xa5reply\xa2id"

# msgpack's integer encodings, smallest first as msgpack.Packer picks them: (lowest, highest, type byte,
# struct code of the value after it). A fixint is its own type byte: the value's byte, no prefix.
_MP_INTS: Final[tuple[tuple[int, int, bytes, str], ...]] = (
    (0, 0x7F, b"", "B"),
    (-32, -1, b"", "b"),
    (0x80, 0xFF, b"\xcc", "B"),
    (0x100, 0xFFFF, b"\xcd", "H"),
    (0x1_0000, 0xFFFF_FFFF, b"\xce", "I"),
    (1 << 32, (1 << 64) - 1, b"\xcf", "Q"),
    (-0x80, -33, b"\xd0", "b"),
    (-0x8000, -0x81, b"\xd1", "h"),
    (-0x8000_0000, -0x8001, b"\xd2", "i"),
    (-(1 << 63), -0x8000_0001, b"\xd3", "q"),
)

#: A msgpack reply shape: the ``pack`` of its struct, its three constant parts, and the ranges of the id,
#: seq and time it holds (the reply is ``pack(head, id, mid, seq, tail, time)``).
_Shape = tuple[Callable[..., bytes], bytes, bytes, bytes, int, int, int, int, int, int]

# The empty ranges of no shape yet: no integer is in them.
_NONE: Final = (None, b"", b"", b"", 1, 0, 1, 0, 1, 0)


# The index in _MP_INTS of a non-negative integer's encoding by its bit length, and of a negative one's by
# the bit length of its complement (-1 - v: 0 for -1, 31 for -32, 63 for -64).
_BY_BITS: Final = tuple(
    next(i for i, c in enumerate(_MP_INTS) if c[0] >= 0 and c[1] >= (1 << b) - 1) for b in range(65)
)
_BY_BITS_NEG: Final = tuple(
    next(i for i, c in enumerate(_MP_INTS) if c[1] < 0 and c[0] <= -(1 << b)) for b in range(64)
)


def _int_class(v: int) -> int:
    """The index in :data:`_MP_INTS` of ``v``'s msgpack encoding; -1 when msgpack cannot hold it."""
    if v >= 0:
        b = v.bit_length()
        return _BY_BITS[b] if b <= 64 else -1
    b = (~v).bit_length()
    return _BY_BITS_NEG[b] if b <= 63 else -1


class PublishReplies:
    """The publish replies of one codec's encoding; see the module docstring. ``general(id, event,
    duplicate)`` encodes the replies no template covers."""

    __slots__ = ("_formats", "_general", "_json", "_last", "_packer", "_shapes")

    def __init__(self, encoding: Encoding, general: Callable[[Any, Event, bool], bytes]) -> None:
        self._json = encoding == "json"
        self._general = general
        self._packer = msgpack.Packer(use_bin_type=True)
        # (channel, epoch, id class, seq class, time class) -> msgpack shape.
        self._shapes: dict[tuple[str, str, int, int, int], _Shape] = {}
        # (channel, epoch) -> JSON ``%`` template.
        self._formats: dict[tuple[str, str], bytes] = {}
        # The channel, epoch and shape of the last single reply (encode): a publisher's next reply, one by
        # one, mostly has the same shape.
        self._last: tuple[str | None, str, _Shape] = (None, "", _NONE)  # type: ignore[assignment]

    def __len__(self) -> int:
        """The templates kept (bounded by :data:`REPLY_SHAPES_MAX`)."""
        return len(self._shapes) + len(self._formats)

    def encode(self, id: Any, event: Event, duplicate: bool = False) -> bytes:
        """The reply to one publish."""
        if duplicate or type(id) is not int:
            return self._general(id, event, duplicate)
        if self._json:
            key = (event.channel, event.epoch)
            return (self._formats.get(key) or self._format(*key)) % (id, event.seq, event.time_ns)
        channel, epoch, seq, t = event.channel, event.epoch, event.seq, event.time_ns
        last_channel, last_epoch, shape = self._last
        if (
            channel is not last_channel
            or epoch != last_epoch
            or not (shape[4] <= id <= shape[5] and shape[6] <= seq <= shape[7] and shape[8] <= t <= shape[9])
        ):
            got = self._shape(channel, epoch, id, seq, t)
            if got is None:
                return self._general(id, event, duplicate)
            shape = got
            self._last = (channel, epoch, shape)
        return shape[0](shape[1], id, shape[2], seq, shape[3], t)

    def encode_many(self, publishes: Sequence[tuple[Any, bool]], results: Sequence[Any]) -> list[bytes]:
        """The replies of one commit, in one pass: of each publish ``(id, ack wanted)`` that wants one, from
        its result (which has ``event`` and ``duplicate``), in order."""
        if self._json:
            return self._json_many(publishes, results)
        general = self._general
        shape_of = self._shape
        out: list[bytes] = []
        add = out.append
        channel: str | None = None
        epoch = ""
        pack, head, mid, tail, ilo, ihi, slo, shi, tlo, thi = _NONE
        for (rid, want), r in zip(publishes, results, strict=True):
            if not want:
                continue
            ev = r.event
            if r.duplicate or type(rid) is not int:
                add(general(rid, ev, r.duplicate))
                continue
            seq = ev.seq
            t = ev.time_ns
            if (
                ev.channel is not channel
                or ev.epoch != epoch
                or not (ilo <= rid <= ihi and slo <= seq <= shi and tlo <= t <= thi)
            ):
                shape = shape_of(ev.channel, ev.epoch, rid, seq, t)
                if shape is None:
                    channel = None
                    add(general(rid, ev, False))
                    continue
                channel, epoch = ev.channel, ev.epoch
                pack, head, mid, tail, ilo, ihi, slo, shi, tlo, thi = shape
            add(pack(head, rid, mid, seq, tail, t))  # type: ignore[misc]
        return out

    def encode_run(
        self, publishes: Sequence[tuple[Any, bool]], proto: Event, rows: Sequence[tuple[int, bytes]]
    ) -> list[bytes]:
        """:meth:`encode_many` of a committed run's results, none a duplicate: event ``i`` is ``proto`` with
        seq ``proto.seq + i`` and ``(time, payload)`` ``rows[i]`` (``EventRun``), read without building it."""
        general = self._general
        channel, epoch, seq0 = proto.channel, proto.epoch, proto.seq
        out: list[bytes] = []
        add = out.append
        fmt = (self._formats.get((channel, epoch)) or self._format(channel, epoch)) if self._json else b""
        pack, head, mid, tail, ilo, ihi, slo, shi, tlo, thi = _NONE
        for i, ((rid, want), (t, payload)) in enumerate(zip(publishes, rows, strict=True)):
            if not want:
                continue
            seq = seq0 + i
            if type(rid) is int and fmt:
                add(fmt % (rid, seq, t))
                continue
            if type(rid) is int and not (ilo <= rid <= ihi and slo <= seq <= shi and tlo <= t <= thi):
                shape = self._shape(channel, epoch, rid, seq, t)
                if shape is not None:
                    pack, head, mid, tail, ilo, ihi, slo, shi, tlo, thi = shape
            if type(rid) is int and ilo <= rid <= ihi and slo <= seq <= shi and tlo <= t <= thi:
                add(pack(head, rid, mid, seq, tail, t))  # type: ignore[misc]
            else:  # a reply no template covers: from its event
                p = proto
                ev = Event(channel, seq, epoch, t, p.publisher, payload, p.content_type, p.headers, p.tags)
                add(general(rid, ev, False))
        return out

    def _json_many(self, publishes: Sequence[tuple[Any, bool]], results: Sequence[Any]) -> list[bytes]:
        """:meth:`encode_many` in JSON: one ``%`` format per reply from its (channel, epoch) template."""
        general = self._general
        format_of = self._format
        out: list[bytes] = []
        add = out.append
        channel: str | None = None
        epoch = ""
        fmt = b""
        for (rid, want), r in zip(publishes, results, strict=True):
            if not want:
                continue
            ev = r.event
            if r.duplicate or type(rid) is not int:
                add(general(rid, ev, r.duplicate))
                continue
            if ev.channel is not channel or ev.epoch != epoch:
                channel, epoch = ev.channel, ev.epoch
                fmt = format_of(channel, epoch)
            add(fmt % (rid, ev.seq, ev.time_ns))
        return out

    def _format(self, channel: str, epoch: str) -> bytes:
        """The JSON reply of ``channel`` and ``epoch`` as a ``%d`` template of its id, seq and time."""
        formats = self._formats
        got = formats.get((channel, epoch))
        if got is None:
            if len(formats) >= REPLY_SHAPES_MAX:
                formats.clear()
            got = formats[(channel, epoch)] = b"".join(
                (
                    b'{"op":"reply","id":%d,"channel":',
                    orjson.dumps(channel).replace(b"%", b"%%"),
                    b',"seq":%d,"epoch":',
                    orjson.dumps(epoch).replace(b"%", b"%%"),
                    b',"time":"%d"}',
                )
            )
        return got

    def _shape(self, channel: str, epoch: str, rid: int, seq: int, t: int) -> _Shape | None:
        """The msgpack shape of a reply of ``channel`` and ``epoch`` with these integers; None when one of
        them is beyond msgpack's 64 bits."""
        ic, sc, tc = _int_class(rid), _int_class(seq), _int_class(t)
        if ic < 0 or sc < 0 or tc < 0:
            return None
        shapes = self._shapes
        key = (channel, epoch, ic, sc, tc)
        got = shapes.get(key)
        if got is None:
            if len(shapes) >= REPLY_SHAPES_MAX:
                shapes.clear()
            pack = self._packer.pack
            ilo, ihi, imark, icode = _MP_INTS[ic]
            slo, shi, smark, scode = _MP_INTS[sc]
            tlo, thi, tmark, tcode = _MP_INTS[tc]
            head = _MP_REPLY_HEAD + imark
            mid = b"".join((pack("channel"), pack(channel), pack("seq"), smark))
            tail = b"".join((pack("epoch"), pack(epoch), pack("time"), tmark))
            layout = struct.Struct(f">{len(head)}s{icode}{len(mid)}s{scode}{len(tail)}s{tcode}")
            got = shapes[key] = (layout.pack, head, mid, tail, ilo, ihi, slo, shi, tlo, thi)
        return got
