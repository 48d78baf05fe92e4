"""The database of :class:`PostgresLogStore`: schema, migrations, durability, and connecting.

Schema (version :data:`SCHEMA_VERSION`, kept in ``schema_version``)::

    schema_version (version INTEGER)                     -- one row
    log_state (id BOOLEAN PRIMARY KEY, last_time, last_pos, next_id, suspect_below, async_start)  -- one row
    channels  (id BIGINT PRIMARY KEY, path TEXT COLLATE "C" UNIQUE, epoch, first, top, top_time, count, bytes)
    retired_epochs (id BIGINT PRIMARY KEY, path TEXT COLLATE "C", epoch, first, top, top_time, count, bytes)
              INDEX retired_epochs_path (path)
    events    (pos BIGINT PRIMARY KEY, channel_id, seq, time_ns, size, publisher_dialect BYTEA,
               publisher_user BYTEA, publisher_app BYTEA, publisher_msg_id BYTEA, content_type BYTEA,
               headers BYTEA, tags BYTEA, payload BYTEA)
              UNIQUE INDEX events_channel_seq (channel_id, seq)
    idem      (channel_id, "user" BYTEA, key BYTEA, seq, time_ns, origin_id, origin_epoch,
               PRIMARY KEY (channel_id, "user", key))
              INDEX idem_time (time_ns)
    consumers (id BIGSERIAL PRIMARY KEY, name TEXT UNIQUE, spec TEXT, created_ns, top, pending, bytes)
    journal   (consumer_id, pos, attempts, not_before, channel TEXT, epoch TEXT, seq, time_ns, size,
               publisher_dialect BYTEA, publisher_user BYTEA, publisher_app BYTEA, publisher_msg_id BYTEA,
               content_type BYTEA, headers BYTEA, tags BYTEA, payload BYTEA, PRIMARY KEY (consumer_id, pos))
    consumer_gen (gen BIGINT)                            -- one row, bumped by consumer create and delete
    state     (ns TEXT COLLATE "C", key TEXT COLLATE "C", value TEXT, version BIGINT, PRIMARY KEY (ns, key))

It is the SQLite engine's schema (``hubbub.log.sqlite._schema``) with these differences:

* ``log_state`` is one row, and **every write transaction of every node locks it first**
  (``SELECT … FOR UPDATE``). It holds the log's last ``time_ns`` and last ``pos`` and the next epoch id, so
  writes of all nodes are serialised and each allocates, inside its own transaction, the next seqs of its
  channels (read from ``channels`` after taking the lock), the next times and positions: gapless, unique
  seqs per channel whatever the number of nodes, ``time_ns`` strictly increasing over the whole log, ``pos``
  in commit order. Holding one lock per commit costs little because commits are grouped (one transaction
  per batch of up to thousands of events), and no two writes can deadlock (every one takes this lock
  before any other).
* The publisher columns, ``content_type`` and the idempotency ``user`` and ``key`` are ``BYTEA`` holding
  UTF-8: PostgreSQL's ``TEXT`` cannot hold a NUL character, which a client's message id may contain, and one
  such event would fail the whole group commit. ``channels.path`` is ``TEXT COLLATE "C"`` (canonical paths
  have no control characters), which orders by UTF-8 bytes as :meth:`LogStore.channels` promises.
* ``pos`` is assigned by the store (``log_state.last_pos + 1, …``), not by a sequence, so that ``pos``
  order is commit order.

Epochs are kept as in SQLite: a new epoch moves the channel's ``channels`` row to ``retired_epochs`` under
its id, and the channel gets a new row with a new id (``log_state.next_id``).

Durable consumers (:mod:`hubbub.log.consumers`, ``_consumers.py``) are the SQLite engine's tables plus
``consumer_gen``, which tells every node's writer when to reload the consumers' filters. ``state`` holds the
state maps (:class:`~hubbub.log.base.StateMaps`, ``_state.py``: MQTT's retained index and sessions, the push
connectors' routes), shared by every node.

Versions and migration: the schema is created by the first store that opens the database as a writer, and
migrated by a writer that finds an older version, in one transaction under an advisory lock (several nodes
starting at once create it once). A store that finds a newer version refuses to open; a read-only store
needs the current version. ``_MIGRATIONS[v]`` takes version ``v`` to ``v + 1``. Version 2 is the last one
released before the state maps; version 3 adds them. Unreleased development builds numbered a table of the
connectors' routes 3 and the state maps 4: a database recording 3 or 4 that still has ``connector_routes``
is one of theirs, and is migrated as from 2 (the step creates ``state`` only when missing, copies the routes
into it as ``hubbub.log.routes`` keeps them, and drops ``connector_routes``).

Durability (protocols README §5) maps to ``synchronous_commit`` of the writer's connection:

* ``fsync``: ``on``: the commit's WAL is flushed to disk (and, when ``synchronous_standby_names`` is set, to
  the synchronous standbys) before the commit returns.
* ``commit``: ``local``: flushed to the database server's disk, without waiting for standbys. It survives a
  crash of any hubbub node and of PostgreSQL (the promise of ``commit`` is that a process crash loses no
  acknowledged event; PostgreSQL has no setting between "in its memory" and "on its disk").
* ``none``: ``off``: the commit returns before its WAL is written; a PostgreSQL crash may lose the last
  commits (never corrupting the database). ``async_start`` records, with a synced commit, the server run
  (``pg_postmaster_start_time()``) in which such commits were made; the first write after that server
  restarted sets ``suspect_below`` to the next epoch id, so :meth:`~PostgresLogStore.commits_may_be_lost`
  answers true for the epochs that were current then (native.md §6 ``ahead``). A hubbub node that crashes
  loses nothing PostgreSQL acknowledged, in any mode.
"""

