"""Each replay selection (``hubbub/selection.py``) turned into a plan over the log.

Pure functions over a :class:`EventLog`, run on a reader thread by the node (:func:`plan_selection`); they
never touch sessions. Native's selection is :func:`~hubbub.core.replay.plan_replay`; the others are here:
guble's counted subtree fetch (:func:`plan_fetch`), a federation link's cursor resume (:func:`plan_cursor`)
and a resume after one event in the merged order (SSE's ``Last-Event-ID``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from hubbub.channels import Pattern
from hubbub.events import Event, Position
from hubbub.log.base import ChannelInfo, EventLog
from hubbub.selection import CursorResume, EventResume, LiveOnly, ReplaySpec, Selection, SubtreeFetch

from .replay import (
    Gap,
    ReplayPlan,
    ReplayScan,
    ReplaySpan,
    count_scan,
    last_start,
    pattern_prefix,
    plan_replay,
    plan_scan,
)

__all__ = ["FETCH_PAGE", "FETCH_PAGE_BYTES", "Keep", "plan_cursor", "plan_fetch", "plan_selection"]

#: Whether a fetch selects an event: the connection may read it and passes its delivery filters.
Keep = Callable[[Event], bool]

#: Events per read of the fetched channel while its start is looked for (guble's ``+ <path> <startId>``).
FETCH_PAGE = 1000
#: Payload bytes per such read (``read_runs(max_bytes=...)``): 1000 events of 1 MiB would be 1 GiB held on
#: a reader thread to find one commit time.
FETCH_PAGE_BYTES = 4 << 20
#: No upper seq: the lookup reads the channel's current epoch to its end (or the first event past the mark).
_MAX_SEQ = (1 << 63) - 1


def plan_selection(
    store: EventLog, pattern: Pattern, selection: Selection, keep: Keep | None = None, keep_all: bool = False
) -> ReplayPlan:
    """The snapshot and replay plan of ``selection`` for a subscription (or a fetch) of ``pattern``, on a
    reader thread. ``keep`` is the fetching connection's filter (:class:`SubtreeFetch` only); ``keep_all``:
    it accepts every event without headers (the connection reads the whole pattern)."""
    if isinstance(selection, ReplaySpec):
        return plan_replay(store, pattern, selection)
    if isinstance(selection, LiveOnly):
        return ReplayPlan()
    if isinstance(selection, SubtreeFetch):
        assert keep is not None, "a fetch is planned with its connection's filter"
        return plan_fetch(store, pattern, selection, keep, keep_all)
    if isinstance(selection, CursorResume):
        return plan_cursor(store, pattern, selection.since, selection.from_time)
    return _plan_event_resume(store, pattern, selection)


def _plan_event_resume(store: EventLog, pattern: Pattern, resume: EventResume) -> ReplayPlan:
    """After one event in the merged order: its channel after its position, the others from the next time
    (event times are unique across the log). The other channels' trimmed gaps are found while the replay
    reads them (``trim_gaps``), so the resume costs what it replays, not a read of every channel the pattern
    matches."""
    ch, t = resume.channel, resume.time_ns
    plan = plan_replay(store, pattern, ReplaySpec(since={ch: resume.position}, from_time=t + 1))
    if plan.scan is not None:
        plan.scan = replace(plan.scan, trim_gaps=True)
    return plan


def plan_fetch(
    store: EventLog, pattern: Pattern, fetch: SubtreeFetch, keep: Keep, keep_all: bool = False
) -> ReplayPlan:
    """The guble fetch selection over ``pattern`` (Subtree(channel), guble.md §5), or with ``from_time`` a
    catch-up (every event from that time), as a replay plan: a scan of the log in commit order (which is
    guble's merged order, commit times being unique) up to one mark, from the selection's first event,
    counted first (``#fetch-start`` announces the exact count) and read page by page as it is sent, so a
    fetch of any length holds a page or two in memory. ``keep_all``: ``keep`` accepts every event without
    headers (the identity reads the whole subtree); then the count comes from the log's rows
    (:func:`_count_rows`) and the events are read once, as they are sent, unless one of them carries headers
    (delivery filters) or the node's replays are capped (a cluster node): those are counted by reading them
    (:func:`count_scan`)."""
    plan = ReplayPlan(replayed=True)
    mark = store.log_mark()
    plan.top_time = mark.time_ns
    start_id, max_count = fetch.start_id, fetch.max_count
    limit = max_count if max_count and (start_id is None or start_id >= 0) else None
    start: int | None
    if fetch.empty:
        return plan
    if fetch.from_time is not None or not start_id:
        start = fetch.from_time or 0
    elif start_id > 0:
        start = _first_from(store, fetch.channel, start_id, mark.time_ns, keep)
    else:
        start = last_start(store, pattern, mark, max_count or -start_id, keep)
    if start is None or start > mark.time_ns:
        return plan
    scan = ReplayScan(pattern_prefix(pattern), store.log_seek(start), mark, {}, frozenset(), start)
    counted = _count_rows(store, fetch.channel, scan, limit) if keep_all else None
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


def _first_from(store: EventLog, channel: str, start_id: int, mark_ns: int, keep: Keep) -> int | None:
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


def plan_cursor(
    store: EventLog, pattern: Pattern, since: Mapping[str, Position], from_time: int | None
) -> ReplayPlan:
    """A federation link's replay (:class:`CursorResume`), with no limit: every channel of ``pattern``'s
    events after its position in ``since`` (channels not in it: from ``from_time``; none when it is
    ``None``). A position the log no longer holds (trimmed, another epoch, ahead of the log) is a gap, and the
    channel goes on from where its log is. Used for a link's up session, and by the node above for a link's
    recovering subscriptions.

    Nothing is read here but the heads of the channels in ``since`` (and, for a pattern, the log's mark and
    where to start): the events are read page by page in commit order while they are sent
    (:class:`~hubbub.core.replay.ReplayScan`, :class:`~hubbub.core.replay.ReplaySpan` for an exact channel),
    so a backlog of any length goes in one replay, in memory of a page or two, at a cost that grows with the
    events replayed and the channels in ``since``, not with the channels in the log."""
    plan = ReplayPlan(replayed=True)
    since = {ch: pos for ch, pos in since.items() if pattern.matches(ch)}
    if pattern.is_exact:
        info = store.head(pattern.text)
        plan.position = Position(info.top, info.epoch)
        plan.tops[info.channel] = info.top
        pos = since.get(info.channel)
        if pos is not None:
            after = _after_gap(plan, info, pos)
        elif from_time is None:
            return plan
        else:
            first = store.read(info.channel, 0, 1, from_time=from_time)
            after = first[0].seq - 1 if first and first[0].epoch == info.epoch else info.top
        if after < info.top:
            plan.span = ReplaySpan(info.channel, info.epoch, after, info.top)
        return plan
    infos = store.heads(since) if since else {}
    mark = store.log_mark()
    plan.top_time = mark.time_ns
    listed: dict[str, Position] = {}
    for ch, pos in since.items():
        info = infos[ch]
        plan.tops[ch] = info.top
        after = _after_gap(plan, info, pos)
        listed[ch] = Position(after, info.epoch) if after or not info.empty else Position(0, "")
    plan.scan = plan_scan(store, pattern_prefix(pattern), mark, listed, frozenset(), from_time)
    return plan


def _after_gap(plan: ReplayPlan, info: ChannelInfo, pos: Position) -> int:
    """Where a channel's replay starts for a link at ``pos``: after it, or, when the log no longer holds it
    (a gap, added to ``plan``), from where the log is."""
    if pos.seq == 0 and pos.epoch == "":
        return max(info.first - 1, 0)  # a channel the link had seen no event of: all of it
    if pos.epoch != info.epoch:
        plan.gaps.append(Gap(info.channel, pos, Position(0, info.epoch), "epoch"))
        return max(info.first - 1, 0)
    if pos.seq > info.top:
        plan.gaps.append(Gap(info.channel, pos, Position(info.top, info.epoch), "ahead"))
        return info.top
    if pos.seq < info.first - 1:
        plan.gaps.append(Gap(info.channel, pos, Position(info.first - 1, info.epoch), "trimmed"))
        return info.first - 1
    return pos.seq
