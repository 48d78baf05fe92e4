"""Pieces of the native codec shared by the frame codec (:mod:`.native`) and the HTTP renderings
(:mod:`.native_http`): field limits, payload-field selection and the pre-encoded event body.

Invariants:

* Every JSON byte string produced here is compact and valid UTF-8, written by orjson (non-ASCII as UTF-8,
  only the escapes JSON requires), except an embedded ``json`` payload, which is the stored payload with
  its insignificant whitespace removed and nothing else changed (see :func:`compact_json`).
* An event *body* is the part of the event object after ``op`` and ``subs``: ``channel`` .. payload field.
  It depends only on the event and the encoding, never on the receiving connection, so a fan-out encodes it
  once and every connection splices its own ``subs`` in front (:func:`event_body_json`,
  :func:`event_body_msgpack`).

Pure functions, no I/O; safe to call from any thread.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from operator import itemgetter
from typing import Any, Literal

import msgpack
import orjson

from hubbub.errors import BadRequest, LimitExceeded
from hubbub.events import Event, Position

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_FRAME",
    "MAX_IDEM_CHARS",
    "MSGPACK_PUBLISHER_KEY",
    "Encoding",
    "Limits",
    "batch_ends",
    "batch_frame",
    "batch_overhead",
    "check_content_type",
    "check_headers",
    "check_idem",
    "check_tags",
    "compact_json",
    "dump_json_value",
    "event_body_json",
    "event_body_msgpack",
    "event_frames",
    "is_json_type",
    "json_payload_field",
    "json_run_format",
    "json_value",
    "mp_array_header",
    "msgpack_run_parts",
    "pack_batches",
    "packb",
    "payload_field",
    "plain",
    "publisher_json",
    "publisher_msgpack",
    "shared_fields_json",
    "shared_fields_msgpack",
]

Encoding = Literal["json", "msgpack"]

DEFAULT_MAX_FRAME = 1 << 20
MAX_IDEM_CHARS = 128
MAX_CONTENT_TYPE_BYTES = 256
DEFAULT_CONTENT_TYPE = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-field limits (protocols README §2, ``limits.*``). All sizes are UTF-8 bytes."""

    max_channel_bytes: int = 1024
    max_tags: int = 64
    max_tag_bytes: int = 256
    max_headers: int = 64
    max_header_bytes: int = 8192


DEFAULT_LIMITS = Limits()


def packb(value: Any) -> bytes:
    """msgpack with the new-spec str/bin distinction (payloads go out as bin)."""
    out: bytes = msgpack.packb(value, use_bin_type=True)
    return out


