"""``SqliteLogStore``: the embedded default engine, one SQLite database file in WAL mode.

Schema (version :data:`SCHEMA_VERSION`, kept in ``meta``)::

    meta      (key TEXT PRIMARY KEY, value INTEGER)   -- schema_version, last_time, writer, suspect_below
    channels  (id INTEGER PRIMARY KEY, path TEXT UNIQUE, epoch, first, top, top_time, count, bytes)
    retired_epochs (id INTEGER PRIMARY KEY, path, epoch, first, top, top_time, count, bytes)
              INDEX retired_epochs_path (path)
    events    (pos INTEGER PRIMARY KEY, channel_id, seq, time_ns, size, publisher_dialect, publisher_user,
               publisher_app, publisher_msg_id, content_type, headers BLOB, tags BLOB, payload BLOB)
              UNIQUE INDEX events_channel_seq (channel_id, seq)
    idem      (channel_id, user, key, seq, time_ns, origin_id, origin_epoch,
               PRIMARY KEY (channel_id, user, key)) WITHOUT ROWID

``headers`` and ``tags`` use the column codec of :mod:`hubbub.log.records`. A ``channels`` row is one epoch
of a channel, the current one: an event's channel and epoch are those of its ``channel_id``. A new epoch
(:meth:`~SqliteLogStore.reset_channel`, :meth:`~SqliteLogStore.new_epochs_on_open`) deletes nothing: the
old row moves to ``retired_epochs`` under the same id (so its events keep their ``channel_id``) and the
channel gets a new row with a new id. Ids only grow and are never reused. A retired epoch stays while it
holds events (age and total-size retention and :meth:`~SqliteLogStore.trim` remove them; the per-channel
limits apply at appends, which a retired epoch no longer gets) and is deleted with its last event. The
idempotency keys move to the new id; ``origin_id``/``origin_epoch`` (``NULL``: the row's own channel id and
its current epoch) say where the original event is. ``channels.path`` compares with SQLite's BINARY
collation, which is the UTF-8 byte order :meth:`LogStore.channels` promises.

Schema version 1 (no ``retired_epochs``, no ``origin_*``, no ``writer`` marker) is migrated when a writer
opens it; a reader (``readonly=True``) needs the current version.

Lost commits (native.md §6 ``ahead``): ``meta.writer`` is 0 once the last writer closed cleanly, else 1
(open with ``fsync``) or 2 (open with ``commit`` or ``none``); it is written with a synced commit at open
and at close. Opening after a writer that did not close under ``commit`` or ``none`` (or a version 1 file,
whose past is unknown) sets ``suspect_below`` to the next channel id: the current epochs of the channels
that existed then, and only those, may have lost their last commits (an OS crash or power loss may have
dropped WAL frames that were never synced). :meth:`~SqliteLogStore.commits_may_be_lost` answers from it. It
survives clean restarts, since a client that saw the lost commits may come back much later.

Why ``events`` is a rowid table in log order rather than ``WITHOUT ROWID`` clustered on ``(channel_id, seq)``
(the first design): measured on the 2-core dev machine (batches of 1000, 100-byte payloads, ``commit``), the
clustered table rewrites, at every commit, the leaf pages in the middle of the tree where each active channel
ends, and splits them half-full; its throughput fell from 118k events/s with 1 channel to 65k with 100 and
25k with 1000 channels. Appending rows at the end of the table in commit order, with the small
``(channel_id, seq)`` index for reads, gave 117k, 87k and 63k. ``pos`` order is also commit order, which is
time order, so age and total-size retention are one forward scan and one ``DELETE … WHERE pos <= ?``. The
cost is on cold reads of one channel among many (one row look-up per event instead of a range of pages).

Time searches (``read(from_time=…)``) use no index: within one channel's epoch ``time_ns`` strictly increases
with ``seq``, so a binary search over ``seq`` costs a handful of index look-ups.

Durability (protocols README §5), all in WAL mode:

* ``fsync``: ``synchronous=FULL``, the WAL is fsync'd at every commit, so a commit survives power loss.
* ``commit``: ``synchronous=NORMAL``. A commit is written to the WAL (the OS page cache) before it returns, so
  it survives a crash of the process (``kill -9``); the WAL is fsync'd only at checkpoints, so an OS crash or
  power loss may lose the last commits (never corrupts the database).
* ``none``: ``synchronous=OFF``. Nothing is promised; the server calls :meth:`new_epochs_on_open` at start.

The ``writer`` marker commits at open and close are synced whatever the durability (``synchronous=FULL`` for
those two commits only): an open marker lost with the commits after it would hide their loss.

Checkpoints (copying the WAL into the database) run on a small background thread with its own connection, so
commits do not pay for them; the writer's own auto-checkpoint stays on at a high mark as the backstop that
lets the WAL start over under continuous load.

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

Every ``sqlite3`` error becomes a :class:`~hubbub.errors.StorageError` whose message names the operation and
SQLite's error code only (never SQL or paths). The full error goes to the ``hubbub.log.sqlite`` logger.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hubbub.errors import StorageError
from hubbub.events import Event, Publisher
from hubbub.log.base import (
    AppendRequest,
    AppendResult,
    ChannelInfo,
    EventRun,
    LogStore,
    RetentionPolicy,
    StoreStats,
    new_epoch,
)
from hubbub.log.records import (
    RecordError,
    decode_headers,
    decode_tags,
    encode_headers,
    encode_tags,
    event_size,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["DURABILITY_SYNCHRONOUS", "SCHEMA_VERSION", "ScanColumns", "ScanPlan", "SqliteLogStore"]

log = logging.getLogger("hubbub.log.sqlite")

#: Version of the database schema in this module's docstring.
SCHEMA_VERSION: Final = 2

#: ``durability`` → ``PRAGMA synchronous`` (see the module docstring).
DURABILITY_SYNCHRONOUS: Final[dict[str, str]] = {"fsync": "FULL", "commit": "NORMAL", "none": "OFF"}

_NS: Final = 1_000_000_000
_MAX_INT64: Final = (1 << 63) - 1

_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID",
    """CREATE TABLE IF NOT EXISTS channels (
        id INTEGER PRIMARY KEY,
        path TEXT NOT NULL UNIQUE,
        epoch TEXT NOT NULL,
        first INTEGER NOT NULL,
        top INTEGER NOT NULL,
        top_time INTEGER NOT NULL,
        count INTEGER NOT NULL,
        bytes INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS retired_epochs (
        id INTEGER PRIMARY KEY,
        path TEXT NOT NULL,
        epoch TEXT NOT NULL,
        first INTEGER NOT NULL,
        top INTEGER NOT NULL,
        top_time INTEGER NOT NULL,
        count INTEGER NOT NULL,
        bytes INTEGER NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS retired_epochs_path ON retired_epochs (path)",
    """CREATE TABLE IF NOT EXISTS events (
        pos INTEGER PRIMARY KEY,
        channel_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        time_ns INTEGER NOT NULL,
        size INTEGER NOT NULL,
        publisher_dialect TEXT NOT NULL,
        publisher_user TEXT NOT NULL,
        publisher_app TEXT NOT NULL,
        publisher_msg_id TEXT NOT NULL,
        content_type TEXT NOT NULL,
        headers BLOB NOT NULL,
        tags BLOB NOT NULL,
        payload BLOB NOT NULL
    )""",
    "CREATE UNIQUE INDEX IF NOT EXISTS events_channel_seq ON events (channel_id, seq)",
    """CREATE TABLE IF NOT EXISTS idem (
        channel_id INTEGER NOT NULL,
        user TEXT NOT NULL,
        key TEXT NOT NULL,
        seq INTEGER NOT NULL,
        time_ns INTEGER NOT NULL,
        origin_id INTEGER,
        origin_epoch TEXT,
        PRIMARY KEY (channel_id, user, key)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS idem_time ON idem (time_ns)",
)

_EVENT_COLS: Final = (
    "seq, time_ns, publisher_dialect, publisher_user, publisher_app, publisher_msg_id, content_type, "
    "headers, tags, payload"
)
_TEXT_COLS: Final = (
    "publisher_dialect",
    "publisher_user",
    "publisher_app",
    "publisher_msg_id",
    "content_type",
)
# read_rows(compact_text=True): a text column is NULL where it equals the given (first row's) value.
_COMPACT_SELECT: Final = (
    "SELECT seq, time_ns, "
    + ", ".join(f"nullif({c}, ?{i})" for i, c in enumerate(_TEXT_COLS, 1))
    + ", headers, tags, payload FROM events WHERE channel_id = ?6 AND seq BETWEEN ?7 AND ?8 "
    "ORDER BY seq LIMIT ?9"
)
# read_runs: the (time_ns, payload) of a range's rows that equal the first row in every other column.
_RUN_SELECT: Final = (
    "SELECT time_ns, payload FROM events WHERE channel_id = ?1 AND seq BETWEEN ?2 AND ?3 "
    + "".join(f"AND {c} = ?{i} " for i, c in enumerate((*_TEXT_COLS, "headers", "tags"), 4))
    + "ORDER BY seq"
)
_INSERT_EVENTS_HEAD: Final = (
    "INSERT INTO events (channel_id, seq, time_ns, size, publisher_dialect, publisher_user, publisher_app, "
    "publisher_msg_id, content_type, headers, tags, payload) VALUES "
)
# append inserts events with multi-row ``VALUES`` statements of 2**k rows each (k up to _INSERT_MAX_LOG2,
# less where SQLite allows fewer parameters). One statement runs in one sqlite3_step, for which sqlite3
# releases the GIL once, where ``executemany`` releases and re-takes it for every row (each time waiting for
# the event loop thread to let go of it), and saves the per-row statement reset and call overhead. A handful
# of sizes keeps the prepared statements cached.
#
# The events of a *run* (consecutive events of one batch with equal publisher dialect, user and app, content
# type, headers and tags: one connection's burst) share most columns, which a run statement binds once as
# ?1-?7 (_RUN_SHARED: dialect, user, app, content type, encoded headers, encoded tags, and the bytes headers
# and tags add to ``size``), and per row only _RUN_ROW parameters (channel_id, seq, time_ns,
# publisher_msg_id, payload). Measured on the 2-core dev machine, SQLite and binding CPU per row: 3.3-3.7 µs
# with ``executemany``, 2.5 µs with 12-parameter rows, 1.2-1.4 µs with run rows. Runs shorter than
# _MIN_RUN (where a statement per run would cost more than it saves) use the 12-parameter rows.
_INSERT_MAX_LOG2: Final = 8
_FULL_ROW: Final = 12
_RUN_SHARED: Final = 7
_RUN_ROW: Final = 5
_MIN_RUN: Final = 8
_INSERT_FULL: Final = tuple(
    _INSERT_EVENTS_HEAD + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * (1 << k))
    for k in range(_INSERT_MAX_LOG2 + 1)
)
_INSERT_RUN: Final = tuple(
    _INSERT_EVENTS_HEAD
    + ", ".join(
        f"(?{b + 1}, ?{b + 2}, ?{b + 3}, length(?{b + 5}) + ?7, ?1, ?2, ?3, ?{b + 4}, ?4, ?5, ?6, ?{b + 5})"
        for b in range(_RUN_SHARED, _RUN_SHARED + (_RUN_ROW << k), _RUN_ROW)
    )
    for k in range(_INSERT_MAX_LOG2 + 1)
)
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
# meta.writer (see the module docstring): closed cleanly, open with fsync, open with commit or none.
_WRITER_CLOSED: Final = 0
_WRITER_OPEN_SYNCED: Final = 1
_WRITER_OPEN: Final = 2
# Version 1 -> 2: retired epochs (created by _SCHEMA), where an idempotency key's original is, the writer
# marker (a version 1 file's last close is unknown: counted as unclean).
_MIGRATE_V1: Final = (
    "ALTER TABLE idem ADD COLUMN origin_id INTEGER",
    "ALTER TABLE idem ADD COLUMN origin_epoch TEXT",
    f"INSERT OR REPLACE INTO meta (key, value) VALUES ('writer', {_WRITER_OPEN})",
    "INSERT OR REPLACE INTO meta (key, value) VALUES ('suspect_below', 0)",
    "UPDATE meta SET value = 2 WHERE key = 'schema_version'",
)
_HEAD_COLS: Final = "path, epoch, first, top, top_time"
# How often (in log time) append forgets expired idempotency keys.
_IDEM_PRUNE_EVERY_NS: Final = 10 * _NS
_HEADS_CHUNK: Final = 500
# The background checkpointer runs at most this often. A checkpoint copies the newest version of every page
# written since the last one, and every commit rewrites a few of the same pages (the last leaves of ``events``
# and its index, ``channels``, ``meta``): checkpointing every 0.25 s rather than every 0.05 s copies those
# less often (measured: about 0.2 µs less CPU per event appended under load). The WAL then holds a few MB
# between checkpoints at full speed, far below _WRITER_AUTOCHECKPOINT.
_CHECKPOINT_PAUSE_S: Final = 0.25
# The writer's own auto-checkpoint (the backstop), in WAL pages (64 MiB at 4 KiB pages).
_WRITER_AUTOCHECKPOINT: Final = 16384


# What a failed write or read turns into StorageError: SQLite's errors, bad stored data, and values SQLite
# cannot bind (text that is not UTF-8, integers beyond 64 bits).
_STORAGE_ERRORS: Final = (sqlite3.Error, RecordError, UnicodeError, OverflowError)


@dataclass(slots=True)
class _Head:
    """The writer's cached copy of one ``channels`` row."""

    id: int
    epoch: str
    first: int
    top: int
    top_time: int
    count: int
    bytes: int

    def row(self) -> tuple[int, int, int, int, int, int]:
        return (self.first, self.top, self.top_time, self.count, self.bytes, self.id)


@dataclass(frozen=True, slots=True)
class ScanPlan:
    """What :meth:`SqliteLogStore.scan_plan` found in one snapshot.

    ``splits``: ascending ``pos`` boundaries; piece ``i`` is ``splits[i] <= pos < splits[i + 1]`` (empty when
    no event is in range). ``max_time``: the newest event's time in that snapshot; a scan bounded by it sees
    no later commit. ``channels``: channel id -> head, for every epoch holding events, current or retired
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
    """Events of a ``pos`` range as columns, in SQLite's concatenated form: no Python object per event.

    ``channel_id``, ``seq`` and ``time_ns`` are decimal integers joined with ``,`` (``""`` when ``n`` is 0).
    A variable-length column is ``(lengths, data)``: the byte length of every value joined with ``,`` and the
    values' bytes concatenated (text as UTF-8; ``headers`` and ``tags`` in the column codec of
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


def _error(what: str, exc: BaseException) -> StorageError:
    """A safe :class:`StorageError` for a failed operation; the details go to the log only."""
    name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
    log.error("sqlite: %s failed: %s: %s", what, name, exc)
    return StorageError(f"log {what} failed ({name})")


def _prefix_upper(prefix: str) -> str | None:
    """The smallest string greater than every string that starts with ``prefix`` (None: there is none)."""
    chars = list(prefix)
    while chars:
        c = ord(chars.pop()) + 1
        if c == 0xD800:  # skip the surrogates: they are not text
            c = 0xE000
        if c <= 0x10FFFF:
            return "".join(chars) + chr(c)
    return None


class _Checkpointer:
    """Runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own thread and connection after commits.

    The writer calls :meth:`kick` after each commit (cheap); the thread checkpoints at most every
    ``_CHECKPOINT_PAUSE_S`` and sleeps while nothing is written. A PASSIVE checkpoint never blocks the writer
    or the readers. Errors are logged and retried at the next kick: the writer's auto-checkpoint is the
    backstop. :meth:`stop` joins the thread, which closes its own connection.
    """

    def __init__(self, path: Path, synchronous: str) -> None:
        self._kick = threading.Event()
        self._halt = threading.Event()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._conn.execute(f"PRAGMA synchronous = {synchronous}")
            self._thread = threading.Thread(target=self._run, name="hubbub-sqlite-checkpoint", daemon=True)
            self._thread.start()
        except BaseException:
            self._conn.close()
            raise

    def kick(self) -> None:
        self._kick.set()

    def _run(self) -> None:
        try:
            while True:
                self._kick.wait()
                if self._halt.is_set():
                    return
                self._kick.clear()
                try:
                    self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    log.warning("sqlite: background checkpoint failed: %s", exc)
                if self._halt.wait(_CHECKPOINT_PAUSE_S):
                    return
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()

    def stop(self) -> None:
        self._halt.set()
        self._kick.set()
        self._thread.join()


class SqliteLogStore(LogStore):
    """A :class:`LogStore` in one SQLite file (see the module docstring for schema and contract).

    ``path``: the database file (created if absent; its directory must exist). ``durability``: ``fsync``,
    ``commit`` or ``none``. ``retention``: its ``max_events``/``max_bytes`` apply per channel inside every
    append's transaction. ``idem_window_s``: how long idempotency keys are kept (0 turns idempotency off).
    ``clock`` returns nanoseconds since the Unix epoch (tests pass a fake one). ``busy_timeout_ms``: how long
    a statement waits for a lock held by another connection (another process reading or backing up the file).
    """

    engine = "sqlite"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "commit",
        retention: RetentionPolicy | None = None,
        idem_window_s: int = 600,
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
        self._retention = retention or RetentionPolicy()
        self._idem_window_ns = max(idem_window_s, 0) * _NS
        self._clock = clock
        self._busy_timeout_ms = max(busy_timeout_ms, 0)
        self._closed = False
        self._close_lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._reader_uri = self.path.as_uri() + "?mode=ro"
        # Writer state (writer thread only).
        self._heads: dict[str, _Head] = {}
        # Retired epochs holding events: id -> (channel, head).
        self._retired: dict[int, tuple[str, _Head]] = {}
        self._next_id = 1
        self._suspect_below = 0
        self._last_time = 0
        self._idem_prune_at = 0
        self._lock_fd = -1
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: _Checkpointer | None = None
        self.readonly = readonly
        if readonly:
            self._open_readonly()
            return
        try:
            self._lock_file()
            self._conn = self._open_writer()
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
            raise StorageError("log database is in use by another store") from exc
        self._lock_fd = fd

    def _open_writer(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, cached_statements=64
            )
        except sqlite3.Error as exc:
            raise _error("open", exc) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StorageError("log database cannot use WAL mode")
            conn.execute(f"PRAGMA synchronous = {DURABILITY_SYNCHRONOUS[self.durability]}")
            conn.execute("PRAGMA cache_size = -32768")  # 32 MiB
            conn.execute("PRAGMA temp_store = MEMORY")
            # The background checkpointer does the copying; this high mark only lets the WAL start over
            # under continuous load (a checkpoint that finds almost everything copied is cheap).
            conn.execute(f"PRAGMA wal_autocheckpoint = {_WRITER_AUTOCHECKPOINT}")
            conn.execute("PRAGMA journal_size_limit = 67108864")
            # This transaction writes the open marker: synced whatever the durability (module docstring).
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("BEGIN IMMEDIATE")
            for stmt in _SCHEMA:
                conn.execute(stmt)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                conn.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [
                        ("schema_version", SCHEMA_VERSION),
                        ("last_time", 0),
                        ("writer", _WRITER_CLOSED),
                        ("suspect_below", 0),
                    ],
                )
            elif row[0] == 1:
                for stmt in _MIGRATE_V1:
                    conn.execute(stmt)
            elif row[0] != SCHEMA_VERSION:
                raise StorageError(
                    f"log database has schema version {row[0]}, this hubbub reads {SCHEMA_VERSION}"
                )
            if conn.execute("SELECT value FROM meta WHERE key = 'writer'").fetchone()[0] == _WRITER_OPEN:
                # The last writer did not close, and did not sync every commit: the current epochs of the
                # channels it left may have lost their last commits.
                conn.execute(
                    "UPDATE meta SET value = (SELECT 1 + max(coalesce((SELECT max(id) FROM channels), 0), "
                    "coalesce((SELECT max(id) FROM retired_epochs), 0))) WHERE key = 'suspect_below'"
                )
            marker = _WRITER_OPEN_SYNCED if self.durability == "fsync" else _WRITER_OPEN
            conn.execute("UPDATE meta SET value = ? WHERE key = 'writer'", (marker,))
            conn.execute("COMMIT")
            conn.execute(f"PRAGMA synchronous = {DURABILITY_SYNCHRONOUS[self.durability]}")
        except BaseException as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            if isinstance(exc, sqlite3.Error):
                raise _error("open", exc) from exc
            raise
        return conn

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

    def append(self, batch: Sequence[AppendRequest]) -> list[AppendResult]:
        if not batch:
            self._writer()
            return []
        with self._transaction("append") as conn:
            now = self._clock()
            t = self._last_time
            window = self._idem_window_ns
            heads = self._heads
            touched: dict[str, _Head] = {}
            created: set[str] = set()
            # The ``events`` rows (see _insert_events): ``segments`` of 12-parameter rows each followed by a
            # long run's rows, then ``full``. The current run is of ``r_pub`` (or a publisher equal to it but
            # for msg_id), ``r_ctype``, ``r_hb`` and ``r_tb``; it has ``r_n`` events. Its first _MIN_RUN - 1
            # rows go to ``full`` from index ``r_start``; at _MIN_RUN they move to a new ``run``.
            segments: list[tuple[list[Any], list[Any]]] = []
            full: list[Any] = []
            run: list[Any] | None = None
            r_pub: Publisher | None = None
            r_ctype: str | None = None
            r_hb = r_tb = b""
            r_n = r_start = 0
            idem_rows: list[tuple[int, str, str, int, int]] = []
            batch_idem: dict[tuple[str, str, str], Event] = {}
            results: list[AppendResult] = []
            add_result = results.append
            # The previous request's channel and head: a batch is mostly runs of one channel's publishes.
            name: str | None = None
            h: _Head | None = None
            for req in batch:
                if req.channel != name or h is None:
                    name = req.channel
                    h = heads.get(name)
                    if h is None:
                        h = heads[name] = _Head(self._next_id, new_epoch(), 1, 0, 0, 0, 0)
                        self._next_id += 1
                        created.add(name)
                    touched[name] = h
                pub = req.publisher
                idem = req.idem
                if idem and window:
                    t_next = now if now > t else t + 1
                    key = (pub.user, name, idem)
                    dup = batch_idem.get(key)
                    if dup is None and name not in created:
                        dup = self._find_original(conn, name, h, req, t_next - window)
                    if dup is not None and t_next - dup.time_ns < window:
                        add_result(AppendResult(dup, duplicate=True))
                        continue
                t = now if now > t else t + 1
                h.top = seq = h.top + 1
                h.top_time = t
                h.count += 1
                payload = req.payload
                headers = req.headers
                tags = req.tags
                if headers or tags:
                    size = event_size(payload, headers, tags)
                    hb = encode_headers(headers)
                    tb = encode_tags(tags)
                    headers = dict(headers)
                    tags = tuple(tags)
                else:
                    size = len(payload)
                    hb = tb = b""
                    headers = {}
                h.bytes += size
                ctype = req.content_type
                if (
                    (pub is not r_pub and (r_pub is None or not _same_publisher(pub, r_pub)))
                    or ctype != r_ctype
                    or hb != r_hb
                    or tb != r_tb
                ):
                    r_pub, r_ctype, r_hb, r_tb = pub, ctype, hb, tb
                    r_n, r_start, run = 0, len(full), None
                r_n += 1
                if run is not None:
                    run += (h.id, seq, t, pub.msg_id, payload)
                elif r_n < _MIN_RUN:
                    full += (
                        h.id,
                        seq,
                        t,
                        size,
                        pub.dialect,
                        pub.user,
                        pub.app,
                        pub.msg_id,
                        ctype,
                        hb,
                        tb,
                        payload,
                    )
                else:
                    run = [pub.dialect, pub.user, pub.app, ctype, hb, tb, size - len(payload)]
                    run += _run_rows(full, r_start)
                    del full[r_start:]
                    run += (h.id, seq, t, pub.msg_id, payload)
                    segments.append((full, run))
                    full = []
                ev = Event(name, seq, h.epoch, t, pub, payload, ctype, headers, tags)
                add_result(AppendResult(ev))
                if idem and window:
                    batch_idem[key] = ev
                    idem_rows.append((h.id, pub.user, idem, seq, t))
            _insert_events(conn, segments, full, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))
            pol = self._retention
            if pol.max_events or pol.max_bytes:
                for h in touched.values():
                    self._trim_per_channel(conn, h)
            if created:
                conn.executemany(
                    _INSERT_CHANNEL,
                    [(heads[n].id, n, heads[n].epoch, *heads[n].row()[:5]) for n in created],
                )
            if len(touched) > len(created):
                conn.executemany(_UPDATE_CHANNEL, [h.row() for n, h in touched.items() if n not in created])
            if idem_rows:
                conn.executemany(
                    "INSERT OR REPLACE INTO idem (channel_id, user, key, seq, time_ns) "
                    "VALUES (?, ?, ?, ?, ?)",
                    idem_rows,
                )
            if window and t >= self._idem_prune_at:
                conn.execute("DELETE FROM idem WHERE time_ns <= ?", (t - window,))
                self._idem_prune_at = t + min(window, _IDEM_PRUNE_EVERY_NS)
            if t != self._last_time:
                conn.execute(_SET_LAST_TIME, (t,))
        self._last_time = t
        if self._checkpointer is not None:
            self._checkpointer.kick()
        return results

    def _find_original(
        self, conn: sqlite3.Connection, name: str, h: _Head, req: AppendRequest, after: int
    ) -> Event | None:
        """The event a repeated idempotency key first appended, if it is newer than ``after``. It may be in
        a retired epoch of the channel: the key was acknowledged there, and the event is still in the log."""
        row = conn.execute(
            "SELECT seq, time_ns, coalesce(origin_id, channel_id), coalesce(origin_epoch, ?) FROM idem "
            "WHERE channel_id = ? AND user = ? AND key = ?",
            (h.epoch, h.id, req.publisher.user, req.idem),
        ).fetchone()
        if row is None or row[1] <= after:
            return None
        seq, t, cid, epoch = row
        found = conn.execute(
            f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = ? AND seq = ?", (cid, seq)
        ).fetchall()
        if found:
            return self._events(name, epoch, found)[0]
        # Trimmed since: rebuild it from the repeated request (same key, so the same event) and the position.
        return Event(
            name,
            seq,
            epoch,
            t,
            req.publisher,
            req.payload,
            req.content_type,
            dict(req.headers),
            tuple(req.tags),
        )

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

    @staticmethod
    def _delete_below(conn: sqlite3.Connection, h: _Head, cut: int, removed_bytes: int | None = None) -> int:
        """Delete the channel's events with ``seq < cut``; update the head. Returns how many."""
        cut = min(cut, h.top + 1)
        n = cut - h.first
        if n <= 0:
            return 0
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
            rid = self._retired_id(channel, epoch)
            h = self._retired[rid][1]
        top = 0 if h is None else h.top
        if not 0 <= up_to_seq <= top:
            raise ValueError(f"cannot trim to seq {up_to_seq}: the channel's top is {top}")
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
        return ChannelInfo(channel, h.epoch, h.first, h.top, h.top_time)

    def _retired_id(self, channel: str, epoch: str) -> int:
        for rid, (path, h) in self._retired.items():
            if path == channel and h.epoch == epoch:
                return rid
        raise ValueError(f"the channel has no epoch {epoch!r} holding events")

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
        idempotency keys move to the new row (see the module docstring). Inside a writer transaction."""
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
        """Record the clean close in ``meta.writer``, synced (see the module docstring). If that fails, the
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

    # -- readers -------------------------------------------------------------------------------------

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
        pubs: dict[tuple[str, str, str, str], Publisher] = {}
        out: list[Event] = []
        for seq, t, dialect, user, app, msg_id, ctype, hb, tb, payload in rows:
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
            if epoch is None:
                row = conn.execute(
                    "SELECT id, epoch, first, top FROM channels WHERE path = ?", (channel,)
                ).fetchone()
            else:
                row = conn.execute(
                    "SELECT id, epoch, first, top FROM channels WHERE path = ?1 AND epoch = ?2 UNION ALL "
                    "SELECT id, epoch, first, top FROM retired_epochs WHERE path = ?1 AND epoch = ?2",
                    (channel, epoch),
                ).fetchone()
            if row is None:
                return "", []
            cid, epoch, first, top = row
            lo, hi = max(after_seq + 1, first), top
            if from_time is not None and lo <= hi:
                lo = _seq_at_time(conn, cid, lo, hi, from_time)
            if to_time is not None and lo <= hi:
                hi = _seq_at_time(conn, cid, lo, hi, to_time) - 1
            if lo > hi:
                return epoch, []
            n = min(limit, _MAX_INT64)
            if not compact_text:
                rows = conn.execute(
                    f"SELECT {_EVENT_COLS} FROM events "
                    "WHERE channel_id = ? AND seq BETWEEN ? AND ? ORDER BY seq LIMIT ?",
                    (cid, lo, hi, n),
                ).fetchall()
                return epoch, rows
            first_row = conn.execute(
                f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = ? AND seq BETWEEN ? AND ? "
                "ORDER BY seq LIMIT 1",
                (cid, lo, hi),
            ).fetchone()
            if first_row is None:
                return epoch, []
            rows = conn.execute(_COMPACT_SELECT, (*first_row[2:7], cid, lo, hi, n)).fetchall()
            rows[0] = first_row
            return epoch, rows

    def read_runs(self, channel: str, after_seq: int, up_to_seq: int, limit: int = 1000) -> list[EventRun]:
        """See :meth:`LogStore.read_runs`. A range whose rows all share the first row's publisher, content
        type, headers and tags (the usual page: one publisher's events) is two statements and one
        ``(time_ns, payload)`` tuple per row, checked by SQLite; any other range is read whole and grouped."""
        if up_to_seq <= after_seq or limit <= 0:
            self._reader()
            return []
        with self._snapshot() as conn:
            row = conn.execute(
                "SELECT id, epoch, first, top FROM channels WHERE path = ?", (channel,)
            ).fetchone()
            if row is None:
                return []
            cid, epoch, first, top = row
            lo = max(after_seq + 1, first)
            hi = min(up_to_seq, top, lo - 1 + min(limit, _MAX_INT64 - lo))
            if lo > hi:
                return []
            head = conn.execute(
                f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = ? AND seq = ?", (cid, lo)
            ).fetchone()
            if head is not None:
                rows = conn.execute(_RUN_SELECT, (cid, lo, hi, *head[2:9])).fetchall()
                # Seqs are unique: as many matching rows as seqs in the range means every row matched.
                if len(rows) == hi - lo + 1:
                    return [EventRun(self._events(channel, epoch, [head])[0], rows)]
            rows = conn.execute(
                f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
                (cid, lo, hi),
            ).fetchall()
            return _runs(channel, epoch, rows)

    def scan_plan(self, size: int, from_time: int | None = None, to_time: int | None = None) -> ScanPlan:
        """Plan a bulk read of the whole log in commit (``pos``) order: see :class:`ScanPlan`. Each piece
        holds ``size`` events (the last one at most ``size``) with ``from_time <= time_ns < to_time``:
        ``time_ns`` increases with ``pos``, so the time range is a ``pos`` range, found by binary search.
        For bulk readers (the data pipeline), with :meth:`scan_columns`."""
        size = max(size, 1)
        with self._snapshot() as conn:
            channels: dict[int, ChannelInfo] = {}
            retired: set[int] = set()
            for row in conn.execute(
                f"SELECT 0, id, {_HEAD_COLS} FROM channels WHERE count > 0 UNION ALL "
                f"SELECT 1, id, {_HEAD_COLS} FROM retired_epochs ORDER BY path, id"
            ):
                channels[row[1]] = ChannelInfo(*row[2:])
                if row[0]:
                    retired.add(row[1])
            events, nbytes = conn.execute(
                "SELECT coalesce(sum(count), 0), coalesce(sum(bytes), 0) FROM "
                "(SELECT count, bytes FROM channels UNION ALL SELECT count, bytes FROM retired_epochs)"
            ).fetchone()
            first = conn.execute("SELECT pos FROM events ORDER BY pos LIMIT 1").fetchone()
            last = conn.execute("SELECT pos, time_ns FROM events ORDER BY pos DESC LIMIT 1").fetchone()
            if first is None or last is None:
                return ScanPlan((), 0, channels, events, nbytes, frozenset(retired))
            lo, hi, max_time = first[0], last[0], last[1]
            if from_time is not None:
                lo = _pos_at_time(conn, lo, hi, from_time)
            if to_time is not None and lo <= hi:
                hi = _pos_at_time(conn, lo, hi, to_time) - 1
            splits: list[int] = []
            at: int | None = lo
            while at is not None and at <= hi:
                splits.append(at)
                row = conn.execute(
                    "SELECT pos FROM events WHERE pos >= ? ORDER BY pos LIMIT 1 OFFSET ?", (at, size)
                ).fetchone()
                at = None if row is None else row[0]
            if splits:
                splits.append(hi + 1)
            return ScanPlan(tuple(splits), max_time, channels, events, nbytes, frozenset(retired))

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
                (cid, min(n, _MAX_INT64)),
            ).fetchall()
            rows.reverse()
            return self._events(channel, epoch, rows)

    def channels(self, after: str = "", limit: int = 1000, prefix: str = "") -> list[ChannelInfo]:
        if limit <= 0:
            self._reader()
            return []
        sql = f"SELECT {_HEAD_COLS} FROM channels WHERE path > ? AND count > 0"
        params: list[Any] = [after]
        if prefix:
            sql += " AND path >= ?"
            params.append(prefix)
            upper = _prefix_upper(prefix)
            if upper is not None:
                sql += " AND path < ?"
                params.append(upper)
        sql += " ORDER BY path LIMIT ?"
        params.append(min(limit, _MAX_INT64))
        with self._snapshot() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [ChannelInfo(*r) for r in rows if r[0].startswith(prefix)]

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


