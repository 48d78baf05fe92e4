"""The Spark data source ``hubbub`` (PySpark 4 Python Data Source API): batch and streaming read and write.

Read::

    spark.read.format("hubbub").option("url", "http://127.0.0.1:8080").option("channels", "/chat/**").load()
    spark.read.format("hubbub").option("url", "sqlite:///var/lib/hubbub/hubbub.db").load()
    spark.readStream.format("hubbub").option("url", …).option("startingOffsets", "earliest").load()

Write (publishes each row; ``channel`` and ``payload`` columns, optional ``content_type``, ``headers``,
``tags``; the idempotency key from ``idemColumn`` or from the row's source position)::

    df.write.format("hubbub").option("url", "http://127.0.0.1:8080").mode("append").save()

The schema is the log's record schema, :data:`hubbub.log.records.SPARK_DDL` (docs/pipeline.md). There is
no ``pushFilters``: ranges are options (``startSeq``, ``endSeq``, ``startTime``, ``endTime``,
``startingOffsets``). Options are documented in docs/pipeline.md.

The class Spark knows the format by, :class:`HubbubDataSource`, is :mod:`hubbub.pipeline.entry`'s (which
PySpark imports in every session) and re-exported here; this module has its readers.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from hubbub.channels import parse_pattern
from hubbub.errors import DataLossError, PipelineError  # DataLossError: also importable from here
from hubbub.log import ChannelInfo, LogStore
from hubbub.log.records import RECORD_SCHEMA, SPARK_DDL
from hubbub.pipeline.arrow import batch_from_columns
from hubbub.pipeline.entry import HubbubDataSource
from hubbub.pipeline.options import (
    DEFAULT_RETRIES,
    DEFAULT_RETRY_INTERVAL_MS,
    SOURCE_OPTIONS,
    Offsets,
    Scope,
    parse_options,
)
from hubbub.pipeline.sink import SOURCE_HEADER, WRITE_OPTIONS, PublishCommit, position_key
from hubbub.pipeline.sources import LogSource, StoreSource, open_source

log = logging.getLogger("hubbub.pipeline")

__all__ = [
    "SOURCE_HEADER",
    "WRITE_OPTIONS",
    "DataLossError",
    "HubbubDataSource",
    "PublishCommit",
    "position_key",
]


#: The record schema as Spark writes a type without nullability (``DataType.simpleString()``).
_RECORD_SHAPE = (
    "struct<" + ",".join(f"{c.name}:{c.spark.lower().replace(' ', '')}" for c in RECORD_SCHEMA) + ">"
)


def check_schema(schema: StructType) -> None:
    """A user schema (``.schema(...)``) must be the record schema (nullability aside): the source returns
    exactly those columns, so anything else would only fail once the query runs."""
    if schema.simpleString() != _RECORD_SHAPE:
        raise PipelineError(
            "hubbub: the source's schema is the log's record schema and cannot be changed; leave out "
            f".schema(...) or give exactly {SPARK_DDL} (got {schema.simpleString()}); select or cast columns "
            "after load() instead"
        )


@dataclass(frozen=True, slots=True)
class _Range:
    channel: str
    epoch: str
    after: int  # read seq > after …
    hi: int  # … and <= hi


@dataclass(frozen=True)
class HubbubPartition(InputPartition):  # type: ignore[misc]
    """Seq ranges of one or more channels (small channels share a partition)."""

    ranges: tuple[_Range, ...]
    strict: bool = False  # streaming with failOnDataLoss: a trimmed range is an error


@dataclass
class _Options:
    """A read's options, parsed (:data:`hubbub.pipeline.options.SOURCE_OPTIONS`) and checked together."""

    url: str
    token: str
    channels: str
    start_seq: int
    end_seq: int | None
    start_time: int | None
    end_time: int | None
    starting: str | Offsets  # "earliest", "latest", or {channel: {epoch: seq}}
    ending: Offsets | None  # None: up to each channel's top
    partition_size: int
    max_per_trigger: int | None
    fail_on_data_loss: bool
    min_partitions: int = 0
    retries: int = DEFAULT_RETRIES
    retry_interval_ms: int = DEFAULT_RETRY_INTERVAL_MS

    @classmethod
    def parse(cls, options: Mapping[str, str], scope: Scope = "any") -> _Options:
        """``scope``: ``batch`` or ``stream`` refuses the options of the other kind of read."""
        v = parse_options(options, SOURCE_OPTIONS, "source", scope)
        if v["url"] is None:
            raise PipelineError("hubbub: set option url (http://host:port, sqlite:///path or postgresql://…)")
        starting, ending = v["startingOffsets"], v.get("endingOffsets", "latest")
        if scope == "batch" and starting == "latest":
            raise PipelineError(
                "hubbub source: startingOffsets latest reads nothing in a batch read (what arrives from now "
                "on is for a stream); use earliest or a JSON map of positions"
            )
        if scope == "stream" and isinstance(starting, dict):
            several = sorted(ch for ch, eps in starting.items() if len(eps) > 1)
            if several:
                raise PipelineError(
                    f"hubbub source: a stream's startingOffsets give one position per channel ({several[0]} "
                    "has several epochs); a list of positions per channel is for batch reads"
                )
        if scope == "stream" and starting != "earliest" and v["startTime"] is not None:
            raise PipelineError("hubbub source: a stream starts at startingOffsets or at startTime, not both")
        start_seq, end_seq = v.get("startSeq", 1), v.get("endSeq")
        if end_seq is not None and end_seq < start_seq:
            raise PipelineError(f"hubbub source: endSeq {end_seq} is before startSeq {start_seq}")
        start_time, end_time = v["startTime"], v.get("endTime")
        if start_time is not None and end_time is not None and end_time <= start_time:
            raise PipelineError("hubbub source: endTime must be after startTime (endTime is exclusive)")
        return cls(
            url=v["url"],
            token=v["token"],
            channels=v["channels"],
            start_seq=start_seq,
            end_seq=end_seq,
            start_time=start_time,
            end_time=end_time,
            starting=starting,
            ending=ending if isinstance(ending, dict) else None,
            partition_size=v["partitionSize"],
            max_per_trigger=v.get("maxEventsPerTrigger"),
            fail_on_data_loss=v.get("failOnDataLoss", True),
            min_partitions=v["minPartitions"] or 0,
            retries=v["retries"],
            retry_interval_ms=v["retryIntervalMs"],
        )

    def piece_size(self, events: int) -> int:
        """Events per partition for a read of ``events``: ``partitionSize``, smaller where that makes fewer
        than ``minPartitions`` partitions (Kafka's option of that name: big ranges split further)."""
        if self.min_partitions > 1 and events > 0:
            return max(1, min(self.partition_size, math.ceil(events / self.min_partitions)))
        return self.partition_size

    def source(self) -> LogSource:
        return open_source(self.url, self.token, self.retries, self.retry_interval_ms / 1000)


