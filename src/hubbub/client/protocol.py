"""The client side of the native protocol (native.md), sans-I/O: one connection's state, no sockets, no loop.

:class:`ClientProtocol` is what :class:`~hubbub.client.aio.AsyncClient` (and the blocking client on top of
it), :class:`~hubbub.client.bulk.BulkPublisher` and the federation link speak. It is given bytes (through a
:class:`~hubbub.client.framing.Framing`) or whole messages (from a WebSocket library) and hands back typed
events; it is given calls (hello, a request, a subscribe) and hands back the bytes to send. What to do
with them (wait, resend, reconnect, queue for a consumer) is the caller's: the shells own their sockets,
their timers and their policies, this class owns the wire.

It owns, for one connection:

* **the codec**: JSON (orjson, integers beyond 64 bits exact) or msgpack, and the framing when there is
  one; every frame it encodes is checked against the server's ``max_frame`` (:class:`FrameTooLarge`);
* **the handshake**: :meth:`ClientProtocol.hello`, answered by :class:`Welcome` (session, ping interval,
  the server's ``max_frame``) or :class:`HelloRefused`;
* **request ids and their replies**: each request carries a caller's *token* (a future, a publish item,
  anything); the reply or error that answers it comes back as :class:`Replies` or :class:`Refused` with
  that token, ``batch`` frames unpacked in order, ``publish_batch`` replies and errors alike; an error no
  request is waiting for is a :class:`ServerError`; :meth:`ClientProtocol.abandon` hands back every token
  still in flight (the connection is gone: the caller fails or resends them);
* **subscriptions and their positions**: :meth:`ClientProtocol.subscribe` sends the replay fields of the
  subscription's :class:`~hubbub.client.positions.SubscriptionPositions`; events, gaps and ``recovered``
  frames for it update them, and only events new to it come back (:class:`Delivered`, :class:`GapNotice`,
  :class:`Recovered`);
* **consumer frames** (``deliver``, ``consumer_closed``) as :class:`ConsumerFrame`, and pings, answered
  with pongs queued in :meth:`ClientProtocol.take_outgoing`.

A connection that keeps its own positions (the federation link: a cursor per link, not per subscription)
gives an ``event_decoder``: then each ``event`` frame comes back once, as :class:`Received` with what the
decoder made of it (a malformed one is :class:`BadInput`: the decoder raises BadFrame), and every
subscription's gaps and ``recovered`` frames come back whether or not it was subscribed through
:meth:`ClientProtocol.subscribe`.

States (transitions as data in :data:`TRANSITIONS`): ``hello`` until the hello's reply, then ``open``;
``closed`` after a refused hello or :meth:`ClientProtocol.abandon`. In ``hello`` only the hello's answer
counts (anything else is ignored); in ``closed`` nothing counts.

Errors: :meth:`ClientProtocol.receive_data` raises :class:`~hubbub.errors.FrameTooLarge` when the framing
is over its bound (the stream cannot be resynchronised) and :class:`~hubbub.errors.BadFrame` for a message
that is not the codec's at all; a frame that decodes but is malformed is skipped and reported as
:class:`BadInput`. Nothing else is raised.

Concurrency contract: one owner at a time (an event loop, or one thread); no locking, no I/O.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar

import msgpack

from hubbub.client._wire import Gap, _dumps, _loads, error_from_frame
from hubbub.client.framing import Framing
from hubbub.client.positions import SubscriptionPositions
from hubbub.client.sub_frames import Delivered, GapNotice, Received, Recovered, SubscriptionFrames
from hubbub.errors import BadFrame, FrameTooLarge, HubbubError
from hubbub.events import fast_init

__all__ = [
    "PACKED_ID_SIZE",
    "TRANSITIONS",
    "BadInput",
    "ClientEvent",
    "ClientProtocol",
    "Codec",
    "ConsumerFrame",
    "Delivered",
    "Gap",
    "GapNotice",
    "HelloRefused",
    "Received",
    "Recovered",
    "Refused",
    "Replies",
    "ServerError",
    "Welcome",
    "publish_frame",
]

T = TypeVar("T")
Codec: TypeAlias = Literal["json", "msgpack"]
State: TypeAlias = Literal["hello", "open", "closed"]

#: The legal transitions: (state, what happened) → the next state.
TRANSITIONS: Final[dict[tuple[State, str], State]] = {
    ("hello", "welcome"): "open",
    ("hello", "refused"): "closed",
    ("hello", "abandon"): "closed",
    ("open", "abandon"): "closed",
    ("closed", "abandon"): "closed",
}

_MAX_ID: Final = (1 << 31) - 1
#: The server's frame bound until its hello reply says otherwise (native.md §3.2's default).
DEFAULT_MAX_FRAME: Final = 1 << 20
# A msgpack frame packed without its id (a map of fewer than 15 fields: one fixmap byte) gets it appended
# as the map's last field: ``"id"`` then a msgpack uint 32 (every frame's id takes the same 5 bytes).
_ID_KEY: Final = b"\xa2id\xce"
_ID: Final = struct.Struct(">I")
#: The bytes :meth:`ClientProtocol.request_packed` adds to a packed body (its id field).
PACKED_ID_SIZE: Final = len(_ID_KEY) + _ID.size
_LEN: Final = struct.Struct(">I")
# What a malformed frame that decoded may raise while it is read (a field of the wrong type).
_MALFORMED: Final = (ValueError, TypeError, KeyError, AttributeError, binascii.Error, BadFrame)


# -- events ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Welcome:
    """The hello was accepted: the server's session id, its ping interval (s) and its frame bound."""

    session: str
    ping_interval: float
    max_frame: int
    frame: dict[str, Any]


