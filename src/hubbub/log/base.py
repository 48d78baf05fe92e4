"""The log's interface, split by role, and ``LogStore``, all the roles that every log engine implements.

* :class:`EventLog`: append a batch, a channel's head, reads in channel (``seq``) order and in commit
  (``pos``) order: what the writer, replays and live reads use.
* :class:`EpochAdmin`: epochs, trimming, retention, retired epochs and totals.
* :class:`ConsumerJournal`: the durable consumers' journals (filled by ``append``).
* :class:`BulkScan`: the data pipeline's reads of rows and columns, in ``pos`` ranges.
* :class:`StateMaps`: small named maps kept beside the events, one for every process writing the log (MQTT's
  retained index and sessions, the push connectors' routes: ``hubbub.log.routes``).

A caller takes the role it uses (a view of the log, such as a cluster node's, implements only the role it
changes). The sequencing rules of ``append`` are one pure planner, ``hubbub.log.sequencing``.

Concurrency contract (every engine):

* ``append``, ``apply_retention``, ``trim``, ``reset_channel``, ``new_epochs_on_open``,
  ``commits_may_be_lost``, ``consumer_create``, ``consumer_delete``, ``consumer_settle``, ``state_set``,
  ``state_swap`` and ``close`` are
  called from **one writer thread** only (core owns it). They are never called concurrently with each other.
* Every read method (``head``, ``heads``, ``read``, ``read_runs``, ``read_rows``, ``read_last``, ``channels``,
  ``retired_epochs``, ``top_time``, ``stats``, ``scan_plan``, ``scan_columns``, ``consumers``,
  ``consumer_items``, ``state_get``, ``state_list``) may be called from any thread,
  concurrently with the writer and with each other. Reads see only committed data.
* No method is ever called on the event loop thread, except ``append`` of an engine that sets
  ``inline_append`` (or of at most ``inline_append_max`` events and ``inline_append_max_bytes`` of
  payload) and ``consumer_settle`` of one that sets ``inline_settle``: core may call them on the loop, never
  concurrently with the other writer methods.

Invariants (checked by ``tests/contract/test_log_stores.py`` against every engine):

* Per channel and epoch, ``seq`` starts at 1 and increases by exactly 1 per appended event.
* ``time_ns`` is assigned by the store at append: ``max(now, last_time + 1)`` over the **whole log**, so it is
  strictly increasing per channel and never lower than any earlier commit.
* A new channel gets a fresh random epoch (``[0-9a-z]{8}``). The epoch changes only through ``reset_channel``
  (or ``new_epochs_on_open``), and then ``seq`` restarts at 1.
* A new epoch deletes nothing. The old epoch's events stay in the store as a **retired epoch** of the
  channel, under their old epoch and seqs: ``stats`` counts them, ``retired_epochs`` lists them, ``read``
  with ``epoch=`` reads them, age and total-size retention and ``trim`` with ``epoch=`` remove them, and a
  retired epoch is gone once its last event is. The per-channel limits (``max_events``, ``max_bytes``) apply
  at appends, so not to retired epochs. ``head``, ``heads``, ``read``, ``read_last`` and ``channels`` see the
  current epoch only.
* Trimming removes the oldest events of a channel; ``first`` moves up, ``top`` and ``epoch`` never change.
* Every event has a **log position** ``pos``: an integer assigned at append, increasing in commit order over
  the whole log (so with ``time_ns``); there may be holes. Every epoch of a channel, current or retired, has
  an integer **epoch id**, never reused. Both exist for the bulk reads of the data pipeline (``scan_plan``,
  ``scan_columns``), which read the log in ``pos`` order.
* Idempotency: an ``AppendRequest`` with an ``idem`` key that repeats ``(user, channel, idem)`` of an event
  appended within ``idem_window_ns`` (by the new commit's time) is not appended again; the result is the
  original event with ``duplicate=True``. This holds across restarts and across new epochs: a retry of a
  publish acknowledged before the channel's epoch changed answers the original event, with its old epoch and
  seq (it is still in the log, and it was delivered when it was committed), instead of appending it again.
"""

from __future__ import annotations

import abc
import secrets
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hubbub.events import Event, Publisher, fast_init, hot_value
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalItem, Retry
from hubbub.log.records import encode_headers, encode_tags

