"""``SqliteLogStore``: the embedded default engine, one SQLite database file in WAL mode.

This module has the store itself: opening, the lock file, the writer side (append, trim, epochs, retention)
and closing. The schema, its migration, the lost-commits marker and durability are in ``_schema.py``; how
append writes rows in ``_inserts.py``; the read side in ``_reads.py``; checkpoints in ``_checkpointer.py``;
errors in ``_errors.py``; the rows an append writes in ``_rows.py``.

Concurrency contract:

* The writer methods (``append``, ``apply_retention``, ``trim``, ``reset_channel``, ``new_epochs_on_open``,
  ``commits_may_be_lost``, ``close``)
  use one writer connection and a cache of every channel's head, and must be called from one thread at a
  time (the core's log writer thread). The store may be opened on another thread (the connection is created
  with ``check_same_thread=False`` for that reason and for ``close``).
* Reads may come from any thread, concurrently: each thread gets its own read-only connection (a
  ``threading.local``), and every read runs in one snapshot, so it sees whole commits only.
* ``close`` stops the checkpoint thread and closes every reader connection too; it must not race with reads
  still running (the core shuts its reader pool down first). Reads after ``close`` raise
  :class:`StorageError`.
* One database file has one writer: opening takes an exclusive ``flock`` on ``<file>.lock``; a second store on
  the same file (in this process or another) fails with :class:`StorageError`.
* ``readonly=True`` opens a **reader only** (the data pipeline reading a running server's file): no lock file,
  no writer connection, no checkpointer, nothing created; the file must exist with this schema version. Its
  read methods work as above (each read one snapshot, concurrently with the owning server's writer); the
  writer methods raise :class:`StorageError`.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import msgpack

from hubbub.errors import StorageError, TrimEpochGone, TrimOutOfRange
from hubbub.events import Event
from hubbub.log.appended import Committed
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
from hubbub.log.sequencing import AppendPlan, IdemKey, plan_append, rebuilt_original
from hubbub.log.sqlite._checkpointer import _Checkpointer
from hubbub.log.sqlite._columns import ColumnReads
from hubbub.log.sqlite._consumers import _ConsumerSide, _Row
from hubbub.log.sqlite._errors import _STORAGE_ERRORS, _error, log
from hubbub.log.sqlite._idem import Original, find_originals, insert_keys, insert_new_keys, original_rows
from hubbub.log.sqlite._rows import _Head, write_rows
from hubbub.log.sqlite._schema import (
    _WRITER_CLOSED,
    DURABILITY_SYNCHRONOUS,
    SCHEMA_VERSION,
    _connect_writer,
)
from hubbub.log.sqlite._state import _StateSide

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["SqliteLogStore"]

_NS: Final = 1_000_000_000
# How often (in log time) append forgets expired idempotency keys.
_IDEM_PRUNE_EVERY_NS: Final = 10 * _NS
# The most expired idempotency keys one append deletes (plus those of the same commit time as the last): a
# larger backlog of expired keys goes over the next appends, so no commit (some run on the event loop,
# ``inline_append_max``) pays for minutes of keyed traffic at once. Expired keys left over are never taken for
# live ones: lookups compare the key's time with the window.
_IDEM_PRUNE_MAX: Final = 2000
_IDEM_PRUNE_BOUND: Final = "SELECT time_ns FROM idem WHERE time_ns <= ? ORDER BY time_ns LIMIT 1 OFFSET ?"
_IDEM_PRUNE: Final = "DELETE FROM idem WHERE time_ns <= ?"
# The most events an append may have to run on the event loop (``inline_append_max``, base.py): a commit of
# 1,024 events of 100 bytes holds the loop for about 4-5 ms on the 2-core dev machine. On the writer thread
# instead, the same commit holds the GIL for most of that time anyway (its Python part), and the hand-offs
# and GIL waits around it cost the server 0-3 µs of CPU per event more (bench/consumer_wire.py, batches of
# 100, 6 alternating pairs: 13.2-16.3 against 12.5-14.5 µs per event, 1.7 less in the median pair), with no
# better latency for other connections meanwhile (a probe publishing every 2 ms beside a publisher of
# 1,000-event windows: p99 14.5-16.2 ms on the thread, 15.0-15.4 ms inline). A limit of 64 sent a
# pipelining publisher's every read to the thread.
_INLINE_APPEND_MAX: Final = 1024
# And the most payload bytes it may hold (``inline_append_max_bytes``): 1,024 events of up to 1 KiB; a few
# large events (64 of 1 MiB, say) would otherwise hold the loop for a 64 MiB commit.
_INLINE_APPEND_MAX_BYTES: Final = 1 << 20

_INSERT_CHANNEL: Final = (
    "INSERT INTO channels (id, path, epoch, first, top, top_time, count, bytes) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_UPDATE_CHANNEL: Final = (
    "UPDATE channels SET first = ?, top = ?, top_time = ?, count = ?, bytes = ? WHERE id = ?"
)
_SET_LAST_TIME: Final = "UPDATE meta SET value = ? WHERE key = 'last_time'"
_INSERT_RETIRED: Final = (
    "INSERT INTO retired_epochs (id, path, epoch, first, top, top_time, count, bytes) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# The idempotency keys of a retired epoch follow the channel to its new row and remember the original's.
_MOVE_IDEM: Final = (
    "UPDATE idem SET channel_id = ?1, origin_id = coalesce(origin_id, ?2), "
    "origin_epoch = coalesce(origin_epoch, ?3) WHERE channel_id = ?2"
)


def _times(originals: Mapping[IdemKey, Original]) -> dict[IdemKey, int]:
    """The time of each key on record, as :func:`plan_append` takes them."""
    return {k: o[1] for k, o in originals.items()}


def _idem_rows(plan: AppendPlan, heads: Mapping[str, _Head]) -> list[Any]:
    """The ``idem`` rows of the keys ``plan`` records (flat: channel id, user, key, seq, time_ns per key)."""
    rows: list[Any] = []
    seqs = plan.seqs
    for (user, name, idem), (i, t) in plan.keys.items():
        rows += (heads[name].id, user, idem, seqs[i], t)
    return rows


class SqliteLogStore(_ConsumerSide, _StateSide, LogStore):
    """A :class:`LogStore` in one SQLite file (schema: ``_schema.py``; contract: the module docstring).

    ``path``: the database file (created if absent; its directory must exist). ``durability``: ``fsync``,
    ``commit`` or ``none``. ``retention``: its ``max_events``/``max_bytes`` apply per channel inside every
    append's transaction. ``idem_window_s``: how long idempotency keys are kept (0 turns idempotency off).
    ``clock`` returns nanoseconds since the Unix epoch (tests pass a fake one). ``busy_timeout_ms``: how long
    a statement waits for a lock held by another connection (another process reading or backing up the file).
    """

    engine = "sqlite"
    # A connection's burst is one request (``_rows._run_rows``): no request object per event.
    takes_runs = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "commit",
        retention: RetentionPolicy | None = None,
        idem_window_s: float = 600,
        clock: Callable[[], int] = time.time_ns,
        busy_timeout_ms: int = 5000,
        readonly: bool = False,
    ) -> None:
        if durability not in DURABILITY_SYNCHRONOUS:
            raise ValueError(
                f"durability must be one of {', '.join(DURABILITY_SYNCHRONOUS)}, not {durability!r}"
            )
        self.path = Path(path).absolute()
        self.durability = durability
        # A settle is a small transaction; without fsync its commit only writes the WAL (page cache), and the
        # checkpointer is PASSIVE, so it never waits for a lock: core may run it on the loop (base.py).
        self.inline_settle = durability != "fsync"
        # Likewise a small append (base.py): measured in bench/consumer_wire.py (bench/RESULTS.md, "Small
        # commits on the loop").
        self.inline_append_max = _INLINE_APPEND_MAX if durability != "fsync" else 0
        self.inline_append_max_bytes = _INLINE_APPEND_MAX_BYTES if durability != "fsync" else 0
        self._retention = retention or RetentionPolicy()
        self._idem_window_ns = int(max(idem_window_s, 0) * _NS)
        self._clock = clock
        self._busy_timeout_ms = max(busy_timeout_ms, 0)
        self._closed = False
        self._close_lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._reader_uri = self.path.as_uri() + "?mode=ro"
        self._names: dict[int, tuple[str, str]] = {}  # see _ReadSide._channel_names
        self._columns = ColumnReads()  # replay pages read as columns (_columns.py)
        # Writer state (writer thread only).
        self._heads: dict[str, _Head] = {}
        # Retired epochs holding events: id -> (channel, head).
        self._retired: dict[int, tuple[str, _Head]] = {}
        self._next_id = 1
        self._suspect_below = 0
        self._last_time = 0
        self._idem_prune_at = 0
        self._idem_optimistic = False  # see _idem.py
        self._packer = msgpack.Packer(use_bin_type=True)  # append's (the writer's) header and tag columns
        self._lock_fd = -1
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: _Checkpointer | None = None
        self._crows: dict[int, _Row] = {}
        self._jindex = JournalIndex()
        self.readonly = readonly
        if readonly:
            self._open_readonly()
            return
        try:
            self._lock_file()
            self._conn = _connect_writer(self.path, self.durability, self._busy_timeout_ms)
            self._load()
            try:
                self._checkpointer = _Checkpointer(self.path, DURABILITY_SYNCHRONOUS[durability])
            except sqlite3.Error as exc:
                raise _error("open", exc) from exc
        except BaseException:
            self._release()
            raise

    # -- opening -------------------------------------------------------------------------------------

    def _open_readonly(self) -> None:
        if not self.path.is_file():
            raise StorageError("log database does not exist")
        try:
            row = self._one("SELECT value FROM meta WHERE key = 'schema_version'")
        except StorageError:
            self._release()
            raise
        if row is None or row[0] != SCHEMA_VERSION:
            self._release()
            raise StorageError(
                f"log database has schema version {row and row[0]}, this hubbub reads {SCHEMA_VERSION}"
            )

    def _lock_file(self) -> None:
        if fcntl is None:  # pragma: no cover - not POSIX
            return
        try:
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _error("open", exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            msg = "log database is in use by another store (another hubbub serve on it?)"
            raise StorageError(msg) from exc
        self._lock_fd = fd

    def _load(self) -> None:
        """(Re)load the writer's cache from the database."""
        conn = self._writer()
        try:
            heads: dict[str, _Head] = {}
            retired: dict[int, tuple[str, _Head]] = {}
            next_id = 1
            for cid, path, epoch, first, top, top_time, count, nbytes in conn.execute(
                "SELECT id, path, epoch, first, top, top_time, count, bytes FROM channels"
            ):
                heads[path] = _Head(cid, epoch, first, top, top_time, count, nbytes)
                next_id = max(next_id, cid + 1)
            for cid, path, epoch, first, top, top_time, count, nbytes in conn.execute(
                "SELECT id, path, epoch, first, top, top_time, count, bytes FROM retired_epochs"
            ):
                retired[cid] = (path, _Head(cid, epoch, first, top, top_time, count, nbytes))
                next_id = max(next_id, cid + 1)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            self._load_consumers(conn)
        except sqlite3.Error as exc:
            raise _error("open", exc) from exc
        self._heads, self._retired, self._next_id = heads, retired, next_id
        self._last_time, self._suspect_below = int(meta["last_time"]), int(meta["suspect_below"])

    def _writer(self) -> sqlite3.Connection:
        conn = self._conn
        if self.readonly and not self._closed:
            raise StorageError("log store is open read-only")
        if conn is None or self._closed:
            raise StorageError("log store is closed")
        return conn

    @contextlib.contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction. On failure: roll back, reload the head cache, raise StorageError."""
        conn = self._writer()
        try:
            conn.execute("BEGIN IMMEDIATE")
            yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            # The cache may hold changes of the rolled-back transaction.
            self._load()
            if isinstance(exc, _STORAGE_ERRORS):
                raise _error(what, exc) from exc
            raise

    # -- writer side ---------------------------------------------------------------------------------

    def append(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult]:
        return self._append(batch, False)  # type: ignore[return-value]  # (no RunAppended without runs)

    def append_runs(self, batch: Sequence[AppendRequest | AppendRun]) -> list[Committed]:
        """``RunAppender.append_runs``: every result is built, as :meth:`append` builds them, while a
        durable consumer exists (the journal is written from them)."""
        return self._append(batch, not self._jindex)

    def _append(self, batch: Sequence[AppendRequest | AppendRun], as_runs: bool) -> list[Committed]:
        if not batch:
            self._writer()
            return []
        with self._transaction("append") as conn:
            now = self._clock()
            window = self._idem_window_ns
            heads = self._heads
            limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
            # Optimistic keys (see _idem.py): the batch's keys are written as new ones without looking them up
            # first; if any was there already, they are written again once the plan has looked them up.
            optimistic = bool(window) and self._idem_optimistic
            # The keys' rows, looked up per batch before any is written (so as the requests see them).
            originals = find_originals(conn, heads, batch) if window and not optimistic else {}
            plan = plan_append(batch, heads, self._last_time, now, window, _times(originals))
            created = plan.created
            for name in created:
                heads[name] = _Head(self._next_id, new_epoch(), 1, 0, 0, 0, 0)
                self._next_id += 1
            if plan.keys:
                rows = _idem_rows(plan, heads)
                if not optimistic:
                    insert_keys(conn, rows, limit)
                else:
                    conn.execute("SAVEPOINT idem_new")
                    if insert_new_keys(conn, rows, limit):
                        conn.execute("RELEASE idem_new")
                    else:
                        # A key was known: undo the keys (nothing else is written yet), look them up, plan
                        # again (the channels the first plan created have heads now, at top 0).
                        conn.execute("ROLLBACK TO idem_new")
                        conn.execute("RELEASE idem_new")
                        self._idem_optimistic = optimistic = False
                        originals = find_originals(conn, heads, batch)
                        plan = plan_append(batch, heads, self._last_time, now, window, _times(originals))
                        insert_keys(conn, _idem_rows(plan, heads), limit)
            if window and not optimistic and not originals:
                self._idem_optimistic = True  # no key of this batch was known: the next one may hope so
            found = original_rows(conn, originals) if plan.dups and originals else {}

            def original(name: str, req: AppendRequest) -> Event:
                return self._original(name, originals[(req.publisher.user, name, req.idem)], req, found)

            results, touched = write_rows(conn, batch, plan, heads, self._packer, original, limit, as_runs)
            t = plan.last_time
            # The new events' ``events.pos`` (the journal refers to them): consecutive, in order, up to the
            # last one's, SQLite's rowids of the rows inserted last.
            last_ref = conn.execute("SELECT last_insert_rowid()").fetchone()[0] if self._jindex else 0
            pol = self._retention
            limited = bool(pol.max_events or pol.max_bytes)
            if limited:
                for h in touched:
                    self._trim_per_channel(conn, h)
            if created:
                conn.executemany(
                    _INSERT_CHANNEL,
                    [(heads[n].id, n, heads[n].epoch, *heads[n].row()[:5]) for n in created],
                )
            if len(touched) > len(created):
                made = set(created)
                conn.executemany(_UPDATE_CHANNEL, [heads[n].row() for n in plan.tops if n not in made])
            if window and t >= self._idem_prune_at:
                self._prune_idem(conn, t - window, t + min(window, _IDEM_PRUNE_EVERY_NS))
            if t != self._last_time:
                conn.execute(_SET_LAST_TIME, (t,))
            if self._jindex:
                self._journal(conn, results, last_ref, limited)  # type: ignore[arg-type]  # (not as_runs)
        self._last_time = t
        if self._checkpointer is not None:
            self._checkpointer.kick()
        return results

    def _prune_idem(self, conn: sqlite3.Connection, expired: int, next_at: int) -> None:
        """Delete idempotency keys written at or before ``expired``, at most about ``_IDEM_PRUNE_MAX`` of
        them: when more are left, the next append goes on (``_idem_prune_at`` stays), else at ``next_at``."""
        bound = conn.execute(_IDEM_PRUNE_BOUND, (expired, _IDEM_PRUNE_MAX)).fetchone()
        if bound is None:
            conn.execute(_IDEM_PRUNE, (expired,))
            self._idem_prune_at = next_at
        else:
            conn.execute(_IDEM_PRUNE, (bound[0],))

    def _original(
        self,
        name: str,
        key: Original,
        req: AppendRequest,
        rows: Mapping[tuple[int, int], Sequence[Any]],
    ) -> Event:
        """The event a repeated idempotency key first appended (its ``idem`` row: ``key``; ``rows``: the
        batch's originals read by ``original_rows``). It may be in a retired epoch of the channel: the key
        was acknowledged there, and the event is still in the log."""
        seq, t, cid, epoch = key
        row = rows.get((cid, seq))
        if row is not None:
            return self._events(name, epoch, [row])[0]
        return rebuilt_original(req, name, seq, epoch, t)  # trimmed since: rebuilt from the repeated request

    def _trim_per_channel(self, conn: sqlite3.Connection, h: _Head) -> None:
        pol = self._retention
        if pol.max_events and h.count > pol.max_events:
            self._delete_below(conn, h, h.top - pol.max_events + 1)
        if pol.max_bytes and h.bytes > pol.max_bytes:
            excess = h.bytes - pol.max_bytes
            cut, removed = h.first, 0
            cur = conn.execute(
                "SELECT seq, size FROM events WHERE channel_id = ? AND seq >= ? ORDER BY seq", (h.id, h.first)
            )
            try:
                for seq, size in cur:
                    cut, removed = seq + 1, removed + size
                    if removed >= excess:
                        break
            finally:
                cur.close()
            self._delete_below(conn, h, cut, removed)

    def _delete_below(
        self, conn: sqlite3.Connection, h: _Head, cut: int, removed_bytes: int | None = None
    ) -> int:
        """Delete the channel's events with ``seq < cut`` (the journal items that refer to them get their
        copies first); update the head. Returns how many."""
        cut = min(cut, h.top + 1)
        n = cut - h.first
        if n <= 0:
            return 0
        if any(c.pending for c in self._crows.values()):
            # The channel's last event to go is its highest ``events.pos`` among them (log order).
            last = conn.execute(
                "SELECT pos FROM events WHERE channel_id = ? AND seq = ?", (h.id, cut - 1)
            ).fetchone()
            if last is not None:
                self._copy_refs(conn, last[0], (h.id, cut))
        if removed_bytes is None:
            removed_bytes = conn.execute(
                "SELECT coalesce(sum(size), 0) FROM events WHERE channel_id = ? AND seq < ?", (h.id, cut)
            ).fetchone()[0]
        conn.execute("DELETE FROM events WHERE channel_id = ? AND seq < ?", (h.id, cut))
        h.first = cut
        h.count -= n
        h.bytes -= removed_bytes
        return n

    def trim(self, channel: str, up_to_seq: int, *, epoch: str | None = None) -> ChannelInfo:
        self._writer()
        h = self._heads.get(channel)
        rid: int | None = None
        if epoch is not None and (h is None or h.epoch != epoch):
            found = self._retired_id(channel, epoch)
            if found is None:
                current = ChannelInfo(channel, "", 0, 0, 0) if h is None else h.info(channel)
                raise TrimEpochGone(current, epoch)
            rid = found
            h = self._retired[rid][1]
        top = 0 if h is None else h.top
        if not 0 <= up_to_seq <= top:
            raise TrimOutOfRange(up_to_seq, top)
        if h is None:
            return ChannelInfo(channel, "", 0, 0, 0)
        if up_to_seq >= h.first:
            with self._transaction("trim") as conn:
                self._delete_below(conn, h, up_to_seq + 1)
                if rid is None:
                    conn.execute(_UPDATE_CHANNEL, h.row())
                else:
                    self._save_retired(conn, (rid,))
            if self._checkpointer is not None:
                self._checkpointer.kick()
        return h.info(channel)

    def _retired_id(self, channel: str, epoch: str) -> int | None:
        for rid, (path, h) in self._retired.items():
            if path == channel and h.epoch == epoch:
                return rid
        return None

    def _save_retired(self, conn: sqlite3.Connection, ids: Iterable[int]) -> None:
        """Write the changed heads of retired epochs; delete those left without events."""
        heads = [self._retired[rid][1] for rid in ids]
        conn.executemany(
            "UPDATE retired_epochs SET first = ?, top = ?, top_time = ?, count = ?, bytes = ? WHERE id = ?",
            [h.row() for h in heads if h.count > 0],
        )
        gone = [h.id for h in heads if h.count <= 0]
        if gone:
            conn.executemany("DELETE FROM retired_epochs WHERE id = ?", [(rid,) for rid in gone])
            for rid in gone:
                del self._retired[rid]

    def _start_epochs(self, conn: sqlite3.Connection, names: Sequence[str]) -> None:
        """Give each channel a new epoch: a new ``channels`` row with a new id. The old row, if any, moves to
        ``retired_epochs`` (when it holds events) with its id, so its events stay where they are; its
        idempotency keys move to the new row (see ``_schema.py``). Inside a writer transaction."""
        retire: list[tuple[str, _Head]] = []
        rows: list[tuple[Any, ...]] = []
        moves: list[tuple[int, int, str]] = []
        for name in names:
            old = self._heads.get(name)
            h = self._heads[name] = _Head(self._next_id, new_epoch(), 1, 0, 0, 0, 0)
            self._next_id += 1
            rows.append((h.id, name, h.epoch, *h.row()[:5]))
            if old is not None:
                moves.append((h.id, old.id, old.epoch))
                if old.count > 0:
                    retire.append((name, old))
        if moves:
            conn.executemany(_INSERT_RETIRED, [(h.id, n, h.epoch, *h.row()[:5]) for n, h in retire])
            conn.executemany("DELETE FROM channels WHERE id = ?", [(old_id,) for _, old_id, _ in moves])
            conn.executemany(_MOVE_IDEM, moves)
            self._retired.update((h.id, (n, h)) for n, h in retire)
        conn.executemany(_INSERT_CHANNEL, rows)

    def reset_channel(self, channel: str) -> ChannelInfo:
        with self._transaction("reset") as conn:
            self._start_epochs(conn, (channel,))
        h = self._heads[channel]
        return ChannelInfo(channel, h.epoch, 1, 0, 0)

    def new_epochs_on_open(self) -> None:
        with self._transaction("reset") as conn:
            self._start_epochs(conn, list(self._heads))

    def commits_may_be_lost(self, channel: str, epoch: str) -> bool:
        h = self._heads.get(channel)
        # Ids grow: a row older than the last unclean open is an epoch that was current then.
        return h is not None and h.epoch == epoch and h.id < self._suspect_below

    def apply_retention(self, policy: RetentionPolicy, now_ns: int) -> int:
        cutoff = now_ns - policy.max_age_s * _NS if policy.max_age_s else None
        cap = policy.max_total_bytes
        total = sum(h.bytes for h in self._heads.values()) + sum(h.bytes for _, h in self._retired.values())
        if cutoff is None and not (cap and total > cap):
            self._writer()
            return 0
        with self._transaction("retention") as conn:
            # ``pos`` order is commit order is time order: the events to drop are a prefix of the table.
            cuts: dict[int, list[int]] = {}  # channel id -> [new first, events, bytes]
            last_pos = after = 0
            done = False
            while not done:
                page = conn.execute(
                    "SELECT pos, channel_id, seq, time_ns, size FROM events "
                    "WHERE pos > ? ORDER BY pos LIMIT 1024",
                    (after,),
                ).fetchall()
                if not page:
                    break
                for pos, cid, seq, t, size in page:
                    if not ((cutoff is not None and t < cutoff) or (cap and total > cap)):
                        done = True
                        break
                    total -= size
                    acc = cuts.get(cid)
                    if acc is None:
                        acc = cuts[cid] = [0, 0, 0]
                    acc[0], acc[1], acc[2] = seq + 1, acc[1] + 1, acc[2] + size
                    last_pos = pos
                after = page[-1][0]
            if not cuts:
                return 0
            self._copy_refs(conn, last_pos)
            conn.execute("DELETE FROM events WHERE pos <= ?", (last_pos,))
            by_id = {h.id: h for h in self._heads.values()}
            by_id.update((rid, h) for rid, (_, h) in self._retired.items())
            removed = 0
            for cid, (cut, n, nbytes) in cuts.items():
                h = by_id[cid]
                h.first, h.count, h.bytes = cut, h.count - n, h.bytes - nbytes
                removed += n
            conn.executemany(_UPDATE_CHANNEL, [by_id[cid].row() for cid in cuts if cid not in self._retired])
            self._save_retired(conn, [cid for cid in cuts if cid in self._retired])
        return removed

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._mark_closed()
        self._release()

    def _mark_closed(self) -> None:
        """Record the clean close in ``meta.writer``, synced (see ``_schema.py``). If that fails, the
        next open counts this close as unclean, which errs on the safe side."""
        conn = self._conn
        if conn is None:
            return
        try:
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("UPDATE meta SET value = ? WHERE key = 'writer'", (_WRITER_CLOSED,))
        except sqlite3.Error as exc:
            log.warning("sqlite: recording the clean close failed: %s", exc)

    def _release(self) -> None:
        ckpt, self._checkpointer = self._checkpointer, None
        if ckpt is not None:
            ckpt.stop()
        readers, self._readers = self._readers, []
        for c in readers:
            with contextlib.suppress(sqlite3.Error):
                c.close()
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("PRAGMA optimize")
                conn.close()
        except sqlite3.Error as exc:
            raise _error("close", exc) from exc
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = -1
