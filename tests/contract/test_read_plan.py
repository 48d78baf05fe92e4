"""The decisions of the log's reads (``hubbub.log.read_plan``), tested once for every engine.

Hypothesis compares each decision with a naive model over a plain list of rows: a page's seq range, its end
under a byte budget, a binary search over time, the grouping of rows into runs, a commit-order page under a
budget, the pieces of a bulk scan. The engines, which run these decisions over their own statements, are
checked against the memory reference in ``test_log_stores.py`` and ``test_read_runs.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hubbub.events import Event, Publisher
from hubbub.log import LogMark
from hubbub.log.read_plan import (
    MAX_INT64,
    budget_end,
    census,
    channel_runs,
    clamp,
    first_at_time,
    group_runs,
    log_scope,
    page_full,
    path_bounds,
    plan_scan,
    run_range,
    seq_range,
    take_upto,
    whole_run,
)
from tests.hypothesis_budget import examples

sizes = st.lists(st.integers(0, 50), min_size=1, max_size=30)


@given(
    after=st.integers(-5, 40),
    up_to=st.integers(-5, 40),
    limit=st.integers(1, 50),
    first=st.integers(1, 20),
    n=st.integers(0, 20),
)
@settings(max_examples=examples(300))
def test_run_range_is_the_naive_page(after: int, up_to: int, limit: int, first: int, n: int) -> None:
    top = first + n - 1
    want = [s for s in range(first, top + 1) if after < s <= up_to][:limit]
    got = run_range(after, up_to, limit, first, top)
    assert got == ((want[0], want[-1]) if want else None)


def test_bounds_past_int64_are_clamped() -> None:
    assert run_range(-(1 << 70), 1 << 70, 1 << 70, 1, 5) == (1, 5)
    assert run_range(1 << 70, 1 << 71, 10, 1, 5) is None
    assert seq_range(-(1 << 70), 3, 9) == (3, 9)


@given(sizes=sizes, max_bytes=st.integers(-3, 200))
@settings(max_examples=examples(300))
def test_budget_end_ends_with_the_row_that_reaches_it(sizes: list[int], max_bytes: int) -> None:
    lo = 10
    hi = lo + len(sizes) - 1
    budget = max(max_bytes, 1)

    def last_under(b: int) -> int | None:
        found = [lo + i for i in range(len(sizes)) if sum(sizes[:i]) < b]
        return max(found) if found else None

    end = budget_end(lo, hi, max_bytes, lambda: sum(sizes), last_under)
    kept = sizes[: end - lo + 1]
    # The naive page: rows until one brings the sum to the budget or more, or all of them.
    naive, total = [], 0
    for s in sizes:
        naive.append(s)
        total += s
        if total >= budget:
            break
    assert kept == naive or (sum(sizes) < budget and end == hi)


def test_budget_end_reads_the_last_row_only_over_budget() -> None:
    asked: list[int] = []

    def last_under(found: int | None) -> Callable[[int], int | None]:
        def ask(budget: int) -> int | None:
            asked.append(budget)
            return found

        return ask

    assert budget_end(1, 9, 100, lambda: 99, last_under(3)) == 9
    assert budget_end(1, 9, 100, lambda: None, last_under(3)) == 9
    assert asked == []
    assert budget_end(1, 9, 50, lambda: 100, last_under(3)) == 3
    assert budget_end(1, 9, 0, lambda: 5, last_under(None)) == 1
    # Exactly at the budget: the row that reaches it ends the page (empty payloads after it wait).
    assert budget_end(1, 9, 100, lambda: 100, last_under(7)) == 7
    assert asked == [50, 1, 100]


@given(sizes=sizes, max_bytes=st.integers(1, 200))
@settings(max_examples=examples(300))
def test_take_upto_stops_at_the_row_that_reaches_the_budget(sizes: list[int], max_bytes: int) -> None:
    rows = [(i, b"x" * s) for i, s in enumerate(sizes)]
    consumed: list[int] = []

    def cursor() -> Any:
        for r in rows:
            consumed.append(r[0])
            yield r

    kept, full = take_upto(cursor(), max_bytes, 1)
    running = [sum(sizes[: i + 1]) for i in range(len(sizes))]
    stop = next((i for i, t in enumerate(running) if t >= max_bytes), None)
    assert kept == (rows if stop is None else rows[: stop + 1])
    assert full is (stop is not None)
    assert consumed == [r[0] for r in kept]  # the cursor is not read past the page
    assert page_full((len(r[1]) for r in kept), max_bytes) is full
    assert page_full([10**9], None) is False


@given(
    times=st.lists(st.integers(0, 20), max_size=20, unique=True), t=st.integers(-1, 22), gap=st.integers(1, 3)
)
@settings(max_examples=examples(300))
def test_first_at_time_is_the_naive_search(times: list[int], t: int, gap: int) -> None:
    times.sort()
    keys = [1 + i * gap for i in range(len(times))]  # holes in the keys
    rows = list(zip(keys, times, strict=True))
    lo, hi = 1, keys[-1] if keys else 0

    def probe(k: int) -> tuple[int, int] | None:
        return next((r for r in rows if r[0] >= k), None)

    got = first_at_time(lo, hi, t, probe)
    # A boundary between the rows before ``t`` and the others (any key in a hole before the first of
    # those is one), and the first of those when there is no hole.
    want = next((k for k, tt in rows if tt >= t), hi + 1)
    assert lo <= got <= want
    assert all(tt < t for k, tt in rows if k < got)
    if gap == 1:
        assert got == want


def row(seq: int, pub: str = "p", payload: bytes = b"x", ctype: str = "t") -> tuple[Any, ...]:
    return (seq, seq * 10, "native", pub, "", "", ctype, b"", b"", payload)


def proto(r: tuple[Any, ...]) -> Event:
    return Event("/c", r[0], "e", r[1], Publisher(r[2], r[3], r[4], r[5]), r[9], r[6])


def test_group_runs_splits_on_a_column_or_a_hole() -> None:
    rows = [row(1), row(2), row(3, pub="q"), row(4, pub="q"), row(6, pub="q"), row(7, ctype="u")]
    runs = group_runs(rows, proto)
    assert [(r.proto.seq, [t for t, _ in r.rows]) for r in runs] == [
        (1, [10, 20]),
        (3, [30, 40]),
        (6, [60]),
        (7, [70]),
    ]
    assert whole_run(5, 9, 5) and not whole_run(5, 9, 4)


def test_log_scope_and_paths() -> None:
    mark = LogMark(10, 99)
    assert log_scope(10, mark) is None
    assert log_scope(11, mark) is None
    s = log_scope(3, mark, "/a/", from_time=5)
    assert s is not None
    assert (s.after_pos, s.pos, s.time_ns, s.from_time) == (3, 10, 99, 5)
    assert s.paths == ((">=", "/a/"), ("<", "/a0"))
    assert s.conditions() == [
        ("pos", ">", 3),
        ("pos", "<=", 10),
        ("time_ns", "<=", 99),
        ("time_ns", ">=", 5),
        ("path", ">=", "/a/"),
        ("path", "<", "/a0"),
    ]
    assert [c[:2] for c in s.conditions(from_time=False)][2:4] == [("time_ns", "<="), ("path", ">=")]
    assert s.values() == [c[2] for c in s.conditions()] and s.shape == (">=", "<")
    assert s.values(from_time=False) == [c[2] for c in s.conditions(from_time=False)]
    assert exact_shape(mark) == ("=",)
    exact = log_scope(-(1 << 70), mark, "/a/", channel="/a/b")
    assert exact is not None and exact.paths == (("=", "/a/b"),) and exact.after_pos == -(1 << 63)
    assert path_bounds("") == ()
    assert path_bounds("\U0010ffff") == ((">=", "\U0010ffff"),)


def test_census_rows() -> None:
    assert census([("/a", "e1", 3, 9), ("/b", "e2", 1, 1)]) == {"/a": ("e1", 3, 9), "/b": ("e2", 1, 1)}


@pytest.mark.parametrize(
    ("from_time", "to_time"), [(None, None), (25, None), (None, 45), (25, 45), (99, None)]
)
def test_plan_scan_pieces(from_time: int | None, to_time: int | None) -> None:
    pos = [2, 3, 5, 8, 9, 12]  # time_ns = pos * 5
    epochs = [(0, 1, "/a", "e", 1, 4, 40), (1, 2, "/a", "old", 1, 2, 10)]

    def pos_at_time(lo: int, hi: int, t: int) -> int:
        return first_at_time(lo, hi, t, lambda k: next(((p, p * 5) for p in pos if p >= k), None))

    def next_split(at: int) -> int | None:
        later = [p for p in pos if p >= at]
        return later[2] if len(later) > 2 else None

    plan = plan_scan(epochs, (6, 60), (2, 12, 60), from_time, to_time, pos_at_time, next_split)
    inside = [
        p for p in pos if (from_time is None or p * 5 >= from_time) and (to_time is None or p * 5 < to_time)
    ]
    assert plan.max_time == 60 and plan.events == 6 and plan.bytes == 60
    assert plan.retired == frozenset({2}) and set(plan.channels) == {1, 2}
    pieces = list(zip(plan.splits, plan.splits[1:], strict=False))
    assert [p for lo, hi in pieces for p in pos if lo <= p < hi] == inside
    empty = plan_scan(epochs, (0, 0), None, None, None, pos_at_time, next_split)
    assert empty.splits == () and empty.max_time == 0


def exact_shape(mark: LogMark) -> tuple[str, ...]:
    scope = log_scope(0, mark, channel="/a")
    assert scope is not None
    return scope.shape


def test_clamp() -> None:
    assert [clamp(n) for n in (0, -5, MAX_INT64, MAX_INT64 + 1, -(1 << 63), -(1 << 63) - 1)] == [
        0,
        -5,
        MAX_INT64,
        MAX_INT64,
        -(1 << 63),
        -(1 << 63),
    ]


class _Statements:
    """A channel's rows as an engine's statements (read_plan.SeqStatements, BudgetSums): ``rows`` and
    ``same_as`` are cursors that record each row they give (``pulled``); the payload sums record theirs."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.store = rows
        self.pulled: list[list[int]] = []  # the seqs each cursor gave
        self.summed = 0

    def _range(self, lo: int, hi: int) -> list[tuple[Any, ...]]:
        return [r for r in self.store if lo <= r[0] <= hi]

    def _cursor(self, rows: list[tuple[Any, ...]], part: Callable[[tuple[Any, ...]], Any]) -> Any:
        pulled: list[int] = []
        self.pulled.append(pulled)
        for r in rows:
            pulled.append(r[0])
            yield part(r)

    def epoch(self, channel: str, epoch: str | None) -> tuple[Any, ...]:
        return (1, "e", 1, len(self.store))

    def at_or_after(self, cid: int, seq: int) -> None:
        raise AssertionError("no time bound here")

    def rows(self, cid: int, lo: int, hi: int, limit: int) -> Any:
        return self._cursor(self._range(lo, hi)[:limit], lambda r: r)

    def compact_rows(self, cid: int, lo: int, hi: int, limit: int, first: Any) -> list[Any]:
        raise AssertionError("not a runs' statement")

    def row(self, cid: int, seq: int) -> tuple[Any, ...] | None:
        return next(iter(self._range(seq, seq)), None)

    def same_as(self, cid: int, lo: int, hi: int, head: Any) -> Any:
        same = [r for r in self._range(lo, hi) if r[2:9] == head[2:9]]
        return self._cursor(same, lambda r: (r[1], r[9]))

    def count_same(self, cid: int, lo: int, hi: int, head: Any) -> int:
        return sum(r[2:9] == head[2:9] for r in self._range(lo, hi))

    def payload_total(self, cid: int, lo: int, hi: int) -> int | None:
        rows = self._range(lo, hi)
        self.summed += len(rows)
        return sum(len(r[9]) for r in rows) if rows else None

    def last_under(self, cid: int, lo: int, hi: int, budget: int) -> int | None:
        rows = self._range(lo, hi)
        self.summed += len(rows)
        earlier, last = 0, None
        for r in rows:
            if earlier < budget:
                last = r[0]
            earlier += len(r[9])
        return last