def _utf8_len(s: str) -> int:
    """UTF-8 length; :class:`BadRequest` for text that has no UTF-8 form (lone surrogates, which e.g. an
    HTTP server's ``surrogateescape`` decoding of invalid bytes produces) and so could never be rendered."""
    if s.isascii():
        return len(s)
    try:
        return len(s.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadRequest("text is not valid UTF-8") from None


# -- validation shared by WebSocket/TCP commands and HTTP publishes ---------------------------------------


def check_tags(items: Iterable[object], limits: Limits) -> tuple[str, ...]:
    """Tags as sent → sorted, de-duplicated tuple. Non-strings are 4001; too many or too long are 4007, whose
    ``message`` says which and names the limit (``too many tags (at most 64)``).

    Sorting ``str`` by code point equals sorting by UTF-8 bytes (mapping.md §1).
    """
    seen: set[str] = set()
    for t in items:
        if type(t) is not str:
            raise BadRequest("tags must be strings")
        seen.add(t)
    if len(seen) > limits.max_tags:
        raise LimitExceeded(
            f"at most {limits.max_tags} tags", public=f"too many tags (at most {limits.max_tags})"
        )
    cap = limits.max_tag_bytes
    for t in seen:
        if _utf8_len(t) > cap:
            raise LimitExceeded(f"a tag is at most {cap} bytes", public=f"tag too long (at most {cap} bytes)")
    return tuple(sorted(seen))


def check_headers(items: Iterable[tuple[object, object]], limits: Limits) -> dict[str, str]:
    """User headers as sent → dict. Pseudo-header (``:``) or empty keys and non-strings are 4001; too many
    headers or too many bytes of keys and values are 4007."""
    out: dict[str, str] = {}
    total = 0
    for k, v in items:
        if type(k) is not str or type(v) is not str:
            raise BadRequest("header names and values must be strings")
        if not k:
            raise BadRequest("header names must not be empty")
        if k[0] == ":":
            raise BadRequest("header names must not start with ':'")
        out[k] = v
        total += _utf8_len(k) + _utf8_len(v)
    if len(out) > limits.max_headers:
        n = limits.max_headers
        raise LimitExceeded(f"at most {n} headers", public=f"too many headers (at most {n})")
    if total > limits.max_header_bytes:
        n = limits.max_header_bytes
        raise LimitExceeded(f"headers are at most {n} bytes", public=f"headers too large (at most {n} bytes)")
    return out


def check_idem(value: object) -> str:
    if value is None:
        return ""
    if type(value) is not str:
        raise BadRequest("idem must be a string")
    if len(value) > MAX_IDEM_CHARS:
        raise BadRequest(f"idem is at most {MAX_IDEM_CHARS} characters")
    _utf8_len(value)
    return value


_CT_BAD = re.compile(r"[\x00-\x1f\x7f]")


def check_content_type(value: object) -> str:
    """A content type is a non-empty string of at most 256 bytes without control characters (it may end up
    in HTTP headers of other dialects, so CR/LF are refused)."""
    if type(value) is not str:
        raise BadRequest("content_type must be a string")
    if not value or _utf8_len(value) > MAX_CONTENT_TYPE_BYTES or _CT_BAD.search(value):
        raise BadRequest("content_type must be 1-256 bytes without control characters")
    return value


# -- payloads ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def is_json_type(content_type: str) -> bool:
    """``application/json`` or any ``…+json`` type, parameters and case ignored (mapping.md §1)."""
    mt = content_type.split(";", 1)[0].strip().lower()
    return mt == "application/json" or mt.endswith("+json")


# A JSON string (escapes included, captured) or a run of insignificant whitespace (not captured). Only
# applied to text already known to be valid JSON, where a raw control character cannot occur in a string.
# ``split`` + ``join`` runs in C (``sub`` with a group template calls back into Python per match in 3.11).
_JSON_WS = re.compile(rb'("[^"\\]*+(?:\\.[^"\\]*+)*+")|[ \t\n\r]++', re.DOTALL)


def _reject_constant(name: str) -> Any:
    raise ValueError(name)


def _ignore_number(_: str) -> None:
    return None


def _valid_json_slow(raw: bytes) -> bool:
    """RFC 8259 validity for the texts orjson refuses although they are JSON (numbers beyond a double,
    nesting orjson does not follow). Values are not built, so no number can overflow."""
    try:
        text = raw.decode("utf-8")
        json.loads(
            text, parse_float=_ignore_number, parse_int=_ignore_number, parse_constant=_reject_constant
        )
    except (ValueError, RecursionError):
        return False
    return True


def compact_json(raw: bytes) -> bytes | None:
    """The payload as compact JSON text to embed verbatim, or ``None`` when it is not JSON.

    The payload is not re-serialised: only whitespace outside strings is removed, so numbers keep their
    exact digits and the bytes of a payload that was stored compact (native ``json``, qpubs) go out
    unchanged.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if not _valid_json_slow(raw):
            return None
    else:
        if not (b" " in raw or b"\n" in raw or b"\r" in raw or b"\t" in raw):
            return raw
        try:
            if orjson.dumps(value) == raw:  # compact already; the spaces are inside strings
                return raw
        except TypeError:
            pass  # nesting orjson does not write back
    return b"".join(filter(None, _JSON_WS.split(raw)))


def dump_json_value(value: Any) -> bytes:
    """The compact JSON text stored for a native ``json`` payload field (ingest)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        pass  # orjson follows only 254 levels of nesting: the standard library writes the same text
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError):
        raise BadRequest("json payload is nested too deeply") from None


def payload_field(event: Event) -> tuple[str, bytes]:
    """The JSON transport's payload field (native.md §3.5) and its value as JSON text.

    ``json`` when the content type is JSON and the payload parses, else ``text`` when it is valid UTF-8,
    else ``b64``.
    """
    payload = event.payload
    if is_json_type(event.content_type):
        c = compact_json(payload)
        if c is not None:
            return "json", c
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "b64", b'"' + base64.b64encode(payload) + b'"'
    return "text", orjson.dumps(text)


