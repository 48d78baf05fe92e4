"""The native ``deliver`` push (docs/native.md "Durable consumers"): one batch of a durable consumer's journal
items, in JSON or msgpack. Sans-I/O.

A ``deliver`` item is ``{"pos":…,"attempts":…,<the event object of an event frame without subs>}``; the rule
is "``pos`` and ``attempts``, then :func:`~.native_common.event_body_json` /
:func:`~.native_common.event_body_msgpack` of the event", and this module writes exactly those bytes (the
tests compare them over generated events), more cheaply: the items of a batch mostly share everything but
their position, seq, time and payload (one channel, one publisher, one content type), so the shared fields are
rendered once into a ``%`` template per *shape* (channel, epoch, headers, tags, content type) and each item
is one ``%`` format of its integers, its publisher's encoding (kept while the publisher stays equal: some
dialects give each event its own message id) and, in JSON, its payload field, joined into one buffer per
batch. In msgpack a payload is copied once, straight into the frame.

Invariants: the output depends only on the arguments (the shape kept from the previous call is compared by
value before it is reused); byte for byte the old per-item rule.

Concurrency contract: pure functions; the template kept between calls is per thread, so any thread may call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgpack
import orjson

from hubbub.events import Event, Publisher

from .native_common import (
    MSGPACK_BODY_PAIRS,
    MSGPACK_PUBLISHER_KEY,
    Encoding,
    event_body_json,
    event_body_msgpack,
    is_json_type,
    json_payload_field,
    publisher_json,
    publisher_msgpack,
    shared_fields_json,
    shared_fields_msgpack,
)

__all__ = ["deliver_frame"]

_MP_ITEM_HEAD: Final = bytes([0x80 | (MSGPACK_BODY_PAIRS + 2)]) + msgpack.packb("pos")
_MP_ATTEMPTS: Final = msgpack.packb("attempts")
_MP_DELIVER: Final = b"\x84" + b"".join(msgpack.packb(x) for x in ("op", "deliver", "consumer"))
_MP_BATCH_KEY: Final = msgpack.packb("batch")
_MP_ITEMS_KEY: Final = msgpack.packb("items")


def _fmt(literal: bytes) -> bytes:
    """``literal`` as part of a bytes ``%`` format."""
    return literal.replace(b"%", b"%%")


def _same_shape(a: Event, b: Event) -> bool:
    """Whether ``a`` and ``b`` render the same apart from seq, time, publisher and payload. Headers are
    compared by value and then their keys in order (the order is on the wire); the rest by value."""
    if a is b:
        return True
    ha, hb = a.headers, b.headers
    return (
        a.channel == b.channel
        and a.epoch == b.epoch
        and a.content_type == b.content_type
        and a.tags == b.tags
        and (ha is hb or (not ha and not hb) or (ha == hb and list(ha) == list(hb)))
    )


#: Shapes (templates) kept per thread and encoding, by channel (cleared when full).
SHAPES_MAX: Final = 1024


class _Shapes(threading.local):
    """The templates rendered on this thread, by channel, in each encoding, and the last publisher's
    encoding: a consumer's batches mostly repeat a few channels, and a batch may interleave them. A template
    is kept with a payload-less copy of the event it was made for, so no payload is held."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True)
        self.pack = self.packer.pack
        # channel -> (shape's event, template, JSON content type?); (publisher, its encoding)
        self.json: dict[str, tuple[Event, bytes, bool]] = {}
        self.json_pub: tuple[Publisher | None, bytes] = (None, b"")
        self.mp: dict[str, tuple[Event, bytes, bool]] = {}
        self.mp_pub: tuple[Publisher | None, bytes] = (None, b"")


def _shape_of(ev: Event) -> Event:
    """``ev`` without what varies along a shape (seq, time, publisher, payload): what a template keeps. The
    headers are copied: the kept shape must not change with a dict someone else holds."""
    return Event(ev.channel, 0, ev.epoch, 0, _NOBODY, b"", ev.content_type, dict(ev.headers), ev.tags)


def _keep(shapes: dict[str, tuple[Event, bytes, bool]], ev: Event, fmt: bytes, json_type: bool) -> Event:
    if len(shapes) >= SHAPES_MAX:
        shapes.clear()
    proto = _shape_of(ev)
    shapes[ev.channel] = (proto, fmt, json_type)
    return proto


_NOBODY: Final = Publisher("")


def _build_budget(n: int) -> int:
    """Templates a batch of ``n`` items may build: a template costs a few items' worth of the per-item
    rule, so a batch whose shapes do not repeat (a channel per event, headers that differ per event) stops
    building them and costs about what the per-item rule does."""
    return 2 + n // 16


_shapes = _Shapes()


def _json_template(ev: Event) -> tuple[bytes, bool]:
    """``{"pos":%d,"attempts":%d,"channel":…,"seq":%d,…,"time":"%d","publisher":%b,"headers":…,
    "content_type":…,%b}`` for events of ``ev``'s shape (the last ``%b`` is the payload field), and whether
    its content type is JSON."""
    a, b, c = shared_fields_json(ev)
    fmt = b"".join(
        (
            b'{"pos":%d,"attempts":%d,',
            _fmt(a),
            b"%d",
            _fmt(b),
            b'%d","publisher":%b',
            _fmt(c),
            b",%b}",
        )
    )
    return fmt, is_json_type(ev.content_type)


