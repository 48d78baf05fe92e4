"""The qpubs dialect (protocols/qpubs.md): topics, values, the qrpc line protocol and the HTTP helpers.

* Topics (§1): :func:`parse_topic` gives a :class:`Topic`, which matches topic names exactly as the engine
  does (byte-for-byte prefix and suffix tests on the name) and names the native pattern the core subscribes
  (a superset for tail wildcards, which the wiring filters with :meth:`Topic.matches`).
* Values (§2, mapping.md §5): :func:`encode_value` stores an emitted value as compact JSON; :func:`jsonval`
  and :func:`render_item` give any dialect's event as ``{"topic":…,"value":…}``.
* qrpc (§4): :class:`QrpcConnection` is one TCP connection's state machine. It is fed bytes and returns
  outputs in order: :class:`Send` (a line for the peer), :class:`Close`, or a :data:`Call` for the core, which
  the wiring answers with the ``item``/``result``/``error``/``end`` renderers. It keeps the connection's open
  streaming calls (``listen``, ``once``, ``listenExclusive``, ``openSubscription``) for ``ignore`` and
  ``closeSubscription``, and gates every call behind ``auth`` when auth is on.
* HTTP (§3): :func:`alias_topic` and :func:`alias_emit` read the alias routes' raw query strings.

Concurrency contract: a :class:`QrpcConnection` belongs to one connection and is called from one thread. The
module-level functions are pure and thread-safe.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, TypeAlias
from urllib.parse import unquote_to_bytes

import msgpack
import orjson

from hubbub.channels import MAX_CHANNEL_BYTES, Pattern, from_separated, separated_pattern, to_separated
from hubbub.config import Config, ConfigError, DialectSection, listen_field, parse_listen
from hubbub.disconnect import Disconnect
from hubbub.events import Event

from .actions import Close, Send
from .spec import DialectSpec

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_SEPARATOR",
    "MAX_TIMEOUT_MS",
    "SPEC",
    "TOPIC_SYNTAX",
    "Ack",
    "Auth",
    "Call",
    "Close",
    "CloseSubscription",
    "CreateSubscription",
    "DeleteSubscription",
    "Emit",
    "Ignore",
    "Listen",
    "OpenSubscription",
    "QpubsConfig",
    "QpubsError",
    "QrpcConnection",
    "Send",
    "Topic",
    "alias_emit",
    "alias_topic",
    "encode_value",
    "jsonval",
    "parse_timeout_ms",
    "parse_topic",
    "render_end",
    "render_error",
    "render_item",
    "render_result",
    "render_stream_item",
    "valid_sub_id",
]

DEFAULT_SEPARATOR: Final = "."
#: The log's pattern syntax of a durable subscription's or a listen group's topic (``hubbub.log.consumers``):
#: a name in a separator mapping with a head or tail wildcard, which :class:`Topic` reads.
TOPIC_SYNTAX: Final = "separated"
CONTENT_TYPE: Final = "application/json"
#: The longest ``timeout_ms`` of ``/qpubs/once``: the largest delay Node's ``setTimeout`` takes (2^31-1 ms,
#: about 24.8 days; past it Node fires at once), so no qpubs client can mean a longer one.
MAX_TIMEOUT_MS: Final = 2**31 - 1
_TIMEOUT_MS: Final = re.compile(r"[0-9]{1,10}")


class QpubsError(Exception):
    """A refusal with qpubs's message and qrpc code (§4 "Errors"); HTTP answers it with ``status``."""

    def __init__(self, message: str, code: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


def _bad_topic() -> QpubsError:
    return QpubsError("bad topic, expected string", "EBADTOPIC")


# -- topics (§1) --------------------------------------------------------------------------------------------

TopicKind: TypeAlias = Literal["exact", "head", "tail", "never"]


@dataclass(frozen=True, slots=True)
class Topic:
    """A listen topic. ``text`` is as given; ``kind`` is exact, head (``H*``), tail (``*T``) or never (a
    wildcard without the separator beside it, which is accepted and matches nothing)."""

    text: str
    kind: TopicKind
    separator: str

    def matches(self, name: str) -> bool:
        """Does the topic name ``name`` (an event's channel rendered with the separator) match?"""
        if self.kind == "exact":
            return name == self.text
        if self.kind == "head":
            return name.startswith(self.text[:-1])
        if self.kind == "tail":
            return name.endswith(self.text[1:])
        return False

    @property
    def filtered(self) -> bool:
        """Is :meth:`pattern` a superset, so that deliveries must be filtered with :meth:`matches`? For tail
        topics, and for head topics whose separator overlaps itself (``::``, ``aa``), where a name can
        start with H without H's last separator being a segment boundary of the name."""
        if self.kind == "tail":
            return True
        return self.kind == "head" and self.text[:-1].split(self.separator)[-1] != ""

    def pattern(self, max_bytes: int = MAX_CHANNEL_BYTES) -> Pattern | None:
        """The native pattern to subscribe in the core: exactly the matching channels unless
        :attr:`filtered`, where it is a superset (every channel for a tail topic); ``None`` for a topic that
        never matches (:func:`~hubbub.channels.separated_pattern`, which durable subscriptions' permission
        checks use too)."""
        return separated_pattern(self.text, self.separator, max_bytes)


def parse_topic(text: object, separator: str = DEFAULT_SEPARATOR) -> Topic:
    """Read a listen topic; raises :class:`QpubsError` (``EBADTOPIC``) for a non-string or a topic with
    both a head and a tail wildcard."""
    if not isinstance(text, str):
        raise _bad_topic()
    if text.startswith("*") and text.endswith("*"):
        raise QpubsError("cannot wildcard both head and tail", "EBADTOPIC")
    if text.endswith("*"):
        return Topic(text, "head" if text[:-1].endswith(separator) else "never", separator)
    if text.startswith("*"):
        return Topic(text, "tail" if text[1:].startswith(separator) else "never", separator)
    return Topic(text, "exact", separator)


def emit_channel(
    topic: object, separator: str = DEFAULT_SEPARATOR, max_bytes: int = MAX_CHANNEL_BYTES
) -> str:
    """The channel an emit to ``topic`` publishes on (always a literal name, mapping.md §2.4). Raises
    :class:`QpubsError` for a non-string, and :class:`~hubbub.errors.BadChannel` for a name too long."""
    if not isinstance(topic, str):
        raise _bad_topic()
    return from_separated(topic, separator, max_bytes)


def topic_name(channel: str, separator: str = DEFAULT_SEPARATOR) -> str:
    """An event's channel as a qpubs topic name."""
    return to_separated(channel, separator)


# -- values (§2) --------------------------------------------------------------------------------------------


def encode_value(value: Any) -> bytes:
    """An emitted value as stored: compact JSON."""
    return orjson.dumps(value)


class _Ext:
    pass


_EXT = _Ext()


class _Map(list[tuple[Any, Any]]):
    """A decoded msgpack map as its pairs: msgpack may key a map with an array or a map, which no dict can
    hold (a dict would raise ``TypeError``); :func:`_json_safe` turns the pairs into a JSON object."""


def _json_safe(v: Any) -> Any:
    """A decoded msgpack value as JSON (mapping.md §5.1 ``jsonval``)."""
    if isinstance(v, bytes):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, _Map):
        out: dict[str, Any] = {}
        for k, x in v:
            key = k if isinstance(k, str) else orjson.dumps(_json_safe(k)).decode()
            out[key] = _json_safe(x)
        return out
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    if v is _EXT:
        return None
    if isinstance(v, int) and not isinstance(v, bool) and not -(2**63) <= v < 2**64:
        return None
    return v


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def jsonval(event: Event) -> Any:
    """An event's payload as a JSON value (mapping.md §5.1): parsed JSON, decoded msgpack, or the text."""
    payload = event.payload
    ctype = event.content_type
    if _is_json(ctype):
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            pass
    elif ctype.split(";", 1)[0].strip().lower() == "application/msgpack":
        try:
            value = msgpack.unpackb(
                payload,
                raw=False,
                unicode_errors="replace",
                strict_map_key=False,
                ext_hook=lambda _, __: _EXT,
                use_list=True,
                object_pairs_hook=_Map,
            )
        except (ValueError, msgpack.UnpackException):
            pass
        else:
            return _json_safe(value)
    return payload.decode("utf-8", "replace")