def json_value(compact: bytes) -> Any:
    """Parse JSON text accepted by :func:`compact_json` into a Python value."""
    try:
        return orjson.loads(compact)
    except orjson.JSONDecodeError:
        return json.loads(compact)


def _publisher(event: Event) -> dict[str, str]:
    p = event.publisher
    return {"dialect": p.dialect, "user": p.user, "app": p.app, "msg_id": p.msg_id}


def _tags(event: Event) -> list[str]:
    # Events are stored sorted and de-duplicated; sorting again is cheap insurance, paid once per fan-out.
    return sorted(set(event.tags))


def _user_headers(event: Event) -> dict[str, str]:
    return {k: v for k, v in event.headers.items() if not k.startswith(":")}


class _Fragments(threading.local):
    """Per-thread encoding state of the event bodies: a reusable msgpack packer, and the last publisher's
    encoded map in each encoding (consecutive events mostly share one ``Publisher`` object: a connection
    keeps one for all its publishes, so an identity check saves re-encoding it)."""

    def __init__(self) -> None:
        self.pack = msgpack.Packer(use_bin_type=True).pack
        self.mp_pub: tuple[object, bytes] = (None, b"")
        self.json_pub: tuple[object, bytes] = (None, b"")


_frag = _Fragments()


def _json_publisher(event: Event) -> bytes:
    pub = event.publisher
    hit = _frag.json_pub
    if hit[0] is pub:
        return hit[1]
    out = orjson.dumps(_publisher(event))
    _frag.json_pub = (pub, out)
    return out


def event_body_json(event: Event) -> bytes:
    """``,"channel":…,<payload field>`` (leading comma, no closing brace): the JSON event object after
    ``op`` and ``subs``. Wrap as ``b"{" + body[1:] + b"}"`` for the object alone."""
    head = orjson.dumps(
        {"channel": event.channel, "seq": event.seq, "epoch": event.epoch, "time": str(event.time_ns)}
    )
    headers = orjson.dumps(_user_headers(event)) if event.headers else b"{}"
    tags = orjson.dumps(_tags(event)) if event.tags else b"[]"
    name, value = payload_field(event)
    return b"".join(
        (
            b",",
            head[1:-1],
            b',"publisher":',
            _json_publisher(event),
            b',"headers":',
            headers,
            b',"tags":',
            tags,
            b',"content_type":',
            orjson.dumps(event.content_type),
            b',"',
            name.encode(),
            b'":',
            value,
        )
    )


#: Number of key/value pairs in :func:`event_body_msgpack`.
MSGPACK_BODY_PAIRS = 9

_MK = {
    k: packb(k) for k in ("channel", "seq", "epoch", "time", "publisher", "headers", "tags", "content_type")
}
_MK_CHANNEL, _MK_SEQ, _MK_EPOCH, _MK_TIME = _MK["channel"], _MK["seq"], _MK["epoch"], _MK["time"]
_MK_PUBLISHER, _MK_HEADERS, _MK_TAGS, _MK_CT = (
    _MK["publisher"],
    _MK["headers"],
    _MK["tags"],
    _MK["content_type"],
)
_MK_PAYLOAD = packb("payload")
_MP_EMPTY_MAP = b"\x80"
_MP_EMPTY_ARRAY = b"\x90"


def event_body_msgpack(event: Event) -> bytes:
    """The msgpack event map's pairs after ``op`` and ``subs`` (no map header): ``channel`` .. ``payload``,
    with ``time`` an integer and ``payload`` bin. Prefix ``0x89`` for the object alone.

    Spliced from pre-encoded keys and per-field packs: the same bytes as packing the whole map.
    """
    frag = _frag
    pack = frag.pack
    pub = event.publisher
    hit = frag.mp_pub
    if hit[0] is pub:
        pub_bytes = hit[1]
    else:
        pub_bytes = pack(_publisher(event))
        frag.mp_pub = (pub, pub_bytes)
    return b"".join(
        (
            _MK_CHANNEL,
            pack(event.channel),
            _MK_SEQ,
            pack(event.seq),
            _MK_EPOCH,
            pack(event.epoch),
            _MK_TIME,
            pack(event.time_ns),
            _MK_PUBLISHER,
            pub_bytes,
            _MK_HEADERS,
            pack(_user_headers(event)) if event.headers else _MP_EMPTY_MAP,
            _MK_TAGS,
            pack(_tags(event)) if event.tags else _MP_EMPTY_ARRAY,
            _MK_CT,
            pack(event.content_type),
            _MK_PAYLOAD,
            pack(bytes(event.payload)),
        )
    )


