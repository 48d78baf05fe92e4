"""The native ``publish_batch`` op (a hubbub v1 addition, docs/native.md "Batched publishes"), sans-I/O.

A bulk loader (the data pipeline's sink, ``backfill``) publishes many events with idempotency keys. As
``publish`` frames each row costs a frame, a map, a decode of that map, checks of its fields and a reply;
``publish_batch`` carries the rows as columns of one frame and is answered with one reply whose fields are
columns too. :func:`parse_publish_batch` validates a decoded frame into a
:class:`~.native_commands.PublishBatch`; :func:`encode_batch_reply` renders the reply.

Invariants:

* The parser either returns a fully validated command or raises a :class:`~hubbub.errors.HubbubError`
  (4001 bad request, 4004 bad channel, 4007 limit exceeded) for the whole frame, whose ``row`` is the bad
  row's index when one row is at fault: a batch is accepted or refused as a whole, never in part.
* Every column is bounded: at most :func:`max_rows` rows (:data:`MAX_BATCH_ROWS`, fewer where the reply
  would not fit in ``max_frame``), each row's fields by the same ``limits.*`` as a ``publish``'s.

Concurrency contract: pure functions; the channel cache passed in belongs to the (loop-thread) codec.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from hubbub.channels import canonical
from hubbub.errors import BadRequest, HubbubError, LimitExceeded

from .native_commands import MAX_ID, Obj, PublishBatch, opt_bool, request_id
from .native_common import (
    DEFAULT_CONTENT_TYPE,
    MAX_IDEM_CHARS,
    Limits,
    check_content_type,
    check_headers,
    check_idem,
    check_tags,
)

__all__ = ["MAX_BATCH_ROWS", "encode_batch_reply", "max_rows", "parse_publish_batch"]

T = TypeVar("T")

#: Most rows of one ``publish_batch`` frame.
MAX_BATCH_ROWS: Final = 10_000
_TEXT_TYPE: Final = "text/plain; charset=utf-8"
# The most bytes a row adds to the reply, in JSON: a seq of up to 20 digits, an epoch, a time of up to 20
# digits as a string, and its index among the duplicates, with separators.
_REPLY_ROW_BYTES: Final = 64


def _column(obj: Obj, key: str, n: int) -> list[Any] | None:
    """The optional per-row column ``key``: None when absent, else a list of exactly ``n`` values."""
    v = obj.get(key)
    if v is None:
        return None
    if type(v) is not list:
        raise BadRequest(f"{key} must be a list")
    if len(v) != n:
        raise BadRequest(f"{key} must have one value per row ({n})")
    return v


def _payloads(obj: Obj, json: bool) -> tuple[list[bytes], str]:
    """The payload column and its default content type. msgpack: ``payloads`` (bin, or str stored as UTF-8);
    JSON: exactly one of ``texts`` (strings, stored as UTF-8) and ``b64s`` (base64 strings)."""
    if not json:
        raw = obj.get("payloads")
        if type(raw) is not list:
            raise BadRequest("payloads (a list of bin) is required")
        if all(type(p) is bytes for p in raw):
            return raw, DEFAULT_CONTENT_TYPE
        out: list[bytes] = []
        for i, p in enumerate(raw):
            if type(p) is bytes:
                out.append(p)
            elif type(p) is str:
                out.append(_utf8(p, i))
            else:
                raise _bad(i, "a payload must be bin or str")
        return out, DEFAULT_CONTENT_TYPE
    present = [k for k in ("texts", "b64s") if k in obj]
    if len(present) != 1:
        raise BadRequest("give exactly one of texts and b64s")
    kind = present[0]
    raw = obj[kind]
    if type(raw) is not list:
        raise BadRequest(f"{kind} must be a list of strings")
    out = []
    for i, p in enumerate(raw):
        if type(p) is not str:
            raise _bad(i, f"{kind} holds strings only")
        if kind == "texts":
            out.append(_utf8(p, i))
        else:
            try:
                out.append(base64.b64decode(p.encode("ascii"), validate=True))
            except (binascii.Error, UnicodeEncodeError, ValueError):
                raise _bad(i, "not valid base64") from None
    return out, (_TEXT_TYPE if kind == "texts" else DEFAULT_CONTENT_TYPE)


def _utf8(s: str, i: int) -> bytes:
    try:
        return s.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(i, "text is not valid UTF-8") from None


def _bad(i: int, detail: str) -> BadRequest:
    """A 4001 about row ``i``."""
    exc = BadRequest(f"row {i}: {detail}")
    exc.row = i
    return exc


def _at_row(i: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, its error naming row ``i`` (the error's code kept)."""
    try:
        return fn(*args)
    except HubbubError as exc:
        exc.detail = f"row {i}: {exc.detail}" if exc.detail else f"row {i}"
        exc.row = i
        raise