@given(
    sizes=sizes,
    others=st.sets(st.integers(1, 30), max_size=3),
    after=st.integers(0, 30),
    limit=st.integers(1, 40),
    max_bytes=st.none() | st.integers(0, 300),
    ended_first=st.booleans(),
)
@settings(max_examples=examples(300))
# Exactly at the budget with an empty payload after the row that reaches it: ended first, the page held it.
@example(sizes=[17, 50, 50, 0], others=set(), after=0, limit=4, max_bytes=117, ended_first=True)
def test_channel_runs_under_a_budget_reads_each_row_once(
    sizes: list[int], others: set[int], after: int, limit: int, max_bytes: int | None, ended_first: bool
) -> None:
    """A page under a byte budget is the naive page (every seq, in order, each with its own payload and
    publisher). An engine whose cursors step the store (no ``sums``) ends it while reading: no payload sums,
    no row given past the page, none twice but where a page is not one run (read again whole); with
    ``sums`` (whole results) the page is ended first."""
    rows = [row(i, "q" if i in others else "p", b"x" * s) for i, s in enumerate(sizes, 1)]
    stmts = _Statements(rows)
    runs = channel_runs(
        stmts,
        "/c",
        after,
        len(rows),
        limit,
        max_bytes,
        lambda epoch, r: proto(r),
        sums=stmts if ended_first else None,
    )
    got = [(r.proto.seq + i, r.proto.publisher.user, t, p) for r in runs for i, (t, p) in enumerate(r.rows)]
    page, total = [], 0
    for r in rows[after : after + limit]:
        page.append((r[0], r[3], r[1], r[9]))
        total += len(r[9])
        if max_bytes is not None and total >= max(max_bytes, 1):
            break
    assert got == page
    seqs = [p[0] for p in page]
    if ended_first:
        assert all(set(pulled) <= set(seqs) for pulled in stmts.pulled)
        return
    assert stmts.summed == 0
    if max_bytes is not None:  # no cursor is read past the row that brings what it gave to the budget
        assert all(sum(sizes[s - 1] for s in pulled[:-1]) < max(max_bytes, 1) for pulled in stmts.pulled)
    if len(runs) == 1:
        assert stmts.pulled == [seqs]  # a run: each row once