def publisher_json(event: Event) -> bytes:
    """The JSON event object's ``publisher`` value."""
    return _json_publisher(event)


def publisher_msgpack(event: Event, pack: Callable[[Any], bytes]) -> bytes:
    """The msgpack event map's ``publisher`` value (``pack``: a ``use_bin_type`` packer's)."""
    return pack(_publisher(event))


def shared_fields_json(event: Event) -> tuple[bytes, bytes, bytes]:
    """The JSON event object's fields that do not vary along a channel's events (the publisher aside), in
    three pieces around the seq, time and publisher values: ``"channel":…,"seq":`` / ``,"epoch":…,"time":"``
    / ``,"headers":…,"content_type":…``. Joined as ``a + seq + b + time + '","publisher":' + publisher + c
    + ',' +`` :func:`json_payload_field`, the bytes of :func:`event_body_json` without its leading comma."""
    head = orjson.dumps({"channel": event.channel, "seq": 0, "epoch": event.epoch, "time": ""})
    # head is {"channel":…,"seq":0,"epoch":…,"time":""}: split it around the seq and time values (a channel
    # cannot hold '"seq":0,"epoch":', its quotes would be escaped).
    at_seq = head.index(b'"seq":0,"epoch":') + 6
    rest = b"".join(
        (
            b',"headers":',
            orjson.dumps(_user_headers(event)) if event.headers else b"{}",
            b',"tags":',
            orjson.dumps(_tags(event)) if event.tags else b"[]",
            b',"content_type":',
            orjson.dumps(event.content_type),
        )
    )
    return head[1:at_seq], head[at_seq + 1 : len(head) - 2], rest


def shared_fields_msgpack(event: Event, pack: Callable[[Any], bytes]) -> tuple[bytes, bytes, bytes]:
    """As :func:`shared_fields_json` for the msgpack event map (``pack``: a ``use_bin_type`` packer's):
    ``channel`` .. the ``seq`` key / ``epoch`` .. the ``time`` key / ``headers`` .. the ``payload`` key.
    Joined as ``a + seq + b + time + <publisher key> + publisher + c + payload`` (each value packed), the
    bytes of :func:`event_body_msgpack`."""
    return (
        b"".join((_MK_CHANNEL, pack(event.channel), _MK_SEQ)),
        b"".join((_MK_EPOCH, pack(event.epoch), _MK_TIME)),
        b"".join(
            (
                _MK_HEADERS,
                pack(_user_headers(event)) if event.headers else _MP_EMPTY_MAP,
                _MK_TAGS,
                pack(_tags(event)) if event.tags else _MP_EMPTY_ARRAY,
                _MK_CT,
                pack(event.content_type),
                _MK_PAYLOAD,
            )
        ),
    )


#: The msgpack key ``publisher`` (between the time value and the publisher map).
MSGPACK_PUBLISHER_KEY = _MK_PUBLISHER


# -- runs of replayed events ------------------------------------------------------------------------------

# The frame's opening up to ``subs`` (map of 11 pairs, 12 with ``replay``), as dialects.native writes it.
_MP_EVENT_OPEN = b"\xa2op\xa5event\xa4subs"
_MP_REPLAY_PAIR = b"\xa6replay\xc3"
_first = itemgetter(0)
_second = itemgetter(1)
_JSON_EVENT_OPEN = b'{"op":"event","subs":'


def _fmt(literal: bytes) -> bytes:
    """``literal`` as part of a bytes ``%`` format."""
    return literal.replace(b"%", b"%%")


