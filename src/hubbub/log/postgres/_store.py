"""``PostgresLogStore``: the shared engine, one PostgreSQL database that several hubbub nodes write to.

This module has the store itself: opening, the writer side (append, trim, epochs, retention) and closing. The
schema, its migrations and durability are in ``_schema.py``; the read side in ``_reads.py``; the rows of a
write transaction in ``_heads.py``; the events rows of an append in ``_rows.py``; errors in ``_errors.py``.

Concurrency contract:

* The writer methods (``append``, ``apply_retention``, ``trim``, ``reset_channel``, ``new_epochs_on_open``,
  ``commits_may_be_lost``, ``close``) use one writer connection and must be called from one thread at a time
  (the core's log writer thread). The store may be opened and closed on another thread.
* Any number of stores, in any number of processes (nodes), may write to one database at once: every write
  transaction first locks the one ``log_state`` row, and reads the heads of its channels after that (there
  is no cache of them), so writes of all nodes are serialised and each allocates its seqs inside its own
  commit (``_schema.py``).
* Reads may come from any thread, concurrently: each takes a connection from a pool (``pool_size``) and runs
  in one snapshot, so it sees whole commits only. ``close`` closes the pool; it must not race with reads
  still running (the core shuts its reader pool down first). Reads after ``close`` raise StorageError.
* ``readonly=True`` opens a **reader only** (the data pipeline): no writer connection, nothing created; the
  database must have this schema version. The writer methods raise :class:`StorageError`.

Failures: any error becomes :class:`StorageError` (4301 ``unavailable`` on the wire) and the transaction is
rolled back, so nothing of a failed append is visible. A write that fails because its connection was dead
before anything was committed (the server restarted since the last write) is retried once on a new
connection, so the first publishes after the server is back succeed. When the connection is lost while the
commit itself is in flight, the outcome is unknown to the client: the store then asks the server, on a new
connection, for the fate of its transaction id (``pg_xact_status``), for up to ``resolve_timeout_s``, and
answers the append's results if it committed. Only if the server cannot be asked in that time does the
append fail with its outcome unknown: its events may then be in the log although the publishers were told
it failed (a retry with an idempotency key is answered with the original).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from hubbub.errors import StorageError, TrimEpochGone, TrimOutOfRange
from hubbub.log.base import (
    AppendRequest,
    AppendResult,
    AppendRun,
    ChannelInfo,
    LogStore,
    RetentionPolicy,
    new_epoch,
)
from hubbub.log.consumers import JournalIndex
from hubbub.log.postgres._consumers import CONSUMER_TOPS, _ConsumerSide
from hubbub.log.postgres._errors import _STORAGE_ERRORS, _error, log
from hubbub.log.postgres._heads import _Head, _heads_row, _info, _Lock, _State, _Unresolved
from hubbub.log.postgres._reads import Conn, _ReadSide
from hubbub.log.postgres._rows import append_rows
from hubbub.log.postgres._schema import (
    DURABILITY_SYNCHRONOUS_COMMIT,
    SCHEMA_VERSION,
    _schema_version,
    ensure_schema,
)
from hubbub.log.postgres._state import _StateSide
from hubbub.log.sequencing import IdemKey, plan_append

__all__ = ["PostgresLogStore"]

T = TypeVar("T")

_NS: Final = 1_000_000_000
# How often (in log time) append forgets expired idempotency keys.
_IDEM_PRUNE_EVERY_NS: Final = 10 * _NS
# Rows per page when retention walks the log in pos order.
_RETENTION_PAGE: Final = 4096

# Array parameters are sent in binary (``%b``): psycopg builds a text array in Python, escaping each bytea
# element through a regular expression (4 µs per 100-byte payload, far more for bytes that need escapes),
# which was most of a publishing node's CPU; the binary form is a length and the bytes (about 0.2 µs).
_SAVE_STATE: Final = (
    "UPDATE log_state SET last_time = %s, last_pos = %s, next_id = %s, suspect_below = %s, async_start = %s"
)
_HEAD_ROW: Final = "id, epoch, first, top, top_time, count, bytes"
_INSERT_CHANNELS: Final = (
    "INSERT INTO channels (id, path, epoch, first, top, top_time, count, bytes) "
    "SELECT * FROM unnest(%b::int8[], %b::text[], %b::text[], %b::int8[], %b::int8[], %b::int8[], "
    "%b::int8[], %b::int8[])"
)
_UPDATE_HEADS: Final = (
    "UPDATE {table} AS c SET first = u.first, top = u.top, top_time = u.top_time, count = u.count, "
    "bytes = u.bytes FROM unnest(%b::int8[], %b::int8[], %b::int8[], %b::int8[], %b::int8[], %b::int8[]) "
    "AS u(id, first, top, top_time, count, bytes) WHERE c.id = u.id"
)
_UPSERT_IDEM: Final = (
    'INSERT INTO idem (channel_id, "user", key, seq, time_ns) '
    "SELECT * FROM unnest(%b::int8[], %b::bytea[], %b::bytea[], %b::int8[], %b::int8[]) "
    'ON CONFLICT (channel_id, "user", key) DO UPDATE SET seq = excluded.seq, time_ns = excluded.time_ns, '
    "origin_id = NULL, origin_epoch = NULL"
)
# The originals of a batch's idempotency keys, with their events where still retained (an original may be in
# a retired epoch: origin_id/origin_epoch, see the SQLite engine's _schema.py).
_FIND_ORIGINALS: Final = (
    "SELECT k.path, k.u, k.key, i.seq, i.time_ns, coalesce(i.origin_epoch, c.epoch), e.publisher_dialect, "
    "e.publisher_user, e.publisher_app, e.publisher_msg_id, e.content_type, e.headers, e.tags, e.payload "
    "FROM unnest(%b::text[], %b::bytea[], %b::bytea[]) AS k(path, u, key) "
    "JOIN channels c ON c.path = k.path "
    'JOIN idem i ON i.channel_id = c.id AND i."user" = k.u AND i.key = k.key '
    "LEFT JOIN events e ON e.channel_id = coalesce(i.origin_id, i.channel_id) AND e.seq = i.seq"
)
# Per-channel max_events: delete below each cut; what went, per channel.
_TRIM_BELOW: Final = (
    "WITH cut AS (SELECT * FROM unnest(%b::int8[], %b::int8[]) AS u(id, cut)), "
    "d AS (DELETE FROM events e USING cut WHERE e.channel_id = cut.id AND e.seq < cut.cut "
    "RETURNING e.channel_id, e.seq, e.size) "
    "SELECT channel_id, count(*), sum(size), max(seq) FROM d GROUP BY channel_id"
)
# Per-channel max_bytes: per channel, the oldest events whose sizes add up to at least its excess, looking
# at no more than ``lim`` events of it (the caller looks further for a channel whose cut is not found).
_FIND_BYTE_CUTS: Final = (
    "SELECT x.id, min(r.seq) FILTER (WHERE r.run >= x.excess) "
    "FROM unnest(%b::int8[], %b::int8[], %b::int8[], %b::int8[]) AS x(id, first, excess, lim) "
    "CROSS JOIN LATERAL (SELECT seq, sum(size) OVER (ORDER BY seq) AS run FROM "
    "(SELECT seq, size FROM events WHERE channel_id = x.id AND seq >= x.first ORDER BY seq LIMIT x.lim) AS s"
    ") AS r GROUP BY x.id"
)
_DELETE_PREFIX: Final = (
    "WITH d AS (DELETE FROM events WHERE pos <= %s RETURNING channel_id, seq, size) "
    "SELECT channel_id, count(*), sum(size), max(seq) FROM d GROUP BY channel_id"
)


class PostgresLogStore(_ReadSide, _ConsumerSide, _StateSide, LogStore):
    """A :class:`LogStore` in a PostgreSQL database (schema: ``_schema.py``; contract: the module docstring).

    ``url``: a libpq connection URI or string (``postgresql://user:password@host:port/dbname?…``).
    ``durability``: ``fsync``, ``commit`` or ``none`` (their ``synchronous_commit``: ``_schema.py``).
    ``retention``: its ``max_events``/``max_bytes`` apply per channel inside every append's transaction.
    ``idem_window_s``: how long idempotency keys are kept (0 turns idempotency off); the keys are in the
    database, so shared by every node. ``clock`` returns nanoseconds since the Unix epoch (tests pass a fake
    one). ``pool_size``: the most reader connections. ``connect_timeout_s``: how long a connection attempt,
    or a read waiting for a pooled connection, may take. ``lock_timeout_s``: how long a write waits for the
    log lock held by another node. ``resolve_timeout_s``: how long an append whose commit was cut off tries
    to learn whether it committed (module docstring).
    """

    engine = "postgres"
    shared = True  # every node of a cluster writes this database
    takes_runs = True

    def __init__(
        self,
        url: str,
        *,
        durability: str = "commit",
        retention: RetentionPolicy | None = None,
        idem_window_s: float = 600,
        clock: Callable[[], int] = time.time_ns,
        readonly: bool = False,
        pool_size: int = 8,
        connect_timeout_s: float = 5.0,
        lock_timeout_s: float = 30.0,
        resolve_timeout_s: float = 10.0,
    ) -> None:
        if durability not in DURABILITY_SYNCHRONOUS_COMMIT:
            raise ValueError(
                f"durability must be one of {', '.join(DURABILITY_SYNCHRONOUS_COMMIT)}, not {durability!r}"
            )
        self._url = url
        self.durability = durability
        self.readonly = readonly
        self._retention = retention or RetentionPolicy()
        self._idem_window_ns = int(max(idem_window_s, 0) * _NS)
        self._clock = clock
        self._connect_timeout_s = max(connect_timeout_s, 1.0)
        self._pool_timeout_s = self._connect_timeout_s
        self._lock_timeout_ms = int(max(lock_timeout_s, 0) * 1000)
        self._resolve_timeout_s = resolve_timeout_s
        self._closed = False
        self._close_lock = threading.Lock()
        self._conn: Conn | None = None
        self._pool: psycopg_pool.ConnectionPool[Any] | None = None
        self._idem_prune_at = 0
        # The consumers' filters as of consumer_gen ``_jgen`` (-1: not loaded yet); see _consumers.py.
        self._jindex = JournalIndex()
        self._jgen = -1
        try:
            if readonly:
                self._check_version()
            else:
                self._open_writer()
            self._pool = psycopg_pool.ConnectionPool(
                url,
                min_size=1,
                max_size=max(pool_size, 1),
                kwargs=self._connect_kwargs(),
                configure=_configure_reader,
                timeout=self._pool_timeout_s,
                name="hubbub-log-readers",
                open=False,
            )
            self._pool.open(wait=False)
        except BaseException:
            self._release()
            raise

    # -- connections ---------------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        return {
            "autocommit": True,
            "connect_timeout": max(int(self._connect_timeout_s), 1),
            "application_name": "hubbub",
            # A server that stops answering (a network partition) is noticed within about a minute.
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
        }

    def _connect(self, what: str) -> Conn:
        try:
            return psycopg.connect(self._url, **self._connect_kwargs())
        except _STORAGE_ERRORS as exc:
            raise _error(what, exc) from exc
        except psycopg.ProgrammingError as exc:  # a malformed connection string
            raise _error(what, exc) from exc

    def _check_version(self) -> None:
        conn = self._connect("open")
        try:
            with conn.transaction():
                found = _schema_version(conn)
        except _STORAGE_ERRORS as exc:
            raise _error("open", exc) from exc
        finally:
            conn.close()
        if found != SCHEMA_VERSION:
            raise StorageError(f"log database has schema version {found}, this hubbub reads {SCHEMA_VERSION}")

    def _open_writer(self) -> None:
        conn = self._writer()
        try:
            ensure_schema(conn)
        except ValueError as exc:
            raise StorageError(str(exc)) from exc
        except _STORAGE_ERRORS as exc:
            raise _error("open", exc) from exc
        # Writes the durability=none marker (synced) and notes a server restart, like any write.
        self._write("open", lambda conn, lock: None)

    def _writer(self) -> Conn:
        """The writer connection, (re)connected if it is gone."""
        if self._closed:
            raise StorageError("log store is closed")
        if self.readonly:
            raise StorageError("log store is open read-only")
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._drop_writer()
        conn = self._connect("connect")
        try:
            conn.execute(f"SET synchronous_commit = {DURABILITY_SYNCHRONOUS_COMMIT[self.durability]}")
            conn.execute(f"SET lock_timeout = {self._lock_timeout_ms}")
            # A node that stalls inside a write transaction must not hold the log lock for ever.
            conn.execute("SET idle_in_transaction_session_timeout = 60000")
        except _STORAGE_ERRORS as exc:
            conn.close()
            raise _error("connect", exc) from exc
        self._conn = conn
        return conn

    def _drop_writer(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    # -- write transactions --------------------------------------------------------------------------

    def _write(self, what: str, body: Callable[[Conn, _Lock], T]) -> T:
        """Run ``body`` in one write transaction that holds the log lock, and commit.

        ``body`` gets the connection (in pipeline mode) and the :class:`_Lock`, whose ``state`` it reads and
        changes; it queues or runs its statements, and the state is saved before the commit. A failure rolls
        back and raises StorageError (``ValueError`` and hubbub's own errors from ``body`` are raised as
        is); see the module docstring for retries and commits whose outcome was cut off."""
        for attempt in (0, 1):
            conn = self._writer()
            st: _State | None = None
            committing = False
            result: T | None = None
            try:
                with conn.pipeline():
                    conn.execute("BEGIN")
                    lock = _Lock(self, conn)
                    result = body(conn, lock)
                    st = lock.state
                    if st.row() != st.saved:
                        conn.execute(_SAVE_STATE, st.row())
                    committing = True
                    conn.execute("COMMIT")
                return result
            except BaseException as exc:
                lost = conn.closed or conn.broken
                if not lost:
                    with contextlib.suppress(Exception):
                        if conn.info.transaction_status != TransactionStatus.IDLE:
                            conn.execute("ROLLBACK")
                else:
                    self._drop_writer()
                if not isinstance(exc, _STORAGE_ERRORS):
                    raise
                if lost and committing and st is not None:
                    try:
                        if self._committed(st.xid):
                            log.warning("postgres: %s: the connection was lost at commit, which took", what)
                            return result  # type: ignore[return-value]
                    except _Unresolved:
                        log.error("postgres: %s: the connection was lost at commit; outcome unknown", what)
                        raise StorageError(f"log {what} failed (commit outcome unknown)") from exc
                    # Not committed: like any failure below.
                if lost and attempt == 0 and not committing:
                    # The connection was dead before anything could commit: once more on a new one.
                    log.info("postgres: %s: the connection was lost; retrying on a new one", what)
                    continue
                raise _error(what, exc) from exc
        raise AssertionError("unreachable")

    def _fetch_state(self, conn: Conn, cur: psycopg.Cursor[Any]) -> _State:
        row = cur.fetchone()
        if row is None:
            raise StorageError("log database has no log_state row")
        last_time, last_pos, next_id, suspect_below, async_start, server_start, xid = row
        st = _State(last_time, last_pos, next_id, suspect_below, async_start, server_start, xid)
        st.saved = st.row()
        if st.async_start is not None and st.async_start != server_start:
            # The server restarted after commits that were acknowledged before they were on its disk
            # (durability=none): the current epochs may have lost their last commits.
            st.suspect_below = st.next_id
            st.async_start = None
        if self.durability == "none" and st.async_start != server_start:
            # Record, synced, that this server run gets unsynced commits (before the first of them).
            st.async_start = server_start
            conn.execute("SET LOCAL synchronous_commit = on")
        return st

    def _committed(self, xid: str) -> bool:
        """Whether transaction ``xid`` committed, asked on a new connection (raises _Unresolved)."""
        deadline = time.monotonic() + self._resolve_timeout_s
        while True:
            try:
                with psycopg.connect(self._url, **self._connect_kwargs()) as conn:
                    row = conn.execute("SELECT pg_xact_status(%s::xid8)", (xid,)).fetchone()
                status = row[0] if row else None
                if status == "committed":
                    return True
                if status == "aborted":
                    return False
                if status is None:
                    raise _Unresolved
                # "in progress": the server has not noticed the lost connection yet.
            except psycopg.Error:
                pass
            if time.monotonic() >= deadline:
                raise _Unresolved
            time.sleep(0.1)

    @staticmethod
    def _heads(conn: Conn, names: Sequence[str]) -> psycopg.Cursor[Any]:
        """Queue the read of the ``channels`` rows of ``names`` (after the log lock: the newest commit)."""
        return conn.execute(
            f"SELECT path, {_HEAD_ROW} FROM channels WHERE path = ANY(%b::text[])", (list(names),)
        )

    # -- writer side ---------------------------------------------------------------------------------

    def append(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult]:
        if not batch:
            self._writer()
            return []
        return self._write("append", lambda conn, lock: self._append(conn, lock, batch))

    def _append(
        self, conn: Conn, lock: _Lock, batch: Sequence[AppendRequest | AppendRun]
    ) -> list[AppendResult]:
        window = self._idem_window_ns
        names = list(dict.fromkeys(r.channel for r in batch))
        heads_cur = self._heads(conn, names)
        tops_cur = conn.execute(CONSUMER_TOPS)
        orig_cur = None
        if window:
            keys = {(r.channel, r.publisher.user, r.idem) for r in batch if r.idem}
            if keys:
                orig_cur = conn.execute(
                    _FIND_ORIGINALS,
                    (
                        [k[0] for k in keys],
                        [k[1].encode() for k in keys],
                        [k[2].encode() for k in keys],
                    ),
                    binary=True,
                )
        st = lock.state
        heads: dict[str, _Head] = {row[0]: _Head(*row[1:]) for row in heads_cur.fetchall()}
        originals: dict[IdemKey, Any] = {}
        if orig_cur is not None:
            originals = {(r[1].decode(), r[0], r[2].decode()): r for r in orig_cur.fetchall()}
        plan = plan_append(
            batch, heads, st.last_time, self._clock(), window, {k: r[4] for k, r in originals.items()}
        )
        created = plan.created
        for new_name in created:
            heads[new_name] = _Head(st.next_id, new_epoch(), 1, 0, 0, 0, 0)
            st.next_id += 1
        results, pos = append_rows(conn, batch, plan, heads, st.last_pos, originals)
        touched = {n: heads[n] for n in plan.tops}
        pol = self._retention
        if pol.max_events or pol.max_bytes:
            self._trim_per_channel(conn, list(touched.values()))
        if created:
            new = [heads[n] for n in created]
            conn.execute(
                _INSERT_CHANNELS,
                (
                    [h.id for h in new],
                    created,
                    [h.epoch for h in new],
                    *_heads_row(new)[1:],
                ),
            )
        if len(touched) > len(created):
            made = set(created)
            conn.execute(
                _UPDATE_HEADS.format(table="channels"),
                _heads_row([h for n, h in touched.items() if n not in made]),
            )
        if plan.keys:
            recorded = plan.keys
            conn.execute(
                _UPSERT_IDEM,
                (
                    [heads[k[1]].id for k in recorded],
                    [k[0].encode() for k in recorded],
                    [k[2].encode() for k in recorded],
                    [plan.seqs[i] for i, _ in recorded.values()],
                    [t for _, t in recorded.values()],
                ),
            )
        t = plan.last_time
        if window and t >= self._idem_prune_at:
            conn.execute("DELETE FROM idem WHERE time_ns <= %s", (t - window,))
            self._idem_prune_at = t + min(window, _IDEM_PRUNE_EVERY_NS)
        st.last_time, st.last_pos = t, pos
        self._journal(conn, results, tops_cur)
        return results

    def _trim_per_channel(self, conn: Conn, touched: list[_Head]) -> None:
        """Apply ``max_events`` and ``max_bytes`` to the channels just appended to (after the insert)."""
        pol = self._retention
        by_id = {h.id: h for h in touched}
        if pol.max_events:
            over = [h for h in touched if h.count > pol.max_events]
            if over:
                self._apply_cuts(
                    conn,
                    by_id,
                    conn.execute(
                        _TRIM_BELOW, ([h.id for h in over], [h.top - pol.max_events + 1 for h in over])
                    ).fetchall(),
                )
        if pol.max_bytes:
            over = [h for h in touched if h.bytes > pol.max_bytes]
            lim = 64
            cuts: dict[int, int] = {}
            while over:
                rows = conn.execute(
                    _FIND_BYTE_CUTS,
                    (
                        [h.id for h in over],
                        [h.first for h in over],
                        [h.bytes - pol.max_bytes for h in over],
                        [lim] * len(over),
                    ),
                ).fetchall()
                found = {cid: cut for cid, cut in rows if cut is not None}
                cuts.update(found)
                # A channel whose excess the first ``lim`` events do not cover: look further.
                over = [h for h in over if h.id not in found and lim < h.count]
                lim *= 16
            if cuts:
                self._apply_cuts(
                    conn,
                    by_id,
                    conn.execute(_TRIM_BELOW, (list(cuts), [c + 1 for c in cuts.values()])).fetchall(),
                )

    @staticmethod
    def _apply_cuts(conn: Conn, by_id: dict[int, _Head], rows: Sequence[Sequence[Any]]) -> int:
        """Update heads from ``(channel id, events, bytes, highest seq)`` of deleted prefixes."""
        removed = 0
        for cid, n, nbytes, top_seq in rows:
            h = by_id[cid]
            h.first = max(h.first, top_seq + 1)
            h.count -= n
            h.bytes -= int(nbytes)
            removed += n
        return removed

    def trim(self, channel: str, up_to_seq: int, *, epoch: str | None = None) -> ChannelInfo:
        def body(conn: Conn, lock: _Lock) -> ChannelInfo:
            row = conn.execute(f"SELECT {_HEAD_ROW} FROM channels WHERE path = %s", (channel,)).fetchone()
            h = None if row is None else _Head(*row)
            table = "channels"
            if epoch is not None and (h is None or h.epoch != epoch):
                row = conn.execute(
                    f"SELECT {_HEAD_ROW} FROM retired_epochs WHERE path = %s AND epoch = %s", (channel, epoch)
                ).fetchone()
                if row is None:
                    current = ChannelInfo(channel, "", 0, 0, 0) if h is None else _info(channel, h)
                    raise TrimEpochGone(current, epoch)
                h, table = _Head(*row), "retired_epochs"
            top = 0 if h is None else h.top
            if not 0 <= up_to_seq <= top:
                raise TrimOutOfRange(up_to_seq, top)
            if h is None:
                return ChannelInfo(channel, "", 0, 0, 0)
            if up_to_seq >= h.first:
                self._apply_cuts(
                    conn, {h.id: h}, conn.execute(_TRIM_BELOW, ([h.id], [up_to_seq + 1])).fetchall()
                )
                conn.execute(_UPDATE_HEADS.format(table=table), _heads_row([h]))
                if table == "retired_epochs":
                    conn.execute("DELETE FROM retired_epochs WHERE id = %s AND count <= 0", (h.id,))
            return _info(channel, h)

        return self._write("trim", body)

    def _start_epochs(self, conn: Conn, lock: _Lock, names: Sequence[str] | None) -> dict[str, _Head]:
        """Give each channel (``None``: every channel) a new epoch: a new ``channels`` row with a new id. The
        old row, if any, moves to ``retired_epochs`` (when it holds events) with its id, so its events stay
        where they are; its idempotency keys move to the new row. Inside a write transaction."""
        if names is None:
            rows = conn.execute(f"SELECT path, {_HEAD_ROW} FROM channels").fetchall()
            names = [r[0] for r in rows]
        else:
            rows = self._heads(conn, names).fetchall()
        st = lock.state
        old = {r[0]: _Head(*r[1:]) for r in rows}
        new: dict[str, _Head] = {}
        for name in names:
            new[name] = _Head(st.next_id, new_epoch(), 1, 0, 0, 0, 0)
            st.next_id += 1
        if old:
            old_ids = [h.id for h in old.values()]
            conn.execute(
                "INSERT INTO retired_epochs (id, path, epoch, first, top, top_time, count, bytes) "
                "SELECT id, path, epoch, first, top, top_time, count, bytes FROM channels "
                "WHERE id = ANY(%b::int8[]) AND count > 0",
                (old_ids,),
            )
            conn.execute("DELETE FROM channels WHERE id = ANY(%b::int8[])", (old_ids,))
            conn.execute(
                "UPDATE idem SET channel_id = m.new, origin_id = coalesce(idem.origin_id, m.old), "
                "origin_epoch = coalesce(idem.origin_epoch, m.epoch) "
                "FROM unnest(%b::int8[], %b::int8[], %b::text[]) AS m(new, old, epoch) "
                "WHERE idem.channel_id = m.old",
                (
                    [new[n].id for n in old],
                    [h.id for h in old.values()],
                    [h.epoch for h in old.values()],
                ),
            )
        heads = list(new.values())
        conn.execute(
            _INSERT_CHANNELS,
            ([h.id for h in heads], list(new), [h.epoch for h in heads], *_heads_row(heads)[1:]),
        )
        return new

    def reset_channel(self, channel: str) -> ChannelInfo:
        h = self._write("reset", lambda conn, lock: self._start_epochs(conn, lock, [channel]))[channel]
        return ChannelInfo(channel, h.epoch, 1, 0, 0)

    def new_epochs_on_open(self) -> None:
        self._write("reset", lambda conn, lock: self._start_epochs(conn, lock, None))

    def commits_may_be_lost(self, channel: str, epoch: str) -> bool:
        def body(conn: Conn, lock: _Lock) -> bool:
            row = conn.execute("SELECT id, epoch FROM channels WHERE path = %s", (channel,)).fetchone()
            return row is not None and row[1] == epoch and row[0] < lock.state.suspect_below

        return self._write("read", body)

    def apply_retention(self, policy: RetentionPolicy, now_ns: int) -> int:
        cutoff = now_ns - policy.max_age_s * _NS if policy.max_age_s else None
        cap = policy.max_total_bytes
        if cutoff is None and not cap:
            self._writer()
            return 0

        def body(conn: Conn, lock: _Lock) -> int:
            total_row = conn.execute(
                "SELECT (SELECT coalesce(sum(bytes), 0) FROM channels) "
                "+ (SELECT coalesce(sum(bytes), 0) FROM retired_epochs)"
            ).fetchone()
            total = int(total_row[0]) if total_row else 0
            if cutoff is None and total <= cap:
                return 0
            # ``pos`` order is commit order is time order: the events to drop are a prefix of the log.
            last_pos, after, done = 0, 0, False
            while not done:
                page = conn.execute(
                    "SELECT pos, time_ns, size FROM events WHERE pos > %s ORDER BY pos LIMIT %s",
                    (after, _RETENTION_PAGE),
                ).fetchall()
                if not page:
                    break
                for p, t, size in page:
                    if not ((cutoff is not None and t < cutoff) or (cap and total > cap)):
                        done = True
                        break
                    total -= size
                    last_pos = p
                after = page[-1][0]
            if not last_pos:
                return 0
            cuts = conn.execute(_DELETE_PREFIX, (last_pos,)).fetchall()
            removed = 0
            cols: list[list[int]] = [[], [], [], []]
            for cid, n, nbytes, top_seq in cuts:
                for col, v in zip(cols, (cid, top_seq + 1, n, int(nbytes)), strict=True):
                    col.append(v)
                removed += n
            for table in ("channels", "retired_epochs"):
                conn.execute(
                    f"UPDATE {table} AS c SET first = greatest(c.first, u.cut), count = c.count - u.n, "
                    "bytes = c.bytes - u.b FROM unnest(%b::int8[], %b::int8[], %b::int8[], %b::int8[]) "
                    "AS u(id, cut, n, b) WHERE c.id = u.id",
                    cols,
                )
            conn.execute("DELETE FROM retired_epochs WHERE count <= 0")
            return removed

        return self._write("retention", body)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._release()

    def _release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                pool.close(timeout=self._connect_timeout_s)
        self._drop_writer()
        self._drop_holds()


def _configure_reader(conn: Conn) -> None:
    """Every pooled reader connection: snapshot transactions (``REPEATABLE READ``), read-only."""
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
