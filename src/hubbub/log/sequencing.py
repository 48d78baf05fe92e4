"""The sequencing rules of an append, decided once for every engine: :func:`plan_append`.

An append gives each request of a batch a position or answers it as a duplicate. The rules (``base.py``):

* Per channel and epoch, ``seq`` goes on from the channel's top (1 for a channel without a head) by exactly
  1 per appended event, in request order.
* One batch reads the clock once (``now``); its appended events get times ``max(now, last + 1)``, ``+ 1``,
  … in request order, so ``time_ns`` strictly increases over the whole log.
* A request with an idempotency key (``idem``) whose ``(user, channel, idem)`` was appended within the
  window, judged at the time the request would get, is not appended: it answers the event that key first
  appended. That event is the batch's own (an earlier request of the batch with the same key) or, failing
  that, the one the engine has on record (``originals``: its time). A batch's own event wins over a record,
  since it is newer.

A run (:class:`~hubbub.log.base.AppendRun`, in the batch of an engine that takes them) stands for its
requests, one per payload, none with a key: it is planned as they would be, as one entry (its first event's
seq and time; :attr:`AppendPlan.spans`).

:func:`plan_append` is pure: it reads the heads and records the engine hands it and returns an
:class:`AppendPlan`; each engine then writes the plan in its own statements (and gives a channel without a
head its epoch and id). The contract suite tests it once against a naive model, and every engine against the
memory reference.

Concurrency: none (no state). Engines call it on their writer thread, or on the event loop for an inline
append (``LogStore.inline_append``): it is part of the hot path, so it is a plain loop over locals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from hubbub.events import Event, hot_value
from hubbub.log.base import AppendRequest, AppendRun

__all__ = ["FROM_RECORD", "AppendPlan", "IdemKey", "plan_append", "rebuilt_original"]

#: An idempotency key as the rules compare it: ``(user, channel, idem)``.
IdemKey = tuple[str, str, str]

#: In :attr:`AppendPlan.dups`: the request repeats a key on record (``originals``), not one of the batch.
FROM_RECORD: Final = -1


def rebuilt_original(req: AppendRequest, channel: str, seq: int, epoch: str, time_ns: int) -> Event:
    """The event a key on record (:data:`FROM_RECORD`) first appended at ``seq`` of ``epoch``, rebuilt from
    its repeat ``req`` by an engine whose row of it was trimmed since: same key, so the same event."""
    return Event(
        channel,
        seq,
        epoch,
        time_ns,
        req.publisher,
        req.payload,
        req.content_type,
        dict(req.headers),
        tuple(req.tags),
    )


class _Head(Protocol):
    """What the planner reads of an engine's channel head: its current epoch's top seq."""

    @property
    def top(self) -> int: ...


# Built once per append (inline on the event loop for a small one): a frozen dataclass's __init__ would cost
# a descriptor call per field (see hot_value).
@hot_value
class AppendPlan:
    """What an append of a batch does, per request ``i`` of it.

    ``seqs[i]`` and ``times[i]``: the request's seq and ``time_ns``, both 0 for a duplicate. ``dups``: the
    duplicates in request order, request index -> the index of the earlier request of the batch whose event
    it repeats, or :data:`FROM_RECORD` for a key on record (the engine answers with that key's original
    event). ``tops``:
    every channel of the batch (first appearance order) -> its top seq after the batch (unchanged for one
    that only got duplicates). ``created``: the channels of the batch without a head (first appearance
    order): each gets a new epoch and ``seq`` from 1. ``keys``: the idempotency keys to record, in time
    order, each -> ``(index, time_ns)`` of the request that appended it (the batch's last with that key).
    ``last_time``: the log's newest commit time after the batch (unchanged when nothing is appended).
    ``spans``: each :class:`~hubbub.log.base.AppendRun` of the batch (an engine's that ``takes_runs``),
    index -> its number of events; ``seqs[i]`` and ``times[i]`` are its first event's, its others' follow
    by 1 (empty without runs). Indexes are the batch's: :meth:`result_index` maps them to the results'."""

    seqs: list[int]
    times: list[int]
    dups: dict[int, int]
    tops: dict[str, int]
    created: list[str]
    keys: dict[IdemKey, tuple[int, int]]
    last_time: int
    spans: dict[int, int]

    def result_index(self, i: int) -> int:
        """Where request ``i``'s result is in the append's results (one per event: a run before it moves it
        by its events but one). For the sources of ``dups`` and the requests of ``keys``."""
        spans = self.spans
        return i + sum(k - 1 for at, k in spans.items() if at < i) if spans else i


def _plan_one(req: AppendRequest | AppendRun, heads: Mapping[str, _Head], t0: int) -> AppendPlan:
    """The plan of a batch of one publish or one run with no key to judge (each append at a light load, one
    event per commit): what :func:`plan_append`'s loop makes of it, without the loop's set-up, which such a
    batch pays for alone (``tests/contract/test_append_plan.py`` checks both against the model)."""
    channel = req.channel
    h = heads.get(channel)
    top = 0 if h is None else h.top
    if isinstance(req, AppendRun):
        k = len(req.payloads)
        spans = {0: k}
    else:
        k, spans = 1, {}
    created = [channel] if h is None else []
    return AppendPlan([top + 1], [t0], {}, {channel: top + k}, created, {}, t0 + k - 1, spans)


def plan_append(
    batch: Sequence[AppendRequest | AppendRun],
    heads: Mapping[str, _Head],
    last_time: int,
    now: int,
    window: int,
    originals: Mapping[IdemKey, int],
) -> AppendPlan:
    """Plan the append of ``batch`` (see the module docstring).

    ``heads``: the current head of (at least) every channel of the batch that has one. ``last_time``: the
    log's newest commit time. ``now``: the clock, read once for the batch. ``window``: the idempotency
    window in ns (0: idempotency off). ``originals``: the time of each key on record for the batch's keyed
    requests (a key without a record is absent; expired ones may be present: the window is applied here)."""
    # New events get consecutive times from ``t0``, so no clock per request: the times are one range, with
    # a 0 for each duplicate when there are any.
    t0 = now if now > last_time else last_time + 1
    if len(batch) == 1:
        only = batch[0]
        if isinstance(only, AppendRun) or not (window and only.idem):
            return _plan_one(only, heads, t0)
    seqs: list[int] = []
    add_seq = seqs.append
    dups: dict[int, int] = {}
    tops: dict[str, int] = {}
    created: list[str] = []
    keys: dict[IdemKey, tuple[int, int]] = {}
    spans: dict[int, int] = {}
    # Events of the runs before the current request beyond one each (the requests' times are one range from
    # ``t0``, shifted by this).
    extra = 0
    # The previous request's channel and its running top: a batch is mostly runs of one channel's publishes.
    name: str | None = None
    top = 0
    for req in batch:
        channel = req.channel
        if channel != name:
            if name is not None:
                tops[name] = top
            name = channel
            known = tops.get(name)
            if known is not None:
                top = known
            else:
                h = heads.get(name)
                if h is None:
                    created.append(name)
                    top = 0
                else:
                    top = h.top
        if type(req) is AppendRun:
            # No key: every event is appended. Its entry holds the first one's seq.
            k = len(req.payloads)
            spans[len(seqs)] = k
            add_seq(top + 1)
            top += k
            extra += k - 1
            continue
        if window and req.idem:
            i = len(seqs)
            t_next = t0 + i - len(dups) + extra  # the time this request gets if it is appended
            key = (req.publisher.user, channel, req.idem)
            own = keys.get(key)
            if own is not None:
                # The batch's own event with this key is newer than any record: only it may answer.
                if t_next - own[1] < window:
                    dups[i] = own[0]
                    add_seq(0)
                    continue
                # Expired within the batch: recorded again below, so that ``keys`` stays in time order.
                del keys[key]
            else:
                found = originals.get(key)
                if found is not None and t_next - found < window:
                    dups[i] = FROM_RECORD
                    add_seq(0)
                    continue
            keys[key] = (i, t_next)
        top += 1
        add_seq(top)
    if name is not None:
        tops[name] = top
    n = len(seqs) - len(dups) + extra
    if spans:
        times = []
        t = t0
        for i, seq in enumerate(seqs):
            if seq:
                times.append(t)
                t += spans.get(i, 1)
            else:
                times.append(0)
    else:
        times = list(range(t0, t0 + n))
        if dups:
            new = iter(times)
            times = [next(new) if seq else 0 for seq in seqs]
    return AppendPlan(seqs, times, dups, tops, created, keys, t0 + n - 1 if n else last_time, spans)