def json_payload_field(payload: bytes, json_type: bool) -> bytes:
    """``"<field>":<value>`` of :func:`payload_field` for a payload whose content type is JSON or not
    (:func:`is_json_type`): one payload of a run or of a deliver batch."""
    if json_type:
        c = compact_json(payload)
        if c is not None:
            return b'"json":' + c
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return b'"b64":"' + base64.b64encode(payload) + b'"'
    return b'"text":' + orjson.dumps(text)


def json_run_format(proto: Event, subs: Sequence[str], replay: bool, field: bytes = b"%b") -> bytes:
    """The ``%`` template of the JSON ``event`` frames of a run (:func:`event_frames`): formatted with each
    event's seq and time (``%d`` each), then what ``field`` asks for, by default the payload field
    (:func:`json_payload_field`, ``%b``)."""
    head = orjson.dumps({"channel": proto.channel, "seq": 0, "epoch": proto.epoch, "time": ""})
    # head is {"channel":…,"seq":0,"epoch":…,"time":""}: split it around the seq and time values.
    at_seq = head.index(b'"seq":0,"epoch":') + 6
    at_time = len(head) - 2
    headers = orjson.dumps(_user_headers(proto)) if proto.headers else b"{}"
    tags = orjson.dumps(_tags(proto)) if proto.tags else b"[]"
    shared = b"".join(
        (
            b'","publisher":',
            orjson.dumps(_publisher(proto)),
            b',"headers":',
            headers,
            b',"tags":',
            tags,
            b',"content_type":',
            orjson.dumps(proto.content_type),
            b",",
        )
    )
    return b"".join(
        (
            _fmt(_JSON_EVENT_OPEN + orjson.dumps(list(subs)) + b"," + head[1:at_seq]),
            b"%d",
            _fmt(head[at_seq + 1 : at_time]),
            b"%d",
            _fmt(shared),
            field,
            b',"replay":true}' if replay else b"}",
        )
    )


def event_frames(
    encoding: Encoding,
    proto: Event,
    rows: Sequence[tuple[int, bytes]],
    subs: Sequence[str],
    replay: bool,
) -> list[bytes]:
    """The ``event`` frames (native.md §3.5) of a run of events of one channel: event ``i`` is ``proto`` with
    seq ``proto.seq + i``, time ``rows[i][0]`` and payload ``rows[i][1]`` (``hubbub.log.base.EventRun``).

    Byte for byte what the codec's ``encode_event`` gives for each event alone (the tests compare them), but
    everything the events share is encoded once, into a ``%`` template: per event only seq, time and payload
    are formatted. This is the replay's hot path: no :class:`Event` is built per replayed event.
    """
    seq0 = proto.seq
    if encoding == "json":
        fmt = json_run_format(proto, subs, replay)
        json_type = is_json_type(proto.content_type)
        field = json_payload_field
        return [fmt % (seq, t, field(p, json_type)) for seq, (t, p) in enumerate(rows, seq0)]
    pack = _frag.pack
    pub = pack(_publisher(proto))
    opening = bytes([0x80 | (MSGPACK_BODY_PAIRS + (3 if replay else 2))]) + _MP_EVENT_OPEN
    fmt = b"".join(
        (
            _fmt(b"".join((opening, pack(list(subs)), _MK_CHANNEL, pack(proto.channel), _MK_SEQ))),
            b"%b",
            _fmt(_MK_EPOCH + pack(proto.epoch) + _MK_TIME),
            b"%b",
            _fmt(
                b"".join(
                    (
                        _MK_PUBLISHER,
                        pub,
                        _MK_HEADERS,
                        pack(_user_headers(proto)) if proto.headers else _MP_EMPTY_MAP,
                        _MK_TAGS,
                        pack(_tags(proto)) if proto.tags else _MP_EMPTY_ARRAY,
                        _MK_CT,
                        pack(proto.content_type),
                        _MK_PAYLOAD,
                    )
                )
            ),
            b"%b",
            _fmt(_MP_REPLAY_PAIR if replay else b""),
        )
    )
    return [fmt % (pack(seq), pack(t), pack(p)) for seq, (t, p) in enumerate(rows, seq0)]


# -- batch frames -----------------------------------------------------------------------------------------

_MP_BATCH_OPEN = b"\x82\xa2op\xa5batch\xa6frames"
_JSON_BATCH_OPEN = b'{"op":"batch","frames":['
_JSON_BATCH_CLOSE = b"]}"


