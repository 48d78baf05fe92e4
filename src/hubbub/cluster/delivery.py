"""A node's ordered delivery of events that several writers commit to one log: :class:`OrderedDelivery`.

When more than one process commits to the log a node reads (the nodes of a cluster on PostgreSQL, the
workers of a multi-worker node on one SQLite file), each node gets its own commits back from its writer and
the others' through a relay (Redis, the owner's Unix sockets), not necessarily in seq order. This class is
the part every such relay shares:

* a :class:`~hubbub.cluster.sequencer.Sequencer` that releases the events to the node's fan-out (and to
  live consumer groups) in per-channel ``(epoch, seq)`` order, each once, filling gaps from the log;
* :meth:`positions`, how far the node delivered some channels, which :class:`~hubbub.cluster.view.ClusterView`
  caps a subscription's snapshot at (waiting a moment for the node to catch up with the log);
* the log reads of the fills, on a small thread pool of its own, never the node's readers (a reader waiting
  in :meth:`positions` cannot starve them).

A subclass carries the events between the processes: it calls :meth:`attach` once the sequencer is seeded,
and :meth:`close_delivery` when it closes.

Concurrency contract: every method runs on the event loop, except :meth:`positions` and :meth:`position`,
which run on other threads (the node's log readers).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from hubbub.events import Event
from hubbub.log.base import ChannelInfo, EventLog

from .sequencer import Sequencer

if TYPE_CHECKING:
    from hubbub.core import Node
    from hubbub.core.session import Session

__all__ = ["OrderedDelivery"]


class OrderedDelivery:
    """See the module docstring. ``store`` is the log the node's fills read (the real one, not a view);
    ``catch_up_s`` how long a snapshot waits for the node to deliver what the log already holds."""

    def __init__(self, store: EventLog, *, gap_wait_s: float, catch_up_s: float) -> None:
        self.store = store
        self.catch_up_s = catch_up_s
        self._node: Node | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        #: While :meth:`offer_many` runs: what the sequencer releases, fanned out together after it.
        self._batch: list[tuple[Session | None, Event]] | None = None
        self._reads = ThreadPoolExecutor(2, thread_name_prefix="hubbub-cluster-reader")
        self.sequencer: Sequencer[Session] = Sequencer(
            self._deliver,
            self._read,
            self._head,
            self._lost,
            self._interested,
            gap_wait=gap_wait_s,
        )

    def attach(self, node: Node) -> None:
        """Deliver to ``node`` from now on (on its loop)."""
        self._node = node
        self._loop = asyncio.get_running_loop()
        self.sequencer.supervise(node.supervision)

    async def close_delivery(self) -> None:
        """Stop the sequencer's fills and the read threads."""
        self._closed = True
        await self.sequencer.close()
        await asyncio.get_running_loop().run_in_executor(None, self._reads.shutdown, True)

    # -- to the node ------------------------------------------------------------------------------------

    def offer_many(self, events: Iterable[tuple[Session | None, Event]]) -> None:
        """Offer committed events to the sequencer (this node's own with their origin sessions, other
        writers' with None); what they release is fanned out together, as runs (``Node.fan_out_many``: a
        delivery per run and connection rather than per event). Fills release one event at a time."""
        batch: list[tuple[Session | None, Event]] = []
        self._batch = batch
        try:
            self.sequencer.offer_all(events)
        finally:
            self._batch = None
        node = self._node
        if batch and node is not None:
            node.fan_out_many(batch)
            if node.consumers is not None:  # live exclusive groups take every writer's events from here
                released = node.consumers.released
                for _, ev in batch:
                    released(ev)

    def _deliver(self, ev: Event, origin: Session | None) -> None:
        if self._batch is not None:
            self._batch.append((origin, ev))
            return
        node = self._node
        if node is not None:
            node.fan_out(ev, origin)
            if node.consumers is not None:  # live exclusive groups take every writer's events from here
                node.consumers.released(ev)

    def _interested(self, channel: str) -> bool:
        node = self._node
        if node is None:
            return False
        if node.matching(channel) or (node.consumers is not None and node.consumers.has_groups):
            return True
        # Subscriptions with tags match only events that carry them: any such one on the channel counts.
        return any(
            s.tags and s.pattern.matches(channel) for sess in node.sessions for s in node.subscriptions(sess)
        )

    def _lost(self, channel: str) -> None:
        """Events of ``channel`` were trimmed before they could be delivered here: close the connections
        subscribed to it as slow consumers, so they resume from their position and get an explicit gap."""
        node = self._node
        if node is None:
            return
        for sess in node.sessions:
            if any(s.pattern.matches(channel) for s in node.subscriptions(sess)):
                sess.kick(sess.slow_close_code)

    # -- log reads (own threads) ------------------------------------------------------------------------

    async def _read(self, channel: str, epoch: str, after: int, limit: int) -> list[Event]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._reads, lambda: self.store.read(channel, after, limit, epoch=epoch)
        )

    async def _head(self, channel: str) -> ChannelInfo:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reads, self.store.head, channel)

    # -- what the node delivered ------------------------------------------------------------------------

    def position(self, channel: str, epoch: str, top: int) -> int:
        """How far (``<= top``) this node delivered the channel's epoch ``epoch``, waiting a moment for it
        to deliver up to ``top`` (a position the log holds) first. From a log reader thread (a replay's
        snapshot): never from the loop. The writer thread does not wait."""
        return self.positions([(channel, epoch, top)])[0]

    def positions(self, wanted: Sequence[tuple[str, str, int]]) -> list[int]:
        """:meth:`position` of several channels, waiting for all of them at once (one ``catch_up_s`` in
        all, however many lag)."""
        seq = self.sequencer
        out = [_capped(seq.released(ch), ep, top) for ch, ep, top in wanted]
        behind = [i for i, (_, _, top) in enumerate(wanted) if out[i] < top]
        loop = self._loop
        if (
            not behind
            or loop is None
            or self._closed
            or threading.current_thread().name.startswith("hubbub-log-writer")
            or _on_loop(loop)
        ):
            return out
        wait_s = self.catch_up_s

        async def catch_up() -> None:
            await asyncio.gather(*(seq.catch_up(*wanted[i], wait_s) for i in behind))

        fut = asyncio.run_coroutine_threadsafe(catch_up(), loop)
        try:
            fut.result(wait_s + 1.0)
        except Exception:
            fut.cancel()
        for i in behind:
            ch, ep, top = wanted[i]
            out[i] = _capped(seq.released(ch), ep, top)
        return out


def _capped(released: tuple[str, int] | None, epoch: str, top: int) -> int:
    if released is None or released[0] != epoch:
        return 0
    return min(released[1], top)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
