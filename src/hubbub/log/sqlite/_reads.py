"""The read side of :class:`SqliteLogStore`: per-thread read-only connections, every read in one
snapshot; reads, runs, and the bulk scans of the data pipeline (:class:`ScanPlan`, :class:`ScanColumns`).

Time searches (``read(from_time=…)``) use no index: within one channel's epoch ``time_ns`` strictly increases
with ``seq``, so a binary search over ``seq`` costs a handful of index look-ups.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any, Final

from hubbub.errors import StorageError
from hubbub.events import Event, Publisher
from hubbub.log.base import (
    ChannelInfo,
    EventRun,
    LogMark,
    LogPage,
    ScanColumns,
    ScanPlan,
    StoreStats,
)
from hubbub.log.read_plan import (
    MAX_INT64,
    LogScope,
    census,
    channel_rows,
    channel_runs,
    first_at_time,
    log_scope,
    path_bounds,
    plan_scan,
    scalar,
    take_upto,
)
from hubbub.log.records import decode_headers, decode_tags
from hubbub.log.sqlite._columns import ColumnReads
from hubbub.log.sqlite._errors import _STORAGE_ERRORS, _error
from hubbub.log.sqlite._schema import _EVENT_COLS, _TEXT_COLS

__all__ = ["ScanColumns", "ScanPlan"]

_HEAD_COLS: Final = "path, epoch, first, top, top_time"
# read_log: the events of current epochs in a pos range, with their channel id and pos after the event
# columns (the channel's path and epoch come from _ReadSide._channel_names: no two strings made per row). The
# four publisher columns are all NULL where they equal ?1..?4 together (the reading thread's last publisher,
# _log_events' ``same``): a page of one publisher's events makes no string for them. CROSS JOIN keeps
# ``events`` the outer loop (its pos range, in pos order), whatever the planner makes of a path prefix.
_SAME_PUBLISHER: Final = (
    "e.publisher_dialect = ?1 AND e.publisher_user = ?2 AND e.publisher_app = ?3 AND e.publisher_msg_id = ?4"
)
_LOG_SELECT: Final = (
    "SELECT e.seq, e.time_ns, "
    + ", ".join(
        f"CASE WHEN {_SAME_PUBLISHER} THEN NULL ELSE e.{c} END"
        for c in ("publisher_dialect", "publisher_user", "publisher_app", "publisher_msg_id")
    )
    + ", e.content_type, e.headers, e.tags, e.payload, e.channel_id, e.pos"
    " FROM events AS e CROSS JOIN channels AS c ON c.id = e.channel_id WHERE "
)
#: read_log's first reference publisher on a thread (see _LOG_SELECT): any value is right, since a row equal
#: to it gets it, an equal object (the columns are NOT NULL: all four NULL only means equal).
_NOBODY: Final = Publisher("")
#: Channel ids whose (path, epoch) a store keeps for read_log (forgotten all at once past it).
_NAMES_MAX: Final = 65536
_HEADS_CHUNK: Final = 500
# read_rows(compact_text=True): a text column is NULL where it equals the given (first row's) value.
_COMPACT_SELECT: Final = (
    "SELECT seq, time_ns, "
    + ", ".join(f"nullif({c}, ?{i})" for i, c in enumerate(_TEXT_COLS, 1))
    + ", headers, tags, payload FROM events WHERE channel_id = ?6 AND seq BETWEEN ?7 AND ?8 "
    "ORDER BY seq LIMIT ?9"
)
# read_runs: the (time_ns, payload) of a range's rows that equal the first row in every other column.
_RUN_RANGE: Final = "FROM events WHERE channel_id = ?1 AND seq BETWEEN ?2 AND ?3 " + "".join(
    f"AND {c} = ?{i} " for i, c in enumerate((*_TEXT_COLS, "headers", "tags"), 4)
)
_RUN_SELECT: Final = "SELECT time_ns, payload " + _RUN_RANGE + "ORDER BY seq"
# read_runs(max_bytes=...), a page ended while read: how many of its rows _RUN_SELECT gives (no payload read).
_RUN_COUNT: Final = "SELECT count(*) " + _RUN_RANGE


class _SeqStatements:
    """The statements of a channel-order read (:class:`~hubbub.log.read_plan.SeqStatements`) on ``conn``,
    inside the read's snapshot. :meth:`rows` and :meth:`same_as` give the cursor: SQLite steps it as it is
    read, so a page under a byte budget is ended while read (no payload sums: ``channel_runs`` without
    ``sums``)."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def epoch(self, channel: str, epoch: str | None) -> Any:
        if epoch is None:
            return self.conn.execute(
                "SELECT id, epoch, first, top FROM channels WHERE path = ?", (channel,)
            ).fetchone()
        return self.conn.execute(
            "SELECT id, epoch, first, top FROM channels WHERE path = ?1 AND epoch = ?2 UNION ALL "
            "SELECT id, epoch, first, top FROM retired_epochs WHERE path = ?1 AND epoch = ?2",
            (channel, epoch),
        ).fetchone()

    def at_or_after(self, cid: int, seq: int) -> Any:
        return self.conn.execute(
            "SELECT seq, time_ns FROM events WHERE channel_id = ? AND seq >= ? ORDER BY seq LIMIT 1",
            (cid, seq),
        ).fetchone()

    def rows(self, cid: int, lo: int, hi: int, limit: int) -> sqlite3.Cursor:
        return self.conn.execute(
            f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = ? AND seq BETWEEN ? AND ? "
            "ORDER BY seq LIMIT ?",
            (cid, lo, hi, limit),
        )

    def compact_rows(self, cid: int, lo: int, hi: int, limit: int, first: Sequence[Any]) -> list[Any]:
        return self.conn.execute(_COMPACT_SELECT, (*first[2:7], cid, lo, hi, limit)).fetchall()

    def row(self, cid: int, seq: int) -> Any:
        return self.conn.execute(
            f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = ? AND seq = ?", (cid, seq)
        ).fetchone()

    def same_as(self, cid: int, lo: int, hi: int, head: Sequence[Any]) -> sqlite3.Cursor:
        return self.conn.execute(_RUN_SELECT, (cid, lo, hi, *head[2:9]))

    def count_same(self, cid: int, lo: int, hi: int, head: Sequence[Any]) -> int:
        return int(self.conn.execute(_RUN_COUNT, (cid, lo, hi, *head[2:9])).fetchone()[0])