def _mp_template(ev: Event, pack: Callable[[Any], bytes]) -> bytes:
    """The msgpack item up to its payload's bytes: ``%b`` for pos, attempts, seq, time, the publisher map
    and the payload's bin header."""
    a, b, c = shared_fields_msgpack(ev, pack)
    pieces = (_MP_ITEM_HEAD, _MP_ATTEMPTS, a, b, MSGPACK_PUBLISHER_KEY, c)
    return b"%b".join(map(_fmt, pieces)) + b"%b"


def _bin_head(n: int) -> bytes:
    """msgpack's bin header for ``n`` bytes (the shortest form, as msgpack writes it)."""
    if n < 0x100:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _deliver_json(consumer: str, batch: int, items: Sequence[Any]) -> bytes:
    st = _shapes
    shapes = st.json
    proto: Event | None = None
    fmt, json_type = b"", False
    builds = _build_budget(len(items))
    last_pub, pub_bytes = st.json_pub
    field = json_payload_field
    out = [b'{"op":"deliver","consumer":%b,"batch":%d,"items":[' % (orjson.dumps(consumer), batch)]
    add = out.append
    for it in items:
        ev = it.event
        if proto is None or not _same_shape(ev, proto):
            hit = shapes.get(ev.channel)
            if hit is not None and hit[0] is not proto and _same_shape(ev, hit[0]):
                proto, fmt, json_type = hit
            elif builds:
                builds -= 1
                fmt, json_type = _json_template(ev)
                proto = _keep(shapes, ev, fmt, json_type)
            else:  # shapes that do not repeat: the per-item rule
                add(b'{"pos":%d,"attempts":%d%b}' % (it.pos, it.attempts, event_body_json(ev)))
                continue
        pub = ev.publisher
        if pub is not last_pub:
            # Field by field: cheaper than the dataclass's __eq__, and store reads give each event its own
            # Publisher.
            if (
                last_pub is None
                or pub.msg_id != last_pub.msg_id
                or pub.app != last_pub.app
                or pub.user != last_pub.user
                or pub.dialect != last_pub.dialect
            ):
                pub_bytes = publisher_json(ev)
            last_pub = pub
        add(fmt % (it.pos, it.attempts, ev.seq, ev.time_ns, pub_bytes, field(ev.payload, json_type)))
    st.json_pub = (last_pub, pub_bytes)
    return b"".join((out[0], b",".join(out[1:]), b"]}"))


def _deliver_msgpack(consumer: str, batch: int, items: Sequence[Any]) -> bytes:
    st = _shapes
    pack = st.pack
    shapes = st.mp
    proto: Event | None = None
    fmt = b""
    builds = _build_budget(len(items))
    last_pub, pub_bytes = st.mp_pub
    out = [
        _MP_DELIVER,
        pack(consumer),
        _MP_BATCH_KEY,
        pack(batch),
        _MP_ITEMS_KEY,
        st.packer.pack_array_header(len(items)),
    ]
    add = out.append
    for it in items:
        ev = it.event
        if proto is None or (
            # One burst's events share these objects (checked by identity first: cheaper than the call).
            not (
                ev.channel is proto.channel
                and ev.epoch is proto.epoch
                and ev.content_type is proto.content_type
                and ev.tags is proto.tags
                and not ev.headers
                and not proto.headers
            )
            and not _same_shape(ev, proto)
        ):
            hit = shapes.get(ev.channel)
            if hit is not None and hit[0] is not proto and _same_shape(ev, hit[0]):
                proto, fmt, _ = hit
            elif builds:
                builds -= 1
                fmt = _mp_template(ev, pack)
                proto = _keep(shapes, ev, fmt, False)
            else:  # shapes that do not repeat: the per-item rule
                add(b"".join((_MP_ITEM_HEAD, pack(it.pos), _MP_ATTEMPTS, pack(it.attempts))))
                add(event_body_msgpack(ev))
                continue
        pub = ev.publisher
        if pub is not last_pub:
            # Field by field: cheaper than the dataclass's __eq__, and store reads give each event its own
            # Publisher.
            if (
                last_pub is None
                or pub.msg_id != last_pub.msg_id
                or pub.app != last_pub.app
                or pub.user != last_pub.user
                or pub.dialect != last_pub.dialect
            ):
                pub_bytes = publisher_msgpack(ev, pack)
            last_pub = pub
        payload = ev.payload
        n = len(payload)
        head = b"\xc4" + n.to_bytes(1, "big") if n < 0x100 else _bin_head(n)
        attempts = it.attempts
        add(
            fmt
            % (
                pack(it.pos),
                pack(attempts) if attempts else b"\x00",
                pack(ev.seq),
                pack(ev.time_ns),
                pub_bytes,
                head,
            )
        )
        add(payload)
    st.mp_pub = (last_pub, pub_bytes)
    return b"".join(out)


def deliver_frame(encoding: Encoding, consumer: str, batch: int, items: Sequence[Any]) -> bytes:
    """``{"op":"deliver","consumer":…,"batch":n,"items":[{"pos":…,"attempts":…,<event>}, …]}``.

    ``items`` have ``pos``, ``attempts`` and ``event``. The event fields are the ``event`` frame's, byte
    for byte (``time`` a string in JSON, payload ``json``/``text``/``b64`` in JSON, ``payload`` bin in
    msgpack)."""
    if encoding == "json":
        return _deliver_json(consumer, batch, items)
    return _deliver_msgpack(consumer, batch, items)
