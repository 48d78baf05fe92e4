"""``SqliteLogStore``: the embedded default engine, one SQLite database file in WAL mode.

Import it from here (or from :mod:`hubbub.log`). The modules are its parts, and their docstrings are its
design record:

* ``_store.py``: :class:`SqliteLogStore` itself: opening, the lock file, the writer side (append, trim,
  epochs, retention), closing, and the concurrency contract.
* ``_schema.py``: the schema (and why ``events`` is a rowid table in log order), the migration from version
  1, the lost-commits marker, durability (:data:`DURABILITY_SYNCHRONOUS`), and opening the writer
  connection.
* ``_inserts.py``: the multi-row ``INSERT`` statements append writes events with (full rows and run rows).
* ``_idem.py``: idempotency keys, looked up and written per batch (one statement per channel and user).
* ``_reads.py``: the read side: per-thread reader connections, reads, runs, time searches, and the bulk scans
  of the data pipeline (:class:`ScanPlan`, :class:`ScanColumns`).
* ``_state.py``: the state maps (:class:`~hubbub.log.base.StateMaps`), one row per entry.
* ``_checkpointer.py``: the background WAL checkpointer.
* ``_errors.py``: how a failure becomes a :class:`~hubbub.errors.StorageError` (never SQL or paths), and the
  ``hubbub.log.sqlite`` logger.
"""

from __future__ import annotations

from hubbub.log.sqlite._reads import ScanColumns, ScanPlan
from hubbub.log.sqlite._schema import DURABILITY_SYNCHRONOUS, SCHEMA_VERSION
from hubbub.log.sqlite._store import SqliteLogStore

__all__ = ["DURABILITY_SYNCHRONOUS", "SCHEMA_VERSION", "ScanColumns", "ScanPlan", "SqliteLogStore"]
