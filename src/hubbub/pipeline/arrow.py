"""The record schema as Arrow, and builders of Arrow record batches from the log's raw rows.

:data:`ARROW_SCHEMA` is :data:`hubbub.log.records.RECORD_SCHEMA` column for column (no column nullable);
:data:`hubbub.log.records.SPARK_DDL` is the same schema in Spark's words. Spark's Python data source turns
these batches into rows without a Python object per value, which is why the source yields batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hubbub.log.base import ScanColumns
from hubbub.log.records import RECORD_SCHEMA, decode_headers, decode_tags

__all__ = ["ARROW_SCHEMA", "batch_from_columns", "batch_from_events", "batch_from_rows", "empty_batch"]

_TYPES: Final[dict[str, pa.DataType]] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "binary": pa.binary(),
    "map<string,string>": pa.map_(pa.string(), pa.string()),
    "list<string>": pa.list_(pa.string()),
}

#: The record schema as an Arrow schema, in column order.
ARROW_SCHEMA: Final = pa.schema([pa.field(c.name, _TYPES[c.type], nullable=False) for c in RECORD_SCHEMA])

_MAP: Final = _TYPES["map<string,string>"]
_LIST: Final = _TYPES["list<string>"]


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)


def _const_or_array(values: Sequence[Any], typ: pa.DataType) -> pa.Array:
    # Most columns of a page hold one value (one dialect, one content type): repeat it instead of converting
    # every element. Comparing to the first value is far cheaper than building an array from Python objects.
    first = values[0]
    if values.count(first) == len(values):
        return pa.repeat(pa.scalar(first, typ), len(values))
    return pa.array(values, typ)


def _text_column(values: Sequence[str | None]) -> pa.Array:
    """A string column from ``read_rows`` values, where ``None`` (``compact_text``) means the first value."""
    first = values[0]
    n = len(values)
    if values.count(None) == n - 1 or values.count(first) == n:
        return pa.repeat(pa.scalar(first, pa.string()), n)
    arr = pa.array(values, pa.string())
    return pc.fill_null(arr, first) if arr.null_count else arr


def _empty_lists(n: int, typ: pa.DataType) -> pa.Array:
    offsets = pa.array(np.zeros(n + 1, np.int32))
    if typ == _MAP:
        return pa.MapArray.from_arrays(offsets, pa.array([], pa.string()), pa.array([], pa.string()))
    return pa.ListArray.from_arrays(offsets, pa.array([], pa.string()))


def _decoded_column(
    encoded: Sequence[bytes] | pa.Array, decode: Callable[[bytes], Any], typ: pa.DataType
) -> pa.Array:
    """A column of encoded values (``b""`` for empty), decoding each distinct value once.

    The page's values are dictionary-encoded in Arrow, only the distinct ones are decoded in Python, and the
    column is gathered from them with ``take``: pages repeat a few header maps and tag sets many times.
    """
    if isinstance(encoded, pa.Array):
        if len(encoded.buffers()[2] or b"") == 0:  # every value empty
            return _empty_lists(len(encoded), typ)
        codes = encoded.dictionary_encode()
    else:
        if not any(encoded):
            return _empty_lists(len(encoded), typ)
        codes = pa.array(encoded, pa.binary()).dictionary_encode()
    distinct = pa.array([decode(b) if b else [] for b in codes.dictionary.to_pylist()], typ)
    return distinct.take(codes.indices)


def _map_column(encoded: Sequence[bytes] | pa.Array) -> pa.Array:
    return _decoded_column(encoded, _header_items, _MAP)


def _list_column(encoded: Sequence[bytes] | pa.Array) -> pa.Array:
    return _decoded_column(encoded, _tag_list, _LIST)


def _header_items(b: bytes) -> list[tuple[str, str]]:
    return list(decode_headers(b).items())


def _tag_list(b: bytes) -> list[str]:
    return list(decode_tags(b))


def batch_from_rows(channel: str, epoch: str, rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """A batch from :meth:`hubbub.log.LogStore.read_rows` rows of one channel and epoch (with or
    without ``compact_text``)."""
    n = len(rows)
    if n == 0:
        return empty_batch()
    seq, time_ns, dialect, user, app, msg_id, ctype, headers, tags, payload = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(channel, pa.string()), n),
            pa.array(seq, pa.int64()),
            pa.repeat(pa.scalar(epoch, pa.string()), n),
            pa.array(time_ns, pa.int64()),
            _text_column(dialect),
            _text_column(user),
            _text_column(app),
            _text_column(msg_id),
            _map_column(headers),
            _list_column(tags),
            pa.array(payload, pa.binary()),
            _text_column(ctype),
        ],
        schema=ARROW_SCHEMA,
    )


def batch_from_events(events: Iterable[Mapping[str, Any]]) -> pa.RecordBatch:
    """A batch from event objects of the HTTP log API's ``msgpack`` form (native.md §8)."""
    evs = list(events)
    if not evs:
        return empty_batch()
    pubs = [e["publisher"] for e in evs]
    return pa.RecordBatch.from_arrays(
        [
            _const_or_array([e["channel"] for e in evs], pa.string()),
            pa.array([e["seq"] for e in evs], pa.int64()),
            _const_or_array([e["epoch"] for e in evs], pa.string()),
            pa.array([e["time"] for e in evs], pa.int64()),
            _const_or_array([p["dialect"] for p in pubs], pa.string()),
            _const_or_array([p["user"] for p in pubs], pa.string()),
            _const_or_array([p["app"] for p in pubs], pa.string()),
            _const_or_array([p["msg_id"] for p in pubs], pa.string()),
            pa.array([list(e["headers"].items()) for e in evs], _MAP),
            pa.array([e["tags"] for e in evs], _LIST),
            pa.array([e["payload"] for e in evs], pa.binary()),
            _const_or_array([e["content_type"] for e in evs], pa.string()),
        ],
        schema=ARROW_SCHEMA,
    )


