"""The native protocol's durable-consumer ops (docs/native.md "Durable consumers"), sans-I/O.

Parsing: :func:`parse_consumer_op` turns a decoded frame whose ``op`` is one of
:data:`~.native_commands.CONSUMER_OPS` into its command (the codec registers it), raising ``BadRequest``
(4001) or ``BadChannel`` (4004) for bad fields. Rendering: :func:`deliver_frame` (from :mod:`.native_deliver`)
is the ``deliver`` push, a batch of journal items, each an event object (as in an ``event`` frame, without
``subs``) with its journal position ``pos`` and ``attempts`` first; the events' fields come from the shared
event renderers, so a ``deliver`` item reads exactly like an ``event``.

:class:`ConsumerTable` is one connection's state: the consumers it holds, by name, each with the handle the
transport keeps for it (the core's opener), at most ``max_consumers`` of them. Legal transitions::

    state of a name   input                        next      answer
    ---------------   -----                        ----      ------
    not held          consume (the core opens it)  held      reply, then deliver pushes
    not held          consume, table full          not held  error 4007
    held              consume                      held      error 4206 consumer_busy
    held              ack / nack (batch it holds)  held      reply (ack: once stored)
    not held          ack / nack / unconsume       not held  error 4207 unknown_batch / reply
    held              unconsume                    not held  reply; its batch is redelivered
    held              the core closes it           not held  push consumer_closed (reason)

Invariants: a name is held at most once per connection; every read is bounded by the codec's limits (name
1-128 characters, tags by ``limits``, integers in range).

Concurrency contract: one table per connection, called from one thread (the event loop). The functions are
pure.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Generic, TypeVar

from hubbub.channels import Pattern, parse_pattern
from hubbub.errors import BadRequest, ConsumerBusy, LimitExceeded

from .native_commands import (
    MAX_U64,
    Ack,
    Command,
    Consume,
    ConsumerCreate,
    ConsumerDelete,
    Nack,
    Obj,
    Unconsume,
    is_int,
    opt_bool,
    opt_list,
    request_id,
    string,
)
from .native_common import Limits, check_tags
from .native_deliver import deliver_frame

__all__ = ["MAX_BATCH_ITEMS", "ConsumerTable", "deliver_frame", "parse_consumer_op"]

#: The most items a client may ask per batch (``max``).
MAX_BATCH_ITEMS: Final = 1_000_000
_NAME_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
#: The largest ``batch_wait_ms`` (one minute) and ``batch_bytes`` (1 GiB) a definition may ask.
MAX_BATCH_WAIT_MS: Final = 60_000
MAX_BATCH_BYTES: Final = 1 << 30


def _name(obj: Obj) -> str:
    v = obj.get("consumer")
    if type(v) is not str or not 1 <= len(v) <= 128 or not _NAME_CHARS.issuperset(v):
        raise BadRequest("consumer must be 1-128 characters of A-Z a-z 0-9 . _ -")
    return v


def _opt_int(obj: Obj, key: str, lo: int, hi: int) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if not is_int(v) or not lo <= v <= hi:
        raise BadRequest(f"{key} must be an integer in {lo} .. {hi}")
    return int(v)


def _batch(obj: Obj) -> int:
    v = obj.get("batch")
    if type(v) is not int or not 1 <= v <= MAX_U64:
        raise BadRequest("batch must be a batch number")
    return v


def _definition(obj: Obj, limits: Limits) -> tuple[tuple[str, ...], int | None, int | None]:
    raw_tags = opt_list(obj, "tags")
    tags = check_tags(raw_tags, limits) if raw_tags else ()
    wait = _opt_int(obj, "batch_wait_ms", 0, MAX_BATCH_WAIT_MS)
    size = _opt_int(obj, "batch_bytes", 1, MAX_BATCH_BYTES)
    return tags, wait, size


def _pattern(obj: Obj, limits: Limits) -> Pattern:
    return parse_pattern(string(obj, "pattern"), limits.max_channel_bytes)


def parse_consumer_op(op: str, obj: Obj, limits: Limits) -> Command:
    """The command of a consumer op (``op`` is one of ``CONSUMER_OPS``). Raises 4001/4004/4007."""
    rid = request_id(obj)
    name = _name(obj)
    if op == "ack":
        return Ack(rid, name, _batch(obj))
    if op == "nack":
        return Nack(rid, name, _batch(obj))
    if op == "unconsume":
        return Unconsume(rid, name)
    if op == "consumer_delete":
        return ConsumerDelete(rid, name)
    if op == "consumer_create":
        tags, wait, size = _definition(obj, limits)
        shared = opt_bool(obj, "shared", False)
        return ConsumerCreate(rid, name, _pattern(obj, limits), tags, shared, wait, size)
    if op == "consume":
        tags, wait, size = _definition(obj, limits)
        create = opt_bool(obj, "create", True)
        pattern = _pattern(obj, limits) if obj.get("pattern") is not None else None
        if create and pattern is None:
            raise BadRequest("pattern is required unless create is false")
        raw_shared = obj.get("shared")
        if raw_shared is not None and type(raw_shared) is not bool:
            raise BadRequest("shared must be true or false")
        share: bool | None = raw_shared
        most = _opt_int(obj, "max", 0, MAX_BATCH_ITEMS) or 0
        reuse = opt_bool(obj, "reuse", True)
        return Consume(rid, name, pattern, tags, create, reuse, share, most, wait, size)
    raise BadRequest("not a consumer op")  # pragma: no cover - the codec routes only CONSUMER_OPS here


H = TypeVar("H")


class ConsumerTable(Generic[H]):
    """The consumers one connection holds (the table of the module docstring). ``H`` is the transport's
    handle of a held consumer."""

    __slots__ = ("_held", "max_consumers")

    def __init__(self, max_consumers: int) -> None:
        self.max_consumers = max_consumers
        self._held: dict[str, H] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._held))

    def check_open(self, name: str) -> None:
        """Whether ``consume`` of ``name`` may go to the core: 4206 when held, 4007 when full."""
        if name in self._held:
            raise ConsumerBusy(f"{name}: already consumed on this connection")
        if len(self._held) >= self.max_consumers:
            raise LimitExceeded("too many consumers on this connection")

    def opened(self, name: str, handle: H) -> None:
        self._held[name] = handle

    def get(self, name: str) -> H | None:
        return self._held.get(name)

    def drop(self, name: str, handle: H | None = None) -> H | None:
        """Forget ``name`` (only when it is still ``handle``, if given); its handle, if it was held."""
        h = self._held.get(name)
        if h is None or (handle is not None and h is not handle):
            return None
        del self._held[name]
        return h

    def drain(self) -> list[H]:
        """Every handle, the table emptied (the connection ends)."""
        held = list(self._held.values())
        self._held.clear()
        return held
