"""How :meth:`SqliteLogStore.append` turns its plan into ``events`` rows and results (:func:`write_rows`),
and the writer's cache of a channel's head (:class:`_Head`), which the rows move.

A batch is cut into *stretches* (``_inserts.stretch_end``: one connection's burst to one channel, whose rows
bind their payload only) and what lies between them, whose rows go through the runs of :func:`_mixed_rows`
(``_inserts._insert_events``). Each part is inserted before the next one is built, so the rows' ``pos``
order is the batch's order (commit order, which is time order). Writer thread only (or the loop, for an
inline append), inside the append's transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgpack

from hubbub.events import Event, Publisher
from hubbub.log.appended import Committed, run_results
from hubbub.log.base import AppendRequest, AppendResult, AppendRun, ChannelInfo
from hubbub.log.records import event_columns
from hubbub.log.sequencing import FROM_RECORD, AppendPlan
from hubbub.log.sqlite._inserts import (
    _COPY_MAX,
    _EMPTY_BLOB,
    _MIN_RUN,
    _MIN_STRETCH,
    _blob,
    _insert_events,
    _run_rows,
    _runh_rows,
    insert_stretch,
    stretch_end,
    stretch_start,
)

__all__ = ["_Head", "write_rows"]

#: The event a duplicate request of a key on record stands for: ``(channel, request) -> event``.
Original = Callable[[str, AppendRequest], Event]


@dataclass(slots=True)
class _Head:
    """The writer's cached copy of one ``channels`` row."""

    id: int
    epoch: str
    first: int
    top: int
    top_time: int
    count: int
    bytes: int

    def row(self) -> tuple[int, int, int, int, int, int]:
        return (self.first, self.top, self.top_time, self.count, self.bytes, self.id)

    def info(self, channel: str) -> ChannelInfo:
        return ChannelInfo(channel, self.epoch, self.first, self.top, self.top_time)


def write_rows(
    conn: sqlite3.Connection,
    batch: Sequence[AppendRequest | AppendRun],
    plan: AppendPlan,
    heads: MutableMapping[str, _Head],
    packer: msgpack.Packer,
    original: Original,
    limit: int,
    as_runs: bool = False,
) -> tuple[list[Committed], list[_Head]]:
    """Execute ``plan``: insert its ``events`` rows, move the heads of the cache, and return the results
    (one per event: a run's one per event of it, or, ``as_runs``, one ``RunAppended`` in each of its places)
    and the heads of the batch's channels. ``original``: a duplicate's original on record. ``limit``:
    SQLite's maximum number of parameters in one statement."""
    results: list[Committed] = []
    # The duplicates' sources, in request order (``dups`` is), taken as their requests come.
    sources = iter(plan.dups.values())
    lo = 0
    # The runs (``plan.spans``, in batch order) are stretches as they come; the requests between them are
    # cut into stretches and mixed rows.
    for at in plan.spans:
        if lo < at:
            _request_rows(conn, batch, plan, lo, at, heads, packer, results, sources, original, limit)
        run = batch[at]
        assert type(run) is AppendRun
        _append_run_rows(conn, run, plan.seqs[at], plan.times[at], heads, results, limit, as_runs)
        lo = at + 1
    if lo < len(batch):
        _request_rows(conn, batch, plan, lo, len(batch), heads, packer, results, sources, original, limit)
    return results, [heads[name] for name in plan.tops]


