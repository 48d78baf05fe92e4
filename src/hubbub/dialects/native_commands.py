"""The native protocol's commands (native.md §2-§3) and the field readers that validate them.

Commands are frozen, slotted values: the codec (:mod:`.native`) builds them from a decoded frame and the
connection layer consumes them. The readers raise :class:`~hubbub.errors.BadRequest` (4001); the codec
attaches the frame's request id.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from hubbub.channels import Pattern
from hubbub.errors import BadRequest
from hubbub.events import Position, fast_init

from .native_common import DEFAULT_CONTENT_TYPE, dump_json_value

__all__ = [
    "CONSUMER_OPS",
    "MAX_ID",
    "MAX_SUB_CHARS",
    "MAX_U64",
    "TEXT_CONTENT_TYPE",
    "Ack",
    "Auth",
    "Command",
    "Consume",
    "ConsumerCreate",
    "ConsumerDelete",
    "Hello",
    "Nack",
    "Obj",
    "Ping",
    "Pong",
    "Publish",
    "PublishBatch",
    "Subscribe",
    "Unconsume",
    "Unsubscribe",
    "echo_id",
    "is_int",
    "json_payload",
    "opt_bool",
    "opt_list",
    "position",
    "request_id",
    "string",
    "sub_id",
    "time_ns",
    "uint",
]

MAX_ID: Final = 1 << 31
MAX_SUB_CHARS: Final = 64
MAX_U64: Final = (1 << 64) - 1
#: The least integer an error frame can echo as its ``id``: both encodings carry -2^63 .. 2^64-1 and no more.
MIN_I64: Final = -(1 << 63)


# -- commands ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """``hello``. ``v`` is whatever the client sent; the connection answers 4006 unless it is 1 (and then
    the other fields keep their defaults, since another version may define them differently)."""

    id: int
    v: int
    token: str | None = None
    client: str = ""
    echo: bool = True
    batch: bool = False


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``subscribe``. At most one of ``since``/``last``/``from_time``, except ``from_time`` with a ``since``
    map. ``since`` is a :class:`Position` for an exact channel and a map of canonical channel → position
    (every key matching ``pattern``) for a pattern."""

    id: int
    sub: str
    pattern: Pattern
    tags: frozenset[str] = frozenset()
    since: Position | dict[str, Position] | None = None
    last: int | None = None
    from_time: int | None = None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    id: int
    sub: str


@fast_init
@dataclass(frozen=True, slots=True)
class Publish:
    """``publish``. ``channel`` is canonical, ``tags`` sorted and de-duplicated, ``headers`` user headers
    only, ``payload`` the bytes to store, ``content_type`` the given type or the payload field's default."""

    id: int
    channel: str
    payload: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    idem: str = ""
    ack: bool = False


@dataclass(frozen=True, slots=True)
class PublishBatch:
    """``publish_batch`` (a hubbub v1 addition, docs/native.md): many publishes in one frame, as columns of
    equal length (row ``i`` is ``Publish(id, channels[i], payloads[i], content_types[i], headers[i],
    tags[i], idems[i], ack)``), validated like ``publish``'s fields. The rows are appended in one commit,
    in order, or the whole frame is refused; one reply answers them all."""

    id: int
    channels: list[str]
    payloads: list[bytes]
    content_types: list[str]
    headers: list[dict[str, str]]
    tags: list[tuple[str, ...]]
    idems: list[str]
    ack: bool = False

    def __len__(self) -> int:
        return len(self.payloads)


@dataclass(frozen=True, slots=True)
class Ping:
    """A client ``ping``; answered with ``pong`` echoing ``id`` when given."""

    id: int | None = None


@dataclass(frozen=True, slots=True)
class Pong:
    """A client ``pong`` (the answer to a server ping)."""


@dataclass(frozen=True, slots=True)
class Auth:
    """``auth``: token refresh."""

    id: int
    token: str


# -- durable consumers (docs/native.md "Durable consumers"; parsed by :mod:`.native_consumers`) ----------


@dataclass(frozen=True, slots=True)
class ConsumerCreate:
    """``consumer_create``: define a durable consumer (kept if it exists). ``pattern`` is canonical."""

    id: int
    consumer: str
    pattern: Pattern
    tags: tuple[str, ...] = ()
    shared: bool = False
    batch_wait_ms: int | None = None
    batch_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Consume:
    """``consume``: open a durable consumer on this connection (creating it from ``pattern`` when ``create``
    and it does not exist). ``shared`` ``None``: the consumer's own. ``max``: the most items per batch
    (0: only ``batch_bytes``)."""

    id: int
    consumer: str
    pattern: Pattern | None = None
    tags: tuple[str, ...] = ()
    create: bool = True
    reuse: bool = True
    shared: bool | None = None
    max: int = 0
    batch_wait_ms: int | None = None
    batch_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Unconsume:
    """``unconsume``: stop holding the consumer; an outstanding batch is redelivered."""

    id: int
    consumer: str


