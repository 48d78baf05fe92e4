"""The push connectors' routes of :class:`SqliteLogStore` (``hubbub.log.routes``): the ``connector_routes``
table of ``_schema.py``. Concurrency: as the store's (writer methods on the writer thread, reads anywhere)."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import TYPE_CHECKING, Final

from hubbub.log.routes import RouteRecord, put_allowed

_COLS: Final = "connector, name, key, body"


class _RouteSide:
    """The route methods of :class:`SqliteLogStore`, which mixes this in and provides ``_transaction`` and
    ``_snapshot``."""

    if TYPE_CHECKING:

        def _transaction(self, what: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

        def _snapshot(self) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

    def route_put(self, record: RouteRecord, *, replace: bool = False) -> bool:
        with self._transaction("route") as conn:
            rows = conn.execute(
                f"SELECT {_COLS} FROM connector_routes WHERE connector = ? AND (name = ? OR key = ?)",
                (record.connector, record.name, record.key),
            ).fetchall()
            if not put_allowed({r[1]: RouteRecord(*r) for r in rows}, record, replace):
                return False
            conn.execute(
                f"INSERT OR REPLACE INTO connector_routes ({_COLS}) VALUES (?, ?, ?, ?)",
                (record.connector, record.name, record.key, record.body),
            )
        return True

    def route_delete(self, connector: str, name: str) -> bool:
        with self._transaction("route") as conn:
            cur = conn.execute(
                "DELETE FROM connector_routes WHERE connector = ? AND name = ?", (connector, name)
            )
            return cur.rowcount > 0

    def route_records(self, connector: str) -> list[RouteRecord]:
        with self._snapshot() as conn:
            rows = conn.execute(
                f"SELECT {_COLS} FROM connector_routes WHERE connector = ? ORDER BY name", (connector,)
            ).fetchall()
        return [RouteRecord(*r) for r in rows]
