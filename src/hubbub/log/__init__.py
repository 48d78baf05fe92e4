"""The durable per-channel event log: the :class:`LogStore` interface (its roles: :class:`EventLog`,
:class:`EpochAdmin`, :class:`ConsumerJournal`, :class:`BulkScan`), its engines, and :func:`open_store`.

Engines: :class:`MemoryLogStore` (reference, nothing survives a restart), :class:`SqliteLogStore` (the
embedded default) and ``PostgresLogStore`` (:mod:`hubbub.log.postgres`: one database shared by several
nodes; imported when opened, so that psycopg is loaded only where it is used). Every engine does blocking
I/O and must be called off the event loop (see ``base.py`` for the threading contract). The record schema
shared with the data pipeline is in :mod:`hubbub.log.records`.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from hubbub.log.base import (
    AppendRequest,
    AppendResult,
    AppendRun,
    BulkScan,
    ChannelInfo,
    ConsumerJournal,
    EpochAdmin,
    EventLog,
    LogMark,
    LogPage,
    LogStore,
    RetentionPolicy,
    ScanColumns,
    ScanPlan,
    StoreStats,
    new_epoch,
)
from hubbub.log.memory import MemoryLogStore
from hubbub.log.sqlite import DURABILITY_SYNCHRONOUS, SqliteLogStore

__all__ = [
    "DB_FILENAME",
    "AppendRequest",
    "AppendResult",
    "AppendRun",
    "BulkScan",
    "ChannelInfo",
    "ConsumerJournal",
    "EpochAdmin",
    "EventLog",
    "LogMark",
    "LogPage",
    "LogStore",
    "MemoryLogStore",
    "RetentionPolicy",
    "ScanColumns",
    "ScanPlan",
    "SqliteLogStore",
    "StoreStats",
    "new_epoch",
    "open_store",
]

#: The database file ``store = "sqlite"`` uses inside ``data_dir``.
DB_FILENAME = "hubbub.db"


def open_store(
    url: str,
    data_dir: str,
    durability: str,
    retention: RetentionPolicy,
    idem_window_s: float,
    *,
    readonly: bool = False,
) -> LogStore:
    """Open the log store that ``url`` names (protocols README §2, key ``store``).

    * ``sqlite``: ``<data_dir>/hubbub.db``, creating ``data_dir`` if needed.
    * ``sqlite:///<absolute path>``: that database file, creating its directory if needed.
    * ``memory``: an in-memory store; nothing survives a restart.
    * ``postgresql://…`` (or ``postgres://…``): a PostgreSQL database (libpq URI), which several servers may
      share; the schema is created or migrated at open.

    Anything else, or an unknown ``durability``, raises :class:`ValueError` with a message fit for the user
    (it never echoes credentials). Failing to open the database raises :class:`hubbub.errors.StorageError`.
    Blocking: call it off the event loop.

    ``readonly=True`` (SQLite, PostgreSQL) opens a reader of an existing log, which may belong to running
    servers: no lock, nothing created, the writer methods raise ``StorageError`` (the data pipeline uses it).
    """
    if durability not in DURABILITY_SYNCHRONOUS:
        raise ValueError(f"durability must be one of {', '.join(DURABILITY_SYNCHRONOUS)}, not {durability!r}")
    if url == "memory":
        if readonly:
            raise ValueError("store: a memory store cannot be opened read-only")
        return MemoryLogStore(retention=retention, idem_window_s=idem_window_s)
    if url == "sqlite":
        if not readonly:
            os.makedirs(data_dir, exist_ok=True)
        path = os.path.join(data_dir, DB_FILENAME)
    elif url.startswith("sqlite:"):
        if not url.startswith("sqlite:///") or len(url) == len("sqlite:///"):
            raise ValueError("store: write a SQLite file as sqlite:///<absolute path> (three slashes)")
        path = url[len("sqlite://") :]
        parent = os.path.dirname(path)
        if parent and not readonly:
            os.makedirs(parent, exist_ok=True)
    else:
        scheme = urlsplit(url).scheme.lower() if "://" in url else ""
        if scheme in ("postgresql", "postgres"):
            from hubbub.log.postgres import PostgresLogStore

            return PostgresLogStore(
                url,
                durability=durability,
                retention=retention,
                idem_window_s=idem_window_s,
                readonly=readonly,
            )
        # Only the scheme is echoed: a URL may carry a password.
        shown = f"{scheme}://…" if scheme else repr(url)
        raise ValueError(
            f"store: unknown log store {shown} (expected sqlite, sqlite:///<file>, memory or postgresql://…)"
        )
    return SqliteLogStore(
        path, durability=durability, retention=retention, idem_window_s=idem_window_s, readonly=readonly
    )
