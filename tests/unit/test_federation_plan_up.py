"""A federation link's replay plan (``plan_cursor`` of a ``CursorResume``): what the up session and the node
above's recovering subscriptions replay, read page by page in commit order, with gaps reported and passed."""

from __future__ import annotations

from typing import Any

from hubbub.channels import parse_pattern
from hubbub.core.replay import ScanCursor, scan_page
from hubbub.core.replay_plans import plan_cursor
from hubbub.events import Event, Position, Publisher
from hubbub.log import AppendRequest, MemoryLogStore

PUB = Publisher("native", "", "t", "")
ALL = parse_pattern("/**")


class Counting(MemoryLogStore):
    """A memory store that counts the channel listings and event reads planning makes."""

    def __init__(self) -> None:
        super().__init__()
        self.listed = 0
        self.read_events = 0

    def channels(self, *args: Any, **kw: Any) -> Any:
        self.listed += 1
        return super().channels(*args, **kw)

    def read(self, *args: Any, **kw: Any) -> list[Event]:
        out = super().read(*args, **kw)
        self.read_events += len(out)
        return out


def fill(store: MemoryLogStore, channels: int, rounds: int) -> list[Event]:
    out: list[Event] = []
    for r in range(rounds):
        reqs = [AppendRequest(f"/f/c{i:05d}", PUB, str(r).encode(), "text/plain") for i in range(channels)]
        out += [res.event for res in store.append(reqs)]
    return out


def scanned(store: MemoryLogStore, plan: Any) -> list[Event]:
    """Every event the plan's scan sends, page by page."""
    assert plan.scan is not None
    cur = ScanCursor(plan.scan.after, dict(plan.scan.since))
    out: list[Event] = []
    while not cur.done:
        out += scan_page(store, ALL, plan.scan, cur)
    assert not cur.broken
    return out


def test_a_link_plan_reads_no_event_and_lists_no_channel_whatever_the_backlog() -> None:
    """5,000 channels, 15,000 events after the link's positions in two of them: planning reads the heads of
    those two and a seek, nothing else; the scan then sends all 15,000 (more than the 10,000 a replay once
    held in memory) in commit order, in one replay."""
    store = Counting()
    firsts = fill(store, 5000, 1)
    later = fill(store, 5000, 3)
    since = {e.channel: Position(e.seq, e.epoch) for e in firsts[:2]}
    store.listed = store.read_events = 0
    plan = plan_cursor(store, ALL, since, firsts[-1].time_ns + 1)
    assert store.listed == 0
    assert store.read_events <= 2  # the next event of each listed channel: where reading starts
    assert plan.events == [] and plan.gaps == []
    got = scanned(store, plan)
    assert [(e.channel, e.seq) for e in got] == [(e.channel, e.seq) for e in later]


def test_a_link_plan_reports_a_trimmed_position_and_goes_on_from_the_log() -> None:
    """A channel trimmed past the link's position is a gap, and its retained events still go: the link
    passes the hole (counted, logged) and loses nothing else."""
    store = MemoryLogStore()
    evs = fill(store, 2, 6)
    a = [e for e in evs if e.channel == "/f/c00000"]
    store.trim("/f/c00000", a[2].seq)  # the first three are gone
    plan = plan_cursor(store, ALL, {"/f/c00000": Position(1, a[0].epoch)}, None)
    assert [(g.channel, g.reason, g.position.seq) for g in plan.gaps] == [("/f/c00000", "trimmed", 3)]
    assert [(e.channel, e.seq) for e in scanned(store, plan)] == [("/f/c00000", s) for s in (4, 5, 6)]
