"""Replay planning: what a subscription with a start position must receive (native.md §6, ARCHITECTURE §4).

Pure functions over a :class:`LogStore`, run on a reader thread by the node. They never touch sessions.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hubbub.channels import Pattern
from hubbub.errors import BadRequest, SubscriptionError
from hubbub.events import Event, Position
from hubbub.log.base import ChannelInfo, LogStore

__all__ = [
    "Gap",
    "ReplayPlan",
    "ReplaySpan",
    "ReplaySpec",
    "list_channels",
    "merged_key",
    "plan_replay",
    "trimmed_after",
]

PAGE = 1000


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """What the subscriber asked for. At most one of the three, except ``from_time`` with a ``since`` map."""

    since: Position | Mapping[str, Position] | None = None
    last: int | None = None
    from_time: int | None = None

    @property
    def wanted(self) -> bool:
        return self.since is not None or self.last is not None or self.from_time is not None


@dataclass(frozen=True, slots=True)
class Gap:
    channel: str
    since: Position
    position: Position
    reason: str  # "epoch" | "trimmed" | "ahead"


@dataclass(frozen=True, slots=True)
class ReplaySpan:
    """An exact channel's replay, not read yet: its events of epoch ``epoch`` with ``after < seq <= top``. The
    node reads it page by page while it sends it (:meth:`LogStore.read_runs`), so a replay of any length holds
    one or two pages in memory, never the whole span."""

    channel: str
    epoch: str
    after: int
    top: int

    @property
    def count(self) -> int:
        return self.top - self.after


@dataclass(slots=True)
class ReplayPlan:
    """The snapshot: per-channel heads (``tops``), gaps to report, and what to replay, in order: ``events``,
    then the events of ``span`` (an exact channel's replay, read while it is sent)."""

    position: Position | None = None  # exact channel: the reply position
    top_time: int = 0  # pattern: the reply top_time
    tops: dict[str, int] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    replayed: bool = False  # a replay was requested (so ``recovered`` is sent)
    ahead: list[str] = field(default_factory=list)  # channels that need a new epoch (reason "ahead")
    span: ReplaySpan | None = None
    #: How many events the replay queued; set by the node before ``on_replayed``.
    sent: int = 0


def merged_key(e: Event) -> tuple[int, bytes, int]:
    """The merged order across channels (mapping.md §3)."""
    return (e.time_ns, e.channel.encode(), e.seq)


def list_channels(store: LogStore, pattern: Pattern, *, include_empty: bool = False) -> list[ChannelInfo]:
    """Every channel with retained events that matches ``pattern`` (``include_empty``: every channel with a
    current epoch, as :meth:`LogStore.channels` lists them)."""
    prefix = ""
    for p in pattern.parts:
        if p is None:
            break
        prefix += "/" + p
    # "/a" is a prefix of "/ab" too: the pattern check below filters those out.
    out: list[ChannelInfo] = []
    after = ""
    while True:
        page = store.channels(after=after, limit=PAGE, prefix=prefix, include_empty=include_empty)
        out.extend(ci for ci in page if pattern.matches(ci.channel))
        if len(page) < PAGE:
            return out
        after = page[-1].channel


def _read_range(store: LogStore, channel: str, after: int, top: int, from_time: int | None) -> list[Event]:
    out: list[Event] = []
    while after < top:
        page = store.read(channel, after_seq=after, limit=PAGE, from_time=from_time)
        page = [e for e in page if e.seq <= top]
        if not page:
            break
        out.extend(page)
        after = page[-1].seq
    return out


def trimmed_after(store: LogStore, pattern: Pattern, time_ns: int, skip: Iterable[str] = ()) -> list[Gap]:
    """``trimmed`` gaps for a resume from ``time_ns`` across a pattern (native.md §8, SSE): every matching
    channel whose retained events start after ``time_ns`` while earlier ones were trimmed. The trimmed events'
    times are gone, so a channel whose first retained event is newer than the resume point is reported."""
    skipped = set(skip)
    gaps: list[Gap] = []
    for ci in list_channels(store, pattern):
        if ci.channel in skipped or ci.first <= 1:
            continue
        first = store.read(ci.channel, ci.first - 1, 1)
        if first and first[0].time_ns > time_ns:
            gaps.append(Gap(ci.channel, Position(0, ci.epoch), Position(ci.top, ci.epoch), "trimmed"))
    return gaps


def _read_last(store: LogStore, info: ChannelInfo, n: int) -> list[Event]:
    """The last ``n`` events at or below the snapshot's top. Reading by seq (not ``read_last``) keeps the
    count exact when commits land between the snapshot and this read."""
    if n <= 0 or info.top == 0:
        return []
    return _read_range(store, info.channel, max(info.top - n, info.first - 1, 0), info.top, None)


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


def plan_replay(store: LogStore, pattern: Pattern, spec: ReplaySpec, max_recovery: int) -> ReplayPlan:
    """Read the snapshot and the replay for one new subscription. Runs on a reader thread."""
    plan = ReplayPlan()
    if pattern.is_exact:
        channel = pattern.text
        info = store.head(channel)
        plan.position = Position(info.top, info.epoch)
        plan.tops[channel] = info.top
        if not spec.wanted:
            return plan
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
                return plan
            if info.top - since.seq > max_recovery:
                raise SubscriptionError("recovery too large", code=4203)
            after = max(since.seq, info.first - 1)
        elif spec.last is not None:
            after = max(info.top - min(spec.last, max_recovery), info.first - 1, 0)
        else:
            # The first event at or after from_time; every later one up to the top is replayed.
            first = store.read(channel, 0, 1, from_time=spec.from_time)
            after = min(first[0].seq - 1, info.top) if first and first[0].epoch == info.epoch else info.top
            if info.top - after > max_recovery:
                raise SubscriptionError("recovery too large", code=4203)
        if after < info.top:
            plan.span = ReplaySpan(channel, info.epoch, after, info.top)
        return plan

    # A pattern: per-channel snapshot, replay in merged order.
    plan.top_time = store.top_time()
    if not spec.wanted:
        # No replay: every live event held while this ran was fanned out after the subscription was
        # registered, so all of them are released; no per-channel snapshot is needed (and listing every
        # channel under ``/**`` would cost as much as the log has channels).
        return plan
    infos = list_channels(store, pattern)
    for ci in infos:
        plan.tops[ci.channel] = ci.top
    plan.replayed = True
    by_name = {ci.channel: ci for ci in infos}
    streams: list[list[Event]] = []
    total = 0
    since_map: Mapping[str, Position] = {}
    if spec.since is not None:
        if not isinstance(spec.since, Mapping):
            raise BadRequest("since for a pattern is a map of channel to position")
        since_map = spec.since
        for ch in since_map:
            if not pattern.matches(ch):
                raise BadRequest(f"since lists {ch}, which the pattern does not match")
    for ch, pos in since_map.items():
        info = by_name.get(ch) or store.head(ch)
        plan.tops.setdefault(ch, info.top)
        gap, ahead = _check_since(info, pos)
        if gap is not None:
            plan.gaps.append(gap)
            if ahead:
                plan.ahead.append(ch)
            continue
        total += info.top - pos.seq
        if total > max_recovery:
            raise SubscriptionError("recovery too large", code=4203)
        streams.append(_read_range(store, ch, max(pos.seq, info.first - 1), info.top, None))
    rest: Iterable[ChannelInfo] = (ci for ci in infos if ci.channel not in since_map)
    if spec.last is not None:
        n = min(spec.last, max_recovery)
        lasts = [_read_last(store, ci, n) for ci in rest]
        merged = list(heapq.merge(*lasts, key=merged_key))
        plan.events = merged[-n:] if n else []
        return plan
    if spec.from_time is not None:
        for ci in rest:
            evs = [e for e in store.read(ci.channel, 0, max_recovery + 1, from_time=spec.from_time)]
            evs = [e for e in evs if e.seq <= ci.top]
            total += len(evs)
            if total > max_recovery:
                raise SubscriptionError("recovery too large", code=4203)
            streams.append(evs)
    plan.events = list(heapq.merge(*streams, key=merged_key))
    return plan
