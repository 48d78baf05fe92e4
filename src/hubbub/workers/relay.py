"""The relay of one worker of a multi-worker node: every worker's committed events, in order.

A worker commits through the log owner (``workers/remote.py``): its own events come back with its
``append``, the other workers' arrive as the owner's broadcasts on the same socket. :class:`WorkerRelay`
(the node's ``relay``, ``core/relay.py``) offers both to the cluster's
:class:`~hubbub.cluster.delivery.OrderedDelivery`, which releases them to the worker's sessions in
per-channel seq order, each once, filling a gap from the log when one stays open ``gap_wait_s`` (a worker's
own commit and another worker's later one on the same channel may arrive in either order), and which the
worker's :class:`~hubbub.cluster.view.ClusterView` asks how far a channel is delivered (a subscription's
snapshot is capped there, so replay and live stream meet without a gap or a duplicate).

Start: the owner sends a worker every commit from the moment the parent connects it, before the process
runs; they wait in the events socket (and the owner's outbox) until :meth:`WorkerRelay.start` has read the
log's heads (after the connection, so they cover everything committed before it) and seeded the sequencer
with them; then the remote store reads them, and they are offered (those at or below the heads are
duplicates, dropped). No commit falls between the two.

Subscriptions: a worker's sessions are acknowledged their publishes when the owner committed them, and
another worker's session may subscribe on this worker before the owner's broadcast of them arrived here; were
the subscription registered then, it would get live an event acknowledged before it was made, which one
process never does (it fans out at commit, before the ack). So :meth:`WorkerRelay.barrier` (the node's
``SubscribeBarrier``, awaited before a subscription is registered) asks the owner to queue a marker behind
what it sent this worker so far (the ``sync`` call) and waits until the relay has read it: everything
committed before the subscribe arrived has been offered to the sequencer then, and released (to the
subscriptions made before) unless a gap holds it.

Notices (``core/notices.py``): :meth:`WorkerRelay.notify` sends one to the owner (on the relay's read
threads, in the order sent: one job sends what is queued, the call blocks), which queues it for every other
worker; a worker's relay hands those it receives to ``Node.notices``. The relay connects the notices with
the worker's index as its id: the owner tells the others when this worker's connection ends.

When the owner goes away (the parent died), the worker cannot commit any more: the relay asks the node to
stop (``Node.supervision``), and the worker exits.

Concurrency contract: :meth:`start`, :meth:`committed`, :meth:`barrier`, :meth:`close`, :meth:`health` and
:meth:`statistics` on the event loop; so are the broadcasts (the remote store reads them on the loop).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hubbub.cluster.delivery import OrderedDelivery
from hubbub.errors import StorageError
from hubbub.events import Event
from hubbub.log.base import ChannelInfo

from .remote import Broadcast, RemoteLogStore

if TYPE_CHECKING:
    from hubbub.core import Node
    from hubbub.core.session import Session

__all__ = ["WorkerRelay"]

log = logging.getLogger("hubbub.workers")

#: Channels per page when reading every head of the log at start.
HEADS_PAGE = 5000
#: The longest a subscription waits for its sync with the owner (:meth:`WorkerRelay.barrier`).
SYNC_TIMEOUT_S = 10.0


class WorkerRelay(OrderedDelivery):
    """See the module docstring."""

    def __init__(self, store: RemoteLogStore, *, gap_wait_s: float = 0.1, catch_up_s: float = 2.0) -> None:
        super().__init__(store, gap_wait_s=gap_wait_s, catch_up_s=catch_up_s)
        self.remote = store
        self.worker = store.worker
        self.received = 0
        self.tops = 0
        self.notices_dropped = 0
        #: Notices waiting to be sent, in order, and the job sending them (calls to the owner, off the loop).
        self._outbox: collections.deque[tuple[str, bytes]] = collections.deque()
        self._sending: set[asyncio.Future[None]] = set()
        #: The barriers waiting for their sync marker, by token (:meth:`barrier`).
        self._syncs: dict[int, asyncio.Future[None]] = {}
        self._tokens = itertools.count(1)

    async def start(self, node: Node) -> None:
        """Seed from the log's heads, attach to ``node`` and take the owner's broadcasts. Call before the
        node's listeners start."""
        self.attach(node)
        loop = asyncio.get_running_loop()
        mark, heads = await loop.run_in_executor(self._reads, self._read_heads)
        self.sequencer.seed(heads)
        self.sequencer.note_time(mark)
        node.relay = self
        node.notices.connect(self.notify, str(self.worker), str(os.getpid()))
        stop = node.supervision.stopper("workers", "log-owner")

        def on_lost() -> None:
            if not self._closed:
                log.error("worker %d: the log owner is gone; stopping", self.worker)
                stop(RuntimeError("the log owner is gone"))

        self.remote.listen(self._on_broadcast, on_lost)

    def _read_heads(self) -> tuple[int, list[ChannelInfo]]:
        store = self.remote
        t = store.top_time()
        out: list[ChannelInfo] = []
        after = ""
        while True:
            page = store.channels(after=after, limit=HEADS_PAGE, include_empty=True)
            out += page
            if len(page) < HEADS_PAGE:
                return t, out
            after = page[-1].channel

    async def close(self) -> None:
        """Stop delivering (the node's sessions are closed by then)."""
        self.remote.unlisten()
        node = self._node
        if node is not None and node.relay is self:
            node.relay = None
            node.notices.connect(None)
        if self._sending:
            await asyncio.wait(list(self._sending), timeout=2.0)
        await self.close_delivery()

    # -- the node's seam ------------------------------------------------------------------------------

    def committed(self, events: Sequence[tuple[Session | None, Event]]) -> None:
        """This worker's newly committed events, in commit order (on the loop, after their acks)."""
        self.offer_many(events)

    def notify(self, topic: str, data: bytes) -> None:
        """A notice for the other workers (``Node.notices``), sent off the loop in the order given; one the
        owner does not take (it is gone) is counted and dropped."""
        if self._closed:
            return
        self._outbox.append((topic, data))
        if not self._sending:  # else the job running sends it after those before it
            self._send_job()

    def _send_job(self) -> None:
        fut = asyncio.get_running_loop().run_in_executor(self._reads, self._send_notices)
        self._sending.add(fut)

        def done(f: asyncio.Future[None]) -> None:
            self._sending.discard(f)
            if self._outbox and not self._closed:  # queued after the job's last look at the outbox
                self._send_job()

        fut.add_done_callback(done)

    def _send_notices(self) -> None:
        """Send the queued notices in order (on a read thread; the loop appends meanwhile: a deque's append
        and popleft are atomic). The job ends when the outbox is empty; one queued after that starts the
        next job when this one's end reaches the loop."""
        box = self._outbox
        while True:
            try:
                topic, data = box.popleft()
            except IndexError:
                return
            try:
                self.remote.notice(topic, data)
            except Exception as exc:  # the owner is gone (the worker stops) or refused it: counted
                self.notices_dropped += 1
                log.info("worker %d: a notice was not sent: %s", self.worker, exc)

    async def barrier(self) -> None:
        """Return once this relay has offered every event committed before the call (see the module
        docstring): a round trip to the owner and back through the events socket. Returns at once when the
        owner did not queue the marker (this worker fell 64 MiB behind: its gaps fill from the log), and
        after :data:`SYNC_TIMEOUT_S` at most (the owner stalled or went away: the node stops then)."""
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        token = next(self._tokens)
        done = self._syncs[token] = loop.create_future()
        try:
            async with asyncio.timeout(SYNC_TIMEOUT_S):
                if await loop.run_in_executor(self._reads, self.remote.sync, token):
                    await done
        except (TimeoutError, StorageError) as exc:
            log.info("worker %d: a subscription's sync with the log owner failed: %r", self.worker, exc)
        finally:
            self._syncs.pop(token, None)

    def _on_broadcast(self, msg: Broadcast) -> None:
        if self._closed:
            return
        kind, items = msg
        node = self._node
        consumers = None if node is None else node.consumers
        if kind == "events":
            for worker, events in items:
                if worker == self.worker:
                    continue  # this worker's own: offered at commit, with their origins
                if consumers is not None:  # their journal items are committed: open consumers read them
                    consumers.others_committed(events)
                if node is not None:  # e.g. qpubs counts its recipients of another worker's emit
                    node.notices.arrived(str(worker), events)
                self.offer_many((None, ev) for ev in events)
                self.received += len(events)
        elif kind == "notice":
            if node is not None:
                topic, data = items
                node.notices.received(topic, data)
        elif kind == "sync":  # everything the owner sent before it was offered above: the barrier may go
            done = self._syncs.pop(items[0], None)
            if done is not None and not done.done():
                done.set_result(None)
        elif kind == "tops":
            self.tops += 1
            for channel, epoch, top in items:
                self.sequencer.committed_up_to(channel, epoch, top)
            if consumers is not None:
                consumers.others_committed(None)

    # -- reporting ------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """Nothing for ``/healthz`` and ``/api/v1/cluster``: the workers are one node to its clients, which
        answers as a single process does (a worker's relay cannot be down: it stops with its owner)."""
        return {}

    def statistics(self) -> dict[str, int | float]:
        return {
            "received": self.received,
            "tops": self.tops,
            "notices_dropped": self.notices_dropped,
            **self.sequencer.statistics(),
        }
