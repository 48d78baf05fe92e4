"""The native HTTP API's renderings and request parsing (native.md §8), so the HTTP transport holds no
protocol logic: error bodies, the log in its three formats, server-sent events and the publish request's
fields.

Every JSON body is one compact line ending in ``\\n``. Pure functions, no I/O; safe from any thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from hubbub.channels import canonical
from hubbub.errors import CODES, BadChannel, BadRequest, http_status, is_temporary
from hubbub.events import Event, Position

from .native_common import (
    DEFAULT_CONTENT_TYPE,
    MSGPACK_BODY_PAIRS,
    Encoding,
    Limits,
    check_content_type,
    check_headers,
    check_idem,
    check_tags,
    event_body_json,
    event_body_msgpack,
    json_value,
    packb,
    payload_field,
    plain,
)

__all__ = [
    "LOG_CONTENT_TYPES",
    "event_object",
    "http_publish_fields",
    "http_stream_tags",
    "parse_sse_last_event_id",
    "render_http_error",
    "render_http_publish",
    "render_log",
    "render_sse_event",
    "render_sse_gap",
    "render_sse_recovered",
]

LOG_CONTENT_TYPES: dict[str, str] = {
    "json": "application/json",
    "jsonl": "application/x-ndjson",
    "msgpack": "application/msgpack",
}
HEADER_PREFIX = "hubbub-header-"


def event_object(event: Event, replay: bool = False, encoding: Encoding = "json") -> dict[str, Any]:
    """The event object of native.md §3.5 without ``op`` and ``subs``, as Python values.

    JSON form: ``time`` a string and one of ``json`` (the parsed value), ``text``, ``b64``. msgpack form:
    ``time`` an integer and ``payload`` bytes. ``"replay": true`` is added last when ``replay``.
    """
    p = event.publisher
    obj: dict[str, Any] = {
        "channel": event.channel,
        "seq": event.seq,
        "epoch": event.epoch,
        "time": str(event.time_ns) if encoding == "json" else event.time_ns,
        "publisher": {"dialect": p.dialect, "user": p.user, "app": p.app, "msg_id": p.msg_id},
        "headers": {k: v for k, v in event.headers.items() if not k.startswith(":")},
        "tags": sorted(set(event.tags)),
        "content_type": event.content_type,
    }
    if encoding == "json":
        name, value = payload_field(event)
        obj[name] = json_value(value)
    else:
        obj["payload"] = bytes(event.payload)
    if replay:
        obj["replay"] = True
    return obj


def _object_json(event: Event, replay: bool = False) -> bytes:
    body = event_body_json(event)
    return b"{" + body[1:] + (b',"replay":true}' if replay else b"}")


def render_log(
    channel: str,
    epoch: str,
    first: int,
    top: int,
    trimmed: bool,
    events: Sequence[Event],
    fmt: str = "json",
) -> tuple[bytes, str, dict[str, str]]:
    """``GET /api/v1/log/…``: (body, content type, extra response headers) for ``fmt`` ``json``, ``jsonl``
    or ``msgpack``. Any other ``fmt`` is :class:`BadRequest`. Event bodies are encoded directly, never via
    intermediate dicts."""
    ctype = LOG_CONTENT_TYPES.get(fmt)
    if ctype is None:
        raise BadRequest("format must be json, jsonl or msgpack")
    if fmt == "jsonl":
        headers = {
            "Hubbub-Epoch": epoch,
            "Hubbub-First": str(first),
            "Hubbub-Top": str(top),
            "Hubbub-Trimmed": "true" if trimmed else "false",
        }
        return b"".join(_object_json(e) + b"\n" for e in events), ctype, headers
    head = {"channel": channel, "epoch": epoch, "first": first, "top": top, "trimmed": trimmed}
    if fmt == "json":
        body = b",".join(_object_json(e) for e in events)
        return orjson.dumps(head)[:-1] + b',"events":[' + body + b"]}\n", ctype, {}
    mp_header = bytes([0x80 | MSGPACK_BODY_PAIRS])
    parts = [bytes([0x80 | (len(head) + 1)]), packb(head)[1:], packb("events"), _array_header(len(events))]
    parts.extend(mp_header + event_body_msgpack(e) for e in events)
    return b"".join(parts), ctype, {}


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def render_http_error(
    code: int, detail: str = "", *, send_detail: bool = False, message: str = "", **extra: Any
) -> tuple[int, bytes]:
    """(HTTP status, body) for an error: ``{"error":{"code":c,"message":"…","temporary":b}}\\n``. The message
    is the code's name unless ``message`` gives the error's own public text (``HubbubError.message``).

    ``extra`` (e.g. ``position`` for 409) is added inside the error object, after ``temporary``; so is
    ``detail``, but only with ``send_detail=True`` (the vectors compare error bodies exactly).
    """
    err: dict[str, Any] = {
        "code": code,
        "message": message or CODES.get(code, ("internal",))[0].replace("_", " "),
        "temporary": is_temporary(code),
    }
    if detail and send_detail:
        err["detail"] = detail
    for k, v in extra.items():
        err[k] = plain(v)
    return http_status(code), orjson.dumps({"error": err}) + b"\n"


def render_http_publish(event: Event, duplicate: bool = False) -> bytes:
    """``POST /api/v1/publish/…`` answer: ``{"channel":…,"seq":…,"epoch":…,"time":"…"}`` (+ duplicate)."""
    obj: dict[str, Any] = {
        "channel": event.channel,
        "seq": event.seq,
        "epoch": event.epoch,
        "time": str(event.time_ns),
    }
    if duplicate:
        obj["duplicate"] = True
    return orjson.dumps(obj) + b"\n"


def render_sse_event(event: Event, replay: bool = False, cache: dict[Any, Any] | None = None) -> bytes:
    """One SSE event: ``id: <time>:<epoch>:<seq>:<channel>\\ndata: <event object>\\n\\n``.

    The event object is that of §3.5 without ``op`` and ``subs``; replays keep ``"replay":true``. With a
    ``cache`` (see ``NativeCodec.encode_event``), the rendering is reused while the event is the same.
    """
    key = ("native.sse", replay)
    if cache is not None:
        hit = cache.get(key)
        if hit is not None and hit[0] is event:
            data: bytes = hit[1]
            return data
    data = b"".join(
        (
            f"id: {event.time_ns}:{event.epoch}:{event.seq}:{event.channel}\ndata: ".encode(),
            _object_json(event, replay),
            b"\n\n",
        )
    )
    if cache is not None:
        cache[key] = (event, data)
    return data


def render_sse_gap(channel: str, reason: str, since: Position, position: Position) -> bytes:
    """``event: gap`` for a resumed stream (§8): ``{"channel":…,"reason":…,"since":…,"position":…}``."""
    data = {"channel": channel, "reason": reason, "since": plain(since), "position": plain(position)}
    return b"event: gap\ndata: " + orjson.dumps(data) + b"\n\n"


def render_sse_recovered(replayed: int) -> bytes:
    return b"event: recovered\ndata: " + orjson.dumps({"replayed": replayed}) + b"\n\n"


_LAST_ID = re.compile(r"(\d{1,20}):([0-9a-z]{0,32}):(\d{1,20}):(/.*)", re.DOTALL)


def parse_sse_last_event_id(value: str) -> tuple[int, str, int, str]:
    """``<time>:<epoch>:<seq>:<channel>`` → ``(time, epoch, seq, canonical channel)``; :class:`BadRequest`
    when malformed (the channel may itself contain ``:``, so it is everything after the third colon)."""
    m = _LAST_ID.fullmatch(value)
    if m is None:
        raise BadRequest("Last-Event-ID must be <time>:<epoch>:<seq>:<channel>")
    t, seq = int(m.group(1)), int(m.group(3))
    if t >= 1 << 64 or seq >= 1 << 64:
        raise BadRequest("Last-Event-ID time or seq out of range")
    try:
        channel = canonical(m.group(4))
    except BadChannel:
        raise BadRequest("Last-Event-ID names an invalid channel") from None
    return t, m.group(2), seq, channel


def http_publish_fields(
    content_type_header: str | None,
    query_tags: Iterable[str],
    headers: Iterable[tuple[str, str]],
    idempotency_key: str | None = None,
    *,
    max_channel_bytes: int = 1024,
    max_tags: int = 64,
    max_tag_bytes: int = 256,
    max_headers: int = 64,
    max_header_bytes: int = 8192,
) -> tuple[str, dict[str, str], tuple[str, ...], str]:
    """The fields of ``POST /api/v1/publish/<channel>`` → (content type, user headers, tags, idem key).

    ``Content-Type`` (default ``application/octet-stream``), ``?tag=`` (repeatable), each
    ``Hubbub-Header-<name>`` as header ``<name>`` in lower case (repeated fields joined with ``", "``, as
    HTTP allows), ``Idempotency-Key``. Same limits and errors as a native publish (4001/4007).
    ``max_channel_bytes`` is accepted so callers can pass one limits mapping; the channel comes from the
    route.
    """
    limits = Limits(max_channel_bytes, max_tags, max_tag_bytes, max_headers, max_header_bytes)
    ct = DEFAULT_CONTENT_TYPE if not content_type_header else check_content_type(content_type_header)
    user: dict[str, str] = {}
    for name, value in headers:
        lname = name.lower()
        if not lname.startswith(HEADER_PREFIX):
            continue
        key = lname[len(HEADER_PREFIX) :]
        user[key] = f"{user[key]}, {value}" if key in user else value
    return (
        ct,
        check_headers(user.items(), limits),
        check_tags(query_tags, limits),
        check_idem(idempotency_key),
    )


def http_stream_tags(
    query_tags: Iterable[str],
    *,
    max_channel_bytes: int = 1024,
    max_tags: int = 64,
    max_tag_bytes: int = 256,
    max_headers: int = 64,
    max_header_bytes: int = 8192,
) -> frozenset[str]:
    """The ``?tag=`` parameters (repeatable) of ``GET /api/v1/stream/<pattern>`` → the subscription's tags,
    under a ``subscribe``'s limits and errors: more than ``max_tags`` distinct tags, or one over
    ``max_tag_bytes``, is 4007 (``too many tags (at most 64)``). The other limits are accepted so callers can
    pass one limits mapping."""
    limits = Limits(max_channel_bytes, max_tags, max_tag_bytes, max_headers, max_header_bytes)
    return frozenset(check_tags(query_tags, limits))