class _BatchRange:
    """The seq range a batch read wants of each channel's epoch, from the options (see docs/pipeline.md)."""

    def __init__(self, o: _Options) -> None:
        self.o = o
        self.starting = o.starting if isinstance(o.starting, dict) else {}
        self.ending = o.ending

    def of(self, ci: ChannelInfo) -> tuple[int, int]:
        """``(after, hi)``: read ``after < seq <= hi`` of the epoch ``ci`` names (nothing when ``hi <=
        after``). Offsets of the channel's other epochs do not apply to it."""
        o = self.o
        after = max(o.start_seq - 1, ci.first - 1)
        prev = self.starting.get(ci.channel, {}).get(ci.epoch)
        if prev is not None:
            after = max(after, prev)
        hi = ci.top if o.end_seq is None else min(ci.top, o.end_seq)
        if self.ending is not None:
            end = self.ending.get(ci.channel, {}).get(ci.epoch)
            hi = 0 if end is None else min(hi, end)
        return after, hi


def _pack(ranges: Sequence[_Range], size: int, strict: bool = False) -> list[HubbubPartition]:
    """Split ranges into pieces of at most ``size`` events, and pack small ones together."""
    out: list[HubbubPartition] = []
    cur: list[_Range] = []
    n = 0
    for r in ranges:
        after = r.after
        while after < r.hi:
            take = min(r.hi - after, size - n)
            cur.append(_Range(r.channel, r.epoch, after, after + take))
            after += take
            n += take
            if n >= size:
                out.append(HubbubPartition(tuple(cur), strict))
                cur, n = [], 0
    if cur:
        out.append(HubbubPartition(tuple(cur), strict))
    return out


@dataclass(frozen=True)
class HubbubScanPartition(InputPartition):  # type: ignore[misc]
    """A commit-order (``pos``) range ``lo <= pos < hi`` of a SQLite store, read by a sequential scan.

    ``channels``: ``(id, path, epoch)`` of every channel the plan saw; ``bounds``: ``(id, first seq, last
    seq)`` of the channels to read, or ``None`` for every event; ``max_time``: the plan's newest event, so
    later commits are not read; ``step``: ``pos`` values per chunk (one Arrow batch each)."""

    lo: int
    hi: int
    max_time: int
    channels: tuple[tuple[int, str, str], ...]
    bounds: tuple[tuple[int, int, int], ...] | None
    step: int


