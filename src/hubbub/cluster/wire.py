"""The messages nodes exchange through Redis: committed events, and the tops of channels a node committed to
while it could not publish. Pure: bytes in, values out.

Every message is one msgpack array ``[1, sender, kind, items]``, the sender being ``<node id>/<instance>``
(the instance a random token of the process, so that a node recognises its own messages and notices another
node configured with its id):

* ``kind = "e"``: committed events of one node, in its commit order. Each item is ``[channel, seq, epoch,
  time_ns, dialect, user, app, msg_id, payload, content_type, headers, tags]``.
* ``kind = "t"``: positions committed without being published (the node lost Redis meanwhile). Each item is
  ``[channel, epoch, top]``: receivers fill what they have not seen from the log.
* ``kind = "n"``: notices (``core/notices.py``). Each item is ``[topic, data]``, a string and bytes.

A message that does not decode to one of these raises :class:`BadMessage` (a Redis channel may be shared
with other software; nothing it sends may stop a node).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from hubbub.events import Event, Publisher

__all__ = [
    "MAX_MESSAGE_BYTES",
    "VERSION",
    "BadMessage",
    "Message",
    "decode",
    "encode_events",
    "encode_notices",
    "encode_tops",
]

VERSION: Final = 1
#: A batch of events is cut into messages of about this many bytes (Redis takes far more; smaller messages
#: keep one large batch from delaying every other node's events behind it).
MAX_MESSAGE_BYTES: Final = 256 * 1024


class BadMessage(ValueError):
    """A Redis message that is not a hubbub cluster message of this version."""


@dataclass(frozen=True, slots=True)
class Message:
    node: str
    events: list[Event]
    tops: list[tuple[str, str, int]]
    notices: list[tuple[str, bytes]] = field(default_factory=list)


def _item(e: Event) -> list[Any]:
    p = e.publisher
    return [
        e.channel, e.seq, e.epoch, e.time_ns, p.dialect, p.user, p.app, p.msg_id,
        e.payload, e.content_type, dict(e.headers), list(e.tags),
    ]  # fmt: skip


def encode_events(node: str, events: Sequence[Event]) -> Iterator[bytes]:
    """``events`` (one node's, in commit order) as messages of about :data:`MAX_MESSAGE_BYTES` at most, in
    order (an event larger than that goes alone)."""
    batch: list[list[Any]] = []
    size = 0
    for e in events:
        n = len(e.payload) + len(e.channel) + 64
        if batch and size + n > MAX_MESSAGE_BYTES:
            yield msgpack.packb([VERSION, node, "e", batch], use_bin_type=True)
            batch, size = [], 0
        batch.append(_item(e))
        size += n
    if batch:
        yield msgpack.packb([VERSION, node, "e", batch], use_bin_type=True)


def encode_tops(node: str, tops: Sequence[tuple[str, str, int]]) -> bytes:
    data: bytes = msgpack.packb([VERSION, node, "t", [list(t) for t in tops]], use_bin_type=True)
    return data


def encode_notices(node: str, notices: Sequence[tuple[str, bytes]]) -> bytes:
    data: bytes = msgpack.packb([VERSION, node, "n", [list(n) for n in notices]], use_bin_type=True)
    return data


def _str(v: Any) -> str:
    if type(v) is not str:
        raise BadMessage("expected a string")
    return v


def _int(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise BadMessage("expected a non-negative integer")
    return v


def decode(data: bytes) -> Message:
    """One message; raises :class:`BadMessage` for anything else."""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for bad input
        raise BadMessage(f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(obj, list) or len(obj) != 4 or obj[0] != VERSION:
        raise BadMessage("not a version-1 cluster message")
    node, kind, items = _str(obj[1]), obj[2], obj[3]
    if not isinstance(items, list):
        raise BadMessage("items must be a list")
    if kind == "t":
        tops = []
        for it in items:
            if not isinstance(it, list) or len(it) != 3:
                raise BadMessage("a top is [channel, epoch, seq]")
            tops.append((_str(it[0]), _str(it[1]), _int(it[2])))
        return Message(node, [], tops)
    if kind == "n":
        notices = []
        for it in items:
            if not isinstance(it, list) or len(it) != 2 or type(it[1]) is not bytes:
                raise BadMessage("a notice is [topic, data]")
            notices.append((_str(it[0]), it[1]))
        return Message(node, [], [], notices)
    if kind != "e":
        raise BadMessage(f"unknown kind {kind!r}")
    events = []
    for it in items:
        if not isinstance(it, list) or len(it) != 12:
            raise BadMessage("an event has 12 fields")
        ch, seq, epoch, t, dialect, user, app, msg_id, payload, ctype, headers, tags = it
        if type(payload) is not bytes or not isinstance(headers, dict) or not isinstance(tags, list):
            raise BadMessage("bad payload, headers or tags")
        hdrs = {_str(k): _str(v) for k, v in headers.items()}
        if _int(seq) < 1 or not _str(ch).startswith("/"):
            raise BadMessage("bad channel or seq")
        pub = Publisher(_str(dialect), _str(user), _str(app), _str(msg_id))
        tag_list = tuple(_str(x) for x in tags)
        events.append(Event(ch, seq, _str(epoch), _int(t), pub, payload, _str(ctype), hdrs, tag_list))
    return Message(node, events, [])
