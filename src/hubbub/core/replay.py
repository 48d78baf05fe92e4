"""Replay planning: what a subscription with a start position must receive (native.md §6, ARCHITECTURE §4).

Pure functions over a :class:`EventLog`, run on a reader thread by the node. They never touch sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from hubbub.channels import Pattern
from hubbub.errors import BadRequest
from hubbub.events import Event, Position
from hubbub.log.base import ChannelInfo, EventLog, LogMark
from hubbub.selection import ReplaySpec

__all__ = [
    "Gap",
    "ReplayPlan",
    "ReplayScan",
    "ReplaySpan",
    "ReplaySpec",
    "ScanCursor",
    "census_gaps",
    "count_scan",
    "last_start",
    "list_channels",
    "merged_key",
    "pattern_prefix",
    "plan_replay",
    "plan_scan",
    "scan_page",
]

PAGE = 1000
#: Log rows per page of a pattern's replay (scan_page): as REPLAY_PAGE for an exact channel's.
SCAN_PAGE = 2048
#: Payload bytes per page of a pattern's replay (``read_log(max_bytes=...)``): two pages are in flight (one
#: read while the previous one is sent), so a recovery holds about 8 MiB of payloads whatever their size
#: (2048 events of 1 MiB would be 2 GiB), half of ``limits.send_queue_bytes``' default; pages of events up
#: to 2 KiB stay 2048 rows.
SCAN_PAGE_BYTES = 4 << 20
#: Channels whose answer a scan keeps (ScanCursor.taken; forgotten all at once past it, then asked again).
TAKEN_MAX = 65536


@dataclass(frozen=True, slots=True)
class Gap:
    channel: str
    since: Position
    position: Position
    reason: str  # "epoch" | "trimmed" | "ahead"


@dataclass(frozen=True, slots=True)
class ReplaySpan:
    """An exact channel's replay, not read yet: its events of epoch ``epoch`` with ``after < seq <= top``. The
    node reads it page by page while it sends it (:meth:`EventLog.read_runs`), so a replay of any length holds
    one or two pages in memory, never the whole span."""

    channel: str
    epoch: str
    after: int
    top: int

    @property
    def count(self) -> int:
        return self.top - self.after


@dataclass(frozen=True, slots=True)
class ReplayScan:
    """A pattern's replay, not read yet: the log read in commit order (:meth:`EventLog.read_log`) from
    ``after`` up to ``mark`` under ``prefix``, page by page while it is sent (:func:`scan_page`). Of each
    channel the pattern matches: a channel of ``since`` its events after that position (of that epoch;
    ``Position(0, "")``: a channel with no event yet, all of them), none of a channel in ``skip`` (its
    ``since`` is a gap), and of any other channel its events at or after ``from_time`` (none without it).

    A scan whose count was announced before its events (guble's ``#fetch-start``; :func:`count_scan`) has
    ``limit``, the events it sends at most, and ``caps``: of each channel whose tail this cluster node had
    not delivered live when it was counted, the last position the count took (the live stream brings the
    rest), so sending it again finds the same events whatever was delivered meanwhile.

    ``trim_gaps`` (SSE's ``Last-Event-ID`` resume, native.md "SSE"): an unlisted channel whose first event
    the scan sends is not its first one while the one before it is trimmed gets a ``trimmed`` gap, told just
    before that event (:attr:`ScanCursor.gaps`): the trimmed events' times are gone, so they may have come
    after ``from_time``. Found by one read of the heads of the channels a page starts, so it costs what the
    replay sends, never a read of every channel the pattern matches.

    ``census`` (a scan from a time: :meth:`EventLog.log_census`, read with the snapshot): of each unlisted
    channel the scan replays, the ``(epoch, first seq, last seq)`` of its events in the range. A channel
    trimmed or reset while the scan runs would lose some of them silently; with the census the scan finds
    out (:func:`scan_page` at the channel's first event, :func:`census_gaps` at the end) and the gap is told.
    It costs one grouped read of the range's rows, and a dictionary of the channels replayed."""

    prefix: str
    after: int
    mark: LogMark
    since: Mapping[str, Position]
    skip: frozenset[str]
    from_time: int | None
    limit: int | None = None
    caps: Mapping[str, Position] | None = None
    trim_gaps: bool = False
    census: Mapping[str, tuple[str, int, int]] | None = None


@dataclass(slots=True)
class ReplayPlan:
    """The snapshot: heads of the channels the request named (``tops``), gaps to report, and what to replay,
    in order: ``events``, then the events of ``span`` (an exact channel's replay) or ``scan`` (a pattern's),
    both read while they are sent."""

    position: Position | None = None  # exact channel: the reply position
    top_time: int = 0  # pattern: the reply top_time
    tops: dict[str, int] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    replayed: bool = False  # a replay was requested (so ``recovered`` is sent)
    ahead: list[str] = field(default_factory=list)  # channels that need a new epoch (reason "ahead")
    span: ReplaySpan | None = None
    scan: ReplayScan | None = None
    #: How many events the replay queued; set by the node before ``on_replayed``.
    sent: int = 0


def merged_key(e: Event) -> tuple[int, bytes, int]:
    """The merged order across channels (mapping.md §3)."""
    return (e.time_ns, e.channel.encode(), e.seq)


def list_channels(
    store: EventLog,
    pattern: Pattern,
    *,
    include_empty: bool = False,
    after: str = "",
    limit: int | None = None,
    keep: Callable[[str], bool] | None = None,
) -> list[ChannelInfo]:
    """The channels with retained events that match ``pattern`` (``include_empty``: every channel with a
    current epoch, as :meth:`EventLog.channels` lists them), in byte order of their path, strictly after
    ``after``, that ``keep`` accepts, at most ``limit`` (None: every one). The store is read a page at a
    time from ``after`` on, and no further than the page that holds the ``limit``-th channel: one page of a
    listing costs the same whatever the log's number of channels. The first page read is ``limit`` rows
    (a listing of one channel reads one), each next one twice the last, up to :data:`PAGE`: a pattern or
    ``keep`` that leaves most channels out takes few reads all the same."""
    prefix = pattern_prefix(pattern)
    out: list[ChannelInfo] = []
    if limit is not None and limit <= 0:
        return out
    size = PAGE if limit is None else min(PAGE, limit)
    while True:
        page = store.channels(after=after, limit=size, prefix=prefix, include_empty=include_empty)
        for ci in page:
            if pattern.matches(ci.channel) and (keep is None or keep(ci.channel)):
                out.append(ci)
                if limit is not None and len(out) >= limit:
                    return out
        if len(page) < size:
            return out
        after = page[-1].channel
        size = min(PAGE, size * 2)


def _check_since(info: ChannelInfo, since: Position) -> tuple[Gap | None, bool]:
    """Returns (gap, ahead) for a ``since`` against the channel's snapshot."""
    seq, epoch = since.seq, since.epoch
    cur = Position(info.top, info.epoch)
    if seq == 0 and epoch == "":
        return None, False
    if epoch != info.epoch:
        return Gap(info.channel, since, cur, "epoch"), False
    if seq > info.top:
        return Gap(info.channel, since, cur, "ahead"), True
    if seq < info.first - 1:
        return Gap(info.channel, since, cur, "trimmed"), False
    return None, False


def plan_replay(store: EventLog, pattern: Pattern, spec: ReplaySpec) -> ReplayPlan:
    """Read the snapshot of one new subscription and plan its replay. Runs on a reader thread.

    Nothing is read but heads of the channels the request names and, for a pattern, the log's
    :class:`LogMark` and where to start reading (:class:`ReplayScan`): the events themselves are read page by
    page while they are sent, so planning costs the same for a log of ten channels or a million, and a
    replay of any length holds a page or two in memory."""
    plan = ReplayPlan()
    if pattern.is_exact:
        _plan_exact(store, pattern.text, spec, plan)
        return plan

    # A pattern: the snapshot is the log's mark, the replay a scan of the log in commit order up to it.
    if not spec.wanted:
        # No replay: every live event held while this ran was fanned out after the subscription was
        # registered, so all of them are released.
        plan.top_time = store.top_time()
        return plan
    since_map: Mapping[str, Position] = {}
    if spec.since is not None:
        if not isinstance(spec.since, Mapping):
            raise BadRequest("since for a pattern is a map of channel to position")
        since_map = spec.since
        for ch in since_map:
            if not pattern.matches(ch):
                raise BadRequest(f"since lists {ch}, which the pattern does not match")
    plan.replayed = True
    # Heads first, then the mark: every event up to a head is at or below the mark.
    infos = store.heads(since_map) if since_map else {}
    mark = store.log_mark()
    plan.top_time = mark.time_ns
    prefix = pattern_prefix(pattern)
    listed: dict[str, Position] = {}
    skip: set[str] = set()
    for ch, pos in since_map.items():
        info = infos[ch]
        plan.tops[ch] = info.top
        gap, ahead = _check_since(info, pos)
        if gap is not None:
            plan.gaps.append(gap)
            skip.add(ch)
            if ahead:
                plan.ahead.append(ch)
            continue
        if info.empty:
            listed[ch] = Position(0, "")  # no event yet: its first one, whatever its epoch, is new
        else:
            listed[ch] = Position(max(pos.seq, info.first - 1), info.epoch)
    from_time = spec.from_time
    if spec.last is not None:
        from_time = last_start(store, pattern, mark, spec.last)
        if from_time is None:
            return plan
    scan = plan_scan(store, prefix, mark, listed, frozenset(skip), from_time)
    if scan is not None and from_time is not None:
        census = store.log_census(scan.after, mark, prefix, from_time=from_time)
        listed_or_skipped = since_map.keys()
        scan = replace(
            scan,
            census={ch: c for ch, c in census.items() if ch not in listed_or_skipped and pattern.matches(ch)},
        )
    plan.scan = scan
    return plan


def plan_scan(
    store: EventLog,
    prefix: str,
    mark: LogMark,
    listed: Mapping[str, Position],
    skip: frozenset[str],
    from_time: int | None,
) -> ReplayScan | None:
    """The :class:`ReplayScan` of ``listed`` channels' events after their positions and other channels'
    from ``from_time``, up to ``mark``; None when there is nothing to read. Reading starts before the first
    event after any listed position and before ``from_time``: one read per listed channel and one seek, so
    it costs what the ``since`` map costs, whatever the number of channels in the log."""
    starts: list[int] = []
    for ch, pos in listed.items():
        nxt = store.read(ch, pos.seq, 1)
        if nxt and nxt[0].time_ns <= mark.time_ns:
            starts.append(nxt[0].time_ns)
    if from_time is not None and from_time <= mark.time_ns:
        starts.append(from_time)
    if not starts:
        return None
    return ReplayScan(prefix, store.log_seek(min(starts)), mark, listed, skip, from_time)


def _plan_exact(store: EventLog, channel: str, spec: ReplaySpec, plan: ReplayPlan) -> None:
    info = store.head(channel)
    plan.position = Position(info.top, info.epoch)
    plan.tops[channel] = info.top
    if not spec.wanted:
        return
    plan.replayed = True
    since = spec.since
    if isinstance(since, Mapping):
        raise BadRequest("since for an exact channel is {seq, epoch}")
    if since is not None:
        gap, ahead = _check_since(info, since)
        if gap is not None:
            plan.gaps.append(gap)
            plan.replayed = False
            if ahead:
                plan.ahead.append(channel)
            return
        after = max(since.seq, info.first - 1)
    elif spec.last is not None:
        after = max(info.top - spec.last, info.first - 1, 0)
    else:
        # The first event at or after from_time; every later one up to the top is replayed.
        first = store.read(channel, 0, 1, from_time=spec.from_time)
        after = min(first[0].seq - 1, info.top) if first and first[0].epoch == info.epoch else info.top
    if after < info.top:
        plan.span = ReplaySpan(channel, info.epoch, after, info.top)


def last_start(
    store: EventLog, pattern: Pattern, mark: LogMark, n: int, keep: Callable[[Event], bool] | None = None
) -> int | None:
    """The time of the ``n``-th newest event the pattern matches at ``mark`` (the oldest of the last ``n``),
    counting only those ``keep`` accepts when given (a dialect's filters), found reading the log backwards
    a page at a time; None when ``n`` is 0 or no event matches."""
    if n <= 0:
        return None
    prefix = pattern_prefix(pattern)
    found = 0
    oldest: int | None = None
    top = mark
    while True:
        page = store.read_log(0, top, SCAN_PAGE, prefix, reverse=True, max_bytes=SCAN_PAGE_BYTES)
        for e in page.events:
            if pattern.matches(e.channel) and (keep is None or keep(e)):
                oldest = e.time_ns
                found += 1
                if found == n:
                    return oldest
        if len(page.events) < SCAN_PAGE and not page.full:
            return oldest
        top = LogMark(page.pos - 1, mark.time_ns)


def count_scan(
    store: EventLog, pattern: Pattern, scan: ReplayScan, keep: Callable[[Event], bool], limit: int | None
) -> ReplayScan:
    """Count a scan's events before sending them (on a reader thread): ``scan`` with ``limit`` the number of
    events ``keep`` accepts (at most ``limit``) and the ``caps`` this count took, so the send finds exactly
    those. Reads the scan once, a page at a time: memory stays one page whatever its length."""
    cur = ScanCursor(scan.after, dict(scan.since))
    count = 0
    while not cur.done and (limit is None or count < limit):
        for e in scan_page(store, pattern, scan, cur):
            if keep(e):
                count += 1
                if count == limit:
                    break
    caps = {ch: cur.expect[ch] for ch in cur.cut}
    return replace(scan, limit=count, caps=caps)


def pattern_prefix(pattern: Pattern) -> str:
    """The longest channel path prefix every channel ``pattern`` matches starts with (``/a`` is a prefix of
    ``/ab`` too: callers still check the pattern)."""
    prefix = ""
    for p in pattern.parts:
        if p is None:
            break
        prefix += "/" + p
    return prefix


@dataclass(slots=True)
class ScanCursor:
    """Where a pattern's replay is (:func:`scan_page`): the log position read up to, per channel the last
    position replayed or passed over (``expect``: each channel's next event must continue it exactly),
    the channels whose replay ended early on a cluster node (``cut``: the live stream brings the rest),
    whether the scan is over (``done``) or lost its snapshot (``broken``), and the gaps found
    (``gaps``, :attr:`ReplayScan.trim_gaps`: each told just before its channel's first event sent; added
    and taken on the reader thread that reads the page)."""

    after: int
    expect: dict[str, Position]
    cut: set[str] = field(default_factory=set)
    done: bool = False
    broken: bool = False
    #: Of each channel the scan met, whether the scan takes it (the pattern matches, not skipped): asked
    #: once per channel, not per event (at most ``TAKEN_MAX`` kept).
    taken: dict[str, bool] = field(default_factory=dict)
    gaps: dict[str, Gap] = field(default_factory=dict)


def scan_page(store: EventLog, pattern: Pattern, scan: ReplayScan, cur: ScanCursor) -> list[Event]:
    """The next page of a pattern's replay (on a reader thread; one cursor's pages one after another): the
    events of the log after ``cur.after`` up to the scan's mark that the subscriber gets, in commit order,
    ``cur`` moved past them. A channel whose events do not continue its ``expect`` exactly (trimmed or
    reset under the scan) sets ``cur.broken``: the replay must not go on. On a cluster node, events this
    node has not delivered live yet (:meth:`EventLog.delivered`) are left to the live stream, and with them
    the rest of their channel's replay."""
    page = store.read_log(cur.after, scan.mark, SCAN_PAGE, scan.prefix, max_bytes=SCAN_PAGE_BYTES)
    cur.after = page.pos
    cur.done = len(page.events) < SCAN_PAGE and not page.full
    matches = pattern.matches
    since, skip, from_time, census = scan.since, scan.skip, scan.from_time, scan.census
    expect, cut = cur.expect, cur.cut
    out: list[Event] = []
    taken = cur.taken
    starts: list[Event] = []  # unlisted channels' first events here, past their seq 1 (trim_gaps)
    for e in page.events:
        ch = e.channel
        ok = taken.get(ch)
        if ok is None:
            if len(taken) >= TAKEN_MAX:
                taken.clear()
            ok = taken[ch] = ch not in skip and matches(ch)
        if not ok or (cut and ch in cut):
            continue
        last = expect.get(ch)
        if last is None:
            if ch in since or from_time is None or e.time_ns < from_time:
                continue
            if census is not None:
                c = census.get(ch)
                if c is not None and c[0] == e.epoch and e.seq > c[1]:
                    # Its first events in the range went while the scan ran (trimmed before this page).
                    gap = Gap(ch, Position(c[1] - 1, e.epoch), Position(e.seq - 1, e.epoch), "trimmed")
                    cur.gaps[ch] = gap
            if e.seq > 1 and scan.trim_gaps:
                starts.append(e)
        elif last.epoch:
            if e.epoch == last.epoch and e.seq <= last.seq:
                continue  # at or before a listed position: the subscriber has it
            if e.epoch != last.epoch or e.seq != last.seq + 1:
                cur.broken = cur.done = True
                return out
        elif e.seq != 1:  # a listed channel that had no event: its first one is 1
            cur.broken = cur.done = True
            return out
        expect[ch] = Position(e.seq, e.epoch)
        out.append(e)
    if starts:
        _trimmed_starts(store, starts, cur.gaps)
    if out and scan.caps is not None:
        if scan.caps:
            out = _capped(out, scan.caps, cur)
    elif out and type(store).delivered is not EventLog.delivered:
        out = _delivered_only(store, out, cur)
    return out


def census_gaps(store: EventLog, scan: ReplayScan, cur: ScanCursor) -> list[Gap]:
    """At the end of a scan with a ``census`` (on a reader thread): a gap for each channel whose replay
    stopped short of the last event the census found, or never began (trimmed or reset away while the scan
    ran): ``since`` the last event replayed (or the one before the census's first), ``position`` the last
    one lost (reason ``trimmed``) or the start of the channel's new epoch (reason ``epoch``). Channels left to
    the live stream (``cur.cut``) are not. One read of the heads of the channels found short."""
    short: list[tuple[str, str, int, int, Position | None]] = []
    for ch, (epoch, first, last) in (scan.census or {}).items():
        got = cur.expect.get(ch)
        if ch in cur.cut or (got is not None and got.epoch == epoch and got.seq >= last):
            continue
        short.append((ch, epoch, first, last, got))
    if not short:
        return []
    heads = store.heads([ch for ch, *_ in short])
    gaps: list[Gap] = []
    for ch, epoch, first, last, got in short:
        since = got if got is not None and got.epoch == epoch else Position(first - 1, epoch)
        h = heads[ch]
        if h.epoch != epoch:
            gaps.append(Gap(ch, since, Position(0, h.epoch), "epoch"))
        else:
            gaps.append(Gap(ch, since, Position(last, epoch), "trimmed"))
    return gaps


def _trimmed_starts(store: EventLog, starts: list[Event], gaps: dict[str, Gap]) -> None:
    """A ``trimmed`` gap in ``gaps`` for each of ``starts`` (an unlisted channel's first event in a scan)
    whose previous event is trimmed: its channel's first retained event now (one read of their heads)."""
    heads = store.heads([e.channel for e in starts])
    for e in starts:
        h = heads[e.channel]
        if h.epoch == e.epoch and h.first >= e.seq and e.channel not in gaps:
            gaps[e.channel] = Gap(e.channel, Position(0, e.epoch), Position(e.seq - 1, e.epoch), "trimmed")


def _capped(events: list[Event], caps: Mapping[str, Position], cur: ScanCursor) -> list[Event]:
    """``events`` without those past their channel's cap (:attr:`ReplayScan.caps`), whose channels join
    ``cur.cut`` at the cap."""
    out: list[Event] = []
    for e in events:
        cap = caps.get(e.channel)
        if cap is not None and e.seq > cap.seq:
            cur.cut.add(e.channel)
            cur.expect[e.channel] = cap
            continue
        out.append(e)
    return out


def _delivered_only(store: EventLog, events: list[Event], cur: ScanCursor) -> list[Event]:
    """``events`` without those this node has not delivered live yet, nor any later one of their channels
    (which the live stream brings, in order): those channels join ``cur.cut`` and their ``expect`` goes back
    to the last event kept (or before the first one cut)."""
    firsts: dict[str, Event] = {}
    lasts: dict[str, Event] = {}
    for e in events:
        firsts.setdefault(e.channel, e)
        lasts[e.channel] = e
    names = list(lasts)
    caps = store.delivered([(ch, lasts[ch].epoch, lasts[ch].seq) for ch in names])
    short = {ch: cap for ch, cap in zip(names, caps, strict=True) if cap < lasts[ch].seq}
    if not short:
        return events
    out = [e for e in events if e.channel not in short or e.seq <= short[e.channel]]
    for ch, cap in short.items():
        cur.cut.add(ch)
        cur.expect[ch] = Position(max(cap, firsts[ch].seq - 1), lasts[ch].epoch)
    return out
