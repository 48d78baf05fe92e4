"""The log's record schema (the contract with the data pipeline) and the compact codec for map/list columns.

Every engine stores, and every reader of the log (``hubbub.pipeline``, exports, backups) sees, one **record**
per event with exactly the columns of :data:`RECORD_SCHEMA`, in that order:

* ``channel`` (string): canonical channel path (``/a/b``), UTF-8; byte order is path order
* ``seq`` (int64): sequence number within ``(channel, epoch)``: 1, 2, 3… without gaps
* ``epoch`` (string): the channel's epoch, ``[0-9a-z]{8}``; changes only on a reset
* ``time`` (int64): commit time in nanoseconds since the Unix epoch (UTC), strictly increasing over the log
* ``publisher_dialect`` (string): dialect the event was published with (``native``, ``guble``…)
* ``publisher_user`` (string): authenticated user, ``""`` when none
* ``publisher_app`` (string): publishing application or session, ``""`` when none
* ``publisher_msg_id`` (string): the publisher's message id or idempotency key, ``""`` when none
* ``headers`` (map<string,string>): headers, including pseudo-headers (keys starting with ``:``)
* ``tags`` (list<string>): tags, sorted ascending, no duplicates
* ``payload`` (binary): the payload bytes, exactly as published
* ``content_type`` (string): the payload's media type

No column is nullable: absent strings are ``""``, absent maps and lists are empty. A record's *size* (what
retention counts, :attr:`hubbub.events.Event.size`) is the payload length plus the UTF-8 lengths of every
header key and value and every tag.

Column codec (:func:`encode_headers` … :func:`decode_tags`): where a store keeps ``headers`` or ``tags`` in
one binary database column, it uses MessagePack (``use_bin_type``): a map of str to str, and an array of str.
An empty map or list is stored as **zero bytes** (``b""``), which is also what the hot path writes for the
common event without headers or tags. Any other content is an error (:class:`RecordError`): a reader never
guesses.

Schema changes bump :data:`RECORD_SCHEMA_VERSION`; a change that removes or retypes a column is breaking for
every archive the pipeline wrote.

Everything here is pure and thread-safe (no state).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from hubbub.events import Event, Publisher

__all__ = [
    "RECORD_COLUMNS",
    "RECORD_SCHEMA",
    "RECORD_SCHEMA_VERSION",
    "SPARK_DDL",
    "Column",
    "RecordError",
    "decode_headers",
    "decode_tags",
    "encode_headers",
    "encode_tags",
    "event_columns",
    "event_size",
    "event_to_record",
    "record_to_event",
]

#: Version of :data:`RECORD_SCHEMA`. Bump it on any change, and say in ``docs/`` what changed.
RECORD_SCHEMA_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class Column:
    """One column of the record schema.

    ``type`` is a logical type: ``string`` (UTF-8), ``int64``, ``binary``, ``map<string,string>`` or
    ``list<string>``. ``spark`` is the same type in Spark SQL DDL.
    """

    name: str
    type: str
    spark: str
    doc: str


#: The record schema, in column order. See the module docstring.
RECORD_SCHEMA: Final[tuple[Column, ...]] = (
    Column("channel", "string", "STRING", "canonical channel path, UTF-8"),
    Column("seq", "int64", "BIGINT", "sequence number within (channel, epoch), from 1, no gaps"),
    Column("epoch", "string", "STRING", "the channel's epoch, [0-9a-z]{8}"),
    Column("time", "int64", "BIGINT", "commit time in ns since the Unix epoch, strictly increasing"),
    Column("publisher_dialect", "string", "STRING", "dialect of the publisher"),
    Column("publisher_user", "string", "STRING", "authenticated user or empty"),
    Column("publisher_app", "string", "STRING", "publishing application or session, or empty"),
    Column("publisher_msg_id", "string", "STRING", "publisher's message id or idempotency key, or empty"),
    Column("headers", "map<string,string>", "MAP<STRING, STRING>", "headers, with pseudo-headers"),
    Column("tags", "list<string>", "ARRAY<STRING>", "tags, sorted, no duplicates"),
    Column("payload", "binary", "BINARY", "payload bytes"),
    Column("content_type", "string", "STRING", "media type of the payload"),
)

#: Column names, in order.
RECORD_COLUMNS: Final[tuple[str, ...]] = tuple(c.name for c in RECORD_SCHEMA)

#: The schema as a Spark SQL DDL string (every column ``NOT NULL``), for ``spark.read.schema(...)``.
SPARK_DDL: Final[str] = ", ".join(f"{c.name} {c.spark} NOT NULL" for c in RECORD_SCHEMA)


class RecordError(ValueError):
    """A stored record or column value is not what the schema says (corruption or a foreign writer)."""


_EMPTY: Final = b""
_local = threading.local()


def _packer() -> msgpack.Packer:
    # A Packer per thread: ``msgpack.packb`` builds a new one per call, which costs more than the packing.
    try:
        packer: msgpack.Packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    return packer


def _pack(obj: dict[str, str] | list[str]) -> bytes:
    data: bytes = _packer().pack(obj)
    return data


def encode_headers(headers: Mapping[str, str]) -> bytes:
    """Encode a header map for a binary column: ``b""`` when empty, else a MessagePack map of str to str."""
    if not headers:
        return _EMPTY
    if type(headers) is not dict:
        headers = dict(headers)
    for k, v in headers.items():
        if type(k) is not str or type(v) is not str:
            raise RecordError("header names and values must be strings")
    return _pack(headers)


def decode_headers(data: bytes | None) -> dict[str, str]:
    """Inverse of :func:`encode_headers`. ``None`` (SQL NULL) reads as empty. Raises :class:`RecordError`."""
    if not data:
        return {}
    obj = _unpack(data)
    if type(obj) is not dict:
        raise RecordError("headers column is not a map")
    for k, v in obj.items():
        if type(k) is not str or type(v) is not str:
            raise RecordError("headers column holds a non-string")
    return obj


def encode_tags(tags: Sequence[str]) -> bytes:
    """Encode tags for a binary column: ``b""`` when empty, else a MessagePack array of str."""
    if not tags:
        return _EMPTY
    for t in tags:
        if type(t) is not str:
            raise RecordError("tags must be strings")
    return _pack(list(tags))


def decode_tags(data: bytes | None) -> tuple[str, ...]:
    """Inverse of :func:`encode_tags`. ``None`` (SQL NULL) reads as empty. Raises :class:`RecordError`."""
    if not data:
        return ()
    obj = _unpack(data)
    if type(obj) is not list:
        raise RecordError("tags column is not a list")
    for t in obj:
        if type(t) is not str:
            raise RecordError("tags column holds a non-string")
    return tuple(obj)


def _unpack(data: bytes) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types (ExtraData, UnicodeDecodeError, …)
        raise RecordError("column is not valid MessagePack") from exc


def event_size(payload: bytes, headers: Mapping[str, str], tags: Sequence[str]) -> int:
    """What retention counts for one event; equal to :attr:`Event.size` for the same values."""
    n = len(payload)
    # One join and (only for non-ASCII text) one encode: this runs for every appended event.
    if headers:
        text = "".join(headers) + "".join(headers.values())
        n += len(text) if text.isascii() else len(text.encode())
    if tags:
        text = "".join(tags)
        n += len(text) if text.isascii() else len(text.encode())
    return n


def event_columns(
    payload: bytes, headers: Mapping[str, str], tags: Sequence[str], packer: msgpack.Packer | None = None
) -> tuple[int, bytes, bytes]:
    """``(event_size(…), encode_headers(headers), encode_tags(tags))`` in one step, for a store's append.
    ``packer``: the caller's own (one thread's) Packer, which spares the per-thread look-up.

    A bulk load's event has a few short ASCII headers (the pipeline's ``hubbub-source``, and its input's) and
    no tags: that case costs one pass over the headers and one pack here (one header: about 0.4 µs less than
    the three calls, 2-core dev machine)."""
    if type(headers) is dict and headers and not tags:
        n = len(payload)
        for k, v in headers.items():
            if type(k) is not str or type(v) is not str or not k.isascii() or not v.isascii():
                break
            n += len(k) + len(v)
        else:
            hb: bytes = (packer or _packer()).pack(headers)
            return n, hb, _EMPTY
    hb, tb = encode_headers(headers), encode_tags(tags)  # first: they check the types
    return event_size(payload, headers, tags), hb, tb


def event_to_record(event: Event) -> dict[str, Any]:
    """The record of one event: a dict with the keys of :data:`RECORD_COLUMNS`, in order."""
    p = event.publisher
    return {
        "channel": event.channel,
        "seq": event.seq,
        "epoch": event.epoch,
        "time": event.time_ns,
        "publisher_dialect": p.dialect,
        "publisher_user": p.user,
        "publisher_app": p.app,
        "publisher_msg_id": p.msg_id,
        "headers": dict(event.headers),
        "tags": list(event.tags),
        "payload": bytes(event.payload),
        "content_type": event.content_type,
    }


def record_to_event(record: Mapping[str, Any]) -> Event:
    """Inverse of :func:`event_to_record`. Raises :class:`RecordError` on a missing or mistyped column.

    ``headers`` may also be given as a sequence of ``(key, value)`` pairs (what Spark returns for a map
    column in some APIs), and ``payload`` as any bytes-like value.
    """
    missing = [c for c in RECORD_COLUMNS if c not in record]
    if missing:
        raise RecordError(f"record lacks column(s): {', '.join(missing)}")
    try:
        headers_in = record["headers"]
        headers = dict(headers_in.items() if isinstance(headers_in, Mapping) else headers_in)
        tags = tuple(record["tags"])
        payload = bytes(record["payload"])
    except (TypeError, ValueError) as exc:
        raise RecordError("record has a mistyped headers, tags or payload column") from exc
    strings = ("channel", "epoch", "publisher_dialect", "publisher_user", "publisher_app", "publisher_msg_id")
    for name in (*strings, "content_type"):
        if type(record[name]) is not str:
            raise RecordError(f"record column {name} is not a string")
    for name in ("seq", "time"):
        if type(record[name]) is not int:
            raise RecordError(f"record column {name} is not an integer")
    if not all(type(k) is str and type(v) is str for k, v in headers.items()):
        raise RecordError("record column headers holds a non-string")
    if not all(type(t) is str for t in tags):
        raise RecordError("record column tags holds a non-string")
    return Event(
        channel=record["channel"],
        seq=record["seq"],
        epoch=record["epoch"],
        time_ns=record["time"],
        publisher=Publisher(
            record["publisher_dialect"],
            record["publisher_user"],
            record["publisher_app"],
            record["publisher_msg_id"],
        ),
        payload=payload,
        content_type=record["content_type"],
        headers=headers,
        tags=tags,
    )
