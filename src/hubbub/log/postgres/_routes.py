"""The push connectors' routes of :class:`PostgresLogStore` (``hubbub.log.routes``): the ``connector_routes``
table of ``_schema.py``, shared by every node. A put checks and writes under the log lock, as every write of
the store does, so two nodes putting the same key at once store one record."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

from hubbub.log.postgres._reads import Conn
from hubbub.log.routes import RouteRecord, put_allowed

T = TypeVar("T")

_COLS: Final = "connector, name, key, body"


class _RouteSide:
    """The route methods of :class:`PostgresLogStore`, which mixes this in (and provides ``_write`` and
    ``_read``)."""

    if TYPE_CHECKING:

        def _write(self, what: str, body: Callable[[Conn, Any], T]) -> T: ...

        def _read(self, fn: Callable[[Conn], T], *, snapshot: bool = True) -> T: ...

    def route_put(self, record: RouteRecord, *, replace: bool = False) -> bool:
        def body(conn: Conn, lock: Any) -> bool:
            lock.state  # noqa: B018 -- takes the log lock first, as every write does
            rows = conn.execute(
                f"SELECT {_COLS} FROM connector_routes WHERE connector = %s AND (name = %s OR key = %s)",
                (record.connector, record.name, record.key),
            ).fetchall()
            if not put_allowed({r[1]: RouteRecord(*r) for r in rows}, record, replace):
                return False
            conn.execute(
                f"INSERT INTO connector_routes ({_COLS}) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (connector, name) DO UPDATE SET key = excluded.key, body = excluded.body",
                (record.connector, record.name, record.key, record.body),
            )
            return True

        return self._write("route", body)

    def route_delete(self, connector: str, name: str) -> bool:
        def body(conn: Conn, lock: Any) -> bool:
            lock.state  # noqa: B018 -- takes the log lock first, as every write does
            row = conn.execute(
                "DELETE FROM connector_routes WHERE connector = %s AND name = %s RETURNING name",
                (connector, name),
            ).fetchone()
            return row is not None

        return self._write("route", body)

    def route_records(self, connector: str) -> list[RouteRecord]:
        def q(conn: Conn) -> list[RouteRecord]:
            rows = conn.execute(
                f"SELECT {_COLS} FROM connector_routes WHERE connector = %s ORDER BY name", (connector,)
            ).fetchall()
            return [RouteRecord(*r) for r in rows]

        return self._read(q)
