"""The read side of :class:`PostgresLogStore`: connections from a pool, every multi-statement read in one
``REPEATABLE READ`` snapshot; reads, runs, and the bulk scans of the data pipeline.

A read whose pooled connection turns out to be dead (the server restarted since it was opened) is retried
once on another connection, after the pool has dropped its other dead connections: reads change nothing, so
a retry is always safe. Time searches use no index, as in the SQLite engine: within one channel's epoch
``time_ns`` strictly increases with ``seq``, and over the log with ``pos``, so a binary search costs a
handful of index look-ups.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TypeVar, cast

import psycopg
import psycopg_pool

from hubbub.errors import StorageError
from hubbub.events import Event, Publisher
from hubbub.log.base import (
    ChannelInfo,
    EventRun,
    LogMark,
    LogPage,
    Row,
    ScanColumns,
    ScanPlan,
    StoreStats,
)
from hubbub.log.postgres._errors import _STORAGE_ERRORS, _error
from hubbub.log.postgres._schema import _EVENT_COLS, _TEXT_COLS
from hubbub.log.read_plan import (
    MAX_INT64,
    LogScope,
    census,
    channel_rows,
    channel_runs,
    clamp,
    first_at_time,
    log_scope,
    page_full,
    path_bounds,
    plan_scan,
    scalar,
)
from hubbub.log.records import decode_headers, decode_tags

T = TypeVar("T")
Conn = psycopg.Connection[Any]


_HEAD_COLS: Final = "path, epoch, first, top, top_time"
# read_log: the events of current epochs in a pos range, with their channel's path and epoch.
#: read_log's columns (payload last), as the byte budget's outer query selects them again.
_LOG_COLS: Final = "pos, path, epoch, " + _EVENT_COLS
_LOG_SELECT: Final = (
    "SELECT e.pos, c.path, c.epoch, "
    + ", ".join(f"e.{c.strip()}" for c in _EVENT_COLS.split(","))
    + " FROM events AS e JOIN channels AS c ON c.id = e.channel_id WHERE "
)
_COMPACT_SELECT: Final = (
    "SELECT seq, time_ns, "
    + ", ".join(f"nullif({c}, %s)" for c in _TEXT_COLS)
    + ", headers, tags, payload FROM events WHERE channel_id = %s AND seq BETWEEN %s AND %s "
    "ORDER BY seq LIMIT %s"
)
# read_runs(max_bytes=...): a range's payload bytes (a range under the budget is read as it is), and else the
# last seq of the range whose earlier rows' payloads stay under it, so the page ends with the row that
# reaches it; the sizes are read without the payloads.
_BUDGET_SUM: Final = (
    "SELECT sum(octet_length(payload)) FROM events WHERE channel_id = %s AND seq BETWEEN %s AND %s"
)
_BUDGET_TOP: Final = (
    "SELECT max(seq) FROM (SELECT seq, sum(octet_length(payload)) OVER (ORDER BY seq) "
    "- octet_length(payload) AS earlier FROM events WHERE channel_id = %s AND seq BETWEEN %s AND %s) AS r "
    "WHERE earlier < %s"
)
# read_runs: the (time_ns, payload) of a range's rows that equal the first row in every other column.
_RUN_MATCH: Final = "".join(f"AND {c} = %s " for c in (*_TEXT_COLS, "headers", "tags"))
_RUN_SELECT: Final = (
    "SELECT time_ns, payload FROM events WHERE channel_id = %s AND seq BETWEEN %s AND %s "
    + _RUN_MATCH
    + "ORDER BY seq"
)
_RUN_COUNT: Final = (
    "SELECT count(*) FROM events WHERE channel_id = %s AND seq BETWEEN %s AND %s " + _RUN_MATCH
)
_SCAN_VARLEN: Final = (
    "string_agg(length({c})::text, ',' ORDER BY e.pos), string_agg({c}, ''::bytea ORDER BY e.pos)"
)
_SCAN_SELECT: Final = (
    "SELECT count(*), string_agg(e.channel_id::text, ',' ORDER BY e.pos), "
    "string_agg(e.seq::text, ',' ORDER BY e.pos), string_agg(e.time_ns::text, ',' ORDER BY e.pos), "
    + ", ".join(_SCAN_VARLEN.format(c=f"e.{c}") for c in ("headers", "tags", "payload"))
    + ", count(*) FILTER (WHERE "
    + " OR ".join(f"e.{c} IS DISTINCT FROM %s" for c in _TEXT_COLS)
    + ")"
)
_SCAN_TEXT: Final = "SELECT " + ", ".join(_SCAN_VARLEN.format(c=f"e.{c}") for c in _TEXT_COLS)


class _Decoder:
    """Turns stored rows into events or str rows, decoding each distinct text value once."""

    __slots__ = ("pubs", "text")

    def __init__(self) -> None:
        self.pubs: dict[tuple[bytes, bytes, bytes, bytes], Publisher] = {}
        self.text: dict[bytes, str] = {}

    def s(self, b: bytes | None) -> str | None:
        if b is None:
            return None
        v = self.text.get(b)
        if v is None:
            v = self.text[b] = b.decode()
        return v

    def events(self, channel: str, epoch: str, rows: Iterable[Sequence[Any]]) -> list[Event]:
        out: list[Event] = []
        for seq, t, dialect, user, app, msg_id, ctype, hb, tb, payload in rows:
            pk = (dialect, user, app, msg_id)
            pub = self.pubs.get(pk)
            if pub is None:
                pub = self.pubs[pk] = Publisher(
                    dialect.decode(), user.decode(), app.decode(), msg_id.decode()
                )
            out.append(
                Event(
                    channel,
                    seq,
                    epoch,
                    t,
                    pub,
                    payload,
                    self.s(ctype) or "",
                    decode_headers(hb) if hb else {},
                    decode_tags(tb) if tb else (),
                )
            )
        return out

    def row(self, r: Sequence[Any]) -> Row:
        """A stored row with its text columns as ``str`` (``None`` stays ``None``)."""
        s = self.s
        return (r[0], r[1], s(r[2]), s(r[3]), s(r[4]), s(r[5]), s(r[6]), r[7], r[8], r[9])


class _SeqStatements:
    """The statements of a channel-order read (:class:`~hubbub.log.read_plan.SeqStatements`) on ``conn``,
    inside the read's snapshot; event rows are read in binary (text columns as bytes). A statement's rows
    all reach the client before the first is read, so a page under a byte budget is ended before it is read
    (it is also the :class:`~hubbub.log.read_plan.BudgetSums`)."""

    __slots__ = ("conn",)

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    def epoch(self, channel: str, epoch: str | None) -> Any:
        if epoch is None:
            return self.conn.execute(
                "SELECT id, epoch, first, top FROM channels WHERE path = %s", (channel,)
            ).fetchone()
        return self.conn.execute(
            "SELECT id, epoch, first, top FROM channels WHERE path = %s AND epoch = %s UNION ALL "
            "SELECT id, epoch, first, top FROM retired_epochs WHERE path = %s AND epoch = %s",
            (channel, epoch, channel, epoch),
        ).fetchone()

    def at_or_after(self, cid: int, seq: int) -> Any:
        return self.conn.execute(
            "SELECT seq, time_ns FROM events WHERE channel_id = %s AND seq >= %s ORDER BY seq LIMIT 1",
            (cid, seq),
        ).fetchone()

    def rows(self, cid: int, lo: int, hi: int, limit: int) -> list[Any]:
        return self.conn.execute(
            f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = %s AND seq BETWEEN %s AND %s "
            "ORDER BY seq LIMIT %s",
            (cid, lo, hi, limit),
            binary=True,
        ).fetchall()

    def compact_rows(self, cid: int, lo: int, hi: int, limit: int, first: Sequence[Any]) -> list[Any]:
        return self.conn.execute(_COMPACT_SELECT, (*first[2:7], cid, lo, hi, limit), binary=True).fetchall()

    def payload_total(self, cid: int, lo: int, hi: int) -> Any:
        return scalar(self.conn.execute(_BUDGET_SUM, (cid, lo, hi)).fetchone())

    def last_under(self, cid: int, lo: int, hi: int, budget: int) -> Any:
        return scalar(self.conn.execute(_BUDGET_TOP, (cid, lo, hi, budget)).fetchone())

    def row(self, cid: int, seq: int) -> Any:
        return self.conn.execute(
            f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = %s AND seq = %s", (cid, seq), binary=True
        ).fetchone()

    def same_as(self, cid: int, lo: int, hi: int, head: Sequence[Any]) -> list[Any]:
        return self.conn.execute(_RUN_SELECT, (cid, lo, hi, *head[2:9]), binary=True).fetchall()

    def count_same(self, cid: int, lo: int, hi: int, head: Sequence[Any]) -> int:
        return int(scalar(self.conn.execute(_RUN_COUNT, (cid, lo, hi, *head[2:9]), binary=True).fetchone()))


class _ReadSide:
    """The read methods of :class:`PostgresLogStore`, which mixes this in (see its concurrency contract).

    :class:`PostgresLogStore` sets these attributes; ``close`` closes ``_pool``."""

    _closed: bool
    _close_lock: threading.Lock
    _pool: psycopg_pool.ConnectionPool[Any] | None
    _pool_timeout_s: float

    def _read(self, fn: Callable[[Conn], T], *, snapshot: bool = True) -> T:
        """Run ``fn`` on a pooled connection (in a REPEATABLE READ, READ ONLY transaction when
        ``snapshot``), retrying once on another connection if this one was dead."""
        for attempt in (0, 1):
            pool = self._pool
            if pool is None or self._closed:
                raise StorageError("log store is closed")
            conn: Conn | None = None
            try:
                conn = pool.getconn(timeout=self._pool_timeout_s)
                try:
                    if snapshot:
                        with conn.transaction():
                            return fn(conn)
                    return fn(conn)
                finally:
                    pool.putconn(conn)
            except _STORAGE_ERRORS as exc:
                if attempt == 0 and conn is not None and conn.broken and not self._closed:
                    # The server went away since this connection was made: drop the pool's other dead
                    # connections and try once more (nothing was changed by a read).
                    with contextlib.suppress(*_STORAGE_ERRORS):
                        pool.check()
                    continue
                raise _error("read", exc) from exc
        raise AssertionError("unreachable")

    # -- reads ---------------------------------------------------------------------------------------

    def head(self, channel: str) -> ChannelInfo:
        def q(conn: Conn) -> ChannelInfo:
            row = conn.execute(f"SELECT {_HEAD_COLS} FROM channels WHERE path = %s", (channel,)).fetchone()
            return ChannelInfo(channel, "", 0, 0, 0) if row is None else ChannelInfo(*row)

        return self._read(q, snapshot=False)

    def heads(self, channels: Iterable[str]) -> dict[str, ChannelInfo]:
        names = list(dict.fromkeys(channels))

        def q(conn: Conn) -> dict[str, ChannelInfo]:
            out = {n: ChannelInfo(n, "", 0, 0, 0) for n in names}
            if names:
                for row in conn.execute(
                    f"SELECT {_HEAD_COLS} FROM channels WHERE path = ANY(%b::text[])", (names,)
                ):
                    out[row[0]] = ChannelInfo(*row)
            return out

        return self._read(q, snapshot=False)

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
        def events(cur: str, rows: list[Any]) -> list[Event]:
            return _Decoder().events(channel, cur, rows) if rows else []

        return self._read_rows(channel, after_seq, limit, from_time, to_time, False, epoch, events)

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
        """See :meth:`LogStore.read_rows`: one snapshot; with ``compact_text`` PostgreSQL compares the text
        columns with the first row's."""

        def text_rows(cur: str, rows: list[Any]) -> tuple[str, list[Row]]:
            dec = _Decoder()
            return cur, [dec.row(r) for r in rows]

        return self._read_rows(channel, after_seq, limit, from_time, to_time, compact_text, epoch, text_rows)

    def _read_rows(
        self,
        channel: str,
        after_seq: int,
        limit: int,
        from_time: int | None,
        to_time: int | None,
        compact_text: bool,
        epoch: str | None,
        post: Callable[[str, list[Any]], T],
    ) -> T:
        """``post(epoch, stored rows)`` (text columns as stored: bytes), run inside the read so that its
        decoding errors are read errors."""
        if limit <= 0:
            self._read(lambda conn: None, snapshot=False)
            return post("", [])

        def q(conn: Conn) -> T:
            st = _SeqStatements(conn)
            return post(
                *channel_rows(
                    st, channel, after_seq, limit, from_time, to_time, compact_text=compact_text, epoch=epoch
                )
            )

        return self._read(q)

    def read_runs(
        self, channel: str, after_seq: int, up_to_seq: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[EventRun]:
        """See :meth:`LogStore.read_runs`. A range whose rows all share the first row's publisher, content
        type, headers and tags is two statements (three or four with ``max_bytes``) and one
        ``(time_ns, payload)`` tuple per row, checked by PostgreSQL; any other range is read whole and
        grouped."""
        if up_to_seq <= after_seq or limit <= 0:
            self._read(lambda conn: None, snapshot=False)
            return []

        def q(conn: Conn) -> list[EventRun]:
            dec = _Decoder()
            st = _SeqStatements(conn)
            return channel_runs(
                st,
                channel,
                after_seq,
                up_to_seq,
                limit,
                max_bytes,
                lambda epoch, row: dec.events(channel, epoch, [row])[0],
                sums=st,
            )

        return self._read(q)

    def read_last(self, channel: str, n: int) -> list[Event]:
        if n <= 0:
            self._read(lambda conn: None, snapshot=False)
            return []

        def q(conn: Conn) -> list[Event]:
            row = conn.execute("SELECT id, epoch FROM channels WHERE path = %s", (channel,)).fetchone()
            if row is None:
                return []
            cid, epoch = row
            rows = conn.execute(
                f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = %s ORDER BY seq DESC LIMIT %s",
                (cid, min(n, MAX_INT64)),
                binary=True,
            ).fetchall()
            rows.reverse()
            return _Decoder().events(channel, epoch, rows)

        return self._read(q)

    def channels(
        self, after: str = "", limit: int = 1000, prefix: str = "", *, include_empty: bool = False
    ) -> list[ChannelInfo]:
        if limit <= 0:
            self._read(lambda conn: None, snapshot=False)
            return []
        sql = f"SELECT {_HEAD_COLS} FROM channels WHERE path > %s"
        if not include_empty:
            sql += " AND count > 0"
        params: list[Any] = [after]
        for op, value in path_bounds(prefix):
            sql += f" AND path {op} %s"
            params.append(value)
        sql += " ORDER BY path LIMIT %s"
        params.append(min(limit, MAX_INT64))
        rows = self._read(lambda conn: conn.execute(sql, params).fetchall(), snapshot=False)
        return [ChannelInfo(*r) for r in rows if r[0].startswith(prefix)]

    def retired_epochs(self, channel: str) -> list[ChannelInfo]:
        rows = self._read(
            lambda conn: conn.execute(
                f"SELECT {_HEAD_COLS} FROM retired_epochs WHERE path = %s ORDER BY id", (channel,)
            ).fetchall(),
            snapshot=False,
        )
        return [ChannelInfo(*r) for r in rows]

    def log_mark(self) -> LogMark:
        row = self._read(
            lambda conn: conn.execute("SELECT last_pos, last_time FROM log_state").fetchone(), snapshot=False
        )
        return LogMark(int(row[0]), int(row[1])) if row else LogMark(0, 0)

    def log_seek(self, time_ns: int) -> int:
        def q(conn: Conn) -> int:
            row = conn.execute("SELECT coalesce(min(pos), 1), coalesce(max(pos), 0) FROM events").fetchone()
            lo, hi = (int(row[0]), int(row[1])) if row else (1, 0)
            return max(_pos_at_time(conn, lo, hi, time_ns) - 1, 0)

        return self._read(q)

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
        params: list[Any] = []
        sql = _LOG_SELECT + _in_scope(scope, params, from_time=False)
        key = "pos DESC" if reverse else "pos"
        sql += " ORDER BY e.pos DESC LIMIT %s" if reverse else " ORDER BY e.pos LIMIT %s"
        params.append(clamp(limit))
        if max_bytes is not None:
            # The budget is applied by the server, on the page's rows only (the window runs over the
            # LIMITed subquery): the rows past the event that reaches it are never sent.
            sql = (
                f"SELECT {_LOG_COLS} FROM (SELECT *, sum(octet_length(payload)) OVER (ORDER BY {key} "
                f"ROWS UNBOUNDED PRECEDING) - octet_length(payload) AS earlier FROM ({sql}) AS p) AS q "
                f"WHERE earlier < %s ORDER BY {key}"
            )
            params.append(clamp(max_bytes))
        rows = self._read(lambda conn: conn.execute(sql, params).fetchall(), snapshot=False)
        dec = _Decoder()
        out: list[Event] = []
        for r in rows:
            out.extend(dec.events(r[1], r[2], [r[3:]]))
        full = page_full((len(r[-1]) for r in rows), max_bytes)
        return LogPage(out, int(rows[-1][0]) if rows else after_pos, full)

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
            "SELECT count(*), coalesce(sum(CASE WHEN length(e.headers) > 0 THEN 1 ELSE 0 END), 0)"
            " FROM events AS e JOIN channels AS c ON c.id = e.channel_id WHERE "
        ) + _in_scope(scope, params)
        row = self._read(lambda conn: conn.execute(sql, params).fetchone(), snapshot=False)
        return (int(row[0]), int(row[1])) if row else (0, 0)

    def log_census(
        self, after_pos: int, mark: LogMark, prefix: str = "", *, from_time: int = 0
    ) -> dict[str, tuple[str, int, int]]:
        scope = log_scope(after_pos, mark, prefix, from_time=from_time)
        if scope is None:
            return {}
        # The rows of the range grouped by channel where they are: no event built.
        params: list[Any] = []
        sql = (
            "SELECT c.path, c.epoch, min(e.seq), max(e.seq) FROM events AS e JOIN channels AS c"
            " ON c.id = e.channel_id WHERE " + _in_scope(scope, params) + " GROUP BY c.path, c.epoch"
        )
        return census(self._read(lambda conn: conn.execute(sql, params).fetchall(), snapshot=False))

    def top_time(self) -> int:
        row = self._read(
            lambda conn: conn.execute("SELECT last_time FROM log_state").fetchone(), snapshot=False
        )
        return int(row[0]) if row else 0

    def stats(self) -> StoreStats:
        row = self._read(
            lambda conn: conn.execute(
                "SELECT (SELECT coalesce(sum(count), 0) FROM channels), "
                "(SELECT coalesce(sum(bytes), 0) FROM channels), "
                "(SELECT count(*) FROM channels WHERE count > 0), "
                "(SELECT count(*) FROM retired_epochs), "
                "(SELECT coalesce(sum(count), 0) FROM retired_epochs), "
                "(SELECT coalesce(sum(bytes), 0) FROM retired_epochs)"
            ).fetchone(),
            snapshot=False,
        )
        assert row is not None
        events, nbytes, channels, retired, r_events, r_bytes = (int(v) for v in row)
        return StoreStats(
            events=events + r_events, bytes=nbytes + r_bytes, channels=channels, retired_epochs=retired
        )

    # -- bulk reads of the data pipeline -------------------------------------------------------------

    def scan_plan(self, size: int, from_time: int | None = None, to_time: int | None = None) -> ScanPlan:
        """See :meth:`LogStore.scan_plan`."""
        size = max(size, 1)

        def q(conn: Conn) -> ScanPlan:
            epochs = conn.execute(
                f"SELECT 0, id, {_HEAD_COLS} FROM channels WHERE count > 0 UNION ALL "
                f"SELECT 1, id, {_HEAD_COLS} FROM retired_epochs ORDER BY 3, 2"
            ).fetchall()
            totals = conn.execute(
                "SELECT coalesce(sum(count), 0), coalesce(sum(bytes), 0) FROM "
                "(SELECT count, bytes FROM channels UNION ALL SELECT count, bytes FROM retired_epochs) AS t"
            ).fetchone()
            assert totals is not None
            first = conn.execute("SELECT pos FROM events ORDER BY pos LIMIT 1").fetchone()
            last = conn.execute("SELECT pos, time_ns FROM events ORDER BY pos DESC LIMIT 1").fetchone()
            return plan_scan(
                epochs,
                (int(totals[0]), int(totals[1])),
                None if first is None or last is None else (first[0], last[0], last[1]),
                from_time,
                to_time,
                lambda lo, hi, t: _pos_at_time(conn, lo, hi, t),
                lambda at: scalar(
                    conn.execute(
                        "SELECT pos FROM events WHERE pos >= %s ORDER BY pos LIMIT 1 OFFSET %s", (at, size)
                    ).fetchone()
                ),
            )

        return self._read(q)

    def scan_columns(
        self,
        lo_pos: int,
        hi_pos: int,
        *,
        max_time: int,
        bounds: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[ScanColumns]:
        """See :meth:`LogStore.scan_columns`: PostgreSQL concatenates each column (``string_agg``) in one
        snapshot; ``bounds`` joins the events with arrays of (epoch id, lowest seq, highest seq). A range
        whose columns are over PostgreSQL's value limit (1 GB) is read in halves."""
        if lo_pos >= hi_pos:
            self._read(lambda conn: None, snapshot=False)
            return []
        join, extra = "", cast(tuple[Any, ...], ())
        if bounds is not None:
            join = (
                " JOIN unnest(%b::int8[], %b::int8[], %b::int8[]) AS b(cid, lo, hi)"
                " ON b.cid = e.channel_id AND e.seq BETWEEN b.lo AND b.hi"
            )
            extra = ([b[0] for b in bounds], [b[1] for b in bounds], [b[2] for b in bounds])

        def q(conn: Conn) -> list[ScanColumns]:
            out: list[ScanColumns] = []
            _scan(conn, join, extra, clamp(lo_pos), clamp(hi_pos), clamp(max_time), out)
            return out

        return self._read(q)


def _scan(
    conn: Conn,
    join: str,
    extra: tuple[Any, ...],
    lo: int,
    hi: int,
    max_time: int,
    out: list[ScanColumns],
) -> None:
    """``scan_columns`` of ``lo <= pos < hi`` into ``out``, halving a range over the value limit."""
    tail = f" FROM events AS e{join} WHERE e.pos >= %s AND e.pos < %s AND e.time_ns <= %s"
    params = (*extra, lo, hi, max_time)
    first = conn.execute(
        "SELECT " + ", ".join(f"e.{c}" for c in _TEXT_COLS) + tail + " ORDER BY e.pos LIMIT 1",
        params,
        binary=True,
    ).fetchone()
    if first is None:
        return
    try:
        with conn.transaction():  # a savepoint: a failed statement must not end the snapshot
            row = conn.execute(_SCAN_SELECT + tail, (*first, *params), binary=True).fetchone()
            assert row is not None
            n, cids, seqs, times, hl, hd, tl, td, pl, pd, varied = row
            text: tuple[str, ...] | tuple[tuple[str, bytes], ...] = tuple(b.decode() for b in first)
            if varied:
                trow = conn.execute(_SCAN_TEXT + tail, params, binary=True).fetchone()
                assert trow is not None
                text = tuple((trow[i], bytes(trow[i + 1])) for i in range(0, 10, 2))
    except (psycopg.errors.ProgramLimitExceeded, psycopg.errors.OutOfMemory):
        if hi - lo <= 1:
            raise
        mid = (lo + hi) // 2
        _scan(conn, join, extra, lo, mid, max_time, out)
        _scan(conn, join, extra, mid, hi, max_time, out)
        return
    out.append(ScanColumns(n, cids, seqs, times, text, (hl, bytes(hd)), (tl, bytes(td)), (pl, bytes(pd))))


#: A :class:`~hubbub.log.read_plan.LogScope`'s fields as read_log's, count_log's and log_census's columns.
_SCOPE_COLS: Final = {"pos": "e.pos", "time_ns": "e.time_ns", "path": "c.path"}
#: _in_scope's conditions rendered, by shape (a handful of them).
_WHERE: dict[tuple[Any, ...], str] = {}


def _in_scope(scope: LogScope, params: list[Any], *, from_time: bool = True) -> str:
    """``scope``'s conditions, their values appended to ``params``, rendered once per shape (a few µs a
    page otherwise)."""
    key = (from_time, scope.shape)
    sql = _WHERE.get(key)
    if sql is None:
        conds = scope.conditions(from_time=from_time)
        sql = _WHERE[key] = " AND ".join(f"{_SCOPE_COLS[field]} {op} %s" for field, op, _ in conds)
    params.extend(scope.values(from_time=from_time))
    return sql


def _pos_at_time(conn: Conn, lo: int, hi: int, t: int) -> int:
    """The smallest ``pos`` in ``[lo, hi]`` of an event with ``time_ns >= t``, or ``hi + 1``."""
    sql = "SELECT pos, time_ns FROM events WHERE pos >= %s ORDER BY pos LIMIT 1"
    return first_at_time(lo, hi, t, lambda mid: conn.execute(sql, (mid,)).fetchone())
