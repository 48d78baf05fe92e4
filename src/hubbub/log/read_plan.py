"""The decisions of the log's reads, made once for every engine: page bounds, byte budgets, runs, scopes.

The read side of an engine runs statements; what they read is decided here, as the append side's
sequencing rules are decided by :mod:`hubbub.log.sequencing`:

* **Pages in channel order** (``read_rows``, ``read_runs``): the seq range a page covers
  (:func:`seq_range`, :func:`run_range`), its end under a byte budget (the page ends with the row that brings
  its payloads to ``max_bytes`` or more, so it holds at least one row whatever its size: found while the page
  is read, :func:`take_upto`, where the engine's cursor steps the store, else first, :func:`budget_end`),
  the binary search of a time in a range whose time increases with its key (:func:`first_at_time`), and the
  grouping of rows into :class:`~hubbub.log.base.EventRun` (:func:`group_runs`, :func:`whole_run`).
* **Pages in commit order** (``read_log``, ``count_log``, ``log_census``): whether a range is empty, the
  range's scope (:class:`LogScope`: pos and time bounds, and the paths it keeps, an exact channel or a
  prefix's bounds, which the engine renders in its SQL), a page's rows under a byte budget
  (:func:`take_upto`, :func:`page_full`) and the census of a range's rows (:func:`census`).
* **The data pipeline's plan** (``scan_plan``): the pieces of a bulk read (:func:`plan_scan`).

Every function is pure: it reads the values an engine hands it, and where a decision needs one more look
at the store (a budget's last row, a probe of a binary search, the next split) the engine hands a function
that runs one statement in the read's own snapshot. Bounds are clamped to a signed 64-bit integer
(:func:`clamp`), what both engines' columns hold, so a caller's bound may be any Python int.

Concurrency: none (no state). Engines call these on their reader threads, inside one snapshot; the
per-row loops (:func:`take_upto`, :func:`group_runs`) are part of a replay's hot path, so they are plain
loops over locals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final, Protocol, TypeAlias, TypeVar

from hubbub.events import Event, hot_value
from hubbub.log.base import ChannelInfo, EventRun, LogMark, ScanPlan, prefix_upper

__all__ = [
    "MAX_INT64",
    "BudgetSums",
    "LogScope",
    "SeqStatements",
    "budget_end",
    "census",
    "channel_rows",
    "channel_runs",
    "clamp",
    "first_at_time",
    "group_runs",
    "log_scope",
    "page_full",
    "path_bounds",
    "plan_scan",
    "run_range",
    "scalar",
    "seq_range",
    "take_upto",
    "whole_run",
]

MAX_INT64: Final = (1 << 63) - 1
_MIN_INT64: Final = -(1 << 63)

R = TypeVar("R", bound=Sequence[Any])
#: An engine's stored event row: ``seq, time_ns``, the publisher's four columns, ``content_type, headers,
#: tags, payload`` (text columns as the engine reads them).
Row = Sequence[Any]


def clamp(n: int) -> int:
    """``n`` within a signed 64-bit integer (callers' bounds may be any Python int)."""
    if _MIN_INT64 <= n <= MAX_INT64:  # the usual case, a third of min(max()) (a few per page)
        return n
    return _MIN_INT64 if n < 0 else MAX_INT64


# -- pages in channel order ------------------------------------------------------------------------------


def seq_range(after_seq: int, first: int, top: int) -> tuple[int, int]:
    """The seqs ``(lo, hi)`` of a channel epoch (``first``, ``top``) after ``after_seq`` (empty: ``lo > hi``),
    before a time range narrows them (:func:`first_at_time`): ``read_rows``."""
    return max(clamp(after_seq) + 1, first), top


def run_range(after_seq: int, up_to_seq: int, limit: int, first: int, top: int) -> tuple[int, int] | None:
    """The seqs ``(lo, hi)`` of a ``read_runs`` page: after ``after_seq``, up to ``up_to_seq`` and the epoch's
    ``top``, at most ``limit`` of them; ``None`` when there are none."""
    lo = max(clamp(after_seq) + 1, first)
    hi = min(clamp(up_to_seq), top, lo - 1 + min(limit, MAX_INT64 - lo))
    return None if lo > hi else (lo, hi)


def budget_end(
    lo: int,
    hi: int,
    max_bytes: int,
    total: Callable[[], int | None],
    last_under: Callable[[int], int | None],
) -> int:
    """The last seq of the page ``lo..hi`` under the byte budget ``max_bytes``: ``hi`` when the range's
    payloads (``total()``) stay under it; else the last seq whose earlier rows' payloads stay under it
    (``last_under(budget)``), so the page ends with the row that reaches it (``lo`` when the store finds
    none), and empty payloads after that row wait for the next page, as a page ended while it is read
    leaves them. A budget below 1 is 1: the page holds one row. The engine reads both sums without the
    payloads."""
    budget = max(clamp(max_bytes), 1)
    if (total() or 0) < budget:
        return hi
    return last_under(budget) or lo


def whole_run(lo: int, hi: int, matched: int) -> bool:
    """Whether ``matched`` rows of ``lo..hi`` equal to the first in every column but seq, time and payload
    make the range one run: seqs are unique, so as many matching rows as seqs means every row matched."""
    return matched == hi - lo + 1


def group_runs(rows: Iterable[R], proto: Callable[[R], Event]) -> list[EventRun]:
    """Group stored event rows of one channel epoch (``seq, time_ns``, the publisher's four columns,
    ``content_type, headers, tags, payload``; in seq order) into runs; ``proto(row)`` builds a run's first
    event, the only one built."""
    out: list[EventRun] = []
    prev_key: tuple[Any, ...] = ()
    prev_seq = 0
    run: list[tuple[int, bytes]] = []
    for r in rows:
        seq = r[0]
        key = tuple(r[2:9])
        if seq == prev_seq + 1 and key == prev_key:
            run.append((r[1], r[9]))
        else:
            run = [(r[1], r[9])]
            out.append(EventRun(proto(r), run))
            prev_key = key
        prev_seq = seq
    return out


def first_at_time(lo: int, hi: int, t: int, probe: Callable[[int], Sequence[int] | None]) -> int:
    """The smallest key in ``[lo, hi]`` of a row with ``time_ns >= t``, or ``hi + 1``, by binary search over
    keys whose ``time_ns`` increases with them (``seq`` within a channel epoch, ``pos`` over the log).
    ``probe(k)``: ``(key, time_ns)`` of the first row with a key at or after ``k``, or ``None``; a hole in
    the keys costs nothing."""
    while lo <= hi:
        mid = (lo + hi) // 2
        row = probe(mid)
        if row is None or row[0] > hi or row[1] >= t:
            hi = mid - 1
        else:
            lo = row[0] + 1
    return lo


class SeqStatements(Protocol):
    """The statements of a channel-order read, each run by the engine in the read's one snapshot: what
    :func:`channel_rows` and :func:`channel_runs` ask of the store. :meth:`rows` and :meth:`same_as` may
    give a cursor that steps the store as it is read (SQLite's): :func:`channel_runs` then ends a page under
    a byte budget while reading it, and holds no row past the one that reaches it."""

    def epoch(self, channel: str, epoch: str | None) -> Sequence[Any] | None:
        """``(epoch id, epoch, first, top)`` of the channel's current epoch, or of ``epoch``, current or
        retired; ``None`` when there is none."""

    def at_or_after(self, cid: int, seq: int) -> Sequence[int] | None:
        """``(seq, time_ns)`` of the epoch's first row at or after ``seq``, or ``None``."""

    def rows(self, cid: int, lo: int, hi: int, limit: int) -> Iterable[Any]:
        """The epoch's rows ``lo..hi`` in seq order, at most ``limit``."""

    def compact_rows(self, cid: int, lo: int, hi: int, limit: int, first: Row) -> list[Any]:
        """:meth:`rows`, each text column ``None`` where it equals ``first``'s (``compact_text``)."""

    def row(self, cid: int, seq: int) -> Row | None:
        """The row ``seq`` of the epoch, or ``None``."""

    def same_as(self, cid: int, lo: int, hi: int, head: Row) -> Iterable[Any]:
        """``(time_ns, payload)`` of the rows ``lo..hi``, in seq order, equal to ``head`` in every column
        but seq, time and payload."""

    def count_same(self, cid: int, lo: int, hi: int, head: Row) -> int:
        """How many rows of ``lo..hi`` :meth:`same_as` gives, read without the payloads."""


#: An engine's read of a page ``(cid, lo, hi, head row, cut)`` as one run's rows, or ``None``: see
#: :func:`channel_runs`. It must give exactly the rows the row-by-row read would make one run of: rows
#: ``lo..`` up to ``hi`` or to the one that brings the payloads to ``cut``, every one equal to ``head`` but
#: for seq, time and payload.
ColumnRows: TypeAlias = Callable[[int, int, int, Row, int | None], Sequence[tuple[int, bytes]] | None]


class BudgetSums(Protocol):
    """The payload sums of an engine whose statements give whole results (a client that holds a statement's
    every row before the first is read, as psycopg's cursors do): a page under a byte budget is ended
    before it is read (:func:`budget_end`), since ending it while reading would bound nothing."""

    def payload_total(self, cid: int, lo: int, hi: int) -> int | None:
        """The payload bytes of the rows ``lo..hi`` (``None``: no row), read without the payloads."""

    def last_under(self, cid: int, lo: int, hi: int, budget: int) -> int | None:
        """The last seq of ``lo..hi`` whose earlier rows' payloads add up to less than ``budget``."""


def channel_rows(
    st: SeqStatements,
    channel: str,
    after_seq: int,
    limit: int,
    from_time: int | None,
    to_time: int | None,
    *,
    compact_text: bool = False,
    epoch: str | None = None,
) -> tuple[str, list[Any]]:
    """``LogStore.read_rows`` over an engine's statements: ``(epoch, rows)``, ``("", [])`` for a channel
    (or ``epoch``) without events. The seq range after ``after_seq`` is narrowed to ``from_time <= time_ns
    < to_time`` by binary search; with ``compact_text``, the first row is read whole and the others compared
    with it by the store."""
    found = st.epoch(channel, epoch)
    if found is None:
        return "", []
    cid, cur, first, top = found
    lo, hi = seq_range(after_seq, first, top)
    if from_time is not None and lo <= hi:
        lo = first_at_time(lo, hi, from_time, lambda k: st.at_or_after(cid, k))
    if to_time is not None and lo <= hi:
        hi = first_at_time(lo, hi, to_time, lambda k: st.at_or_after(cid, k)) - 1
    if lo > hi:
        return cur, []
    n = min(limit, MAX_INT64)
    if not compact_text:
        return cur, list(st.rows(cid, lo, hi, n))
    head = list(st.rows(cid, lo, hi, 1))
    if not head:
        return cur, []
    rows = st.compact_rows(cid, lo, hi, n, head[0])
    rows[0] = head[0]
    return cur, rows


def channel_runs(
    st: SeqStatements,
    channel: str,
    after_seq: int,
    up_to_seq: int,
    limit: int,
    max_bytes: int | None,
    proto: Callable[[str, Any], Event],
    sums: BudgetSums | None = None,
    columns: ColumnRows | None = None,
) -> list[EventRun]:
    """``LogStore.read_runs`` over an engine's statements (``proto(epoch, row)`` builds a run's first
    event). A range whose rows all equal the first row in every column but seq, time and payload (the usual
    page: one publisher's events) is two statements and one ``(time_ns, payload)`` pair per row, compared by
    the store; any other range is read whole and grouped.

    Under ``max_bytes`` the page ends with the row that brings its payloads to the budget (a budget below 1
    is 1). With ``sums`` (an engine whose statements give whole results) that end is found first
    (:func:`budget_end`: one or two more statements); without, the page is ended while it is read
    (:func:`take_upto`, a row at a time, so no row past that one is held), and a run so ended is checked
    whole by :meth:`~SeqStatements.count_same` over its own range, without the payloads. Reading the sizes
    apart cost a second pass over the page's rows (a look-up of the table per row, as the payloads' own
    read): about a tenth of a 16 B replay's CPU on SQLite.

    ``columns`` (an engine that reads a run's rows in one statement) is offered each page first, with its
    first row and the budget it is ended at; when it answers, its rows are the page's one run."""
    found = st.epoch(channel, None)
    if found is None:
        return []
    cid, epoch, first, top = found
    page = run_range(after_seq, up_to_seq, limit, first, top)
    if page is None:
        return []
    lo, hi = page
    cut: int | None = None  # the budget the page is ended at while it is read
    if max_bytes is not None:
        if sums is None:
            cut = max(clamp(max_bytes), 1)
        else:
            hi = budget_end(
                lo,
                hi,
                max_bytes,
                lambda: sums.payload_total(cid, lo, hi),
                lambda budget: sums.last_under(cid, lo, hi, budget),
            )
    run = _one_run(st, cid, lo, hi, cut, lambda head: proto(epoch, head), columns)
    if run is not None:
        return [run]
    rows = st.rows(cid, lo, hi, MAX_INT64)
    if cut is not None:
        rows, _ = take_upto(rows, cut, 9)
    return group_runs(rows, lambda r: proto(epoch, r))


def _one_run(
    st: SeqStatements,
    cid: int,
    lo: int,
    hi: int,
    cut: int | None,
    proto: Callable[[Row], Event],
    columns: ColumnRows | None = None,
) -> EventRun | None:
    """The page ``lo..hi`` (ended at ``cut`` payload bytes while read) as one run, or ``None`` when it is
    not one (what was read for it is dropped before the page is read again whole)."""
    head = st.row(cid, lo)
    if head is None:
        return None
    if columns is not None:
        rows = columns(cid, lo, hi, head, cut)
        if rows is not None:
            return EventRun(proto(head), rows)
    same = st.same_as(cid, lo, hi, head)
    if cut is None:
        pairs, full = list(same), False
    else:
        pairs, full = take_upto(same, cut, 1)
    if whole_run(lo, hi, len(pairs)) or (
        # Ended at the budget: a run if no other row lies among the ones read.
        full and st.count_same(cid, lo, lo + len(pairs) - 1, head) == len(pairs)
    ):
        return EventRun(proto(head), pairs)
    return None


# -- pages in commit order -------------------------------------------------------------------------------


def path_bounds(prefix: str) -> tuple[tuple[str, str], ...]:
    """The comparisons that keep the paths starting with ``prefix`` (none for ``""``), each
    ``(operator, value)`` for the engine's ``path <op> value``; a path that passes them may still not start
    with ``prefix`` only where :func:`~hubbub.log.base.prefix_upper` has no bound (the caller checks)."""
    if not prefix:
        return ()
    upper = prefix_upper(prefix)
    return ((">=", prefix),) if upper is None else ((">=", prefix), ("<", upper))


# Built once per page of a replay: a frozen dataclass's __init__ would cost a descriptor call per field.
@hot_value
class LogScope:
    """The rows of a commit-order read: ``after_pos < pos <= pos`` and ``from_time <= time_ns <= time_ns``
    (bounds clamped), with a channel path passing every ``paths`` comparison (``(operator, value)``)."""

    after_pos: int
    pos: int
    time_ns: int
    from_time: int
    paths: tuple[tuple[str, str], ...]

    def conditions(self, *, from_time: bool = True) -> list[tuple[str, str, int | str]]:
        """The scope as ``(field, operator, value)`` comparisons, all to hold, over the fields ``pos``,
        ``time_ns`` (of the event) and ``path`` (of its channel), which the engine renders in its SQL.
        Without ``from_time``: no lower time bound (``read_log`` has none). The fields and operators
        depend only on ``from_time`` and :attr:`shape`, so an engine may render them once per shape
        (:meth:`values` then gives the values in the same order)."""
        out: list[tuple[str, str, int | str]] = [
            ("pos", ">", self.after_pos),
            ("pos", "<=", self.pos),
            ("time_ns", "<=", self.time_ns),
        ]
        if from_time:
            out.append(("time_ns", ">=", self.from_time))
        out.extend(("path", op, value) for op, value in self.paths)
        return out

    @property
    def shape(self) -> tuple[str, ...]:
        """The operators of :attr:`paths`: with ``from_time``, what :meth:`conditions`' fields and operators
        depend on."""
        return tuple(op for op, _ in self.paths)

    def values(self, *, from_time: bool = True) -> list[int | str]:
        """The values of :meth:`conditions`, in its order."""
        out: list[int | str] = [self.after_pos, self.pos, self.time_ns]
        if from_time:
            out.append(self.from_time)
        out.extend(value for _, value in self.paths)
        return out


def log_scope(
    after_pos: int, mark: LogMark, prefix: str = "", *, from_time: int = 0, channel: str | None = None
) -> LogScope | None:
    """The scope of ``read_log``/``count_log``/``log_census`` from ``after_pos`` up to ``mark`` under
    ``prefix`` (or of ``channel`` alone); ``None`` when the range is empty (nothing to read)."""
    if after_pos >= mark.pos:
        return None
    paths = (("=", channel),) if channel is not None else path_bounds(prefix)
    return LogScope(clamp(after_pos), clamp(mark.pos), clamp(mark.time_ns), clamp(from_time), paths)


def take_upto(rows: Iterable[R], max_bytes: int, payload_at: int) -> tuple[list[R], bool]:
    """The rows of ``rows`` up to the one that brings their payloads (column ``payload_at``) to
    ``max_bytes`` or more, and whether that one was reached (the page is ``full``). Stepped a row at a time,
    so a cursor stops there: a batch (``fetchmany``) would hold its whole batch of large rows before the sum
    could stop it. The step and the sum cost about 0.1 µs a row, against about 2 µs to build its event."""
    out: list[R] = []
    append = out.append
    size = 0
    for r in rows:
        append(r)
        size += len(r[payload_at])
        if size >= max_bytes:
            return out, True
    return out, False


def page_full(sizes: Iterable[int], max_bytes: int | None) -> bool:
    """Whether a page whose payloads have ``sizes`` reached its budget (for an engine whose store applied
    the budget itself)."""
    return max_bytes is not None and sum(sizes) >= max_bytes


def census(rows: Iterable[Sequence[Any]]) -> dict[str, tuple[str, int, int]]:
    """``log_census``'s answer from rows ``(path, epoch, first seq, last seq)``, one per channel."""
    return {str(r[0]): (str(r[1]), int(r[2]), int(r[3])) for r in rows}


# -- the data pipeline's plan ----------------------------------------------------------------------------


def plan_scan(
    epochs: Iterable[Sequence[Any]],
    totals: tuple[int, int],
    ends: tuple[int, int, int] | None,
    from_time: int | None,
    to_time: int | None,
    pos_at_time: Callable[[int, int, int], int],
    next_split: Callable[[int], int | None],
) -> ScanPlan:
    """``scan_plan`` from what the engine read in one snapshot: ``epochs``, rows ``(retired, epoch id,
    path, epoch, first, top, top_time)`` of every epoch holding events; ``totals``, ``(events, bytes)``;
    ``ends``, ``(first pos, last pos, last time_ns)`` (``None`` for an empty log); ``pos_at_time(lo, hi, t)``
    the first pos at or after ``t`` (:func:`first_at_time`); ``next_split(at)`` the pos ``size`` events
    after ``at``, or ``None``. Pieces start at ``lo`` and at every ``next_split``, and end at ``hi + 1``."""
    channels: dict[int, ChannelInfo] = {}
    retired: set[int] = set()
    for row in epochs:
        channels[row[1]] = ChannelInfo(*row[2:])
        if row[0]:
            retired.add(row[1])
    events, nbytes = totals
    if ends is None:
        return ScanPlan((), 0, channels, events, nbytes, frozenset(retired))
    lo, hi, max_time = ends
    if from_time is not None:
        lo = pos_at_time(lo, hi, from_time)
    if to_time is not None and lo <= hi:
        hi = pos_at_time(lo, hi, to_time) - 1
    splits = list(_splits(lo, hi, next_split))
    if splits:
        splits.append(hi + 1)
    return ScanPlan(tuple(splits), max_time, channels, events, nbytes, frozenset(retired))


def _splits(lo: int, hi: int, next_split: Callable[[int], int | None]) -> Iterator[int]:
    at: int | None = lo
    while at is not None and at <= hi:
        yield at
        at = next_split(at)


def scalar(row: Sequence[Any] | None) -> Any:
    """The first column of a statement's one row (``None`` for no row)."""
    return None if row is None else row[0]