def _same_publisher(a: Publisher, b: Publisher) -> bool:
    """Whether events of ``a`` and ``b`` may share a run (see _INSERT_RUN): ``msg_id`` is a per-row column."""
    return a.dialect == b.dialect and a.user == b.user and a.app == b.app


def _insert_log2(limit: int, shared: int, per_row: int) -> int:
    """The largest ``k <= _INSERT_MAX_LOG2`` whose 2**k-row statement stays within the parameter limit."""
    k = _INSERT_MAX_LOG2
    while k and shared + (per_row << k) > limit:
        k -= 1
    return k


def _insert_chunks(
    conn: sqlite3.Connection,
    stmts: tuple[str, ...],
    max_log2: int,
    shared: int,
    per_row: int,
    params: list[Any],
) -> None:
    """Insert the rows of ``params`` (``shared`` parameters for every statement, then ``per_row`` per row)
    with ``stmts[k]`` (2**k rows each, ``k <= max_log2``), the largest first."""
    n = len(params)
    rows = (n - shared) // per_row
    start = shared
    while rows:
        k = min(rows.bit_length() - 1, max_log2)
        end = start + (per_row << k)
        if start == shared and end == n:
            conn.execute(stmts[k], params)
        else:
            conn.execute(stmts[k], params[:shared] + params[start:end])
        start = end
        rows -= 1 << k


