"""The native protocol's codec, v1 (protocols/native.md): sans-I/O, one message at a time.

:class:`NativeCodec` turns one WebSocket message (or one TCP frame) into a :data:`Command` and turns replies,
pushes and events into bytes, in JSON or msgpack. Splitting a raw TCP byte stream into frames is
:mod:`.native_stream`'s; :mod:`.native` re-exports both.

Invariants:

* ``decode`` either returns a fully validated command or raises a :class:`~hubbub.errors.HubbubError`
  whose code is in :data:`hubbub.errors.CODES`; when the frame's integer ``id`` could be read, the error
  carries it in ``request_id`` so the error frame can echo it, unless no encoding can (past 64 bits).
  Nothing else escapes.
* Every read is bounded by ``max_frame`` and the ``limits.*`` values given to the constructor.
* Encoders return complete frames (``bytes``); JSON output is compact with keys in the spec's order.
* An event body is encoded once per fan-out and encoding (``cache``); each connection only adds its ``subs``.

Concurrency contract: a codec keeps no state of a connection, so the connections of one event loop may share
it (the TCP listener and the WebSocket endpoint do). It is called from one thread (the event loop). The
module-level functions are pure and thread-safe.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgpack
import orjson

from hubbub.channels import Pattern, canonical, parse_pattern
from hubbub.errors import (
    CODES,
    BadFrame,
    BadRequest,
    FrameTooLarge,
    HubbubError,
    UnknownOp,
    is_temporary,
)
from hubbub.events import Event, Position

from .native_batch import encode_batch_reply, parse_publish_batch
from .native_commands import (
    CONSUMER_OPS,
    MAX_ID,
    MAX_U64,
    TEXT_CONTENT_TYPE,
    Auth,
    Command,
    Hello,
    Obj,
    Ping,
    Pong,
    Publish,
    PublishBatch,
    Subscribe,
    Unsubscribe,
    echo_id,
    is_int,
    json_payload,
    opt_bool,
    opt_list,
    position,
    request_id,
    string,
    sub_id,
    time_ns,
)
from .native_common import (
    DEFAULT_CONTENT_TYPE,
    DEFAULT_MAX_FRAME,
    MSGPACK_BODY_PAIRS,
    Encoding,
    Limits,
    batch_frame,
    check_content_type,
    check_headers,
    check_idem,
    check_tags,
    event_body_json,
    event_body_msgpack,
    pack_batches,
    plain,
)
from .native_consumers import deliver_frame, parse_consumer_op
from .native_replies import PublishReplies

__all__ = [
    "CHANNEL_CACHE_SIZE",
    "PROTOCOL_VERSION",
    "PUSH_FIELDS",
    "SUBPROTOCOLS",
    "NativeCodec",
    "error_message",
    "exact_json",
]

PROTOCOL_VERSION: Final = 1
#: WebSocket subprotocol → encoding.
SUBPROTOCOLS: Final[dict[str, Encoding]] = {"hubbub.v1.json": "json", "hubbub.v1.msgpack": "msgpack"}

_unpackb = msgpack.unpackb
_U32_PACK: Final = struct.Struct(">I").pack

#: Canonical forms of raw channel texts kept per codec (cleared when full).
CHANNEL_CACHE_SIZE: Final = 1024


# -- the codec --------------------------------------------------------------------------------------------

_EVENT_JSON: Final = b'{"op":"event","subs":'
_EVENT_JSON_END: Final = b"}"
_EVENT_JSON_REPLAY_END: Final = b',"replay":true}'
_MP_OP_EVENT_SUBS: Final = b"\xa2op\xa5event\xa4subs"
_MP_EVENT: Final = bytes([0x80 | (MSGPACK_BODY_PAIRS + 2)]) + _MP_OP_EVENT_SUBS
_MP_EVENT_REPLAY: Final = bytes([0x80 | (MSGPACK_BODY_PAIRS + 3)]) + _MP_OP_EVENT_SUBS
_MP_REPLAY: Final = b"\xa6replay\xc3"

#: Field order of the server pushes (native.md §3.5): listed fields first, in this order, then any others.
PUSH_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "recovered": ("sub", "replayed", "position"),
    "gap": ("sub", "channel", "since", "position", "reason"),
    "ping": (),
    "pong": ("id",),
    "consumer_closed": ("consumer", "reason"),
}


_LONG_INT = re.compile(rb"[0-9]{19,}")
_LONG_INT_STR = re.compile(r"[0-9]{19,}")


#: The types of a decoded JSON value that orjson may have read inexactly (an integer beyond 64 bits becomes a
#: float) or that may hold such a value.
_INEXACT: Final = frozenset({float, dict, list})
#: No value read (yet): orjson refused the frame.
_UNREAD: Final = object()


def exact_json(obj: Any) -> bool:
    """Whether orjson's reading ``obj`` of a frame is certainly what the standard library reads (no integer
    beyond 64 bits, which orjson reads as a float): an object whose values are neither floats nor containers,
    or no object at all (such a frame is refused, whichever library read it)."""
    return type(obj) is not dict or _INEXACT.isdisjoint(map(type, obj.values()))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def error_message(code: int) -> str:
    """The fixed public text for a code: its name with ``_`` as spaces (native.md §7)."""
    return CODES.get(code, ("internal",))[0].replace("_", " ")


class NativeCodec:
    """Decode native commands and encode native frames in one encoding (``json`` or ``msgpack``).

    Sizes are UTF-8 bytes. ``max_frame`` bounds a decoded message; the ``max_*`` limits bound channels,
    tags and headers (protocols README §2).
    """

    __slots__ = (
        "_body_key",
        "_channels",
        "_json",
        "_packer",
        "_parsers",
        "encoding",
        "limits",
        "max_frame",
        "publish_replies",
        "send_detail",
    )

    def __init__(
        self,
        encoding: Encoding,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        max_channel_bytes: int = 1024,
        max_tags: int = 64,
        max_tag_bytes: int = 256,
        max_headers: int = 64,
        max_header_bytes: int = 8192,
        send_detail: bool = False,
    ) -> None:
        if encoding not in ("json", "msgpack"):
            raise ValueError(f"unknown native encoding {encoding!r}")
        self.encoding: Encoding = encoding
        self._json = encoding == "json"
        self.max_frame = max_frame
        #: Whether error frames carry the optional ``detail`` field (native.md §7).
        self.send_detail = send_detail
        self.limits = Limits(max_channel_bytes, max_tags, max_tag_bytes, max_headers, max_header_bytes)
        # A per-codec packer: reusing one is much cheaper than msgpack.packb, and a codec has one thread.
        self._packer = msgpack.Packer(use_bin_type=True)
        # The fan-out cache is keyed by encoding, so a cache shared across encodings stays correct.
        self._body_key = f"native.{encoding}.body"
        # Raw channel text -> canonical channel: publishers repeat their channels.
        self._channels: dict[str, str] = {}
        #: The publish replies' templates (:meth:`encode_publish_reply` and :meth:`encode_publish_replies`;
        #: the hot path calls its ``encode`` straight).
        self.publish_replies = PublishReplies(encoding, self._publish_reply_object)
        self._parsers: dict[str, Callable[[Obj], Command]] = {
            "hello": self._hello,
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "publish": self._publish,
            "publish_batch": self._publish_batch,
            "ping": self._ping,
            "pong": self._pong,
            "auth": self._auth,
        }
        for op in CONSUMER_OPS:
            self._parsers[op] = functools.partial(parse_consumer_op, op, limits=self.limits)

    @property
    def binary(self) -> bool:
        """Whether frames are binary (msgpack) rather than text (JSON)."""
        return self.encoding == "msgpack"

    def __repr__(self) -> str:
        return f"NativeCodec({self.encoding!r}, max_frame={self.max_frame})"

    # -- decoding ---------------------------------------------------------------------------------------

    def decode(self, message: bytes | bytearray | memoryview | str) -> Command:
        """One WebSocket message or one TCP frame (without its newline or length prefix) → a command.

        Raises :class:`FrameTooLarge` (4003) over ``max_frame``, :class:`BadFrame` (4000) for input that is
        not one JSON object / msgpack map, and otherwise what :meth:`decode_object` raises.
        """
        if not self._json and type(message) is not str:
            # The binary hot path (msgpack over TCP or WebSocket), the general one's steps inlined.
            if len(message) > self.max_frame:
                raise FrameTooLarge(f"frame over {self.max_frame} bytes")
            try:
                obj = _unpackb(message, raw=False, strict_map_key=False)
            except Exception:
                raise BadFrame("not msgpack") from None
            if type(obj) is dict and obj.get("op") == "publish":
                try:
                    return self._publish(obj)
                except HubbubError as exc:
                    if exc.request_id is None:
                        exc.request_id = echo_id(obj.get("id"))
                    raise
        else:
            if isinstance(message, str):
                n = len(message)
                if n > self.max_frame or (
                    n * 4 > self.max_frame and len(message.encode("utf-8", "replace")) > self.max_frame
                ):
                    raise FrameTooLarge(f"frame over {self.max_frame} bytes")
                if not self._json:
                    raise BadFrame("msgpack frames are binary")
            elif len(message) > self.max_frame:
                raise FrameTooLarge(f"frame over {self.max_frame} bytes")
            obj = self._load(message)
        if type(obj) is not dict:
            raise BadFrame("a frame must be an object")
        if obj.get("op") == "publish":
            # The hot path of every publishing client, in either encoding: decode_object's steps inlined.
            try:
                return self._publish(obj)
            except HubbubError as exc:
                if exc.request_id is None:
                    exc.request_id = echo_id(obj.get("id"))
                raise
        return self.decode_object(obj)

    def _load(self, message: bytes | bytearray | memoryview | str) -> Any:
        if self._json:
            try:
                # orjson reads integers beyond 64 bits as floats, which would change a ``json`` payload's
                # digits; a frame with such a long digit run is read by the standard library instead. A
                # frame orjson reads into an object of plain values (no float, no nested container: the
                # common publish) held no such integer, and its reading is the standard library's: it is
                # taken without looking for long digit runs, a scan that costs more than orjson's parse.
                read: Any = _UNREAD
                with contextlib.suppress(ValueError):  # orjson.JSONDecodeError is a ValueError
                    read = orjson.loads(message)
                if read is not _UNREAD and exact_json(read):
                    return read
                if isinstance(message, str):
                    long_int = _LONG_INT_STR.search(message) is not None
                else:
                    long_int = _LONG_INT.search(message) is not None
                if not long_int:
                    if read is _UNREAD:
                        raise BadFrame("not JSON")
                    return read
                obj = json.loads(
                    bytes(message) if isinstance(message, memoryview) else message,
                    parse_constant=_no_constant,
                )
                # Unlike orjson, the standard library accepts escaped lone surrogates ("\\ud800"), which
                # no string of the frame may hold (they cannot be encoded); the UnicodeEncodeError is a
                # ValueError.
                json.dumps(obj, ensure_ascii=False).encode("utf-8")
                return obj
            except (ValueError, RecursionError):  # orjson.JSONDecodeError is a ValueError
                raise BadFrame("not JSON") from None
        try:
            return _unpackb(message, raw=False, strict_map_key=False)
        except Exception:
            # unpackb is pure C: any failure (bad format, extra data, bad UTF-8, unhashable key, nesting
            # depth) means the bytes are not one msgpack value.
            raise BadFrame("not msgpack") from None

    def decode_object(self, obj: dict[Any, Any]) -> Command:
        """Validate one decoded frame object. Raises 4001/4002/4004/4007 errors with ``request_id`` set
        whenever the frame has an integer ``id`` that an error frame can echo (even one out of range, so the
        client can correlate; :func:`~.native_commands.echo_id`)."""
        try:
            op = obj.get("op")
            if type(op) is not str:
                raise BadRequest("op must be a string")
            parser = self._parsers.get(op)
            if parser is None:
                raise UnknownOp("unknown op")
            return parser(obj)
        except HubbubError as exc:
            if exc.request_id is None:
                exc.request_id = echo_id(obj.get("id"))
            raise

    def _hello(self, obj: Obj) -> Hello:
        rid = request_id(obj)
        v = obj.get("v")
        if type(v) is not int:
            raise BadRequest("v must be an integer")
        if v != PROTOCOL_VERSION:
            return Hello(rid, v)
        token = obj.get("token")
        if token is not None and type(token) is not str:
            raise BadRequest("token must be a string")
        client = obj.get("client")
        if client is None:
            client = ""
        elif type(client) is not str:
            raise BadRequest("client must be a string")
        return Hello(rid, v, token, client, opt_bool(obj, "echo", True), opt_bool(obj, "batch", False))

    def _subscribe(self, obj: Obj) -> Subscribe:
        rid = request_id(obj)
        sub = sub_id(obj)
        pattern = parse_pattern(string(obj, "pattern"), self.limits.max_channel_bytes)
        raw_tags = opt_list(obj, "tags")
        tags = frozenset(check_tags(raw_tags, self.limits)) if raw_tags else frozenset()
        raw_since = obj.get("since")
        raw_last = obj.get("last")
        raw_from = obj.get("from_time")
        since: Position | dict[str, Position] | None = None
        if raw_since is not None:
            if type(raw_since) is not dict:
                raise BadRequest("since must be an object")
            since = self._since(raw_since, pattern)
        last = None
        if raw_last is not None:
            if not is_int(raw_last) or not 1 <= raw_last <= MAX_U64:
                raise BadRequest("last must be an integer >= 1")
            last = int(raw_last)
        from_time = None if raw_from is None else time_ns(raw_from)
        given = (since is not None) + (last is not None) + (from_time is not None)
        if given > 1 and not (given == 2 and isinstance(since, dict) and from_time is not None):
            raise BadRequest(
                "give at most one of since, last and from_time (from_time may accompany a since map)"
            )
        return Subscribe(rid, sub, pattern, tags, since, last, from_time)

    def _since(self, raw: Obj, pattern: Pattern) -> Position | dict[str, Position]:
        if pattern.is_exact:
            return position(raw, "since")
        out: dict[str, Position] = {}
        for key, value in raw.items():
            if type(key) is not str or not key.startswith("/"):
                raise BadRequest("since for a pattern is a map of channel to {seq, epoch}")
            ch = canonical(key, self.limits.max_channel_bytes)
            if not pattern.matches(ch):
                raise BadRequest("since lists a channel the pattern does not match")
            out[ch] = position(value, "since")
        return out

    def _unsubscribe(self, obj: Obj) -> Unsubscribe:
        return Unsubscribe(request_id(obj), sub_id(obj))

    def _publish(self, obj: Obj) -> Publish:
        # The hot path of every publishing client: the common fields are checked inline.
        rid = obj.get("id")
        if type(rid) is not int or not 0 <= rid < MAX_ID:
            rid = request_id(obj)
        lim = self.limits
        raw_channel = obj.get("channel")
        channel = self._channels.get(raw_channel) if type(raw_channel) is str else None
        if channel is None:
            raw_channel = string(obj, "channel")
            channel = canonical(raw_channel, lim.max_channel_bytes)
            if len(self._channels) >= CHANNEL_CACHE_SIZE:
                self._channels.clear()
            self._channels[raw_channel] = channel
        if self._json:
            text = obj.get("text")
            if type(text) is str and "json" not in obj and "b64" not in obj:
                # json_payload's answer for the common text payload, without its checks' list.
                payload, default_type = text.encode("utf-8"), TEXT_CONTENT_TYPE
            else:
                payload, default_type = json_payload(obj)
        else:
            raw = obj.get("payload")
            if type(raw) is bytes:
                payload = raw
            elif type(raw) is str:
                payload = raw.encode("utf-8")
            else:
                raise BadRequest("payload (bin or str) is required")
            default_type = DEFAULT_CONTENT_TYPE
        ct = obj.get("content_type")
        content_type = default_type if ct is None else check_content_type(ct)
        raw_headers = obj.get("headers")
        headers: dict[str, str] = {}
        if raw_headers is not None:
            if type(raw_headers) is not dict:
                raise BadRequest("headers must be an object of strings")
            headers = check_headers(raw_headers.items(), lim)
        raw_tags = obj.get("tags")
        tags = check_tags(opt_list(obj, "tags") or (), lim) if raw_tags is not None else ()
        idem = obj.get("idem")
        idem = "" if idem is None else check_idem(idem)
        ack = obj.get("ack", False)
        if type(ack) is not bool:
            ack = opt_bool(obj, "ack", False)
        return Publish(rid, channel, payload, content_type, headers, tags, idem, ack)

    def _publish_batch(self, obj: Obj) -> PublishBatch:
        return parse_publish_batch(
            obj, self.limits, self._channels, self._json, CHANNEL_CACHE_SIZE, self.max_frame
        )

    def encode_batch_reply(
        self,
        id: int,
        seqs: Sequence[int],
        epochs: Sequence[str],
        times: Sequence[int],
        duplicates: Sequence[int] = (),
    ) -> bytes:
        """The acknowledgement of a ``publish_batch`` (docs/native.md "Batched publishes")."""
        return encode_batch_reply(self._dump, self._json, id, seqs, epochs, times, duplicates)

    def _ping(self, obj: Obj) -> Ping:
        return Ping(None if obj.get("id") is None else request_id(obj))

    def _pong(self, obj: Obj) -> Pong:
        return Pong()

    def _auth(self, obj: Obj) -> Auth:
        return Auth(request_id(obj), string(obj, "token"))

    # -- encoding: replies and pushes -------------------------------------------------------------------

    def _dump(self, obj: dict[str, Any]) -> bytes:
        if self.encoding == "json":
            return orjson.dumps(obj)
        out: bytes = self._packer.pack(obj)
        return out

    def _wire_time(self, ns: int) -> str | int:
        return str(ns) if self.encoding == "json" else ns

    def encode_reply(self, id: int, fields: dict[str, Any] | None = None, /, **extra: Any) -> bytes:
        """``{"op":"reply","id":n,…}`` with ``fields`` then ``extra`` in order (positions become maps)."""
        obj: dict[str, Any] = {"op": "reply", "id": id}
        if fields:
            for k, v in fields.items():
                obj[k] = plain(v)
        for k, v in extra.items():
            obj[k] = plain(v)
        return self._dump(obj)

    def encode_hello_reply(
        self,
        id: int,
        session: str,
        user: str,
        ping_interval: float,
        max_frame: int,
        max_subscriptions: int,
        batch: bool = False,
    ) -> bytes:
        """The answer to ``hello`` (native.md §2); ``"batch":true`` last when the client asked for it."""
        pi: float = int(ping_interval) if float(ping_interval).is_integer() else float(ping_interval)
        obj: dict[str, Any] = {
            "op": "reply",
            "id": id,
            "v": PROTOCOL_VERSION,
            "session": session,
            "user": user,
            "ping_interval": pi,
            "limits": {"max_frame": max_frame, "max_subscriptions": max_subscriptions},
        }
        if batch:
            obj["batch"] = True
        return self._dump(obj)

    def encode_publish_replies(
        self, publishes: Sequence[tuple[Any, bool]], results: Sequence[Any]
    ) -> list[bytes]:
        """:meth:`encode_publish_reply` of each publish ``(id, ack wanted)`` that wants one, from its result
        (which has ``event`` and ``duplicate``), in order: the replies of one commit, in one pass over
        cached templates (:class:`~.native_replies.PublishReplies`); the bytes are the same."""
        return self.publish_replies.encode_many(publishes, results)

    def encode_publish_reply(self, id: Any, event: Event, duplicate: bool = False) -> bytes:
        """The acknowledgement of a publish (native.md §3.4); ``time`` is a string in JSON, and ``id`` is
        echoed as given (any JSON value: :class:`~.native_replies.PublishReplies` encodes an int's reply from
        its template and any other's in full).

        From a template cached per reply shape (:class:`~.native_replies.PublishReplies`): only the id, seq
        and time are encoded per reply, the same bytes as encoding the whole object (the tests compare them).
        """
        return self.publish_replies.encode(id, event, duplicate)

    def _publish_reply_object(self, id: Any, event: Event, duplicate: bool) -> bytes:
        """The publish reply encoded from its whole object: the replies no template covers."""
        obj: dict[str, Any] = {
            "op": "reply",
            "id": id,
            "channel": event.channel,
            "seq": event.seq,
            "epoch": event.epoch,
            "time": self._wire_time(event.time_ns),
        }
        if duplicate:
            obj["duplicate"] = True
        return self._dump(obj)

    def encode_subscribe_reply(
        self, id: int, sub: str, position: Position | None, top_time: int | None = None
    ) -> bytes:
        """``position`` for an exact channel; otherwise ``top_time`` (``"0"`` for an empty log)."""
        obj: dict[str, Any] = {"op": "reply", "id": id, "sub": sub}
        if position is not None:
            obj["position"] = {"seq": position.seq, "epoch": position.epoch}
        else:
            obj["top_time"] = self._wire_time(top_time or 0)
        return self._dump(obj)

    def encode_error(
        self, code: int, id: int | None = None, detail: str = "", *, message: str = "", **extra: Any
    ) -> bytes:
        """``{"op":"error","id":n,"code":c,"message":"…","temporary":b}`` (native.md §3.1), ``id`` only when
        answering a request, then ``extra`` (e.g. ``supported=[1]``). ``message`` is the code's name unless
        given (an error's own public text, ``HubbubError.message``: 4007's ``too many tags (at most 64)``).

        ``detail`` goes on the wire only when the codec was built with ``send_detail=True``: the
        conformance vectors compare error frames exactly, so by default it is for logs only.

        An ``id`` that neither encoding can carry (past 64 bits; :func:`~.native_commands.echo_id`) is left
        out rather than failing the frame: the error must reach the client even when its id cannot.
        """
        obj: dict[str, Any] = {"op": "error"}
        if id is not None and (id := echo_id(id)) is not None:
            obj["id"] = id
        obj["code"] = code
        obj["message"] = message or error_message(code)
        obj["temporary"] = is_temporary(code)
        if detail and self.send_detail:
            obj["detail"] = detail
        for k, v in extra.items():
            obj[k] = plain(v)
        return self._dump(obj)

    def encode_push(self, op: str, **fields: Any) -> bytes:
        """A server push: ``recovered``, ``gap``, ``ping``, ``pong`` (fields in :data:`PUSH_FIELDS` order;
        positions may be :class:`Position` or maps)."""
        obj: dict[str, Any] = {"op": op}
        for k in PUSH_FIELDS.get(op, ()):
            if k in fields:
                obj[k] = plain(fields[k])
        for k, v in fields.items():
            if k not in obj:
                obj[k] = plain(v)
        return self._dump(obj)

    # -- encoding: events (the hot path) ----------------------------------------------------------------

    def event_body(self, event: Event, cache: dict[Any, Any] | None = None) -> bytes:
        """The encoded event without ``op``/``subs``, through ``cache`` when given.

        The cache holds one ``(event, body)`` slot per encoding and is checked by identity, so a cache that
        outlives one event (a replay loop reuses one dict) is simply overwritten, never wrong.
        """
        if cache is not None:
            hit = cache.get(self._body_key)
            if hit is not None and hit[0] is event:
                body: bytes = hit[1]
                return body
        body = event_body_json(event) if self.encoding == "json" else event_body_msgpack(event)
        if cache is not None:
            cache[self._body_key] = (event, body)
        return body

    def encode_event(
        self,
        event: Event,
        subs: Sequence[str],
        replay: bool = False,
        cache: dict[Any, Any] | None = None,
    ) -> bytes:
        """An ``event`` frame (native.md §3.5) for a connection whose matching subscriptions are ``subs``.

        ``cache`` is a dict scoped to one fan-out and shared by every connection with this encoding: the
        event body is encoded on the first call, and every call only encodes ``subs`` and concatenates.
        """
        # event_body(), inlined: this runs once per event per subscribed connection.
        hit = cache.get(self._body_key) if cache is not None else None
        if hit is not None and hit[0] is event:
            body: bytes = hit[1]
        else:
            body = event_body_json(event) if self._json else event_body_msgpack(event)
            if cache is not None:
                cache[self._body_key] = (event, body)
        if cache is not None and type(subs) is tuple:
            # Connections with the same subscription ids get the very same frame.
            fk = (subs, replay)
            frame: bytes | None = cache.get(fk)
            if frame is None:
                frame = cache[fk] = self._event_frame(body, subs, replay)
            return frame
        return self._event_frame(body, subs, replay)

    def _event_frame(self, body: bytes, subs: Sequence[str], replay: bool) -> bytes:
        if type(subs) is not list and type(subs) is not tuple:
            subs = list(subs)
        if self._json:
            return b"".join(
                (_EVENT_JSON, orjson.dumps(subs), body, _EVENT_JSON_REPLAY_END if replay else _EVENT_JSON_END)
            )
        if replay:
            return b"".join((_MP_EVENT_REPLAY, self._packer.pack(subs), body, _MP_REPLAY))
        return b"".join((_MP_EVENT, self._packer.pack(subs), body))

    def encode_deliver(self, consumer: str, batch: int, items: Sequence[Any]) -> bytes:
        """A ``deliver`` push: one batch of a durable consumer (docs/native.md "Durable consumers")."""
        return deliver_frame(self.encoding, consumer, batch, items)

    def encode_batch(self, frames: Sequence[bytes]) -> bytes:
        """``{"op":"batch","frames":[…]}`` from already-encoded frames, without re-encoding them."""
        return batch_frame(self.encoding, frames)

    def encode_batches(self, frames: Sequence[bytes], limit: int) -> list[bytes]:
        """``frames`` packed into as few ``batch`` frames of at most ``limit`` bytes as possible (see
        :func:`~hubbub.dialects.native_common.pack_batches`). Thread-safe."""
        return pack_batches(self.encoding, frames, limit)

    def frame_for_stream(self, data: bytes) -> bytes:
        """Frame one encoded message for raw TCP: a JSON line, or a 4-byte big-endian length + msgpack."""
        if self.encoding == "json":
            return data + b"\n"
        return len(data).to_bytes(4, "big") + data

    def frames_for_stream(self, frames: Sequence[bytes]) -> bytes:
        """:meth:`frame_for_stream` of each of ``frames``, joined: one write of a session's queued frames."""
        if self._json:
            return b"\n".join(frames) + b"\n" if frames else b""
        u32 = _U32_PACK
        return b"".join([u32(len(f)) + f for f in frames])

    def stream_parts(self, data: bytes) -> tuple[bytes, bytes]:
        """:meth:`frame_for_stream` as two pieces to write one after the other, without copying ``data``."""
        if self._json:
            return data, b"\n"
        return len(data).to_bytes(4, "big"), data

    def streams_parts(self, frames: Sequence[bytes]) -> list[bytes]:
        """The :meth:`stream_parts` of each of ``frames``, in one list: one write of a session's frames,
        none of them copied."""
        out: list[bytes] = []
        if self._json:
            for f in frames:
                out += (f, b"\n")
        else:
            u32 = _U32_PACK
            for f in frames:
                out += (u32(len(f)), f)
        return out
