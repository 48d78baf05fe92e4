"""How :meth:`SqliteLogStore.append` writes ``events`` rows: multi-row ``INSERT`` statements of full rows
and of run rows (the events of a run bind their shared columns once; a run of events whose headers differ,
all but the headers), and of a stretch's rows (:func:`stretch_end`, :func:`insert_stretch`: consecutive
events of one channel and publisher without headers or tags, which bind their payload only)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from hubbub.log.base import AppendRequest

_INSERT_EVENTS_HEAD: Final = (
    "INSERT INTO events (channel_id, seq, time_ns, size, publisher_dialect, publisher_user, publisher_app, "
    "publisher_msg_id, content_type, headers, tags, payload) VALUES "
)
# append inserts events with multi-row ``VALUES`` statements of 2**k rows each (k up to _INSERT_MAX_LOG2,
# less where SQLite allows fewer parameters). One statement runs in one sqlite3_step, for which sqlite3
# releases the GIL once, where ``executemany`` releases and re-takes it for every row (each time waiting for
# the event loop thread to let go of it), and saves the per-row statement reset and call overhead. A handful
# of sizes keeps the prepared statements cached.
#
# The events of a *run* (consecutive events of one batch with equal publisher dialect, user and app, content
# type, headers and tags: one connection's burst) share most columns, which a run statement binds once as
# ?1-?7 (_RUN_SHARED: dialect, user, app, content type, encoded headers, encoded tags, and the bytes headers
# and tags add to ``size``), and per row only _RUN_ROW parameters (channel_id, seq, time_ns,
# publisher_msg_id, payload). Measured on the 2-core dev machine, SQLite and binding CPU per row: 3.3-3.7 µs
# with ``executemany``, 2.5 µs with 12-parameter rows, 1.2-1.4 µs with run rows. Runs shorter than
# _MIN_RUN (where a statement per run would cost more than it saves) use the 12-parameter rows.
_INSERT_MAX_LOG2: Final = 8
_FULL_ROW: Final = 12
_RUN_SHARED: Final = 7
_RUN_ROW: Final = 5
_MIN_RUN: Final = 8
_INSERT_FULL: Final = tuple(
    _INSERT_EVENTS_HEAD + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * (1 << k))
    for k in range(_INSERT_MAX_LOG2 + 1)
)
_INSERT_RUN: Final = tuple(
    _INSERT_EVENTS_HEAD
    + ", ".join(
        f"(?{b + 1}, ?{b + 2}, ?{b + 3}, length(?{b + 5}) + ?7, ?1, ?2, ?3, ?{b + 4}, ?4, ?5, ?6, ?{b + 5})"
        for b in range(_RUN_SHARED, _RUN_SHARED + (_RUN_ROW << k), _RUN_ROW)
    )
    for k in range(_INSERT_MAX_LOG2 + 1)
)


# A run whose events differ in their headers too (the data pipeline's sink sets a header per event: its source
# position) binds the shared columns but the headers once (_RUNH_SHARED: dialect, user, app, content type,
# encoded tags) and per row _RUNH_ROW parameters (channel_id, seq, time_ns, publisher_msg_id, encoded
# headers, size, payload): 7 instead of the 12 of a full row, which measured 6.5 µs of SQLite and binding
# CPU per sink row against 3.7 µs (bench/RESULTS.md, pipeline section).
_RUNH_SHARED: Final = 5
_RUNH_ROW: Final = 7
_INSERT_RUNH: Final = tuple(
    _INSERT_EVENTS_HEAD
    + ", ".join(
        f"(?{b + 1}, ?{b + 2}, ?{b + 3}, ?{b + 6}, ?1, ?2, ?3, ?{b + 4}, ?4, ?{b + 5}, ?5, ?{b + 7})"
        for b in range(_RUNH_SHARED, _RUNH_SHARED + (_RUNH_ROW << k), _RUNH_ROW)
    )
    for k in range(_INSERT_MAX_LOG2 + 1)
)


# Binding a ``bytes`` parameter costs Python's sqlite3 (3.11) about 0.35 µs more than a ``bytearray``: only
# int, float, str and bytearray skip its adaptation step (a key tuple, a dict look-up and two failed attribute
# look-ups, one of which formats an AttributeError). Payloads up to _COPY_MAX bytes are therefore bound as a
# bytearray copy (0.1 µs for 100 bytes; larger ones would cost more to copy than the adaptation), and empty
# header and tag columns as _EMPTY_BLOB. Both are stored as the same BLOB as the bytes they copy.
_COPY_MAX: Final = 2048
_EMPTY_BLOB: Final = bytearray()


def _blob(data: bytes) -> bytes | bytearray:
    """``data`` as the cheaper parameter to bind (see _COPY_MAX)."""
    if not data:
        return _EMPTY_BLOB
    return bytearray(data) if len(data) <= _COPY_MAX else data


def _insert_log2(limit: int, shared: int, per_row: int) -> int:
    """The largest ``k <= _INSERT_MAX_LOG2`` whose 2**k-row statement stays within the parameter limit."""
    k = _INSERT_MAX_LOG2
    while k and shared + (per_row << k) > limit:
        k -= 1
    return k


def _insert_chunks(
    conn: sqlite3.Connection,
    stmts: tuple[str, ...],
    max_log2: int,
    shared: int,
    per_row: int,
    params: list[Any],
) -> None:
    """Insert the rows of ``params`` (``shared`` parameters for every statement, then ``per_row`` per row)
    with ``stmts[k]`` (2**k rows each, ``k <= max_log2``), the largest first."""
    n = len(params)
    rows = (n - shared) // per_row
    start = shared
    while rows:
        k = min(rows.bit_length() - 1, max_log2)
        end = start + (per_row << k)
        if start == shared and end == n:
            conn.execute(stmts[k], params)
        else:
            conn.execute(stmts[k], params[:shared] + params[start:end])
        start = end
        rows -= 1 << k


def _run_rows(full: list[Any], start: int) -> list[Any]:
    """The _RUN_ROW parameters of the 12-parameter rows of ``full`` from index ``start`` on."""
    out: list[Any] = []
    for i in range(start, len(full), _FULL_ROW):
        out += (full[i], full[i + 1], full[i + 2], full[i + 7], full[i + 11])
    return out


def _runh_rows(full: list[Any], start: int) -> list[Any]:
    """The _RUNH_ROW parameters of the 12-parameter rows of ``full`` from index ``start`` on."""
    out: list[Any] = []
    for i in range(start, len(full), _FULL_ROW):
        out += (full[i], full[i + 1], full[i + 2], full[i + 7], full[i + 9], full[i + 3], full[i + 11])
    return out


def _insert_events(
    conn: sqlite3.Connection, segments: list[tuple[list[Any], list[Any], bool]], full: list[Any], limit: int
) -> None:
    """Insert ``events`` rows, in order: per segment its 12-parameter rows (``_INSERT_FULL``), then its run:
    ``_INSERT_RUN`` (the _RUN_SHARED values of the run's events, then _RUN_ROW per event), or, for a run
    whose flag says its headers vary, ``_INSERT_RUNH`` (_RUNH_SHARED, then _RUNH_ROW per event); then
    ``full``'s 12-parameter rows. ``limit``: SQLite's maximum number of parameters in one statement."""
    run_log2 = _insert_log2(limit, _RUN_SHARED, _RUN_ROW)
    runh_log2 = _insert_log2(limit, _RUNH_SHARED, _RUNH_ROW)
    full_log2 = _insert_log2(limit, 0, _FULL_ROW)
    for rows, run, row_headers in segments:
        _insert_chunks(conn, _INSERT_FULL, full_log2, 0, _FULL_ROW, rows)
        if row_headers:
            _insert_chunks(conn, _INSERT_RUNH, runh_log2, _RUNH_SHARED, _RUNH_ROW, run)
        else:
            _insert_chunks(conn, _INSERT_RUN, run_log2, _RUN_SHARED, _RUN_ROW, run)
    _insert_chunks(conn, _INSERT_FULL, full_log2, 0, _FULL_ROW, full)


# A *stretch* (one connection's burst: consecutive events of one channel, one ``Publisher`` object and one
# content type, no headers, no tags, no duplicate) has consecutive seqs and times, so its statement binds the
# channel id, first seq and first time, publisher and content type once (_SEQ_SHARED: ?1-?8) and per row the
# payload only; the row's seq and time are ?2 and ?3 plus its place, its size the payload's length. Against
# run rows (_RUN_ROW parameters and a tuple per row, and the per-row run checks of ``_mixed_rows``) that
# saves about 0.5 µs of CPU per event of append, a sixth (bench/RESULTS.md, "Persistent publishing: the SQLite
# append's stretches"). Stretches shorter than _MIN_STRETCH go through the runs (a statement per stretch
# would cost more than it saves).
_SEQ_SHARED: Final = 8
_MIN_STRETCH: Final = 8
_INSERT_SEQ: Final = tuple(
    _INSERT_EVENTS_HEAD
    + ", ".join(
        f"(?1, ?2 + {j}, ?3 + {j}, length(?{_SEQ_SHARED + 1 + j}), ?4, ?5, ?6, ?7, ?8, X'', X'', "
        f"?{_SEQ_SHARED + 1 + j})"
        for j in range(1 << k)
    )
    for k in range(_INSERT_MAX_LOG2 + 1)
)


def stretch_end(batch: Sequence[AppendRequest], seqs: Sequence[int], start: int, hi: int) -> int:
    """The end (exclusive, at most ``hi``) of the stretch of ``batch`` that starts at ``start``: the
    requests after it of the same channel, ``Publisher`` object and content type, none with headers or tags
    or a duplicate (seq 0 in ``seqs``), so that their seqs and times follow each other. ``start + 1`` when
    ``batch[start]`` cannot begin one."""
    first = batch[start]
    if first.headers or first.tags or not seqs[start]:
        return start + 1
    channel, pub, ctype = first.channel, first.publisher, first.content_type
    end, n = start + 1, hi
    while end < n:
        req = batch[end]
        if (
            req.publisher is not pub
            or req.channel != channel
            or req.content_type != ctype
            or req.headers
            or req.tags
            or not seqs[end]
        ):
            break
        end += 1
    return end


def stretch_start(batch: Sequence[AppendRequest], seqs: Sequence[int], at: int, lo: int) -> int:
    """The first request (at or after ``lo``) of the stretch of ``batch`` that holds ``at``
    (:func:`stretch_end`); ``at`` when ``batch[at]`` cannot be in one."""
    first = batch[at]
    if first.headers or first.tags or not seqs[at]:
        return at
    channel, pub, ctype = first.channel, first.publisher, first.content_type
    start = at
    while start > lo:
        req = batch[start - 1]
        if (
            req.publisher is not pub
            or req.channel != channel
            or req.content_type != ctype
            or req.headers
            or req.tags
            or not seqs[start - 1]
        ):
            break
        start -= 1
    return start


def insert_stretch(
    conn: sqlite3.Connection, shared: list[Any], blobs: list[bytes | bytearray], limit: int
) -> None:
    """Insert a stretch's rows: ``shared`` its _SEQ_SHARED values (channel id, first seq, first time,
    dialect, user, app, msg_id, content type), ``blobs`` its payloads as bound (:func:`_blob`), in order.
    ``limit``: SQLite's maximum number of parameters in one statement."""
    max_log2 = _insert_log2(limit, _SEQ_SHARED, 1)
    cid, seq, t = shared[0], shared[1], shared[2]
    rest = shared[3:]
    i, n = 0, len(blobs)
    while i < n:
        k = min((n - i).bit_length() - 1, max_log2)
        end = i + (1 << k)
        conn.execute(_INSERT_SEQ[k], [cid, seq + i, t + i, *rest, *blobs[i:end]])
        i = end
