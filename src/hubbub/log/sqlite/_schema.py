"""The database file of :class:`SqliteLogStore`: schema, migration, the lost-commits marker, durability, and
opening the file as its writer (:func:`_connect_writer`).

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
    consumers (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT UNIQUE, spec TEXT, created_ns, top, pending,
               bytes, acked_to)
    journal   (consumer_id, pos, attempts, not_before, size, ref, and the copy: channel TEXT, epoch TEXT, seq,
               time_ns, publisher_dialect, publisher_user, publisher_app, publisher_msg_id, content_type,
               headers BLOB, tags BLOB, payload BLOB; PRIMARY KEY (consumer_id, pos)) WITHOUT ROWID
    state     (ns TEXT, key TEXT, value TEXT, version INTEGER, PRIMARY KEY (ns, key)) WITHOUT ROWID

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

``consumers`` and ``journal`` hold the durable consumers (:mod:`hubbub.log.consumers`): ``spec`` is the
consumer's :class:`~hubbub.log.consumers.ConsumerSpec` as JSON, ``top`` its last journal position, ``pending``
and ``bytes`` its unacknowledged items. A ``journal`` row is one item: its ``attempts``, ``not_before`` (ns)
and the event's ``size``, and the event itself, by reference while the event is in the log (``ref``, its
``events.pos``; a channel's reset keeps its events) and as a copy once it is not (``ref`` NULL; the channel
path and epoch included): each path that deletes events copies the unacknowledged items that refer to them
first, so an item outlives its event's trimming. Every position up to a consumer's ``acked_to`` is
acknowledged: a batch acknowledged in order moves it (one small row update) and leaves its rows behind, and
they are deleted in large ranges later (``_consumers.py``); reads never return them.

``state`` holds the state maps (:class:`~hubbub.log.base.StateMaps`, ``_state.py``: MQTT's retained index
and sessions, the push connectors' routes). It came without a new version: a writer creates it when it
opens a file without it, and an older hubbub, which never reads it, opens such a file as before.

Schema version 1 (no ``retired_epochs``, no ``origin_*``, no ``writer`` marker), version 2 (no
``consumers``, no ``journal``) and version 3 (no ``acked_to``) are migrated when a writer opens them; a
reader (``readonly=True``) needs the current version.

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

Durability (protocols README §5), all in WAL mode:

* ``fsync``: ``synchronous=FULL``, the WAL is fsync'd at every commit, so a commit survives power loss.
* ``commit``: ``synchronous=NORMAL``. A commit is written to the WAL (the OS page cache) before it returns, so
  it survives a crash of the process (``kill -9``); the WAL is fsync'd only at checkpoints, so an OS crash or
  power loss may lose the last commits (never corrupts the database).
* ``none``: ``synchronous=OFF``. Nothing is promised; the server calls
  :meth:`~SqliteLogStore.new_epochs_on_open` at start.

The ``writer`` marker commits at open and close are synced whatever the durability (``synchronous=FULL`` for
those two commits only): an open marker lost with the commits after it would hide their loss.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Final

from hubbub.errors import StorageError
from hubbub.log.sqlite._errors import _error

__all__ = ["DURABILITY_SYNCHRONOUS", "SCHEMA_VERSION"]

#: Version of the database schema in this module's docstring.
SCHEMA_VERSION: Final = 4

#: ``durability`` → ``PRAGMA synchronous`` (see the module docstring).
DURABILITY_SYNCHRONOUS: Final[dict[str, str]] = {"fsync": "FULL", "commit": "NORMAL", "none": "OFF"}

# A journal row refers to its event (``ref``: the event's ``events.pos``) while the event is in the log, and
# holds a copy of it (``ref`` NULL, the event's columns set) once it is not: see _consumers.py.
_JOURNAL_COLUMNS: Final = """
        consumer_id INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        not_before INTEGER NOT NULL,
        size INTEGER NOT NULL,
        ref INTEGER,
        channel TEXT,
        epoch TEXT,
        seq INTEGER,
        time_ns INTEGER,
        publisher_dialect TEXT,
        publisher_user TEXT,
        publisher_app TEXT,
        publisher_msg_id TEXT,
        content_type TEXT,
        headers BLOB,
        tags BLOB,
        payload BLOB,
        PRIMARY KEY (consumer_id, pos)
    """
_JOURNAL_COPY: Final = (
    "channel, epoch, seq, time_ns, publisher_dialect, publisher_user, publisher_app, publisher_msg_id, "
    "content_type, headers, tags, payload"
)

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
    """CREATE TABLE IF NOT EXISTS consumers (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL UNIQUE,
        spec TEXT NOT NULL,
        created_ns INTEGER NOT NULL,
        top INTEGER NOT NULL,
        pending INTEGER NOT NULL,
        bytes INTEGER NOT NULL,
        acked_to INTEGER NOT NULL DEFAULT 0
    )""",
    f"""CREATE TABLE IF NOT EXISTS journal ({_JOURNAL_COLUMNS}) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS state (
        ns TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT,
        version INTEGER NOT NULL,
        PRIMARY KEY (ns, key)
    ) WITHOUT ROWID""",
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
# Version 2 -> 3: durable consumers (their tables are created by _SCHEMA, ``acked_to`` included).
_MIGRATE_V2: Final = ("UPDATE meta SET value = 3 WHERE key = 'schema_version'",)
# Version 3 -> 4: a consumer's ``acked_to``; journal rows that may refer to their event (their copies kept).
_MIGRATE_V3: Final = (
    "ALTER TABLE consumers ADD COLUMN acked_to INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE journal RENAME TO journal_v3",
    f"CREATE TABLE journal ({_JOURNAL_COLUMNS}) WITHOUT ROWID",
    f"INSERT INTO journal (consumer_id, pos, attempts, not_before, size, ref, {_JOURNAL_COPY}) "
    f"SELECT consumer_id, pos, attempts, not_before, size, NULL, {_JOURNAL_COPY} FROM journal_v3",
    "DROP TABLE journal_v3",
)
_MIGRATE_V4: Final = ("UPDATE meta SET value = 4 WHERE key = 'schema_version'",)
# The writer's own auto-checkpoint (the backstop), in WAL pages (64 MiB at 4 KiB pages).
_WRITER_AUTOCHECKPOINT: Final = 16384


def _connect_writer(path: Path, durability: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open ``path`` as its writer: WAL mode, ``durability``'s ``synchronous``, the schema created or
    migrated, and the open marker written (synced). Raises StorageError."""
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, cached_statements=64)
    except sqlite3.Error as exc:
        raise _error("open", exc) from exc
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StorageError("log database cannot use WAL mode")
        conn.execute(f"PRAGMA synchronous = {DURABILITY_SYNCHRONOUS[durability]}")
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
        elif row[0] in (1, 2, 3):
            older = (_MIGRATE_V1 if row[0] == 1 else ()) + (_MIGRATE_V2 if row[0] < 3 else _MIGRATE_V3)
            for stmt in older + _MIGRATE_V4:
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
        marker = _WRITER_OPEN_SYNCED if durability == "fsync" else _WRITER_OPEN
        conn.execute("UPDATE meta SET value = ? WHERE key = 'writer'", (marker,))
        conn.execute("COMMIT")
        conn.execute(f"PRAGMA synchronous = {DURABILITY_SYNCHRONOUS[durability]}")
    except BaseException as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        if isinstance(exc, sqlite3.Error):
            raise _error("open", exc) from exc
        raise
    return conn