__all__ = [
    "AppendRequest",
    "AppendResult",
    "AppendRun",
    "BulkScan",
    "ChannelInfo",
    "ConsumerInfo",
    "ConsumerJournal",
    "ConsumerSpec",
    "EpochAdmin",
    "EventLog",
    "EventRun",
    "JournalItem",
    "LogMark",
    "LogPage",
    "LogStore",
    "RetentionPolicy",
    "Retry",
    "ScanColumns",
    "ScanPlan",
    "StateMaps",
    "StateWrite",
    "StoreStats",
    "new_epoch",
    "next_state_version",
    "prefix_upper",
    "swapped_state_version",
]

_EPOCH_ALPHABET = string.digits + string.ascii_lowercase


def new_epoch() -> str:
    """A fresh random epoch: 8 characters from ``[0-9a-z]``."""
    return "".join(secrets.choice(_EPOCH_ALPHABET) for _ in range(8))


@hot_value
class AppendRequest:
    """One event to append; the store assigns ``seq``, ``epoch`` and ``time_ns``."""

    channel: str
    publisher: Publisher
    payload: bytes
    content_type: str
    headers: Mapping[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    idem: str = ""


@hot_value
class AppendRun:
    """Consecutive events of one publisher to one channel with one content type and nothing else (no
    headers, tags or idempotency key): one connection's burst, appended as one request instead of an
    :class:`AppendRequest` per event, to an engine that ``takes_runs`` (:attr:`EventLog.takes_runs`; core
    hands any other one :meth:`requests`). Its events get consecutive seqs and times, and the append
    returns one :class:`AppendResult` per event, in order, as for the requests it stands for.
    ``payloads`` is never empty.

    The class attributes below are those of every request it stands for, so that code reading a batch's
    keys, headers or tags reads a run's too."""

    channel: str
    publisher: Publisher
    content_type: str
    payloads: list[bytes]

    headers: ClassVar[Mapping[str, str]] = {}
    tags: ClassVar[tuple[str, ...]] = ()
    idem: ClassVar[str] = ""

    def requests(self) -> list[AppendRequest]:
        """The run as one request per event."""
        ch, pub, ctype = self.channel, self.publisher, self.content_type
        return [AppendRequest(ch, pub, p, ctype) for p in self.payloads]


@hot_value
class AppendResult:
    """``journal``: the ``(consumer id, journal pos)`` of every durable consumer this event was journaled for
    in the same transaction (``hubbub.log.consumers``); empty for a duplicate."""

    event: Event
    duplicate: bool = False
    journal: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class LogMark:
    """A point in the whole log's commit order (:meth:`LogStore.log_mark`): every event committed up to it has
    ``pos <= pos`` and ``time_ns <= time_ns``, every later one a greater ``time_ns`` (``time_ns`` strictly
    increases over the whole log, so a mark is also a snapshot of every channel's head at once)."""

    pos: int
    time_ns: int


@dataclass(frozen=True, slots=True)
class LogPage:
    """One page of :meth:`LogStore.read_log`: ``events`` in commit order (reversed when read backwards),
    ``pos``, the log position of the last one (where the next page starts, exclusive), and ``full``: the
    page reached the read's byte budget (``max_bytes``), so events may follow although it holds fewer than
    ``limit``."""

    events: list[Event]
    pos: int
    full: bool = False


@fast_init
@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """A channel's position. ``first`` is the oldest retained seq (``top + 1`` when all are trimmed)."""

    channel: str
    epoch: str
    first: int
    top: int
    top_time: int

    @property
    def empty(self) -> bool:
        return self.epoch == ""


@dataclass(frozen=True, slots=True)
class EventRun:
    """Consecutive events of one channel that differ only in ``seq``, ``time_ns`` and ``payload``: the bulk
    form of :meth:`LogStore.read_runs`, which builds no :class:`Event` per event.

    ``proto`` is the run's first event. Event ``i`` of the run is ``proto`` with ``seq = proto.seq + i``,
    ``time_ns = rows[i][0]`` and ``payload = rows[i][1]``; every other field (channel, epoch, publisher,
    content type, headers, tags) is ``proto``'s. ``rows`` is never empty and ``rows[0]`` is ``proto``'s own.
    """

    proto: Event
    rows: Sequence[tuple[int, bytes]]

    @property
    def last_seq(self) -> int:
        return self.proto.seq + len(self.rows) - 1

    def events(self) -> list[Event]:
        """The run as events (for consumers that need them one by one)."""
        p = self.proto
        ch, epoch, pub, ctype = p.channel, p.epoch, p.publisher, p.content_type
        headers, tags = p.headers, p.tags
        return [
            Event(ch, seq, epoch, t, pub, payload, ctype, headers, tags)
            for seq, (t, payload) in enumerate(self.rows, p.seq)
        ]


def prefix_upper(prefix: str) -> str | None:
    """The smallest string greater than every string that starts with ``prefix`` (None: there is none)."""
    chars = list(prefix)
    while chars:
        c = ord(chars.pop()) + 1
        if c == 0xD800:  # skip the surrogates: they are not text
            c = 0xE000
        if c <= 0x10FFFF:
            return "".join(chars) + chr(c)
    return None


def same_but_position(a: Event, b: Event) -> bool:
    """Whether two events of one channel may share an :class:`EventRun` (everything but seq, time and payload
    equal). A commit's events of one burst share their ``Publisher`` object, whose dataclass equality (two
    tuples built and compared) costs more than the rest: identity is looked at first (bench/RESULTS.md,
    runs_of of a 256-event stretch: 0.28 → 0.16 µs per event)."""
    return (
        a.epoch == b.epoch
        and (a.publisher is b.publisher or a.publisher == b.publisher)
        and a.content_type == b.content_type
        and a.headers == b.headers
        and a.tags == b.tags
    )


def runs_of(events: Iterable[Event]) -> list[EventRun]:
    """Group events of one channel, in seq order, into runs (see :class:`EventRun`)."""
    out: list[EventRun] = []
    prev: Event | None = None
    rows: list[tuple[int, bytes]] = []
    for e in events:
        if prev is not None and e.seq == prev.seq + 1 and same_but_position(prev, e):
            rows.append((e.time_ns, e.payload))
        else:
            rows = [(e.time_ns, e.payload)]
            out.append(EventRun(e, rows))
        prev = e
    return out


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """``0`` means unlimited. ``max_events``/``max_bytes`` apply per channel at every append;
    ``max_age_s``/``max_total_bytes`` apply when ``apply_retention`` runs."""

    max_age_s: int = 0
    max_events: int = 0
    max_bytes: int = 0
    max_total_bytes: int = 0


@dataclass(frozen=True, slots=True)
class StoreStats:
    """``events`` and ``bytes``: every retained event, retired epochs included. ``channels``: channels whose
    current epoch holds events (as :meth:`LogStore.channels` lists them). ``retired_epochs``: retired epochs
    holding events."""

    events: int
    bytes: int
    channels: int
    retired_epochs: int = 0


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """What :meth:`LogStore.scan_plan` found in one snapshot.

    ``splits``: ascending ``pos`` boundaries; piece ``i`` is ``splits[i] <= pos < splits[i + 1]`` (empty when
    no event is in range). ``max_time``: the newest event's time in that snapshot; a scan bounded by it sees
    no later commit. ``channels``: epoch id -> head, for every epoch holding events, current or retired
    (a channel with retired epochs has several ids, each with its own epoch). ``events`` and ``bytes``: the
    log's totals (for sizing reads). ``retired``: the ids of ``channels`` that are retired epochs."""

    splits: tuple[int, ...]
    max_time: int
    channels: dict[int, ChannelInfo]
    events: int
    bytes: int
    retired: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class ScanColumns:
    """Events of a ``pos`` range as columns, concatenated: no Python object per event.

    ``channel_id`` (the epoch id), ``seq`` and ``time_ns`` are decimal integers joined with ``,`` (``""`` when
    ``n`` is 0). A variable-length column is ``(lengths, data)``: the byte length of every value joined with
    ``,`` and the values' bytes concatenated (text as UTF-8; ``headers`` and ``tags`` in the column codec of
    :mod:`hubbub.log.records`). ``text`` holds the five text columns (``publisher_dialect``,
    ``publisher_user``, ``publisher_app``, ``publisher_msg_id``, ``content_type``), together either one
    ``str`` each (every row has that value, as is usual) or ``(lengths, data)`` each."""

    n: int
    channel_id: str
    seq: str
    time_ns: str
    text: tuple[str, ...] | tuple[tuple[str, bytes], ...]
    headers: tuple[str, bytes]
    tags: tuple[str, bytes]
    payload: tuple[str, bytes]


#: A row of :meth:`BulkScan.read_rows`: ``(seq, time_ns, publisher_dialect, publisher_user, publisher_app,
#: publisher_msg_id, content_type, headers, tags, payload)``, headers and tags in the column codec.
Row = tuple[Any, ...]


class EventLog(abc.ABC):
    """The event log proper: append a batch, a channel's head, reads of a channel in ``seq`` order and of the
    whole log in commit (``pos``) order. What the writer, the replays and the live reads use."""

    #: Name of the engine, for logs and metrics.
    engine: str = ""
    #: Whether the store was opened as a reader only (its writer methods raise ``StorageError``).
    readonly: bool = False
    #: Whether ``append`` is cheap and never waits on I/O (no disk, no network), so that core may run it on
    #: the event loop thread instead of handing it to the writer thread (see ``hubbub.core.writer``).
    inline_append: bool = False
    #: Below ``inline_append``: an ``append`` of at most this many events is cheap enough, and waits on no
    #: I/O beyond the page cache (no fsync, no network), for core to run it on the event loop thread while
    #: the writer is idle (0: never). A small commit then costs no thread hand-offs, and what arrives while it
    #: runs goes into the next one (``hubbub.core.batcher``).
    inline_append_max: int = 0
    #: With ``inline_append_max``: the most payload bytes such an append may hold (a few large events, say
    #: 64 of 1 MiB, would hold the loop, and every connection on it, for their whole commit).
    inline_append_max_bytes: int = 0
    #: Whether ``append`` also takes :class:`AppendRun` entries in its batch (each standing for the requests
    #: of its :meth:`~AppendRun.requests`, and answered with one result per event). Core gives an engine that
    #: does not only requests; ``inline_append_max`` counts events either way.
    takes_runs: bool = False

    @abc.abstractmethod
    def append(self, batch: Sequence[AppendRequest]) -> list[AppendResult]:
        """Append a batch in **one transaction** and return one result per request, in order (an engine
        that ``takes_runs`` declares ``Sequence[AppendRequest | AppendRun]``: one result per event).

        Within the batch, requests for the same channel get consecutive seqs in request order. When this
        returns, the batch is committed (and, with ``durability=fsync``, synced to stable storage).
        Raises ``hubbub.errors.StorageError`` if the commit fails; then nothing of the batch is visible.
        """

    @abc.abstractmethod
    def head(self, channel: str) -> ChannelInfo:
        """The channel's position. A channel that never had an event: epoch ``""``, first 0, top 0."""

    def heads(self, channels: Iterable[str]) -> dict[str, ChannelInfo]:
        """The positions of several channels (unknown ones as :meth:`head` gives them). Engines override this
        to read them all from one snapshot; this default calls :meth:`head` per channel."""
        return {ch: self.head(ch) for ch in channels}

    @abc.abstractmethod
    def read(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        epoch: str | None = None,
    ) -> list[Event]:
        """Events of the channel's current epoch with ``seq > after_seq`` and
        ``from_time <= time_ns < to_time`` (when given), oldest first, at most ``limit``. ``epoch``: read that
        epoch instead, the current one or a retired one (none: no events)."""

    def read_runs(
        self, channel: str, after_seq: int, up_to_seq: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[EventRun]:
        """The events of :meth:`read` with ``after_seq < seq <= up_to_seq`` (at most ``limit``, oldest first),
        grouped in runs (:class:`EventRun`), all from one snapshot: the bulk read of a replay.

        ``max_bytes``, when given, bounds the page's payload bytes as ``limit`` bounds its events: the page
        ends with the event that brings its payloads to ``max_bytes`` or more (so it holds at least one event
        whatever its size), and the caller goes on after the last seq it got.

        The runs hold consecutive seqs of the channel's current epoch; their ``proto`` events carry that
        epoch, so a caller that pages through a channel notices a reset between two calls. This default groups
        :meth:`read`'s events; engines override it to skip building an event per row."""
        if up_to_seq <= after_seq or limit <= 0:
            return []
        events = [
            e for e in self.read(channel, after_seq, min(limit, up_to_seq - after_seq)) if e.seq <= up_to_seq
        ]
        if max_bytes is not None:
            size = 0
            for i, e in enumerate(events):
                size += len(e.payload)
                if size >= max_bytes:
                    del events[i + 1 :]
                    break
        return runs_of(events)

    @abc.abstractmethod
    def read_last(self, channel: str, n: int) -> list[Event]:
        """The last ``n`` retained events of the channel, oldest first."""

    @abc.abstractmethod
    def channels(
        self, after: str = "", limit: int = 1000, prefix: str = "", *, include_empty: bool = False
    ) -> list[ChannelInfo]:
        """Channels holding at least one retained event, in byte order of the canonical path (UTF-8),
        starting strictly after ``after``, at most ``limit``. ``prefix``, when given, keeps only channels
        whose path starts with it (a cheap pre-filter for patterns).

        ``include_empty``: also the channels whose current epoch holds no event (trimmed or aged out to
        nothing, or reset and not published to since), each with its position (``first = top + 1``, the low
        water mark): a reader that starts now knows where such a channel goes on, so its next event is not
        taken for the first of a new channel with the earlier ones lost."""

    @abc.abstractmethod
    def top_time(self) -> int:
        """``time_ns`` of the newest committed event in the whole log, 0 when empty. It is kept when that
        event is later trimmed or its channel reset, so it never goes back (it is 0 only for a log that never
        had an event)."""

    @abc.abstractmethod
    def log_mark(self) -> LogMark:
        """The log's newest commit, as a :class:`LogMark` (``LogMark(0, 0)`` for a log that never had an
        event), read in one snapshot: the reads of a pattern's replay run up to it."""

    @abc.abstractmethod
    def log_seek(self, time_ns: int) -> int:
        """A log position ``p`` such that every retained event with ``time_ns >= time_ns`` has ``pos > p``,
        and as high as the engine finds cheaply (at most the position of the last event older than
        ``time_ns``; 0 when none is retained): where a pattern's replay from a time starts reading."""

    @abc.abstractmethod
    def read_log(
        self,
        after_pos: int,
        mark: LogMark,
        limit: int = 1000,
        prefix: str = "",
        *,
        reverse: bool = False,
        max_bytes: int | None = None,
    ) -> LogPage:
        """The events of every channel's **current** epoch whose path starts with ``prefix``, with
        ``after_pos < pos <= mark.pos`` and ``time_ns <= mark.time_ns``, in commit (``pos``) order, at most
        ``limit``, from one snapshot: a pattern's replay, read a page at a time whatever the number of
        channels. ``reverse``: the last ``limit`` of them, newest first (``after_pos`` still the exclusive
        lower bound; page backwards with ``mark`` moved below the page's ``pos``). A page shorter than
        ``limit`` ends the range, unless it is ``full``: ``max_bytes``, when given, bounds a page's payload
        bytes as ``limit`` bounds its events (the page ends with the event that brings its payloads to
        ``max_bytes`` or more, so it holds at least one event whatever its size, and is ``full``): a page of
        large events holds a bounded number of bytes, not ``limit`` times the largest event. Events of
        retired epochs are left out (a channel reset between two pages
        loses its earlier events from the later pages: the caller checks each channel's continuity)."""

    def count_log(
        self,
        after_pos: int,
        mark: LogMark,
        prefix: str = "",
        *,
        from_time: int = 0,
        channel: str | None = None,
    ) -> tuple[int, int]:
        """How many events :meth:`read_log` gives from ``after_pos`` up to ``mark`` under ``prefix`` (or of
        ``channel`` alone, when given) with ``time_ns >= from_time``, and how many of those carry headers,
        from one snapshot: a count announced before the events (guble's fetch) without reading them. This
        default reads them (:meth:`read_log`); engines override it to count rows without building events."""
        total = marked = 0
        after = after_pos
        while True:
            page = self.read_log(after, mark, 2048, channel if channel is not None else prefix)
            for e in page.events:
                if e.time_ns >= from_time and (channel is None or e.channel == channel):
                    total += 1
                    marked += bool(e.headers)
            if len(page.events) < 2048:
                return total, marked
            after = page.pos

    def log_census(
        self, after_pos: int, mark: LogMark, prefix: str = "", *, from_time: int = 0
    ) -> dict[str, tuple[str, int, int]]:
        """Of each channel whose events :meth:`read_log` gives from ``after_pos`` up to ``mark`` under
        ``prefix`` with ``time_ns >= from_time``: ``(epoch, first seq, last seq)`` of those events, from one
        snapshot. What a replay of that range must find, channel by channel, so that one whose events are
        trimmed or reset away while it runs is told (:func:`hubbub.core.replay.census_gaps`). This default
        reads the events (:meth:`read_log`); engines override it to group the rows without building events."""
        out: dict[str, tuple[str, int, int]] = {}
        after = after_pos
        while True:
            page = self.read_log(after, mark, 2048, prefix)
            for e in page.events:
                if e.time_ns >= from_time:
                    had = out.get(e.channel)
                    out[e.channel] = (e.epoch, had[1] if had else e.seq, e.seq)
            if len(page.events) < 2048:
                return out
            after = page.pos

    def delivered(self, wanted: Sequence[tuple[str, str, int]]) -> list[int]:
        """Of each ``(channel, epoch, seq)``, up to which seq (at most ``seq``) the node reading through this
        store has delivered that epoch live. A store one node writes commits and delivers in one order, so
        this default gives each ``seq`` back; a cluster node's view (``hubbub.cluster.view``) caps it at what
        the node has released, so a replay leaves the rest to the live stream."""
        return [seq for _, _, seq in wanted]


class EpochAdmin(abc.ABC):
    """Epochs, trimming and retention: the administration of what the log keeps. Writer-thread methods but for
    :meth:`retired_epochs` and :meth:`stats`."""

    @abc.abstractmethod
    def reset_channel(self, channel: str) -> ChannelInfo:
        """Start a new epoch for the channel (seq restarts at 1); its events stay, as a retired epoch (see
        the module docstring). Returns the new head (``top`` 0, ``first`` 1, the new epoch). A channel that
        never had an event is created with a new epoch."""

    @abc.abstractmethod
    def new_epochs_on_open(self) -> None:
        """Give every channel a new epoch, as :meth:`reset_channel` does (``durability=none`` restarts)."""

    @abc.abstractmethod
    def commits_may_be_lost(self, channel: str, epoch: str) -> bool:
        """Whether the channel's current epoch is ``epoch`` and commits of it may have been lost: only then
        is a client position beyond its top evidence of lost commits (native.md §6 ``ahead``) rather than a
        client's error. A **writer-thread** method, so the caller can decide and reset in one call."""

    @abc.abstractmethod
    def retired_epochs(self, channel: str) -> list[ChannelInfo]:
        """The channel's retired epochs that still hold events, oldest first, each with its own ``epoch``,
        ``first``, ``top`` and ``top_time`` (admin tools; read them with ``read(…, epoch=…)``)."""

    @abc.abstractmethod
    def trim(self, channel: str, up_to_seq: int, *, epoch: str | None = None) -> ChannelInfo:
        """Remove the channel's events with ``seq <= up_to_seq``; returns the new head. A **writer-thread**
        method (like :meth:`append`): never called concurrently with the other writer methods. ``epoch``, when
        it names a retired epoch of the channel, trims that one instead (and returns its head; it is gone once
        empty); an ``epoch`` that is neither the current one nor a retired one holding events raises
        :class:`hubbub.errors.TrimEpochGone` (carrying the channel's current head).

        ``first`` moves up to ``up_to_seq + 1`` (never down: trimming what is already gone changes nothing, so
        a repeated call is a no-op); ``top``, ``top_time`` and ``epoch`` never change; :meth:`stats` counts
        the remaining events and bytes. ``up_to_seq == top`` trims every event (``first`` becomes
        ``top + 1``). Raises :class:`hubbub.errors.TrimOutOfRange` when ``up_to_seq`` is negative or beyond
        the top of the epoch trimmed (an unknown channel has top 0). Both errors are
        :class:`hubbub.errors.TrimError`; the log is unchanged then.
        """

    @abc.abstractmethod
    def apply_retention(self, policy: RetentionPolicy, now_ns: int) -> int:
        """Trim by age and by total size. Returns the number of events removed."""

    @abc.abstractmethod
    def stats(self) -> StoreStats:
        """Retained events, their bytes (payload + header + tag bytes, as ``Event.size``), channels."""


class ConsumerJournal(abc.ABC):
    """The durable consumers' journals (``hubbub.log.consumers``): filled by :meth:`EventLog.append` in the
    same transaction, read and settled here."""

    #: Whether ``consumer_settle`` is cheap and never waits on I/O beyond the page cache (no fsync, no
    #: network), so that core may run it on the event loop thread while the writer is idle: an ack is then
    #: stored without the two thread hand-offs of a writer round trip (``hubbub.core.consumer_delivery``).
    inline_settle: bool = False
    #: Whether other processes write the same log (several nodes on one database): then a consumer's journal
    #: also grows by commits this process never sees, so its readers learn of them by reading, not only from
    #: their own commits (``hubbub.core.consumers``). Journal positions stay allocated in commit order.
    shared: bool = False

    @abc.abstractmethod
    def consumer_create(self, spec: ConsumerSpec) -> tuple[ConsumerInfo, bool]:
        """Create the consumer ``spec.name`` unless it exists; returns its info and whether it was created
        (an existing one keeps its own spec). Every later append journals for it. A **writer-thread**
        method. Raises ``BadChannel``/``BadRequest`` for a filter that cannot be read (nothing created)."""

    @abc.abstractmethod
    def consumer_delete(self, name: str, consumer_id: int | None = None) -> bool:
        """Delete the consumer ``name`` and its journal; whether it existed. With ``consumer_id``, only
        that consumer: a consumer of the same name with another id (created after it was deleted) is kept,
        and the answer is False, all in one transaction, so that a caller checked against one consumer
        never deletes another. A **writer-thread** method."""

    @abc.abstractmethod
    def consumer_settle(
        self, acked: Sequence[tuple[int, Sequence[int]]], retried: Sequence[Retry] = ()
    ) -> None:
        """In one transaction: remove the acknowledged items (``(consumer id, positions)``), and give back
        the ``retried`` ones (attempts + 1, ``not_before_ns``). Unknown consumers and positions are passed
        over (an item acknowledged twice, a consumer deleted meanwhile). Durable when it returns, as an
        append is. A **writer-thread** method."""

    @abc.abstractmethod
    def consumers(self) -> list[ConsumerInfo]:
        """Every consumer, by name."""

    @abc.abstractmethod
    def consumer_items(self, consumer_id: int, after_pos: int = 0, limit: int = 1000) -> list[JournalItem]:
        """The consumer's unacknowledged items with ``pos > after_pos``, by position, at most ``limit``."""

    def consumer_hold(self, consumer_id: int, take: bool = True) -> bool:
        """Take (``take``) or give back this store's hold of a consumer among the stores sharing the log
        (``shared``): at most one holds a consumer at a time, so one node hands out its items. True when held
        (or given back), False when another store holds it. A hold ends with its store or its process; taking
        it again while held stacks (give it back as often). An engine no other process writes holds always."""
        return True


class BulkScan(abc.ABC):
    """The data pipeline's bulk reads: a channel's rows without events, and the whole log planned into
    ``pos`` ranges and read as columns, each in one snapshot."""

    @abc.abstractmethod
    def read_rows(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        compact_text: bool = False,
        epoch: str | None = None,
    ) -> tuple[str, list[Row]]:
        """:meth:`read` without building events, for bulk readers (the data pipeline): ``(epoch, rows)`` from
        one snapshot, each row ``(seq, time_ns, publisher_dialect, publisher_user, publisher_app,
        publisher_msg_id, content_type, headers, tags, payload)`` with ``headers`` and ``tags`` in the column
        codec of :mod:`hubbub.log.records`. An unknown channel gives ``("", [])``.

        ``compact_text``: in every row but the first, each of the five text columns (``publisher_*`` and
        ``content_type``) is ``None`` where it equals the first row's value.

        ``epoch``: read that epoch of the channel, current or retired (``("", [])`` when the channel has no
        such epoch holding events)."""

    @abc.abstractmethod
    def scan_plan(self, size: int, from_time: int | None = None, to_time: int | None = None) -> ScanPlan:
        """Plan a bulk read of the whole log in ``pos`` order (see :class:`ScanPlan`), from one snapshot.
        Each piece holds ``size`` events (the last one at most ``size``) with ``from_time <= time_ns <
        to_time``: ``time_ns`` increases with ``pos``, so the time range is a ``pos`` range. For bulk readers
        (the data pipeline), with :meth:`scan_columns`."""

    @abc.abstractmethod
    def scan_columns(
        self,
        lo_pos: int,
        hi_pos: int,
        *,
        max_time: int,
        bounds: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[ScanColumns]:
        """The events with ``lo_pos <= pos < hi_pos`` and ``time_ns <= max_time``, in ``pos`` order, as
        columns (:class:`ScanColumns`), read in one snapshot. ``bounds``: only these ``(epoch id, lowest seq,
        highest seq)``. Usually one piece; an engine may split a range it cannot return at once (pieces in
        ``pos`` order); an empty range gives no piece."""


class StateMaps(abc.ABC):
    """Small named maps kept in the log's own storage, beside the events: state of a dialect that every
    process writing the log must see alike (the workers of a node on one SQLite file, the nodes of a cluster
    on one PostgreSQL database), such as MQTT's retained index and its persistent sessions' filters, and the
    push connectors' routes (``hubbub.log.routes``).

    A map is a namespace ``ns``; each entry is a key, a text value and a **version**, an integer that only
    grows. :meth:`state_set` with a version writes only over an older one (or none), so that writers racing
    in any order end with the newest (a value stamped with its event's ``time_ns``, which increases over the
    whole log); without one it writes whatever is there, one version up. A removal (value None) stays as a
    tombstone holding its version, so that an older write arriving late cannot bring the entry back; readers
    do not see tombstones. A map is meant for entries counted in thousands, not millions: each entry is a row
    (SQLite, PostgreSQL) or a dict item (memory); nothing expires them."""

    @abc.abstractmethod
    def state_get(self, ns: str, key: str) -> tuple[str | None, int] | None:
        """The entry's value (None: removed) and version; None when the map never had the key."""

    @abc.abstractmethod
    def state_list(self, ns: str, prefix: str = "") -> list[tuple[str, str]]:
        """The entries of ``ns`` whose key starts with ``prefix`` and whose value is not removed, as
        ``(key, value)`` in key order (code points; UTF-8 byte order is the same), from one snapshot."""

    def state_set(self, ns: str, key: str, value: str | None, version: int | None = None) -> int | None:
        """Set the entry (``value`` None: remove it) and return the version it has now; with ``version``,
        only when the entry is absent or its version is lower (None returned when it is not). Without,
        the entry's version plus one (1 for a new entry). A **writer-thread** method, durable when it
        returns as an append is."""
        return self.state_write(ns, key, value, StateWrite(version=version))

    def state_swap(self, ns: str, key: str, value: str | None, expect: int) -> int | None:
        """Set the entry (``value`` None: remove it) only when its version is ``expect`` now (0: the map
        never had the key; a removed entry keeps its version): the version it has now (``expect + 1``), or
        None when the entry's version is another. Checked and written in one transaction, so of the stores of
        one log swapping from the same version at once exactly one succeeds: insert-if-absent is a swap from
        the version :meth:`state_get` gave (0 for None) when its value is None. A **writer-thread** method,
        durable when it returns as an append is."""
        return self.state_write(ns, key, value, StateWrite(expect=expect))

    @abc.abstractmethod
    def state_write(self, ns: str, key: str, value: str | None, how: StateWrite) -> int | None:
        """The write of :meth:`state_set` and :meth:`state_swap`, which each engine implements once: in one
        transaction, read the entry's stored version, take ``how.next(stored)`` (None: not written, and None
        returned) and store the value with it."""


def next_state_version(stored: int | None, version: int | None) -> int | None:
    """The rule of :meth:`StateMaps.state_set`, which every engine applies in its own transaction: the
    version an entry whose version is ``stored`` (None: absent) gets from a write with ``version``, or None
    when that write is refused."""
    if version is None:
        return 1 if stored is None else stored + 1
    if stored is not None and stored >= version:
        return None
    return version


def swapped_state_version(stored: int | None, expect: int) -> int | None:
    """The rule of :meth:`StateMaps.state_swap`, which every engine applies in its own transaction: the
    version an entry whose version is ``stored`` (None: absent) gets from a swap from ``expect``, or None
    when that swap is refused."""
    return expect + 1 if (stored or 0) == expect else None


@dataclass(frozen=True, slots=True)
class StateWrite:
    """How a state map write picks an entry's new version from its stored one: :meth:`StateMaps.state_set`'s
    rule with ``version`` (None: one up), or :meth:`StateMaps.state_swap`'s with ``expect``. A value, so a
    worker's store sends it to the log owner as it is."""

    version: int | None = None
    expect: int | None = None

    def next(self, stored: int | None) -> int | None:
        """The entry's new version, or None when the write is refused."""
        if self.expect is not None:
            return swapped_state_version(stored, self.expect)
        return next_state_version(stored, self.version)


class LogStore(EventLog, EpochAdmin, ConsumerJournal, BulkScan, StateMaps):
    """A durable, per-channel sequenced event log: every role at once, as each engine implements it. See the
    module docstring for the contract; callers that use one role take that role's type."""

    def read_rows(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        compact_text: bool = False,
        epoch: str | None = None,
    ) -> tuple[str, list[Row]]:
        """:meth:`BulkScan.read_rows` from :meth:`read`, :meth:`head` and :meth:`retired_epochs` (so not one
        snapshot); engines override it to read rows in one."""
        events = self.read(channel, after_seq, limit, from_time, to_time, epoch=epoch)
        if events:
            cur = events[0].epoch
        elif epoch is None:
            cur = self.head(channel).epoch
        else:
            known = [self.head(channel), *self.retired_epochs(channel)]
            cur = epoch if any(ci.epoch == epoch for ci in known if ci.epoch) else ""
        rows: list[Row] = []
        first: tuple[str, ...] = ()
        for e in events:
            p = e.publisher
            text: tuple[str | None, ...] = (p.dialect, p.user, p.app, p.msg_id, e.content_type)
            if compact_text:
                if not rows:
                    first = (p.dialect, p.user, p.app, p.msg_id, e.content_type)
                else:
                    text = tuple(None if v == f else v for v, f in zip(text, first, strict=True))
            rows.append((e.seq, e.time_ns, *text, encode_headers(e.headers), encode_tags(e.tags), e.payload))
        return cur, rows

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release everything. Idempotent."""