class _ReadSide:
    """The read methods of :class:`SqliteLogStore`, which mixes this in (see its concurrency contract).

    :class:`SqliteLogStore` ``__init__`` sets these attributes; ``close`` closes ``_readers``."""

    _closed: bool
    _close_lock: threading.Lock
    _local: threading.local
    _readers: list[sqlite3.Connection]
    _reader_uri: str
    _busy_timeout_ms: int
    _names: dict[int, tuple[str, str]]
    _columns: ColumnReads

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and not self._closed:
            return conn
        with self._close_lock:
            if self._closed:
                raise StorageError("log store is closed")
            try:
                conn = sqlite3.connect(
                    self._reader_uri,
                    uri=True,
                    isolation_level=None,
                    check_same_thread=False,
                    cached_statements=64,
                )
            except sqlite3.Error as exc:
                raise _error("read", exc) from exc
            self._readers.append(conn)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            conn.execute("PRAGMA cache_size = -8192")  # 8 MiB
        except sqlite3.Error as exc:
            raise _error("read", exc) from exc
        self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction on this thread's reader: every statement in it sees the same commit."""
        conn = self._reader()
        try:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")
        except _STORAGE_ERRORS as exc:
            raise _error("read", exc) from exc

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        try:
            return self._reader().execute(sql, params).fetchone()
        except _STORAGE_ERRORS as exc:
            raise _error("read", exc) from exc

    @staticmethod
    def _events(channel: str, epoch: str, rows: Iterable[Sequence[Any]]) -> list[Event]:
        return _build_events(rows, repeat((channel, epoch)))

    def _channel_names(
        self, conn: sqlite3.Connection, rows: list[Any], at: int
    ) -> dict[int, tuple[str, str]]:
        """The (path, epoch) of the channel ids of ``rows`` (column ``at``; rows of current epochs, read in
        this snapshot ``conn``), one entry per id. An id is one epoch of one channel for good (a new epoch
        gets a new id; ids are never reused), so the answers are kept, shared by the reader threads (a dict's
        single steps are atomic): a replay asks SQLite only for the channels it meets first."""
        names = self._names
        ids = {r[at] for r in rows}
        missing = ids.difference(names)
        if missing:
            if len(names) + len(missing) > _NAMES_MAX:
                names.clear()
                missing = ids
            chunks = list(missing)
            for i in range(0, len(chunks), _HEADS_CHUNK):
                chunk = chunks[i : i + _HEADS_CHUNK]
                marks = ", ".join("?" * len(chunk))
                for cid, path, epoch in conn.execute(
                    f"SELECT id, path, epoch FROM channels WHERE id IN ({marks})", chunk
                ):
                    names[cid] = (path, epoch)
        # The page's own answers, one per channel rather than per row: another reader's clear (past
        # _NAMES_MAX) may drop an id between the two steps, and such an id is asked again.
        out: dict[int, tuple[str, str]] = {}
        for cid in ids:
            name = names.get(cid)
            if name is None:
                path, epoch = conn.execute("SELECT path, epoch FROM channels WHERE id = ?", (cid,)).fetchone()
                name = names[cid] = (path, epoch)
            out[cid] = name
        return out

    def head(self, channel: str) -> ChannelInfo:
        row = self._one(f"SELECT {_HEAD_COLS} FROM channels WHERE path = ?", (channel,))
        return ChannelInfo(channel, "", 0, 0, 0) if row is None else ChannelInfo(*row)

    def heads(self, channels: Iterable[str]) -> dict[str, ChannelInfo]:
        names = list(dict.fromkeys(channels))
        out = {n: ChannelInfo(n, "", 0, 0, 0) for n in names}
        with self._snapshot() as conn:
            for i in range(0, len(names), _HEADS_CHUNK):
                chunk = names[i : i + _HEADS_CHUNK]
                marks = ", ".join("?" * len(chunk))
                for row in conn.execute(f"SELECT {_HEAD_COLS} FROM channels WHERE path IN ({marks})", chunk):
                    out[row[0]] = ChannelInfo(*row)
        return out

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
        epoch, rows = self.read_rows(channel, after_seq, limit, from_time, to_time, epoch=epoch)
        return self._events(channel, epoch, rows) if rows else []

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
    ) -> tuple[str, list[tuple[Any, ...]]]:
        """:meth:`read` without building events, for bulk readers (the data pipeline): ``(epoch, rows)``,
        each row ``(seq, time_ns, publisher_dialect, publisher_user, publisher_app, publisher_msg_id,
        content_type, headers, tags, payload)`` with ``headers`` and ``tags`` in the column codec of
        :mod:`hubbub.log.records`. An unknown channel gives ``("", [])``.

        ``compact_text``: in every row but the first, each of the five text columns (``publisher_*`` and
        ``content_type``) is ``None`` where it equals the first row's value (SQLite compares, so no Python
        string is made for a repeated value: in a page they mostly are).

        ``epoch``: read that epoch of the channel, current or retired (``("", [])`` when the channel has no
        such epoch holding events)."""
        if limit <= 0:
            self._reader()
            return "", []
        with self._snapshot() as conn:
            return channel_rows(
                _SeqStatements(conn),
                channel,
                after_seq,
                limit,
                from_time,
                to_time,
                compact_text=compact_text,
                epoch=epoch,
            )

    def read_runs(
        self, channel: str, after_seq: int, up_to_seq: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[EventRun]:
        """See :meth:`LogStore.read_runs`. A range whose rows all share the first row's publisher, content
        type, headers and tags (the usual page: one publisher's events) and payload size is read in one
        aggregate statement as columns (:class:`~hubbub.run_columns.RunColumns`, ``_columns.py``); one whose
        payloads differ in size is two statements and one ``(time_ns, payload)`` tuple per row, checked by
        SQLite; any other range is read whole and grouped. Under ``max_bytes`` a page of one size is cut to
        the budget before it is read, and any other is ended while its cursor is read (one more statement,
        without the payloads, when it ends before its range does)."""
        if up_to_seq <= after_seq or limit <= 0:
            self._reader()
            return []
        with self._snapshot() as conn:
            return channel_runs(
                _SeqStatements(conn),
                channel,
                after_seq,
                up_to_seq,
                limit,
                max_bytes,
                lambda epoch, row: self._events(channel, epoch, [row])[0],
                columns=lambda cid, lo, hi, head, cut: self._columns.rows(conn, cid, lo, hi, head, cut),
            )

    def scan_plan(self, size: int, from_time: int | None = None, to_time: int | None = None) -> ScanPlan:
        """Plan a bulk read of the whole log in commit (``pos``) order: see :class:`ScanPlan`. Each piece
        holds ``size`` events (the last one at most ``size``) with ``from_time <= time_ns < to_time``:
        ``time_ns`` increases with ``pos``, so the time range is a ``pos`` range, found by binary search.
        For bulk readers (the data pipeline), with :meth:`scan_columns`."""
        size = max(size, 1)
        with self._snapshot() as conn:
            epochs = conn.execute(
                f"SELECT 0, id, {_HEAD_COLS} FROM channels WHERE count > 0 UNION ALL "
                f"SELECT 1, id, {_HEAD_COLS} FROM retired_epochs ORDER BY path, id"
            ).fetchall()
            totals = conn.execute(
                "SELECT coalesce(sum(count), 0), coalesce(sum(bytes), 0) FROM "
                "(SELECT count, bytes FROM channels UNION ALL SELECT count, bytes FROM retired_epochs)"
            ).fetchone()
            first = conn.execute("SELECT pos FROM events ORDER BY pos LIMIT 1").fetchone()
            last = conn.execute("SELECT pos, time_ns FROM events ORDER BY pos DESC LIMIT 1").fetchone()
            return plan_scan(
                epochs,
                totals,
                None if first is None or last is None else (first[0], last[0], last[1]),
                from_time,
                to_time,
                lambda lo, hi, t: _pos_at_time(conn, lo, hi, t),
                lambda at: scalar(
                    conn.execute(
                        "SELECT pos FROM events WHERE pos >= ? ORDER BY pos LIMIT 1 OFFSET ?", (at, size)
                    ).fetchone()
                ),
            )

    def scan_columns(
        self,
        lo_pos: int,
        hi_pos: int,
        *,
        max_time: int,
        bounds: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[ScanColumns]:
        """The events with ``lo_pos <= pos < hi_pos`` and ``time_ns <= max_time``, in ``pos`` order, as
        columns (:class:`ScanColumns`), read in one snapshot by a sequential scan of the table. ``bounds``:
        only these ``(channel id, lowest seq, highest seq)`` (a join with a temporary table of this thread's
        reader). Usually one piece; a range whose columns would exceed SQLite's string limit is read in
        halves (pieces in ``pos`` order)."""
        if lo_pos >= hi_pos:
            self._reader()
            return []
        with self._snapshot() as conn:
            join, where = "", ""
            if bounds is not None:
                if getattr(self._local, "scan_table", None) is not conn:
                    conn.execute(
                        "CREATE TEMP TABLE IF NOT EXISTS hubbub_scan "
                        "(cid INTEGER PRIMARY KEY, lo INTEGER NOT NULL, hi INTEGER NOT NULL)"
                    )
                    self._local.scan_table = conn
                conn.execute("DELETE FROM temp.hubbub_scan")
                conn.executemany("INSERT INTO temp.hubbub_scan (cid, lo, hi) VALUES (?, ?, ?)", bounds)
                # CROSS JOIN keeps ``events`` the outer loop: a scan in ``pos`` order, one look-up per row in
                # the small table (faster than ``channel_id IN (…)``, measured).
                join = " CROSS JOIN temp.hubbub_scan AS b ON b.cid = e.channel_id"
                where = " AND e.seq BETWEEN b.lo AND b.hi"
            out: list[ScanColumns] = []
            _scan(conn, join, where, lo_pos, hi_pos, max_time, out)
            return out

    def read_last(self, channel: str, n: int) -> list[Event]:
        if n <= 0:
            self._reader()
            return []
        with self._snapshot() as conn:
            row = conn.execute("SELECT id, epoch FROM channels WHERE path = ?", (channel,)).fetchone()
            if row is None:
                return []
            cid, epoch = row
            rows = conn.execute(
                f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = ? ORDER BY seq DESC LIMIT ?",
                (cid, min(n, MAX_INT64)),
            ).fetchall()
            rows.reverse()
            return self._events(channel, epoch, rows)

    def channels(
        self, after: str = "", limit: int = 1000, prefix: str = "", *, include_empty: bool = False
    ) -> list[ChannelInfo]:
        if limit <= 0:
            self._reader()
            return []
        sql = f"SELECT {_HEAD_COLS} FROM channels WHERE path > ?"
        if not include_empty:
            sql += " AND count > 0"
        params: list[Any] = [after]
        for op, value in path_bounds(prefix):
            sql += f" AND path {op} ?"
            params.append(value)
        sql += " ORDER BY path LIMIT ?"
        params.append(min(limit, MAX_INT64))
        with self._snapshot() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [ChannelInfo(*r) for r in rows if r[0].startswith(prefix)]

    def log_mark(self) -> LogMark:
        with self._snapshot() as conn:
            (pos,) = conn.execute("SELECT coalesce(max(pos), 0) FROM events").fetchone()
            row = conn.execute("SELECT value FROM meta WHERE key = 'last_time'").fetchone()
        return LogMark(int(pos), int(row[0]) if row else 0)

    def log_seek(self, time_ns: int) -> int:
        with self._snapshot() as conn:
            lo, hi = conn.execute(
                "SELECT coalesce(min(pos), 1), coalesce(max(pos), 0) FROM events"
            ).fetchone()
            return max(_pos_at_time(conn, lo, hi, time_ns) - 1, 0)

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
        scope = log_scope(after_pos, mark, prefix)
        if limit <= 0 or scope is None:
            return LogPage([], after_pos)
        local = self._local
        same: Publisher = getattr(local, "log_publisher", _NOBODY)
        params: list[Any] = [same.dialect, same.user, same.app, same.msg_id]
        sql = _LOG_SELECT + _in_scope(scope, params, from_time=False)
        sql += f" ORDER BY e.pos {'DESC ' if reverse else ''}LIMIT ?{len(params) + 1}"
        params.append(min(limit, MAX_INT64))
        full = False
        with self._snapshot() as conn:
            cur = conn.execute(sql, params)
            if max_bytes is None:
                rows = cur.fetchall()
            else:
                rows, full = take_upto(cur, max_bytes, 9)
            names = self._channel_names(conn, rows, 10) if rows else {}
        events = _log_events(rows, names, same)
        if events:
            # The next page's reference: one publisher's events keep one object from page to page.
            local.log_publisher = events[-1].publisher
        return LogPage(events, rows[-1][11] if rows else after_pos, full)

    def count_log(
        self,
        after_pos: int,
        mark: LogMark,
        prefix: str = "",
        *,
        from_time: int = 0,
        channel: str | None = None,
    ) -> tuple[int, int]:
        scope = log_scope(after_pos, mark, prefix, from_time=from_time, channel=channel)
        if scope is None:
            return 0, 0
        # Rows counted where the events are (the pos range), each channel looked up by id: no event built.
        params: list[Any] = []
        sql = (
            "SELECT count(*), coalesce(sum(length(e.headers) > 0), 0)"
            " FROM events AS e CROSS JOIN channels AS c ON c.id = e.channel_id WHERE "
        ) + _in_scope(scope, params)
        with self._snapshot() as conn:
            total, marked = conn.execute(sql, params).fetchone()
        return int(total), int(marked)

    def log_census(
        self, after_pos: int, mark: LogMark, prefix: str = "", *, from_time: int = 0
    ) -> dict[str, tuple[str, int, int]]:
        scope = log_scope(after_pos, mark, prefix, from_time=from_time)
        if scope is None:
            return {}
        # The rows of the range grouped by channel where they are: no event built.
        params: list[Any] = []
        sql = (
            "SELECT c.path, c.epoch, min(e.seq), max(e.seq) FROM events AS e CROSS JOIN channels AS c"
            " ON c.id = e.channel_id WHERE " + _in_scope(scope, params) + " GROUP BY c.path, c.epoch"
        )
        with self._snapshot() as conn:
            return census(conn.execute(sql, params))

    def top_time(self) -> int:
        row = self._one("SELECT value FROM meta WHERE key = 'last_time'")
        return int(row[0]) if row else 0

    def stats(self) -> StoreStats:
        with self._snapshot() as conn:
            events, nbytes, channels = conn.execute(
                "SELECT coalesce(sum(count), 0), coalesce(sum(bytes), 0), coalesce(sum(count > 0), 0) "
                "FROM channels"
            ).fetchone()
            retired, r_events, r_bytes = conn.execute(
                "SELECT count(*), coalesce(sum(count), 0), coalesce(sum(bytes), 0) FROM retired_epochs"
            ).fetchone()
        return StoreStats(
            events=int(events + r_events),
            bytes=int(nbytes + r_bytes),
            channels=int(channels),
            retired_epochs=int(retired),
        )

    def retired_epochs(self, channel: str) -> list[ChannelInfo]:
        with self._snapshot() as conn:
            rows = conn.execute(
                f"SELECT {_HEAD_COLS} FROM retired_epochs WHERE path = ? ORDER BY id", (channel,)
            ).fetchall()
        return [ChannelInfo(*r) for r in rows]


#: A :class:`~hubbub.log.read_plan.LogScope`'s fields as read_log's, count_log's and log_census's columns.
_SCOPE_COLS: Final = {"pos": "e.pos", "time_ns": "e.time_ns", "path": "c.path"}
#: _in_scope's conditions rendered, by shape (a handful of them).
_WHERE: dict[tuple[Any, ...], str] = {}


def _in_scope(scope: LogScope, params: list[Any], *, from_time: bool = True) -> str:
    """``scope``'s conditions, their values appended to ``params`` (numbered placeholders after theirs);
    rendered once per shape (a few µs a page otherwise)."""
    key = (len(params), from_time, scope.shape)
    sql = _WHERE.get(key)
    if sql is None:
        conds = scope.conditions(from_time=from_time)
        sql = _WHERE[key] = " AND ".join(
            f"{_SCOPE_COLS[field]} {op} ?{len(params) + i}" for i, (field, op, _) in enumerate(conds, 1)
        )
    params.extend(scope.values(from_time=from_time))
    return sql


def _build_events(
    rows: Iterable[Sequence[Any]], places: Iterable[tuple[str, str]], same: Publisher | None = None
) -> list[Event]:
    """The events of ``rows`` (each ``_EVENT_COLS``), each of the (channel, epoch) ``places`` gives in turn:
    the one row-to-event step of every read. The events of one call that share a publisher share its
    object; with ``same``, a row whose four publisher columns are all NULL has ``same`` (read_log)."""
    pubs: dict[tuple[str | None, str | None, str | None, str | None], Publisher] = {}
    if same is not None:
        pubs[None, None, None, None] = same
    out: list[Event] = []
    for (channel, epoch), (seq, t, dialect, user, app, msg_id, ctype, hb, tb, payload) in zip(
        places, rows, strict=False
    ):
        pk = (dialect, user, app, msg_id)
        pub = pubs.get(pk)
        if pub is None:
            pub = pubs[pk] = Publisher(dialect, user, app, msg_id)
        out.append(
            Event(
                channel,
                seq,
                epoch,
                t,
                pub,
                payload,
                ctype,
                decode_headers(hb) if hb else {},
                decode_tags(tb) if tb else (),
            )
        )
    return out


def _log_events(
    rows: Iterable[Sequence[Any]], names: dict[int, tuple[str, str]], same: Publisher
) -> list[Event]:
    """The events of read_log's ``rows`` (``_LOG_SELECT``'s columns), each channel's (path, epoch) from
    ``names`` by its id: :func:`_build_events` for a page of any channels, in one loop over the rows as
    they come (no slice of the row, no pair per row to zip), and a row whose four publisher columns are
    all NULL (they equal ``same``'s, checked by SQLite) has ``same`` without a lookup: about 0.3 µs an event
    of the 1 µs that building a pattern's page took."""
    pubs: dict[tuple[str, str, str, str], Publisher] = {}
    out: list[Event] = []
    add = out.append
    for seq, t, dialect, user, app, msg_id, ctype, hb, tb, payload, cid, _ in rows:
        channel, epoch = names[cid]
        if dialect is None:
            pub = same
        else:
            pk = (dialect, user, app, msg_id)
            found = pubs.get(pk)
            if found is None:
                found = pubs[pk] = Publisher(dialect, user, app, msg_id)
            pub = found
        add(
            Event(
                channel,
                seq,
                epoch,
                t,
                pub,
                payload,
                ctype,
                decode_headers(hb) if hb else {},
                decode_tags(tb) if tb else (),
            )
        )
    return out


def _pos_at_time(conn: sqlite3.Connection, lo: int, hi: int, t: int) -> int:
    """The smallest ``pos`` in ``[lo, hi]`` of an event with ``time_ns >= t``, or ``hi + 1``
    (``time_ns`` increases with ``pos``)."""
    sql = "SELECT pos, time_ns FROM events WHERE pos >= ? ORDER BY pos LIMIT 1"
    return first_at_time(lo, hi, t, lambda mid: conn.execute(sql, (mid,)).fetchone())


_SCAN_VARLEN: Final = "group_concat(length({c})), CAST(group_concat({c}, '') AS BLOB)"
_SCAN_SELECT: Final = (
    "SELECT count(*), group_concat(e.channel_id), group_concat(e.seq), group_concat(e.time_ns), "
    + ", ".join(_SCAN_VARLEN.format(c=f"e.{c}") for c in ("headers", "tags", "payload"))
    + ", total("
    + " OR ".join(f"e.{c} IS NOT ?{i}" for i, c in enumerate(_TEXT_COLS, 1))
    + ")"
)
_SCAN_TEXT: Final = "SELECT " + ", ".join(_SCAN_VARLEN.format(c=f"CAST(e.{c} AS BLOB)") for c in _TEXT_COLS)


def _scan(
    conn: sqlite3.Connection,
    join: str,
    where: str,
    lo: int,
    hi: int,
    max_time: int,
    out: list[ScanColumns],
) -> None:
    """:meth:`SqliteLogStore.scan_columns` of ``lo <= pos < hi`` into ``out``, halving on SQLITE_TOOBIG."""
    tail = f" FROM events AS e{join} WHERE e.pos >= ?6 AND e.pos < ?7 AND e.time_ns <= ?8{where}"
    first = conn.execute(
        "SELECT " + ", ".join(f"e.{c}" for c in _TEXT_COLS) + tail + " ORDER BY e.pos LIMIT 1",
        (None, None, None, None, None, lo, hi, max_time),
    ).fetchone()
    if first is None:
        return
    try:
        n, cids, seqs, times, hl, hd, tl, td, pl, pd, varied = conn.execute(
            _SCAN_SELECT + tail, (*first, lo, hi, max_time)
        ).fetchone()
        text: tuple[str, ...] | tuple[tuple[str, bytes], ...] = tuple(first)
        if varied:
            row = conn.execute(_SCAN_TEXT + tail, (None, None, None, None, None, lo, hi, max_time)).fetchone()
            text = tuple((row[i], row[i + 1]) for i in range(0, 10, 2))
    except sqlite3.DataError:  # SQLITE_TOOBIG: the concatenated columns are over SQLite's limit
        if hi - lo <= 1:
            raise
        mid = (lo + hi) // 2
        _scan(conn, join, where, lo, mid, max_time, out)
        _scan(conn, join, where, mid, hi, max_time, out)
        return
    out.append(ScanColumns(n, cids, seqs, times, text, (hl, hd), (tl, td), (pl, pd)))