def render_item(event: Event, separator: str = DEFAULT_SEPARATOR) -> dict[str, Any]:
    """``{"topic":…,"value":…}`` for an event of any dialect (§2)."""
    return {"topic": topic_name(event.channel, separator), "value": jsonval(event)}


# -- qrpc (§4) ----------------------------------------------------------------------------------------------

_SUB_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def valid_sub_id(sub_id: object) -> bool:
    return isinstance(sub_id, str) and _SUB_ID.fullmatch(sub_id) is not None


def _line(obj: Mapping[str, Any]) -> bytes:
    return orjson.dumps(obj) + b"\n"


def render_stream_item(call_id: str, item: Any) -> bytes:
    """A streamed item of a ``listen``, ``listenExclusive`` or ``openSubscription`` call."""
    return _line({"v": 1, "id": call_id, "s": "ok", "m": item})


def render_result(call_id: str, result: Any) -> bytes:
    """The final result of a call."""
    return _line({"v": 1, "id": call_id, "e": None, "s": "end", "m": result})


def render_error(call_id: str, error: QpubsError) -> bytes:
    """The final error of a call, which qrpc clients rebuild into an ``Error``."""
    e = {"name": "Error", "message": error.message, "code": error.code, "_isError__": 1}
    return _line({"v": 1, "id": call_id, "e": e, "s": "end"})


