"""SQLite's journal (items refer to their events while the log holds them, copied when the log drops them;
an acknowledged run moves ``acked_to`` and its rows are swept later) against the memory engine's (copies from
the start), as a hypothesis state machine.

Both stores get the same appends (some with idempotency keys that repeat) on channels that two consumers match
(one of them a subset of the other's),
acks of any positions (runs, gaps, already acknowledged ones), retries, every path that deletes events (a
per-channel limit of events and of bytes at each append, ``trim`` of the current and of a retired epoch, age
and total-size retention, a channel's
reset between) and, for SQLite, reopens. After every step each consumer's items read the same on both:
positions, attempts, and the whole event but for the epoch's name (random per store), which must map one to
one between them; and the consumers' counts agree.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hubbub.events import Publisher
from hubbub.log import AppendRequest, LogStore, MemoryLogStore, RetentionPolicy, SqliteLogStore
from hubbub.log.consumers import ConsumerSpec, Retry
from tests.contract.test_log_stores import Clock
from tests.hypothesis_budget import examples

CHANNELS = ("/a/x", "/a/y", "/a/z/q", "/b")
RETENTION = RetentionPolicy(max_events=6, max_bytes=40)
SPECS = (ConsumerSpec("all", "/a/**"), ConsumerSpec("x", "/a/x"))


class JournalEngines(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.path = Path(self.tmp.name) / "log.db"
        self.clock = Clock()
        self.mem = MemoryLogStore(retention=RETENTION, clock=self.clock)
        self.sql: LogStore = self._open()
        self.ids: list[tuple[int, int]] = []  # (memory id, sqlite id) per consumer
        for spec in SPECS:
            self.ids.append((self.mem.consumer_create(spec)[0].id, self.sql.consumer_create(spec)[0].id))
        self.made = 0

    def _open(self) -> SqliteLogStore:
        return SqliteLogStore(self.path, durability="commit", retention=RETENTION, clock=self.clock)

    def teardown(self) -> None:
        self.mem.close()
        self.sql.close()
        self.tmp.cleanup()

    def both(self, fn: Any) -> None:
        fn(self.mem, 0)
        fn(self.sql, 1)

    # -- rules ----------------------------------------------------------------------------------------

    @rule(
        channel=st.sampled_from(CHANNELS),
        n=st.integers(1, 9),
        headers=st.booleans(),
        keys=st.lists(st.sampled_from(("", "", "k1", "k2", "k3")), min_size=9, max_size=9),
    )
    def append(self, channel: str, n: int, headers: bool, keys: list[str]) -> None:
        """``n`` events, some with an idempotency key from a small pool (repeats are duplicates)."""
        reqs = []
        for key in keys[:n]:
            self.made += 1
            reqs.append(
                AppendRequest(
                    channel,
                    Publisher("native", "u", "app", key),
                    b"p%d" % self.made,
                    "text/plain",
                    {"n": str(self.made)} if headers else {},
                    (f"t{self.made % 3}",),
                    idem=key,
                )
            )
        self.clock.advance(1)
        self.both(lambda s, _: s.append(reqs))

    @rule(which=st.integers(0, 1), data=st.data())
    def ack(self, which: int, data: st.DataObject) -> None:
        live = [i.pos for i in self.mem.consumer_items(self.ids[which][0], limit=10**6)]
        top = self.mem.consumers()[0].top if live else 0
        if data.draw(st.booleans()) and live:  # the lowest run, as a consumer acknowledges a batch
            positions = live[: data.draw(st.integers(1, len(live)))]
        else:
            positions = data.draw(st.lists(st.integers(1, max(top, 1) + 3), max_size=12))
        self.both(lambda s, k: s.consumer_settle([(self.ids[which][k], positions)]))

    @rule(which=st.integers(0, 1), data=st.data())
    def retry(self, which: int, data: st.DataObject) -> None:
        live = [i.pos for i in self.mem.consumer_items(self.ids[which][0], limit=10**6)]
        if not live:
            return
        positions = tuple(data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=4, unique=True)))
        self.both(lambda s, k: s.consumer_settle([], [Retry(self.ids[which][k], positions, 7)]))

    @rule(channel=st.sampled_from(CHANNELS), data=st.data())
    def trim(self, channel: str, data: st.DataObject) -> None:
        info = self.mem.head(channel)
        if info.top == 0:
            return
        up_to = data.draw(st.integers(0, info.top))
        self.both(lambda s, _: s.trim(channel, up_to))

    @rule(channel=st.sampled_from(CHANNELS), data=st.data())
    def trim_retired(self, channel: str, data: st.DataObject) -> None:
        """Trim the oldest retired epoch of the channel (the same one in both: epochs retire in order)."""
        retired = [self.mem.retired_epochs(channel), self.sql.retired_epochs(channel)]
        if not retired[0]:
            return
        assert len(retired[0]) == len(retired[1])
        i = data.draw(st.integers(0, len(retired[0]) - 1))
        up_to = data.draw(st.integers(0, retired[0][i].top))
        self.both(lambda s, k: s.trim(channel, up_to, epoch=retired[k][i].epoch))

    @rule(channel=st.sampled_from(CHANNELS))
    def reset(self, channel: str) -> None:
        if not self.mem.head(channel).epoch:
            return
        self.both(lambda s, _: s.reset_channel(channel))

    @rule(age=st.integers(1, 30))
    def retention(self, age: int) -> None:
        self.clock.advance(5)
        now = self.clock()
        self.both(lambda s, _: s.apply_retention(RetentionPolicy(max_age_s=age), now))

    @rule(cap=st.integers(1, 200))
    def total_size_retention(self, cap: int) -> None:
        now = self.clock()
        self.both(lambda s, _: s.apply_retention(RetentionPolicy(max_total_bytes=cap), now))

    @rule()
    def reopen(self) -> None:
        self.sql.close()
        self.sql = self._open()

    # -- the check --------------------------------------------------------------------------------------

    @invariant()
    def same_items(self) -> None:
        epochs: dict[str, str] = {}
        for mid, sid in self.ids:
            got = [self.mem.consumer_items(mid, limit=10**6), self.sql.consumer_items(sid, limit=10**6)]
            assert [(i.pos, i.attempts, i.not_before_ns) for i in got[0]] == [
                (i.pos, i.attempts, i.not_before_ns) for i in got[1]
            ]
            for m, s in zip(got[0], got[1], strict=True):
                assert epochs.setdefault(m.event.epoch, s.event.epoch) == s.event.epoch
                assert m.event == s.event.__class__(**{**_fields(s.event), "epoch": m.event.epoch})
        counts = [
            [(c.spec.name, c.top, c.pending, c.bytes) for c in s.consumers()] for s in (self.mem, self.sql)
        ]
        assert counts[0] == counts[1]


def _fields(ev: Any) -> dict[str, Any]:
    return {f: getattr(ev, f) for f in ev.__dataclass_fields__}


JournalEngines.TestCase.settings = settings(
    max_examples=examples(40),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestJournalEngines = JournalEngines.TestCase
