"""The durable-consumer service (core/consumers.py) against a simple model, as a hypothesis state machine.

A real :class:`Node` and :class:`ConsumerService` on a SQLite store get emits on matching and other channels,
opens, acks, nacks, closes and restarts (the node and the service stopped and started again on the same
file, so outstanding batches become pending). The model is a list of journal positions and their payloads,
the set acknowledged, and the one outstanding batch. Because the consumer has one, unshared, opener, the
service must deliver in journal order: every batch is the lowest unacknowledged positions, in order, with
their payloads, and redeliveries count their attempts. After every step the store's journal holds exactly
the unacknowledged positions.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hubbub.core import Batch, ConsumerService, Node, Opener
from hubbub.core.consumer_delivery import ITEM_OVERHEAD
from hubbub.events import Publisher
from hubbub.log import open_store
from hubbub.log.base import AppendRequest, RetentionPolicy
from hubbub.log.consumers import ConsumerSpec
from tests.hypothesis_budget import examples

WAIT = 10.0
SPEC = ConsumerSpec("m", "/jobs/*", batch_wait_ms=0)


class ConsumerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.loop = asyncio.new_event_loop()
        self.node: Node | None = None
        self.svc: ConsumerService | None = None
        self.opener: Opener | None = None
        self.batches: asyncio.Queue[Batch] | None = None
        # The model.
        self.payloads: dict[int, bytes] = {}  # pos -> payload
        self.acked: set[int] = set()
        # Attempts per position, as far as the model knows: between ``attempts`` and ``attempts_max``. A
        # batch the service sent but the machine did not take yet, when the opener closes or the server
        # restarts, is given back too, so its items may have one more.
        self.attempts: dict[int, int] = {}
        self.attempts_max: dict[int, int] = {}
        self.outstanding: tuple[int, list[int]] | None = None
        self.emitted = 0
        self.run(self.start())

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, WAIT))

    async def start(self) -> None:
        store = open_store("sqlite", str(Path(self.tmp.name) / "data"), "commit", RetentionPolicy(), 600)
        self.node = Node(store)
        await self.node.__aenter__()
        # Four items per consumer, and about three more while the held bytes allow: both limits are met.
        self.svc = ConsumerService(self.node, max_items=4, held_bytes_max=3 * (ITEM_OVERHEAD + 2))
        await self.svc.start()
        await self.svc.create(SPEC)

    async def stop(self) -> None:
        assert self.svc is not None and self.node is not None
        await self.svc.close()
        await self.node.close()
        self.opener = None
        self.batches = None

    def teardown(self) -> None:
        try:
            self.run(self.stop())
        finally:
            self.loop.close()
            self.tmp.cleanup()

    def unacked(self) -> list[int]:
        return sorted(p for p in self.payloads if p not in self.acked)

    @rule(channel=st.sampled_from(["/jobs/a", "/jobs/b", "/other", "/jobs/a/deep"]), n=st.integers(1, 4))
    def emit(self, channel: str, n: int) -> None:
        async def go() -> None:
            assert self.node is not None
            for _ in range(n):
                self.emitted += 1
                payload = str(self.emitted).encode()
                r = await self.node.publish(
                    AppendRequest(channel, Publisher("native"), payload, "text/plain")
                )
                if channel in ("/jobs/a", "/jobs/b"):
                    pos = len(self.payloads) + 1
                    assert r.journal and r.journal[0][1] == pos
                    self.payloads[pos] = payload
                else:
                    assert r.journal == ()

        self.run(go())

    @precondition(lambda self: self.opener is None)
    @rule(batch_max=st.integers(0, 3))
    def open(self, batch_max: int) -> None:
        async def go() -> None:
            assert self.svc is not None
            q: asyncio.Queue[Batch] = asyncio.Queue()
            self.opener = await self.svc.open("m", q.put_nowait, batch_max=batch_max)
            self.batches = q
            self.batch_max = batch_max

        self.run(go())

    @precondition(lambda self: self.opener is not None and self.outstanding is None and self.unacked())
    @rule()
    def take(self) -> None:
        assert self.batches is not None
        b: Batch = self.run(self.batches.get())
        got = [it.pos for it in b.items]
        want = self.unacked()
        # In order, from the lowest unacknowledged position, contiguous.
        assert got == want[: len(got)], (got, want)
        if self.batch_max:
            assert len(got) <= self.batch_max
        assert [it.event.payload for it in b.items] == [self.payloads[p] for p in got]
        for it in b.items:
            assert self.attempts.get(it.pos, 0) <= it.attempts <= self.attempts_max.get(it.pos, 0), it
            self.attempts[it.pos] = self.attempts_max[it.pos] = it.attempts
        self.outstanding = (b.number, got)

    @precondition(lambda self: self.outstanding is not None)
    @rule()
    def ack(self) -> None:
        assert self.opener is not None and self.outstanding is not None
        number, got = self.outstanding
        self.run(self.opener.ack(number))
        self.acked.update(got)
        self.outstanding = None

    @precondition(
        lambda self: self.outstanding is not None and max(self.attempts_max.values(), default=0) < 2
    )
    @rule()
    def nack(self) -> None:
        assert self.opener is not None and self.outstanding is not None
        number, got = self.outstanding
        self.run(self.opener.nack(number))
        self.given_back(got)
        self.outstanding = None

    def given_back(self, positions: list[int]) -> None:
        for p in positions:
            self.attempts[p] = self.attempts.get(p, 0) + 1
            self.attempts_max[p] = self.attempts_max.get(p, 0) + 1

    def opener_goes(self) -> None:
        """The opener closes (or the server stops): its batch, taken or not, is given back."""
        if self.outstanding is not None:
            self.given_back(self.outstanding[1])
            self.outstanding = None
        elif self.opener is not None:
            for p in self.unacked():
                self.attempts_max[p] = self.attempts_max.get(p, 0) + 1

    @precondition(lambda self: self.opener is not None)
    @rule()
    def close(self) -> None:
        assert self.opener is not None
        self.opener_goes()
        self.opener.close()
        self.opener = None
        self.batches = None

    @rule()
    def restart(self) -> None:
        # The service closes its openers before it stops, so a batch that was out is given back (stored);
        # either way it is pending after the restart.
        self.opener_goes()
        self.run(self.stop())
        self.run(self.start())

    @invariant()
    def journal_holds_exactly_the_unacknowledged(self) -> None:
        async def go() -> list[int]:
            assert self.node is not None
            infos = await self.node._reads.call_journal(lambda st: st.consumers())
            cid = infos[0].id
            items = await self.node._reads.call_journal(lambda st: st.consumer_items(cid, 0, 10_000))
            return [it.pos for it in items]

        assert self.run(go()) == self.unacked()


TestConsumerStateMachine = ConsumerMachine.TestCase
TestConsumerStateMachine.settings = settings(
    max_examples=examples(15),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
