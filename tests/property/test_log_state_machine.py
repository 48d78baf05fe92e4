"""The sqlite log engine against the memory reference engine, as a hypothesis state machine.

Both stores get the same operations (append batches with idempotency keys, resets, retention, a clock that
jumps back and forth) and must agree on every result and on their whole state after every step. Epochs are
random in both, so they are compared through a bijection learned as they appear.

The sqlite store runs in a child process (:class:`StoreProcess`), so that it can really crash: the machine
closes and reopens it cleanly, kills the process with SIGKILL while it is idle, and kills it while it is
executing an append (after the child has taken the request, so the kill lands during the commit or just
after it). After a crash everything committed must still be there, an append caught by the kill must be there
whole or not at all, and the store must report that the channels' current epochs may have lost commits under
``commit`` and ``none`` (the lost-commits path: native.md §6 ``ahead``), and must not under ``fsync``.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import signal
import tempfile
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hubbub.events import Event, Publisher
from hubbub.log import AppendRequest, AppendRun, ChannelInfo, MemoryLogStore, RetentionPolicy, SqliteLogStore
from tests.hypothesis_budget import examples

#: Each step is a call between this process and the store's, each waiting for the other to be scheduled:
#: 40-56 s in a CI run, four to five minutes at a load of 16-20 on 2 cores, where the suite's 120 s ended
#: the test for the machine's pace. This bounds a hang only.
pytestmark = pytest.mark.timeout(900)

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


# -- the sqlite store in a child process ----------------------------------------------------------------

#: Children fork from a server process that has imported hubbub and this module but started no thread, so
#: that forking is safe and cheap (a crash every few steps, hundreds per run).
_CTX = multiprocessing.get_context("forkserver")
_CTX.set_forkserver_preload(["hubbub.log", __name__])


def _serve(conn: Connection, path: str, durability: str, policy: RetentionPolicy, window: int) -> None:
    """The child: open the store, then answer ``(method, now, taken, mids, args, kwargs)`` calls until
    ``close``. Asked to (``taken``), it answers ``"taken"`` before executing the call, so the parent can kill
    it during the call; the other calls get their one answer only. Given ``mids``, it answers the call's
    result with the state after it (:func:`_state`), which the machine's invariant reads next: one exchange
    for the two (every hand-over between the processes waits for a CPU, dear on a loaded machine)."""
    clock = Clock()
    store = SqliteLogStore(
        Path(path), durability=durability, retention=policy, idem_window_s=window, clock=clock
    )
    conn.send(("ready", None))
    helpers: dict[str, Callable[..., Any]] = {"state": _state, "crash_view": _crash_view}
    while True:
        method, now, taken, mids, args, kwargs = conn.recv()
        clock.now = now
        if taken:
            conn.send(("taken", None))
        try:
            helper = helpers.get(method)
            call = functools.partial(helper, store) if helper else getattr(store, method)
            result = call(*args, **kwargs)
            if mids is not None:
                result = (result, _state(store, mids))
        except Exception as exc:
            conn.send(("error", repr(exc)))
            continue
        conn.send(("ok", result))
        if method == "close":
            return


def _state(store: Any, mids: dict[str, int | None]) -> dict[str, Any]:
    """Everything the machine's invariant compares, read in one call (``mids``: per channel, the time that
    splits its events for the time-range reads, or None)."""
    out: dict[str, Any] = {}
    for ch, mid in mids.items():
        out[ch] = (
            store.head(ch),
            store.read(ch, limit=10_000),
            [e.seq for e in store.read_last(ch, 2)],
            [(ri, store.read(ch, limit=10_000, epoch=ri.epoch)) for ri in store.retired_epochs(ch)],
            None
            if mid is None
            else (
                [e.seq for e in store.read(ch, from_time=mid)],
                [e.seq for e in store.read(ch, to_time=mid)],
            ),
        )
    out[""] = (store.channels(), store.stats(), store.top_time())
    return out


def _crash_view(store: Any) -> dict[str, tuple[ChannelInfo, bool | None]]:
    """Per channel, after a reopen: its head, and whether its current epoch may have lost commits (None for a
    channel without one). In one call, for the same reason as :func:`_state`."""
    out: dict[str, tuple[ChannelInfo, bool | None]] = {}
    for ch in CHANNELS:
        head = store.head(ch)
        out[ch] = (head, store.commits_may_be_lost(ch, head.epoch) if head.epoch else None)
    return out


class StoreProcess:
    """A :class:`SqliteLogStore` in a child process, called like one (``store.append(batch)``), plus
    :meth:`kill` (SIGKILL, no clean close) and :meth:`kill_during`."""

    def __init__(
        self, path: Path, durability: str, policy: RetentionPolicy, window: int, clock: Clock
    ) -> None:
        self.clock = clock
        self._conn, child = _CTX.Pipe()
        self._proc = _CTX.Process(target=_serve, args=(child, str(path), durability, policy, window))
        self._proc.start()
        child.close()
        assert self._conn.recv() == ("ready", None)

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.then_state(None, method, *args, **kwargs)

    def then_state(self, mids: dict[str, int | None] | None, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)``; given ``mids``, its result and the state after it (:func:`_state`)."""
        self._conn.send((method, self.clock.now, False, mids, args, kwargs))
        kind, result = self._conn.recv()
        assert kind == "ok", result
        return result

    def __getattr__(self, method: str) -> Any:
        return lambda *args, **kwargs: self._call(method, *args, **kwargs)

    def close(self) -> None:
        if self._proc.is_alive():
            self._call("close")
        self._join()

    def kill(self) -> None:
        """SIGKILL: the store gets no chance to close, sync or clean up."""
        os.kill(self._proc.pid or 0, signal.SIGKILL)
        self._join()

    def kill_during(self, method: str, *args: Any) -> None:
        """Start ``method`` in the child and kill the child as soon as it has taken the call."""
        self._conn.send((method, self.clock.now, True, None, args, {}))
        assert self._conn.recv() == ("taken", None)
        self.kill()

    def _join(self) -> None:
        self._proc.join(10)
        assert self._proc.exitcode is not None, "the store process did not end"
        self._conn.close()


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self.path = Path(self._tmp.name) / "log.db"
        self.clock = Clock()
        self.mem: MemoryLogStore | None = None
        self.sql: StoreProcess | None = None
        self.epochs: dict[str, str] = {}  # sqlite epoch -> memory epoch
        self.reopens = 0
        #: The sqlite store's state read with the last rule's call, and the ``mids`` it was read for.
        self.state_after: tuple[dict[str, int | None], Any] | None = None

    # -- helpers -----------------------------------------------------------------------------------

    def _open_sql(self) -> StoreProcess:
        return StoreProcess(self.path, self.durability, self.policy, self.window, self.clock)

    def _after_crash(self) -> dict[str, ChannelInfo]:
        """Reopen after a kill, and check that the store knows which epochs may have lost commits; returns
        each channel's head."""
        self.sql = self._open_sql()
        self.reopens += 1
        sql, _ = self.stores
        heads = {}
        for ch, (head, may_be_lost) in sql.crash_view().items():
            heads[ch] = head
            if head.epoch:
                # Every channel existed before the crash (none was created since the reopen).
                assert may_be_lost is (self.durability != "fsync"), (ch, self.durability)
        return heads

    def _mids(self) -> dict[str, int | None]:
        """Per channel, the time that splits the memory store's events for the time-range reads, or None."""
        assert self.mem is not None
        reads = {ch: self.mem.read(ch, limit=10_000) for ch in CHANNELS}
        return {ch: (em[len(em) // 2].time_ns if em else None) for ch, em in reads.items()}

    def _sql_then_state(self, method: str, *args: Any) -> Any:
        """The sqlite store's ``method(*args)``, called after the memory store's: the state the invariant
        compares comes back with its result."""
        sql, _ = self.stores
        mids = self._mids()
        result, state = sql.then_state(mids, method, *args)
        self.state_after = (mids, state)
        return result

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
    def stores(self) -> tuple[Any, MemoryLogStore]:
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
        _, mem = self.stores
        self.clock.now += step * NS
        rm = mem.append(batch)
        rs = self._sql_then_state("append", batch)
        assert [r.duplicate for r in rs] == [r.duplicate for r in rm]
        for a, b in zip(rs, rm, strict=True):
            self._same_event(a.event, b.event)

    @rule(
        batch=st.lists(requests(), max_size=4),
        runs=st.lists(
            st.tuples(
                st.integers(0, 4),
                st.sampled_from(CHANNELS),
                st.lists(st.binary(max_size=6), min_size=1, max_size=5),
            ),
            min_size=1,
            max_size=3,
        ),
        step=st.integers(-2, 3),
    )
    def append_runs(
        self, batch: list[AppendRequest], runs: list[tuple[int, str, list[bytes]]], step: int
    ) -> None:
        """SQLite takes runs (``AppendRun``) among the requests; the reference is given their requests."""
        sql, mem = self.stores
        self.clock.now += step * NS
        mixed: list[AppendRequest | AppendRun] = list(batch)
        for at, channel, payloads in sorted(runs, key=lambda r: r[0], reverse=True):
            mixed.insert(at, AppendRun(channel, Publisher("native", "u1", "app", ""), "text/plain", payloads))
        flat = [r for e in mixed for r in (e.requests() if isinstance(e, AppendRun) else [e])]
        rs, rm = sql.append(mixed), mem.append(flat)
        assert [r.duplicate for r in rs] == [r.duplicate for r in rm]
        for a, b in zip(rs, rm, strict=True):
            self._same_event(a.event, b.event)

    @rule(channel=st.sampled_from(CHANNELS))
    def reset(self, channel: str) -> None:
        _, mem = self.stores
        m = mem.reset_channel(channel)
        self._same_info(self._sql_then_state("reset_channel", channel), m)

    @rule(max_age_s=st.sampled_from([0, 1, 4]), total=st.sampled_from([0, 10, 40]))
    def retention(self, max_age_s: int, total: int) -> None:
        _, mem = self.stores
        pol = RetentionPolicy(max_age_s=max_age_s, max_total_bytes=total)
        m = mem.apply_retention(pol, self.clock.now)
        assert self._sql_then_state("apply_retention", pol, self.clock.now) == m

    @rule()
    def close_and_reopen(self) -> None:
        sql, _ = self.stores
        sql.close()
        self.sql = self._open_sql()
        self.reopens += 1

    @rule()
    def crash_and_reopen(self) -> None:
        sql, _ = self.stores
        sql.kill()
        self._after_crash()

    @rule(batch=st.lists(requests(), min_size=1, max_size=6), step=st.integers(0, 2))
    def crash_during_append(self, batch: list[AppendRequest], step: int) -> None:
        sql, mem = self.stores
        self.clock.now += step * NS
        sql.kill_during("append", batch)
        heads = self._after_crash()
        # The append is atomic: it landed whole (a top moved) or not at all; the memory store follows.
        landed = any(heads[r.channel].top != mem.head(r.channel).top for r in batch)
        if landed:
            mem.append(batch)

    @precondition(lambda self: self.reopens > 0)
    @rule()
    def restart_without_durability(self) -> None:
        _, mem = self.stores
        mem.new_epochs_on_open()
        self._sql_then_state("new_epochs_on_open")

    # -- invariants --------------------------------------------------------------------------------

    @invariant()
    def same_state(self) -> None:
        if self.mem is None:
            return
        sql, mem = self.stores
        reads = {ch: mem.read(ch, limit=10_000) for ch in CHANNELS}
        mids = {ch: (em[len(em) // 2].time_ns if em else None) for ch, em in reads.items()}
        # Read with the rule's call when it made one (for these mids: nothing has changed since).
        after, self.state_after = self.state_after, None
        state = after[1] if after is not None and after[0] == mids else sql.state(mids)
        for ch in CHANNELS:
            head, es, last2, retired, ranges = state[ch]
            em = reads[ch]
            self._same_info(head, mem.head(ch))
            assert len(es) == len(em)
            for a, b in zip(es, em, strict=True):
                self._same_event(a, b)
            assert last2 == [e.seq for e in mem.read_last(ch, 2)]
            # Retired epochs (a new epoch deletes nothing) agree too, events included.
            rm = mem.retired_epochs(ch)
            assert len(retired) == len(rm)
            for (ri_s, olds), ri_m in zip(retired, rm, strict=True):
                self._same_info(ri_s, ri_m)
                oldm = mem.read(ch, limit=10_000, epoch=ri_m.epoch)
                assert len(olds) == len(oldm)
                for a, b in zip(olds, oldm, strict=True):
                    self._same_event(a, b)
            mid = mids[ch]
            if mid is not None:
                # A time-range read agrees too (the engines search differently).
                assert ranges == (
                    [e.seq for e in mem.read(ch, from_time=mid)],
                    [e.seq for e in mem.read(ch, to_time=mid)],
                )
        cs, stats, top_time = state[""]
        cm = mem.channels()
        assert [c.channel for c in cs] == [c.channel for c in cm]
        for ci_s, ci_m in zip(cs, cm, strict=True):
            self._same_info(ci_s, ci_m)
        assert stats == mem.stats()
        assert top_time == mem.top_time()

    def teardown(self) -> None:
        try:
            for store in (self.sql, self.mem):
                if store is not None:
                    store.close()
        finally:
            self._tmp.cleanup()


TestLogStateMachine = LogMachine.TestCase
TestLogStateMachine.settings = settings(
    max_examples=examples(50),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
