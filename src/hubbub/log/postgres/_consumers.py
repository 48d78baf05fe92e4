"""Durable consumers of :class:`PostgresLogStore` (:mod:`hubbub.log.consumers`): the ``consumers``,
``journal`` and ``consumer_gen`` tables of ``_schema.py``.

Several nodes share the database, so nothing about consumers is cached across transactions except their
filters: every append reads (in the same pipeline round trip as the channel heads, after taking the log lock)
the consumers' ``top`` and the one-row ``consumer_gen`` counter, which ``consumer_create`` and
``consumer_delete`` bump; when it moved, the node reloads the definitions before matching. An event committed
by any node is therefore journaled for every consumer created before its commit, by whichever node. Every
write here runs under the log lock (``_write``), like every other write of the store.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

import psycopg

from hubbub.log.base import AppendResult
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalIndex, JournalItem, Retry, check_spec
from hubbub.log.postgres._errors import _STORAGE_ERRORS, _error
from hubbub.log.postgres._reads import Conn, _Decoder
from hubbub.log.records import encode_headers, encode_tags

T = TypeVar("T")

#: Queued by every append after the log lock: the consumers' tops and the definitions' generation.
CONSUMER_TOPS: Final = "SELECT g.gen, c.id, c.top FROM consumer_gen g LEFT JOIN consumers c ON true"
_INSERT_JOURNAL: Final = (
    "INSERT INTO journal (consumer_id, pos, attempts, not_before, channel, epoch, seq, time_ns, size, "
    "publisher_dialect, publisher_user, publisher_app, publisher_msg_id, content_type, headers, tags, "
    "payload) "
    "SELECT u.cid, u.pos, 0, 0, u.ch, u.ep, u.seq, u.t, u.size, u.d, u.u, u.a, u.m, u.ct, u.h, u.tg, u.p "
    "FROM unnest(%b::int8[], %b::int8[], %b::text[], %b::text[], %b::int8[], %b::int8[], %b::int8[], "
    "%b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[]) "
    "AS u(cid, pos, ch, ep, seq, t, size, d, u, a, m, ct, h, tg, p)"
)
_ADD_TO_CONSUMERS: Final = (
    "UPDATE consumers AS c SET top = u.top, pending = c.pending + u.n, bytes = c.bytes + u.b "
    "FROM unnest(%b::int8[], %b::int8[], %b::int8[], %b::int8[]) AS u(id, top, n, b) WHERE c.id = u.id"
)
_ITEM_COLS: Final = (
    "pos, attempts, not_before, channel, epoch, seq, time_ns, publisher_dialect, publisher_user, "
    "publisher_app, publisher_msg_id, content_type, headers, tags, payload"
)
_CONSUMER_COLS: Final = "id, name, spec, created_ns, top, pending, bytes"
#: The first key of the advisory locks that are consumers' holds (``consumer_hold``): "hubb".
_HOLD_KEY: Final = 0x68756262
#: Server-side TCP keepalives of the holds' session (seconds): a silent peer is dropped after 10 + 5 * 3 s.
_HOLD_KEEPALIVES: Final = (
    ("tcp_keepalives_idle", 10),
    ("tcp_keepalives_interval", 5),
    ("tcp_keepalives_count", 3),
)


def _info(row: Sequence[Any]) -> ConsumerInfo:
    cid, name, spec, created, top, pending, nbytes = row
    return ConsumerInfo(cid, ConsumerSpec.from_json(name, spec), created, top, pending, nbytes)


class _ConsumerSide:
    """The consumer methods of :class:`PostgresLogStore`, which mixes this in (and provides ``_write``,
    ``_read``, ``_clock``)."""

    _jindex: JournalIndex
    _jgen: int
    _clock: Callable[[], int]
    #: The session whose advisory locks are this store's consumer holds (made on first use), and its lock.
    _hold_conn: Conn | None = None
    _hold_lock: Final = threading.Lock()

    if TYPE_CHECKING:

        def _connect(self, what: str) -> Conn: ...

        def _write(self, what: str, body: Callable[[Conn, Any], T]) -> T: ...

        def _read(self, fn: Callable[[Conn], T], *, snapshot: bool = True) -> T: ...

    def _journal(self, conn: Conn, results: list[AppendResult], tops_cur: psycopg.Cursor[Any]) -> None:
        """Journal each new event of an append for the consumers that match it (inside its transaction;
        ``tops_cur``: the queued :data:`CONSUMER_TOPS`)."""
        tops_rows = tops_cur.fetchall()
        gen = int(tops_rows[0][0]) if tops_rows else 0
        tops = {int(r[1]): int(r[2]) for r in tops_rows if r[1] is not None}
        if gen != self._jgen or len(self._jindex) != len(tops):
            index = JournalIndex()
            for cid, name, spec in conn.execute("SELECT id, name, spec FROM consumers").fetchall():
                index.add(cid, ConsumerSpec.from_json(name, spec))
            self._jindex, self._jgen = index, gen
        if not self._jindex:
            return
        match = self._jindex.match
        cols: list[list[Any]] = [[] for _ in range(15)]
        added: dict[int, list[int]] = {}  # id -> [events, bytes]
        for i, r in enumerate(results):
            if r.duplicate:
                continue
            ev = r.event
            ids = match(ev.channel, ev.tags)
            if not ids:
                continue
            p = ev.publisher
            hb = encode_headers(ev.headers) if ev.headers else b""
            tb = encode_tags(ev.tags) if ev.tags else b""
            size = ev.size
            entries = []
            for cid in ids:
                tops[cid] = pos = tops[cid] + 1
                acc = added.setdefault(cid, [0, 0])
                acc[0] += 1
                acc[1] += size
                entries.append((cid, pos))
                row = (cid, pos, ev.channel, ev.epoch, ev.seq, ev.time_ns, size, p.dialect.encode(),
                       p.user.encode(), p.app.encode(), p.msg_id.encode(), ev.content_type.encode(), hb, tb,
                       ev.payload)  # fmt: skip
                for col, v in zip(cols, row, strict=True):
                    col.append(v)
            results[i] = AppendResult(ev, False, tuple(entries))
        if added:
            conn.execute(_INSERT_JOURNAL, cols, binary=True)
            ids_ = list(added)
            conn.execute(
                _ADD_TO_CONSUMERS,
                (ids_, [tops[c] for c in ids_], [added[c][0] for c in ids_], [added[c][1] for c in ids_]),
            )

    def consumer_create(self, spec: ConsumerSpec) -> tuple[ConsumerInfo, bool]:
        def body(conn: Conn, lock: Any) -> tuple[ConsumerInfo, bool]:
            st = lock.state
            row = conn.execute(
                f"SELECT {_CONSUMER_COLS} FROM consumers WHERE name = %s", (spec.name,)
            ).fetchone()
            if row is not None:
                return _info(row), False
            check_spec(spec)  # before anything is written (a failure rolls back)
            created = max(self._clock(), st.last_time)
            row = conn.execute(
                "INSERT INTO consumers (name, spec, created_ns, top, pending, bytes) "
                f"VALUES (%s, %s, %s, 0, 0, 0) RETURNING {_CONSUMER_COLS}",
                (spec.name, spec.to_json(), created),
            ).fetchone()
            conn.execute("UPDATE consumer_gen SET gen = gen + 1")
            assert row is not None
            return _info(row), True

        return self._write("consumer", body)

    def consumer_delete(self, name: str, consumer_id: int | None = None) -> bool:
        def body(conn: Conn, lock: Any) -> bool:
            lock.state  # noqa: B018 -- takes the log lock first, as every write does
            if consumer_id is None:
                row = conn.execute("DELETE FROM consumers WHERE name = %s RETURNING id", (name,)).fetchone()
            else:
                row = conn.execute(
                    "DELETE FROM consumers WHERE name = %s AND id = %s RETURNING id", (name, consumer_id)
                ).fetchone()
            if row is None:
                return False
            conn.execute("DELETE FROM journal WHERE consumer_id = %s", (row[0],))
            conn.execute("UPDATE consumer_gen SET gen = gen + 1")
            return True

        return self._write("consumer", body)

    def consumer_settle(
        self, acked: Sequence[tuple[int, Sequence[int]]], retried: Sequence[Retry] = ()
    ) -> None:
        a_cid = [cid for cid, ps in acked for _ in ps]
        a_pos = [p for _, ps in acked for p in ps]
        r_cid = [r.consumer_id for r in retried for _ in r.positions]
        r_pos = [p for r in retried for p in r.positions]
        r_nb = [r.not_before_ns for r in retried for _ in r.positions]
        if not a_pos and not r_pos:
            return

        def body(conn: Conn, lock: Any) -> None:
            lock.state  # noqa: B018 -- takes the log lock first, as every write does
            if a_pos:
                conn.execute(
                    "WITH d AS (DELETE FROM journal j USING unnest(%b::int8[], %b::int8[]) AS u(cid, pos) "
                    "WHERE j.consumer_id = u.cid AND j.pos = u.pos RETURNING j.consumer_id, j.size), "
                    "s AS (SELECT consumer_id, count(*) AS n, sum(size) AS b FROM d GROUP BY consumer_id) "
                    "UPDATE consumers c SET pending = c.pending - s.n, bytes = c.bytes - s.b "
                    "FROM s WHERE c.id = s.consumer_id",
                    (a_cid, a_pos),
                )
            if r_pos:
                conn.execute(
                    "UPDATE journal j SET attempts = j.attempts + 1, not_before = u.nb "
                    "FROM unnest(%b::int8[], %b::int8[], %b::int8[]) AS u(cid, pos, nb) "
                    "WHERE j.consumer_id = u.cid AND j.pos = u.pos",
                    (r_cid, r_pos, r_nb),
                )

        self._write("consumer", body)

    def consumers(self) -> list[ConsumerInfo]:
        def q(conn: Conn) -> list[ConsumerInfo]:
            rows = conn.execute(f"SELECT {_CONSUMER_COLS} FROM consumers ORDER BY name").fetchall()
            return [_info(r) for r in rows]

        return self._read(q)

    def consumer_hold(self, consumer_id: int, take: bool = True) -> bool:
        """A session-level advisory lock on a connection of its own: PostgreSQL ends it with the session, so
        with the process (a node killed lets go at once). A lost connection loses every hold it had."""
        sql = "SELECT pg_try_advisory_lock(%s, %s)" if take else "SELECT pg_advisory_unlock(%s, %s)"
        with self._hold_lock:
            conn = self._hold_conn
            if conn is None or conn.closed or conn.broken:
                if not take:
                    return True  # the session is gone, and its holds with it
                conn = self._connect("consumer_hold")
                try:
                    # The server notices a dead node (a machine lost, not only a process) within ~25 s and
                    # ends its session, and the holds with it; the default is the OS's (often 2 hours).
                    for name, value in _HOLD_KEEPALIVES:
                        conn.execute(f"SET {name} = {value}")
                except _STORAGE_ERRORS as exc:
                    with contextlib.suppress(Exception):
                        conn.close()
                    raise _error("consumer_hold", exc) from exc
                self._hold_conn = conn
            try:
                row = conn.execute(sql, (_HOLD_KEY, consumer_id)).fetchone()
            except _STORAGE_ERRORS as exc:
                with contextlib.suppress(Exception):
                    conn.close()
                self._hold_conn = None
                raise _error("consumer_hold", exc) from exc
        return True if not take else bool(row and row[0])

    def _drop_holds(self) -> None:
        with self._hold_lock:
            conn, self._hold_conn = self._hold_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def consumer_items(self, consumer_id: int, after_pos: int = 0, limit: int = 1000) -> list[JournalItem]:
        if limit <= 0:
            return []

        def q(conn: Conn) -> list[JournalItem]:
            rows = conn.execute(
                f"SELECT {_ITEM_COLS} FROM journal WHERE consumer_id = %s AND pos > %s ORDER BY pos LIMIT %s",
                (consumer_id, after_pos, limit),
                binary=True,
            ).fetchall()
            dec = _Decoder()
            out = []
            for pos, attempts, nb, ch, epoch, *ev in rows:
                out.append(JournalItem(pos, dec.events(ch, epoch, [ev])[0], attempts, nb))
            return out

        return self._read(q)