def render_end(call_id: str) -> bytes:
    """A streaming call closed without data (ignored, closed or deleted)."""
    return _line({"v": 1, "id": call_id, "s": "end"})


@dataclass(frozen=True, slots=True)
class Auth:
    """Authenticate with ``token``; answer with ``result {"ok":true,"user":…}`` and
    :meth:`QrpcConnection.authenticated`, or ``error unauthorized/EAUTH``."""

    call_id: str
    token: str


@dataclass(frozen=True, slots=True)
class Emit:
    """Publish ``value`` (already compact JSON) on ``channel``; answer ``{"ok":true,"delivered":N}``."""

    call_id: str
    topic: str
    channel: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Listen:
    """Start a live stream (``listen``), a one-shot (``once``: the next matching event is the result), or a
    group member (``listenExclusive`` with ``group``). Events are sent as items, or as the result for once."""

    call_id: str
    topic: Topic
    once: bool = False
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Ignore:
    """``ignore``: the connection already picked the call to close (``closes``, or ``None``). End that call's
    stream in the core, send :func:`render_end` for it, then ``{"ok":true,"removed":1|0}``."""

    call_id: str
    closes: str | None


@dataclass(frozen=True, slots=True)
class CreateSubscription:
    call_id: str
    sub_id: str
    topic: Topic


@dataclass(frozen=True, slots=True)
class OpenSubscription:
    """``openSubscription`` with its flags (§4 defaults). With ``delete`` the subscription is deleted and the
    call ends with a result instead of streaming batches. ``topic`` is ``None`` when the call gave none: fine
    for an existing subscription (a later open ignores its topic, §6); creating one without a topic is
    refused by the core with ``bad topic, expected string``."""

    call_id: str
    sub_id: str
    topic: Topic | None
    create: bool = True
    reuse: bool = True
    delete: bool = False
    shared: bool = False


@dataclass(frozen=True, slots=True)
class CloseSubscription:
    """Close this connection's open calls on ``sub_id`` (listed in ``closes``), then answer."""

    call_id: str
    sub_id: str
    closes: tuple[str, ...]
    delete: bool = False


@dataclass(frozen=True, slots=True)
class DeleteSubscription:
    call_id: str
    sub_id: str


@dataclass(frozen=True, slots=True)
class Ack:
    """Acknowledge (or, with ``error`` set, return to pending) one batch of a subscription."""

    call_id: str
    sub_id: str
    batch: int
    error: Any = None
    nack: bool = False


Call: TypeAlias = (
    Auth
    | Emit
    | Listen
    | Ignore
    | CreateSubscription
    | OpenSubscription
    | CloseSubscription
    | DeleteSubscription
    | Ack
)
Output: TypeAlias = Send | Close | Call

_STREAMING = frozenset({"listen", "once", "listenExclusive", "openSubscription"})


@dataclass(slots=True)
class _Open:
    name: str
    topic_text: str
    sub_id: str | None = None


