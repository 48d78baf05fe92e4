"""Wire values of the native client: acknowledgements, gaps, statistics, errors and the event codec.

Pure (no sockets, no event loop): :class:`PublishAck` and :class:`Gap` are what the client hands back,
:func:`error_from_frame` maps a native ``error`` frame onto the :mod:`hubbub.errors` tree, and
:func:`event_from_dict` / :func:`event_as_dict` convert between native JSON event objects and
:class:`~hubbub.events.Event`. Re-exported by :mod:`hubbub.client.aio` and :mod:`hubbub.client`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from hubbub.errors import (
    AuthError,
    BadChannel,
    BadFrame,
    BadRequest,
    FrameTooLarge,
    HubbubError,
    LimitExceeded,
    ProtocolError,
    ShuttingDown,
    StorageError,
    SubscriptionError,
    UnknownOp,
    is_fatal,
    is_temporary,
)
from hubbub.events import Event, Position, Publisher

__all__ = [
    "CannotConnect",
    "ClientClosed",
    "ClientConnectionError",
    "ClientStatistics",
    "ConnectionLost",
    "Gap",
    "PublishAck",
    "SubscriptionStatistics",
    "error_from_frame",
    "event_as_dict",
    "event_from_dict",
]


# -- values ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PublishAck:
    """The server's acknowledgement of a publish: where the event was committed.

    ``time`` is the commit time in nanoseconds. ``duplicate`` is true when the idempotency key had been seen
    within the server's window and the event was not appended again (the position is the original one).
    """

    channel: str
    seq: int
    epoch: str
    time: int
    duplicate: bool = False

    @property
    def position(self) -> Position:
        return Position(self.seq, self.epoch)


@dataclass(frozen=True, slots=True)
class Gap:
    """A subscription could not be recovered for ``channel``: events after ``since`` up to ``position`` are
    lost to this subscriber (``reason``: ``epoch`` the log restarted, ``trimmed`` retention removed them,
    ``ahead`` the server lost commits). The stream for that channel continues after ``position``.

    Subscriptions yield these alongside :class:`~hubbub.events.Event` values, so a gap is never silent.
    """

    channel: str
    since: Position
    position: Position
    reason: str


@dataclass(frozen=True, slots=True)
class SubscriptionStatistics:
    id: str
    pattern: str
    active: bool
    queued: int
    max_queue: int
    received: int
    duplicates_dropped: int
    gaps: int
    replayed: int
    subscribes: int


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    url: str
    connected: bool
    connects: int
    disconnects: int
    frames_sent: int
    frames_received: int
    events_received: int
    pending_requests: int
    retry_queue: int
    subscriptions: int
    queued: int
    unmatched_errors: int
    last_error: str


# -- errors ---------------------------------------------------------------------------------------------


class ClientConnectionError(HubbubError, ConnectionError):
    """The client has no usable connection. Also a :class:`ConnectionError`. Temporary (code 4300)."""

    code = 4300


class CannotConnect(ClientConnectionError):
    """The server could not be reached, or refused the WebSocket upgrade."""


class ConnectionLost(ClientConnectionError):
    """The connection dropped while a request was in flight (its outcome is unknown), or for good."""


class ClientClosed(ClientConnectionError):
    """The client was closed."""


_FINAL_CODES = frozenset(c for c in range(4000, 4400) if is_fatal(c) and not is_temporary(c))


def error_from_frame(frame: Mapping[str, Any]) -> HubbubError:
    """The :mod:`hubbub.errors` exception for a native ``error`` frame (or an HTTP ``error`` object)."""
    try:
        code = int(frame.get("code", 4300))
    except (TypeError, ValueError):
        code = 4300
    detail = frame.get("detail") or ""
    if not isinstance(detail, str):
        detail = str(detail)
    rid = frame.get("id")
    request_id = rid if isinstance(rid, int) else None
    exact: dict[int, type[HubbubError]] = {
        4000: BadFrame,
        4001: BadRequest,
        4002: UnknownOp,
        4003: FrameTooLarge,
        4004: BadChannel,
        4007: LimitExceeded,
        4301: StorageError,
        4303: ShuttingDown,
    }
    cls: type[HubbubError]
    if code in exact:
        cls = exact[code]
    elif code in (4005, 4006) or 4000 <= code < 4100:
        cls = ProtocolError
    elif 4100 <= code < 4200:
        cls = AuthError
    elif 4200 <= code < 4300:
        cls = SubscriptionError
    else:
        cls = HubbubError
    return cls(detail, code=code, request_id=request_id)


# -- JSON -----------------------------------------------------------------------------------------------

# orjson turns integers beyond 64 bits into floats; the standard library keeps them exact. Event times are
# 19 digits, so a run of 20 digits is the cheap sign that a frame needs the exact parser.
_BIG_INT = re.compile(r"\d{20}")
_BIG_INT_B = re.compile(rb"\d{20}")


def _loads(raw: str | bytes) -> Any:
    big = _BIG_INT.search(raw) if isinstance(raw, str) else _BIG_INT_B.search(raw)
    if big is not None:
        return json.loads(raw)
    return orjson.loads(raw)


def _dumps(obj: Any) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:
        # Integers over 64 bits: the standard library can encode them exactly.
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _is_json_type(content_type: str) -> bool:
    base = content_type.split(";", 1)[0].strip().lower()
    return base == "application/json" or base.endswith("+json")


def _position(obj: Any) -> Position:
    if not isinstance(obj, Mapping):
        return Position(0, "")
    return Position(int(obj.get("seq", 0)), str(obj.get("epoch", "")))


def event_from_dict(obj: Mapping[str, Any]) -> Event:
    """Decode a native JSON event object (an ``event`` push, or an HTTP log/stream event) into an Event.

    The payload comes from ``json`` (re-encoded as compact JSON, so byte-exactness of JSON payloads is not
    preserved by the JSON transport), ``text`` (UTF-8), ``b64`` or ``payload``.
    """
    if "json" in obj:
        payload = _dumps(obj["json"])
    elif "text" in obj:
        payload = str(obj["text"]).encode()
    elif "b64" in obj:
        payload = base64.b64decode(str(obj["b64"]))
    elif "payload" in obj:
        p = obj["payload"]
        payload = p if isinstance(p, bytes) else str(p).encode()
    else:
        payload = b""
    pub = obj.get("publisher")
    publisher = (
        Publisher(
            str(pub.get("dialect", "")),
            str(pub.get("user", "")),
            str(pub.get("app", "")),
            str(pub.get("msg_id", "")),
        )
        if isinstance(pub, Mapping)
        else Publisher("")
    )
    headers = obj.get("headers")
    tags = obj.get("tags")
    return Event(
        channel=str(obj.get("channel", "")),
        seq=int(obj.get("seq", 0)),
        epoch=str(obj.get("epoch", "")),
        time_ns=int(obj.get("time", 0)),
        publisher=publisher,
        payload=payload,
        content_type=str(obj.get("content_type", "")),
        headers={str(k): str(v) for k, v in headers.items()} if isinstance(headers, Mapping) else {},
        tags=tuple(str(t) for t in tags) if isinstance(tags, list) else (),
    )


def event_as_dict(event: Event) -> dict[str, Any]:
    """The native JSON event object for an Event (native.md §3.5, without ``op`` and ``subs``)."""
    p = event.publisher
    out: dict[str, Any] = {
        "channel": event.channel,
        "seq": event.seq,
        "epoch": event.epoch,
        "time": str(event.time_ns),
        "publisher": {"dialect": p.dialect, "user": p.user, "app": p.app, "msg_id": p.msg_id},
        "headers": event.user_headers,
        "tags": list(event.tags),
        "content_type": event.content_type,
    }
    if _is_json_type(event.content_type):
        try:
            out["json"] = _loads(event.payload)
            return out
        except ValueError:
            pass
    try:
        out["text"] = event.payload.decode("utf-8")
    except UnicodeDecodeError:
        out["b64"] = base64.b64encode(event.payload).decode()
    return out
