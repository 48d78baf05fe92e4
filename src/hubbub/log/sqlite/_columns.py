"""An exact channel's replay page read as columns: one SQLite statement per page, whatever its length.

The usual replay page (``read_runs``) is one run: rows of one publisher, content type, headers and tags,
and, at a bench's or a sensor's pace, payloads of one size. Stepping a cursor over its rows costs, per row,
the GIL released and taken again around ``sqlite3_step`` and a tuple with an ``int`` and a ``bytes`` built
by Python's ``sqlite3``, then a Python loop for the byte budget: more than SQLite's own work for the row.
Here SQLite does that work in one aggregate statement: it checks every row against the first (its filters)
and hands back two values for the whole page, the times as decimal text (parsed as a JSON array's body, in
C) and the payloads concatenated; :class:`~hubbub.run_columns.RunColumns` keeps them as columns.

A page is read so only when every row of it passes (SQLite counts them for us: the page's seqs are
consecutive, so as many rows as seqs means all): the head row's shape, the head row's payload size (the
rows' payloads are cut apart by it), and a time of at least ``2**32`` (the msgpack frame writes each time as
a ``uint 64``: the stamps are those bytes). Anything else (the caller's ``None``) is read row by row as
before, from the start of the page. A page of one channel's rows only (the usual single-channel log) is
read as a range of the table itself, without an index look-up per row.

The byte budget (``max_bytes``) ends a page with the row that brings its payloads to the budget; with one
size ``s`` that is the ``ceil(budget / s)``-th row, so the page's range is cut to it before it is read,
and what SQLite concatenates stays within the budget and one payload.

Exact by construction, checked by the tests (``tests/unit/test_sqlite_run_columns.py``) against the row
path over arbitrary payload bytes: ``group_concat`` appends each value's bytes as they are (NUL bytes
included; the store writes payloads as BLOBs only, and a database's text is UTF-8, so ``CAST(… AS BLOB)``
gives the bytes back unchanged), and writes an integer in decimal, as JSON reads it. Per 16 B event, about
4,000 instructions of SQLite where the cursor took 8,800 with Python's (cachegrind).
"""

from __future__ import annotations

import sqlite3
import struct
from typing import Any, Final

import orjson

from hubbub.log.read_plan import Row
from hubbub.run_columns import RunColumns

from ._schema import _TEXT_COLS

__all__ = ["COLUMN_PAYLOAD_MAX", "ColumnReads"]

#: The smallest time a column page holds (see the module docstring).
_WIDE_MIN: Final = 1 << 32
#: The largest payload a column page holds: past it the page is read row by row (each payload's own bytes
#: object, as before), since the copies a column page makes of each payload (SQLite's concatenation, Python's
#: bytes of it, and a slice of it per event for an encoder that needs them apart) grow with it while the
#: per-row steps they save do not. At 1 KiB the column page still takes about a quarter less CPU to read and
#: encode (in process, 200,000 events: 2.6-3.3 against 3.7-3.8 µs an event).
COLUMN_PAYLOAD_MAX: Final = 2048
_COLUMN_AGGREGATE: Final = (
    "SELECT CAST(group_concat(time_ns) AS BLOB), CAST(group_concat(payload, '') AS BLOB) FROM events WHERE "
)
# The shape as one row value: about 15 % fewer instructions than seven comparisons ANDed (cachegrind).
_SHAPE_COLS: Final = ", ".join((*_TEXT_COLS, "headers", "tags"))
_COLUMN_FILTERS: Final = f"({_SHAPE_COLS}) = (?4, ?5, ?6, ?7, ?8, ?9, ?10) AND length(payload) = ?11"
# The page's rows by the ``(channel_id, seq)`` index, in its order: seq order.
_BY_SEQ: Final = _COLUMN_AGGREGATE + "channel_id = ?1 AND seq BETWEEN ?2 AND ?3 AND " + _COLUMN_FILTERS
# The page's rows as a range of the table itself, in ``pos`` order (seq order within a channel), when they
# are all of that range: no index look-up per row. The unary ``+`` keeps the planner off the index.
_BY_POS: Final = _COLUMN_AGGREGATE + "pos BETWEEN ?2 AND ?3 AND +channel_id = ?1 AND " + _COLUMN_FILTERS
_POS: Final = "SELECT pos FROM events WHERE channel_id = ? AND seq = ?"


