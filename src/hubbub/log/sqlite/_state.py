"""The state maps of :class:`SqliteLogStore` (:class:`~hubbub.log.base.StateMaps`): the ``state`` table of
``_schema.py``, one row per entry (a removed entry keeps its row, value NULL, as a tombstone).

A write reads the entry's version and writes the row in one transaction of the writer connection (the one
writer of the file: the workers of a node write through the parent's), applying
:func:`~hubbub.log.base.next_state_version` (``state_swap``:
:func:`~hubbub.log.base.swapped_state_version`). Reads run on the calling thread's reader, each one snapshot.
Concurrency: as the store's (``state_set`` and ``state_swap`` on the writer thread, reads anywhere).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from hubbub.log.base import next_state_version, prefix_upper, swapped_state_version

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

    def state_set(self, ns: str, key: str, value: str | None, version: int | None = None) -> int | None:
        return self._state_write(ns, key, value, lambda stored: next_state_version(stored, version))

    def state_swap(self, ns: str, key: str, value: str | None, expect: int) -> int | None:
        return self._state_write(ns, key, value, lambda stored: swapped_state_version(stored, expect))

    def _state_write(
        self, ns: str, key: str, value: str | None, rule: Callable[[int | None], int | None]
    ) -> int | None:
        """Write the entry with the version ``rule`` gives from its stored one (None: not written)."""
        with self._transaction("state") as conn:
            row = conn.execute(_GET, (ns, key)).fetchone()
            new = rule(None if row is None else int(row[1]))
            if new is not None:
                conn.execute(_PUT, (ns, key, value, new))
            return new
