"""The memory store's columns (``hubbub.log.memory_epoch``): what it keeps per event, and events read back
across the stretches of shared fields, trimmed anywhere."""

from __future__ import annotations

import gc
import itertools

from hubbub.events import Event, Publisher
from hubbub.log import AppendRequest, MemoryLogStore, RetentionPolicy
from hubbub.log.base import AppendRun, runs_of


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


def test_retained_events_are_not_objects_the_collector_walks() -> None:
    # A store holding millions of events made every collection walk an Event per event. The columns keep
    # ints and bytes, and one entry per stretch of shared fields.
    store = MemoryLogStore()
    pub = Publisher("native", "u", "a")
    try:
        store.append([AppendRun("/warm", pub, "text/plain", [b"w"])])
        before = _tracked()
        for i in range(20):
            store.append([AppendRun("/c", pub, "text/plain", [b"%d" % j for j in range(500)])])
            store.append([AppendRequest("/c", pub, b"single %d" % i, "text/plain")])
        after = _tracked()
        assert store.head("/c").top == 20 * 501
        # 10,020 events kept; the objects they add are the channel's and its one stretch's.
        assert after - before < 50, after - before
    finally:
        store.close()


def _expected(n: int) -> list[tuple[Publisher, str, dict[str, str], tuple[str, ...], bytes]]:
    pubs = [Publisher("native", "u", "a"), Publisher("ivy", "v", "b")]
    out: list[tuple[Publisher, str, dict[str, str], tuple[str, ...], bytes]] = []
    for i in range(n):
        # Stretches of varying lengths: 1, 2, 3 ... events sharing publisher, type, headers and tags.
        k = next(j for j in itertools.count() if (j + 1) * (j + 2) // 2 > i)
        out.append(
            (
                pubs[k % 2],
                "text/plain" if k % 3 else "application/json",
                {"h": str(k)} if k % 4 == 1 else {},
                ("t",) if k % 5 == 2 else (),
                b"p%d" % i,
            )
        )
    return out


def test_events_read_back_across_stretches_and_trims() -> None:
    rows = _expected(120)
    for keep in (120, 119, 100, 57, 1):
        store = MemoryLogStore(retention=RetentionPolicy(max_events=keep))
        try:
            reqs = [AppendRequest("/c", pub, p, ct, hd, tg) for pub, ct, hd, tg, p in rows]
            results = store.append(reqs[:50]) + store.append(reqs[50:])
            first = 121 - keep
            want = [r.event for r in results][first - 1 :]
            got = store.read("/c", 0, 1000)
            assert [e.seq for e in got] == list(range(first, 121))
            assert got == want
            runs = store.read_runs("/c", 0, 120, 1000)
            assert [e for r in runs for e in r.events()] == want
            assert [(r.proto.seq, len(r.rows)) for r in runs] == [
                (r.proto.seq, len(r.rows)) for r in runs_of(want)
            ]
            # Every window of a read: bounds in seq and count land inside stretches as well as on them.
            for lo in range(first - 1, 121, 7):
                assert store.read("/c", lo, 5) == [e for e in want if e.seq > lo][:5]
                assert [e for r in store.read_runs("/c", lo, lo + 9, 4) for e in r.events()] == [
                    e for e in want if lo < e.seq <= lo + 9
                ][:4]
            assert store.read_last("/c", 3) == want[-3:]
        finally:
            store.close()


def test_a_channel_trimmed_empty_starts_a_fresh_stretch() -> None:
    store = MemoryLogStore()
    a, b = Publisher("native", "u", "a"), Publisher("native", "u", "b")
    try:
        store.append([AppendRun("/c", a, "text/plain", [b"1", b"2"])])
        store.trim("/c", 2)
        (r,) = store.append([AppendRequest("/c", b, b"3", "application/json", {"k": "v"}, ("t",))])
        got = store.read("/c")
        assert got == [r.event]
        assert got[0] == Event(
            "/c", 3, got[0].epoch, got[0].time_ns, b, b"3", "application/json", {"k": "v"}, ("t",)
        )
    finally:
        store.close()