def _run_rows(full: list[Any], start: int) -> list[Any]:
    """The _RUN_ROW parameters of the 12-parameter rows of ``full`` from index ``start`` on."""
    out: list[Any] = []
    for i in range(start, len(full), _FULL_ROW):
        out += (full[i], full[i + 1], full[i + 2], full[i + 7], full[i + 11])
    return out


def _insert_events(
    conn: sqlite3.Connection, segments: list[tuple[list[Any], list[Any]]], full: list[Any], limit: int
) -> None:
    """Insert ``events`` rows, in order: per segment its 12-parameter rows (``_INSERT_FULL``), then its run
    (``_INSERT_RUN``: the _RUN_SHARED values of the run's events, then _RUN_ROW per event); then ``full``'s
    12-parameter rows. ``limit``: SQLite's maximum number of parameters in one statement."""
    run_log2 = _insert_log2(limit, _RUN_SHARED, _RUN_ROW)
    full_log2 = _insert_log2(limit, 0, _FULL_ROW)
    for rows, run in segments:
        _insert_chunks(conn, _INSERT_FULL, full_log2, 0, _FULL_ROW, rows)
        _insert_chunks(conn, _INSERT_RUN, run_log2, _RUN_SHARED, _RUN_ROW, run)
    _insert_chunks(conn, _INSERT_FULL, full_log2, 0, _FULL_ROW, full)