@dataclass(frozen=True, slots=True)
class HelloRefused:
    """The server refused the hello (``error``), or answered it with a malformed reply (``malformed``)."""

    error: HubbubError
    malformed: bool = False


@dataclass(frozen=True, slots=True)
class Replies(Generic[T]):
    """Replies (or ``pong``) to requests, in order: ``(token, reply frame)`` for each. Consecutive replies
    of a message come as one event (a bulk publisher reads thousands per message: one object, not one
    each)."""

    answers: list[tuple[T, dict[str, Any]]]


@fast_init
@dataclass(frozen=True, slots=True)
class Refused(Generic[T]):
    """The error answering the request that carried ``token`` (``frame``: the error frame, ``row`` included
    for a ``publish_batch``)."""

    token: T
    error: HubbubError
    frame: dict[str, Any]


@fast_init
@dataclass(frozen=True, slots=True)
class ServerError:
    """An error no request in flight is waiting for (``request_id``: the id it named, if any). A fatal one
    is the last thing the server says before it closes."""

    error: HubbubError
    request_id: object


@fast_init
@dataclass(frozen=True, slots=True)
class ConsumerFrame:
    """A ``deliver`` or ``consumer_closed`` frame for durable consumer ``consumer``."""

    consumer: str
    frame: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BadInput:
    """A frame that decoded but is not a well-formed native frame: skipped."""

    error: BadFrame


ClientEvent: TypeAlias = (
    Welcome
    | Received
    | HelloRefused
    | Replies[Any]
    | Refused[Any]
    | ServerError
    | Delivered
    | GapNotice
    | Recovered
    | ConsumerFrame
    | BadInput
)


def publish_frame(
    channel: str,
    data: Any,
    *,
    content_type: str | None = None,
    headers: Mapping[str, str] | None = None,
    tags: Iterable[str] | None = None,
    idem: str | None = None,
    ack: bool = True,
) -> dict[str, Any]:
    """A JSON ``publish`` frame (without ``id``): bytes go as ``b64``, ``str`` as ``text``, anything else as
    ``json``."""
    frame: dict[str, Any] = {"op": "publish", "channel": channel}
    if isinstance(data, bytes | bytearray | memoryview):
        frame["b64"] = base64.b64encode(bytes(data)).decode()
    elif isinstance(data, str):
        frame["text"] = data
    else:
        frame["json"] = data
    if content_type is not None:
        frame["content_type"] = content_type
    if headers:
        frame["headers"] = dict(headers)
    if tags is not None:
        tag_list = list(tags)
        if tag_list:
            frame["tags"] = tag_list
    if idem is not None:
        frame["idem"] = idem
    frame["ack"] = ack
    return frame