from __future__ import annotations

from typing import Final

import psycopg

__all__ = ["DURABILITY_SYNCHRONOUS_COMMIT", "SCHEMA_VERSION"]

#: Version of the database schema in this module's docstring.
SCHEMA_VERSION: Final = 3

#: ``durability`` -> ``synchronous_commit`` (see the module docstring).
DURABILITY_SYNCHRONOUS_COMMIT: Final[dict[str, str]] = {"fsync": "on", "commit": "local", "none": "off"}

# Any constant: the advisory lock that serialises creating and migrating the schema.
_SCHEMA_LOCK: Final = 0x68756262

_SCHEMA_V1: Final = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    """CREATE TABLE log_state (
        id BOOLEAN PRIMARY KEY DEFAULT true CHECK (id),
        last_time BIGINT NOT NULL,
        last_pos BIGINT NOT NULL,
        next_id BIGINT NOT NULL,
        suspect_below BIGINT NOT NULL,
        async_start TIMESTAMPTZ
    )""",
    """CREATE TABLE channels (
        id BIGINT PRIMARY KEY,
        path TEXT COLLATE "C" NOT NULL UNIQUE,
        epoch TEXT NOT NULL,
        first BIGINT NOT NULL,
        top BIGINT NOT NULL,
        top_time BIGINT NOT NULL,
        count BIGINT NOT NULL,
        bytes BIGINT NOT NULL
    )""",
    """CREATE TABLE retired_epochs (
        id BIGINT PRIMARY KEY,
        path TEXT COLLATE "C" NOT NULL,
        epoch TEXT NOT NULL,
        first BIGINT NOT NULL,
        top BIGINT NOT NULL,
        top_time BIGINT NOT NULL,
        count BIGINT NOT NULL,
        bytes BIGINT NOT NULL
    )""",
    "CREATE INDEX retired_epochs_path ON retired_epochs (path)",
    """CREATE TABLE events (
        pos BIGINT PRIMARY KEY,
        channel_id BIGINT NOT NULL,
        seq BIGINT NOT NULL,
        time_ns BIGINT NOT NULL,
        size BIGINT NOT NULL,
        publisher_dialect BYTEA NOT NULL,
        publisher_user BYTEA NOT NULL,
        publisher_app BYTEA NOT NULL,
        publisher_msg_id BYTEA NOT NULL,
        content_type BYTEA NOT NULL,
        headers BYTEA NOT NULL,
        tags BYTEA NOT NULL,
        payload BYTEA NOT NULL
    )""",
    "CREATE UNIQUE INDEX events_channel_seq ON events (channel_id, seq)",
    """CREATE TABLE idem (
        channel_id BIGINT NOT NULL,
        "user" BYTEA NOT NULL,
        key BYTEA NOT NULL,
        seq BIGINT NOT NULL,
        time_ns BIGINT NOT NULL,
        origin_id BIGINT,
        origin_epoch TEXT,
        PRIMARY KEY (channel_id, "user", key)
    )""",
    "CREATE INDEX idem_time ON idem (time_ns)",
    "INSERT INTO log_state (last_time, last_pos, next_id, suspect_below) VALUES (0, 0, 1, 0)",
    "INSERT INTO schema_version (version) VALUES (1)",
)