#: Pages of a channel read row by row without trying columns after a page that did not qualify (doubling
#: from 1 with each further miss, up to this): a replay of a channel whose rows seldom qualify (a msg id or
#: a payload size per event) spends an aggregate on a few of its pages only, not on each.
_SKIP_MAX: Final = 64


class ColumnReads:
    """:func:`ColumnReads.rows` for a store's reader threads, and the pages they pass over after a miss.

    Concurrency contract: any reader thread, each with its own connection; what is shared is the miss
    count per channel id (a dict's single steps are atomic, and a lost update only moves when columns are
    tried next, never what a page holds)."""

    __slots__ = ("_skip",)

    def __init__(self) -> None:
        # channel id -> (pages still to pass over, the pass after the next miss)
        self._skip: dict[int, tuple[int, int]] = {}

    def rows(
        self, conn: sqlite3.Connection, cid: int, lo: int, hi: int, head: Row, cut: int | None
    ) -> RunColumns | None:
        """The rows ``lo..hi`` of channel ``cid`` as one run of :class:`RunColumns` (``head``: row ``lo``,
        read whole), ended at ``cut`` payload bytes as ``take_upto`` ends it (``cut`` at least 1); ``None``
        when a row of the range does not qualify (see the module docstring), or when the channel's last
        pages did not, and the page is to be read row by row."""
        payload: Any = head[9]
        if type(payload) is not bytes:
            return None
        size = len(payload)
        if size > COLUMN_PAYLOAD_MAX or head[1] < _WIDE_MIN:
            return None
        skip = self._skip.get(cid)
        if skip is not None and skip[0] > 0:
            self._skip[cid] = (skip[0] - 1, skip[1])
            return None
        got = _read(conn, cid, lo, hi, head, size, cut)
        if got is None:
            after = 1 if skip is None else skip[1]
            self._skip[cid] = (after, min(after * 2, _SKIP_MAX))
            if len(self._skip) > _SKIPS_KEPT:
                self._skip.clear()
        elif skip is not None:
            self._skip.pop(cid, None)
        return got


#: Channels whose misses a store keeps (forgotten all at once past it).
_SKIPS_KEPT: Final = 4096


def _read(
    conn: sqlite3.Connection, cid: int, lo: int, hi: int, head: Row, size: int, cut: int | None
) -> RunColumns | None:
    """:meth:`ColumnReads.rows` once the head row qualifies: the one aggregate statement."""
    if cut is not None and size:
        hi = min(hi, lo + -(-cut // size) - 1)
    n = hi - lo + 1
    sql, a, b = _BY_SEQ, lo, hi
    if n > 1:
        # seq and pos grow together within a channel's epoch, so when the page's first and last rows are
        # n - 1 apart in pos, its n rows are all the rows of that pos range.
        first, last = conn.execute(_POS, (cid, lo)).fetchone(), conn.execute(_POS, (cid, hi)).fetchone()
        if first is not None and last is not None and last[0] - first[0] == hi - lo:
            sql, a, b = _BY_POS, first[0], last[0]
    try:
        times, payloads = conn.execute(sql, (cid, a, b, *head[2:9], size)).fetchone()
    except sqlite3.DataError:  # SQLITE_TOOBIG: a page past SQLite's string limit (no byte budget)
        return None
    if times is None or payloads is None or len(payloads) != n * size:
        return None
    # The times as SQLite writes integers (decimal, comma separated): a JSON array's body, parsed in C.
    stamps = orjson.loads(b"[%b]" % times)
    if len(stamps) != n or min(stamps) < _WIDE_MIN:
        return None
    return RunColumns(struct.pack(f">{n}q", *stamps), payloads, size, wide=True)
