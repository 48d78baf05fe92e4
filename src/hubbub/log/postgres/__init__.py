"""``PostgresLogStore``: the shared engine, one PostgreSQL database written by several hubbub nodes.

Import it from here (or from :mod:`hubbub.log`). The modules are its parts, and their docstrings are its
design record:

* ``_store.py``: :class:`PostgresLogStore` itself: opening, the writer side (append, trim, epochs,
  retention), write transactions and their failures, closing, and the concurrency contract.
* ``_schema.py``: the schema (and how the log lock makes seqs gapless across nodes), versions and migration,
  and durability (:data:`DURABILITY_SYNCHRONOUS_COMMIT`).
* ``_reads.py``: the read side: pooled connections, snapshots, reads, runs, and the bulk scans of the data
  pipeline.
* ``_state.py``: the state maps (:class:`~hubbub.log.base.StateMaps`), one row per entry.
* ``_errors.py``: how a failure becomes a :class:`~hubbub.errors.StorageError` (never SQL or credentials),
  and the ``hubbub.log.postgres`` logger.

It needs ``psycopg`` (3) and ``psycopg-pool``; :mod:`hubbub.log` imports this package only when a
``postgresql://`` store is opened.
"""

from __future__ import annotations

from hubbub.log.postgres._schema import DURABILITY_SYNCHRONOUS_COMMIT, SCHEMA_VERSION
from hubbub.log.postgres._store import PostgresLogStore

__all__ = ["DURABILITY_SYNCHRONOUS_COMMIT", "SCHEMA_VERSION", "PostgresLogStore"]