# _MIGRATIONS[v]: the statements that take version v to v + 1. A new database is created at version 1 and
# migrated up like an old one.
_MIGRATIONS: Final[dict[int, tuple[str, ...]]] = {
    # 1 -> 2: durable consumers.
    1: (
        """CREATE TABLE consumers (
            id BIGSERIAL PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            spec TEXT NOT NULL,
            created_ns BIGINT NOT NULL,
            top BIGINT NOT NULL,
            pending BIGINT NOT NULL,
            bytes BIGINT NOT NULL
        )""",
        """CREATE TABLE journal (
            consumer_id BIGINT NOT NULL,
            pos BIGINT NOT NULL,
            attempts BIGINT NOT NULL,
            not_before BIGINT NOT NULL,
            channel TEXT NOT NULL,
            epoch TEXT NOT NULL,
            seq BIGINT NOT NULL,
            time_ns BIGINT NOT NULL,
            size BIGINT NOT NULL,
            publisher_dialect BYTEA NOT NULL,
            publisher_user BYTEA NOT NULL,
            publisher_app BYTEA NOT NULL,
            publisher_msg_id BYTEA NOT NULL,
            content_type BYTEA NOT NULL,
            headers BYTEA NOT NULL,
            tags BYTEA NOT NULL,
            payload BYTEA NOT NULL,
            PRIMARY KEY (consumer_id, pos)
        )""",
        "CREATE TABLE consumer_gen (gen BIGINT NOT NULL)",
        "INSERT INTO consumer_gen (gen) VALUES (0)",
    ),
    # 2 -> 3: the state maps (IF NOT EXISTS, and the routes table dropped: see the module docstring).
    2: (
        """CREATE TABLE IF NOT EXISTS state (
            ns TEXT COLLATE "C" NOT NULL,
            key TEXT COLLATE "C" NOT NULL,
            value TEXT,
            version BIGINT NOT NULL,
            PRIMARY KEY (ns, key)
        )""",
        """DO $$ BEGIN IF to_regclass('connector_routes') IS NOT NULL THEN
            INSERT INTO state (ns, key, value, version)
                SELECT 'routes:' || connector, key, json_build_object('name', name, 'body', body)::text, 1
                FROM connector_routes ON CONFLICT DO NOTHING;
            DROP TABLE connector_routes;
        END IF; END $$""",
    ),
}

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


def _schema_version(conn: psycopg.Connection[tuple[object, ...]]) -> int | None:
    """The database's schema version, None when it has no hubbub schema (in the current transaction)."""
    exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return None if row is None or row[0] is None else int(str(row[0]))


def _has_routes_table(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute("SELECT to_regclass('connector_routes') IS NOT NULL").fetchone()
    return bool(row and row[0])


def ensure_schema(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """Create or migrate the schema (see the module docstring); returns the version found before.

    Runs one transaction on ``conn`` (an autocommit connection) under the schema advisory lock. Raises
    :class:`ValueError` for a version newer than this hubbub's (the caller turns it into StorageError) and
    psycopg's errors."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        found = _schema_version(conn)
        start = found
        if found is None:
            for stmt in _SCHEMA_V1:
                conn.execute(stmt)
            start = 1
        elif found in (3, 4) and _has_routes_table(conn):
            start = 2  # an unreleased build's numbering (module docstring)
        elif found > SCHEMA_VERSION:
            raise ValueError(f"log database has schema version {found}, this hubbub reads {SCHEMA_VERSION}")
        assert start is not None
        for v in range(start, SCHEMA_VERSION):
            for stmt in _MIGRATIONS[v]:
                conn.execute(stmt)
            conn.execute("UPDATE schema_version SET version = %s", (v + 1,))
        return found or 0
