"""The ``hubbub`` sink: publishes a DataFrame's rows to a running server (batch and streaming writes).

Each Spark task publishes its rows over **one native connection**, pipelined (:class:`BulkPublisher`): the
rows go as ``publish_batch`` frames (docs/native.md "Batched publishes": a quarter of the window's rows per
frame, appended in one commit and acknowledged with one reply; ``publish`` frames per row to a server
without the op), up to ``publishWindow`` rows unacknowledged, every row acknowledged before the task
reports success. Where that connection goes (option ``nativeAddress``, docs/pipeline.md):

* ``tcp://host:port``: the server's native TCP listener (``native.tcp_listen``);
* ``ws://host:port``: the native WebSocket route (``/ws/hubbub``);
* not given: the WebSocket route on the port of ``url``, so nothing more needs configuring.

``transport``: ``auto`` (the default) falls back to HTTP (``POST /api/v1/publish``, one request per row, the
old path) when the native connection cannot be opened and ``nativeAddress`` was not given; ``native`` never
falls back; ``http`` always uses HTTP.

Every row carries an idempotency key (``idemColumn``, or its source position ``channel#epoch:seq``), the same
on either transport, so a retried task, or a publish resent after a reconnect, is acknowledged as a
duplicate instead of appended again (within the server's ``native.idempotency_window_s``). A publish the
server refuses fails the task with that row's channel and the server's error, as over HTTP.

Spark hands the rows over as Arrow record batches (``DataSourceArrowWriter``), which costs far less per row
than ``Row`` objects; a PySpark without the streaming Arrow writer (before 4.1) gets rows.

``orderBy`` (columns, comma-separated) publishes each task's rows in that order (:func:`ordered`): Arrow sorts
them in the task's Python worker once all are in, held in memory, or beyond :data:`ORDERED_MEMORY_BYTES` in a
memory-mapped file in Spark's local directory.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import datasource as _ds
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import Row, StructType

from hubbub.client._wire import CannotConnect
from hubbub.client.bulk import BulkPublisher
from hubbub.errors import HubbubError, PipelineError
from hubbub.pipeline.options import SINK_OPTIONS, SOURCE_HEADER, names_of, parse_options

__all__ = [
    "SOURCE_HEADER",
    "WRITE_OPTIONS",
    "HubbubStreamWriter",
    "HubbubWriter",
    "PublishCommit",
    "position_key",
]

log = logging.getLogger("hubbub.pipeline")

_MAX_IDEM = 128

#: The sink's option names (:data:`hubbub.pipeline.options.SINK_OPTIONS`, with their parsers).
WRITE_OPTIONS: tuple[str, ...] = tuple(names_of(SINK_OPTIONS))

#: Most rows of a batch that :func:`ordered` publishes from.
ORDERED_BATCH_ROWS = 8192
#: Most bytes of rows (Arrow's) that :func:`ordered` holds in memory; a task with more goes through a file.
ORDERED_MEMORY_BYTES = 128 << 20


def position_key(channel: str, epoch: str, seq: int) -> str:
    """The source position of an event as text: ``channel#epoch:seq``."""
    return f"{channel}#{epoch}:{seq}"


def _idem(key: str) -> str:
    if len(key) <= _MAX_IDEM:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


@dataclass
class PublishCommit(WriterCommitMessage):  # type: ignore[misc]
    published: int = 0
    duplicates: int = 0
    channels: dict[str, int] = field(default_factory=dict)
    transport: str = ""

    def count(self, channel: str, seq: int, duplicate: bool) -> None:
        if duplicate:
            self.duplicates += 1
        else:
            self.published += 1
        if seq > self.channels.get(channel, 0):
            self.channels[channel] = seq


def _native_url(url: str, address: str) -> str:
    """The native endpoint: ``nativeAddress`` (``tcp://``, ``ws://``, or ``host:port`` for TCP), else the
    WebSocket route on ``url``'s port."""
    if address:
        return address if "://" in address else "tcp://" + address
    return url


