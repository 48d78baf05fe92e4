"""The sequencing rules of an append (``hubbub.log.sequencing.plan_append``), tested once for every engine.

Hypothesis compares the planner with a naive model that walks the batch one request at a time over a plain
dict of every key it knows (those on record, overwritten by the batch's own), so that neither the planner's
"previous channel" cache nor its split between the batch's keys and the record can hide a mistake. The
engines are then checked against the memory reference in ``test_log_stores.py`` (every test runs against
each engine) and ``tests/property/test_log_state_machine.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.events import Publisher
from hubbub.log import AppendRequest, AppendRun
from hubbub.log.sequencing import FROM_RECORD, AppendPlan, IdemKey, plan_append
from tests.hypothesis_budget import examples

CHANNELS = ["/a", "/b", "/a/b", "/c"]
USERS = ["u1", "u2"]
KEYS = ["", "", "k1", "k2", "k3"]


@dataclass
class Head:
    top: int


def request(channel: str, user: str = "u1", idem: str = "") -> AppendRequest:
    return AppendRequest(channel, Publisher("native", user, "app", idem), b"x", "text/plain", idem=idem)


def naive(
    batch: Sequence[AppendRequest],
    heads: Mapping[str, Head],
    last_time: int,
    now: int,
    window: int,
    originals: Mapping[IdemKey, int],
) -> tuple[list[Any], dict[str, int], list[str], dict[IdemKey, tuple[int, int]], int]:
    """Per request ``("new", seq, time)`` or ``("dup", source)``; the tops, created channels, recorded keys
    and last time; one request at a time, every key in one dict."""
    t = last_time
    tops = {ch: h.top for ch, h in heads.items()}
    known: dict[IdemKey, tuple[int, int]] = {k: (FROM_RECORD, v) for k, v in originals.items()}
    out: list[Any] = []
    seen: dict[str, int] = {}
    created: list[str] = []
    recorded: dict[IdemKey, tuple[int, int]] = {}
    for i, r in enumerate(batch):
        if r.channel not in seen:
            if r.channel not in tops:
                created.append(r.channel)
            seen[r.channel] = tops.get(r.channel, 0)
        t_next = max(now, t + 1)
        key = (r.publisher.user, r.channel, r.idem)
        if r.idem and window and key in known and t_next - known[key][1] < window:
            out.append(("dup", known[key][0]))
            continue
        t = t_next
        seen[r.channel] += 1
        out.append(("new", seen[r.channel], t))
        if r.idem and window:
            known[key] = (i, t)
            recorded.pop(key, None)
            recorded[key] = (i, t)
    return out, seen, created, recorded, t


def outcomes(plan: AppendPlan) -> list[Any]:
    return [
        ("dup", plan.dups[i]) if seq == 0 else ("new", seq, t)
        for i, (seq, t) in enumerate(zip(plan.seqs, plan.times, strict=True))
    ]


@st.composite
def cases(draw: st.DrawFn) -> tuple[Any, ...]:
    batch = draw(
        st.lists(
            st.builds(request, st.sampled_from(CHANNELS), st.sampled_from(USERS), st.sampled_from(KEYS)),
            max_size=30,
        )
    )
    heads = {
        ch: Head(draw(st.integers(0, 5)))
        for ch in draw(st.sets(st.sampled_from(CHANNELS), max_size=len(CHANNELS)))
    }
    last_time = draw(st.integers(0, 100))
    # The clock may be ahead of the log, at it, or behind it (a wall clock stepped back).
    now = last_time + draw(st.integers(-20, 20))
    window = draw(st.sampled_from([0, 1, 3, 10, 1000]))
    # Keys on record: mostly the batch's own (what a retry repeats), at times around the window's edge.
    batch_keys = [(r.publisher.user, r.channel, r.idem) for r in batch if r.idem]
    other = st.tuples(st.sampled_from(USERS), st.sampled_from(CHANNELS), st.sampled_from(KEYS[2:]))
    on_record = draw(
        st.dictionaries(
            st.sampled_from(batch_keys) | other if batch_keys else other,
            st.integers(max(last_time - 2 * min(window, 15), 0), last_time),
            max_size=6,
        )
    )
    return batch, heads, last_time, now, window, on_record


@settings(max_examples=examples(500))
@given(cases())
def test_plan_matches_the_naive_model(case: tuple[Any, ...]) -> None:
    plan = plan_append(*case)
    out, tops, created, recorded, last_time = naive(*case)
    assert outcomes(plan) == out
    assert plan.tops == tops
    assert list(plan.tops) == list(tops)  # first appearance order
    assert plan.created == created
    assert plan.keys == recorded
    assert list(plan.keys) == list(recorded)  # time order
    assert plan.last_time == last_time
    assert list(plan.dups) == sorted(plan.dups)  # request order: engines take them as they come


@settings(max_examples=examples(200))
@given(cases())
def test_plan_invariants(case: tuple[Any, ...]) -> None:
    """The rules of ``base.py`` stated directly: consecutive seqs per channel, strictly increasing times
    from ``max(now, last + 1)``, and a duplicate only of an appended request with the same key."""
    batch, heads, last_time, now, window, _ = case
    plan = plan_append(*case)
    tops = {ch: h.top for ch, h in heads.items()}
    times = [t for s, t in zip(plan.seqs, plan.times, strict=True) if s]
    assert times == list(range(max(now, last_time + 1), max(now, last_time + 1) + len(times)))
    for i, r in enumerate(batch):
        if plan.seqs[i]:
            tops[r.channel] = tops.get(r.channel, 0) + 1
            assert plan.seqs[i] == tops[r.channel]
        else:
            assert r.idem and window
            src = plan.dups[i]
            if src != FROM_RECORD:
                assert src < i and plan.seqs[src]
                assert (batch[src].publisher.user, batch[src].channel, batch[src].idem) == (
                    r.publisher.user,
                    r.channel,
                    r.idem,
                )


@settings(max_examples=examples(300))
@given(cases(), st.data())
def test_a_run_plans_as_the_requests_it_stands_for(case: tuple[Any, ...], data: st.DataObject) -> None:
    """A batch with runs (``AppendRun``, an engine's that takes them) is planned as the batch with each run
    expanded into its requests: each run's entry holds its first event's seq and time, the others follow
    by 1; duplicates, keys (their times judged after the runs' events) and tops are the expanded batch's,
    with the indexes mapped by ``result_index``."""
    batch, *rest = case
    runs = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, len(batch)),
                st.sampled_from(CHANNELS),
                st.sampled_from(USERS),
                st.integers(1, 5),
            ),
            max_size=4,
        )
    )
    mixed: list[AppendRequest | AppendRun] = list(batch)
    for at, channel, user, k in sorted(runs, reverse=True):
        pub = Publisher("native", user, "app", "")
        mixed.insert(at, AppendRun(channel, pub, "text/plain", [b"x"] * k))
    flat = [r for e in mixed for r in (e.requests() if isinstance(e, AppendRun) else [e])]
    plan, ref = plan_append(mixed, *rest), plan_append(flat, *rest)
    firsts = [plan.result_index(i) for i in range(len(mixed))]
    assert firsts == [
        sum(len(e.payloads) if isinstance(e, AppendRun) else 1 for e in mixed[:i]) for i in range(len(mixed))
    ]
    seqs: list[int] = []
    times: list[int] = []
    for i, e in enumerate(mixed):
        k = plan.spans.get(i, 1)
        assert k == (len(e.payloads) if isinstance(e, AppendRun) else 1)
        seqs += [plan.seqs[i] + j if plan.seqs[i] else 0 for j in range(k)]
        times += [plan.times[i] + j if plan.seqs[i] else 0 for j in range(k)]
    assert (seqs, times) == (ref.seqs, ref.times)
    assert {firsts[i]: firsts[s] if s != FROM_RECORD else s for i, s in plan.dups.items()} == ref.dups
    assert {key: (firsts[i], t) for key, (i, t) in plan.keys.items()} == ref.keys
    assert (plan.tops, plan.created, plan.last_time) == (ref.tops, ref.created, ref.last_time)


def test_a_repeat_inside_the_batch_answers_the_batchs_own_event_not_the_record() -> None:
    key = ("u1", "/a", "k1")
    batch = [request("/a", "u1", "k1"), request("/a", "u1", "k1")]
    # The record expired: the first request appends, the second repeats it.
    plan = plan_append(batch, {"/a": Head(4)}, 100, 100, 10, {key: 80})
    assert plan.seqs == [5, 0] and plan.dups == {1: 0} and plan.keys == {key: (0, 101)}
    # The record is in the window: both answer it.
    plan = plan_append(batch, {"/a": Head(4)}, 100, 100, 10, {key: 95})
    assert plan.seqs == [0, 0] and plan.dups == {0: FROM_RECORD, 1: FROM_RECORD} and plan.keys == {}
    assert plan.last_time == 100 and plan.tops == {"/a": 4}


def test_no_window_no_duplicates_and_new_channels_start_at_one() -> None:
    batch = [request("/n", "u1", "k1"), request("/a", "u1", "k1"), request("/n", "u1", "k1")]
    plan = plan_append(batch, {"/a": Head(7)}, 50, 10, 0, {("u1", "/n", "k1"): 49})
    assert plan.seqs == [1, 8, 2] and plan.times == [51, 52, 53] and plan.dups == {}
    assert plan.created == ["/n"] and plan.tops == {"/n": 2, "/a": 8} and plan.keys == {}