def _runs(channel: str, epoch: str, rows: list[Any]) -> list[EventRun]:
    """Group full event rows (``_EVENT_COLS``, in seq order) into runs; one event is built per run."""
    out: list[EventRun] = []
    prev_key: tuple[Any, ...] = ()
    prev_seq = 0
    run: list[tuple[int, bytes]] = []
    for r in rows:
        seq = r[0]
        key = r[2:9]
        if seq == prev_seq + 1 and key == prev_key:
            run.append((r[1], r[9]))
        else:
            run = [(r[1], r[9])]
            out.append(EventRun(SqliteLogStore._events(channel, epoch, [r])[0], run))
            prev_key = key
        prev_seq = seq
    return out


def _pos_at_time(conn: sqlite3.Connection, lo: int, hi: int, t: int) -> int:
    """The smallest ``pos`` in ``[lo, hi]`` of an event with ``time_ns >= t``, or ``hi + 1``
    (``time_ns`` increases with ``pos``)."""
    while lo <= hi:
        mid = (lo + hi) // 2
        row = conn.execute(
            "SELECT pos, time_ns FROM events WHERE pos >= ? ORDER BY pos LIMIT 1", (mid,)
        ).fetchone()
        if row is None or row[0] > hi or row[1] >= t:
            hi = mid - 1
        else:
            lo = row[0] + 1
    return lo


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


def _seq_at_time(conn: sqlite3.Connection, cid: int, lo: int, hi: int, t: int) -> int:
    """The smallest ``seq`` in ``[lo, hi]`` of a channel whose ``time_ns >= t``, or ``hi + 1``.

    Binary search: within one epoch ``time_ns`` strictly increases with ``seq``. Each probe reads the first
    event at or after the middle, so a hole in the seqs (which the store never leaves) costs nothing.
    """
    while lo <= hi:
        mid = (lo + hi) // 2
        row = conn.execute(
            "SELECT seq, time_ns FROM events WHERE channel_id = ? AND seq >= ? ORDER BY seq LIMIT 1",
            (cid, mid),
        ).fetchone()
        if row is None or row[0] > hi or row[1] >= t:
            hi = mid - 1
        else:
            lo = row[0] + 1
    return lo
