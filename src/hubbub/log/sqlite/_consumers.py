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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from hubbub.errors import StorageError
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendResult
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalIndex, JournalItem, Retry, check_spec
from hubbub.log.records import decode_headers, decode_tags, encode_headers, encode_tags
from hubbub.log.sqlite._inserts import _EMPTY_BLOB, _INSERT_MAX_LOG2, _blob, _insert_chunks, _insert_log2
from hubbub.log.sqlite._reads import _ReadSide
from hubbub.log.sqlite._schema import _JOURNAL_COPY

# A journal row refers to its event while the event is in the log (``ref``: its ``events.pos``) and holds a
# copy of it once it is not (_schema.py). Rows by reference are 6 narrow columns where a copy binds 15 and
# stores the payload twice: measured on the 2-core dev machine (``bench/consumer_store.py``: batches of 100,
# 100-byte payloads, one consumer), journaling cost 2.9 µs per event with copies and 1.7 by reference, the
# settle 1.15 and 0.8; a row of 300 bytes costs SQLite about four times as much to delete as one of 40
# (bench/RESULTS.md). An append writes them with multi-row statements of 2**k rows (k <=
# _INSERT_MAX_LOG2), as it writes ``events`` (_inserts.py), binding the consumer id once per statement and
# per row only _JREF_ROW (pos, size, ref). An event trimmed in its own append (a per-channel limit) is
# journaled as a copy (_INSERT_COPY, _JCOPY_ROW per row).
_JREF_ROW: Final = 3
_INSERT_JREF: Final = tuple(
    "INSERT INTO journal (consumer_id, pos, attempts, not_before, size, ref) VALUES "
    + ", ".join(
        f"(?1, ?{b + 1}, 0, 0, ?{b + 2}, ?{b + 3})" for b in range(1, 1 + (_JREF_ROW << k), _JREF_ROW)
    )
    for k in range(_INSERT_MAX_LOG2 + 1)
)
_JCOPY_ROW: Final = 15
_INSERT_COPY: Final = tuple(
    f"INSERT INTO journal (consumer_id, pos, attempts, not_before, size, ref, {_JOURNAL_COPY}) VALUES "
    + ", ".join(["(?, ?, 0, 0, ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * (1 << k))
    for k in range(_INSERT_MAX_LOG2 + 1)
)
# An item's event: its copy, else the event it refers to (in ``events``; its channel's path and epoch in
# ``channels``, or in ``retired_epochs`` after a reset).
_ITEM_COLS: Final = (
    "j.pos, j.attempts, j.not_before, coalesce(j.channel, c.path, r.path), "
    "coalesce(j.epoch, c.epoch, r.epoch), "
    + ", ".join(
        f"coalesce(j.{col}, e.{col})"
        for col in (
            "seq",
            "time_ns",
            "publisher_dialect",
            "publisher_user",
            "publisher_app",
            "publisher_msg_id",
            "content_type",
            "headers",
            "tags",
            "payload",
        )
    )
)
# An event's channel path and epoch: ``c`` or ``r``.
_EVENT_CHANNEL: Final = (
    "LEFT JOIN channels AS c ON c.id = e.channel_id LEFT JOIN retired_epochs AS r ON r.id = e.channel_id"
)
_ITEM_FROM: Final = f"journal AS j LEFT JOIN events AS e ON e.pos = j.ref {_EVENT_CHANNEL}"
# Before events are deleted (retention, trim, per-channel limits): a page of a consumer's unacknowledged
# items by reference, with their event's channel id and seq, and the copy of one item.
_REF_PAGE: Final = (
    "SELECT j.pos, j.ref, e.channel_id, e.seq FROM journal AS j JOIN events AS e ON e.pos = j.ref "
    "WHERE j.consumer_id = ? AND j.pos > ? AND j.ref IS NOT NULL ORDER BY j.pos LIMIT ?"
)
_REF_FIRST_PAGE: Final = 8
_REF_PAGE_SIZE: Final = 512
_COPY_ITEM: Final = (
    f"UPDATE journal SET (ref, {_JOURNAL_COPY}) = (SELECT NULL, coalesce(c.path, r.path), "
    "coalesce(c.epoch, r.epoch), e.seq, e.time_ns, e.publisher_dialect, e.publisher_user, e.publisher_app, "
    f"e.publisher_msg_id, e.content_type, e.headers, e.tags, e.payload FROM events AS e {_EVENT_CHANNEL} "
    "WHERE e.pos = journal.ref) WHERE consumer_id = ? AND pos = ?"
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
# then writes the ``consumers`` row's page, where deleting the rows rewrote every leaf page they were on.
# The rows at or below ``acked_to`` go in one range delete once _SWEEP positions have collected, in the
# settle that passes the mark; reads skip them meanwhile (and after a restart, until the next sweep).
_LIVE_BETWEEN: Final = "SELECT 1 FROM journal WHERE consumer_id = ? AND pos > ? AND pos < ? LIMIT 1"
_SWEEP_STMT: Final = "DELETE FROM journal WHERE consumer_id = ? AND pos <= ?"
_SWEEP: Final = 2048


class _FirstSeq(Protocol):
    """A channel's head as far as journaling reads it: its first seq still in the log."""

    first: int


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
    #: At most the lowest ``ref`` of the unacknowledged items by reference (0: not known). A new item refers
    #: to a new event, whose ``events.pos`` (SQLite's rowid: one more than the largest in the table) is above
    #: every ``ref`` of the log's events; but once the events with the highest positions are gone (copied
    #: where an item referred to them), a position may come round again, below this bound: ``_journal``
    #: then forgets every consumer's (see ``_ConsumerSide._max_ref``).
    low_ref: int = 0

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
        if ch is None:
            raise StorageError(f"journal item {pos} refers to an event that is not in the log")
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
    #: The highest ``events.pos`` any item has referred to (at the load: in the file), so at least every
    #: ``low_ref``: an append whose first new event is not above it reuses positions.
    _max_ref: int
    _heads: Mapping[str, _FirstSeq]
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
        self._max_ref = conn.execute(
            "SELECT max(coalesce((SELECT max(pos) FROM events), 0), "
            "coalesce((SELECT max(ref) FROM journal), 0))"
        ).fetchone()[0]

    def _journal(
        self, conn: sqlite3.Connection, results: list[AppendResult], last_ref: int, limited: bool
    ) -> None:
        """Journal each new event of an append for the consumers that match it (inside its transaction, after
        its events are inserted: ``last_ref`` is the last one's ``events.pos``, and the new events have the
        consecutive positions up to it, in order). ``limited``: per-channel limits may have trimmed some of
        them in this append already; those are journaled as copies."""
        match, crows = self._jindex.match, self._crows
        heads = self._heads if limited else None
        refs: dict[int, list[Any]] = {}  # consumer id -> _JREF_ROW values per item
        copies: list[Any] = []
        touched: dict[int, _Row] = {}
        # The previous event's channel and tags and, per consumer they matched, its row and refs: the events
        # of one burst share them, so they are matched once per burst, not per event.
        last_channel: str | None = None
        last_tags: tuple[str, ...] = ()
        last: list[tuple[_Row, list[Any]]] = []
        ref = last_ref - sum(1 for r in results if not r.duplicate)
        if ref < self._max_ref:
            for c in crows.values():
                c.low_ref = 0  # positions come round again (see _Row.low_ref)
        self._max_ref = max(self._max_ref, last_ref)
        for i, r in enumerate(results):
            if r.duplicate:
                continue
            ref += 1
            ev = r.event
            if ev.channel != last_channel or ev.tags != last_tags:
                last_channel, last_tags = ev.channel, ev.tags
                last = []
                for cid in match(ev.channel, ev.tags):
                    c = touched[cid] = crows[cid]
                    rows = refs.get(cid)
                    if rows is None:
                        rows = refs[cid] = []
                    last.append((c, rows))
            if not last:
                continue
            size = ev.size
            if heads is not None and ev.seq < heads[ev.channel].first:
                entries = []
                p = ev.publisher
                hb = encode_headers(ev.headers) if ev.headers else _EMPTY_BLOB
                tb = encode_tags(ev.tags) if ev.tags else _EMPTY_BLOB
                for c, _ in last:
                    c.top = top = c.top + 1
                    c.pending += 1
                    c.bytes += size
                    entries.append((c.id, top))
                    copies += (c.id, top, size, ev.channel, ev.epoch, ev.seq, ev.time_ns, p.dialect, p.user,
                               p.app, p.msg_id, ev.content_type, hb, tb, _blob(ev.payload))  # fmt: skip
                results[i] = AppendResult(ev, False, tuple(entries))
                continue
            if len(last) == 1:
                c, rows = last[0]
                c.top = top = c.top + 1
                c.pending += 1
                c.bytes += size
                rows += (top, size, ref)
                results[i] = AppendResult(ev, False, ((c.id, top),))
                continue
            entries = []
            for c, their in last:
                c.top = top = c.top + 1
                c.pending += 1
                c.bytes += size
                entries.append((c.id, top))
                their.extend((top, size, ref))
            results[i] = AppendResult(ev, False, tuple(entries))
        if not touched:
            return
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        for cid, rows in refs.items():
            if rows:
                _insert_chunks(
                    conn, _INSERT_JREF, _insert_log2(limit, 1, _JREF_ROW), 1, _JREF_ROW, [cid, *rows]
                )
        if copies:
            _insert_chunks(conn, _INSERT_COPY, _insert_log2(limit, 0, _JCOPY_ROW), 0, _JCOPY_ROW, copies)
        conn.executemany(
            _UPDATE_CONSUMER, [(c.top, c.pending, c.bytes, c.acked_to, c.id) for c in touched.values()]
        )

    def _copy_refs(self, conn: sqlite3.Connection, upto: int, channel: tuple[int, int] | None = None) -> None:
        """Before events are deleted (in the same transaction): give each unacknowledged item that refers to
        one of them its copy. The events: those at ``events.pos <= upto`` (retention's prefix of the log) or,
        with ``channel`` (channel id, cut), that channel id's events with ``seq < cut``, all at or below
        ``upto``. A consumer's items by reference refer to events in log order (their positions grow with
        their ``ref``), so its scan stops at the first beyond ``upto``; most consumers have none that low
        (``low_ref``) and cost nothing."""
        for c in self._crows.values():
            if not c.pending or upto < c.low_ref:
                continue
            after = c.acked_to
            size = _REF_FIRST_PAGE  # a consumer past the events (the usual case) needs its first item only
            while True:
                page = conn.execute(_REF_PAGE, (c.id, after, size)).fetchall()
                if size == _REF_FIRST_PAGE:
                    c.low_ref = page[0][1] if page else 0
                hits = []
                done = len(page) < size
                size = _REF_PAGE_SIZE
                for pos, ref, cid, seq in page:
                    if ref > upto:
                        done = True
                        break
                    if channel is None or (cid == channel[0] and seq < channel[1]):
                        hits.append((c.id, pos))
                if hits:
                    conn.executemany(_COPY_ITEM, hits)
                if done:
                    break
                after = page[-1][0]

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

    def consumer_delete(self, name: str, consumer_id: int | None = None) -> bool:
        found = [r for r in self._crows.values() if r.spec.name == name]
        if not found or (consumer_id is not None and found[0].id != consumer_id):
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
                # Positions not allocated yet (above ``top``) are unknown: passed over, never acknowledged
                # ahead of their items.
                ps = sorted({p for p in positions if c.acked_to < p <= c.top})
                if self._settle_acked(conn, c, ps):
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
                f"SELECT {_ITEM_COLS} FROM {_ITEM_FROM} WHERE j.consumer_id = ?1 "
                "AND j.pos > max(?2, (SELECT acked_to FROM consumers WHERE id = ?1)) ORDER BY j.pos LIMIT ?3",
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
