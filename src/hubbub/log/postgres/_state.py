"""The state maps of :class:`PostgresLogStore` (:class:`~hubbub.log.base.StateMaps`): the ``state`` table of
``_schema.py``, one row per entry (a removed entry keeps its row, value NULL, as a tombstone).

A write runs in a write transaction of the store, which holds the log lock as every write does: the nodes'
writes of one entry are serialised, and each reads the entry's version and writes the row applying the write's
:class:`~hubbub.log.base.StateWrite` (``state_set``'s rule or ``state_swap``'s). Reads run on a pooled
connection, each one snapshot. Concurrency: as the store's (``state_write``, under ``state_set`` and
``state_swap``, on the writer thread, reads anywhere).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from hubbub.log.base import StateWrite, prefix_upper
from hubbub.log.postgres._reads import Conn

T = TypeVar("T")

_GET: Final = "SELECT value, version FROM state WHERE ns = %s AND key = %s"
_LIST: Final = "SELECT key, value FROM state WHERE ns = %s AND key >= %s AND value IS NOT NULL"
_PUT: Final = (
    "INSERT INTO state (ns, key, value, version) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (ns, key) DO UPDATE SET value = excluded.value, version = excluded.version"
)


class _StateSide:
    """The state-map methods of :class:`PostgresLogStore`, which mixes this in (and provides ``_write`` and
    ``_read``)."""

    if TYPE_CHECKING:

        def _write(self, what: str, body: Callable[[Conn, Any], T]) -> T: ...

        def _read(self, fn: Callable[[Conn], T], *, snapshot: bool = True) -> T: ...

    def state_get(self, ns: str, key: str) -> tuple[str | None, int] | None:
        def q(conn: Conn) -> tuple[str | None, int] | None:
            row = conn.execute(_GET, (ns, key)).fetchone()
            return None if row is None else (None if row[0] is None else str(row[0]), int(row[1]))

        return self._read(q, snapshot=False)

    def state_list(self, ns: str, prefix: str = "") -> list[tuple[str, str]]:
        upper = prefix_upper(prefix) if prefix else None
        sql, params = _LIST, [ns, prefix]
        if upper is not None:
            sql, params = sql + " AND key < %s", [*params, upper]

        def q(conn: Conn) -> list[tuple[str, str]]:
            return [(str(k), str(v)) for k, v in conn.execute(sql + " ORDER BY key", params)]

        return self._read(q, snapshot=False)

    def state_write(self, ns: str, key: str, value: str | None, how: StateWrite) -> int | None:
        """Write the entry with the version ``how`` gives from its stored one (None: not written)."""

        def body(conn: Conn, lock: Any) -> int | None:
            lock.state  # noqa: B018 -- takes the log lock first, as every write does
            row = conn.execute(_GET + " FOR UPDATE", (ns, key)).fetchone()
            new = how.next(None if row is None else int(row[1]))
            if new is not None:
                conn.execute(_PUT, (ns, key, value, new))
            return new

        return self._write("state", body)