def _headers(items: Any, source: str, position: str) -> dict[str, str]:
    """A row's headers: its user headers (a map column's ``(key, value)`` pairs, or a dict), pseudo-headers
    left out, and ``source`` (when set) holding the row's source position."""
    if not items:
        return {source: position} if source else {}
    pairs = items.items() if isinstance(items, Mapping) else items
    out = {k: v for k, v in pairs if not k.startswith(":")}
    if source:
        out[source] = position
    return out


def _spill_dir() -> str | None:
    """Spark's first local directory of this worker (where Spark spills its own sorts), else the system's
    temporary directory."""
    first = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0]
    return first if first and os.path.isdir(first) else None


def ordered(
    batches: Iterable[pa.RecordBatch],
    order: Sequence[str],
    rows: int = ORDERED_BATCH_ROWS,
    memory: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of ``batches`` ordered by the columns ``order`` (each ascending, nulls first, as Spark
    orders), in batches of at most ``rows``. Nothing comes out before every row is in. Up to ``memory``
    bytes of rows (default :data:`ORDERED_MEMORY_BYTES`) are held in memory; beyond that every row goes to
    an Arrow file in Spark's local directory, read back memory-mapped, so the worker holds the sort's
    columns and indices (8 bytes a row) and one batch at a time, and the operating system pages the rest.
    In a short job this costs far less than Spark's own sort of the same rows, whose code the JVM has yet
    to compile (bench/RESULTS.md, "Pipeline: the backfill's order")."""
    budget = ORDERED_MEMORY_BYTES if memory is None else memory
    held: list[pa.RecordBatch] = []
    size = 0
    it = iter(batches)
    for batch in it:
        held.append(batch)
        size += batch.nbytes
        if size > budget:
            yield from _ordered_on_disk(held, it, order, rows)
            return
    if held:
        # One chunk per column: taking from it costs half as much as from many.
        table = pa.Table.from_batches(held).combine_chunks()
        held.clear()
        yield from _in_order(table, order, rows)


def _ordered_on_disk(
    held: list[pa.RecordBatch], rest: Iterator[pa.RecordBatch], order: Sequence[str], rows: int
) -> Iterator[pa.RecordBatch]:
    """:func:`ordered` through a file: ``held`` (emptied once written), then ``rest``."""
    with tempfile.NamedTemporaryFile(dir=_spill_dir(), prefix="hubbub-sink-", suffix=".arrow") as spill:
        with pa.ipc.new_file(spill.name, held[0].schema) as out:
            for batch in held:
                out.write_batch(batch)
            held.clear()
            for batch in rest:
                out.write_batch(batch)
        with pa.memory_map(spill.name) as src:
            # take copies: the batches outlive neither the map nor the file.
            yield from _in_order(pa.ipc.open_file(src).read_all(), order, rows)


def _in_order(table: pa.Table, order: Sequence[str], rows: int) -> Iterator[pa.RecordBatch]:
    idx = pc.sort_indices(table.select(list(order)), sort_keys=[(c, "ascending", "at_start") for c in order])
    for at in range(0, len(idx), rows):
        yield from table.take(idx.slice(at, rows)).to_batches()


def _nonempty_lists(arr: pa.Array) -> Iterator[tuple[int, slice]]:
    """``(row, slice of the flat values)`` of each row of a list or map array that has values (nulls and
    empty lists have none). Arrow finds them; Python visits only those rows."""
    # Absolute offsets into the whole flat values (``.values``, ``.keys``, ``.items`` ignore a slice's start).
    off = arr.offsets
    n = len(arr)
    has = pc.greater(pc.subtract(off.slice(1, n), off.slice(0, n)), 0)
    if arr.null_count:
        has = pc.and_(has, arr.is_valid())
    rows = pc.indices_nonzero(has).to_pylist()
    if not rows:
        return
    offsets = off.to_pylist()
    for i in rows:
        yield i, slice(offsets[i], offsets[i + 1])


def _columns(rows: Iterable[_Row]) -> _Rows:
    """Rows as the sink's columns."""
    cols: list[list[Any]] = [[], [], [], [], [], []]
    for row in rows:
        for c, v in zip(cols, row, strict=True):
            c.append(v)
    return (cols[0], cols[1], cols[2], cols[3], cols[4], cols[5])


#: One row to publish: target channel, payload, idempotency key, content type, headers, tags (a plain tuple:
#: this is made once per row, and a frozen dataclass costs several times more).
_Row = tuple[str, bytes, str, str, dict[str, str], list[str]]
#: Rows to publish as columns (the fields of :data:`_Row`, a list each): what a batch becomes.
_Rows = tuple[list[str], list[bytes], list[str], list[str], list[dict[str, str]], list[list[str]]]


class _Publishing:
    """The sink's options, checked against the input schema once; :meth:`publish` runs in each task."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        v = parse_options(options, SINK_OPTIONS, "sink")
        if v["url"] is None:
            raise PipelineError("hubbub sink: set option url to a running server (http://host:port)")
        self.url: str = v["url"]
        self.token: str = v["token"]
        self.channel: str = v["channel"]
        self.prefix: str = v["channelPrefix"]
        self.idem_column: str = v["idemColumn"]
        self.source_header: str = v["sourceHeader"]
        self.native_address: str = v["nativeAddress"]
        self.transport: str = v["transport"]
        self.window: int = v["publishWindow"]
        self.order: tuple[str, ...] = v["orderBy"]
        self.retries: int = v["retries"]
        self.retry_interval = v["retryIntervalMs"] / 1000
        if self.native_address and self.transport == "http":
            raise PipelineError("hubbub sink: nativeAddress has no use with transport http")
        if self.transport == "native" and not self.native_address and self.url.startswith("https://"):
            raise PipelineError(
                "hubbub sink: the native publisher does not do TLS; set nativeAddress, or transport http"
            )
        names = set(schema.fieldNames())
        if "payload" not in names:
            raise PipelineError("hubbub sink: the rows need a payload column")
        if not self.channel and "channel" not in names:
            raise PipelineError("hubbub sink: set option channel, or give the rows a channel column")
        if self.idem_column and self.idem_column not in names:
            raise PipelineError(f"hubbub sink: idemColumn {self.idem_column!r} is not a column")
        if not self.idem_column and not {"channel", "seq"} <= names:
            raise PipelineError(
                "hubbub sink: set idemColumn, or give the rows their source channel and seq columns "
                "(every published event needs an idempotency key, so a retried task never publishes twice)"
            )
        self.has_channel = "channel" in names
        for c in self.order:
            if c not in names:
                raise PipelineError(f"hubbub sink: orderBy column {c!r} is not a column")
            kind = schema[c].dataType
            if kind.typeName() in ("map", "array", "struct"):
                raise PipelineError(
                    f"hubbub sink: orderBy column {c!r} cannot be ordered ({kind.simpleString()})"
                )

    # -- rows -----------------------------------------------------------------------------------------

    def _target(self, channel: str) -> str:
        """Where a row of ``channel`` goes: ``channelPrefix`` in front (the prefix alone for ``/``)."""
        if self.prefix:
            return self.prefix + (channel if channel != "/" else "")
        return channel

    def _row(
        self,
        src_ch: str | None,
        epoch: str | None,
        seq: int | None,
        key: Any,
        payload: bytes | str,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
        tags: Iterable[str] | None,
        content_type: str | None,
    ) -> _Row:
        src_ch = src_ch or ""
        position = position_key(src_ch, epoch or "", int(seq)) if seq is not None and self.has_channel else ""
        target = self._target(self.channel or src_ch)
        if isinstance(payload, str):
            payload = payload.encode()
        hdrs: dict[str, str] = {}
        if headers:
            items = headers.items() if isinstance(headers, Mapping) else headers
            hdrs = {k: v for k, v in items if not k.startswith(":")}
        if self.source_header and position:
            hdrs[self.source_header] = position
        idem = _idem(str(key) if self.idem_column else position)
        return (target, payload, idem, content_type or "", hdrs, list(tags) if tags else [])

    def rows_of_batches(self, batches: Iterable[pa.RecordBatch]) -> Iterator[_Rows]:
        """The rows of Arrow batches, a batch at a time: only the columns the sink reads, each converted at
        once (far cheaper than Spark Rows, or than every column of the record schema); with ``orderBy``,
        once all are in, in that order."""
        if self.order:
            batches = ordered(batches, self.order)
        for batch in batches:
            yield self._rows_of_batch(batch)

    def _rows_of_batch(self, batch: pa.RecordBatch) -> _Rows:
        """The rows of one batch. The source positions and target channels are built by Arrow (string
        joins in C), so Python touches each row once, for its headers; a batch with a null in the
        position's columns takes :meth:`_row` per row (whose rules say what a missing value means)."""
        n = batch.num_rows
        names = batch.schema.names

        def column(name: str) -> pa.Array | None:
            return batch.column(names.index(name)) if name and name in names else None

        def col(name: str) -> list[Any]:
            c = column(name)
            return [None] * n if c is None else c.to_pylist()

        ch, ep, sq, pay = column("channel"), column("epoch"), column("seq"), column("payload")
        if (
            self.idem_column
            or ch is None
            or sq is None
            or ep is None
            or pay is None
            or not pa.types.is_string(ch.type)
            or not pa.types.is_string(ep.type)
            or not pa.types.is_integer(sq.type)
            or not (pa.types.is_binary(pay.type) or pa.types.is_string(pay.type))
            or ch.null_count
            or ep.null_count
            or sq.null_count
            or pay.null_count
        ):
            return _columns(
                map(
                    self._row,
                    col("channel"),
                    col("epoch"),
                    col("seq"),
                    col(self.idem_column),
                    col("payload"),
                    col("headers"),
                    col("tags"),
                    col("content_type"),
                )
            )
        pos = pc.binary_join_element_wise(
            pc.binary_join_element_wise(ch, ep, "#"), pc.cast(sq, pa.string()), ":"
        )
        positions: list[str] = pos.to_pylist()
        keys = positions
        if n and pc.max(pc.utf8_length(pos)).as_py() > _MAX_IDEM:
            keys = [_idem(p) for p in positions]
        if self.channel:
            targets: list[str] = [self._target(self.channel)] * n
        elif self.prefix:
            rest = pc.if_else(pc.equal(ch, "/"), pa.scalar("", ch.type), ch)
            targets = pc.binary_join_element_wise(pa.scalar(self.prefix, ch.type), rest, "").to_pylist()
        else:
            targets = ch.to_pylist()
        if pa.types.is_string(pay.type):
            pay = pay.cast(pa.binary())
        ctypes = [c or "" for c in col("content_type")]
        source = self.source_header
        headers: list[dict[str, str]] = [{source: p} for p in positions] if source else [{} for _ in keys]
        hcol = column("headers")
        if hcol is not None and pa.types.is_map(hcol.type):
            # Only the rows with headers are visited (a map column's to_pylist costs a microsecond a row).
            hkeys, hvalues = hcol.keys.to_pylist(), hcol.items.to_pylist()
            for i, at in _nonempty_lists(hcol):
                headers[i] = _headers(zip(hkeys[at], hvalues[at], strict=True), source, positions[i])
        elif hcol is not None:
            for i, h in enumerate(hcol.to_pylist()):
                if h:
                    headers[i] = _headers(h, source, positions[i])
        tags: list[list[str]] = [[]] * n
        tcol = column("tags")
        if tcol is not None and pa.types.is_list(tcol.type):
            tvalues = tcol.values.to_pylist()
            for i, at in _nonempty_lists(tcol):
                tags[i] = tvalues[at]
        elif tcol is not None:
            tags = [t or [] for t in tcol.to_pylist()]
        return (targets, pay.to_pylist(), keys, ctypes, headers, tags)

    def rows_of_rows(self, rows: Iterable[Row], chunk: int = 1024) -> Iterator[_Rows]:
        it = iter(rows)
        while True:
            part = list(itertools.islice(it, chunk))
            if not part:
                return
            out: list[_Row] = []
            for row in part:
                d = row.asDict()
                out.append(
                    self._row(
                        d.get("channel"),
                        d.get("epoch"),
                        d.get("seq"),
                        d.get(self.idem_column) if self.idem_column else None,
                        d["payload"],
                        d.get("headers"),
                        d.get("tags"),
                        d.get("content_type"),
                    )
                )
            yield _columns(out)

    # -- publishing -----------------------------------------------------------------------------------

    def publish(self, rows: Iterator[_Rows]) -> PublishCommit:
        """Publish every row (called in a Spark task): natively, or over HTTP (see the module docstring)."""
        native = self.native_address or not self.url.startswith("https://")
        if self.transport != "http" and native:
            commit = PublishCommit(transport="native")
            try:
                pub = BulkPublisher(
                    _native_url(self.url, self.native_address),
                    token=self.token or None,
                    window=self.window,
                    keep_acks=False,  # the tallies are all the commit message needs
                    client_name="hubbub-pipeline-sink",
                    retries=self.retries,
                    retry_interval=self.retry_interval,
                )
            except CannotConnect as exc:
                if self.transport == "native" or self.native_address:
                    raise PipelineError(f"hubbub sink: {exc}") from exc
                log.warning("hubbub sink: no native connection (%s); publishing over HTTP instead", exc)
            except HubbubError as exc:
                raise PipelineError(f"hubbub sink: {exc}") from exc
            else:
                return self._publish_native(pub, rows, commit)
        return self._publish_http(rows)

    def _publish_native(
        self, pub: BulkPublisher, rows: Iterator[_Rows], commit: PublishCommit
    ) -> PublishCommit:
        try:
            for channels, payloads, keys, ctypes, headers, tags in rows:
                pub.publish_many(channels, payloads, keys, ctypes, headers, tags)
            pub.flush()
            commit.published, commit.duplicates, commit.channels = pub.published, pub.duplicates, pub.tops
        except HubbubError as exc:
            raise PipelineError(
                str(exc) if str(exc).startswith("publishing") else f"hubbub sink: {exc}"
            ) from exc
        except (OSError, TimeoutError) as exc:
            raise PipelineError(f"hubbub sink: {pub.url}: {exc}") from exc
        finally:
            pub.close()
        return commit

    def _publish_http(self, rows: Iterator[_Rows]) -> PublishCommit:
        from hubbub.pipeline.sources import HttpPublisher

        pub = HttpPublisher(self.url, self.token, self.retries, self.retry_interval)
        commit = PublishCommit(transport="http")
        try:
            for channel, payload, idem, ctype, headers, tags in itertools.chain.from_iterable(
                zip(*cols, strict=True) for cols in rows
            ):
                res = pub.publish(channel, payload, idem=idem, content_type=ctype, headers=headers, tags=tags)
                commit.count(res.channel, res.seq, res.duplicate)
        finally:
            pub.close()
        return commit


class HubbubWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.p = _Publishing(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishCommit:
        return self.p.publish(self.p.rows_of_batches(iterator))


# The streaming Arrow writer came with PySpark 4.1; before it, streaming writes get Rows.
_StreamBase: type = getattr(_ds, "DataSourceStreamArrowWriter", DataSourceStreamWriter)
_STREAM_ARROW = _StreamBase is not DataSourceStreamWriter


class HubbubStreamWriter(_StreamBase):  # type: ignore[misc]
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.p = _Publishing(options, schema)
        if self.p.order and not _STREAM_ARROW:
            raise PipelineError("hubbub sink: orderBy in a streaming write needs PySpark 4.1 or later")

    def write(self, iterator: Iterator[Any]) -> PublishCommit:
        rows = self.p.rows_of_batches(iterator) if _STREAM_ARROW else self.p.rows_of_rows(iterator)
        return self.p.publish(rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
