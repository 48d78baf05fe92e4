"""The ``event`` frames of a page of replayed events of any channels (a pattern's replay). Sans-I/O.

A pattern's replay reads the log in commit order, so a page interleaves many channels and seldom holds two
consecutive events of one channel: the run form (:func:`~.native_common.event_frames`, one template per run)
would build a template per event. Here the template is per *shape* (channel, epoch, publisher, content type,
headers, tags), one per channel, kept from page to page (``shapes``): a replay of a thousand channels
builds a thousand templates once and formats each event's seq, time and payload into its channel's. Byte
for byte the codec's ``encode_event`` of each event alone (the tests compare them).

Concurrency contract: a pure function of its arguments; the node calls it on a reader thread, next to the
read of the page, while the loop writes the previous one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import msgpack
import orjson

from hubbub.events import Event

from .native_common import (
    MSGPACK_BODY_PAIRS,
    MSGPACK_PUBLISHER_KEY,
    Encoding,
    is_json_type,
    json_payload_field,
    publisher_json,
    publisher_msgpack,
    shared_fields_json,
    shared_fields_msgpack,
)

__all__ = ["page_frames"]

_MP_OP_EVENT_SUBS: Final = b"\xa2op\xa5event\xa4subs"
_MP_REPLAY_PAIR: Final = b"\xa6replay\xc3"
#: The key of a shape cache's setting (:func:`page_frames`): not a channel (channels start with "/").
_SETTING: Final = "setting"


def _fmt(literal: bytes) -> bytes:
    """``literal`` as part of a bytes ``%`` format."""
    return literal.replace(b"%", b"%%")


def _json_template(ev: Event, subs: bytes, replay: bool) -> tuple[bytes, bool]:
    """The frame of events of ``ev``'s shape as a ``%`` format of seq, time and the payload field, and
    whether the content type is JSON (``subs``: the ``subs`` value, encoded)."""
    a, b, c = shared_fields_json(ev)
    fmt = b"".join(
        (
            _fmt(b'{"op":"event","subs":' + subs + b"," + a),
            b"%d",
            _fmt(b),
            b"%d",
            _fmt(b'","publisher":' + publisher_json(ev) + c + b","),
            b"%b",
            b',"replay":true}' if replay else b"}",
        )
    )
    return fmt, is_json_type(ev.content_type)


def _mp_template(ev: Event, opening: bytes, pack: Callable[[Any], bytes]) -> bytes:
    """The msgpack frame of events of ``ev``'s shape as a ``%`` format of the packed seq, time and payload
    (``opening``: the map header, ``op`` and the packed ``subs``)."""
    a, b, c = shared_fields_msgpack(ev, pack)
    return b"".join(
        (
            _fmt(opening + a),
            b"%b",
            _fmt(b),
            b"%b",
            _fmt(MSGPACK_PUBLISHER_KEY + publisher_msgpack(ev, pack) + c),
        )
    )


#: Templates a page cache keeps (:func:`page_frames`; cleared when full): a replay over more channels than
#: this builds some templates again, page after page.
SHAPES_MAX: Final = 8192


def _same_shape(ev: Event, shape: list[Any]) -> bool:
    """Whether ``ev`` renders as the kept ``shape`` of its channel (``[epoch, publisher, content type,
    headers, tags, …]``) but for seq, time and payload; when it does with another publisher object of the
    same value, that object is kept (the next events of the page share it). Field by field: cheaper than the
    dataclasses' ``__eq__``. Headers compare by value and then their keys in order (the order is on the
    wire)."""
    pub, p = ev.publisher, shape[1]
    ha, hb = ev.headers, shape[3]
    same = (
        ev.epoch == shape[0]
        and (
            pub is p
            or (
                pub.msg_id == p.msg_id
                and pub.user == p.user
                and pub.app == p.app
                and pub.dialect == p.dialect
            )
        )
        and ev.content_type == shape[2]
        and ev.tags == shape[4]
        and ((not ha and not hb) or (ha == hb and list(ha) == list(hb)))
    )
    if same:
        shape[1] = pub
    return same


def _shape(ev: Event, *rendered: Any) -> list[Any]:
    """What a kept template of ``ev``'s shape remembers: ``[epoch, publisher, content type, headers, tags,
    *rendered]``. The headers are copied: the kept shape must not change with a dict someone else holds."""
    return [ev.epoch, ev.publisher, ev.content_type, dict(ev.headers), ev.tags, *rendered]


def page_frames(
    encoding: Encoding,
    events: Sequence[Event],
    subs: Sequence[str],
    replay: bool,
    shapes: dict[Any, Any] | None = None,
) -> list[bytes]:
    """The ``event`` frames (native.md §3.5) of ``events``, in order, for a connection whose matching
    subscriptions are ``subs``: the codec's ``encode_event`` of each, built from one template per shape.

    ``shapes`` keeps the templates from one call to the next (one replay's pages, encoded one after another:
    a caller never shares it between threads at once), one per channel (a channel whose shape changes gets
    a new one); it notes what the templates depend on, so a call with another encoding, ``subs`` or
    ``replay`` starts it afresh."""
    if shapes is None:
        shapes = {}
    setting = (encoding, tuple(subs), replay)
    if shapes.get(_SETTING) != setting or len(shapes) > SHAPES_MAX:
        shapes.clear()
        shapes[_SETTING] = setting
    if encoding == "json":
        subs_json = orjson.dumps(list(subs))

        def template(ev: Event) -> list[Any]:
            return _shape(ev, *_json_template(ev, subs_json, replay))

    else:
        pack = msgpack.Packer(use_bin_type=True).pack
        opening = (
            bytes([0x80 | (MSGPACK_BODY_PAIRS + (3 if replay else 2))]) + _MP_OP_EVENT_SUBS + pack(list(subs))
        )
        end = _fmt(_MP_REPLAY_PAIR if replay else b"")

        def template(ev: Event) -> list[Any]:
            return _shape(ev, _mp_template(ev, opening, pack) + b"%b" + end)

    kept: list[list[Any]] = []
    add = kept.append
    hit: Any  # a kept shape (_shape), or None
    for ev in events:
        hit = shapes.get(ev.channel)
        # The usual event has its channel's kept publisher object and no headers: checked inline (no call).
        usual = (
            hit is not None
            and ev.publisher is hit[1]
            and ev.epoch == hit[0]
            and not ev.headers
            and not hit[3]
            and ev.content_type == hit[2]
            and ev.tags == hit[4]
        )
        if not usual and (hit is None or not _same_shape(ev, hit)):
            hit = shapes[ev.channel] = template(ev)
        add(hit)
    if encoding == "json":
        field = json_payload_field
        return [k[5] % (e.seq, e.time_ns, field(e.payload, k[6])) for k, e in zip(kept, events, strict=True)]
    return [
        k[5] % (pack(e.seq), pack(e.time_ns), pack(bytes(e.payload)))
        for k, e in zip(kept, events, strict=True)
    ]
