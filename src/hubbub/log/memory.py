"""``MemoryLogStore``: the reference engine. Everything lives in process memory; nothing survives a restart.

It is written for obviousness, not speed, and every other engine is tested against it (the contract suite and
the hypothesis state machine); the one concession to speed is how a channel epoch keeps its events: as
columns (``memory_epoch.py``), which the garbage collector does not walk event by event, built back into
events when read. Where ``base.py`` leaves a choice open, this file settles it for every engine:

* One batch reads the clock once (``now``); its events get times ``max(now, last + 1)``, ``+ 1``, … in request
  order, so ``time_ns`` is strictly increasing over the whole log, not only per channel.
* ``top_time()`` is the time of the newest event ever committed (it survives trimming and resets); 0 only for
  a log that never had an event.
* ``reset_channel`` of a channel that never had an event creates it with a new epoch (first 1, top 0).
  ``reset_channel`` and ``new_epochs_on_open`` keep the old epoch's events as a retired epoch (when it holds
  any), and keep the idempotency keys: a retry answers the original event in its old epoch.
* ``commits_may_be_lost`` is always false: nothing of this engine outlives its process, so no epoch of it
  can have lost commits.
* A duplicate (idempotency) is judged against the time the event would have been given, and answers the
  original event, even when that event has since been trimmed (engines that cannot read it back rebuild it
  from the request with the original position and time).
* ``channels()`` and ``stats().channels`` count only channels holding at least one retained event.
* Per-channel ``max_bytes`` may trim the event just appended when it alone is over the limit: the append still
  succeeds (and is acknowledged), the channel's ``first`` moves to ``top + 1``.

Concurrency: one lock guards all state, so every read sees a whole batch or none of it; the writer methods are
never called concurrently, as the ``LogStore`` contract says (``append`` may run on the event loop:
``inline_append``), reads from any thread.
"""

from __future__ import annotations

import bisect
import heapq
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from hubbub.errors import StorageError, TrimEpochGone, TrimOutOfRange
from hubbub.events import Event
from hubbub.log.appended import RunAppended, run_results
from hubbub.log.base import (
    AppendRequest,
    AppendResult,
    AppendRun,
    ChannelInfo,
    EventRun,
    LogMark,
    LogPage,
    LogStore,
    RetentionPolicy,
    Row,
    ScanColumns,
    ScanPlan,
    StateWrite,
    StoreStats,
    new_epoch,
)
from hubbub.log.consumers import ConsumerInfo, ConsumerSpec, JournalIndex, JournalItem, Retry, check_spec
from hubbub.log.memory_epoch import NO_HEADERS, Epoch, payload_bytes
from hubbub.log.read_plan import take_upto
from hubbub.log.records import encode_headers, encode_tags, event_size
from hubbub.log.sequencing import FROM_RECORD, IdemKey, plan_append

__all__ = ["MemoryLogStore"]

_NS = 1_000_000_000


def _single(r: AppendResult | RunAppended) -> AppendResult:
    """The result of a request with an idempotency key (never a run's: a run has no key)."""
    assert type(r) is AppendResult
    return r


def _no_append(_item: object) -> None:
    """The appends of :meth:`MemoryLogStore.append` before its first channel (never called)."""
    raise AssertionError("no channel")


@dataclass(slots=True)
class _Consumer:
    """A durable consumer and its journal (unacknowledged items by position, in position order)."""

    id: int
    spec: ConsumerSpec
    created_ns: int
    top: int = 0
    bytes: int = 0
    items: dict[int, JournalItem] = field(default_factory=dict)

    def info(self) -> ConsumerInfo:
        return ConsumerInfo(self.id, self.spec, self.created_ns, self.top, len(self.items), self.bytes)