# Chunks of a scan partition: about this many bytes of events each (SQLite concatenates a chunk's columns).
_SCAN_CHUNK_BYTES = 16 << 20
_SCAN_CHUNK_MAX = 65536
# A scan visits every event in its range; one row SQLite skips costs about a twentieth of one read through
# the (channel, seq) index, so scan when the read wants more than this share of the range.
_SCAN_MIN_SHARE = 1 / 16


def _scan_partitions(o: _Options, store: LogStore) -> list[InputPartition] | None:
    """Partitions as ``pos`` ranges when the read wants enough of the log (else ``None``)."""
    size = o.partition_size
    plan = store.scan_plan(size, o.start_time, o.end_time)
    if not plan.splits:
        return [HubbubPartition(())]
    if o.min_partitions > 1 and len(plan.splits) - 1 < o.min_partitions:
        size = o.piece_size(plan.events)  # minPartitions: plan again in smaller pieces
        plan = store.scan_plan(size, o.start_time, o.end_time)
    pat = parse_pattern(o.channels)
    want = _BatchRange(o)
    bounds: list[tuple[int, int, int]] = []
    wanted = 0
    everything = True
    for cid, ci in plan.channels.items():
        if not pat.matches(ci.channel):
            everything = False
            continue
        after, hi = want.of(ci)
        if after >= ci.first or hi < ci.top:
            everything = False
        if hi > after:
            bounds.append((cid, after + 1, hi))
            wanted += hi - after
    if not bounds:
        return [HubbubPartition(())]
    scanned = min(plan.events, (len(plan.splits) - 1) * size)
    # Only a scan reads retired epochs (the index path reads the channels' current epochs, like the HTTP log
    # API): a read that wants one stays a scan, so what it returns does not depend on this choice.
    if wanted < scanned * _SCAN_MIN_SHARE and not any(cid in plan.retired for cid, _, _ in bounds):
        return None
    per_event = plan.bytes / plan.events if plan.events else 1
    step = int(max(256, min(_SCAN_CHUNK_MAX, _SCAN_CHUNK_BYTES / max(per_event, 1))))
    channels = tuple((cid, ci.channel, ci.epoch) for cid, ci in plan.channels.items())
    return [
        HubbubScanPartition(lo, hi, plan.max_time, channels, None if everything else tuple(bounds), step)
        for lo, hi in itertools.pairwise(plan.splits)
    ]


def _read_scan(opts: _Options, part: HubbubScanPartition) -> Iterator[pa.RecordBatch]:
    src = opts.source()
    if not isinstance(src, StoreSource):
        raise PipelineError(f"{opts.url}: a pos-range partition needs a store URL, not a server's")
    names = {cid: (path, epoch) for cid, path, epoch in part.channels}
    at = part.lo
    while at < part.hi:
        end = min(at + part.step, part.hi)
        for cols in src.store.scan_columns(at, end, max_time=part.max_time, bounds=part.bounds):
            yield batch_from_columns(cols, names)
        at = end