# -- ScanColumns (LogStore.scan_columns): no Python object per event -------------------------------


def _ints(text: str) -> pa.Array:
    """``"1,2,3"`` -> an int64 array, parsed by Arrow."""
    parts = pc.split_pattern(pa.array([text], pa.large_string()), ",")
    return pc.cast(pc.list_flatten(parts), pa.int64())


def _varlen(lengths: str, data: bytes, n: int, typ: pa.DataType) -> pa.Array:
    """A binary or string array from the values' byte lengths (``"3,0,5"``) and their concatenated bytes."""
    offsets = np.zeros(n + 1, np.int32)
    if data:
        np.cumsum(_ints(lengths).to_numpy(), out=offsets[1:])
    return pa.Array.from_buffers(typ, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def batch_from_columns(cols: ScanColumns, channels: Mapping[int, tuple[str, str]]) -> pa.RecordBatch:
    """A batch from :meth:`hubbub.log.LogStore.scan_columns` columns; ``channels`` maps each channel
    id in them to its ``(path, epoch)``. Arrow parses and gathers every column: Python handles only the
    distinct channels, header maps and tag sets."""
    n = cols.n
    if n == 0:
        return empty_batch()
    cids = _ints(cols.channel_id)
    ids = pc.unique(cids).to_pylist()
    if len(ids) == 1:
        path, epoch = channels[ids[0]]
        channel = pa.repeat(pa.scalar(path, pa.string()), n)
        epochs = pa.repeat(pa.scalar(epoch, pa.string()), n)
    else:
        where = pc.index_in(cids, value_set=pa.array(ids, pa.int64()))
        names = [channels[i] for i in ids]
        channel = pa.array([c for c, _ in names], pa.string()).take(where)
        epochs = pa.array([e for _, e in names], pa.string()).take(where)
    text: list[pa.Array] = []
    for value in cols.text:
        if isinstance(value, str):
            text.append(pa.repeat(pa.scalar(value, pa.string()), n))
        else:
            text.append(_varlen(value[0], value[1], n, pa.string()))
    dialect, user, app, msg_id, ctype = text
    return pa.RecordBatch.from_arrays(
        [
            channel,
            _ints(cols.seq),
            epochs,
            _ints(cols.time_ns),
            dialect,
            user,
            app,
            msg_id,
            _map_column(_varlen(*cols.headers, n, pa.binary())),
            _list_column(_varlen(*cols.tags, n, pa.binary())),
            _varlen(*cols.payload, n, pa.binary()),
            ctype,
        ],
        schema=ARROW_SCHEMA,
    )