@dataclass(frozen=True, slots=True)
class ConsumerDelete:
    """``consumer_delete``: remove the consumer and its journal."""

    id: int
    consumer: str


@dataclass(frozen=True, slots=True)
class Ack:
    """``ack``: the whole batch is done; its items leave the journal durably before the reply."""

    id: int
    consumer: str
    batch: int


@dataclass(frozen=True, slots=True)
class Nack:
    """``nack``: give the batch back; its items are redelivered after the backoff."""

    id: int
    consumer: str
    batch: int


#: The consumer commands' ops.
CONSUMER_OPS: Final = ("consumer_create", "consumer_delete", "consume", "unconsume", "ack", "nack")

Command: TypeAlias = (
    Hello
    | Subscribe
    | Unsubscribe
    | Publish
    | PublishBatch
    | Ping
    | Pong
    | Auth
    | ConsumerCreate
    | Consume
    | Unconsume
    | ConsumerDelete
    | Ack
    | Nack
)


# -- field readers (raise BadRequest; the caller attaches the request id) --------------------------------

Obj = dict[Any, Any]


def is_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass and is refused everywhere


def echo_id(v: object) -> int | None:
    """The ``id`` an error frame echoes for a frame whose ``id`` field is ``v``: any integer that JSON and
    msgpack frames can both carry (-2^63 .. 2^64-1), valid (0 .. 2^31-1) or not, so that a client can
    correlate the error; ``None`` for anything else (a float, a string, or a JSON integer past 64 bits, which
    neither encoder can write back). A frame whose id is refused this way gets its 4001 without an id."""
    if type(v) is int and MIN_I64 <= v <= MAX_U64:
        return v
    return None


def request_id(obj: Obj) -> int:
    v = obj.get("id")
    if v is None:
        raise BadRequest("id is required")
    if not is_int(v):
        raise BadRequest("id must be an integer")
    if not 0 <= v < MAX_ID:
        raise BadRequest("id must be in 0 .. 2^31-1")
    return int(v)


def string(obj: Obj, key: str) -> str:
    v = obj.get(key)
    if type(v) is not str:
        raise BadRequest(f"{key} must be a string")
    return v


def opt_bool(obj: Obj, key: str, default: bool) -> bool:
    v = obj.get(key)
    if v is None:
        return default
    if type(v) is not bool:
        raise BadRequest(f"{key} must be true or false")
    return v


def sub_id(obj: Obj) -> str:
    v = obj.get("sub")
    if type(v) is not str or not 1 <= len(v) <= MAX_SUB_CHARS:
        raise BadRequest(f"sub must be a string of 1-{MAX_SUB_CHARS} characters")
    return v


def opt_list(obj: Obj, key: str) -> list[Any] | None:
    v = obj.get(key)
    if v is None:
        return None
    if type(v) is not list:
        raise BadRequest(f"{key} must be a list")
    return v


def uint(v: object, what: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_U64:
        raise BadRequest(f"{what} must be a non-negative integer")
    return v


def position(v: object, what: str) -> Position:
    if type(v) is not dict:
        raise BadRequest(f"{what} must be {{seq, epoch}}")
    epoch = v.get("epoch")
    if type(epoch) is not str:
        raise BadRequest(f"{what} needs an epoch string")
    return Position(uint(v.get("seq"), f"{what}.seq"), epoch)


def time_ns(v: object) -> int:
    """``from_time``: nanoseconds, an integer or (JSON, where they exceed 2^53) a decimal string."""
    if type(v) is str and 0 < len(v) <= 20 and v.isascii() and v.isdigit():
        v = int(v)
    return uint(v, "from_time")


#: The content type of a JSON publish's ``text`` payload (native.md §3.4).
TEXT_CONTENT_TYPE: Final = "text/plain; charset=utf-8"


def json_payload(obj: Obj) -> tuple[bytes, str]:
    """Exactly one of ``json``, ``text``, ``b64`` (JSON transport, native.md §3.4)."""
    present = [k for k in ("json", "text", "b64") if k in obj]
    if len(present) != 1:
        raise BadRequest("give exactly one of json, text and b64")
    kind = present[0]
    value = obj[kind]
    if kind == "json":
        return dump_json_value(value), "application/json"
    if type(value) is not str:
        raise BadRequest(f"{kind} must be a string")
    if kind == "text":
        return value.encode("utf-8"), TEXT_CONTENT_TYPE
    try:
        return base64.b64decode(value.encode("ascii"), validate=True), DEFAULT_CONTENT_TYPE
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise BadRequest("b64 is not valid base64") from None