def _request_rows(
    conn: sqlite3.Connection,
    batch: Sequence[AppendRequest | AppendRun],
    plan: AppendPlan,
    lo: int,
    hi: int,
    heads: MutableMapping[str, _Head],
    packer: msgpack.Packer,
    results: list[Committed],
    sources: Iterator[int],
    original: Original,
    limit: int,
) -> None:
    """The rows and results of ``batch[lo:hi]``, requests only: its stretches, and the rest as mixed rows."""
    reqs = cast("Sequence[AppendRequest]", batch)
    seqs = plan.seqs
    # Stretches of at least 2 * _MIN_STRETCH - 1 requests hold two of every _MIN_STRETCH-th request, so only
    # those are looked at (a batch of many short runs costs a look per _MIN_STRETCH requests, not one each):
    # a stretch is looked for around ``i`` when it and the sample _MIN_STRETCH later share a publisher
    # object and channel. Shorter stretches may be missed; their rows go through the runs.
    i = mixed = lo  # the next sample; the first request not written yet
    while i + _MIN_STRETCH < hi:
        req, ahead = reqs[i], reqs[i + _MIN_STRETCH]
        if ahead.publisher is not req.publisher or ahead.channel != req.channel:
            i += _MIN_STRETCH
            continue
        start, end = stretch_start(reqs, seqs, i, mixed), stretch_end(reqs, seqs, i, hi)
        if end - start >= _MIN_STRETCH:
            if mixed < start:
                _mixed_rows(conn, reqs, plan, mixed, start, heads, packer, results, sources, original, limit)
            _stretch_rows(conn, reqs, plan, start, end, heads, results, limit)
            mixed = end
        i = max(end, i + 1)
    if mixed < hi:
        _mixed_rows(conn, reqs, plan, mixed, hi, heads, packer, results, sources, original, limit)


def _append_run_rows(
    conn: sqlite3.Connection,
    run: AppendRun,
    seq0: int,
    t0: int,
    heads: MutableMapping[str, _Head],
    results: list[Committed],
    limit: int,
    as_runs: bool,
) -> None:
    """The rows and results of a run, from its first event's seq ``seq0`` and time ``t0``: a stretch
    (:func:`_stretch_rows`) built from the run's payloads in comprehensions, without a request per event;
    ``as_runs``: its results as one ``RunAppended``."""
    name, pub, ctype = run.channel, run.publisher, run.content_type
    h = heads[name]
    epoch = h.epoch
    payloads = run.payloads
    n = len(payloads)
    results += run_results(Event(name, seq0, epoch, t0, pub, payloads[0], ctype, {}, ()), payloads, as_runs)
    insert_stretch(
        conn,
        [h.id, seq0, t0, pub.dialect, pub.user, pub.app, pub.msg_id, ctype],
        [bytearray(p) if len(p) <= _COPY_MAX else p for p in payloads],
        limit,
    )
    h.top = seq0 + n - 1
    h.top_time = t0 + n - 1
    h.count += n
    h.bytes += sum(map(len, payloads))


def _stretch_rows(
    conn: sqlite3.Connection,
    batch: Sequence[AppendRequest],
    plan: AppendPlan,
    lo: int,
    hi: int,
    heads: MutableMapping[str, _Head],
    results: list[Committed],
    limit: int,
) -> None:
    """The rows and results of the stretch ``batch[lo:hi]`` (``stretch_end``): consecutive seqs and times
    from the first's."""
    first = batch[lo]
    name, pub, ctype = first.channel, first.publisher, first.content_type
    h = heads[name]
    seq0, t0 = plan.seqs[lo], plan.times[lo]
    epoch = h.epoch
    blobs: list[bytes | bytearray] = []
    add_blob = blobs.append
    add_result = results.append
    size = 0
    seq, t = seq0, t0
    # Plain loop with locals: per event, and core may run it on the event loop (``inline_append_max``).
    for req in batch[lo:hi] if lo or hi != len(batch) else batch:
        payload = req.payload
        k = len(payload)
        size += k
        add_blob(bytearray(payload) if k <= _COPY_MAX else payload)
        add_result(AppendResult(Event(name, seq, epoch, t, pub, payload, ctype, {}, ())))
        seq += 1
        t += 1
    insert_stretch(conn, [h.id, seq0, t0, pub.dialect, pub.user, pub.app, pub.msg_id, ctype], blobs, limit)
    h.top = seq - 1
    h.top_time = t - 1
    h.count += hi - lo
    h.bytes += size


