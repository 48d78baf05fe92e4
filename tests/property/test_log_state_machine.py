"""The sqlite log engine against the memory reference engine, as a hypothesis state machine.

Both stores get the same operations (append batches with idempotency keys, resets, retention, a clock that
jumps back and forth) and must agree on every result and on their whole state after every step. The sqlite
store is also closed and reopened at random ("crash and recover"): everything committed must still be there.
Epochs are random in both, so they are compared through a bijection learned as they appear.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hubbub.events import Event, Publisher
from hubbub.log import AppendRequest, ChannelInfo, MemoryLogStore, RetentionPolicy, SqliteLogStore

NS = 1_000_000_000
CHANNELS = ["/a", "/b", "/a/b", "/é"]


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000 * NS

    def __call__(self) -> int:
        return self.now


@st.composite
def requests(draw: st.DrawFn) -> AppendRequest:
    channel = draw(st.sampled_from(CHANNELS))
    user = draw(st.sampled_from(["u1", "u2"]))
    idem = draw(st.sampled_from(["", "", "k1", "k2"]))
    if idem:
        # A repeated idempotency key is a repeated request: same content.
        payload = f"{user}{channel}{idem}".encode()
        headers = {"k": idem}
        tags: tuple[str, ...] = (user,)
    else:
        payload = draw(st.binary(max_size=6))
        headers = draw(st.dictionaries(st.sampled_from(["h", ":p"]), st.text(max_size=2), max_size=2))
        tags = tuple(sorted(draw(st.sets(st.sampled_from(["t1", "t2"])))))
    return AppendRequest(
        channel=channel,
        publisher=Publisher("native", user, "app", idem),
        payload=payload,
        content_type="text/plain",
        headers=headers,
        tags=tags,
        idem=idem,
    )


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.path = Path(self._tmp.name) / "log.db"
        self.clock = Clock()
        self.mem: MemoryLogStore | None = None
        self.sql: SqliteLogStore | None = None
        self.epochs: dict[str, str] = {}  # sqlite epoch -> memory epoch
        self.reopens = 0

    # -- helpers -----------------------------------------------------------------------------------

    def _open_sql(self) -> SqliteLogStore:
        return SqliteLogStore(
            self.path,
            durability=self.durability,
            retention=self.policy,
            idem_window_s=self.window,
            clock=self.clock,
        )

    def _epoch(self, sql_epoch: str, mem_epoch: str) -> None:
        """Both epochs name the same thing: learn or check the bijection."""
        if sql_epoch == "" or mem_epoch == "":
            assert sql_epoch == mem_epoch
            return
        known = self.epochs.get(sql_epoch)
        if known is None:
            assert mem_epoch not in self.epochs.values(), "memory kept an epoch that sqlite changed"
            self.epochs[sql_epoch] = mem_epoch
        else:
            assert known == mem_epoch, "sqlite kept an epoch that memory changed"

    def _same_event(self, s: Event, m: Event) -> None:
        self._epoch(s.epoch, m.epoch)
        assert dataclasses.replace(s, epoch=m.epoch, headers=dict(s.headers)) == dataclasses.replace(
            m, headers=dict(m.headers)
        )

    def _same_info(self, s: ChannelInfo, m: ChannelInfo) -> None:
        self._epoch(s.epoch, m.epoch)
        assert dataclasses.replace(s, epoch=m.epoch) == m

    @property
    def stores(self) -> tuple[SqliteLogStore, MemoryLogStore]:
        assert self.sql is not None and self.mem is not None
        return self.sql, self.mem

    # -- rules -------------------------------------------------------------------------------------

    @initialize(
        max_events=st.sampled_from([0, 0, 3]),
        max_bytes=st.sampled_from([0, 0, 14]),
        window=st.sampled_from([0, 5]),
        durability=st.sampled_from(["fsync", "commit", "none"]),
    )
    def open_stores(self, max_events: int, max_bytes: int, window: int, durability: str) -> None:
        self.policy = RetentionPolicy(max_events=max_events, max_bytes=max_bytes)
        self.window = window
        self.durability = durability
        self.mem = MemoryLogStore(retention=self.policy, idem_window_s=window, clock=self.clock)
        self.sql = self._open_sql()

    @rule(batch=st.lists(requests(), max_size=6), step=st.integers(-2, 3))
    def append(self, batch: list[AppendRequest], step: int) -> None:
        sql, mem = self.stores
        self.clock.now += step * NS
        rs, rm = sql.append(batch), mem.append(batch)
        assert [r.duplicate for r in rs] == [r.duplicate for r in rm]
        for a, b in zip(rs, rm, strict=True):
            self._same_event(a.event, b.event)

    @rule(channel=st.sampled_from(CHANNELS))
    def reset(self, channel: str) -> None:
        sql, mem = self.stores
        self._same_info(sql.reset_channel(channel), mem.reset_channel(channel))

    @rule(max_age_s=st.sampled_from([0, 1, 4]), total=st.sampled_from([0, 10, 40]))
    def retention(self, max_age_s: int, total: int) -> None:
        sql, mem = self.stores
        pol = RetentionPolicy(max_age_s=max_age_s, max_total_bytes=total)
        assert sql.apply_retention(pol, self.clock.now) == mem.apply_retention(pol, self.clock.now)

    @rule()
    def crash_and_reopen(self) -> None:
        sql, _ = self.stores
        sql.close()
        self.sql = self._open_sql()
        self.reopens += 1

    @precondition(lambda self: self.reopens > 0)
    @rule()
    def restart_without_durability(self) -> None:
        sql, mem = self.stores
        sql.new_epochs_on_open()
        mem.new_epochs_on_open()

    # -- invariants --------------------------------------------------------------------------------

    @invariant()
    def same_state(self) -> None:
        if self.mem is None:
            return
        sql, mem = self.stores
        for ch in CHANNELS:
            self._same_info(sql.head(ch), mem.head(ch))
            es, em = sql.read(ch, limit=10_000), mem.read(ch, limit=10_000)
            assert len(es) == len(em)
            for a, b in zip(es, em, strict=True):
                self._same_event(a, b)
            assert [e.seq for e in sql.read_last(ch, 2)] == [e.seq for e in mem.read_last(ch, 2)]
            # Retired epochs (a new epoch deletes nothing) agree too, events included.
            rs, rm = sql.retired_epochs(ch), mem.retired_epochs(ch)
            assert len(rs) == len(rm)
            for ri_s, ri_m in zip(rs, rm, strict=True):
                self._same_info(ri_s, ri_m)
                olds = sql.read(ch, limit=10_000, epoch=ri_s.epoch)
                oldm = mem.read(ch, limit=10_000, epoch=ri_m.epoch)
                assert len(olds) == len(oldm)
                for a, b in zip(olds, oldm, strict=True):
                    self._same_event(a, b)
            if em:
                # A time-range read agrees too (the engines search differently).
                mid = em[len(em) // 2].time_ns
                assert [e.seq for e in sql.read(ch, from_time=mid)] == [
                    e.seq for e in mem.read(ch, from_time=mid)
                ]
                assert [e.seq for e in sql.read(ch, to_time=mid)] == [
                    e.seq for e in mem.read(ch, to_time=mid)
                ]
        cs, cm = sql.channels(), mem.channels()
        assert [c.channel for c in cs] == [c.channel for c in cm]
        for ci_s, ci_m in zip(cs, cm, strict=True):
            self._same_info(ci_s, ci_m)
        assert sql.stats() == mem.stats()
        assert sql.top_time() == mem.top_time()

    def teardown(self) -> None:
        try:
            for store in (self.sql, self.mem):
                if store is not None:
                    store.close()
        finally:
            self._tmp.cleanup()


TestLogStateMachine = LogMachine.TestCase
TestLogStateMachine.settings = settings(
    max_examples=50,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