@dataclass(slots=True)
class QrpcConnection:
    """One qrpc connection (§4): newline-delimited JSON calls in, outputs out.

    ``auth_required``: every call but ``auth`` is refused with ``EAUTH`` until :meth:`authenticated`.
    An ``auth`` call pauses the connection: its :class:`Auth` is the last output of :meth:`feed`, and the
    lines after it (pipelined by the client in the same read or later) wait in the buffer until the wiring
    has checked the token and calls :meth:`resume`, so a call sent right behind ``auth`` is judged with the
    token's answer whatever way the bytes were split. While paused, at most ``max_line`` bytes more than the
    pausing read brought may wait.
    ``max_line`` is ``limits.max_frame``; ``max_calls`` is ``limits.max_subscriptions`` (open streaming
    calls).
    """

    separator: str = DEFAULT_SEPARATOR
    auth_required: bool = False
    max_line: int = 1 << 20
    max_calls: int = 1024
    max_channel_bytes: int = MAX_CHANNEL_BYTES
    _buf: bytearray = field(default_factory=bytearray)
    _open: dict[str, _Open] = field(default_factory=dict)
    _authed: bool = False
    _paused: bool = False
    _pause_limit: int = 0
    closed: bool = False
    #: Complete lines taken from the input so far, calls or skipped (the listener's first-message timeout
    #: stops at the first).
    messages: int = 0

    # -- input --

    def feed(self, data: bytes) -> list[Output]:
        """Bytes from the socket; the outputs of every complete line, in order (up to an ``auth`` call's
        :class:`Auth`, which pauses the connection until :meth:`resume`)."""
        if self.closed:
            return []
        self._buf += data
        if self._paused:
            if len(self._buf) > self._pause_limit:
                return self._close([], "line over limits.max_frame")
            return []
        return self._lines()

    def resume(self) -> list[Output]:
        """The wiring has answered the pausing ``auth`` call (:meth:`authenticated` first if the token was
        accepted): the outputs of the lines that waited, up to the next ``auth``."""
        if self.closed or not self._paused:
            return []
        self._paused = False
        return self._lines()

    @property
    def paused(self) -> bool:
        """Whether an ``auth`` call waits for :meth:`resume`."""
        return self._paused

    def _lines(self) -> list[Output]:
        buf = self._buf
        out: list[Output] = []
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            line = bytes(buf[start:nl])
            start = nl + 1
            self.messages += 1
            if len(line) > self.max_line:
                return self._close(out, "line over limits.max_frame")
            outs = self._line(line)
            out.extend(outs)
            if outs and isinstance(outs[-1], Auth):
                del buf[:start]
                self._paused = True
                self._pause_limit = len(buf) + self.max_line
                return out
        del buf[:start]
        if len(buf) > self.max_line:
            return self._close(out, "line over limits.max_frame")
        return out

    def _close(self, out: list[Output], reason: str) -> list[Output]:
        self.closed = True
        self._buf.clear()
        out.append(Close(Disconnect.FRAME_TOO_LARGE, reason))
        return out

    def _line(self, line: bytes) -> list[Output]:
        line = line.strip()
        if not line:
            return []
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            return []  # not JSON: skipped, as stock qrpc servers do
        if not isinstance(msg, dict):
            return []
        raw_id = msg.get("id")
        if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or raw_id == "":
            return []  # no usable id: nobody to answer
        call_id = str(raw_id)
        try:
            return self._call(call_id, msg)
        except QpubsError as exc:
            return [Send(render_error(call_id, exc))]

    def _call(self, call_id: str, msg: dict[str, Any]) -> list[Output]:
        if "v" in msg and (type(msg["v"]) is not int or msg["v"] != 1):
            raise QpubsError("unsupported version", "EVERSION")
        name = msg.get("n")
        if not isinstance(name, str):
            raise QpubsError("bad request", "EBADREQ")
        if name not in _HANDLERS:
            raise QpubsError(f"{name}: no handler", "ENOHANDLER")
        if "b" in msg:
            raise QpubsError("bad request", "EBADREQ")  # qrpc blob calls carry no JSON payload
        if self.auth_required and not self._authed and name != "auth":
            raise QpubsError("unauthorized", "EAUTH", 401)
        m = msg.get("m")
        if not isinstance(m, dict):
            raise QpubsError("bad request", "EBADREQ")
        if name in _STREAMING and call_id in self._open:
            raise QpubsError("bad request", "EBADREQ")  # a call id still streaming cannot be reused
        return _HANDLERS[name](self, call_id, m)

    # -- handlers --

    def _auth(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        token = m.get("token")
        if not isinstance(token, str):
            raise QpubsError("bad request", "EBADREQ")
        return [Auth(call_id, token)]

    def _emit(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        if "value" not in m:
            raise QpubsError("bad request", "EBADREQ")
        topic = m.get("topic")
        channel = emit_channel(topic, self.separator, self.max_channel_bytes)
        return [Emit(call_id, str(topic), channel, encode_value(m["value"]))]

    def _listen(self, call_id: str, m: dict[str, Any], once: bool = False) -> list[Output]:
        topic = parse_topic(m.get("topic"), self.separator)
        self._register(call_id, "once" if once else "listen", topic.text)
        return [Listen(call_id, topic, once=once)]

    def _once(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        return self._listen(call_id, m, once=True)

    def _listen_exclusive(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        topic = parse_topic(m.get("topic"), self.separator)
        group = m.get("group")
        if not isinstance(group, str):
            raise QpubsError("bad request", "EBADREQ")
        self._register(call_id, "listenExclusive", topic.text)
        return [Listen(call_id, topic, group=group)]

    def _ignore(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        topic = m.get("topic")
        if not isinstance(topic, str):
            raise _bad_topic()
        # The oldest open listen, once or listenExclusive call with that topic string.
        closes = next(
            (cid for cid, o in self._open.items() if o.sub_id is None and o.topic_text == topic), None
        )
        if closes is not None:
            del self._open[closes]
        return [Ignore(call_id, closes)]

    def _sub_id(self, m: dict[str, Any]) -> str:
        sub_id = m.get("subId")
        if not valid_sub_id(sub_id):
            raise QpubsError("bad subId", "EBADREQ")
        return str(sub_id)

    def _create(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        sub_id = self._sub_id(m)
        return [CreateSubscription(call_id, sub_id, parse_topic(m.get("topic"), self.separator))]

    def _open_sub(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        sub_id = self._sub_id(m)
        flags = {
            k: m.get(k, d)
            for k, d in (("create", True), ("reuse", True), ("delete", False), ("shared", False))
        }
        if not all(isinstance(v, bool) for v in flags.values()):
            raise QpubsError("bad request", "EBADREQ")
        # The topic matters only when the call creates the subscription; a later open ignores it (§6).
        raw = m.get("topic")
        topic = None if raw is None else parse_topic(raw, self.separator)
        if not flags["delete"]:
            self._register(call_id, "openSubscription", "" if topic is None else topic.text, sub_id)
        return [OpenSubscription(call_id, sub_id, topic, **flags)]

    def _close_sub(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        sub_id = self._sub_id(m)
        delete = m.get("delete", False)
        if not isinstance(delete, bool):
            raise QpubsError("bad request", "EBADREQ")
        closes = tuple(cid for cid, o in self._open.items() if o.sub_id == sub_id)
        for cid in closes:
            del self._open[cid]
        return [CloseSubscription(call_id, sub_id, closes, delete)]

    def _delete_sub(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        return [DeleteSubscription(call_id, self._sub_id(m))]

    def _ack(self, call_id: str, m: dict[str, Any]) -> list[Output]:
        sub_id = self._sub_id(m)
        batch = m.get("batch")
        if isinstance(batch, bool) or not isinstance(batch, int):
            raise QpubsError("bad request", "EBADREQ")
        nack = m.get("error") is not None
        return [Ack(call_id, sub_id, batch, m.get("error"), nack)]

    def _register(self, call_id: str, name: str, topic_text: str, sub_id: str | None = None) -> None:
        if len(self._open) >= self.max_calls:
            raise QpubsError("too many listeners", "ELIMIT")
        self._open[call_id] = _Open(name, topic_text, sub_id)

    # -- from the wiring --

    def authenticated(self) -> None:
        """The core accepted an ``auth`` call's token."""
        self._authed = True

    def ended(self, call_id: str) -> None:
        """A streaming call ended on the core's side (a once got its event, a subscription was deleted,
        an open was refused): forget it."""
        self._open.pop(call_id, None)

    def open_calls(self) -> dict[str, str]:
        """Open streaming calls: call id → handler name, oldest first."""
        return {cid: o.name for cid, o in self._open.items()}


_HANDLERS = {
    "auth": QrpcConnection._auth,
    "emit": QrpcConnection._emit,
    "listen": QrpcConnection._listen,
    "once": QrpcConnection._once,
    "listenExclusive": QrpcConnection._listen_exclusive,
    "ignore": QrpcConnection._ignore,
    "createSubscription": QrpcConnection._create,
    "openSubscription": QrpcConnection._open_sub,
    "closeSubscription": QrpcConnection._close_sub,
    "deleteSubscription": QrpcConnection._delete_sub,
    "ack": QrpcConnection._ack,
}


# -- HTTP (§3) ----------------------------------------------------------------------------------------------


def alias_topic(raw_query: str) -> str:
    """The topic of an alias route: the whole raw query string, percent-decoded, ``+`` kept as ``+``. Bytes
    that are not UTF-8 after decoding are replaced (U+FFFD), so the topic is always text; so are raw bytes
    of the request target that reached the query as surrogate escapes."""
    return unquote_to_bytes(raw_query.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")


def parse_timeout_ms(text: str | None) -> int:
    """``/qpubs/once``'s ``timeout_ms``: absent or empty is 0 (no timeout); otherwise ASCII digits whose value
    is at most :data:`MAX_TIMEOUT_MS`. Raises :class:`QpubsError` (400, ``EBADREQ``) for anything else: a
    sign, a fraction, an exponent, spaces, or a larger number (which would otherwise never time out)."""
    if not text:
        return 0
    if _TIMEOUT_MS.fullmatch(text) is None or int(text) > MAX_TIMEOUT_MS:
        raise QpubsError(f"bad timeout_ms, expected an integer from 0 to {MAX_TIMEOUT_MS}", "EBADREQ")
    return int(text)


def alias_emit(raw_query: str) -> tuple[str, Any]:
    """``/emit?<topic>,<value>``: the topic before the first ``,`` and the value after it, JSON if it
    parses, else the string itself. Raises :class:`QpubsError` (``missing value``) without a ``,``."""
    text = alias_topic(raw_query)
    topic, comma, value = text.partition(",")
    if not comma:
        raise QpubsError("missing value", "EBADREQ")
    try:
        return topic, orjson.loads(value)
    except orjson.JSONDecodeError:
        return topic, value


#: qpubs as the server wires it: the qrpc TCP listener (§4; its HTTP routes are a route module of their
#: own), the oldest live item dropped when a reader falls behind (§5).
@dataclass(frozen=True, slots=True)
class QpubsConfig(DialectSection):
    """qpubs' configuration section (protocols/qpubs.md §1, §8; docs/dialects/qpubs.md)."""

    SECTION: ClassVar[str] = "qpubs"
    HELP: ClassVar[Mapping[str, str]] = {
        "enabled": "serve qpubs: HTTP /qpubs/* and the aliases, and the qrpc TCP listener (true/false)",
        "separator": "the qpubs topic separator (non-empty, no *)",
        "qrpc_listen": "HOST:PORT of the qpubs qrpc TCP listener",
        "heartbeat_s": "seconds of silence before a qpubs HTTP listen stream sends a heartbeat",
        "batch_bytes": "the most event bytes in one batch of a durable qpubs subscription",
        "batch_wait_ms": "how long a durable qpubs subscription waits to fill a batch",
        "auth": "auth for qpubs (HTTP and qrpc); empty means auth.mode",
    }
    enabled: bool = True
    separator: str = DEFAULT_SEPARATOR
    qrpc_listen: str = listen_field("127.0.0.1:1337")  # qpubs.md §1
    heartbeat_s: float = 15.0
    batch_bytes: int = 2_097_152
    batch_wait_ms: int = 5
    auth: str = ""  # "" means auth.mode

    def validate(self, config: Config) -> None:
        DialectSection.validate(self, config)
        if not self.separator or "*" in self.separator:
            raise ConfigError("qpubs.separator: must be non-empty and must not contain *")
        parse_listen(self.qrpc_listen, "qpubs.qrpc_listen")
        if self.heartbeat_s <= 0 or self.batch_bytes <= 0:
            raise ConfigError("qpubs.heartbeat_s and qpubs.batch_bytes: must be positive")
        if self.batch_wait_ms < 0:
            raise ConfigError("qpubs.batch_wait_ms: must not be negative")


SPEC: Final = DialectSpec(
    name="qpubs",
    section="qpubs",
    config=QpubsConfig,
    stream_listeners=("qpubs.qrpc_listen",),
    overflow="drop_oldest",
    binding="hubbub.transports.qrpc:mount",
)