def _mixed_rows(
    conn: sqlite3.Connection,
    batch: Sequence[AppendRequest],
    plan: AppendPlan,
    lo: int,
    hi: int,
    heads: MutableMapping[str, _Head],
    packer: msgpack.Packer,
    results: list[Committed],
    sources: Iterator[int],
    original: Original,
    limit: int,
) -> None:
    """The rows and results of ``batch[lo:hi]``, any requests, duplicates included (their sources next in
    ``sources``)."""
    # The ``events`` rows (see _insert_events): ``segments`` of 12-parameter rows each followed by a long
    # run's rows, then ``full``. The current run is of ``r_pub`` (or a publisher equal to it but for
    # msg_id), ``r_ctype``, ``r_hb`` and ``r_tb``; it has ``r_n`` events. Its first _MIN_RUN - 1 rows go
    # to ``full`` from index ``r_start``; at _MIN_RUN they move to a new ``run``. With ``r_varied`` the
    # run's events differ in their headers (``r_hb`` is its first event's): such a run binds its headers
    # per row (``_INSERT_RUNH``), its segment's flag says.
    segments: list[tuple[list[Any], list[Any], bool]] = []
    full: list[Any] = []
    run: list[Any] | None = None
    r_pub: Publisher | None = None
    r_ctype: str | None = None
    r_hb: bytes | bytearray = b""
    r_tb: bytes | bytearray = b""
    r_varied = False
    r_n = r_start = 0
    add_result = results.append
    # The previous request's channel and head: a batch is mostly runs of one channel's publishes.
    name: str | None = None
    h: _Head | None = None
    seqs, times = plan.seqs, plan.times
    if lo or hi != len(batch):
        batch, seqs, times = batch[lo:hi], seqs[lo:hi], times[lo:hi]
    for req, seq, t in zip(batch, seqs, times, strict=True):
        if req.channel != name or h is None:
            name = req.channel
            h = heads[name]
        pub = req.publisher
        if not seq:
            src = next(sources)
            # (A duplicate's source is a request with a key: never a run, answered as one or not.)
            dup = original(name, req) if src == FROM_RECORD else results[plan.result_index(src)].event  # type: ignore[union-attr]
            add_result(AppendResult(dup, duplicate=True))
            continue
        h.top = seq
        h.top_time = t
        h.count += 1
        payload = req.payload
        headers = req.headers
        tags = req.tags
        hb: bytes | bytearray
        tb: bytes | bytearray
        if headers or tags:
            size, hb, tb = event_columns(payload, headers, tags, packer)
            headers = dict(headers)
            tags = tuple(tags)
        else:
            size = len(payload)
            hb = tb = _EMPTY_BLOB
            headers = {}
        h.bytes += size
        bp = _blob(payload)
        ctype = req.content_type
        # A new run: another publisher but for msg_id (a sink's rows each have a Publisher), content type
        # or tags.
        fresh = (
            (
                pub is not r_pub
                and (
                    r_pub is None
                    or pub.user != r_pub.user
                    or pub.app != r_pub.app
                    or pub.dialect != r_pub.dialect
                )
            )
            or ctype != r_ctype
            or tb != r_tb
        )
        if not fresh and hb != r_hb and not r_varied:
            # Headers differ within the run: before it became one, it becomes a run of per-row headers; a
            # run that binds its headers once ends here.
            if run is None:
                r_varied = True
            else:
                fresh = True
        if fresh:
            r_pub, r_ctype, r_hb, r_tb, r_varied = pub, ctype, hb, tb, False
            r_n, r_start, run = 0, len(full), None
        r_n += 1
        if run is not None:
            if r_varied:
                run += (h.id, seq, t, pub.msg_id, hb, size, bp)
            else:
                run += (h.id, seq, t, pub.msg_id, bp)
        elif r_n < _MIN_RUN:
            full += (h.id, seq, t, size, pub.dialect, pub.user, pub.app, pub.msg_id, ctype, hb, tb, bp)
        elif r_varied:
            run = [pub.dialect, pub.user, pub.app, ctype, tb]
            run += _runh_rows(full, r_start)
            del full[r_start:]
            run += (h.id, seq, t, pub.msg_id, hb, size, bp)
            segments.append((full, run, True))
            full = []
        else:
            run = [pub.dialect, pub.user, pub.app, ctype, hb, tb, size - len(payload)]
            run += _run_rows(full, r_start)
            del full[r_start:]
            run += (h.id, seq, t, pub.msg_id, bp)
            segments.append((full, run, False))
            full = []
        add_result(AppendResult(Event(name, seq, h.epoch, t, pub, payload, ctype, headers, tags)))
    _insert_events(conn, segments, full, limit)