def _unpack(message: bytes | str) -> Any:
    return msgpack.unpackb(message, raw=False, strict_map_key=False)


class ClientProtocol(Generic[T]):
    """One native connection's client side (see the module docstring). ``T``: the caller's request tokens."""

    def __init__(
        self,
        codec: Codec = "json",
        framing: Framing | None = None,
        *,
        client: str = "hubbub-py",
        token: str | None = None,
        echo: bool = True,
        batch: bool = True,
        event_decoder: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.codec: Codec = codec
        self.framing = framing
        self.state: State = "hello"
        self._hello_frame: dict[str, Any] = {"op": "hello", "v": 1, "client": client}
        if token:
            self._hello_frame["token"] = token
        self._hello_frame["echo"] = echo
        self._hello_frame["batch"] = batch
        self._hello_id = -1
        #: The server's session, ping interval and frame bound (from :class:`Welcome`).
        self.session = ""
        self.ping_interval = 25.0
        self.max_frame = DEFAULT_MAX_FRAME
        #: Requests in flight: id → the caller's token, in the order sent.
        self.pending: dict[int, T] = {}
        #: The subscriptions sent on this connection, their positions and their frames.
        self.streams = SubscriptionFrames(event_decoder)
        self._subscribing = self.streams.subscribing  # subscribe request id → subscription id
        self._next_id = 0
        #: The id the last request (or subscribe) was given.
        self.last_id = 0
        #: Messages received (statistics).
        self.received = 0
        self._outgoing: list[bytes] = []
        packer = msgpack.Packer(use_bin_type=True)
        self._dumps: Callable[[Any], bytes] = _dumps if codec == "json" else packer.pack
        self._loads: Callable[[bytes | str], Any] = _loads if codec == "json" else _unpack

    def _move(self, what: str) -> None:
        self.state = TRANSITIONS[(self.state, what)]

    # -- frames out ---------------------------------------------------------------------------------------

    def next_id(self) -> int:
        """A request id not in flight (ids wrap at 2³¹ - 1)."""
        pending = self.pending
        while True:
            i = self._next_id = self._next_id + 1 if self._next_id < _MAX_ID else 1
            if i not in pending:
                return i

    def hello(self) -> bytes:
        """The ``hello`` frame: the first thing sent on the connection."""
        frame = dict(self._hello_frame)
        frame["id"] = self._hello_id = self.next_id()
        return self._wrap(self._dumps(frame))

    def _wrap(self, body: bytes) -> bytes:
        return body if self.framing is None else self.framing.wrap(body)

    def encode(self, frame: Mapping[str, Any]) -> bytes:
        """``frame``'s bytes; raises :class:`FrameTooLarge` over the server's bound (nothing is sent)."""
        body = self._dumps(frame)
        if len(body) > self.max_frame:
            raise FrameTooLarge(f"frame of {len(body)} bytes over the server's max_frame {self.max_frame}")
        return self._wrap(body)

    def request(self, frame: dict[str, Any], token: T) -> bytes:
        """``frame`` with a fresh ``id`` (set in ``frame``), registered with ``token``: its reply or error
        comes back as :class:`Replies` or :class:`Refused`. Raises :class:`FrameTooLarge` unregistered."""
        rid = frame["id"] = self.next_id()
        data = self.encode(frame)
        self.pending[rid] = token
        self.last_id = rid
        return data

    def request_packed(self, body: bytes, token: T, out: bytearray) -> int:
        """Append a msgpack frame packed without ``id`` (a fixmap, see ``_ID_KEY``), with a fresh id, to
        ``out``, framed; registered with ``token``; returns the id. A resend packs nothing again."""
        size = len(body) + PACKED_ID_SIZE
        if size > self.max_frame:
            raise FrameTooLarge(f"frame of {size} bytes over the server's max_frame {self.max_frame}")
        i = self.last_id = self.next_id()
        self.pending[i] = token
        framing = self.framing
        if framing is not None and framing.kind == "ws":
            out += framing.wrap(b"".join((bytes((body[0] + 1,)), body[1:], _ID_KEY, _ID.pack(i))))
        else:  # appends: no concatenated copy of the frame
            if framing is not None:
                out += _LEN.pack(size)
            out.append(body[0] + 1)  # one more field in the fixmap
            out += memoryview(body)[1:]
            out += _ID_KEY
            out += _ID.pack(i)
        return i

    def request_message(self, body: bytes, token: T) -> bytes:
        """One message (no framing, no frame bound: the server's own answer says when a frame is over
        it) of a msgpack frame packed without ``id``, with a fresh id registered with ``token``."""
        i = self.last_id = self.next_id()
        self.pending[i] = token
        return b"".join((bytes((body[0] + 1,)), body[1:], _ID_KEY, _ID.pack(i)))

    def subscribe(
        self, sub: str, pattern: str, tags: Iterable[str], positions: SubscriptionPositions, token: T
    ) -> bytes:
        """Subscribe ``sub`` to ``pattern`` with the replay fields of its ``positions`` (a resume after a
        reconnect asks for what it has not seen); from now on its frames on this connection update them."""
        frame, fields = self.streams.subscribe_frame(sub, pattern, tags, positions)
        data = self.request(frame, token)
        self.streams.sent(frame["id"], sub, positions, fields)
        return data

    def forget(self, sub: str) -> None:
        """Frames for ``sub`` no longer count (it ended here; the server may still send a few)."""
        self.streams.forget(sub)

    def discard(self, rid: int, token: T) -> None:
        """Stop waiting for request ``rid`` if it still carries ``token`` (its caller gave up)."""
        if self.pending.get(rid) is token:
            del self.pending[rid]
            self._subscribing.pop(rid, None)

    def abandon(self) -> list[T]:
        """The connection is gone: every token still in flight, in the order sent; nothing counts after."""
        self._move("abandon")
        tokens = list(self.pending.values())
        self.pending.clear()
        self._subscribing.clear()
        return tokens

    def take_outgoing(self) -> Sequence[bytes]:
        """What the protocol must send on its own (pongs; WebSocket control frames), as separate messages."""
        framing = self.framing
        if not self._outgoing and (framing is None or not framing.control):
            return ()
        out, self._outgoing = self._outgoing, []
        if framing is not None and framing.control:
            out.append(bytes(framing.control))
            framing.control.clear()
        return out

    # -- frames in ----------------------------------------------------------------------------------------

    def receive_data(self, data: bytes | str) -> list[ClientEvent]:
        """Bytes read from the connection (with a framing), or one whole message (without): the events in
        the order their frames came. Raises FrameTooLarge or BadFrame (see the module docstring)."""
        if self.framing is None:
            return self.receive(data)
        out: list[ClientEvent] = []
        for body in self.framing.feed(data if isinstance(data, bytes) else data.encode()):
            out += self.receive(body)
        return out

    @property
    def events(self) -> int:
        """``event`` frames received (statistics)."""
        return self.streams.events

    @property
    def peer_closed(self) -> bool:
        """The framing saw the peer's close (WebSocket over a plain socket)."""
        return self.framing is not None and self.framing.closed

    def receive(self, message: bytes | str) -> list[ClientEvent]:
        """One whole message: its events. Raises BadFrame when it is not the codec's."""
        state = self.state
        if state == "closed":
            return []
        self.received += 1
        try:
            obj = self._loads(message)
        except Exception:
            raise BadFrame(f"a message that is not {self.codec}") from None
        out: list[ClientEvent] = []
        if type(obj) is not dict:
            return out
        if obj.get("op") == "batch":
            frames = obj.get("frames")
            if type(frames) is not list:
                return out
        else:
            frames = (obj,)
        greeting = state == "hello"
        dispatch = self._greeting if greeting else self._dispatch
        # Replies take the hot path (a publisher's acknowledgements, thousands a message) unless a subscribe
        # is answered (its positions first) or the hello is: nothing in this loop sets either.
        fast = not greeting and not self._subscribing
        pending, missing = self.pending, _NONE
        run: Replies[T] | None = None
        for f in frames:
            if type(f) is not dict:
                continue
            if fast and f.get("op") == "reply":
                rid = f.get("id")
                token = pending.pop(rid, missing) if type(rid) is int else missing
                if token is not missing:
                    if run is None or out[-1] is not run:
                        run = Replies([])
                        out.append(run)
                    run.answers.append((token, f))
                continue
            try:
                dispatch(f, out)
            except _MALFORMED as exc:
                why = exc if isinstance(exc, BadFrame) else BadFrame(f"malformed {f.get('op')!r} frame")
                out.append(BadInput(why))
            if greeting and self.state != "hello":  # the rest of the message is after the hello's answer
                greeting = False
                dispatch = self._dispatch if self.state == "open" else _ignore
        return out

    def _greeting(self, frame: dict[str, Any], out: list[ClientEvent]) -> None:
        op = frame.get("op")
        if op == "error":
            self._move("refused")
            out.append(HelloRefused(error_from_frame(frame)))
        elif op == "reply" and frame.get("id") == self._hello_id:
            try:
                limits = frame.get("limits") or {}
                welcome = Welcome(
                    str(frame.get("session", "")),
                    float(frame.get("ping_interval", 25)),
                    int(limits.get("max_frame", DEFAULT_MAX_FRAME)),
                    frame,
                )
            except _MALFORMED:
                self._move("refused")
                out.append(HelloRefused(BadFrame("bad hello reply"), malformed=True))
                return
            self._move("welcome")
            self.session, self.ping_interval, self.max_frame = (
                welcome.session,
                welcome.ping_interval,
                welcome.max_frame,
            )
            out.append(welcome)

    def _dispatch(self, frame: dict[str, Any], out: list[ClientEvent]) -> None:
        op = frame.get("op")
        if op == "reply" or op == "pong":  # noqa: PLR1714 - two compares beat building a tuple here
            rid = frame.get("id")
            token = self.pending.pop(rid, _NONE) if type(rid) is int else _NONE
            if token is _NONE:
                return
            if self._subscribing:
                self.streams.answered(rid, frame)  # type: ignore[arg-type]  # rid is an int here
            if out and type(out[-1]) is Replies:
                out[-1].answers.append((token, frame))
            else:
                out.append(Replies([(token, frame)]))
        elif op == "event":
            self.streams.event(frame, out)
        elif op == "gap":
            self.streams.gap(frame, out)
        elif op == "recovered":
            self.streams.recovered(frame, out)
        elif op in ("deliver", "consumer_closed"):
            name = frame.get("consumer")
            if type(name) is str:
                out.append(ConsumerFrame(name, frame))
        elif op == "ping":
            pong: dict[str, Any] = {"op": "pong"}
            if "id" in frame:
                pong["id"] = frame["id"]
            self._outgoing.append(self._wrap(self._dumps(pong)))
        elif op == "error":
            err = error_from_frame(frame)
            rid = frame.get("id")
            token = self.pending.pop(rid, _NONE) if type(rid) is int else _NONE
            if token is _NONE:
                out.append(ServerError(err, rid))
                return
            self._subscribing.pop(rid, None)  # type: ignore[arg-type]  # rid is an int here
            out.append(Refused(token, err, frame))
        # Unknown ops are ignored (native.md §10).


class _Missing:
    __slots__ = ()


_NONE: Any = _Missing()


def _ignore(frame: dict[str, Any], out: list[ClientEvent]) -> None:
    """Frames after a refused hello in the same message."""
