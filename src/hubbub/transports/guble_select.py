"""The guble fetch selection as a replay plan (guble.md §5, §6), run on a reader thread through the node's
``planner`` hook: where a fetch or a catch-up starts, and the count its ``#fetch-start`` announces, read from
the log's rows where nothing can leave an event out (:func:`plan_fetch`).

Concurrency contract: every function here runs on a node's reader thread, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hubbub.core import ReplayPlan
from hubbub.core.replay import ReplayScan, count_scan, last_start, pattern_prefix
from hubbub.dialects import guble as gc
from hubbub.events import Event
from hubbub.log.base import EventLog

__all__ = ["FETCH_PAGE", "FETCH_PAGE_BYTES", "fetch_count", "plan_fetch", "subtree_pattern"]

subtree_pattern = gc.subtree_pattern


#: Events per read of the fetched channel while its start is looked for (``+ <path> <startId>``).
FETCH_PAGE = 1000
#: Payload bytes per such read (``read_runs(max_bytes=...)``): 1000 events of 1 MiB would be 1 GiB held on
#: a reader thread to find one commit time.
FETCH_PAGE_BYTES = 4 << 20
#: No upper seq: the lookup reads the channel's current epoch to its end (or the first event past the mark).
_MAX_SEQ = (1 << 63) - 1


def plan_fetch(
    store: EventLog,
    channel: str,
    start_id: int | None,
    max_count: int | None,
    keep: Callable[[Event], bool],
    from_time: int | None = None,
    empty: bool = False,
    keep_all: bool = False,
) -> ReplayPlan:
    """The guble fetch selection over Subtree(channel) (guble.md §5), or with ``from_time`` a catch-up (every
    event from that time), as a replay plan (on a reader thread): a scan of the log in commit order (which is
    guble's merged order, commit times being unique) up to one mark, from the selection's first event,
    counted first (``#fetch-start`` announces the exact count) and read page by page as it is sent, so a
    fetch of any length holds a page or two in memory. ``empty``: a selection of no event (a catch-up
    receiver inside another one's subtree). ``keep_all``: ``keep`` accepts every event without headers
    (the identity reads the whole subtree); then the count comes from the log's rows
    (:func:`_count_rows`) and the events are read once, as they are sent, unless one of them carries
    headers (delivery filters) or the node's replays are capped (a cluster node): those are counted by
    reading them (:func:`count_scan`)."""
    plan = ReplayPlan(replayed=True)
    pattern = gc.subtree_pattern(channel)
    mark = store.log_mark()
    plan.top_time = mark.time_ns
    limit = max_count if max_count and (start_id is None or start_id >= 0) else None
    start: int | None
    if empty:
        return plan
    if from_time is not None or not start_id:
        start = from_time or 0
    elif start_id > 0:
        start = _first_from(store, channel, start_id, mark.time_ns, keep)
    else:
        start = last_start(store, pattern, mark, max_count or -start_id, keep)
    if start is None or start > mark.time_ns:
        return plan
    scan = ReplayScan(pattern_prefix(pattern), store.log_seek(start), mark, {}, frozenset(), start)
    counted = _count_rows(store, channel, scan, limit) if keep_all else None
    scan = counted if counted is not None else count_scan(store, pattern, scan, keep, limit)
    if scan.limit:
        plan.scan = scan
    return plan


def _count_rows(store: EventLog, channel: str, scan: ReplayScan, limit: int | None) -> ReplayScan | None:
    """``scan`` counted from the log's rows (:meth:`EventLog.count_log`: the subtree is the channel and the
    channels under ``channel/``) without reading its events, when nothing can leave one out: none carries
    headers, and the store gives every replayed event back (not a cluster node's view, whose replay leaves
    events not delivered here yet to the live stream). None otherwise. The send then finds exactly this
    many events, or closes the connection as for a counted scan (:func:`send_scan`)."""
    if type(store).delivered is not EventLog.delivered:
        return None
    t = scan.from_time or 0
    if channel == "/":
        total, marked = store.count_log(scan.after, scan.mark, from_time=t)
    else:
        total, marked = store.count_log(scan.after, scan.mark, channel + "/", from_time=t)
        own, own_marked = store.count_log(scan.after, scan.mark, from_time=t, channel=channel)
        total, marked = total + own, marked + own_marked
    if marked:
        return None
    return replace(scan, limit=total if limit is None else min(total, limit), caps={})


def _first_from(
    store: EventLog, channel: str, start_id: int, mark_ns: int, keep: Callable[[Event], bool]
) -> int | None:
    """The commit time of the first event of ``channel`` itself with ``seq >= start_id`` that ``keep``
    accepts, at or before the mark (guble.md §5: the selection starts there on every channel)."""
    after = start_id - 1
    while True:
        runs = store.read_runs(channel, after, _MAX_SEQ, FETCH_PAGE, max_bytes=FETCH_PAGE_BYTES)
        if not runs:
            return None
        for run in runs:
            for e in run.events():
                if e.time_ns > mark_ns:
                    return None
                if keep(e):
                    return e.time_ns
        after = runs[-1].last_seq


def fetch_count(plan: ReplayPlan) -> int:
    """The number of events a fetch's plan sends (its ``#fetch-start`` count)."""
    return plan.scan.limit or 0 if plan.scan is not None else 0
