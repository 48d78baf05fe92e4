"""Guble's fetch selection (core/replay_plans.py ``plan_fetch`` of a ``SubtreeFetch``: a counted scan of the
log) against a naive selection over the memory log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.core import replay_plans
from hubbub.core.replay import ReplayPlan, ScanCursor, scan_page
from hubbub.core.replay_plans import plan_fetch
from hubbub.dialects import guble_fetch as gf
from hubbub.events import Event, Publisher
from hubbub.log import RetentionPolicy, SqliteLogStore, open_store
from hubbub.log.base import AppendRequest, EventRun, LogStore
from hubbub.selection import SubtreeFetch
from tests.hypothesis_budget import examples

CHANNELS = ["/a", "/a/x", "/a/y/z", "/b"]


def every(e: Event) -> bool:
    return True


def guble_fetch(
    store: LogStore, channel: str, start_id: int | None, max_count: int | None, keep: Callable[[Event], bool]
) -> ReplayPlan:
    """The plan of guble's ``+ <channel> <start_id> <max_count>`` (a receiver's pattern is the subtree)."""
    return plan_fetch(store, gf.subtree_pattern(channel), SubtreeFetch(channel, start_id, max_count), keep)


def fetched(
    store: LogStore, channel: str, plan: ReplayPlan, keep: Callable[[Event], bool] = every
) -> list[Event]:
    """The events a fetch's plan sends, read as the node sends them (its scan, page by page), checked to be
    exactly as many as it counted (the ``#fetch-start`` count)."""
    scan = plan.scan
    if scan is None:
        return []
    pattern = gf.subtree_pattern(channel)
    cur = ScanCursor(scan.after, dict(scan.since))
    out: list[Event] = []
    while not cur.done and len(out) < (scan.limit or 0):
        out += [e for e in scan_page(store, pattern, scan, cur) if keep(e)]
    assert not cur.broken and len(out) >= (scan.limit or 0)
    return out[: scan.limit]


def naive(
    events: list[Event], channel: str, start_id: int | None, max_count: int | None, keep_odd: bool, cap: int
) -> list[Event]:
    sub = gf.subtree_pattern(channel)
    kept = sorted(
        (e for e in events if sub.matches(e.channel) and (not keep_odd or e.seq % 2 == 1)), key=gf.merged_key
    )
    limit = cap if not max_count else min(max_count, cap)
    if not start_id:
        return kept[:limit]
    if start_id > 0:
        first = next((e for e in kept if e.channel == channel and e.seq >= start_id), None)
        if first is None:
            return []
        rest = [
            e
            for e in kept
            if (e.channel == channel and e.seq >= first.seq)
            or (e.channel != channel and e.time_ns >= first.time_ns)
        ]
        return rest[:limit]
    k = min(max_count if max_count else -start_id, cap)
    return kept[-k:]


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.sampled_from(CHANNELS), min_size=0, max_size=60),
    st.sampled_from(["/", "/a", "/a/x", "/b"]),
    st.integers(-8, 12),
    st.one_of(st.none(), st.integers(1, 10)),
    st.booleans(),
)
def test_selection_matches_the_naive_one(
    publishes: list[str], channel: str, start_id: int, max_count: int | None, odd: bool
) -> None:
    store = open_store("memory", "", "none", RetentionPolicy(), 600)
    try:
        for i, ch in enumerate(publishes):
            store.append([AppendRequest(ch, Publisher("guble"), str(i).encode(), "text/plain")])
        events = [e for ch in CHANNELS for e in store.read(ch, 0, 1000)]

        def keep(e: Event) -> bool:
            return not odd or e.seq % 2 == 1

        got = fetched(store, channel, guble_fetch(store, channel, start_id, max_count, keep), keep)
        assert got == naive(events, channel, start_id, max_count, odd, 10**9)
    finally:
        store.close()


def test_the_start_lookup_reads_the_channel_in_pages_bounded_in_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``+ <path> <startId>`` looks for its start on the channel a page at a time, each page bounded in
    payload bytes (``FETCH_PAGE_BYTES``) as well as in events: past many large events it holds a few of them
    at a time, not ``FETCH_PAGE``; the fetch still starts at the first event it keeps."""
    monkeypatch.setattr(replay_plans, "FETCH_PAGE_BYTES", 4096, raising=False)
    store = SqliteLogStore(tmp_path / "log.db")
    try:
        pub = Publisher("guble", "u", "", "")
        store.append(
            [AppendRequest("/a", pub, b"%04d" % i + bytes(1020), "text/plain") for i in range(1, 51)]
        )
        pages: list[int] = []
        real_read, real_runs = store.read, store.read_runs

        def read(*args: Any, **kwargs: Any) -> list[Event]:
            events = real_read(*args, **kwargs)
            pages.append(sum(len(e.payload) for e in events))
            return events

        def read_runs(*args: Any, **kwargs: Any) -> list[EventRun]:
            runs = real_runs(*args, **kwargs)
            pages.append(sum(len(payload) for r in runs for _, payload in r.rows))
            return runs

        monkeypatch.setattr(store, "read", read)
        monkeypatch.setattr(store, "read_runs", read_runs)

        def keep(e: Event) -> bool:
            return e.seq >= 40

        got = fetched(store, "/a", guble_fetch(store, "/a", 3, None, keep), keep)
        assert [(e.seq, e.payload[:4]) for e in got] == [(i, b"%04d" % i) for i in range(40, 51)]
        assert len(pages) >= 10 and max(pages) <= 4096, pages
    finally:
        store.close()


def test_subtree_of_the_root_matches_everything() -> None:
    assert gf.subtree_pattern("/").matches("/a/b")
    assert gf.subtree_pattern("/a").matches("/a") and gf.subtree_pattern("/a").matches("/a/b/c")
    assert not gf.subtree_pattern("/a").matches("/ab")


def test_live_mark_counts_written_live_events_only() -> None:
    mark = gf.LiveMark()
    mark.queued(10, True)
    mark.queued(20, False)  # a fetch's replayed event: not live
    mark.queued(30, True)
    mark.written([b"#subscribed-to /a", b"/a,1,..."])
    assert mark.last_live_ns == 10
    mark.written([b"/a,2,...", b"/a,3,..."])
    assert mark.last_live_ns == 30
    mark.queued(40, True)
    assert mark.dropped() == 30  # the dropped event at 40 was never written
    mark.written([b"/a,5,..."])  # nothing queued any more: nothing matched
    assert mark.last_live_ns == 30


def test_catch_up_steps_put_ancestors_first_and_cover_their_subtrees() -> None:
    steps = gf.catch_up_steps([("/a/b", 5), ("/c", 500), ("/a", 7)], 100)
    assert [s.channel for s in steps] == ["/c", "/a", "/a/b"]
    assert [s.covered for s in steps] == [False, False, True]
    # From just after the last live event, or from a later registration.
    assert [s.from_time for s in steps] == [500, 101, 101]