def mp_array_header(n: int) -> bytes:
    """msgpack's array header for ``n`` items (the shortest form, as msgpack writes it)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def batch_frame(encoding: Encoding, frames: Sequence[bytes]) -> bytes:
    """``{"op":"batch","frames":[…]}`` (native.md §3.5) from already-encoded frames, without re-encoding."""
    if encoding == "json":
        return b"".join((_JSON_BATCH_OPEN, b",".join(frames), _JSON_BATCH_CLOSE))
    return b"".join((_MP_BATCH_OPEN, mp_array_header(len(frames)), *frames))


def batch_overhead(encoding: Encoding, k: int) -> int:
    """Bytes a batch frame of ``k`` frames adds to the frames themselves."""
    if encoding == "json":
        return len(_JSON_BATCH_OPEN) + len(_JSON_BATCH_CLOSE) + max(k - 1, 0)
    return len(_MP_BATCH_OPEN) + (1 if k < 16 else 3 if k < 0x10000 else 5)


def batch_ends(encoding: Encoding, sizes: Sequence[int], limit: int) -> list[int]:
    """Where :func:`pack_batches` cuts frames of these sizes: the end index of each group, in order. Each
    group is the longest that fits ``limit`` with its batch overhead (at least one frame)."""
    cum = list(accumulate(sizes, initial=0))
    k = len(sizes)
    ends: list[int] = []
    start = 0
    while start < k:
        base = cum[start]
        # The longest group [start, end) within the limit; the fit is monotone in end, so bisect.
        end = (
            bisect_right(
                range(start + 1, k + 1),
                False,
                key=lambda e: cum[e] - base + batch_overhead(encoding, e - start) > limit,
            )
            + start
        )
        end = max(end, start + 1)
        ends.append(end)
        start = end
    return ends


def pack_batches(encoding: Encoding, frames: Sequence[bytes], limit: int) -> list[bytes]:
    """``frames`` packed in order into as few batch frames of at most ``limit`` bytes as possible (native.md
    §3.5: each batch within ``max_frame``). A frame that shares no batch within the limit goes alone, as
    itself, and so does a single frame. Pure: safe on any thread."""
    k = len(frames)
    if k <= 1:
        return list(frames)
    sizes = list(map(len, frames))
    if sum(sizes) + batch_overhead(encoding, k) <= limit:
        return [batch_frame(encoding, frames)]
    out: list[bytes] = []
    start = 0
    for end in batch_ends(encoding, sizes, limit):
        out.append(frames[start] if end - start == 1 else batch_frame(encoding, frames[start:end]))
        start = end
    return out


def msgpack_run_parts(proto: Event, subs: Sequence[str], replay: bool) -> tuple[bytes, bytes, bytes, bytes]:
    """What every msgpack event frame of a run shares, around its seq, time and payload: ``(suffix,
    before_seq, before_time, after_time)``. A frame is ``before_seq`` + the seq + ``before_time`` + the
    time + ``after_time`` + the payload (bin header and bytes) + ``suffix`` (the replay flag, or nothing)."""
    pack = _frag.pack
    opening = bytes([0x80 | (MSGPACK_BODY_PAIRS + (3 if replay else 2))]) + _MP_EVENT_OPEN
    after_time = b"".join(
        (
            _MK_PUBLISHER,
            pack(_publisher(proto)),
            _MK_HEADERS,
            pack(_user_headers(proto)) if proto.headers else _MP_EMPTY_MAP,
            _MK_TAGS,
            pack(_tags(proto)) if proto.tags else _MP_EMPTY_ARRAY,
            _MK_CT,
            pack(proto.content_type),
            _MK_PAYLOAD,
        )
    )
    return (
        _MP_REPLAY_PAIR if replay else b"",
        b"".join((opening, pack(list(subs)), _MK_CHANNEL, pack(proto.channel), _MK_SEQ)),
        b"".join((_MK_EPOCH, pack(proto.epoch), _MK_TIME)),
        after_time,
    )


def plain(value: Any) -> Any:
    """Reply/push field values with positions turned into ``{"seq":…, "epoch":…}`` maps."""
    if isinstance(value, Position):
        return {"seq": value.seq, "epoch": value.epoch}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value