class MemoryLogStore(LogStore):
    """The reference :class:`LogStore` (see the module docstring).

    ``retention``: its ``max_events``/``max_bytes`` apply per channel at every append. ``idem_window_s``: how
    long idempotency keys are remembered (0 turns idempotency off). ``clock`` returns nanoseconds since the
    Unix epoch (tests pass a fake one).
    """

    engine = "memory"
    # The append only touches process memory: core runs it on the loop, saving two thread hand-offs.
    inline_append = True
    inline_settle = True
    takes_runs = True

    def __init__(
        self,
        *,
        retention: RetentionPolicy | None = None,
        idem_window_s: float = 600,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._retention = retention or RetentionPolicy()
        self._idem_window_ns = int(max(idem_window_s, 0) * _NS)
        self._clock = clock
        # Reentrant: read_rows holds it across the reads it is made of (one snapshot).
        self._lock = threading.RLock()
        self._channels: dict[str, Epoch] = {}
        # Retired epochs holding events, per channel, oldest first.
        self._retired: dict[str, list[Epoch]] = {}
        self._last_time = 0
        self._next_id = 1
        self._next_pos = 1
        # (user, channel, idem) -> the original event; insertion order is time order (oldest first).
        self._idem: OrderedDict[tuple[str, str, str], Event] = OrderedDict()
        self._closed = False
        # Durable consumers: by name, by id, and the filters that journal events at append.
        self._consumers: dict[str, _Consumer] = {}
        self._consumer_ids: dict[int, _Consumer] = {}
        self._next_consumer = 1
        self._jindex = JournalIndex()
        # The state maps (``StateMaps``): (ns, key) -> (value, version).
        self._state: dict[tuple[str, str], tuple[str | None, int]] = {}

    # -- writer side ---------------------------------------------------------------------------------

    def append(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult]:
        return self._append(batch, False)  # type: ignore[return-value]  # (no RunAppended without runs)

    def append_runs(self, batch: Sequence[AppendRequest | AppendRun]) -> list[AppendResult | RunAppended]:
        """``RunAppender.append_runs``: a run's events are journaled when a durable consumer exists, so then
        every result is built, as :meth:`append` builds them (whether one exists is read under the lock,
        with the append: a consumer another thread creates meanwhile journals the batch or not at all)."""
        return self._append(batch, True)

    def _append(
        self, batch: Sequence[AppendRequest | AppendRun], runs: bool
    ) -> list[AppendResult | RunAppended]:
        with self._lock:
            if self._closed:  # (_check_open, without its call on the per-event path)
                raise StorageError("log store is closed")
            as_runs = runs and self._jindex.empty
            now = self._clock()
            window = self._idem_window_ns
            idem_keys = self._idem
            originals: dict[IdemKey, int] = {}
            if window and idem_keys:
                # Keys no later request can match: every later event time is after the last one (the wall
                # clock may step back, so ``now`` is no lower bound). The plan judges a key in the window.
                self._forget_idem(self._last_time + 1 - window)
                for req in batch:
                    if req.idem:
                        key = (req.publisher.user, req.channel, req.idem)
                        orig = idem_keys.get(key)
                        if orig is not None:
                            originals[key] = orig.time_ns
            channels = self._channels
            plan = plan_append(batch, channels, self._last_time, now, window, originals)
            for name in plan.created:
                channels[name] = self._epoch_row(name)
            if as_runs and len(batch) == 1 and type(only := batch[0]) is AppendRun:
                return self._append_run_alone(only, plan.seqs[0], plan.times[0], plan.last_time)
            results: list[AppendResult | RunAppended] = []
            add_result = results.append
            touched: dict[str, Epoch] = {}
            pos = self._next_pos
            # Plain loop with locals: core may run this on the event loop (``inline_append``), per event. A
            # batch is mostly runs of one channel's publishes: the channel is looked up, and its running
            # figures written back (``Epoch.took``), once per run of it, not once per event.
            # The duplicates' sources, in request order (``dups`` is), taken as their requests come.
            sources = iter(plan.dups.values())
            ch: Epoch | None = None
            cur = ""
            epoch = ""
            add_time: Callable[[int], None] = _no_append
            add_payload: Callable[[bytes], None] = _no_append
            add_size: Callable[[int], None] = _no_append
            add_pos: Callable[[int], None] = _no_append
            top = top_time = nbytes = 0
            for req, seq, t in zip(batch, plan.seqs, plan.times, strict=True):
                name = req.channel
                if not seq:
                    src = next(sources)
                    orig = (
                        idem_keys[(req.publisher.user, name, req.idem)]
                        if src == FROM_RECORD
                        else _single(results[plan.result_index(src)]).event
                    )
                    add_result(AppendResult(orig, duplicate=True))
                    continue
                if ch is None or name is not cur:
                    if ch is not None:
                        ch.took(top, top_time, nbytes)
                    ch = touched[name] = channels[name]
                    cur, epoch, nbytes = name, ch.epoch, 0
                    add_time, add_payload = ch.times.append, ch.payloads.append
                    add_size, add_pos = ch.sizes.append, ch.pos.append
                if isinstance(req, AppendRun):
                    # A run (one publisher's burst): its events in bulk (the epoch's running figures are its
                    # own then: ``nbytes`` counts the single events only).
                    pub, ctype = req.publisher, req.content_type
                    payloads = payload_bytes(req.payloads)
                    ch.add_run(seq, t, pos, pub, ctype, payloads)
                    k = len(payloads)
                    pos += k
                    top = seq + k - 1
                    top_time = t + k - 1
                    proto = Event(name, seq, epoch, t, pub, payloads[0], ctype, NO_HEADERS, ())
                    results += run_results(proto, payloads, as_runs)
                    continue
                payload = req.payload
                if type(payload) is not bytes:
                    payload = bytes(payload)
                headers: dict[str, str] = dict(req.headers) if req.headers else NO_HEADERS
                tags = req.tags
                if tags or headers:
                    tags = tuple(tags)
                    size = event_size(payload, headers, tags)
                else:
                    tags = ()
                    size = len(payload)
                ev = Event(name, seq, epoch, t, req.publisher, payload, req.content_type, headers, tags)
                ch.share(seq, req.publisher, req.content_type, headers, tags)
                add_time(t)
                add_payload(payload)
                add_size(size)
                add_pos(pos)
                pos += 1
                nbytes += size
                top = seq
                top_time = t
                add_result(AppendResult(ev))
            if ch is not None:
                ch.took(top, top_time, nbytes)
            for key, (i, _t) in plan.keys.items():
                idem_keys.pop(key, None)
                idem_keys[key] = _single(results[plan.result_index(i)]).event
            self._last_time = plan.last_time
            self._next_pos = pos
            if self._retention.max_events or self._retention.max_bytes:
                for ch in touched.values():
                    self._trim_channel(ch)
            if not self._jindex.empty:
                self._journal(results)  # type: ignore[arg-type]  # (as_runs is false then)
            return results

    def _append_run_alone(
        self, req: AppendRun, seq: int, t: int, last_time: int
    ) -> list[AppendResult | RunAppended]:
        """A batch of one run, journaled for no durable consumer, its first event at ``seq`` and ``t`` and
        the log's newest time after it ``last_time`` (the plan's): what the batch loop of :meth:`_append`
        does with it, without the loop's set-up, which a publish at a light load (a run of one event, one
        commit each) pays alone. Caller holds the lock."""
        ch = self._channels[req.channel]
        pub, ctype = req.publisher, req.content_type
        payloads = payload_bytes(req.payloads)
        pos = self._next_pos
        ch.add_run(seq, t, pos, pub, ctype, payloads)
        self._last_time = last_time
        self._next_pos = pos + len(payloads)
        if self._retention.max_events or self._retention.max_bytes:
            self._trim_channel(ch)
        return run_results(
            Event(ch.channel, seq, ch.epoch, t, pub, payloads[0], ctype, NO_HEADERS, ()), payloads, True
        )

    def _journal(self, results: list[AppendResult]) -> None:
        """Journal each new event for the consumers that match it (caller holds the lock)."""
        match, by_id = self._jindex.match, self._consumer_ids
        for i, r in enumerate(results):
            if r.duplicate:
                continue
            ev = r.event
            ids = match(ev.channel, ev.tags)
            if not ids:
                continue
            entries = []
            for cid in ids:
                c = by_id[cid]
                c.top += 1
                c.items[c.top] = JournalItem(c.top, ev)
                c.bytes += ev.size
                entries.append((cid, c.top))
            results[i] = AppendResult(ev, False, tuple(entries))

    def consumer_create(self, spec: ConsumerSpec) -> tuple[ConsumerInfo, bool]:
        with self._lock:
            self._check_open()
            c = self._consumers.get(spec.name)
            if c is not None:
                return c.info(), False
            check_spec(spec)
            self._jindex.add(self._next_consumer, spec)
            c = _Consumer(self._next_consumer, spec, max(self._clock(), self._last_time))
            self._next_consumer += 1
            self._consumers[spec.name] = self._consumer_ids[c.id] = c
            return c.info(), True

    def consumer_delete(self, name: str, consumer_id: int | None = None) -> bool:
        with self._lock:
            self._check_open()
            c = self._consumers.get(name)
            if c is None or (consumer_id is not None and c.id != consumer_id):
                return False
            del self._consumers[name]
            del self._consumer_ids[c.id]
            self._jindex.remove(c.id)
            return True

    def consumer_settle(
        self, acked: Sequence[tuple[int, Sequence[int]]], retried: Sequence[Retry] = ()
    ) -> None:
        with self._lock:
            self._check_open()
            for cid, positions in acked:
                c = self._consumer_ids.get(cid)
                if c is None:
                    continue
                for p in positions:
                    item = c.items.pop(p, None)
                    if item is not None:
                        c.bytes -= item.event.size
            for r in retried:
                c = self._consumer_ids.get(r.consumer_id)
                if c is None:
                    continue
                for p in r.positions:
                    item = c.items.get(p)
                    if item is not None:
                        c.items[p] = JournalItem(p, item.event, item.attempts + 1, r.not_before_ns)

    def consumers(self) -> list[ConsumerInfo]:
        with self._lock:
            self._check_open()
            return [self._consumers[n].info() for n in sorted(self._consumers)]

    def consumer_items(self, consumer_id: int, after_pos: int = 0, limit: int = 1000) -> list[JournalItem]:
        with self._lock:
            self._check_open()
            c = self._consumer_ids.get(consumer_id)
            if c is None or limit <= 0:
                return []
            # Positions were inserted ascending; a retried item keeps its place (dict assignment).
            out = []
            for p, item in c.items.items():
                if p > after_pos:
                    out.append(item)
                    if len(out) >= limit:
                        break
            return out

    def _trim_channel(self, ch: Epoch) -> None:
        pol = self._retention
        if pol.max_events and len(ch) > pol.max_events:
            ch.trim_to(ch.top - pol.max_events + 1)
        if pol.max_bytes and ch.held > pol.max_bytes:
            excess, n = ch.held - pol.max_bytes, 0
            while excess > 0:
                excess -= ch.sizes[n]
                n += 1
            ch.trim_to(ch.first + n)

    def _forget_idem(self, before: int) -> None:
        while self._idem:
            key, ev = next(iter(self._idem.items()))
            if ev.time_ns > before:
                break
            del self._idem[key]

    def _new_epoch(self, name: str) -> Epoch:
        old = self._channels.get(name)
        if old is not None and len(old):
            self._retired.setdefault(name, []).append(old)
        ch = self._channels[name] = self._epoch_row(name)
        return ch

    def _epoch_row(self, name: str) -> Epoch:
        """A new epoch with a new id (caller holds the lock)."""
        ch = Epoch(name, new_epoch(), self._next_id)
        self._next_id += 1
        return ch

    def reset_channel(self, channel: str) -> ChannelInfo:
        with self._lock:
            self._check_open()
            return self._info(channel, self._new_epoch(channel))

    def new_epochs_on_open(self) -> None:
        with self._lock:
            self._check_open()
            for name in list(self._channels):
                self._new_epoch(name)

    def commits_may_be_lost(self, channel: str, epoch: str) -> bool:
        return False

    def _all_epochs(self) -> Iterator[Epoch]:
        yield from self._channels.values()
        for old in self._retired.values():
            yield from old

    def _drop_empty_retired(self) -> None:
        for name in list(self._retired):
            kept = [ch for ch in self._retired[name] if len(ch)]
            if kept:
                self._retired[name] = kept
            else:
                del self._retired[name]

    def apply_retention(self, policy: RetentionPolicy, now_ns: int) -> int:
        with self._lock:
            self._check_open()
            removed = 0
            if policy.max_age_s:
                cutoff = now_ns - policy.max_age_s * _NS
                for ch in self._all_epochs():
                    n = ch.index_at_time(cutoff)
                    removed += ch.trim_to(ch.first + n)
            if policy.max_total_bytes:
                total = sum(ch.held for ch in self._all_epochs())
                if total > policy.max_total_bytes:
                    # The oldest events of the whole log by time: merge the epochs' (time-sorted) events.
                    cut: dict[int, tuple[Epoch, int]] = {}
                    streams = [ch.oldest_first() for ch in self._all_epochs()]
                    for _, ch, i in heapq.merge(*streams, key=lambda x: x[0]):
                        if total <= policy.max_total_bytes:
                            break
                        total -= ch.sizes[i]
                        cut[id(ch)] = (ch, i + 1)
                    for ch, n in cut.values():
                        removed += ch.trim_to(ch.first + n)
            self._drop_empty_retired()
            return removed

    def trim(self, channel: str, up_to_seq: int, *, epoch: str | None = None) -> ChannelInfo:
        with self._lock:
            self._check_open()
            ch = self._channels.get(channel)
            if epoch is not None and (ch is None or ch.epoch != epoch):
                current = ChannelInfo(channel, "", 0, 0, 0) if ch is None else self._info(channel, ch)
                ch = self._retired_epoch(channel, epoch)
                if ch is None:
                    raise TrimEpochGone(current, epoch)
            top = 0 if ch is None else ch.top
            if not 0 <= up_to_seq <= top:
                raise TrimOutOfRange(up_to_seq, top)
            if ch is None:
                return ChannelInfo(channel, "", 0, 0, 0)
            ch.trim_to(up_to_seq + 1)
            self._drop_empty_retired()
            return self._info(channel, ch)

    def _retired_epoch(self, channel: str, epoch: str) -> Epoch | None:
        return next((ch for ch in self._retired.get(channel, ()) if ch.epoch == epoch), None)

    def close(self) -> None:
        with self._lock:
            self._closed = True

    # -- state maps ----------------------------------------------------------------------------------

    def state_get(self, ns: str, key: str) -> tuple[str | None, int] | None:
        with self._lock:
            self._check_open()
            return self._state.get((ns, key))

    def state_list(self, ns: str, prefix: str = "") -> list[tuple[str, str]]:
        with self._lock:
            self._check_open()
            out: list[tuple[str, str]] = []
            for (n, k), (v, _) in self._state.items():
                if n == ns and v is not None and k.startswith(prefix):
                    out.append((k, v))
            return sorted(out)

    def state_write(self, ns: str, key: str, value: str | None, how: StateWrite) -> int | None:
        """Write the entry with the version ``how`` gives from its stored one (None: not written)."""
        with self._lock:
            self._check_open()
            had = self._state.get((ns, key))
            new = how.next(None if had is None else had[1])
            if new is not None:
                self._state[(ns, key)] = (value, new)
            return new

    # -- readers -------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("log store is closed")

    @staticmethod
    def _info(name: str, ch: Epoch) -> ChannelInfo:
        return ChannelInfo(name, ch.epoch, ch.first, ch.top, ch.top_time)

    def head(self, channel: str) -> ChannelInfo:
        with self._lock:
            self._check_open()
            ch = self._channels.get(channel)
            return ChannelInfo(channel, "", 0, 0, 0) if ch is None else self._info(channel, ch)

    def heads(self, channels: Iterable[str]) -> dict[str, ChannelInfo]:
        with self._lock:
            self._check_open()
            out: dict[str, ChannelInfo] = {}
            for name in channels:
                ch = self._channels.get(name)
                out[name] = ChannelInfo(name, "", 0, 0, 0) if ch is None else self._info(name, ch)
            return out

    def read(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        epoch: str | None = None,
    ) -> list[Event]:
        with self._lock:
            self._check_open()
            ch = self._channels.get(channel)
            if epoch is not None and (ch is None or ch.epoch != epoch):
                ch = self._retired_epoch(channel, epoch)
            if ch is None or limit <= 0:
                return []
            lo = max(after_seq + 1 - ch.first, 0)
            hi = len(ch)
            if from_time is not None:
                lo = max(lo, ch.index_at_time(from_time))
            if to_time is not None:
                hi = ch.index_at_time(to_time)
            return ch.events(lo, min(hi, lo + limit))

    def read_runs(
        self, channel: str, after_seq: int, up_to_seq: int, limit: int = 1000, *, max_bytes: int | None = None
    ) -> list[EventRun]:
        # Straight from the columns: an EventRun per stretch of shared fields, no Event per row.
        with self._lock:
            self._check_open()
            ch = self._channels.get(channel)
            if ch is None or up_to_seq <= after_seq or limit <= 0:
                return []
            lo = max(after_seq + 1 - ch.first, 0)
            hi = min(len(ch), up_to_seq + 1 - ch.first, lo + limit)
            if max_bytes is not None:
                size = 0
                for i in range(lo, hi):
                    size += len(ch.payloads[i])
                    if size >= max_bytes:
                        hi = i + 1
                        break
            return ch.runs(lo, hi)

    def read_rows(
        self,
        channel: str,
        after_seq: int = 0,
        limit: int = 1000,
        from_time: int | None = None,
        to_time: int | None = None,
        *,
        compact_text: bool = False,
        epoch: str | None = None,
    ) -> tuple[str, list[Row]]:
        # The interface's rows from events, under the lock: one snapshot.
        with self._lock:
            return super().read_rows(
                channel, after_seq, limit, from_time, to_time, compact_text=compact_text, epoch=epoch
            )

    def scan_plan(self, size: int, from_time: int | None = None, to_time: int | None = None) -> ScanPlan:
        size = max(size, 1)
        with self._lock:
            self._check_open()
            epochs = [ch for ch in self._all_epochs() if len(ch)]
            names = {id(ch): name for name, ch in self._channels.items()}
            names.update((id(ch), name) for name, old in self._retired.items() for ch in old)
            channels = {ch.id: self._info(names[id(ch)], ch) for ch in epochs}
            retired = frozenset(ch.id for old in self._retired.values() for ch in old)
            events = sum(map(len, epochs))
            nbytes = sum(ch.held for ch in epochs)
            # (pos, time) of every event, in pos order (which is time order).
            order = sorted(pt for ch in epochs for pt in zip(ch.pos, ch.times, strict=True))
            if not order:
                return ScanPlan((), 0, channels, events, nbytes, retired)
            max_time = order[-1][1]
            lo = 0 if from_time is None else bisect.bisect_left(order, from_time, key=lambda r: r[1])
            hi = len(order) if to_time is None else bisect.bisect_left(order, to_time, key=lambda r: r[1])
            if lo >= hi:
                return ScanPlan((), max_time, channels, events, nbytes, retired)
            splits = [order[i][0] for i in range(lo, hi, size)]
            splits.append(order[hi - 1][0] + 1)
            return ScanPlan(tuple(splits), max_time, channels, events, nbytes, retired)

    def scan_columns(
        self,
        lo_pos: int,
        hi_pos: int,
        *,
        max_time: int,
        bounds: Sequence[tuple[int, int, int]] | None = None,
    ) -> list[ScanColumns]:
        with self._lock:
            self._check_open()
            want = None if bounds is None else {cid: (lo, hi) for cid, lo, hi in bounds}
            picked: list[tuple[int, int, Event]] = []
            for ch in self._all_epochs():
                rng = (-1, -1) if want is None else want.get(ch.id)
                if rng is None:
                    continue
                for p, e in zip(ch.pos, ch.events(), strict=True):
                    if (
                        lo_pos <= p < hi_pos
                        and e.time_ns <= max_time
                        and (want is None or rng[0] <= e.seq <= rng[1])
                    ):
                        picked.append((p, ch.id, e))
        if not picked:
            return []
        picked.sort(key=lambda r: r[0])
        return [_columns([(cid, e) for _, cid, e in picked])]

    def log_mark(self) -> LogMark:
        with self._lock:
            self._check_open()
            return LogMark(self._next_pos - 1, self._last_time)

    def log_seek(self, time_ns: int) -> int:
        with self._lock:
            self._check_open()
            best = 0
            for ch in self._all_epochs():
                i = ch.index_at_time(time_ns)
                if i:
                    best = max(best, ch.pos[i - 1])
            return best

    def read_log(
        self,
        after_pos: int,
        mark: LogMark,
        limit: int = 1000,
        prefix: str = "",
        *,
        reverse: bool = False,
        max_bytes: int | None = None,
    ) -> LogPage:
        with self._lock:
            self._check_open()
            if limit <= 0:
                return LogPage([], after_pos)
            found: list[tuple[int, Event]] = []
            for name, ch in self._channels.items():
                if prefix and not name.startswith(prefix):
                    continue
                lo = bisect.bisect_right(ch.pos, after_pos)
                hi = bisect.bisect_right(ch.pos, mark.pos)
                while hi > lo and ch.times[hi - 1] > mark.time_ns:
                    hi -= 1
                if reverse:
                    lo = max(lo, hi - limit)
                else:
                    hi = min(hi, lo + limit)
                found.extend(zip(ch.pos[lo:hi], ch.events(lo, hi), strict=True))
            found.sort(key=lambda pe: pe[0], reverse=reverse)
            del found[limit:]
            full = False
            if max_bytes is not None:
                kept, full = take_upto([(p, e, e.payload) for p, e in found], max_bytes, 2)
                del found[len(kept) :]
            return LogPage([e for _, e in found], found[-1][0] if found else after_pos, full)

    def read_last(self, channel: str, n: int) -> list[Event]:
        with self._lock:
            self._check_open()
            ch = self._channels.get(channel)
            if ch is None or n <= 0:
                return []
            return ch.events(len(ch) - n)

    def channels(
        self, after: str = "", limit: int = 1000, prefix: str = "", *, include_empty: bool = False
    ) -> list[ChannelInfo]:
        with self._lock:
            self._check_open()
            if limit <= 0:
                return []
            # Python orders str by code point, which is the UTF-8 byte order for valid text.
            names = sorted(
                n
                for n, ch in self._channels.items()
                if (len(ch) or include_empty) and n > after and (not prefix or n.startswith(prefix))
            )
            return [self._info(n, self._channels[n]) for n in names[:limit]]

    def retired_epochs(self, channel: str) -> list[ChannelInfo]:
        with self._lock:
            self._check_open()
            return [self._info(channel, ch) for ch in self._retired.get(channel, ())]

    def top_time(self) -> int:
        with self._lock:
            self._check_open()
            return self._last_time

    def stats(self) -> StoreStats:
        with self._lock:
            self._check_open()
            live = [ch for ch in self._all_epochs() if len(ch)]
            return StoreStats(
                events=sum(map(len, live)),
                bytes=sum(ch.held for ch in live),
                channels=sum(1 for ch in self._channels.values() if len(ch)),
                retired_epochs=sum(len(old) for old in self._retired.values()),
            )


def _joined(values: Iterable[int]) -> str:
    return ",".join(map(str, values))


def _varlen(values: Sequence[bytes]) -> tuple[str, bytes]:
    return _joined(len(v) for v in values), b"".join(values)


def _columns(rows: Sequence[tuple[int, Event]]) -> ScanColumns:
    """:class:`ScanColumns` of events (with their epoch ids), in the order given."""
    texts = [
        (e.publisher.dialect, e.publisher.user, e.publisher.app, e.publisher.msg_id, e.content_type)
        for _, e in rows
    ]
    text: tuple[str, ...] | tuple[tuple[str, bytes], ...]
    if all(t == texts[0] for t in texts):
        text = texts[0]
    else:
        text = tuple(_varlen([t[i].encode() for t in texts]) for i in range(5))
    return ScanColumns(
        n=len(rows),
        channel_id=_joined(cid for cid, _ in rows),
        seq=_joined(e.seq for _, e in rows),
        time_ns=_joined(e.time_ns for _, e in rows),
        text=text,
        headers=_varlen([encode_headers(e.headers) for _, e in rows]),
        tags=_varlen([encode_tags(e.tags) for _, e in rows]),
        payload=_varlen([e.payload for _, e in rows]),
    )
