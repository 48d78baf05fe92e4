"""The state maps of :class:`SqliteLogStore` (:class:`~hubbub.log.base.StateMaps`): the ``state`` table of
``_schema.py``, one row per entry (a removed entry keeps its row, value NULL, as a tombstone).

A write reads the entry's version and writes the row in one transaction of the writer connection (the one
writer of the file: the workers of a node write through the parent's), applying the write's
:class:`~hubbub.log.base.StateWrite` (``state_set``'s rule or ``state_swap``'s). Reads run on the calling
thread's reader, each one snapshot. Concurrency: as the store's (``state_write``, under ``state_set`` and
``state_swap``, on the writer thread, reads anywhere).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from hubbub.log.base import StateWrite, prefix_upper

_GET: Final = "SELECT value, version FROM state WHERE ns = ? AND key = ?"
_LIST: Final = "SELECT key, value FROM state WHERE ns = ? AND key >= ? AND value IS NOT NULL"
_PUT: Final = "INSERT OR REPLACE INTO state (ns, key, value, version) VALUES (?, ?, ?, ?)"


class _StateSide:
    """The state-map methods of :class:`SqliteLogStore`, which mixes this in (and provides ``_one``,
    ``_snapshot`` and ``_transaction``)."""

    if TYPE_CHECKING:

        def _one(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

        def _snapshot(self) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

        def _transaction(self, what: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

    def state_get(self, ns: str, key: str) -> tuple[str | None, int] | None:
        row = self._one(_GET, (ns, key))
        return None if row is None else (row[0], int(row[1]))

    def state_list(self, ns: str, prefix: str = "") -> list[tuple[str, str]]:
        upper = prefix_upper(prefix) if prefix else None
        sql, params = _LIST, [ns, prefix]
        if upper is not None:
            sql, params = sql + " AND key < ?", [*params, upper]
        with self._snapshot() as conn:
            return [(str(k), str(v)) for k, v in conn.execute(sql + " ORDER BY key", params)]

    def state_write(self, ns: str, key: str, value: str | None, how: StateWrite) -> int | None:
        """Write the entry with the version ``how`` gives from its stored one (None: not written)."""
        with self._transaction("state") as conn:
            row = conn.execute(_GET, (ns, key)).fetchone()
            new = how.next(None if row is None else int(row[1]))
            if new is not None:
                conn.execute(_PUT, (ns, key, value, new))
            return new