def max_rows(max_frame: int) -> int:
    """Most rows of a batch on a connection of ``max_frame``: :data:`MAX_BATCH_ROWS`, and few enough that
    the reply (at most :data:`_REPLY_ROW_BYTES` a row) fits in one frame."""
    return max(1, min(MAX_BATCH_ROWS, max_frame // _REPLY_ROW_BYTES))


def parse_publish_batch(
    obj: Obj, limits: Limits, channel_cache: dict[str, str], json: bool, cache_size: int, max_frame: int
) -> PublishBatch:
    """Validate a decoded ``publish_batch`` frame (see the module docstring and docs/native.md).

    ``channel_cache``: the codec's raw → canonical channel texts (at most ``cache_size``, cleared when full).
    """
    rid = obj.get("id")
    if type(rid) is not int or not 0 <= rid < MAX_ID:
        rid = request_id(obj)
    payloads, default_type = _payloads(obj, json)
    n = len(payloads)
    if n == 0:
        raise BadRequest("a batch needs at least one row")
    limit = max_rows(max_frame)
    if n > limit:
        raise LimitExceeded(f"a batch has at most {limit} rows")

    # Channels: one for every row, or one per row; each distinct text is canonicalized once.
    raw_one = obj.get("channel")
    raw_many = _column(obj, "channels", n)
    if (raw_one is None) == (raw_many is None):
        raise BadRequest("give exactly one of channel and channels")
    try:
        distinct = [raw_one] if raw_many is None else set(raw_many)
    except TypeError:  # a list or map among them
        raise BadRequest("channels must be strings") from None
    for raw in distinct:
        if type(raw) is not str:
            if raw_many is None:
                raise BadRequest("channel must be a string")
            raise _bad(raw_many.index(raw), "channels must be strings")
        if raw not in channel_cache:
            ch = (
                canonical(raw, limits.max_channel_bytes)
                if raw_many is None
                else _at_row(raw_many.index(raw), canonical, raw, limits.max_channel_bytes)
            )
            if len(channel_cache) >= cache_size:
                channel_cache.clear()
            channel_cache[raw] = ch
    if raw_many is None:
        channels = [channel_cache[str(raw_one)]] * n
    else:
        get = channel_cache.get
        channels = [get(c) or canonical(c, limits.max_channel_bytes) for c in raw_many]

    # Content types: one for every row, or one per row (null: the payload field's default).
    ct_one = obj.get("content_type")
    ct_many = _column(obj, "content_types", n)
    if ct_one is not None and ct_many is not None:
        raise BadRequest("give at most one of content_type and content_types")
    if ct_many is None:
        content_types = [default_type if ct_one is None else check_content_type(ct_one)] * n
    else:
        checked: dict[str, str] = {}
        content_types = []
        for i, ct in enumerate(ct_many):
            if ct is None:
                content_types.append(default_type)
                continue
            if type(ct) is not str:
                raise _bad(i, "content_type must be a string")
            if ct not in checked:
                checked[ct] = _at_row(i, check_content_type, ct)
            content_types.append(ct)

    # Headers: a map (or null) per row. The usual row holds one or two short ASCII headers: checked inline.
    raw_headers = _column(obj, "headers", n)
    headers: list[dict[str, str]]
    if raw_headers is None:
        headers = [{} for _ in range(n)]  # a dict of its own each: an event's headers are its own
    else:
        headers = []
        max_bytes = limits.max_header_bytes
        for i, h in enumerate(raw_headers):
            if h is None:
                headers.append({})
                continue
            if type(h) is not dict:
                raise _bad(i, "headers must be an object of strings")
            if len(h) == 1:
                ((k, v),) = h.items()
                if (
                    type(k) is str
                    and type(v) is str
                    and k
                    and k[0] != ":"
                    and k.isascii()
                    and v.isascii()
                    and len(k) + len(v) <= max_bytes
                    and limits.max_headers >= 1
                ):
                    headers.append(h)
                    continue
            headers.append(_at_row(i, check_headers, h.items(), limits))

    # Tags: a list (or null) per row.
    raw_tags = _column(obj, "tags", n)
    tags: list[tuple[str, ...]]
    if raw_tags is None:
        tags = [()] * n
    else:
        tags = []
        for i, t in enumerate(raw_tags):
            if t is None:
                tags.append(())
            elif type(t) is not list:
                raise _bad(i, "tags must be a list")
            else:
                tags.append(_at_row(i, check_tags, t, limits) if t else ())

    # Idempotency keys: a string (or null: none) per row.
    raw_idems = _column(obj, "idems", n)
    idems: list[str]
    if raw_idems is None:
        idems = [""] * n
    else:
        idems = raw_idems
        for k in raw_idems:
            if type(k) is not str or len(k) > MAX_IDEM_CHARS or not k.isascii():
                idems = [_at_row(j, check_idem, k) for j, k in enumerate(raw_idems)]
                break
    return PublishBatch(
        rid, channels, payloads, content_types, headers, tags, idems, opt_bool(obj, "ack", False)
    )


def encode_batch_reply(
    dump: Callable[[dict[str, Any]], bytes],
    json: bool,
    rid: int,
    seqs: Sequence[int],
    epochs: Sequence[str],
    times: Sequence[int],
    duplicates: Sequence[int],
) -> bytes:
    """``{"op":"reply","id":n,"count":N,"seqs":[…],"epochs":[…],"times":[…]}``, then ``"duplicates":[…]``
    (the rows answered with an earlier event) when there are any; ``times`` are strings in JSON."""
    obj: dict[str, Any] = {
        "op": "reply",
        "id": rid,
        "count": len(seqs),
        "seqs": seqs,
        "epochs": epochs,
        "times": [str(t) for t in times] if json else times,
    }
    if duplicates:
        obj["duplicates"] = duplicates
    return dump(obj)