def _read_partition(opts: _Options, part: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(part, HubbubScanPartition):
        yield from _read_scan(opts, part)
        return
    src = opts.source()
    for r in part.ranges:
        after = r.after
        while after < r.hi:
            page = src.read(
                r.channel, r.epoch, after, min(src.page_limit, r.hi - after), opts.start_time, opts.end_time
            )
            batch = page.batch
            if batch.num_rows == 0:
                if page.first - 1 > after:
                    if part.strict:
                        raise DataLossError(
                            f"channel {r.channel}: events after seq {after} were trimmed "
                            f"(first is now {page.first}); "
                            "set failOnDataLoss=false to skip them"
                        )
                    _warn_skipped(r.channel, after + 1, min(page.first - 1, r.hi), "trimmed while reading")
                break
            seqs = batch.column(1)
            first_seq = seqs[0].as_py()
            if opts.start_time is None and first_seq != after + 1:
                if part.strict:
                    raise DataLossError(
                        f"channel {r.channel}: events {after + 1}..{first_seq - 1} were trimmed; "
                        "set failOnDataLoss=false to skip them"
                    )
                _warn_skipped(r.channel, after + 1, first_seq - 1, "trimmed while reading")
            last = seqs[-1].as_py()
            if last > r.hi:
                batch = batch.slice(0, batch.num_rows - (last - r.hi))  # seqs have no gaps
                last = r.hi
            yield batch
            after = last


def _warn_skipped(channel: str, lo: int, hi: int, why: str) -> None:
    """failOnDataLoss=false: say what a stream skips (events ``lo..hi`` of ``channel``) instead of nothing."""
    if hi >= lo:
        log.warning(
            "hubbub stream: skipping %d events of %s (seqs %d..%d, %s; failOnDataLoss=false)",
            hi - lo + 1,
            channel,
            lo,
            hi,
            why,
        )


def batch_reader(options: Mapping[str, str], schema: StructType) -> HubbubBatchReader:
    """The batch reader of a source of ``options`` (:meth:`HubbubDataSource.reader`), once ``schema`` is
    found to be the record schema."""
    check_schema(schema)
    return HubbubBatchReader(_Options.parse(options, "batch"))


def stream_reader(options: Mapping[str, str], schema: StructType) -> HubbubStreamReader:
    """The streaming reader of a source of ``options`` (:meth:`HubbubDataSource.streamReader`), once
    ``schema`` is found to be the record schema."""
    check_schema(schema)
    return HubbubStreamReader(_Options.parse(options, "stream"))


class HubbubBatchReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, opts: _Options) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        o = self.opts
        src = o.source()
        if isinstance(src, StoreSource):
            scan = _scan_partitions(o, src.store)
            if scan is not None:
                return scan
        want = _BatchRange(o)
        ranges = []
        for ci in src.channels(o.channels):
            after, hi = want.of(ci)
            if hi > after:
                ranges.append(_Range(ci.channel, ci.epoch, after, hi))
        size = o.piece_size(sum(r.hi - r.after for r in ranges))
        return _pack(ranges, size) or [HubbubPartition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(self.opts, partition)


class HubbubStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Offsets: ``{channel: {"epoch": E, "seq": S}}``, S the last seq read (see docs/pipeline.md)."""

    def __init__(self, opts: _Options) -> None:
        self.opts = opts
        self._target: dict[str, tuple[str, int]] | None = None
        self._last: dict[str, Any] | None = None
        self._report: dict[str, Any] | None = None
        self._skips_seen: set[tuple[str, str, int, str, int]] = set()
        self._skipped_to: dict[tuple[str, str, int], int] = {}  # (channel, epoch, offset): skipped up to
        self._skipped_events = 0
        self._skipped_channels = 0

    def initialOffset(self) -> dict[str, Any]:
        o = self.opts
        src = o.source()
        # Channels trimmed to nothing too, with their positions: a stream that starts after a trim goes on
        # where the channel does, so its next event is not taken for the first of a channel that lost the
        # rest. "earliest" is each channel's first retained event: what was trimmed before the stream
        # started is not a loss for it.
        infos = src.channels(o.channels, include_empty=True)
        if isinstance(o.starting, dict):
            out: dict[str, Any] = {ci.channel: {"epoch": ci.epoch, "seq": ci.first - 1} for ci in infos}
            for ch, eps in o.starting.items():  # one epoch each (checked for a stream)
                for epoch, seq in eps.items():
                    out[ch] = {"epoch": epoch, "seq": seq}
            return out
        if o.starting == "latest":
            return {ci.channel: {"epoch": ci.epoch, "seq": ci.top} for ci in infos}
        out = {}
        for ci in infos:
            seq = ci.first - 1
            if o.start_time is not None:
                page = src.read(ci.channel, ci.epoch, seq, 1, o.start_time, None)
                seq = page.batch.column(1)[0].as_py() - 1 if page.batch.num_rows else ci.top
            out[ci.channel] = {"epoch": ci.epoch, "seq": seq}
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_per_trigger:
            return ReadMaxRows(self.opts.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {
            ci.channel: (ci.epoch, ci.top)
            for ci in self.opts.source().channels(self.opts.channels, include_empty=True)
        }

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        o = self.opts
        if start is None:  # PySpark before 4.2 calls latestOffset() without arguments
            start = self._last if self._last is not None else self.initialOffset()
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end: dict[str, Any] = {ch: dict(v) for ch, v in start.items()}
        wants: list[tuple[str, str, int, int]] = []  # channel, epoch, base seq, available up to
        infos = o.source().channels(o.channels, include_empty=True)
        for ci in infos:
            prev = start.get(ci.channel)
            base = 0
            if prev is not None:
                if prev["epoch"] != ci.epoch:
                    if o.fail_on_data_loss:
                        raise DataLossError(
                            f"channel {ci.channel}: epoch changed from {prev['epoch']} to {ci.epoch} (the "
                            f"channel was reset) after seq {prev['seq']}; "
                            "set failOnDataLoss=false to restart "
                            "it from its new start"
                        )
                    self._skip(ci, prev, 0, f"epoch {prev['epoch']} reset to {ci.epoch}")
                elif prev["seq"] < ci.first - 1:
                    if o.fail_on_data_loss:
                        raise DataLossError(
                            f"channel {ci.channel}: events {prev['seq'] + 1}..{ci.first - 1} were trimmed "
                            "before they were read; set failOnDataLoss=false to skip them"
                        )
                    self._skip(ci, prev, ci.first - 1 - prev["seq"], "trimmed before they were read")
                    base = ci.first - 1
                    # The batch's partitions start after the skip: a task reading from the offset would
                    # find the same events gone and say so a second time.
                    self._skipped_to[(ci.channel, ci.epoch, int(prev["seq"]))] = base
                else:
                    base = prev["seq"]
            top = ci.top
            if self._target is not None:
                tgt = self._target.get(ci.channel)
                top = min(top, tgt[1]) if tgt is not None and tgt[0] == ci.epoch else base
            if prev is None or prev["epoch"] != ci.epoch or top > base:
                wants.append((ci.channel, ci.epoch, base, max(top, base)))
        if budget is not None:
            # Water-filling: every channel with data gets an equal share; unused shares go to the others.
            wants.sort(key=lambda w: w[3] - w[2])
            left = budget
            for i, (ch, ep, base, top) in enumerate(wants):
                share = max(left // (len(wants) - i), 1 if left > 0 else 0)
                take = min(top - base, share)
                left -= take
                end[ch] = {"epoch": ep, "seq": base + take}
        else:
            for ch, ep, _base, top in wants:
                end[ch] = {"epoch": ep, "seq": top}
        self._last = end
        self._report = self._lag(infos, end)
        return end

    def _skip(self, ci: ChannelInfo, prev: Mapping[str, Any], events: int, why: str) -> None:
        """failOnDataLoss=false skips events of ``ci`` after ``prev``: count them and warn, once per skip
        (a trigger with no new data plans from the same start again)."""
        key = (ci.channel, str(prev["epoch"]), int(prev["seq"]), ci.epoch, ci.first)
        if key in self._skips_seen:
            return
        self._skips_seen.add(key)
        self._skipped_channels += 1
        self._skipped_events += events
        if events:
            _warn_skipped(ci.channel, int(prev["seq"]) + 1, int(prev["seq"]) + events, why)
        else:  # the old epoch's last seq is not known once it is reset away
            log.warning(
                "hubbub stream: %s: %s after seq %s; events of the old epoch after it are skipped, the "
                "stream goes on from the new epoch's first event (failOnDataLoss=false)",
                ci.channel,
                why,
                prev["seq"],
            )

    def _lag(self, infos: Sequence[ChannelInfo], end: Mapping[str, Any]) -> dict[str, Any]:
        """What :meth:`reportLatestOffset` shows: each channel's latest position and, past the batch being
        planned (``end``), the events and channels the query is behind, and what it skipped so far."""
        behind = channels = 0
        latest: dict[str, Any] = {}
        for ci in infos:
            latest[ci.channel] = {"epoch": ci.epoch, "seq": ci.top}
            e = end.get(ci.channel)
            done = e["seq"] if e is not None and e["epoch"] == ci.epoch else ci.first - 1
            if ci.top > done:
                behind += ci.top - max(done, ci.first - 1)
                channels += 1
        return {
            "eventsBehind": behind,
            "channelsBehind": channels,
            "eventsSkipped": self._skipped_events,
            "channelsSkipped": self._skipped_channels,
            "channels": latest,
        }

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Lag, in the query's progress (``sources[].latestOffset``): PySpark's Python streaming sources
        cannot fill ``sources[].metrics`` (their JVM side does not report source metrics), so the lag rides
        on the latest offset, which Spark only displays. Called on the driver after :meth:`latestOffset`."""
        return self._report

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = []
        for ch in sorted(end):
            e = end[ch]
            s = start.get(ch)
            after = s["seq"] if s is not None and s["epoch"] == e["epoch"] else 0
            after = self._skipped_to.get((ch, e["epoch"], after), after)
            if e["seq"] > after:
                ranges.append(_Range(ch, e["epoch"], after, e["seq"]))
        size = self.opts.piece_size(sum(r.hi - r.after for r in ranges))
        return _pack(ranges, size, strict=self.opts.fail_on_data_loss)

    def read(self, partition: HubbubPartition) -> Iterator[pa.RecordBatch]:
        # The time range picks the start offsets only: a stream reads every event after them.
        opts = self.opts
        if opts.start_time is not None or opts.end_time is not None:
            opts = _Options(**{**opts.__dict__, "start_time": None, "end_time": None})
        return _read_partition(opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass
