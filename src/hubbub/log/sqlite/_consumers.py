"""Durable consumers of :class:`SqliteLogStore` (:mod:`hubbub.log.consumers`): the ``consumers`` and
``journal`` tables of ``_schema.py``.

The writer keeps every consumer's row (``top``, ``pending``, ``bytes``) and the :class:`JournalIndex` of
their filters in memory, loaded at open and reloaded after a failed transaction, like the channel heads.
Journaling is part of ``append``'s transaction (:meth:`_ConsumerSide._journal`), so an event and its journal
copies commit together. Concurrency: as the store's (writer methods on the writer thread, reads anywhere).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from hubbub.events import Event, Publisher
from hubbub.log.base import AppendResult
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalIndex, JournalItem, Retry, check_spec
from hubbub.log.records import decode_headers, decode_tags, encode_headers, encode_tags
from hubbub.log.sqlite._inserts import _EMPTY_BLOB, _INSERT_MAX_LOG2, _blob, _insert_chunks, _insert_log2
from hubbub.log.sqlite._reads import _ReadSide

_JOURNAL_HEAD: Final = (
    "INSERT INTO journal (consumer_id, pos, attempts, not_before, channel, epoch, seq, time_ns, size, "
    "publisher_dialect, publisher_user, publisher_app, publisher_msg_id, content_type, headers, tags, "
    "payload) VALUES "
)
# Multi-row statements of 2**k rows (k <= _INSERT_MAX_LOG2), as append writes ``events`` (_inserts.py): one
# sqlite3_step per statement instead of one per row. The items of one consumer that share their channel,
# epoch, publisher (but for msg_id), content type, headers and tags (one connection's burst: the usual
# commit) are a *run*: a run statement binds the _JRUN_SHARED columns once (?1-?9: consumer id, channel,
# epoch, dialect, user, app, content type, encoded headers and tags) and per item only _JRUN_ROW (pos, seq,
# time_ns, size, msg_id, payload), where a full row binds all _JOURNAL_ROW: binding is most of the cost of
# the insert (measured on the 2-core dev machine with a consumer of every event, batches of 100: the writer's
# journal insert 5.1 µs per item with full rows). Groups shorter than _MIN_JRUN use full rows.
_JOURNAL_ROW: Final = 15
_JRUN_SHARED: Final = 9
_JRUN_ROW: Final = 6
_MIN_JRUN: Final = 8
_INSERT_JOURNAL: Final = tuple(
    _JOURNAL_HEAD + ", ".join(["(?, ?, 0, 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * (1 << k))
    for k in range(_INSERT_MAX_LOG2 + 1)
)
_INSERT_JOURNAL_RUN: Final = tuple(
    _JOURNAL_HEAD
    + ", ".join(
        f"(?1, ?{b + 1}, 0, 0, ?2, ?3, ?{b + 2}, ?{b + 3}, ?{b + 4}, ?4, ?5, ?6, ?{b + 5}, ?7, ?8, ?9, "
        f"?{b + 6})"
        for b in range(_JRUN_SHARED, _JRUN_SHARED + (_JRUN_ROW << k), _JRUN_ROW)
    )
    for k in range(_INSERT_MAX_LOG2 + 1)
)
_ITEM_COLS: Final = (
    "pos, attempts, not_before, channel, epoch, seq, time_ns, publisher_dialect, publisher_user, "
    "publisher_app, publisher_msg_id, content_type, headers, tags, payload"
)
_UPDATE_CONSUMER: Final = "UPDATE consumers SET top = ?, pending = ?, bytes = ?, acked_to = ? WHERE id = ?"
# An acknowledged run of consecutive positions (the usual batch): one range of the primary key, where an
# ``IN`` list of the same positions costs a look-up per position (see _runs). The count and bytes of what
# goes are read first, in the same transaction: ``DELETE … RETURNING size`` cost four times as much as
# both statements (2.5 against 0.6 µs per item, 100-item ranges, on the 2-core dev machine).
_COUNT_RANGE: Final = "SELECT count(*), sum(size) FROM journal WHERE consumer_id = ? AND pos BETWEEN ? AND ?"
_DELETE_RANGE: Final = "DELETE FROM journal WHERE consumer_id = ? AND pos BETWEEN ? AND ?"
_MIN_RANGE: Final = 4
# A consumer's ``acked_to`` (_schema.py): an acknowledged run of positions that starts above it with no
# unacknowledged item in between moves it up, and the run's rows stay where they are: the settle's commit
# then writes the ``consumers`` row's page, where deleting the rows rewrote every leaf page they were on
# (the settle of a 100-item batch, thread CPU per item, on the 2-core dev machine: see bench/RESULTS.md).
# The rows at or below ``acked_to`` go in one range delete once _SWEEP positions have collected, in the
# settle that passes the mark; reads skip them meanwhile (and after a restart, until the next sweep).
_LIVE_BETWEEN: Final = "SELECT 1 FROM journal WHERE consumer_id = ? AND pos > ? AND pos < ? LIMIT 1"
_SWEEP_STMT: Final = "DELETE FROM journal WHERE consumer_id = ? AND pos <= ?"
_SWEEP: Final = 2048


@dataclass(slots=True)
class _Row:
    """The writer's copy of one ``consumers`` row."""

    id: int
    spec: ConsumerSpec
    created_ns: int
    top: int
    pending: int
    bytes: int
    acked_to: int
    #: Rows at or below this position are deleted (not kept: 0 after a load, so the first settle sweeps).
    swept: int = 0

    def info(self) -> ConsumerInfo:
        return ConsumerInfo(self.id, self.spec, self.created_ns, self.top, self.pending, self.bytes)


def _items(rows: Iterable[Sequence[Any]]) -> list[JournalItem]:
    """Journal rows (_ITEM_COLS) as items. The publishers of one page are shared (a page is mostly one
    connection's burst), as ``_ReadSide._events`` does: building the values is half the cost of a read."""
    pubs: dict[tuple[str, str, str, str], Publisher] = {}
    out: list[JournalItem] = []
    add = out.append
    for (
        pos,
        attempts,
        not_before,
        ch,
        epoch,
        seq,
        t,
        dialect,
        user,
        app,
        msg_id,
        ctype,
        hb,
        tb,
        payload,
    ) in rows:
        pk = (dialect, user, app, msg_id)
        pub = pubs.get(pk)
        if pub is None:
            pub = pubs[pk] = Publisher(dialect, user, app, msg_id)
        ev = Event(
            ch,
            seq,
            epoch,
            t,
            pub,
            payload,
            ctype,
            decode_headers(hb) if hb else {},
            decode_tags(tb) if tb else (),
        )
        add(JournalItem(pos, ev, attempts, not_before))
    return out


class _ConsumerSide(_ReadSide):
    """The consumer methods of :class:`SqliteLogStore`, which mixes this in and provides ``_transaction``
    and ``_clock``."""

    _crows: dict[int, _Row]
    _jindex: JournalIndex
    _last_time: int
    _clock: Callable[[], int]

    if TYPE_CHECKING:

        def _transaction(self, what: str) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...

    def _load_consumers(self, conn: sqlite3.Connection) -> None:
        """(Re)load the consumer rows and their filters (writer thread; raises sqlite3.Error)."""
        rows = conn.execute(
            "SELECT id, name, spec, created_ns, top, pending, bytes, acked_to FROM consumers"
        ).fetchall()
        crows: dict[int, _Row] = {}
        index = JournalIndex()
        for cid, name, spec, created, top, pending, nbytes, acked_to in rows:
            r = crows[cid] = _Row(
                cid, ConsumerSpec.from_json(name, spec), created, top, pending, nbytes, acked_to
            )
            index.add(cid, r.spec)
        self._crows, self._jindex = crows, index

    def _journal(self, conn: sqlite3.Connection, results: list[AppendResult]) -> None:
        """Journal each new event of an append for the consumers that match it (inside its transaction)."""
        match, crows = self._jindex.match, self._crows
        # Per run (see _INSERT_JOURNAL_RUN): its shared values -> its items' _JRUN_ROW values.
        runs: dict[tuple[Any, ...], list[Any]] = {}
        touched: dict[int, _Row] = {}
        # The previous event's shape (channel, tags, epoch, publisher but for msg_id, content type; no
        # headers) and, per consumer it matched, its rows and run: the events of one connection's burst share
        # them, so their run keys are built and looked up once per burst, not per event and consumer.
        last_shape: tuple[Any, ...] | None = None
        last: list[tuple[_Row, list[Any]]] = []
        for i, r in enumerate(results):
            if r.duplicate:
                continue
            ev = r.event
            p = ev.publisher
            shape = (ev.channel, ev.tags, ev.epoch, p.dialect, p.user, p.app, ev.content_type)
            if ev.headers or shape != last_shape:
                ids = match(ev.channel, ev.tags)
                if not ids:
                    last_shape = None
                    continue
                hb = encode_headers(ev.headers) if ev.headers else b""
                tb = encode_tags(ev.tags) if ev.tags else b""
                last = []
                for cid in ids:
                    c = touched[cid] = crows[cid]
                    key = (cid, ev.channel, ev.epoch, p.dialect, p.user, p.app, ev.content_type, hb, tb)
                    run = runs.get(key)
                    if run is None:
                        run = runs[key] = []
                    last.append((c, run))
                last_shape = None if ev.headers else shape
            size = ev.size
            bp = _blob(ev.payload)
            if len(last) == 1:
                c, run = last[0]
                c.top = top = c.top + 1
                c.pending += 1
                c.bytes += size
                run.extend((top, ev.seq, ev.time_ns, size, p.msg_id, bp))
                results[i] = AppendResult(ev, False, ((c.id, top),))
                continue
            entries = []
            for c, rows in last:
                c.top = top = c.top + 1
                c.pending += 1
                c.bytes += size
                entries.append((c.id, top))
                rows.extend((top, ev.seq, ev.time_ns, size, p.msg_id, bp))
            results[i] = AppendResult(ev, False, tuple(entries))
        if runs:
            limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
            full: list[Any] = []
            for key, run in runs.items():
                if len(run) >= _MIN_JRUN * _JRUN_ROW:
                    log2 = _insert_log2(limit, _JRUN_SHARED, _JRUN_ROW)
                    _insert_chunks(conn, _INSERT_JOURNAL_RUN, log2, _JRUN_SHARED, _JRUN_ROW, [*key, *run])
                    continue
                cid, channel, epoch, dialect, user, app, ctype, hb_key, tb_key = key
                hbb, tbb = hb_key or _EMPTY_BLOB, tb_key or _EMPTY_BLOB
                for j in range(0, len(run), _JRUN_ROW):
                    pos, seq, t, size, msg_id, payload = run[j : j + _JRUN_ROW]
                    full += (cid, pos, channel, epoch, seq, t, size, dialect, user, app, msg_id, ctype,
                             hbb, tbb, payload)  # fmt: skip
            if full:
                log2 = _insert_log2(limit, 0, _JOURNAL_ROW)
                _insert_chunks(conn, _INSERT_JOURNAL, log2, 0, _JOURNAL_ROW, full)
            conn.executemany(
                _UPDATE_CONSUMER, [(c.top, c.pending, c.bytes, c.acked_to, c.id) for c in touched.values()]
            )

    def consumer_create(self, spec: ConsumerSpec) -> tuple[ConsumerInfo, bool]:
        for r in self._crows.values():
            if r.spec.name == spec.name:
                return r.info(), False
        check_spec(spec)  # before anything is written
        created = max(self._clock(), self._last_time)
        with self._transaction("consumer") as conn:
            cur = conn.execute(
                "INSERT INTO consumers (name, spec, created_ns, top, pending, bytes) "
                "VALUES (?, ?, ?, 0, 0, 0)",
                (spec.name, spec.to_json(), created),
            )
            cid = int(cur.lastrowid or 0)
        row = self._crows[cid] = _Row(cid, spec, created, 0, 0, 0, 0)
        self._jindex.add(cid, spec)
        return row.info(), True

    def consumer_delete(self, name: str) -> bool:
        found = [r for r in self._crows.values() if r.spec.name == name]
        if not found:
            return False
        cid = found[0].id
        with self._transaction("consumer") as conn:
            conn.execute("DELETE FROM journal WHERE consumer_id = ?", (cid,))
            conn.execute("DELETE FROM consumers WHERE id = ?", (cid,))
        del self._crows[cid]
        self._jindex.remove(cid)
        return True

    def consumer_settle(
        self, acked: Sequence[tuple[int, Sequence[int]]], retried: Sequence[Retry] = ()
    ) -> None:
        crows = self._crows
        acked = [(cid, ps) for cid, ps in acked if cid in crows and ps]
        retried = [r for r in retried if r.consumer_id in crows and r.positions]
        if not acked and not retried:
            return
        with self._transaction("consumer") as conn:
            touched: set[int] = set()
            for cid, positions in acked:
                c = crows[cid]
                if self._settle_acked(conn, c, sorted({p for p in positions if p > c.acked_to})):
                    touched.add(cid)
            for r in retried:
                floor = crows[r.consumer_id].acked_to
                conn.executemany(
                    "UPDATE journal SET attempts = attempts + 1, not_before = ? "
                    "WHERE consumer_id = ? AND pos = ?",
                    [(r.not_before_ns, r.consumer_id, p) for p in r.positions if p > floor],
                )
            if touched:
                conn.executemany(
                    _UPDATE_CONSUMER,
                    [(crows[c].top, crows[c].pending, crows[c].bytes, crows[c].acked_to, c) for c in touched],
                )

    @staticmethod
    def _settle_acked(conn: sqlite3.Connection, c: _Row, positions: list[int]) -> bool:
        """Acknowledge ``positions`` (sorted, distinct, above ``acked_to``) of ``c`` in the transaction of
        ``conn``: the leading run moves ``acked_to`` when no unacknowledged item lies below it, the rest are
        deleted (ranges and ``IN`` lists, see _runs); sweeps when due. Whether ``c``'s row changed."""
        if not positions:
            return False
        cid = c.id
        changed = False
        lo = positions[0]
        if lo == c.acked_to + 1 or conn.execute(_LIVE_BETWEEN, (cid, c.acked_to, lo)).fetchone() is None:
            j = 1
            while j < len(positions) and positions[j] == lo + j:
                j += 1
            hi = positions[j - 1]
            n, nbytes = conn.execute(_COUNT_RANGE, (cid, lo, hi)).fetchone()
            c.pending -= n
            c.bytes -= nbytes or 0
            c.acked_to = hi
            changed = True
            del positions[:j]
            if c.acked_to - c.swept >= _SWEEP:
                conn.execute(_SWEEP_STMT, (cid, c.acked_to))
                c.swept = c.acked_to
        ranges, scattered = _runs(positions)
        for lo, hi in ranges:
            n, nbytes = conn.execute(_COUNT_RANGE, (cid, lo, hi)).fetchone()
            if n:
                conn.execute(_DELETE_RANGE, (cid, lo, hi))
                c.pending -= n
                c.bytes -= nbytes
                changed = True
        for chunk in _chunks(scattered):
            where = f"WHERE consumer_id = ? AND pos IN ({','.join('?' * len(chunk))})"
            n, nbytes = conn.execute(
                f"SELECT count(*), sum(size) FROM journal {where}", (cid, *chunk)
            ).fetchone()
            if n:
                conn.execute(f"DELETE FROM journal {where}", (cid, *chunk))
                c.pending -= n
                c.bytes -= nbytes
                changed = True
        return changed

    def consumers(self) -> list[ConsumerInfo]:
        with self._snapshot() as conn:
            rows = conn.execute(
                "SELECT id, name, spec, created_ns, top, pending, bytes FROM consumers ORDER BY name"
            ).fetchall()
        return [
            ConsumerInfo(cid, ConsumerSpec.from_json(name, spec), created, top, pending, nbytes)
            for cid, name, spec, created, top, pending, nbytes in rows
        ]

    def consumer_items(self, consumer_id: int, after_pos: int = 0, limit: int = 1000) -> list[JournalItem]:
        if limit <= 0:
            return []
        with self._snapshot() as conn:
            rows = conn.execute(
                f"SELECT {_ITEM_COLS} FROM journal WHERE consumer_id = ?1 "
                "AND pos > max(?2, (SELECT acked_to FROM consumers WHERE id = ?1)) ORDER BY pos LIMIT ?3",
                (consumer_id, after_pos, limit),
            ).fetchall()
        return _items(rows)


def _runs(positions: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """Sorted distinct ``positions`` as the ranges of their runs of at least :data:`_MIN_RANGE` consecutive
    positions (each deleted by one range scan of the primary key) and the positions outside such runs (an
    ``IN`` list). A batch acknowledged in order is one range."""
    n = len(positions)
    if n >= _MIN_RANGE and positions[-1] - positions[0] == n - 1:
        return [(positions[0], positions[-1])], []
    ranges: list[tuple[int, int]] = []
    scattered: list[int] = []
    i = 0
    while i < n:
        lo = positions[i]
        j = i + 1
        while j < n and positions[j] == lo + (j - i):
            j += 1
        if j - i >= _MIN_RANGE:
            ranges.append((lo, positions[j - 1]))
        else:
            scattered += positions[i:j]
        i = j
    return ranges, scattered


def _chunks(values: list[int], size: int = 500) -> Iterator[list[int]]:
    for i in range(0, len(values), size):
        yield values[i : i + size]
